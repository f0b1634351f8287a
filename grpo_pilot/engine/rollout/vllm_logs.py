"""vLLM's log: everything in a file of the run directory, only what may matter on the console.

An in-process vLLM engine logs through the `vllm` logger (its own handler writes to stdout) and raises a
few Python warnings; on a CPU run that is ~70 WARNING lines, almost all known to be harmless. `VllmLog`
takes the `vllm` logger over while the engine lives: every record goes to the log file
(`<out>/workers/worker-<i>/vllm.log`), except that of each `HARMLESS` kind only the first is written there
(`close()` adds how many followed); the console (stderr) gets the WARNING-and-above records of no known
kind — nothing of the kinds below. Python warnings raised inside vLLM's own files during start-up
(`capture_warnings`) are logged the same way.

The known-harmless kinds, with where vLLM 0.32 emits them and why they are harmless here:
- `no_weights_layer`: "<Layer>: Failed to load weights" (model_executor/model_loader/reload/layerwise.py:266),
  one per parameter-free layer (RotaryEmbedding) per weight sync; a layer *with* parameters that got none
  is a stale sync, which `vllm_backend.stale_reports` turns into a RunError whatever the log says;
- `set_num_threads`: "CPU backend doesn't allow to use `torch.set_num_threads`" (v1/worker/cpu_worker.py:140):
  vLLM's CPU worker replaces torch.set_num_threads; `vllm_backend._preserve_process_state` restores it;
- `ld_preload`: "... is not found in LD_PRELOAD" (v1/worker/cpu_worker.py:114): tcmalloc / Intel OpenMP
  only speed the CPU backend up;
- `compile_again`: "Compiling model again due to a load failure" (compilation/decorators.py:334): an AOT
  compile cache miss; vLLM recompiles;
- `triton`: "Triton is installed, but doesn't include CPU backend" (triton_utils/importing.py:45), "Triton
  is not installed. triton-cpu is expected" (platforms/cpu.py:225), "Model Runner V2 requires Triton"
  (config/vllm.py:726): the CPU backend runs without Triton;
- `global_seed`: "The global random seed is set to" (engine/arg_utils.py:1946): vLLM reseeds the process;
  `_preserve_process_state` restores every RNG state after start-up;
- `ssm_cache`: "Reset SSM cache type to float32" (platforms/cpu.py:318): a Mamba setting, no Mamba here;
- `reduce_op`: FutureWarning "`torch.distributed.reduce_op` is deprecated" (triton_utils/dispatcher.py:138);
- `numa_membind`: "NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes" (the CPU
  worker's `init_cpu_memory_env` in vLLM's C++ extension, a c10 warning written straight to the process's
  stderr): it states the binding the CPU backend chose. Native lines like it are caught by
  `capture_native_stderr` around the engine's start-up and pass through the same filter.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import IO, Iterator

VLLM_LOGGER = "vllm"
LOG_FILE = "vllm.log"  # in the backend's work directory: <out>/workers/worker-<i>/vllm.log
HARMLESS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("no_weights_layer", r"^\w+: Failed to load weights$"),
        ("set_num_threads", r"doesn't allow to use `torch\.set_num_threads`"),
        ("ld_preload", r"is not found in LD_PRELOAD"),
        ("compile_again", r"Compiling model again due to a load failure"),
        ("triton", r"Triton is installed, but doesn't include CPU backend|Triton is not installed|requires Triton"),
        ("global_seed", r"The global random seed is set to"),
        ("ssm_cache", r"Reset SSM cache type to float32"),
        ("reduce_op", r"`torch\.distributed\.reduce_op` is deprecated"),
        ("numa_membind", r"NUMA binding: Using MEMBIND policy"),
    )
)
FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


def harmless_kind(message: str) -> str | None:
    """The `HARMLESS` kind a vLLM message is, or None."""
    return next((name for name, pattern in HARMLESS if pattern.search(message)), None)


class VllmLog(logging.Handler):
    """The `vllm` logger's only handler while installed (module docstring)."""

    def __init__(self, path: Path | None, console: IO[str] | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter(FORMAT))
        self.path = path
        self.console = console
        self.counts: Counter[str] = Counter()
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._saved: tuple[list[logging.Handler], bool, int] | None = None

    def install(self) -> "VllmLog":
        logger = logging.getLogger(VLLM_LOGGER)
        self._saved = (list(logger.handlers), logger.propagate, logger.level)
        logger.handlers = [self]
        logger.propagate = False
        logger.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
        return self

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log_line(self.format(record), record.getMessage(), record.levelno)
        except Exception:  # a log line must never break the run
            self.handleError(record)

    def log_line(self, line: str, message: str, level: int) -> None:
        """Write one record: to the file (a harmless kind only the first time), to the console when it may matter."""
        kind = harmless_kind(message)
        if kind is not None:
            self.counts[kind] += 1
            if self.counts[kind] > 1:
                return
            line += f"  [known harmless: {kind}; repeats are counted, not written]"
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if kind is None and level >= logging.WARNING:
            print(line, file=self.console or sys.stderr)

    def close(self) -> None:
        if self._saved is not None:
            logger = logging.getLogger(VLLM_LOGGER)
            logger.handlers, logger.propagate, level = self._saved
            logger.setLevel(level)
            self._saved = None
        if self._file is not None:
            for kind, count in sorted(self.counts.items()):
                if count > 1:
                    self._file.write(f"(known harmless '{kind}': {count} in all, the first above)\n")
            self._file.close()
            self._file = None
        super().close()


@contextlib.contextmanager
def capture_warnings(log: VllmLog) -> Iterator[None]:
    """Python warnings raised inside vLLM's files go to `log` (harmless kinds once); others are shown as usual."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    marker = f"{os.sep}vllm{os.sep}"
    for w in caught:
        if marker in str(w.filename):
            text = f"{w.category.__name__}: {w.message}"
            log.log_line(f"warning {w.filename}:{w.lineno}: {text}", text, logging.WARNING)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


@contextlib.contextmanager
def capture_native_stderr(log: VllmLog) -> Iterator[None]:
    """The process's stderr (file descriptor 2: C++ warnings that bypass Python) goes to a temporary file while
    the block runs; afterwards each line is passed to `log` (a harmless kind to the file once, the rest to the
    console as before, only later). Python's own writes to stderr in the block are replayed the same way."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for raw in sink.read().decode("utf-8", "replace").splitlines():
                if raw.strip():
                    log.log_line(raw, raw, logging.WARNING)
