"""Fused alias-free SnakeBeta activation: custom op, dispatch rules and a pure-PyTorch polyphase oracle.

Contract of ``torch.ops.streamdec.alias_free_activation(x, filt, alpha_exp, beta_inv)``: ``x`` is
``[B, C, T]`` (``T >= 1``), ``filt`` holds the 12 taps of the shared Kaiser-sinc filter (any shape with 12
elements), ``alpha_exp`` and ``beta_inv`` are ``[C]`` (SnakeBeta's cached ``exp(alpha)`` and
``1/(exp(beta)+eps)``), all float32 on one device. The result is a new contiguous ``[B, C, T]`` tensor
equal (to float32 rounding, see ``docs/kernels.md``) to
:meth:`streamdec.codecs.layers.AliasFreeActivation.forward`: 2x polyphase upsample with replicate edges,
SnakeBeta, causal 12-tap low-pass with replicate left edge, decimation by 2.

On CUDA the op runs one Triton kernel (:mod:`streamdec.kernels._triton_alias_free`); on the CPU it runs
:func:`polyphase_reference`. It has a fake (meta) implementation, so ``torch.compile`` traces it as one
opaque node and CUDA graphs capture its launch.

:func:`fused_supported` is the dispatch rule the layer uses: CUDA, float32, rank 3, Triton importable, and
``STREAMDEC_NO_FUSED`` not on when this module was imported (:mod:`streamdec.settings`). Everything else keeps the reference
path unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from streamdec import settings
from streamdec.errors import DTypeError, ShapeError
from streamdec.kernels.availability import HAS_TRITON, direct_cuda_call, launch_device
from streamdec.kernels.conv import check_keep, keep_pair, keep_tail

__all__ = [
    "ENV_DISABLE",
    "TAPS",
    "alias_free_activation",
    "alias_free_activation_peak",
    "alias_free_activation_window",
    "alias_free_activation_window_peak",
    "fused_supported",
    "polyphase_reference",
]

TAPS = 12
ENV_DISABLE = settings.NO_FUSED.name
# Read once at import: torch.compile traces module constants, not the live environment.
ENV_DISABLED = settings.NO_FUSED.value()


def fused_supported(x: Tensor) -> bool:
    """True when the fused kernel may replace the reference path for input ``x``."""
    return not ENV_DISABLED and HAS_TRITON and x.is_cuda and x.dtype == torch.float32 and x.dim() == 3


def _check(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> None:
    if x.dim() != 3 or x.shape[-1] < 1:
        raise ShapeError(f"alias_free_activation needs x shaped [B, C, T>=1], got {tuple(x.shape)}")
    channels = x.shape[1]
    if filt.numel() != TAPS:
        raise ShapeError(f"alias_free_activation needs {TAPS} filter taps, got {filt.numel()}")
    if alpha_exp.shape != (channels,) or beta_inv.shape != (channels,):
        raise ShapeError(
            f"alias_free_activation needs alpha_exp and beta_inv shaped [{channels}], got "
            f"{tuple(alpha_exp.shape)} and {tuple(beta_inv.shape)}"
        )
    for name, t in (("x", x), ("filt", filt), ("alpha_exp", alpha_exp), ("beta_inv", beta_inv)):
        if t.dtype != torch.float32:
            raise DTypeError(f"alias_free_activation needs float32 {name}, got {t.dtype}; use .float()")


@torch.library.custom_op("streamdec::alias_free_activation", mutates_args=())
def alias_free_activation(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> Tensor:
    """See the module docstring."""
    _check(x, filt, alpha_exp, beta_inv)
    return polyphase_reference(x, filt, alpha_exp, beta_inv)


@alias_free_activation.register_fake
def _(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> Tensor:
    return x.new_empty(x.shape)


@alias_free_activation.register_kernel("cuda")
def _activation_cuda(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> Tensor:
    return _run_cuda(x, filt, alpha_exp, beta_inv, peak=None)


def _run_cuda(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, *, peak: Tensor | None) -> Tensor:
    """Launch the kernel over ``x`` flattened to rows; given ``peak`` (int32 ``[B]``, zeroed, since the
    kernel only raises it) it also takes the batch rows' peak bits."""
    _check(x, filt, alpha_exp, beta_inv)
    from streamdec.kernels import _triton_alias_free as tk  # Triton is imported only here

    batch, channels, length = x.shape
    flat = x.contiguous().view(batch * channels, length)
    out = torch.empty_like(flat)
    args = (flat, filt.contiguous().view(TAPS), alpha_exp.contiguous(), beta_inv.contiguous(), out)
    with launch_device(x.device):
        tk.launch_blocked(*args, peak)
    return out.view(batch, channels, length)


