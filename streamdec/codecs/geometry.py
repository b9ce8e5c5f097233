"""Receptive-field geometry: which input samples can reach an output sample, layer by layer.

Every layer of a decoder answers one question through :meth:`Geometric.input_interval`: "for the
inclusive range of output indices ``[lo, hi]``, which inclusive range of input indices can influence
it?". Composite modules answer it by composing their children backwards (:func:`through`) and taking
the hull over parallel branches and residual paths (:func:`hull`, :func:`residual`). A codec applies
this to the samples of one output frame and reads off its exact latent context (:func:`frame_context`).

The analysis is for the interior of a signal: padding is treated as virtual samples at negative (or
past-the-end) indices, so edge effects of zero or replicate padding are not modelled. Indices are plain
Python integers; nothing here touches tensors, so the figures are exact.

The result is the exact *support* (the hull of every path of non-zero taps), which is what bit-exact
windowed decoding needs. With real weights the outermost paths multiply dozens of small filter tail taps
(about 2e-3 per alias-free filter end), so their effect underflows even float64: in the AuK decoder a
latent bump is numerically invisible in the last few frames of the support. Tests therefore prove
tightness with non-negative weights (no cancellation, no underflow) and soundness with random weights.

Conventions the helpers implement (``k`` kernel, ``s`` stride, ``d`` dilation):

* Conv1d with ``pad_left`` samples before the input: output ``t`` reads ``[t*s - pad_left,
  t*s - pad_left + (k-1)*d]``. Right padding only changes the output length, not the indexing.
* ConvTranspose1d: before cropping, output ``o`` receives input ``i`` iff ``0 <= o - i*s <= k-1``.
  Cropping ``crop_left`` leading outputs shifts ``o`` by that much; padding the input by ``pad_left``
  shifts ``i`` back. Dropping trailing outputs (the causal trim) changes nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "Geometric",
    "Interval",
    "conv_interval",
    "conv_transpose_interval",
    "frame_context",
    "hull",
    "residual",
    "through",
]

Interval = tuple[int, int]  # inclusive [lo, hi]


@runtime_checkable
class Geometric(Protocol):
    """A layer that can say which input indices feed a range of its output indices."""

    def input_interval(self, lo: int, hi: int) -> Interval:
        """Inclusive input index range that can influence outputs ``lo..hi`` (inclusive)."""
        ...


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def conv_interval(
    lo: int, hi: int, *, kernel: int, stride: int = 1, dilation: int = 1, pad_left: int = 0
) -> Interval:
    """Input range of a Conv1d (see the module docstring for the convention)."""
    return lo * stride - pad_left, hi * stride - pad_left + (kernel - 1) * dilation


def conv_transpose_interval(
    lo: int, hi: int, *, kernel: int, stride: int, crop_left: int = 0, pad_left: int = 0
) -> Interval:
    """Input range of a ConvTranspose1d whose first ``crop_left`` outputs were cropped away."""
    lo_full, hi_full = lo + crop_left, hi + crop_left
    return _ceil_div(lo_full - kernel + 1, stride) - pad_left, hi_full // stride - pad_left


def hull(intervals: Iterable[Interval]) -> Interval:
    """Smallest interval holding all given intervals (the union over parallel branches)."""
    items = list(intervals)
    if not items:
        raise ValueError("hull() needs at least one interval")
    return min(lo for lo, _ in items), max(hi for _, hi in items)


def through(layers: Sequence[Geometric], lo: int, hi: int) -> Interval:
    """Input range of ``layers`` applied in order (``layers[-1]`` produces the output)."""
    for layer in reversed(layers):
        lo, hi = layer.input_interval(lo, hi)
    return lo, hi


def residual(branch: Sequence[Geometric], lo: int, hi: int) -> Interval:
    """Input range of ``x + branch(x)``: the identity path united with the branch."""
    return hull([(lo, hi), through(branch, lo, hi)])


def frame_context(network: Geometric, hop_size: int) -> tuple[int, int]:
    """Latent context ``(left, right)`` of an output frame of a network mapping frames to samples.

    ``network.input_interval`` maps output sample indices to input latent frame indices. Frame 0 owns
    samples ``0 .. hop_size-1``; taking them all at once covers every phase of the frame. Output frame
    ``g`` can then be influenced by latent frames ``g-left .. g+right`` (shift invariance by whole
    frames holds because every upsampling factor divides ``hop_size``).
    """
    lo, hi = network.input_interval(0, hop_size - 1)
    return -lo, hi
