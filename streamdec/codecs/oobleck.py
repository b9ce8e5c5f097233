"""Oobleck decoder (the Stable Audio Open VAE): 64-dim latents at 44.1 kHz / 2048 to stereo audio.

::

    z [B,T,64] --> layers.0  WNConv1d(64, 16c, k7, pad 3)
               --> layers.1..5  DecoderBlock(m_i c -> m_(i-1) c, stride s_i)    m = (1, 1, 2, 4, 8, 16)
               --> layers.6  SnakeBeta --> layers.7  WNConv1d(c, 2, k7, pad 3, no bias)
               --> layers.8  tanh (``final_tanh``; off for Stable Audio Open 1.0) --> [B, 2, T*2048]

    DecoderBlock (``layers``):  SnakeBeta, ConvTranspose1d(k=2s, stride s, padding ceil(s/2)),
                                ResidualUnit(d=1), ResidualUnit(d=3), ResidualUnit(d=9)
    ResidualUnit (``layers``):  x + (SnakeBeta, Conv1d(k7, dilation d, pad 3d), SnakeBeta, Conv1d(k1))(x)

The facts this follows (stable-audio-tools ``models/autoencoders.py``, ``OobleckDecoder`` with
``use_snake=True``, no anti-aliasing, transposed-conv upsampling): ``c_mults`` gets a leading 1; block
``i`` (counting down from the deepest) maps ``c_mults[i]*channels`` to ``c_mults[i-1]*channels`` with
stride ``strides[i-1]``, so the strides run in reverse (8, 8, 4, 4, 2 for Stable Audio Open's
``strides = [2, 4, 4, 8, 8]``); SnakeBeta uses log-scale ``alpha`` and ``beta``
(``x + 1/(exp(beta)+1e-9) * sin(exp(alpha) x)**2``); convolutions carry old-style weight norm. Module
names mirror that decoder, so ``pretransform.model.decoder.<key>`` in a ``model.safetensors`` maps to
``<key>`` here after weight-norm folding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from streamdec.codecs._random import init_conv, init_snake
from streamdec.codecs.base import ConfiguredCodec
from streamdec.codecs.config import Coercers, JSONConfig
from streamdec.codecs.geometry import Interval, residual
from streamdec.codecs.layers import GeoSequential, PaddedConv1d, PaddedConvTranspose1d, Pointwise, SnakeBeta
from streamdec.codecs.stateful import Node, Residual, layout_of
from streamdec.errors import CodecError

__all__ = ["OOBLECK_44K", "OOBLECK_TINY", "OobleckConfig", "OobleckDecoder"]

_DILATIONS = (1, 3, 9)


@dataclass(frozen=True)
class OobleckConfig(JSONConfig):
    """The decoder's ``OobleckDecoder`` arguments (``use_snake=True``), plus the sample rate."""

    family_label = "Oobleck"
    coercers: ClassVar[Coercers] = {"final_tanh": bool}

    latent_dim: int = 64
    channels: int = 128
    c_mults: tuple[int, ...] = (1, 2, 4, 8, 16)
    strides: tuple[int, ...] = (2, 4, 4, 8, 8)
    out_channels: int = 2
    final_tanh: bool = False
    sample_rate: int = 44100

    def __post_init__(self) -> None:
        sizes = [self.latent_dim, self.channels, self.out_channels, self.sample_rate]
        if min(sizes) < 1 or not self.strides or min(self.strides) < 1 or min(self.c_mults, default=0) < 1:
            raise CodecError(f"Oobleck config {self} has a non-positive size or an empty list")
        if len(self.c_mults) != len(self.strides):
            raise CodecError(
                f"Oobleck config has {len(self.c_mults)} c_mults for {len(self.strides)} strides; "
                f"it needs one channel multiplier per stride"
            )

    @property
    def hop_size(self) -> int:
        return math.prod(self.strides)


OOBLECK_44K = OobleckConfig()
OOBLECK_TINY = OobleckConfig(latent_dim=8, channels=2, c_mults=(1, 2, 2, 4, 4))


