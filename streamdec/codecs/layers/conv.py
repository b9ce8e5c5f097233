"""Convolution layers with explicit padding and the split-precision paths, each knowing its geometry.

:class:`SplitConv` is what they share: the weight caches and calls of the ``"tf32x3"`` and ``"fp16x3"``
precisions (:mod:`streamdec.codecs.precision`), on a Triton split kernel (:mod:`streamdec.kernels.conv`)
where :mod:`~streamdec.codecs.layers.routing` allows, else as the stacked cuDNN split. A causal transposed
convolution runs on those kernels as ``stride`` ordinary ones (:func:`polyphase_weight`).
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs.geometry import Interval, conv_interval, conv_transpose_interval
from streamdec.codecs.layers import routing
from streamdec.codecs.layers.activation import AliasFreeActivation
from streamdec.kernels.conv import joined_residual, keep_tail, split_conv1d, split_conv1d_f16
from streamdec.kernels.split import pack_split_weight, pack_split_weight_f16, split_input, split_weight

__all__ = [
    "CausalConvTranspose1d",
    "PaddedConv1d",
    "PaddedConvTranspose1d",
    "SplitConv",
    "polyphase_weight",
]


class SplitConv(nn.Module):
    """What this package's conv layers share: the split paths (:mod:`streamdec.codecs.precision`).

    ``split_weight`` is None (plain convolution) until :meth:`set_split` caches ``[w_hi, w_lo, w_hi]``;
    from then on a CUDA float32 input is convolved as ``[x_hi, x_hi, x_lo]`` against it, in one call.
    With the Triton split kernels on (:mod:`streamdec.kernels.conv`), a layer that is an ordinary
    convolution (:meth:`triton_weight`) caches that form for a kernel instead: ``packed_f16`` and
    ``f16_inverse`` for the float16 one (``"fp16x3"``, on GPUs with TMA), else ``packed_split`` for the
    TF32 one.
    The cache is non-persistent (never in a checkpoint); :func:`refresh_caches` rebuilds it after a weight
    or dtype change, and a layer whose weights are not float32 keeps none (TF32 is a float32 matter).
    Use :func:`set_split_convs` on a whole model: it checks every layer before changing any.
    """

    #: Input-channel axis of the weight: 1 for ``[Cout, Cin, k]`` (conv), 0 for ``[Cin, Cout, k]`` (transpose).
    weight_in_dim: ClassVar[int]
    weight: Tensor
    groups: int
    split_weight: Tensor | None  # [w_hi, w_lo, w_hi] stacked on the input channels, for cuDNN
    packed_split: Tensor | None  # [2, k, Cout, Cin] heads and tails, for the TF32 Triton kernel
    packed_f16: Tensor | None  # [2, k, Cout, Cin'] float16 heads and tails, for the float16 kernel
    f16_inverse: Tensor | None  # [Cout]: the power-of-two scale packed_f16 carries, inverted
    split_enabled = False
    split_f16 = False
    f16_products = 3  # 1: the single-product "fp16" precision (float16 heads only)

    def _register_split_buffers(self) -> None:
        for name in ("split_weight", "packed_split", "packed_f16", "f16_inverse"):
            self.register_buffer(name, None, persistent=False)

    def set_split(self, enabled: bool, *, f16: bool = False, products: int = 3) -> None:
        """Take the split path (``f16``: the float16 kernel where it can run this layer, multiplying
        ``products`` times: 3 for ``"fp16x3"``, 1 for ``"fp16"``), or not."""
        self.split_enabled, self.split_f16 = enabled, enabled and f16
        self.f16_products = products
        self.refresh_split()

    def refresh_split(self) -> None:
        """Cache the split weight in the form this layer's split path takes (or none when off)."""
        on = self.split_enabled and self.weight.dtype == torch.float32
        triton = on and routing.triton_conv_supported(self.weight)
        as_conv = self.triton_weight() if triton else None
        f16 = self.split_f16 and routing.f16_conv_supported(self.weight)
        f16_form = pack_split_weight_f16(as_conv) if f16 and as_conv is not None else None
        self.packed_f16, self.f16_inverse = f16_form or (None, None)
        self.packed_split = pack_split_weight(as_conv) if as_conv is not None and f16_form is None else None
        self.split_weight = split_weight(self.weight, self.weight_in_dim) if on and as_conv is None else None

    def on_triton(self, x: Tensor) -> bool:
        """Whether this call goes through a Triton split kernel (:meth:`triton_conv`)."""
        return (self.packed_split is not None or self.packed_f16 is not None) and routing.takes_split(x)

    def triton_conv(
        self,
        x: Tensor,
        bias: Tensor | None,
        dilation: int,
        pads: tuple[int, int] = (0, 0),
        residual: Tensor | None = None,
        peak: Tensor | None = None,
        phases: int = 1,
        head: Tensor | None = None,
        residual_head: Tensor | None = None,
        keep: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """``cat(head, x)`` (``head`` may be None) zero-padded by ``pads`` through this layer's
        ordinary-convolution form (then
        ``residual +`` it), on whichever kernel holds it; ``phases`` > 1 interleaves the output's phase
        groups in time (a transposed convolution's phases, see ``conv1d_split_f16``). The float16 op pads
        as it splits, adds the residual in its epilogue and takes ``x``'s row peaks from ``peak`` when
        given: no padded copy, no separate add, no pass for the peaks. ``residual_head``, if given, comes
        before ``residual`` in time (see :func:`joined_residual`); the float16 op reads the two in place.
        ``keep`` = ``(pool, slots)``: also write each row's last ``pool.shape[-1]`` samples of
        ``cat(head, x)`` to ``pool[slots[b]]`` (:func:`keep_tail`; the float16 op's split stores them as
        it reads them)."""
        if self.packed_f16 is not None:
            assert self.f16_inverse is not None  # set with packed_f16
            out: Tensor = split_conv1d_f16(
                x, self.packed_f16, self.f16_inverse, bias, dilation, pads, residual, peak, phases, head,
                self.f16_products, residual_head, keep,
            )  # fmt: skip
            return out
        keep_tail(keep, head, x)
        assert self.packed_split is not None  # on_triton held
        if head is not None:
            x = torch.cat([head, x], dim=-1)
        out = split_conv1d(F.pad(x, pads), self.packed_split, bias, dilation, phases)
        residual = joined_residual(residual_head, residual)
        return out if residual is None else residual + out

    def triton_weight(self) -> Tensor | None:
        """This layer as an ordinary ``[Cout, Cin, k]`` convolution the Triton kernel runs, if it can be one."""
        return None

    def splits(self, x: Tensor) -> bool:
        """Whether this call takes the split path: it is cached, and ``x`` is CUDA float32."""
        return self.split_weight is not None and routing.takes_split(x)


class PaddedConv1d(SplitConv, nn.Conv1d):
    """Conv1d with explicit zero padding: ``pad_left`` before and ``pad_right`` after the input.

    ``causal(...)`` pads ``(k-1)*d`` on the left only (length preserved, no lookahead); ``centred(...)``
    pads ``(k-1)//2`` on both sides (odd ``k``).
    """

    weight_in_dim = 1

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        dilation: int = 1,
        pad_left: int,
        pad_right: int,
        bias: bool = True,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)
        self.pad_left = pad_left
        self.pad_right = pad_right
        self._register_split_buffers()

    @classmethod
    def causal(
        cls, cin: int, cout: int, kernel: int, *, dilation: int = 1, bias: bool = True
    ) -> PaddedConv1d:
        return cls(
            cin, cout, kernel, dilation=dilation, pad_left=(kernel - 1) * dilation, pad_right=0, bias=bias
        )

    @classmethod
    def centred(cls, cin: int, cout: int, kernel: int, *, bias: bool = True) -> PaddedConv1d:
        return cls(cin, cout, kernel, pad_left=(kernel - 1) // 2, pad_right=(kernel - 1) // 2, bias=bias)

    def triton_weight(self) -> Tensor:
        return self.weight

    def forward(self, x: Tensor) -> Tensor:  # [B, Cin, T] -> [B, Cout, T + pads - (k-1)*d]
        return self.convolve(x, (self.pad_left, self.pad_right))

    def convolve(
        self,
        x: Tensor,
        pads: tuple[int, int],
        head: Tensor | None = None,
        residual: Tensor | None = None,
        peak: Tensor | None = None,
        residual_head: Tensor | None = None,
        keep: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:  # [B, Cin, H + T] -> [B, Cout, H + T + pads - (k-1)*d]
        """This convolution of ``cat(head, x)`` (``head`` may be None) with ``pads`` zeros around it instead
        of its own padding, on whichever path this layer takes, plus ``residual`` if given (as
        :meth:`after` adds it). Stateful streaming convolves a stream's kept history (``head``) and its new
        samples with none; the float16 kernel reads the two where they lie, adds the residual in its
        epilogue, and takes ``peak`` (the rows' peaks of ``cat(head, x)``, from the fused activation) as
        its split's. ``residual_head``, if given, comes before ``residual`` in time (a delay line's kept
        history and its new samples, :func:`joined_residual`): the float16 kernel reads both in place.
        ``keep`` = ``(pool, slots)``: also write each row's last ``pool.shape[-1]`` samples of
        ``cat(head, x)`` to ``pool[slots[b]]`` (a stateful layer's new state; the float16 kernel's split
        stores them as it reads them)."""
        if self.on_triton(x):
            return self.triton_conv(
                x, self.bias, self.dilation[0], pads, residual, peak, head=head, residual_head=residual_head,
                keep=keep,
            )  # fmt: skip
        keep_tail(keep, head, x)
        if head is not None:
            x = torch.cat([head, x], dim=-1)
        x = F.pad(x, pads)
        if self.split_weight is not None and self.splits(x):
            out = F.conv1d(split_input(x), self.split_weight, self.bias, self.stride, 0, self.dilation)
        else:
            out = super().forward(x)
        residual = joined_residual(residual_head, residual)
        return out if residual is None else residual + out

    def takes_peak(self, x: Tensor) -> bool:
        """Whether a call on ``x`` runs the float16 split, which takes handed-over row peaks."""
        return self.packed_f16 is not None and self.on_triton(x)

    def after(self, act: nn.Module, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``self(act(x))``, plus ``residual`` if given, rounded alike on every path.

        On the float16 split kernel the add runs in the kernel's epilogue (one pass over the output
        less), and a fused :class:`AliasFreeActivation` hands over its output's row peaks, which the
        conv's input split would otherwise take in a pass of its own."""
        if self.on_triton(x):
            pads = (self.pad_left, self.pad_right)
            if self.packed_f16 is not None and isinstance(act, AliasFreeActivation):
                y, peak = act.with_peak(x)
                return self.triton_conv(y, self.bias, self.dilation[0], pads, residual, peak)
            return self.triton_conv(act(x), self.bias, self.dilation[0], pads, residual)
        out: Tensor = self(act(x))
        return out if residual is None else residual + out

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_interval(
            lo, hi, kernel=self.kernel_size[0], dilation=self.dilation[0], pad_left=self.pad_left
        )


class _SplitConvTranspose1d(SplitConv, nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` (torch's ``padding`` crop included) with the tf32x3 path."""

    weight_in_dim = 0

    def convolve(self, x: Tensor) -> Tensor:  # [B, Cin, T] -> [B, Cout, (T-1)*s - 2*padding + k]
        if self.split_weight is not None and self.splits(x):
            return F.conv_transpose1d(
                split_input(x), self.split_weight, self.bias, self.stride,
                cast(tuple[int, ...], self.padding), self.output_padding, 1, self.dilation,
            )  # fmt: skip
        return super().forward(x)

    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:
        if output_size is not None:
            raise ValueError(f"{type(self).__name__} has a fixed output length; drop output_size")
        return self.convolve(x)


def polyphase_weight(weight: Tensor, stride: int) -> Tensor:
    """Transposed-conv weight ``[Cin, Cout, k]`` (``k = M * stride``) -> conv weight ``[stride*Cout, Cin, M]``.

    A causal transposed convolution is ``stride`` ordinary ones, one per output phase ``p``::

        y[t*s + p] = sum_m W[:, :, p + m*s] . x[t - m]          m = 0 .. M-1

    so ``conv1d(pad_left(x, M-1), polyphase_weight(W, s))`` gives output channel ``p*Cout + co`` at time
    ``t`` equal to ``y[co, t*s + p]``: tap ``j`` of the conv reads ``x[t + j - (M-1)]``, hence the flip.
    """
    cin, cout, kernel = weight.shape
    taps = kernel // stride
    phases = weight.reshape(cin, cout, taps, stride)  # [ci, co, m, p]: kernel index m*s + p
    return phases.permute(3, 1, 0, 2).flip(-1).reshape(stride * cout, cin, taps)


class CausalConvTranspose1d(_SplitConvTranspose1d):
    """ConvTranspose1d (no padding) whose last ``kernel - stride`` outputs are dropped: ``T -> T*stride``.

    With the Triton split conv on (:mod:`streamdec.kernels.conv`) and ``kernel`` a multiple of ``stride``,
    the tf32x3 path runs it as one ordinary convolution per phase (:func:`polyphase_weight`) through that
    kernel, whose accumulation keeps float32 accuracy; otherwise as the stacked cuDNN split.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        if kernel_size < stride:
            raise ValueError(f"kernel_size={kernel_size} < stride={stride} would leave gaps")
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self._register_split_buffers()

    def triton_weight(self) -> Tensor | None:
        kernel, stride = self.kernel_size[0], self.stride[0]
        return polyphase_weight(self.weight, stride) if kernel % stride == 0 else None

    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:  # [B,Cin,T] -> [B,Cout,T*s]
        if output_size is not None:
            raise ValueError("CausalConvTranspose1d always returns T*stride samples; drop output_size")
        if self.on_triton(x):
            return self._polyphase(x)
        y = self.convolve(x)
        return y[..., : x.shape[-1] * self.stride[0]]

    def step_outputs(
        self, head: Tensor, x: Tensor, keep: tuple[Tensor, Tensor] | None = None
    ) -> Tensor | None:
        """The ``T * stride`` outputs of the new inputs ``x`` ``[B, Cin, T]`` after the kept inputs ``head``
        (the ``kernel // stride - 1`` before them): ``self(cat(head, x))[..., H * stride :]``, computed on
        the phase convolutions without a concatenated buffer or a crop (each phase's output ``t`` reads
        ``cat(head, x)[t .. t + H]``, so none is computed that is thrown away); ``keep`` as
        :meth:`PaddedConv1d.convolve` takes it. None where this layer does not run on the phase
        convolutions (the caller then convolves the buffer)."""
        stride = self.stride[0]
        if (
            not self.on_triton(x)
            or self.kernel_size[0] % stride
            or head.shape[-1] != self.kernel_size[0] // stride - 1
        ):
            return None
        bias = None if self.bias is None else self.bias.repeat(stride)
        return self.triton_conv(x, bias, 1, (0, 0), phases=stride, head=head, keep=keep)

    def _polyphase(self, x: Tensor) -> Tensor:
        stride = self.stride[0]
        taps = self.kernel_size[0] // stride
        bias = None if self.bias is None else self.bias.repeat(stride)  # channel p*Cout + co -> bias[co]
        # stride phase convolutions [B, s*Cout, T], interleaved to [B, Cout, T*s]
        return self.triton_conv(x, bias, 1, (taps - 1, 0), phases=stride)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_transpose_interval(lo, hi, kernel=self.kernel_size[0], stride=self.stride[0])


class PaddedConvTranspose1d(_SplitConvTranspose1d):
    """``nn.ConvTranspose1d`` with torch's ``padding``: ``padding`` outputs cropped from each side.

    Length ``T -> (T-1)*stride - 2*padding + kernel``; DAC, Oobleck and BigVGAN use ``kernel = 2*stride``
    (or ``kernel - stride`` even) with ``padding = ceil(stride/2)`` or ``(kernel-stride)//2``, which gives
    ``T*stride`` for even strides and ``T*stride - 1`` for DAC's odd ones.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int,
                 *, bias: bool = True) -> None:  # fmt: skip
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias)
        self._register_split_buffers()

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_transpose_interval(
            lo, hi, kernel=self.kernel_size[0], stride=self.stride[0], crop_left=int(self.padding[0])
        )
