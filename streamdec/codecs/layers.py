"""Shared decoder layers, each knowing its own receptive-field geometry.

Alias-free activation (the exact choices a fused GPU kernel reproduces; change them only together):

* Filter: 12-tap Kaiser-windowed sinc, cutoff 0.25, half-width 0.3 (BigVGAN's
  ``kaiser_sinc_filter1d(0.25, 0.3, 12)``): even kernel, ``time = arange(-6, 6) + 0.5``,
  ``A = 2.285 * (6 - 1) * pi * 4 * half_width + 7.95``, Kaiser ``beta`` from ``A`` by the standard
  formula, symmetric (``periodic=False``) window, ``2 * cutoff * window * sinc(2 * cutoff * time)``,
  normalised to sum 1. Computed in float64, cast to the module dtype by :meth:`refresh_cache`.
* Buffer layout: one ``[1, 1, 12]`` filter per activation, the same taps for every channel. The
  depthwise (``groups=C``) convolutions below are computed as single-channel convolutions over a
  ``[B*C, 1, T]`` view, which is the same arithmetic (a per-channel ``[C, 1, 12]`` filter would need the
  grouped form instead).
* Upsample x2: replicate-pad 5 samples each side, ``2 * conv_transpose1d(x, filt, stride=2, groups=C)``,
  crop 15 samples from each side: length ``T -> 2T``.
* SnakeBeta at the doubled rate, ``x + 1/(exp(beta) + 1e-9) * sin(exp(alpha) * x)**2`` with per-channel
  log-scale ``alpha`` and ``beta`` (or any :class:`Snake`/:class:`SnakeBeta` passed as ``act``).
* Downsample x2, causal (AuK): replicate-pad 11 samples on the left only, ``conv1d(filt, stride=2,
  groups=C)``: length ``2T -> T``. Output ``t`` reads input samples ``t-8 .. t+2`` of the activation's input.
* Downsample x2, centred (``causal=False``, BigVGAN v2's ``LowPassFilter1d``): replicate-pad 5 left and 6
  right, same filter and stride. Output ``t`` reads input samples ``t-5 .. t+5``. The fused GPU kernel
  implements the causal variant; centred activations use it shifted (see ``_centred_from_causal``).

Derived, non-persistent buffers (the filter, ``exp(alpha)``, ``1/(exp(beta)+1e-9)``) are rebuilt by
``refresh_cache()``, which every loader calls after weights are in place and after any dtype change.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs.geometry import Interval, conv_interval, conv_transpose_interval, through
from streamdec.codecs.precision import pack_split_weight, pack_split_weight_f16, split_input, split_weight
from streamdec.errors import ConfigError


def _from_kernels(module: str, name: str) -> Callable[..., Any] | None:
    """A function of ``streamdec.kernels.<module>``, or None where that package is absent."""
    try:
        found: Callable[..., Any] = getattr(importlib.import_module(f"streamdec.kernels.{module}"), name)
    except ModuleNotFoundError:  # pragma: no cover - depends on what is installed
        return None
    return found


# The fused alias-free activation's dispatch rule, and the split-TF32 convolution's with the call that
# splits an input and runs it; layers use the call only where the rule let them.
_fused_supported = _from_kernels("alias_free", "fused_supported")
_triton_conv_supported = _from_kernels("conv", "triton_conv_supported")
_f16_conv_supported = _from_kernels("conv", "f16_conv_supported")
_split_conv1d = _from_kernels("conv", "split_conv1d")
_split_conv1d_f16 = _from_kernels("conv", "split_conv1d_f16")


def _takes_split(x: Tensor) -> bool:
    """Whether a tf32x3 layer splits this input: TF32 exists only on CUDA, and only float32 is split."""
    return x.is_cuda and x.dtype == torch.float32


__all__ = [
    "FILTER_CUTOFF",
    "FILTER_HALF_WIDTH",
    "FILTER_TAPS",
    "AliasFreeActivation",
    "CausalConvTranspose1d",
    "GeoSequential",
    "PaddedConv1d",
    "PaddedConvTranspose1d",
    "Pointwise",
    "Snake",
    "SnakeBeta",
    "SplitConv",
    "kaiser_sinc_filter",
    "polyphase_weight",
    "refresh_caches",
    "set_split_convs",
]

FILTER_TAPS = 12
FILTER_CUTOFF = 0.25
FILTER_HALF_WIDTH = 0.3
_UP_PAD = FILTER_TAPS // 2 - 1  # 5: replicate padding before the x2 transposed filter
_UP_CROP = _UP_PAD * 2 + (FILTER_TAPS - 2) // 2  # 15: samples cropped from each side after it
_DOWN_PAD = FILTER_TAPS - 1  # 11: causal left padding of the x2 decimating filter
_DOWN_PAD_CENTRED = (FILTER_TAPS // 2 - 1, FILTER_TAPS // 2)  # (5, 6): BigVGAN's LowPassFilter1d, even taps
_SNAKE_EPS = 1e-9
_CENTRED_SHIFT = (_DOWN_PAD - _DOWN_PAD_CENTRED[0]) // 2  # 3: centred output t is causal output t + 3
_CENTRED_TAIL = 16  # inputs whose reference pass gives the last _CENTRED_SHIFT centred outputs exactly


def kaiser_sinc_filter(
    cutoff: float = FILTER_CUTOFF, half_width: float = FILTER_HALF_WIDTH, taps: int = FILTER_TAPS
) -> Tensor:
    """Kaiser-windowed sinc low-pass, float64 ``[taps]``, summing to 1 (even ``taps`` only)."""
    if taps % 2:
        raise ValueError(f"taps={taps} must be even for this filter layout")
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21.0) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, periodic=False, beta=beta, dtype=torch.float64)
    time = torch.arange(-half, half, dtype=torch.float64) + 0.5
    filt = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return filt / filt.sum()


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

    def _register_split_buffers(self) -> None:
        for name in ("split_weight", "packed_split", "packed_f16", "f16_inverse"):
            self.register_buffer(name, None, persistent=False)

    def set_split(self, enabled: bool, *, f16: bool = False) -> None:
        """Take the split path (``f16``: the float16 kernel where it can run this layer), or not."""
        self.split_enabled, self.split_f16 = enabled, enabled and f16
        self.refresh_split()

    def refresh_split(self) -> None:
        """Cache the split weight in the form this layer's split path takes (or none when off)."""
        on = self.split_enabled and self.weight.dtype == torch.float32
        triton = on and _triton_conv_supported is not None and _triton_conv_supported(self.weight)
        as_conv = self.triton_weight() if triton else None
        f16 = self.split_f16 and _f16_conv_supported is not None and _f16_conv_supported(self.weight)
        f16_form = pack_split_weight_f16(as_conv) if f16 and as_conv is not None else None
        self.packed_f16, self.f16_inverse = f16_form or (None, None)
        self.packed_split = pack_split_weight(as_conv) if as_conv is not None and f16_form is None else None
        self.split_weight = split_weight(self.weight, self.weight_in_dim) if on and as_conv is None else None

    def on_triton(self, x: Tensor) -> bool:
        """Whether this call goes through a Triton split kernel (:meth:`triton_conv`)."""
        return (self.packed_split is not None or self.packed_f16 is not None) and _takes_split(x)

    def triton_conv(
        self,
        x: Tensor,
        bias: Tensor | None,
        dilation: int,
        pads: tuple[int, int] = (0, 0),
        residual: Tensor | None = None,
        peak: Tensor | None = None,
        phases: int = 1,
    ) -> Tensor:
        """``x`` zero-padded by ``pads`` through this layer's ordinary-convolution form (then
        ``residual +`` it), on whichever kernel holds it; ``phases`` > 1 interleaves the output's phase
        groups in time (a transposed convolution's phases, see ``conv1d_split_f16``). The float16 op pads
        as it splits, adds the residual in its epilogue and takes ``x``'s row peaks from ``peak`` when
        given: no padded copy, no separate add, no pass for the peaks."""
        if self.packed_f16 is not None:
            assert _split_conv1d_f16 is not None and self.f16_inverse is not None  # set only where it loaded
            out: Tensor = _split_conv1d_f16(
                x, self.packed_f16, self.f16_inverse, bias, dilation, pads, residual, peak, phases
            )
            return out
        assert _split_conv1d is not None and self.packed_split is not None  # likewise
        out = _split_conv1d(F.pad(x, pads), self.packed_split, bias, dilation, phases)
        return out if residual is None else residual + out

    def triton_weight(self) -> Tensor | None:
        """This layer as an ordinary ``[Cout, Cin, k]`` convolution the Triton kernel runs, if it can be one."""
        return None

    def splits(self, x: Tensor) -> bool:
        """Whether this call takes the split path: it is cached, and ``x`` is CUDA float32."""
        return self.split_weight is not None and _takes_split(x)


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
        self, x: Tensor, pads: tuple[int, int]
    ) -> Tensor:  # [B, Cin, T] -> [B, Cout, T + pads - (k-1)*d]
        """This convolution with ``pads`` zeros around ``x`` instead of its own padding (stateful streaming
        convolves a kept history with none), on whichever path this layer takes."""
        if self.on_triton(x):
            return self.triton_conv(x, self.bias, self.dilation[0], pads)
        x = F.pad(x, pads)
        if self.split_weight is not None and self.splits(x):
            return F.conv1d(split_input(x), self.split_weight, self.bias, self.stride, 0, self.dilation)
        return super().forward(x)

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

    def _polyphase(self, x: Tensor) -> Tensor:
        stride = self.stride[0]
        taps = self.kernel_size[0] // stride
        bias = None if self.bias is None else self.bias.repeat(stride)  # channel p*Cout + co -> bias[co]
        # stride phase convolutions [B, s*Cout, T], interleaved to [B, Cout, T*s]
        return self.triton_conv(x, bias, 1, (taps - 1, 0), phases=stride)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_transpose_interval(lo, hi, kernel=self.kernel_size[0], stride=self.stride[0])


