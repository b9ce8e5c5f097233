"""How a codec's convolutions use a CUDA GPU's matrix units: ``"fp32"``, ``"tf32x3"``, ``"fp16x3"``, ``"tf32"``.

* ``"fp32"`` (default): true float32 on CUDA cores. Exact to float32 round-off, and the slowest on a GPU
  at large batches.
* ``"tf32"``: cuDNN rounds every operand to TF32 (a 10-bit mantissa). About 3x faster, but it moves AuK's
  output by about 1e-3, and two graphs whose convolutions cuDNN implements differently (an eager call and
  a compiled one) then disagree by 62-68 dB: that breaks "streamed equals offline" at 1e-4.
* ``"tf32x3"``: TF32 tensor cores with split operands. Each operand is split into a TF32 head and a
  float32 tail and three of the four partial products are kept (NVIDIA's "3xTF32", as CUTLASS names it)::

      x = x_hi + x_lo,  w = w_hi + w_lo      x_hi, w_hi: rounded to 11 significant bits (exact in TF32)
      conv(x, w) ~ conv(x_hi, w_hi) + conv(x_hi, w_lo) + conv(x_lo, w_hi)

  Each tail is at most ``2**-11`` of its operand, so the dropped ``x_lo * w_lo`` is at most ``2**-22`` of
  ``|x * w|``: the products carry float32-level error (tests/test_precision.py shows it on an emulated
  tensor core). A convolution sums over input channels, so the three terms are one convolution over three
  stacked copies of the input channels, ``[x_hi, x_hi, x_lo]`` against ``[w_hi, w_lo, w_hi]``: one kernel
  launch with three times the FLOPs, and weights split once and cached (three times the conv weights'
  memory).

  Through cuDNN it is not float32, though: measured on an H200, the tensor cores' float32 accumulator
  loses a little at every MMA step (it behaves like truncation, not round-to-nearest), so a layer's error
  grows with its reduction length ``3 * Cin * k``: about 1e-6 of the output peak at 200 terms, 2-3e-5 at
  7,000, in cuDNN and cuBLAS alike, against 0.4-3e-6 for float32 on CUDA cores and 3e-4 for plain TF32
  (``scripts/probe_conv_precision.py``; ``docs/precision.md``); a whole AuK decode lands at
  83 dB against float64. So where Triton is installed, ``"tf32x3"`` runs this package's convolutions
  through its own kernel (:mod:`streamdec.kernels.conv`), which takes the same three products but starts a
  fresh accumulator every reduction step and adds the steps in plain float32: a whole AuK decode then
  lands at 120 dB (fp32: 115 dB, tf32: 61 dB; max abs 1.3e-6, 2.6e-6, 1.2e-3). ``STREAMDEC_TRITON_CONV=0``
  falls back to the stacked cuDNN form above.

* ``"fp16x3"``: the same three products on the float16 tensor cores, where this package's float16 kernel
  runs (Triton and a GPU with TMA: compute capability 9.0, an H100 or H200). Each operand is first scaled
  by a power of two (one per batch row of the input, one per output channel of the weight) so that its
  largest magnitude lands in ``[2**13, 2**14)``, then split into a float16 head and tail
  (:func:`split_input_f16`, :func:`pack_split_weight_f16`): 22 bits, like the TF32 split, in half the
  bytes, and float16 products run at twice TF32's rate. The scales are exact and factor out of every sum.
  Each step's three products go into a fresh tensor-core accumulator, as in the TF32 kernel. A whole AuK
  decode lands at 122 dB against float64 on an H200 (max abs 1.1e-6), a layer at 0.05-0.2x cuDNN fp32's
  error. Layers the float16 kernel cannot take run as ``"tf32x3"`` does.

The split happens only on CUDA float32 tensors; on the CPU every precision computes plain float32. Only
this package's conv layers know how to split (:func:`streamdec.codecs.layers.set_split_convs`): a codec
holding another convolution module cannot take ``"tf32x3"`` or ``"fp16x3"``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from streamdec.errors import ConfigError

__all__ = [
    "AUTO_PREFERENCE",
    "F16_CHANNEL_QUANTUM",
    "PRECISIONS",
    "Precision",
    "check_precision",
    "pack_split_weight",
    "pack_split_weight_f16",
    "pow2_scale",
    "split_input",
    "split_input_f16",
    "split_tf32",
    "split_weight",
]

Precision = Literal["fp32", "tf32x3", "fp16x3", "tf32"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
# What Codec.use_auto_precision tries, in order: the first with every convolution on a Triton split kernel.
AUTO_PREFERENCE: tuple[Precision, ...] = ("fp16x3", "tf32x3")

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


def pack_split_weight(weight: Tensor) -> Tensor:
    """Conv weight ``[Cout, Cin, k]`` -> ``[2, k, Cout, Cin]``: heads then tails, tap-major, contiguous.

    The layout of ``torch.ops.streamdec.conv1d_split_tf32`` (:mod:`streamdec.kernels.conv`).
    """
    hi, lo = split_tf32(weight.detach())
    return torch.stack([hi, lo]).permute(0, 3, 1, 2).contiguous()


# float16 split ("fp16x3"): each operand is scaled by a power of two so its largest magnitude lands in
# [2**13, 2**14), then split into two float16 parts. The kernel reads inputs channels-last with the
# channels padded to a multiple of F16_CHANNEL_QUANTUM: a TMA box then never crosses into the next
# sample's channels, and every row starts 16-byte aligned.
F16_CHANNEL_QUANTUM = 32
_F32_EXPONENT_BIAS = 127
_F32_MANTISSA_BITS = 23
_F16_TOP_EXPONENT = 14  # largest scaled magnitude below 2**14: float16 holds up to 65504


def pow2_scale(amax: Tensor) -> tuple[Tensor, Tensor]:
    """``(2**k, 2**-k)`` float32, elementwise, with ``amax * 2**k`` in ``[2**13, 2**14)`` for normal ``amax``.

    Read off the exponent bits, so exact; ``k`` is clamped to ``[-126, 126]`` (both factors stay normal
    floats), which only matters for a zero or subnormal ``amax``.
    """
    if amax.dtype != torch.float32:
        raise TypeError(f"pow2_scale takes float32 magnitudes, got {amax.dtype}")
    biased = (amax.view(torch.int32) >> _F32_MANTISSA_BITS) & 0xFF  # amax in [2**(e-127), 2**(e-126))
    k = (_F16_TOP_EXPONENT + _F32_EXPONENT_BIAS - 1 - biased).clamp(-126, 126)
    scale = ((k + _F32_EXPONENT_BIAS) << _F32_MANTISSA_BITS).view(torch.float32)
    inverse = ((_F32_EXPONENT_BIAS - k) << _F32_MANTISSA_BITS).view(torch.float32)
    return scale, inverse


def _split_f16(scaled: Tensor) -> tuple[Tensor, Tensor]:
    # float16 keeps float32's top 10 mantissa bits, as TF32 does: round with integer ops, so that the head
    # is rounded by the time the tail is formed even inside a torch.compile'd kernel (Inductor keeps
    # float16 intermediates in float32 registers, unrounded, unless they are stored).
    hi, lo = split_tf32(scaled)  # |scaled| < 2**14: the head fits float16 (exactly, above 2**-14)
    return hi.to(torch.float16), lo.to(torch.float16)


def split_input_f16(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``[B, C, T]`` float32 -> ``(hi, lo, inverse)`` with ``(hi + lo) * inverse[b] ~ x`` to 22 bits.

    ``hi`` and ``lo`` are float16 and channels-last, ``[B, T, C']`` with the channels zero-padded to
    :data:`F16_CHANNEL_QUANTUM`. The scale is one power of two per batch row (from the row's largest
    magnitude), so a row's parts never depend on the other rows. ``lo`` is within ``2**-12`` of
    ``x - hi`` relative to it, or ``2**-25`` absolute in scaled units where it is subnormal (``2**-38``
    of the row's peak).
    """
    if x.dtype != torch.float32 or x.dim() != 3:
        raise TypeError(f"split_input_f16 splits float32 [B, C, T] tensors, got {x.dtype} {tuple(x.shape)}")
    scale, inverse = pow2_scale(x.abs().amax(dim=(1, 2)))
    scaled = (x * scale[:, None, None]).transpose(1, 2)
    hi, lo = _split_f16(torch.nn.functional.pad(scaled, (0, -x.shape[1] % F16_CHANNEL_QUANTUM)))
    return hi.contiguous(), lo.contiguous(), inverse


def pack_split_weight_f16(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Conv weight ``[Cout, Cin, k]`` float32 -> ``(packed, inverse)``: ``packed`` float16
    ``[2, k, Cout, Cin']`` (heads then tails, tap-major, input channels zero-padded to
    :data:`F16_CHANNEL_QUANTUM`) with ``(hi + lo) * inverse[o] ~ w`` to 22 bits, one power-of-two scale
    per output channel."""
    if weight.dtype != torch.float32 or weight.dim() != 3:
        raise TypeError(
            f"pack_split_weight_f16 packs float32 [Cout, Cin, k], got {weight.dtype} {tuple(weight.shape)}"
        )
    w = weight.detach()
    scale, inverse = pow2_scale(w.abs().amax(dim=(1, 2)))
    pads = (0, 0, 0, -w.shape[1] % F16_CHANNEL_QUANTUM)
    hi, lo = _split_f16(torch.nn.functional.pad(w * scale[:, None, None], pads))
    return torch.stack([hi, lo]).permute(0, 3, 1, 2).contiguous(), inverse
