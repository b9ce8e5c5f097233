"""Padding rows a batched stateful call's kernels may skip: which rows are real, read on the device.

A captured graph decodes a fixed batch bucket; a replay that holds fewer streams fills the rest with padding
rows (the scratch slot's), which cost as much as real ones wherever a kernel computes every row. Inside
:func:`live_rows` the kernels that work row by row (the float16 split convolution, its input split and row
peaks, the fused activation) read the number of real rows from a device tensor and do no work for the rows
at or past it: those rows' outputs are left unwritten or hold partial values, and nothing but other padding
rows ever reads them. The count is read at run time, so one captured graph serves any fill of its bucket,
and the engine writes it beside the slot indices before each replay.

Padding rows must be the batch's last rows (the engine puts them there). A real row's outputs are the same
bits with or without the count: no kernel's arithmetic for a row depends on the other rows. Outside the
context (halo windows, eager calls, the CPU) every row is computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from streamdec.errors import DTypeError, ShapeError

__all__ = ["live_count", "live_rows"]

_LIVE: ContextVar[Tensor | None] = ContextVar("streamdec_live_rows", default=None)


@contextmanager
def live_rows(count: Tensor | None) -> Iterator[None]:
    """Kernels launched inside skip batch rows ``>= count[0]`` (``count``: a one-element int64 tensor on the
    batch's device; None: skip nothing)."""
    if count is not None and count.shape != (1,):
        raise ShapeError(f"live_rows takes a one-element tensor, got shape {tuple(count.shape)}")
    if count is not None and count.dtype != torch.int64:
        raise DTypeError(f"live_rows takes an int64 count (the kernels read it as one), got {count.dtype}")
    token = _LIVE.set(count)
    try:
        yield
    finally:
        _LIVE.reset(token)


def live_count() -> Tensor | None:
    """The live-row count that kernels launched now read, or None: compute every row."""
    return _LIVE.get()
