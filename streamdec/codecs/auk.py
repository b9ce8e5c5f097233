"""AuK-style "BigVGAN-flow" VAE decoder: 64-dim latents at 50 Hz to 24 kHz mono audio.

::

    z [B,T,64] --denormalize--> conv_pre (k7, centred) --> 6 x stage --> alias-free SnakeBeta
        --> conv_post (k7, causal, no bias) --> clamp(-1, 1) --> [B, 1, T*480]

    stage i:  ConvTranspose1d(k=2r, stride r, drop last r)  -->  mean(AMP_k3, AMP_k7, AMP_k11)
    AMP_k:    for d in (1, 3, 5):  x = x + conv_k(d=1)(act(conv_k(d)(act(x))))     (causal convs)

Everything after ``conv_pre`` is causal, so the lookahead comes from ``conv_pre`` and the x2
upsampling filters of the alias-free activations; the exact figures come from
:meth:`Codec.context_frames`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from streamdec.codecs._random import fill_normal
from streamdec.codecs.base import ConfiguredCodec
from streamdec.codecs.config import JSONConfig
from streamdec.codecs.geometry import Interval, hull, residual, through
from streamdec.codecs.hifigan import mean_of
from streamdec.codecs.layers import AliasFreeActivation, CausalConvTranspose1d, PaddedConv1d
from streamdec.codecs.stateful import Mean, Node, Residual, Seq, Stateless, layout_of
from streamdec.errors import CodecError

__all__ = ["AUK_24K", "TINY", "AMPBlock", "AuKConfig", "AuKDecoder"]


@dataclass(frozen=True)
class AuKConfig(JSONConfig):
    """Architecture of an AuK-style decoder; ``channels[0]`` is conv_pre's width, then one per stage."""

    family_label = "AuK"

    latent_dim: int = 64
    sample_rate: int = 24000
    audio_channels: int = 1
    channels: tuple[int, ...] = (1536, 768, 384, 192, 96, 48, 24)
    upsample_rates: tuple[int, ...] = (5, 4, 3, 2, 2, 2)
    resblock_kernels: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[int, ...] = (1, 3, 5)
    pre_kernel: int = 7
    post_kernel: int = 7

    def __post_init__(self) -> None:
        ints = [self.latent_dim, self.sample_rate, self.audio_channels, self.pre_kernel, self.post_kernel]
        tuples = [self.channels, self.upsample_rates, self.resblock_kernels, self.resblock_dilations]
        if any(v < 1 for v in ints) or any(not t or min(t) < 1 for t in tuples):
            raise CodecError(f"AuK config {self} has a non-positive size or an empty list; all must be >= 1")
        if len(self.channels) != len(self.upsample_rates) + 1:
            raise CodecError(
                f"AuK config has {len(self.channels)} channel widths for {len(self.upsample_rates)} "
                f"upsample stages; it needs exactly one more width than stages"
            )
        if self.pre_kernel % 2 == 0:
            raise CodecError(f"AuK pre_kernel={self.pre_kernel} must be odd (centred padding)")

    @property
    def hop_size(self) -> int:
        return math.prod(self.upsample_rates)


TINY = AuKConfig(channels=(32, 16, 8, 8, 4, 2, 2))
AUK_24K = AuKConfig()