@torch.library.custom_op("streamdec::alias_free_activation_peak", mutates_args=())
def alias_free_activation_peak(
    x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`alias_free_activation` and, per batch row, the float32 bits (as int32 ``[B]``) of the
    output's largest magnitude: the row peaks a float16 split convolution of the output starts from
    (``torch.ops.streamdec.conv1d_split_f16``'s ``peak``), taken here by the kernel as it writes."""
    out = alias_free_activation(x, filt, alpha_exp, beta_inv)
    return out, _peak_bits(out)


def _peak_bits(y: Tensor) -> Tensor:
    return y.abs().amax(dim=(1, 2)).view(torch.int32)


@alias_free_activation_peak.register_fake
def _(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.int32)


@alias_free_activation_peak.register_kernel("cuda")
def _activation_peak_cuda(
    x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor
) -> tuple[Tensor, Tensor]:
    peak = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    return _run_cuda(x, filt, alpha_exp, beta_inv, peak=peak), peak


@torch.library.custom_op("streamdec::alias_free_activation_window", mutates_args=("keep",))
def alias_free_activation_window(
    head: Tensor,
    x: Tensor,
    filt: Tensor,
    alpha_exp: Tensor,
    beta_inv: Tensor,
    start: int,
    length: int,
    keep: Tensor | None,
    keep_slots: Tensor | None,
) -> Tensor:
    """``alias_free_activation(cat(head, x))[..., start : start + length]`` without the concatenation or
    the outputs outside the window: a stateful step's activation of its kept history (``head``,
    ``[B, C, H]``) and new samples. ``start`` is 0 or at least 5; the window must lie inside the row.

    ``keep`` (``[S, C, L]``, mutated) and ``keep_slots`` (``[B]`` int64), if given: also write the last
    ``L`` samples of each row's ``cat(head, x)`` to ``keep[keep_slots[b]]``
    (:func:`~streamdec.kernels.conv.keep_tail`), the layer's new state; on CUDA the window kernel copies
    them as it reads the row."""
    return _window_reference(head, x, filt, alpha_exp, beta_inv, start, length, keep, keep_slots)


def _window_reference(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    keep: Tensor | None, keep_slots: Tensor | None,
) -> Tensor:  # fmt: skip
    """The window ops off CUDA: the reference activation of ``cat(head, x)``, cropped, and the kept tail."""
    _check_window(head, x, start, length)
    check_keep(keep, keep_slots, x, head.shape[-1], "alias_free_activation_window")
    whole = torch.cat([head, x], dim=-1)
    _check(whole, filt, alpha_exp, beta_inv)
    out = polyphase_reference(whole, filt, alpha_exp, beta_inv)[..., start : start + length].contiguous()
    keep_tail(keep_pair(keep, keep_slots), head, x)
    return out


def _check_window(head: Tensor, x: Tensor, start: int, length: int) -> None:
    if head.dim() != 3 or x.dim() != 3 or head.shape[:2] != x.shape[:2]:
        raise ShapeError(
            f"alias_free_activation_window needs head and x of one batch and channel count, got "
            f"{tuple(head.shape)} and {tuple(x.shape)}"
        )
    total = head.shape[-1] + x.shape[-1]
    if not (start == 0 or start >= 5) or length < 1 or start + length > total:
        raise ShapeError(
            f"alias_free_activation_window: outputs {start} .. {start + length - 1} of a row of {total} "
            "(the window starts at 0 or at 5 or later, and lies inside the row)"
        )


@alias_free_activation_window.register_fake
def _(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    keep: Tensor | None, keep_slots: Tensor | None,
) -> Tensor:  # fmt: skip
    return x.new_empty(x.shape[0], x.shape[1], length)


@alias_free_activation_window.register_kernel("cuda")
def _window_cuda(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    keep: Tensor | None, keep_slots: Tensor | None,
) -> Tensor:  # fmt: skip
    _check_window(head, x, start, length)
    _check(x, filt, alpha_exp, beta_inv)
    check_keep(keep, keep_slots, x, head.shape[-1], "alias_free_activation_window")
    from streamdec.kernels import _triton_alias_free as tk  # Triton is imported only here

    with launch_device(x.device):
        return window_launch(tk, head, x, filt, alpha_exp, beta_inv, start, length, None, keep, keep_slots)


def window_launch(
    tk: Any, head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int,
    length: int, peak: Tensor | None, keep: Tensor | None = None, keep_slots: Tensor | None = None,
    before: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The window kernel's launch on the current device; the head is read where it lies (its batch rows may
    lie apart); ``peak``, if given, is raised to the row peaks of the window and of ``before`` (a
    history read before it); ``keep`` and ``keep_slots`` as the op takes them."""
    batch, channels, samples = x.shape
    flat = x.contiguous().view(batch * channels, samples)
    kept = head if head.shape[-1] else None
    out = flat.new_empty(batch * channels, length)
    args = (flat, filt.contiguous().view(TAPS), alpha_exp.contiguous(), beta_inv.contiguous(), out)
    tk.launch_blocked(*args, peak, kept, start, keep=keep_pair(keep, keep_slots), before=before)
    return out.view(batch, channels, length)


@torch.library.custom_op("streamdec::alias_free_activation_window_peak", mutates_args=("keep",))
def alias_free_activation_window_peak(
    head: Tensor,
    x: Tensor,
    filt: Tensor,
    alpha_exp: Tensor,
    beta_inv: Tensor,
    start: int,
    length: int,
    before: Tensor | None,
    keep: Tensor | None,
    keep_slots: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """:func:`alias_free_activation_window` and, per batch row, the float32 bits (int32 ``[B]``) of the
    largest magnitude in ``cat(before, out)``: the row peaks of a float16 split convolution that reads
    ``before`` (``[B, C', H']``, its kept history; None for none) and then this window, so its input split
    makes no peak pass of its own. On CUDA the window kernel's programs raise a zeroed buffer to the
    peaks of what they write and of the same channels of ``before``: no pass over ``before`` of its own.
    ``keep`` and ``keep_slots`` as :func:`alias_free_activation_window` takes them."""
    _check_before(before, x)
    out = _window_reference(head, x, filt, alpha_exp, beta_inv, start, length, keep, keep_slots)
    peak = _peak_bits(out)
    if before is not None:
        peak = torch.maximum(peak, _peak_bits(before)) if before.numel() else peak
    return out, peak


@alias_free_activation_window_peak.register_fake
def _(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    before: Tensor | None, keep: Tensor | None, keep_slots: Tensor | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    return x.new_empty(x.shape[0], x.shape[1], length), x.new_empty(x.shape[0], dtype=torch.int32)


@alias_free_activation_window_peak.register_kernel("cuda")
def _window_peak_cuda(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    before: Tensor | None, keep: Tensor | None, keep_slots: Tensor | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    _check_window(head, x, start, length)
    _check(x, filt, alpha_exp, beta_inv)
    _check_before(before, x)
    check_keep(keep, keep_slots, x, head.shape[-1], "alias_free_activation_window_peak")
    from streamdec.kernels import _triton_alias_free as tk  # Triton is imported only here

    with launch_device(x.device):
        return window_peak_launch(
            tk, head, x, filt, alpha_exp, beta_inv, start, length, before, keep, keep_slots
        )


def window_peak_launch(
    tk: Any, head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int,
    length: int, before: Tensor | None, keep: Tensor | None = None, keep_slots: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The window-with-peak op's kernels (``tk``: :mod:`streamdec.kernels._triton_alias_free`) on the
    current device: a zeroed peak buffer, raised by the window kernel to the peaks of what it writes and
    of ``before``."""
    peak = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    out = window_launch(tk, head, x, filt, alpha_exp, beta_inv, start, length, peak, keep, keep_slots, before)
    return out, peak


def _check_before(before: Tensor | None, x: Tensor) -> None:
    if before is not None and (before.dim() != 3 or before.shape[0] != x.shape[0] or before.dtype != x.dtype):
        raise ShapeError(
            f"alias_free_activation_window_peak: a history of {tuple(before.shape)} {before.dtype} before "
            f"outputs of {tuple(x.shape)} {x.dtype}: it needs their batch, three dimensions and dtype"
        )


def polyphase_reference(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> Tensor:
    """The activation computed in the kernels' polyphase form with plain PyTorch ops (an oracle).

    ``up[2m] = 2 sum_q f[2q+1] x[m+2-q]`` and ``up[2m+1] = 2 sum_q f[2q] x[m+3-q]`` with clamped indices,
    SnakeBeta, then the reference's causal replicate pad 11 and stride-2 filter.
    """
    batch, channels, length = x.shape
    f = filt.reshape(TAPS)
    # xp[:, d + 8] = x[clamp(t + d)] for d in -8..3 (replicate edges).
    xp = F.pad(x.reshape(batch * channels, 1, length), (8, 3), mode="replicate").view(batch, channels, -1)

    def tap(d: int) -> Tensor:
        return xp[..., 8 + d : 8 + d + length]

    up_e = 2.0 * sum((f[2 * q + 1] * tap(2 - q) for q in range(6)), torch.zeros_like(x))
    up_o = 2.0 * sum((f[2 * q] * tap(3 - q) for q in range(6)), torch.zeros_like(x))
    a, b = alpha_exp.view(1, -1, 1), beta_inv.view(1, -1, 1)
    s = torch.stack([up_e, up_o], dim=-1).view(batch, channels, 2 * length)
    s = s + b * torch.sin(a * s).pow(2)
    s = F.pad(s.view(batch * channels, 1, 2 * length), (TAPS - 1, 0), mode="replicate")
    return F.conv1d(s, f.view(1, 1, TAPS), stride=2).view(batch, channels, length)


# -- what layers call: the op, or its CUDA implementation straight away in eager code ----------------------
# (the same function the dispatcher would run, without its Python layers: see direct_cuda_call)


def activation(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> Tensor:
    """:func:`alias_free_activation`."""
    out: Tensor = (
        _activation_cuda(x, filt, alpha_exp, beta_inv)
        if direct_cuda_call(x)
        else torch.ops.streamdec.alias_free_activation(x, filt, alpha_exp, beta_inv)
    )
    return out


def activation_peak(x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`alias_free_activation_peak`."""
    pair: tuple[Tensor, Tensor] = (
        _activation_peak_cuda(x, filt, alpha_exp, beta_inv)
        if direct_cuda_call(x)
        else torch.ops.streamdec.alias_free_activation_peak(x, filt, alpha_exp, beta_inv)
    )
    return pair


def activation_window(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    keep: Tensor | None, keep_slots: Tensor | None,
) -> Tensor:  # fmt: skip
    """:func:`alias_free_activation_window`."""
    args = (head, x, filt, alpha_exp, beta_inv, start, length, keep, keep_slots)
    out: Tensor = (
        _window_cuda(*args)
        if direct_cuda_call(x)
        else torch.ops.streamdec.alias_free_activation_window(*args)
    )
    return out


def activation_window_peak(
    head: Tensor, x: Tensor, filt: Tensor, alpha_exp: Tensor, beta_inv: Tensor, start: int, length: int,
    before: Tensor | None, keep: Tensor | None, keep_slots: Tensor | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`alias_free_activation_window_peak`."""
    args = (head, x, filt, alpha_exp, beta_inv, start, length, before, keep, keep_slots)
    pair: tuple[Tensor, Tensor] = (
        _window_peak_cuda(*args)
        if direct_cuda_call(x)
        else torch.ops.streamdec.alias_free_activation_window_peak(*args)
    )
    return pair
