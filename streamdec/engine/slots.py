"""Stateful streams on the device: a pool of per-stream layer state, and batched prime/step/flush calls.

Every stream in stateful mode owns a *slot*: row ``slot`` of one pool tensor ``[slots + lanes, width]``
holding every stateful layer's state side by side (layer ``i`` is the view ``[slots + lanes, channels,
state_len]`` of its columns), allocated once at start-up, so addresses never change and a captured graph
can read and write them. A batched call takes the slots of its rows as an index tensor and runs
:class:`~streamdec.codecs.stateful.StatefulNet` once for all rows: the first layer that reads state
gathers every layer's state of those rows in one copy (``[B, width]``; each layer reads its view of it in
place), and each layer scatters its new state into the pool once it has computed, all inside one replay.
Reads come from the call's copy and writes go to the pool, so no write can change what a later layer
reads. Padding rows of a batch bucket point at an extra row past the slots, a scratch slot nobody owns,
so they never touch a live stream's state (several padding rows write it at once: whichever wins, nobody
reads it). Each lane of calls (:mod:`.lanes`) has its own scratch row, so two calls in flight at once
never share one.
A captured call also reads how many of its rows are real (``live``, beside the slot indices), and its
kernels skip the padding rows (:mod:`streamdec.kernels.rows`): a bucket costs what its streams cost, not
what its size would.

Slot bookkeeping (:class:`SlotAllocator`) is pure Python; the engine's lock guards it.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..codecs.stateful import StatefulNet
from ..errors import ConfigError, TooManyStreamsError
from ..kernels.rows import live_rows
from .lanes import lane_of

__all__ = ["SlotAllocator", "StatePool", "StepFn"]


class StepFn(Protocol):
    """A batched stateful call: slot indices ``[B]`` int64 and latents ``[B, T, D]`` -> audio; ``live``
    (``[1]`` int64 on the device), if given, is how many of the rows are real (the rest are padding)."""

    def __call__(self, slots: Tensor, z: Tensor, live: Tensor | None = None) -> Tensor: ...


class SlotAllocator:
    """Hands out slot numbers ``0 .. slots-1``; lowest free first, so a short-lived server stays compact."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ConfigError(f"max_streams must be >= 1 for stateful streaming, got {slots}")
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def in_use(self) -> int:
        return len(self._used)

    def take(self) -> int:
        if not self._free:
            raise TooManyStreamsError(
                f"all {self.slots} stream slots are in use: wait for a stream to end, or raise max_streams "
                f"(each slot holds one stream's layer state on the device)"
            )
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def give_back(self, slot: int) -> None:
        if slot not in self._used:
            raise ConfigError(f"slot {slot} is not in use")
        self._used.remove(slot)
        self._free.append(slot)
        self._free.sort(reverse=True)


