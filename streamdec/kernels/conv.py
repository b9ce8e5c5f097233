"""Split convolutions with float32 accumulation between steps: custom ops and dispatch rules.

Two ops. ``conv1d_split_tf32`` (below) takes TF32 splits, for ``"tf32x3"``. ``conv1d_split_f16`` takes the
input whole and a weight split into float16 halves under per-output-channel power-of-two scales, for
``"fp16x3"``: on CUDA it splits the input itself (:func:`streamdec.kernels._triton_conv_f16.split_f16`, one
scale per batch row) and runs :mod:`streamdec.kernels._triton_conv_f16` (TMA, so compute capability 9.0:
:func:`f16_conv_supported`); half the operand bytes and twice the product rate of the TF32 split, 122 dB on
a whole AuK decode. It also takes what would otherwise be passes of their own over the layer's input or
output: the zero padding (written by the split), a residual (added in the epilogue) and the input's row
peaks (from the fused activation that produced it). The rest of this docstring is about the TF32 op.

Contract of ``torch.ops.streamdec.conv1d_split_tf32(x_hi, x_lo, w_hi, w_lo, bias, dilation)``: ``x_hi`` and
``x_lo`` are an already padded ``[B, Cin, Tin]`` float32 input's TF32 heads and tails
(:func:`streamdec.kernels.split.split_tf32`), ``w_hi`` and ``w_lo`` the weight's, packed tap-major,
``[k, Cout, Cin]`` (:func:`streamdec.kernels.split.pack_split_weight`), ``bias`` is ``[Cout]`` or
None; the result is ``conv1d(x, w, bias, dilation=dilation)``, ``[B, Cout, Tin - (k-1)*dilation]``.
:func:`split_conv1d` splits the input and calls it; the split is plain tensor code outside the op so that
``torch.compile`` fuses it into whatever produced the input (the padding, a residual add).

On CUDA the op runs the Triton kernel of :mod:`streamdec.kernels._triton_conv`, whose point is accuracy
at tensor-core speed: the split precision through cuDNN lands at 83 dB on a whole AuK decode because one
tensor-core accumulator carries each whole reduction; the kernel restarts it every step and lands at
120 dB (float32 on CUDA cores: 115). On the CPU it runs ``F.conv1d`` on ``x_hi + x_lo`` and
``w_hi + w_lo`` (which are ``x`` and ``w`` exactly). It has a fake implementation, so ``torch.compile``
traces it as one node and CUDA graphs capture its launch.

On wherever Triton is installed; ``STREAMDEC_TRITON_CONV=0`` at import turns it off (the ``"tf32x3"``
precision then runs the stacked cuDNN split, at 83 dB). When on, ``"tf32x3"`` sends every
:class:`~streamdec.codecs.layers.PaddedConv1d` through it, and every
:class:`~streamdec.codecs.layers.CausalConvTranspose1d` whose kernel is a multiple of its stride as one
convolution per output phase.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from streamdec import settings
from streamdec.errors import DTypeError, ShapeError
from streamdec.kernels.availability import HAS_TRITON, direct_cuda_call, launch_device
from streamdec.kernels.split import F16_CHANNEL_QUANTUM, split_input_f16, split_tf32

__all__ = [
    "ENABLED",
    "ENV_ENABLE",
    "check_keep",
    "conv1d_split_f16",
    "conv1d_split_f16_keep",
    "conv1d_split_tf32",
    "f16_conv_supported",
    "keep_pair",
    "keep_tail",
    "split_conv1d",
    "split_conv1d_f16",
    "triton_conv_supported",
]

ENV_ENABLE = settings.TRITON_CONV.name
# Read once at import, like STREAMDEC_NO_FUSED: compiled graphs trace module constants.
ENABLED = settings.TRITON_CONV.value()


def triton_conv_supported(x: Tensor) -> bool:
    """True when a tf32x3 conv layer may send input ``x`` through the Triton kernel."""
    return ENABLED and HAS_TRITON and x.is_cuda and x.dtype == torch.float32 and x.dim() == 3


def f16_conv_supported(weight: Tensor) -> bool:
    """True when an fp16x3 conv layer with this ``[Cout, Cin, k]`` weight may use the float16 kernel:
    the Triton conv is on, and the GPU has TMA (compute capability 9.0 or newer)."""
    return triton_conv_supported(weight) and torch.cuda.get_device_capability(weight.device) >= (9, 0)


def _check(
    x_hi: Tensor, x_lo: Tensor, w_hi: Tensor, w_lo: Tensor, bias: Tensor | None, dilation: int
) -> None:
    if x_hi.dim() != 3 or x_hi.shape != x_lo.shape or w_hi.dim() != 3 or w_hi.shape != w_lo.shape:
        raise ShapeError(
            f"conv1d_split_tf32 needs x_hi, x_lo [B, Cin, T] of one shape and w_hi, w_lo [k, Cout, Cin] of "
            f"one shape, got {tuple(x_hi.shape)}, {tuple(x_lo.shape)}, {tuple(w_hi.shape)}, {tuple(w_lo.shape)}"
        )
    if x_hi.shape[1] != w_hi.shape[2] or (bias is not None and bias.shape != (w_hi.shape[1],)):
        raise ShapeError(
            f"conv1d_split_tf32: x has {x_hi.shape[1]} channels, the weight {w_hi.shape[2]} inputs and "
            f"{w_hi.shape[1]} outputs, bias {None if bias is None else tuple(bias.shape)}"
        )
    if dilation < 1 or x_hi.shape[2] < (w_hi.shape[0] - 1) * dilation + 1:
        raise ShapeError(
            f"conv1d_split_tf32: {x_hi.shape[2]} samples cannot hold a {w_hi.shape[0]}-tap kernel at "
            f"dilation {dilation}"
        )
    for name, t in (("x_hi", x_hi), ("x_lo", x_lo), ("w_hi", w_hi), ("w_lo", w_lo), ("bias", bias)):
        if t is not None and t.dtype != torch.float32:
            raise DTypeError(f"conv1d_split_tf32 needs float32 {name}, got {t.dtype}; use .float()")


@torch.library.custom_op("streamdec::conv1d_split_tf32", mutates_args=())
def conv1d_split_tf32(
    x_hi: Tensor, x_lo: Tensor, w_hi: Tensor, w_lo: Tensor, bias: Tensor | None, dilation: int
) -> Tensor:
    """See the module docstring."""
    _check(x_hi, x_lo, w_hi, w_lo, bias, dilation)
    weight = (w_hi + w_lo).permute(1, 2, 0)  # [k, Cout, Cin] -> [Cout, Cin, k]; hi + lo is w exactly
    return F.conv1d(x_hi + x_lo, weight, bias, dilation=dilation)


@conv1d_split_tf32.register_fake
def _(x_hi: Tensor, x_lo: Tensor, w_hi: Tensor, w_lo: Tensor, bias: Tensor | None, dilation: int) -> Tensor:
    ksize, cout, _ = w_hi.shape
    return x_hi.new_empty(x_hi.shape[0], cout, x_hi.shape[2] - (ksize - 1) * dilation)


@conv1d_split_tf32.register_kernel("cuda")
def _tf32_on_cuda(
    x_hi: Tensor, x_lo: Tensor, w_hi: Tensor, w_lo: Tensor, bias: Tensor | None, dilation: int
) -> Tensor:
    _check(x_hi, x_lo, w_hi, w_lo, bias, dilation)
    from streamdec.kernels import _triton_conv as tc  # Triton is imported only here

    with launch_device(x_hi.device):
        return tc.conv1d_split(x_hi, x_lo, w_hi, w_lo, bias, dilation)


def split_conv1d(x: Tensor, packed: Tensor, bias: Tensor | None, dilation: int, phases: int = 1) -> Tensor:
    """``conv1d(x, w, bias, dilation=dilation)`` through the op, ``packed`` = ``pack_split_weight(w)``;
    ``phases`` > 1 interleaves the output's phase groups as :func:`conv1d_split_f16` does (here a copy)."""
    if x.dtype != torch.float32:
        raise DTypeError(f"split_conv1d needs a float32 x, got {x.dtype}; use .float()")
    x_hi, x_lo = split_tf32(x)
    if direct_cuda_call(x):  # what the dispatcher would run, without its layers (see direct_cuda_call)
        out = _tf32_on_cuda(x_hi, x_lo, packed[0], packed[1], bias, dilation)
    else:
        out = torch.ops.streamdec.conv1d_split_tf32(x_hi, x_lo, packed[0], packed[1], bias, dilation)
    return interleave_phases(out, phases)


