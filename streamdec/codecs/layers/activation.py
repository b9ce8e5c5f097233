"""Snake activations and the alias-free activation around them, each knowing its geometry.

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

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs.geometry import Interval, conv_interval, conv_transpose_interval, through
from streamdec.codecs.layers import routing
from streamdec.kernels import alias_free
from streamdec.kernels.conv import keep_tail
from streamdec.kernels.split import split_input, split_weight

__all__ = [
    "FILTER_CUTOFF",
    "FILTER_HALF_WIDTH",
    "FILTER_TAPS",
    "AliasFreeActivation",
    "Snake",
    "SnakeBeta",
    "kaiser_sinc_filter",
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
        if self.use_fused and routing.fused_supported(x):
            if self.causal:
                return self._fused(x)
            if x.shape[-1] >= _CENTRED_TAIL:
                return self._centred_from_causal(x)
        return self.reference(x)

    def _fused(self, x: Tensor) -> Tensor:
        return alias_free.activation(x, self.filter, self.act.alpha_exp, self.act.beta_inv)

    def with_peak(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(self(x), peak)``: ``peak`` is int32 ``[B]``, the float32 bits of each batch row's largest
        output magnitude, where the causal fused op computes the output (it takes them as it writes);
        None elsewhere."""
        if self.causal and self.use_fused and routing.fused_supported(x):
            return alias_free.activation_peak(x, self.filter, self.act.alpha_exp, self.act.beta_inv)
        return self(x), None

    def window(
        self, head: Tensor, x: Tensor, start: int, length: int, keep: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """``self(cat(head, x))[..., start : start + length]``: where the causal fused op runs, computed in
        one pass that reads ``head`` and ``x`` in place and writes only the window (a stateful step keeps
        a history and computes only the outputs whose reach has arrived). ``keep`` = ``(pool, slots)``:
        also write each row's last ``pool.shape[-1]`` inputs of ``cat(head, x)`` to ``pool[slots[b]]``
        (the layer's new state; the fused op copies them as it reads them)."""
        pool, slots = keep if keep is not None else (None, None)
        if self._window_fused(x, start, length):
            return alias_free.activation_window(
                head, x, self.filter, self.act.alpha_exp, self.act.beta_inv, start, length, pool, slots
            )
        whole: Tensor = self(torch.cat([head, x], dim=-1) if head.shape[-1] else x)
        keep_tail(keep, head, x)
        return whole[..., start : start + length]

    def _window_fused(self, x: Tensor, start: int, length: int) -> bool:
        fused = self.causal and self.use_fused and routing.fused_supported(x)
        return fused and (start == 0 or start >= 5) and length >= 1

    def window_with_peak(
        self,
        head: Tensor,
        x: Tensor,
        start: int,
        length: int,
        before: Tensor | None,
        keep: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(self.window(head, x, start, length, keep), peak)``: where the causal fused op runs, ``peak`` is
        int32 ``[B]``, the float32 bits of each batch row's largest magnitude in ``cat(before, window)``,
        what a float16 split convolution of the window after its own history ``before`` needs (None: no
        history); elsewhere None. The window's values are the same either way."""
        if self._window_fused(x, start, length):
            pool, slots = keep if keep is not None else (None, None)
            return alias_free.activation_window_peak(
                head,
                x,
                self.filter,
                self.act.alpha_exp,
                self.act.beta_inv,
                start,
                length,
                before,
                pool,
                slots,
            )
        return self.window(head, x, start, length, keep), None

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
        if self.split_filters and routing.takes_split(x):
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