class StatePool:
    """Per-layer state of ``slots`` streams (plus a scratch row per lane) on the codec's device.

    ``lanes``: how many lanes of calls may run at once (:mod:`.lanes`); each has a scratch row of its own
    for its padding rows, so two calls in flight never write one row at the same time.

    ``fused`` (default) runs the calls with one gather of every layer's state and the work handed
    across layers (:class:`~streamdec.codecs.stateful.StateIO`); ``fused=False`` gathers each layer's
    state apart and hands nothing over. Both give the same bits."""

    def __init__(
        self,
        net: StatefulNet,
        slots: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
        fused: bool = True,
        lanes: int = 1,
    ) -> None:
        self.net = net
        self.slots = slots
        self.lanes = lanes
        self.scratch = slots  # the row the main lane's padding rows read and write (scratch_row)
        self.fused = fused
        widths = [spec.channels * spec.length for spec in net.specs]
        rows = slots + lanes
        self.flat = torch.zeros(rows, sum(widths), device=device, dtype=dtype)
        self.tensors: list[Tensor] = []  # each layer's view [rows, channels, length] of its columns
        start = 0
        for spec, width in zip(net.specs, widths, strict=True):
            self.tensors.append(self.flat[:, start : start + width].view(rows, spec.channels, spec.length))
            start += width

    def scratch_row(self, kind: str) -> int:
        """The scratch row of the lane that runs calls of ``kind``."""
        return self.slots + lane_of(kind, self.lanes)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def _io(self, slots: Tensor) -> _GatheredStates | _SlotStates:
        return (
            _GatheredStates(self.flat, self.tensors, slots)
            if self.fused
            else _SlotStates(self.tensors, slots)
        )

    def fn(self, kind: str) -> StepFn:
        """The batched call for ``kind`` (``"prime"``, ``"step"`` or ``"flush"``): capturable, no host sync."""
        if kind == "prime":
            return self.prime
        if kind == "step":
            return self.step
        if kind == "flush":
            return self.flush
        raise ConfigError(f"unknown stateful call {kind!r}: expected 'prime', 'step' or 'flush'")

    # ``live``: a one-element device tensor, the number of real rows (the first ones; the rest are
    # padding the kernels skip), or None: every row is real.

    def prime(self, slots: Tensor, z: Tensor, live: Tensor | None = None) -> Tensor:
        with live_rows(live):
            return self.net.prime_into(z, self._io(slots))

    def step(self, slots: Tensor, z: Tensor, live: Tensor | None = None) -> Tensor:
        with live_rows(live):
            return self.net.step_with(z, self._io(slots))

    def flush(self, slots: Tensor, z: Tensor, live: Tensor | None = None) -> Tensor:
        with live_rows(live):
            return self.net.flush_with(z, self._io(slots))


class _GatheredStates:
    """The states of the streams in ``slots``: gathered from the pool for every layer in one copy when the
    first layer reads, and scattered back layer by layer the moment a layer has its new state.

    One gather instead of one per layer: a step of auk-24k reads about 140 states, and at small batches
    the step's time is its launches. The copy is ``B x`` a stream's state (0.67 GB at 256 rows of
    auk-24k) and lives for the call. New states go to the pool as soon as they exist: a new state is a
    view of its layer's whole input, and collecting them all until the end of the call would hold every
    layer's input at once (8 GiB for 64 x 16 frames of auk-24k). Writes never reach the call's copy, so
    they never change what a layer reads.
    """

    fuse = True

    def __init__(self, flat: Tensor, tensors: list[Tensor], slots: Tensor) -> None:
        self.flat = flat
        self.tensors = tensors
        self.slots = slots
        self._views: list[Tensor] | None = None

    def get(self, index: int) -> Tensor:
        if self._views is None:
            self._views = self._gather()
        return self._views[index]

    def _gather(self) -> list[Tensor]:
        rows = self.flat.index_select(0, self.slots)  # [B, width], one launch for every layer
        views, start = [], 0
        for pool in self.tensors:
            width = pool.shape[1] * pool.shape[2]
            views.append(rows[:, start : start + width].view(rows.shape[0], pool.shape[1], pool.shape[2]))
            start += width
        return views

    def put(self, index: int, value: Tensor) -> None:
        pool = self.tensors[index]
        pool.index_copy_(0, self.slots, value.to(pool.dtype))

    def target(self, index: int) -> tuple[Tensor, Tensor]:
        return self.tensors[index], self.slots


class _SlotStates:
    """The states of the streams in ``slots``, gathered from the pool when a layer reads them and
    scattered back the moment the layer has its new state, with nothing handed across layers: the
    unfused step (``StatePool(fused=False)``), kept to measure and check the fused one against.

    A read is a copy (``index_select``), so writing early never changes what is read.
    """

    fuse = False

    def __init__(self, tensors: list[Tensor], slots: Tensor) -> None:
        self.tensors = tensors
        self.slots = slots

    def get(self, index: int) -> Tensor:
        return self.tensors[index].index_select(0, self.slots)

    def put(self, index: int, value: Tensor) -> None:
        pool = self.tensors[index]
        pool.index_copy_(0, self.slots, value.to(pool.dtype))

    def target(self, index: int) -> None:
        return None  # the per-layer step keeps every layer's write its own pass
