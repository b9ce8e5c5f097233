"""How a codec's convolutions use a CUDA GPU's matrix units: ``"fp32"``, ``"tf32x3"`` or ``"tf32"``.

* ``"fp32"`` (default): true float32 on CUDA cores. Exact to float32 round-off, and the slowest on a GPU:
  AuK's dense convolutions run at about a third of the tensor-core rate.
* ``"tf32"``: cuDNN rounds every operand to TF32 (a 10-bit mantissa). About 3x faster, but it moves AuK's
  output by about 1e-3, and two graphs whose convolutions cuDNN implements differently (an eager call and
  a compiled one) then disagree by 62-68 dB: that breaks "streamed equals offline" at 1e-4.
* ``"tf32x3"``: float32 accuracy from TF32 tensor cores, by splitting each operand into a TF32 head and
  a float32 tail and keeping three of the four partial products (NVIDIA's "3xTF32", as CUTLASS names it)::

      x = x_hi + x_lo,  w = w_hi + w_lo      x_hi, w_hi: rounded to 11 significant bits (exact in TF32)
      conv(x, w) ~ conv(x_hi, w_hi) + conv(x_hi, w_lo) + conv(x_lo, w_hi)

  Each tail is at most ``2**-11`` of its operand, so the dropped ``x_lo * w_lo`` is at most ``2**-22`` of
  ``|x * w|``, and TF32's rounding of the tails adds the same order again: each product carries an error
  of a few float32 units (``2**-24``) while every multiply runs on tensor cores. A convolution sums over input channels, so the three terms are one convolution over three
  stacked copies of the input channels, ``[x_hi, x_hi, x_lo]`` against ``[w_hi, w_lo, w_hi]``: one
  kernel launch with three times the FLOPs, and weights split once and cached (three times the conv
  weights' memory).

The split happens only on CUDA float32 tensors; on the CPU every precision computes plain float32. Only
this package's conv layers know how to split (:func:`streamdec.codecs.layers.set_split_convs`): a codec
holding another convolution module cannot take ``"tf32x3"``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from streamdec.errors import ConfigError

__all__ = ["PRECISIONS", "Precision", "check_precision", "split_input", "split_tf32", "split_weight"]

Precision = Literal["fp32", "tf32x3", "tf32"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

# float32: 1 sign, 8 exponent, 23 mantissa bits. TF32 keeps the top 10 mantissa bits; adding half of the
# dropped range and masking rounds to nearest (ties away from zero) in the magnitude bits, for either sign.
_TF32_DROPPED_BITS = 13
_ROUND_HALF = 1 << (_TF32_DROPPED_BITS - 1)
_KEEP_MASK = -(1 << _TF32_DROPPED_BITS)  # ...1110_0000_0000_0000 as int32


def check_precision(value: object) -> Precision:
    """``value`` as a :data:`Precision`, or a :class:`ConfigError` naming the choices."""
    if value not in PRECISIONS:
        raise ConfigError(f"precision {value!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    return value


def split_tf32(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(hi, lo)`` with ``hi + lo == x`` exactly: ``hi`` is ``x`` rounded to TF32, ``lo`` the rest.

    ``|lo|`` is at most half a TF32 unit in the last place, so ``|lo| <= 2**-11 * |x|``. Float32 only.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"split_tf32 splits float32 tensors, got {x.dtype}")
    hi = ((x.view(torch.int32) + _ROUND_HALF) & _KEEP_MASK).view(torch.float32)
    return hi, x - hi


def split_input(x: Tensor) -> Tensor:
    """``[B, C, T]`` -> ``[B, 3C, T]``: ``[x_hi, x_hi, x_lo]`` along channels (pairs with split_weight)."""
    hi, lo = split_tf32(x)
    return torch.cat([hi, hi, lo], dim=1)


def split_weight(weight: Tensor, in_dim: int) -> Tensor:
    """``[w_hi, w_lo, w_hi]`` stacked along ``in_dim``, the weight's input-channel axis.

    ``in_dim`` is 1 for ``conv1d`` weights ``[Cout, Cin, k]`` and 0 for ``conv_transpose1d`` weights
    ``[Cin, Cout, k]``.
    """
    hi, lo = split_tf32(weight.detach())
    return torch.cat([hi, lo, hi], dim=in_dim).contiguous()