class _F16Args(NamedTuple):
    """The float16 op's arguments, in its order and with its defaults: its fake and CUDA implementations
    take them as the dispatcher passes them (trailing defaults may be left out) and read them by name."""

    x: Tensor
    w_hi: Tensor
    w_lo: Tensor
    w_inv: Tensor
    bias: Tensor | None
    dilation: int
    pad_left: int = 0
    pad_right: int = 0
    residual: Tensor | None = None
    peak: Tensor | None = None
    phases: int = 1
    head: Tensor | None = None
    products: int = 3
    residual_head: Tensor | None = None


def _f16_out_shape(
    x: Tensor, w_hi: Tensor, dilation: int, pad_left: int, pad_right: int, phases: int, kept: int = 0
) -> tuple[int, int, int]:
    ksize, cout, _ = w_hi.shape
    tout = pad_left + kept + x.shape[2] + pad_right - (ksize - 1) * dilation
    return x.shape[0], cout // phases, tout * phases


def _check_f16(args: _F16Args) -> None:
    (
        x, w_hi, w_lo, w_inv, bias, dilation, pad_left, pad_right, residual, peak, phases, head, products,
        residual_head,
    ) = args  # fmt: skip
    if products not in (1, 3):
        raise ShapeError(f"conv1d_split_f16 takes products=3 (split) or 1 (heads only), got {products}")
    if head is not None and (head.dim() != 3 or head.shape[:2] != x.shape[:2] or head.dtype != x.dtype):
        raise ShapeError(
            f"conv1d_split_f16: a head of {tuple(head.shape)} {head.dtype} before x of {tuple(x.shape)} "
            f"{x.dtype}: it needs x's batch, channels and dtype"
        )
    kept = 0 if head is None else head.shape[2]
    if x.dim() != 3 or w_hi.dim() != 3 or w_hi.shape != w_lo.shape:
        raise ShapeError(
            f"conv1d_split_f16 needs x [B, Cin, T] and w_hi, w_lo [k, Cout, Cin'] of one shape, got "
            f"{tuple(x.shape)}, {tuple(w_hi.shape)}, {tuple(w_lo.shape)}"
        )
    ksize, cout, padded = w_hi.shape
    if padded != x.shape[1] + (-x.shape[1] % F16_CHANNEL_QUANTUM) or w_inv.shape != (cout,):
        raise ShapeError(
            f"conv1d_split_f16: x has {x.shape[1]} channels; the weight {padded} padded inputs, {cout} "
            f"outputs and {tuple(w_inv.shape)} scales"
        )
    if (
        (bias is not None and bias.shape != (cout,))
        or dilation < 1
        or min(pad_left, pad_right) < 0
        or pad_left + kept + x.shape[2] + pad_right < (ksize - 1) * dilation + 1
    ):
        raise ShapeError(
            f"conv1d_split_f16: {kept} + {x.shape[2]} samples padded by ({pad_left}, {pad_right}), a {ksize}-tap "
            f"kernel at dilation {dilation}, bias {None if bias is None else tuple(bias.shape)} for {cout} "
            "outputs"
        )
    if phases < 1 or cout % phases:
        raise ShapeError(f"conv1d_split_f16: {cout} output channels do not make {phases} phase groups")
    out_shape = _f16_out_shape(x, w_hi, dilation, pad_left, pad_right, phases, kept)
    if residual_head is not None:
        check_residual_parts(residual_head, residual, out_shape, "conv1d_split_f16")
    elif residual is not None and tuple(residual.shape) != out_shape:
        raise ShapeError(
            f"conv1d_split_f16: a residual of {tuple(residual.shape)} for an output of {out_shape}"
        )
    if peak is not None and tuple(peak.shape) != (x.shape[0],):
        raise ShapeError(f"conv1d_split_f16: peaks of {tuple(peak.shape)} for a batch of {x.shape[0]}")
    for name, t, dtype in (
        ("x", x, torch.float32), ("w_hi", w_hi, torch.float16), ("w_lo", w_lo, torch.float16),
        ("w_inv", w_inv, torch.float32), ("bias", bias, torch.float32), ("residual", residual, torch.float32),
        ("peak", peak, torch.int32), ("residual_head", residual_head, torch.float32),
    ):  # fmt: skip
        if t is not None and t.dtype != dtype:
            raise DTypeError(f"conv1d_split_f16 needs {dtype} {name}, got {t.dtype}")


