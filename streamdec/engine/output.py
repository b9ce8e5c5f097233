"""What an engine call hands back: one block of audio per device call, each request's part a view of it.

A device call decodes many streams' requests at once, and every one of its tiles needs the same two things
before it can be sent: a check that its audio is finite, and (for most listeners) the audio in s16. Done
per tile, each costs a few numpy calls on a few thousand samples, on the event loop, for every message of
every stream. Done per call, each is one vectorised pass over the block:

* :class:`CallOutput` owns a call's audio ``[rows, channels, samples]`` (one host copy per call, not one
  per request). Which rows are finite is computed where the block is made, on the completer thread; the
  block's s16 values when a tile first asks for them, for every row at once.
* :class:`DecodedAudio` is one request's part: ``samples`` (a view of its row), :meth:`~DecodedAudio.all_finite`
  and :meth:`~DecodedAudio.pcm16`, exactly what the per-tile functions give for those samples.
"""

from __future__ import annotations

import numpy as np
import torch

from ..io import pcm16, s16_values
from ..session import all_finite

__all__ = ["CallOutput", "DecodedAudio"]


class CallOutput:
    """One device call's audio for its live rows, ``[rows, channels, samples]`` float32 on the CPU, owned
    (it aliases no engine buffer). Requests' :class:`DecodedAudio` are views of it."""

    __slots__ = ("_all_finite", "_rows", "_s16", "_s16_bytes", "_width", "finite_rows", "samples")

    def __init__(self, samples: torch.Tensor) -> None:
        self.samples = samples
        values = samples.numpy()
        rows = int(values.shape[0])
        # Exact per row, and it raises no floating-point warning, so it needs no np.errstate (whose
        # context manager costs as much as the pass itself on a call's block): half the time of a float32
        # sum under errstate. Reduced by the ufunc itself: ndarray.all() is a Python wrapper around it.
        self.finite_rows: np.ndarray = np.logical_and.reduce(np.isfinite(values.reshape(rows, -1)), axis=1)
        self._all_finite = bool(np.logical_and.reduce(self.finite_rows))
        # each row's view, over the block's memory: torch.from_numpy keeps the GIL, where unbind (as any
        # torch op) releases it and takes it back, a hand-off to a waiting event loop on every call
        self._rows = list(map(torch.from_numpy, values))
        self._width = int(values.shape[-1])  # samples per row: a part of all of them is the row itself
        self._s16: np.ndarray | None = None
        self._s16_bytes: bytes | None = None  # the s16 block interleaved, [rows, samples, channels]

    def part(self, row: int, lo: int, hi: int) -> DecodedAudio:
        """Samples ``lo:hi`` of ``row`` (a view)."""
        samples = self._rows[row]
        if lo != 0 or hi != self._width:
            samples = samples[:, lo:hi]
        return DecodedAudio(samples, self, row, lo, hi)

    def s16(self) -> np.ndarray:
        """The whole block in s16 ``[rows, channels, samples]``, converted on first use."""
        s16 = self._s16
        if s16 is None:  # two loops may race here: both compute the same values, either is kept
            values = self.samples.numpy()
            if self._all_finite:  # the usual block: no NaN to cast, so no warning to silence
                s16 = s16_values(values)
            else:  # rows that are not finite are converted too (to values nobody sends: their streams end)
                with np.errstate(invalid="ignore"):
                    s16 = s16_values(values)
            self._s16 = s16
        return s16

    def s16_bytes(self, row: int, lo: int, hi: int) -> bytes:
        """Samples ``lo:hi`` of ``row`` as interleaved little-endian s16: a slice of the whole block's
        interleaved bytes, made once (one pass over the block) on the first part's call, so each
        part costs a bytes slice, not a numpy view, a transpose and a copy of its own."""
        blob = self._s16_bytes
        block = self.s16()
        if blob is None:
            blob = self._s16_bytes = block.transpose(0, 2, 1).tobytes()
        _, channels, width = block.shape
        start = row * width * channels
        return blob[(start + lo * channels) * 2 : (start + hi * channels) * 2]


class DecodedAudio:
    """One request's audio ``[channels, n]`` float32: ``samples``, and what its call computed once for all.

    Built without a call (``DecodedAudio(samples)``, an engine that decodes requests one by one) it
    computes both from ``samples``.
    """

    __slots__ = ("_call", "_hi", "_lo", "_row", "samples")

    def __init__(
        self, samples: torch.Tensor, call: CallOutput | None = None, row: int = 0, lo: int = 0, hi: int = 0
    ) -> None:
        self.samples = samples
        self._call, self._row, self._lo, self._hi = call, row, lo, hi

    def all_finite(self) -> bool:
        """Whether every sample is finite (a row that is not is checked again over this part alone: a
        window's part may leave out the columns that are not)."""
        call = self._call
        if call is not None and call.finite_rows[self._row]:
            return True
        with np.errstate(invalid="ignore"):  # +Inf and -Inf sum to NaN: not finite, nothing to warn of
            return all_finite(self.samples.numpy())

    def pcm16(self) -> bytes:
        """Interleaved little-endian s16, as :func:`streamdec.io.pcm16` of ``samples``."""
        call = self._call
        if call is None:
            return pcm16(self.samples)
        return call.s16_bytes(self._row, self._lo, self._hi)
