"""Replay a shape-stable step as CUDA graphs: one graph per shape key, captured the first time the key runs.

    graphs = StepGraphs(enabled=device.type == "cuda")
    graphs.run(key, fn)     fn() eagerly when disabled; else replay the key's graph (capturing it at first use)
    graphs.reset()          forget every graph (after the buffers `fn` works on were replaced)

A capture that raises (an op CUDA cannot record) turns graphs off for the rest of the call, with a
warning and `failure` set; the step it warmed up has already run, so the decode goes on eagerly.

A thin wrapper: it is only correct because `fn` is shape-stable — it reads and writes only tensors that
exist before the capture and are updated in place (static_step.StaticStep, static_decode), performs no
host read and no data-dependent Python branch, and its launch configuration depends only on `key`.
tests/engine/test_rollout_static.py runs the static loop through this wrapper with a stand-in graph that
checks exactly that (the same buffer addresses at every replay as at the capture).

The first call of a key runs `fn` for real on a side stream (the step is needed anyway; it also does the
lazy CUDA initialisation — cuBLAS workspaces, kernel loading — outside the capture, as the PyTorch docs
on CUDA graphs ask: "warm up ... on a side stream"), then records it with `torch.cuda.graph` (recording
runs nothing). Every graph of one `StepGraphs` shares one memory pool: the steps run one after another
and write their results into the caller's buffers, never into graph-owned tensors that outlive a replay
(torch.cuda.graph `pool=`: sharing is safe for graphs that do not run concurrently and keep no outputs
alive; PyTorch docs, notes/cuda.rst "Graph memory management").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch


class StepGraphs:
    """See the module docstring."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._graphs: dict[Hashable, Any] = {}
        self._pool: Any = None
        self.captures = 0
        self.replays = 0
        self.failure: str | None = None  # why capturing stopped (then every step runs eagerly)

    def run(self, key: Hashable, fn: Callable[[], None]) -> None:
        if not self.enabled:
            fn()
            return
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # the real step for this key, and the warm-up before its capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: only this thread may not make capture-unsafe CUDA calls meanwhile; a profiler's or a
            # benchmark's poller thread (cudaMemGetInfo every 20 ms) may go on (torch.cuda.graph capture_error_mode)
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                fn()  # recorded, not run
        except RuntimeError as exc:  # the step ran (above); later steps run eagerly, the decode goes on
            self.enabled, self.failure = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            warnings.warn(f"CUDA graph capture failed ({self.failure}); decoding on without graphs", stacklevel=2)
            return
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[key] = graph
        self.captures += 1

    def reset(self) -> None:
        self._graphs.clear()
        self._pool = None