def check_keep(keep: Tensor | None, slots: Tensor | None, x: Tensor, kept: int, op: str) -> None:
    """A state to keep, ``keep`` ``[S, C, L]`` float32 (each slot's ``C * L`` samples contiguous) with
    ``slots`` ``[B]`` int64, for an input ``cat(head, x)`` of ``kept + T`` samples: else a typed error
    naming ``op``."""
    if keep is None and slots is None:
        return
    if keep is None or slots is None:
        raise ShapeError(f"{op}: keep and keep_slots come together")
    if (
        keep.dim() != 3
        or keep.shape[1] != x.shape[1]
        or not 0 < keep.shape[2] <= kept + x.shape[2]
        or keep.stride(2) != 1
        or keep.stride(1) != keep.shape[2]
        or tuple(slots.shape) != (x.shape[0],)
    ):
        raise ShapeError(
            f"{op}: keeping {tuple(keep.shape)} (strides {keep.stride()}) by slots {tuple(slots.shape)} from "
            f"{kept} + {x.shape[2]} samples of {tuple(x.shape)}"
        )
    if keep.dtype != torch.float32 or slots.dtype != torch.int64 or keep.device != x.device:
        raise DTypeError(f"{op}: keep must be float32 and keep_slots int64, on x's device")


def keep_tail(keep: tuple[Tensor, Tensor] | None, head: Tensor | None, x: Tensor) -> None:
    """``pool[slots[b]] = cat(head, x)[b, :, -L:]`` for ``keep = (pool, slots)``: what the kernels that take
    a state to keep write (nothing for None)."""
    if keep is None:
        return
    pool, slots = keep
    length = pool.shape[-1]
    whole = x if head is None or x.shape[-1] >= length else torch.cat([head, x], dim=-1)
    pool.index_copy_(0, slots, whole[..., whole.shape[-1] - length :].to(pool.dtype))


