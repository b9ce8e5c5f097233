"""Summaries of repeated measurements and device-aware timing.

Every figure the benchmark reports is a median (p50) with its p99 over repeated runs; warm-up calls are
made before the timed ones and never enter a summary.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["Summary", "graph_ms", "median_ms", "summary", "timed"]

T = TypeVar("T")
Summary = dict[str, float | int | None]


def summary(values: Sequence[float], scale: float = 1.0) -> Summary:
    """``{n, p50, p90, p99, min, max, mean}`` of ``values`` times ``scale`` (None fields when empty)."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "min": None, "max": None, "mean": None}
    a = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "n": len(a),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "min": float(a.min()),
        "max": float(a.max()),
        "mean": float(a.mean()),
    }


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """Run ``fn`` once; seconds it took on ``device``.

    On CUDA: events on the current stream around the call, then a synchronisation before reading them
    (the call's kernels are asynchronous, a host clock alone would time only their launch). Elsewhere a
    host clock around the call.
    """
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, float(start.elapsed_time(end)) / 1000.0
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def median_ms(
    fn: Callable[[], Any], reps: int, *, warm: int = 0, stream: torch.cuda.Stream | None = None
) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` on CUDA, each between two events recorded on
    ``stream`` (the current stream by default), after ``warm`` untimed calls and a synchronisation."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def graph_ms(fn: Callable[[], Any], *, calls: int = 5, reps: int = 10) -> float:
    """Milliseconds of one call of ``fn`` on CUDA without its host launch cost: ``calls`` calls captured
    in one CUDA graph, the replays timed by :func:`median_ms`, divided by ``calls``. Two calls on a side
    stream first (compiles, allocator, cuDNN heuristics stay out of the capture)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    ms = median_ms(graph.replay, reps, warm=1)
    del graph
    return ms / calls