class SnakeBeta(nn.Module):
    """``x + 1/(exp(beta)+1e-9) * sin(exp(alpha)*x)**2`` per channel; ``alpha``, ``beta`` are log-scales.

    ``log_scale=False`` reads ``alpha`` and ``beta`` as the scales themselves (BigVGAN's
    ``snake_logscale: false``): ``x + 1/(beta+1e-9) * sin(alpha*x)**2``. Either way the forward pass uses
    the cached ``alpha_exp`` (the frequency) and ``beta_inv`` (the magnitude), which the fused kernel reads.
    """

    alpha_exp: Tensor
    beta_inv: Tensor

    def __init__(self, channels: int, *, log_scale: bool = True) -> None:
        super().__init__()
        self.log_scale = log_scale
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.register_buffer("alpha_exp", torch.empty(channels), persistent=False)
        self.register_buffer("beta_inv", torch.empty(channels), persistent=False)

    def _scale(self, p: Tensor) -> Tensor:
        return torch.exp(p.detach()) if self.log_scale else p.detach().clone()

    def _magnitude(self) -> Tensor:
        return self.beta

    @torch.no_grad()
    def refresh_cache(self) -> None:
        """Recompute the frequency ``exp(alpha)`` and ``1/(exp(beta)+eps)`` from the current parameters."""
        self.alpha_exp = self._scale(self.alpha)
        self.beta_inv = 1.0 / (self._scale(self._magnitude()) + _SNAKE_EPS)

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        a = self.alpha_exp.unsqueeze(-1)
        b = self.beta_inv.unsqueeze(-1)
        return x + b * torch.sin(a * x).pow(2)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return lo, hi