class AMPBlock(nn.Module):
    """Three causal residual units at dilations ``dilations``, each ``act, conv(d), act, conv(1)``."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            PaddedConv1d.causal(channels, channels, kernel, dilation=d) for d in dilations
        )
        self.convs2 = nn.ModuleList(PaddedConv1d.causal(channels, channels, kernel) for _ in dilations)
        self.activations = nn.ModuleList(AliasFreeActivation(channels) for _ in range(2 * len(dilations)))

    def _unit(self, i: int) -> list[nn.Module]:
        acts = self.activations
        return [acts[2 * i], self.convs1[i], acts[2 * i + 1], self.convs2[i]]

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        for i in range(len(self.convs1)):
            act1, conv1, act2, conv2 = self._unit(i)
            # x + conv2(act2(conv1(act1(x)))); PaddedConv1d.after fuses what the kernels allow.
            xt = cast(PaddedConv1d, conv1).after(act1, x)
            x = cast(PaddedConv1d, conv2).after(act2, xt, residual=x)
        return x

    def input_interval(self, lo: int, hi: int) -> Interval:
        for i in reversed(range(len(self.convs1))):
            lo, hi = residual(self._unit(i), lo, hi)  # type: ignore[arg-type]
        return lo, hi

    def stream_layout(self) -> Node:
        channels = cast(PaddedConv1d, self.convs1[0]).in_channels
        units = range(len(self.convs1))
        return Seq(
            [
                Residual(Seq([layout_of(m) for m in self._unit(i)]), channels, identity_first=True)
                for i in units
            ]
        )


class _Stage(nn.Module):
    """One upsampling stage: transposed conv, then the mean of parallel AMP blocks."""

    def __init__(self, cin: int, cout: int, rate: int, cfg: AuKConfig) -> None:
        super().__init__()
        self.up = CausalConvTranspose1d(cin, cout, 2 * rate, rate)
        self.blocks = nn.ModuleList(AMPBlock(cout, k, cfg.resblock_dilations) for k in cfg.resblock_kernels)

    def amp_blocks(self) -> list[AMPBlock]:
        return [cast(AMPBlock, b) for b in self.blocks]

    def forward(self, x: Tensor) -> Tensor:  # [B, Cin, T] -> [B, Cout, T*rate]
        return mean_of(self.amp_blocks(), self.up(x))

    def input_interval(self, lo: int, hi: int) -> Interval:
        lo, hi = hull(block.input_interval(lo, hi) for block in self.amp_blocks())
        return self.up.input_interval(lo, hi)

    def stream_layout(self) -> Node:
        blocks = [block.stream_layout() for block in self.amp_blocks()]
        return Seq([layout_of(self.up), Mean(blocks, self.up.out_channels)])


class AuKDecoder(ConfiguredCodec):
    """The AuK-style decoder (module docstring); build through :func:`streamdec.codecs.load_codec`."""

    family: ClassVar[str] = "auk"
    config_class = AuKConfig
    config: AuKConfig

    def __init__(self, name: str, config: AuKConfig) -> None:
        super().__init__(
            name,
            config,
            latent_dim=config.latent_dim,
            sample_rate=config.sample_rate,
            channels=config.audio_channels,
        )
        ch = config.channels
        self.conv_pre = PaddedConv1d.centred(config.latent_dim, ch[0], config.pre_kernel)
        self.stages = nn.ModuleList(
            _Stage(ch[i], ch[i + 1], r, config) for i, r in enumerate(config.upsample_rates)
        )
        self.activation_post = AliasFreeActivation(ch[-1])
        self.conv_post = PaddedConv1d.causal(ch[-1], config.audio_channels, config.post_kernel, bias=False)

    def _layers(self) -> list[nn.Module]:
        return [self.conv_pre, *self.stages, self.activation_post, self.conv_post]

    def synthesize(self, x: Tensor, *, clamp: bool = True) -> Tensor:
        """Denormalised ``[B, 64, T]`` -> ``[B, 1, T*480]``; ``clamp=False`` exposes the pre-clamp signal."""
        for layer in self._layers():
            x = layer(x)
        return x.clamp(-1.0, 1.0) if clamp else x

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through(self._layers(), lo, hi)  # type: ignore[arg-type]

    def stream_layout(self) -> Node:
        return Seq([*(layout_of(m) for m in self._layers()), Stateless(_clamp)])

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights whose decode of N(0, 1) latents is audio-like (std ~0.1, rarely clipped).

        Conv weights are N(0, gain^2 / fan_in); residual branches get a small gain so nine residual
        units per block stay bounded; SnakeBeta log-scales are ``alpha ~ N(0, 0.3^2)``, ``beta ~ N(1, 0.3^2)``
        (a sin^2 term of weight about 1/e keeps the DC drift small); biases are N(0, 0.02^2), non-zero.
        ``global_mean ~ N(0, 0.5^2)`` and ``global_log_std ~ U(0.5, 2)`` make normalisation non-trivial.
        """
        gen = torch.Generator().manual_seed(seed)

        def normal(t: Tensor, std: float, mean: float = 0.0) -> None:
            fill_normal(t, gen, std, mean)

        def conv(m: nn.Conv1d | nn.ConvTranspose1d, gain: float, transposed: bool = False) -> None:
            w = m.weight  # Conv1d [out, in, k]; ConvTranspose1d [in, out, k], k/stride taps per output
            fan_in = w.shape[0] * w.shape[2] // m.stride[0] if transposed else w.shape[1] * w.shape[2]
            normal(w, gain / math.sqrt(fan_in))
            if m.bias is not None:
                normal(m.bias, 0.02)

        for module in self.modules():
            if isinstance(module, AliasFreeActivation):
                normal(module.act.alpha, 0.3)
                normal(module.act.beta, 0.3, mean=1.0)
        conv(self.conv_pre, 1.0)
        for stage in self.stages:
            conv(cast(_Stage, stage).up, 1.0, transposed=True)
            for block in cast(_Stage, stage).amp_blocks():
                for c1, c2 in zip(block.convs1, block.convs2, strict=True):
                    conv(cast(nn.Conv1d, c1), 1.0)
                    conv(cast(nn.Conv1d, c2), 0.5)
        conv(self.conv_post, 0.15)
        normal(self.global_mean, 0.5)
        self.global_log_std.copy_(torch.rand(self.global_log_std.shape, generator=gen) * 1.5 + 0.5)
        self.refresh_cache()


def _clamp(x: Tensor) -> Tensor:
    return x.clamp(-1.0, 1.0)
