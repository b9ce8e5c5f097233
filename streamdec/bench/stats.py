"""Summaries of repeated measurements and device-aware timing.

Every figure the benchmark reports is a median (p50) with its p99 over repeated runs; warm-up calls are
made before the timed ones and never enter a summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

__all__ = ["Summary", "summary", "timed"]

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
