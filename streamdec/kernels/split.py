"""Operand splitting for the split-precision convolution kernels (pure tensor arithmetic, no Triton).

A float32 operand is cut into a head and a tail whose sum is the operand (exactly for the TF32 split, to 22
bits for the float16 one), and weights are packed in the layouts the kernels of
:mod:`streamdec.kernels.conv` read. Why three products of split operands keep float32 accuracy on tensor
cores is told in :mod:`streamdec.codecs.precision`, which names the precisions that use these helpers.

* :func:`split_tf32`: ``x = hi + lo`` exactly, ``hi`` rounded to TF32 (11 significant bits).
* :func:`split_input` / :func:`split_weight`: the stacked ``[x_hi, x_hi, x_lo]`` against
  ``[w_hi, w_lo, w_hi]`` form, one cuDNN convolution over three times the input channels.
* :func:`pack_split_weight`: ``[2, k, Cout, Cin]`` heads and tails for ``conv1d_split_tf32``.
* :func:`split_input_f16` / :func:`pack_split_weight_f16`: power-of-two scaled float16 halves, channels
  padded to :data:`F16_CHANNEL_QUANTUM`, for ``conv1d_split_f16``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "F16_CHANNEL_QUANTUM",
    "pack_split_weight",
    "pack_split_weight_f16",
    "pow2_scale",
    "split_input",
    "split_input_f16",
    "split_tf32",
    "split_weight",
    "takes_split",
]

# float32: 1 sign, 8 exponent, 23 mantissa bits. TF32 keeps the top 10 mantissa bits; adding half of the
# dropped range and masking rounds to nearest (ties away from zero) in the magnitude bits, for either sign.
_TF32_DROPPED_BITS = 13
_ROUND_HALF = 1 << (_TF32_DROPPED_BITS - 1)
_KEEP_MASK = -(1 << _TF32_DROPPED_BITS)  # ...1110_0000_0000_0000 as int32


def takes_split(x: Tensor) -> bool:
    """Whether a split-precision layer splits this input: TF32 exists only on CUDA, and only float32 is split."""
    return x.is_cuda and x.dtype == torch.float32


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