def keep_pair(keep: Tensor | None, slots: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """An op's ``keep`` and ``keep_slots`` arguments as one ``(pool, slots)`` target (None unless both)."""
    return (keep, slots) if keep is not None and slots is not None else None


@torch.library.custom_op("streamdec::conv1d_split_f16", mutates_args=())
def conv1d_split_f16(
    x: Tensor,
    w_hi: Tensor,
    w_lo: Tensor,
    w_inv: Tensor,
    bias: Tensor | None,
    dilation: int,
    pad_left: int = 0,
    pad_right: int = 0,
    residual: Tensor | None = None,
    peak: Tensor | None = None,
    phases: int = 1,
    head: Tensor | None = None,
    products: int = 3,
    residual_head: Tensor | None = None,
) -> Tensor:
    """``conv1d(F.pad(x, (pad_left, pad_right)), w, bias, dilation=dilation)`` (plus ``residual``, if
    given: added in the kernel's epilogue, rounded as a separate float32 add would) for a float32 ``x``
    ``[B, Cin, T]`` and a weight packed by :func:`~streamdec.kernels.split.pack_split_weight_f16`:
    ``w_hi``/``w_lo`` ``[k, Cout, Cin']`` with ``(w_hi + w_lo) * w_inv[o] ~ w``. Result
    ``[B, Cout, pad_left + T + pad_right - (k-1)*dilation]``.

    On CUDA the op splits ``x`` itself (:func:`~streamdec.kernels.split.split_input_f16`, two Triton
    kernels that also write the zero padding, so no padded float32 copy is made) and runs the float16
    kernel; on the CPU, float32 ``F.conv1d`` of the padded ``x`` and the reassembled weight (exact in
    float32). ``peak``, if given, must be the float32 bits (int32 ``[B]``) of each row's largest ``|x|``
    (:func:`~streamdec.kernels.alias_free.alias_free_activation_peak` gives them): the split then skips its
    own pass over ``x`` for them.

    ``phases`` = s > 1 reads the ``Cout`` outputs as s groups (phases) of ``Cout // s`` and interleaves
    them in time, as a transposed convolution run as s ordinary ones needs: the result is
    ``[B, Cout // s, s * T']``, output channel ``p * (Cout // s) + c`` at ``[:, c, p::s]``. On CUDA one
    Triton pass after the conv does it, writing contiguously.

    ``head`` (``[B, Cin, H]``), if given, comes before ``x`` in time: the convolution is of
    ``cat(head, x)``, which the split reads in place (a stateful stream's kept history and its new
    samples, never copied into one buffer).

    ``products=1`` (the opt-in ``"fp16"`` precision) multiplies the float16 heads only, ``x_hi * w_hi``:
    11 significant bits of each operand; ``w_lo`` is not read. On the CPU the op then convolves the
    heads, reassembled, in float32.

    ``residual_head`` (``[B, Cout', H]``), if given, comes before ``residual`` in time: the residual added
    is ``cat(residual_head, residual)`` (``residual`` None where the head covers the whole output), read
    where each part lies on CUDA: a delay line's kept history and the new samples it passes on."""
    _check_f16(
        _F16Args(
            x, w_hi, w_lo, w_inv, bias, dilation, pad_left, pad_right, residual, peak, phases, head, products,
            residual_head,
        )
    )  # fmt: skip
    residual = joined_residual(residual_head, residual)
    parts = w_hi.float() + w_lo.float() if products == 3 else w_hi.float()
    weight = (parts * w_inv[None, :, None]).permute(1, 2, 0)  # [Cout, Cin', k]
    if head is not None:
        x = torch.cat([head, x], dim=-1)
    x = F.pad(x, (pad_left, pad_right))
    if products == 1:  # the heads of the input's split, as the CUDA op makes them
        heads, _, inverse = split_input_f16(x)
        x = heads.float().transpose(1, 2)[:, : x.shape[1]] * inverse[:, None, None]
    out = F.conv1d(x, weight[:, : x.shape[1]], bias, dilation=dilation)
    out = interleave_phases(out, phases)
    return out if residual is None else residual + out


def check_residual_parts(head: Tensor, tail: Tensor | None, out_shape: tuple[int, int, int], op: str) -> None:
    """A residual in two parts, ``head`` ``[B, C, H]`` then ``tail`` ``[B, C, T - H]`` (None where
    ``H = T``), must cover an output of ``out_shape`` ``[B, C, T]``: else a :class:`ShapeError` naming
    ``op``."""
    kept = head.shape[-1] if head.dim() == 3 else -1
    tail_shape = (*out_shape[:2], out_shape[2] - kept)
    if (
        head.dim() != 3
        or tuple(head.shape[:2]) != tuple(out_shape[:2])
        or not 0 <= kept <= out_shape[2]
        or (tuple(tail.shape) != tail_shape if tail is not None else kept != out_shape[2])
    ):
        raise ShapeError(
            f"{op}: a residual of {tuple(head.shape)} then {None if tail is None else tuple(tail.shape)} "
            f"for an output of {tuple(out_shape)}"
        )


def joined_residual(head: Tensor | None, tail: Tensor | None) -> Tensor | None:
    """A residual given in two parts, ``head`` then ``tail`` in time (either may be None), as one tensor."""
    if head is None:
        return tail
    return head if tail is None else torch.cat([head, tail], dim=-1)


def interleave_phases(y: Tensor, phases: int) -> Tensor:
    """``[B, s * C, T]`` -> ``[B, C, T * s]``, channel ``p * C + c`` to ``[:, c, p::s]`` (s = ``phases``)."""
    if phases == 1:
        return y
    batch, channels, length = y.shape
    per_phase = channels // phases
    return y.view(batch, phases, per_phase, length).permute(0, 2, 3, 1).reshape(batch, per_phase, -1)


def _f16_empty(a: _F16Args) -> Tensor:
    """An uninitialised output of the float16 op's shape for ``a`` (its fake implementations)."""
    kept = 0 if a.head is None else a.head.shape[2]
    return a.x.new_empty(_f16_out_shape(a.x, a.w_hi, a.dilation, a.pad_left, a.pad_right, a.phases, kept))


@conv1d_split_f16.register_fake
def _(*args: Any, **kwargs: Any) -> Tensor:
    return _f16_empty(_F16Args(*args, **kwargs))


@conv1d_split_f16.register_kernel("cuda")
def _(*args: Any, **kwargs: Any) -> Tensor:
    return _f16_on_cuda(_F16Args(*args, **kwargs), None)


@torch.library.custom_op("streamdec::conv1d_split_f16_keep", mutates_args=("keep",))
def conv1d_split_f16_keep(
    keep: Tensor,
    keep_slots: Tensor,
    x: Tensor,
    w_hi: Tensor,
    w_lo: Tensor,
    w_inv: Tensor,
    bias: Tensor | None,
    dilation: int,
    pad_left: int = 0,
    pad_right: int = 0,
    residual: Tensor | None = None,
    peak: Tensor | None = None,
    phases: int = 1,
    head: Tensor | None = None,
    products: int = 3,
    residual_head: Tensor | None = None,
) -> Tensor:
    """:func:`conv1d_split_f16`, and the last ``L`` samples of each row's ``cat(head, x)`` written to
    ``keep[keep_slots[b]]`` (``keep`` ``[S, Cin, L]``, mutated; ``keep_slots`` ``[B]`` int64;
    :func:`keep_tail`): a stateful layer's new state, which on CUDA the split stores as it reads the
    samples. (An op of its own, so that the state it writes is a leading, required argument: a mutated
    argument left at its default is dropped from the dispatcher's call.)"""
    a = _F16Args(
        x, w_hi, w_lo, w_inv, bias, dilation, pad_left, pad_right, residual, peak, phases, head, products,
        residual_head,
    )  # fmt: skip
    _check_f16(a)
    check_keep(keep, keep_slots, x, 0 if head is None else head.shape[2], "conv1d_split_f16_keep")
    keep_tail((keep, keep_slots), head, x)
    out: Tensor = conv1d_split_f16(*a)
    return out


@conv1d_split_f16_keep.register_fake
def _(keep: Tensor, keep_slots: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return _f16_empty(_F16Args(*args, **kwargs))


@conv1d_split_f16_keep.register_kernel("cuda")
def _(keep: Tensor, keep_slots: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return _f16_keep_on_cuda(keep, keep_slots, _F16Args(*args, **kwargs))


def _f16_keep_on_cuda(keep: Tensor, keep_slots: Tensor, a: _F16Args) -> Tensor:
    check_keep(keep, keep_slots, a.x, 0 if a.head is None else a.head.shape[2], "conv1d_split_f16_keep")
    return _f16_on_cuda(a, (keep, keep_slots))


def _f16_on_cuda(a: _F16Args, keep: tuple[Tensor, Tensor] | None) -> Tensor:
    """The float16 op's CUDA work: the input split (writing ``keep``'s state, if given), then the kernel."""
    _check_f16(a)
    from streamdec.kernels import _triton_conv_f16 as tc  # Triton is imported only here

    with launch_device(a.x.device):
        x_hi, x_lo, x_inv = tc.split_f16(
            a.x, a.pad_left, a.pad_right, a.peak, a.head, tails=a.products == 3, keep=keep
        )
        return tc.conv1d_f16x3(
            x_hi,
            x_lo,
            x_inv,
            a.w_hi,
            a.w_lo,
            a.w_inv,
            a.bias,
            a.dilation,
            residual=a.residual,
            phases=a.phases,
            products=a.products,
            residual_head=a.residual_head,
        )


def split_conv1d_f16(
    x: Tensor,
    packed: Tensor,
    inverse: Tensor,
    bias: Tensor | None,
    dilation: int,
    pads: tuple[int, int] = (0, 0),
    residual: Tensor | None = None,
    peak: Tensor | None = None,
    phases: int = 1,
    head: Tensor | None = None,
    products: int = 3,
    residual_head: Tensor | None = None,
    keep: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``conv1d(F.pad(x, pads), w, bias, dilation=dilation)`` (``+ residual``, if given) through the
    float16 op, ``(packed, inverse)`` = ``pack_split_weight_f16(w)``; ``peak``, ``phases``, ``head``,
    ``products`` and ``residual_head`` as the op takes them; ``keep`` = ``(pool, slots)``: through
    :func:`conv1d_split_f16_keep`, which also writes the new state.

    Unlike :func:`split_conv1d`, the input's split (and its padding) happens inside the op: it needs each
    row's peak, a reduction that ``torch.compile`` would otherwise generate and compile for every layer,
    and a padded copy would be one more pass over the input."""
    if x.dtype != torch.float32:
        raise DTypeError(f"split_conv1d_f16 needs a float32 x, got {x.dtype}; use .float()")
    args = (
        x, packed[0], packed[1], inverse, bias, dilation, pads[0], pads[1], residual, peak, phases, head, products,
        residual_head,
    )  # fmt: skip
    if direct_cuda_call(x):  # what the dispatcher would run, without its layers (see direct_cuda_call)
        a = _F16Args(*args)
        return _f16_on_cuda(a, None) if keep is None else _f16_keep_on_cuda(*keep, a)
    out: Tensor = (
        torch.ops.streamdec.conv1d_split_f16(*args)
        if keep is None
        else torch.ops.streamdec.conv1d_split_f16_keep(*keep, *args)
    )
    return out