class Snake(SnakeBeta):
    """Snake with one parameter per channel: ``x + 1/(a+1e-9) * sin(a*x)**2``, ``a = alpha`` (DAC's
    ``Snake1d``, BigVGAN's ``Snake``), or ``a = exp(alpha)`` with ``log_scale=True``.

    The magnitude is tied to the frequency, so it shares :class:`SnakeBeta`'s forward pass and caches
    (and the fused kernel); it simply has no ``beta`` parameter of its own.
    """

    def __init__(self, channels: int, *, log_scale: bool = False) -> None:
        super().__init__(channels, log_scale=log_scale)
        del self.beta

    def _magnitude(self) -> Tensor:
        return self.alpha


class _Downsample2Geometry:
    """Geometry of the x2 decimating half of :class:`AliasFreeActivation` (``pad_left`` 11 or 5)."""

    def __init__(self, pad_left: int) -> None:
        self.pad_left = pad_left

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_interval(lo, hi, kernel=FILTER_TAPS, stride=2, pad_left=self.pad_left)


class AliasFreeActivation(nn.Module):
    """Upsample x2, SnakeBeta, downsample x2 (see the module docstring for the exact recipe).

    ``causal`` (default, AuK) picks the causal down filter; ``causal=False`` the centred one of BigVGAN v2.
    ``act`` replaces the default log-scale :class:`SnakeBeta` (e.g. a :class:`Snake`).

    ``use_fused`` (default on; ``streamdec.kernels.set_fused`` flips it per codec) lets a call whose input
    the kernel supports (CUDA float32, see ``streamdec.kernels.fused_supported``) run the fused op
    ``torch.ops.streamdec.alias_free_activation`` instead of the reference path; everything else, the CPU
    included, always takes the reference path. The op is causal; a centred activation uses it shifted by
    three samples plus a short reference pass for its last three outputs (:meth:`_centred_from_causal`).
    """

    filter: Tensor

    def __init__(self, channels: int, *, causal: bool = True, act: SnakeBeta | None = None) -> None:
        super().__init__()
        self.use_fused = True
        self.split_filters = False  # the tf32x3 precision: filter convolutions split like SplitConv's
        self.causal = causal
        self.down_pad = (_DOWN_PAD, 0) if causal else _DOWN_PAD_CENTRED
        self.act = act if act is not None else SnakeBeta(channels)
        self.register_buffer("filter", torch.empty(1, 1, FILTER_TAPS), persistent=False)

    @torch.no_grad()
    def refresh_cache(self) -> None:
        """Rebuild the filter (float64 design, cast to the module dtype) and the SnakeBeta caches."""
        dtype, device = self.act.alpha.dtype, self.act.alpha.device
        self.filter = kaiser_sinc_filter().to(device=device, dtype=dtype).view(1, 1, FILTER_TAPS)
        self.act.refresh_cache()

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        if self.use_fused and _fused_supported is not None and _fused_supported(x):
            if self.causal:
                return self._fused(x)
            if x.shape[-1] >= _CENTRED_TAIL:
                return self._centred_from_causal(x)
        return self.reference(x)

    def _fused(self, x: Tensor) -> Tensor:
        out: Tensor = torch.ops.streamdec.alias_free_activation(
            x, self.filter, self.act.alpha_exp, self.act.beta_inv
        )
        return out

    def with_peak(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(self(x), peak)``: ``peak`` is int32 ``[B]``, the float32 bits of each batch row's largest
        output magnitude, where the causal fused op computes the output (it takes them as it writes);
        None elsewhere."""
        if self.causal and self.use_fused and _fused_supported is not None and _fused_supported(x):
            out, peak = torch.ops.streamdec.alias_free_activation_peak(
                x, self.filter, self.act.alpha_exp, self.act.beta_inv
            )
            return out, peak
        return self(x), None

    def _centred_from_causal(self, x: Tensor) -> Tensor:  # [B, C, T >= 16] -> [B, C, T]
        """The centred activation through the causal fused op (same values up to float32 rounding).

        Both down filters read the same SnakeBeta samples ``S`` (left edge replicated); the centred one
        pads 5 on the left and the causal one 11, so centred output ``t`` is causal output ``t + 3``::

            causal   out[t+3] = sum_k f[k] S[2(t+3) + k - 11] = sum_k f[k] S[2t + k - 5] = centred out[t]

        That holds up to ``t = T - 4``; the last 3 centred outputs read past the end of ``S`` (the right
        replicate pad), so they come from the reference path on the last 16 inputs, which is exact: output
        ``t`` reads inputs ``t-5 .. t+5`` only, all inside that slice for the last 3.
        """
        body = self._fused(x)[..., _CENTRED_SHIFT:]
        tail = self.reference(x[..., -_CENTRED_TAIL:])[..., -_CENTRED_SHIFT:]
        return torch.cat([body, tail], dim=-1)

    def reference(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        """The unfused path (module docstring): what every other path must equal."""
        # One filter for every channel, so the depthwise (groups=C) convolutions equal single-channel
        # convolutions over a [B*C, 1, T] view; on the CPU that is about 2-3x faster than grouped ones.
        batch, channels, length = x.shape
        flat = x.reshape(batch * channels, 1, length)
        up = F.pad(flat, (_UP_PAD, _UP_PAD), mode="replicate")
        up = 2.0 * self._filter(up, transposed=True)[..., _UP_CROP:-_UP_CROP]
        up = self.act(up.view(batch, channels, 2 * length)).view(batch * channels, 1, 2 * length)
        down = self._filter(F.pad(up, self.down_pad, mode="replicate"), transposed=False)
        return down.view(batch, channels, length)

    def _filter(self, x: Tensor, *, transposed: bool) -> Tensor:  # stride-2 filter, [N, 1, T]
        conv = F.conv_transpose1d if transposed else F.conv1d
        if self.split_filters and _takes_split(x):
            # 12 taps: splitting them per call costs less than caching two more buffers per activation
            return conv(split_input(x), split_weight(self.filter, 0 if transposed else 1), stride=2)
        return conv(x, self.filter, stride=2)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through([_Upsample2Geometry(), self.act, _Downsample2Geometry(self.down_pad[0])], lo, hi)


class _Upsample2Geometry:
    """Geometry of the x2 upsampling half of :class:`AliasFreeActivation`."""

    def input_interval(self, lo: int, hi: int) -> Interval:
        return conv_transpose_interval(
            lo, hi, kernel=FILTER_TAPS, stride=2, crop_left=_UP_CROP, pad_left=_UP_PAD
        )


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


class Pointwise(nn.Module):
    """An elementwise function (``tanh``, ``clamp``) as a layer with identity geometry."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return lo, hi


class GeoSequential(nn.Sequential):
    """``nn.Sequential`` whose geometry is its children's, composed (every child must be geometric).

    Families mirror a reference implementation's ``nn.Sequential`` with it, so that state-dict keys
    (``model.1.block.2...``) match the reference checkpoints one for one.
    """

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through(list(self), lo, hi)  # type: ignore[arg-type]


def refresh_caches(module: nn.Module) -> None:
    """Rebuild every derived buffer (activation caches, tf32x3 split weights) after loading or a dtype change."""
    for sub in module.modules():
        if isinstance(sub, (AliasFreeActivation, SnakeBeta)):
            sub.refresh_cache()
        elif isinstance(sub, SplitConv):
            sub.refresh_split()


def all_convs_on_triton_split(module: nn.Module, *, f16: bool = False) -> bool:
    """Whether every convolution of ``module`` runs through a Triton split kernel (``f16``: the float16
    one): true only after ``set_split_convs(module, True)`` on CUDA float32 weights with the kernels on,
    and only where each layer has an ordinary-convolution form (:meth:`SplitConv.triton_weight`)."""
    convs = [sub for sub in module.modules() if isinstance(sub, SplitConv)]
    if f16:
        return bool(convs) and all(sub.packed_f16 is not None for sub in convs)
    return bool(convs) and all(sub.packed_split is not None or sub.packed_f16 is not None for sub in convs)


def set_split_convs(module: nn.Module, enabled: bool, *, f16: bool = False) -> None:
    """Switch every convolution in ``module`` to the split path (``f16``: the float16 kernel where a
    layer can take it, ``"fp16x3"``; else ``"tf32x3"``), or back to plain.

    Raises :class:`ConfigError` (and changes nothing) when enabling finds a convolution module that is
    not a :class:`SplitConv`: under the TF32 flag that split precision sets, it would silently run in TF32.
    """
    if enabled:
        convs = [(name or "<root>", sub) for name, sub in module.named_modules()
                 if isinstance(sub, nn.modules.conv._ConvNd)]  # fmt: skip
        foreign = [f"{name} ({type(sub).__name__})" for name, sub in convs if not isinstance(sub, SplitConv)]
        if foreign:
            raise ConfigError(
                f"precision 'tf32x3' needs streamdec's conv layers, but these are other convolutions: "
                f"{', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}; use 'fp32' (exact) or 'tf32'"
            )
        grouped = [f"{name} (groups={sub.groups})" for name, sub in convs if sub.groups != 1]
        if grouped:  # stacking [x_hi, x_hi, x_lo] along channels would cross group boundaries
            raise ConfigError(
                f"precision 'tf32x3' supports groups=1 convolutions only; grouped: {', '.join(grouped[:5])}; "
                f"use 'fp32' (exact) or 'tf32'"
            )
    for sub in module.modules():
        if isinstance(sub, SplitConv):
            sub.set_split(enabled, f16=f16)
        elif isinstance(sub, AliasFreeActivation):
            sub.split_filters = enabled