class ResidualUnit(nn.Module):
    """``x + layers(x)``; ``layers`` = SnakeBeta, k7 conv at dilation ``d`` (centred), SnakeBeta, k1 conv."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        pad = 3 * dilation
        self.layers = GeoSequential(
            SnakeBeta(dim),
            PaddedConv1d(dim, dim, 7, dilation=dilation, pad_left=pad, pad_right=pad),
            SnakeBeta(dim),
            PaddedConv1d(dim, dim, 1, pad_left=0, pad_right=0),
        )

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        out: Tensor = x + self.layers(x)
        return out

    def input_interval(self, lo: int, hi: int) -> Interval:
        return residual(list(self.layers), lo, hi)  # type: ignore[arg-type]

    def stream_layout(self) -> Node:
        channels = cast(PaddedConv1d, self.layers[1]).in_channels
        return Residual(layout_of(self.layers), channels, identity_first=True)


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv (x ``stride``), three residual units at dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.layers = GeoSequential(
            SnakeBeta(cin),
            PaddedConvTranspose1d(cin, cout, 2 * stride, stride, math.ceil(stride / 2)),
            *(ResidualUnit(cout, d) for d in _DILATIONS),
        )

    def forward(self, x: Tensor) -> Tensor:  # [B, Cin, T] -> [B, Cout, T*stride] (even strides)
        out: Tensor = self.layers(x)
        return out

    def input_interval(self, lo: int, hi: int) -> Interval:
        return self.layers.input_interval(lo, hi)

    def stream_layout(self) -> Node:
        return layout_of(self.layers)


class OobleckDecoder(ConfiguredCodec):
    """The Oobleck decoder (module docstring); build through :func:`streamdec.codecs.load_codec`."""

    family: ClassVar[str] = "oobleck"
    config_class = OobleckConfig
    config: OobleckConfig

    def __init__(self, name: str, config: OobleckConfig) -> None:
        super().__init__(
            name,
            config,
            latent_dim=config.latent_dim,
            sample_rate=config.sample_rate,
            channels=config.out_channels,
        )
        mults = (1, *config.c_mults)
        width = config.channels
        layers: list[nn.Module] = [PaddedConv1d.centred(config.latent_dim, mults[-1] * width, 7)]
        for i in range(len(mults) - 1, 0, -1):
            layers.append(DecoderBlock(mults[i] * width, mults[i - 1] * width, config.strides[i - 1]))
        layers += [
            SnakeBeta(mults[0] * width),
            PaddedConv1d.centred(mults[0] * width, config.out_channels, 7, bias=False),
            Pointwise(torch.tanh if config.final_tanh else _identity),
        ]
        self.layers = GeoSequential(*layers)

    def synthesize(self, x: Tensor) -> Tensor:
        """Denormalised ``[B, 64, T]`` -> ``[B, 2, T*2048]`` (odd strides would trim; see DAC)."""
        y: Tensor = self.layers(x)
        return y[..., : x.shape[-1] * self.hop_size]

    def input_interval(self, lo: int, hi: int) -> Interval:
        return self.layers.input_interval(lo, hi)

    def stream_layout(self) -> Node:
        return layout_of(self.layers)

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> OobleckDecoder:
        cfg = OobleckConfig.from_dict(config)
        if any(s % 2 for s in cfg.strides):
            raise CodecError(
                f"Oobleck strides {cfg.strides} include an odd stride, whose transposed conv would not "
                f"give T*stride samples; only even strides are supported"
            )
        return cls(name, cfg)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights (conv N(0, gain^2/fan_in), residual gain 0.5, biases N(0, 0.02^2)).

        SnakeBeta log-scales ``alpha ~ N(0, 0.3^2)``, ``beta ~ N(1, 0.3^2)``; ``global_mean ~ N(0, 0.5^2)``,
        ``global_log_std ~ U(0.5, 2)`` (Stable Audio Open itself has no normalisation: zeros and ones).
        """
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, SnakeBeta):
                init_snake(module, gen)
            elif isinstance(module, ResidualUnit):
                init_conv(module.layers[1], 1.0, gen)
                init_conv(module.layers[3], 0.5, gen)
            elif isinstance(module, PaddedConvTranspose1d):
                init_conv(module, 1.0, gen)
        init_conv(self.layers[0], 1.0, gen)
        init_conv(self.layers[-2], 0.05, gen)
        self.global_mean.copy_(torch.randn(self.latent_dim, generator=gen) * 0.5)
        self.global_log_std.copy_(torch.rand(self.latent_dim, generator=gen) * 1.5 + 0.5)
        self.refresh_cache()


def _identity(x: Tensor) -> Tensor:
    return x
