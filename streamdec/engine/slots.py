"""Stateful streams on the device: a pool of per-stream layer state, and batched prime/step/flush calls.

Every stream in stateful mode owns a *slot*: row ``slot`` of one pool tensor per stateful layer
(``[slots + 1, channels, state_len]``, allocated once at start-up, so addresses never change and a captured
graph can read and write them). A batched call takes the slots of its rows as an index tensor and runs
:class:`~streamdec.codecs.stateful.StatefulNet` once for all rows; each layer gathers its rows' state as it
reaches it and scatters its new state straight back, all inside one replay. Padding rows of a batch
bucket point at the extra last row, a scratch slot nobody owns, so they never touch a live stream's state.

Slot bookkeeping (:class:`SlotAllocator`) is pure Python; the engine's lock guards it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..codecs.stateful import StatefulNet
from ..errors import ConfigError, TooManyStreamsError

__all__ = ["SlotAllocator", "StatePool", "StepFn"]

StepFn = Callable[[Tensor, Tensor], Tensor]  # (slot indices [B] int64, latents [B, T, D]) -> audio


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
    """Per-layer state of ``slots`` streams (plus one scratch row) on the codec's device."""

    def __init__(self, net: StatefulNet, slots: int, *, device: torch.device, dtype: torch.dtype) -> None:
        self.net = net
        self.slots = slots
        self.scratch = slots  # the row padding rows read and write
        self.tensors = [
            torch.zeros(slots + 1, spec.channels, spec.length, device=device, dtype=dtype)
            for spec in net.specs
        ]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def fn(self, kind: str) -> StepFn:
        """The batched call for ``kind`` (``"prime"``, ``"step"`` or ``"flush"``): capturable, no host sync."""
        if kind == "prime":
            return self.prime
        if kind == "step":
            return self.step
        if kind == "flush":
            return self.flush
        raise ConfigError(f"unknown stateful call {kind!r}: expected 'prime', 'step' or 'flush'")

    def prime(self, slots: Tensor, z: Tensor) -> Tensor:
        return self.net.prime_into(z, _SlotStates(self.tensors, slots))

    def step(self, slots: Tensor, z: Tensor) -> Tensor:
        return self.net.step_with(z, _SlotStates(self.tensors, slots))

    def flush(self, slots: Tensor, z: Tensor) -> Tensor:
        return self.net.flush_with(z, _SlotStates(self.tensors, slots))


class _SlotStates:
    """The states of the streams in ``slots``, gathered from the pool when a layer reads them and
    scattered back the moment the layer has its new state.

    Reading and writing layer by layer bounds a call's working memory by one layer's tensors: a new
    state is a view of its layer's whole input, and collecting them all until the end of the call held
    every layer's input at once (8 GiB for 64 x 16 frames of auk-24k). Each leaf reads its state before
    writing it, and a read is a copy (``index_select``), so writing early never changes what is read.
    """

    def __init__(self, tensors: list[Tensor], slots: Tensor) -> None:
        self.tensors = tensors
        self.slots = slots

    def get(self, index: int) -> Tensor:
        return self.tensors[index].index_select(0, self.slots)

    def put(self, index: int, value: Tensor) -> None:
        pool = self.tensors[index]
        pool.index_copy_(0, self.slots, value.to(pool.dtype))
