"""DAC (Descript Audio Codec) decoder: the continuous latent after the quantizer to mono audio.

::

    z [B,T,D] --> model.0  WNConv1d(D, C, k7, pad 3)
              --> model.i  DecoderBlock(C/2^(i-1) -> C/2^i, stride r_i)        i = 1 .. len(rates)
              --> Snake --> WNConv1d(C/2^n, 1, k7, pad 3) --> tanh --> [B, 1, T*hop]

    DecoderBlock:  Snake, ConvTranspose1d(k=2r, stride r, padding ceil(r/2)),
                   ResidualUnit(d=1), ResidualUnit(d=3), ResidualUnit(d=9)
    ResidualUnit:  x + (Snake, Conv1d(k7, dilation d, pad 3d), Snake, Conv1d(k1))(x)

Everything is non-causal (centred convolutions). Snake is ``x + 1/(a+1e-9) * sin(a*x)**2`` with a
per-channel *linear* ``a`` (DAC's ``Snake1d``). Module names mirror ``dac.model.dac.Decoder`` so that a DAC
``.pth`` state dict maps key for key (``decoder.`` prefix dropped, weight norm folded, ``alpha``
``[1, C, 1]`` flattened to ``[C]``).

Odd strides (the 24 and 16 kHz models use rates 8, 5, 4, 2) make DAC's transposed conv return
``T*r - 1`` samples, so the reference decoder returns ``T*hop - 8`` samples there. :meth:`DACDecoder.
synthesize` computes exactly those samples and appends zeros up to ``T*hop`` so that every frame has
``hop`` samples; with even strides (44 kHz) nothing is appended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs._random import init_conv
from streamdec.codecs.base import ConfiguredCodec
from streamdec.codecs.config import JSONConfig
from streamdec.codecs.geometry import Interval, residual
from streamdec.codecs.layers import GeoSequential, PaddedConv1d, PaddedConvTranspose1d, Pointwise, Snake
from streamdec.codecs.stateful import Node, Residual, layout_of
from streamdec.errors import CodecError, DTypeError, ShapeError

__all__ = ["DAC_16K", "DAC_24K", "DAC_44K", "DAC_TINY", "DACCodebooks", "DACConfig", "DACDecoder"]

_DILATIONS = (1, 3, 9)


@dataclass(frozen=True)
class DACConfig(JSONConfig):
    """Architecture of a DAC decoder (the reference's ``latent_dim``, ``decoder_dim``, ``decoder_rates``)."""

    family_label = "DAC"

    latent_dim: int = 1024
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    sample_rate: int = 44100

    def __post_init__(self) -> None:
        if min(self.latent_dim, self.decoder_dim, self.sample_rate) < 1 or not self.decoder_rates:
            raise CodecError(f"DAC config {self} has a non-positive size or no decoder rates")
        if min(self.decoder_rates) < 1:
            raise CodecError(f"DAC decoder_rates {self.decoder_rates} must all be >= 1")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            raise CodecError(
                f"DAC decoder_dim={self.decoder_dim} must be divisible by 2^{len(self.decoder_rates)} "
                f"(each of the {len(self.decoder_rates)} blocks halves the width)"
            )

    @property
    def hop_size(self) -> int:
        return math.prod(self.decoder_rates)


DAC_44K = DACConfig()
DAC_24K = DACConfig(decoder_rates=(8, 5, 4, 2), sample_rate=24000)
DAC_16K = DACConfig(decoder_rates=(8, 5, 4, 2), sample_rate=16000)
DAC_TINY = DACConfig(latent_dim=16, decoder_dim=32, decoder_rates=(8, 8, 4, 2), sample_rate=44100)


class ResidualUnit(nn.Module):
    """``x + block(x)``; ``block`` = Snake, k7 conv at dilation ``d`` (centred), Snake, k1 conv."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        pad = 3 * dilation
        self.block = GeoSequential(
            Snake(dim),
            PaddedConv1d(dim, dim, 7, dilation=dilation, pad_left=pad, pad_right=pad),
            Snake(dim),
            PaddedConv1d(dim, dim, 1, pad_left=0, pad_right=0),
        )

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        out: Tensor = x + self.block(x)
        return out

    def input_interval(self, lo: int, hi: int) -> Interval:
        return residual(list(self.block), lo, hi)  # type: ignore[arg-type]

    def stream_layout(self) -> Node:
        channels = cast(PaddedConv1d, self.block[1]).in_channels
        return Residual(layout_of(self.block), channels, identity_first=True)


class DecoderBlock(nn.Module):
    """Snake, transposed conv (x ``stride``), three residual units at dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.block = GeoSequential(
            Snake(cin),
            PaddedConvTranspose1d(cin, cout, 2 * stride, stride, math.ceil(stride / 2)),
            *(ResidualUnit(cout, d) for d in _DILATIONS),
        )

    def forward(self, x: Tensor) -> Tensor:  # [B, Cin, T] -> [B, Cout, ~T*stride]
        out: Tensor = self.block(x)
        return out

    def input_interval(self, lo: int, hi: int) -> Interval:
        return self.block.input_interval(lo, hi)

    def stream_layout(self) -> Node:
        return layout_of(self.block)


class DACDecoder(ConfiguredCodec):
    """The DAC decoder (module docstring); build through :func:`streamdec.codecs.load_codec`."""

    family: ClassVar[str] = "dac"
    config_class = DACConfig
    config: DACConfig

    def __init__(self, name: str, config: DACConfig) -> None:
        super().__init__(name, config, latent_dim=config.latent_dim, sample_rate=config.sample_rate)
        width = config.decoder_dim
        layers: list[nn.Module] = [PaddedConv1d.centred(config.latent_dim, width, 7)]
        for i, stride in enumerate(config.decoder_rates):
            layers.append(DecoderBlock(width // 2**i, width // 2 ** (i + 1), stride))
        out = width // 2 ** len(config.decoder_rates)
        layers += [Snake(out), PaddedConv1d.centred(out, 1, 7), Pointwise(torch.tanh)]
        self.model = GeoSequential(*layers)

    def synthesize(self, x: Tensor) -> Tensor:
        """Denormalised ``[B, D, T]`` -> ``[B, 1, T*hop]``: the reference's samples, zero-padded to ``T*hop``."""
        y: Tensor = self.model(x)
        return F.pad(y, (0, x.shape[-1] * self.hop_size - y.shape[-1]))

    def input_interval(self, lo: int, hi: int) -> Interval:
        return self.model.input_interval(lo, hi)

    def stream_layout(self) -> Node:
        return layout_of(self.model)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights whose decode of N(0, 1) latents stays audio-like (tanh rarely saturates).

        Conv weights are N(0, gain^2 / fan_in), residual branches at gain 0.5; biases N(0, 0.02^2); Snake
        frequencies ``alpha ~ U(0.5, 1.5)`` (linear scale, as DAC trains them). No normalisation.
        """
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, Snake):
                module.alpha.copy_(torch.rand(module.alpha.shape, generator=gen) + 0.5)
            elif isinstance(module, ResidualUnit):
                init_conv(module.block[1], 1.0, gen)
                init_conv(module.block[3], 0.5, gen)
            elif isinstance(module, PaddedConvTranspose1d):
                init_conv(module, 1.0, gen)
        init_conv(self.model[0], 1.0, gen)
        init_conv(self.model[-2], 0.3, gen)
        self.global_mean.zero_()
        self.global_log_std.fill_(1.0)
        self.refresh_cache()


class DACCodebooks(nn.Module):
    """DAC's residual codebooks: discrete codes to the continuous latent the decoder takes.

    ``latents(codes)`` equals ``DAC.quantizer.from_codes(codes)[0]`` (transposed): the sum over codebooks
    ``i < n`` of ``out_proj_i(codebook_i[codes[..., i]])``. Each frame maps on its own, so a token model's
    codes can be turned into latents chunk by chunk before streaming them. ``tables`` holds, per codebook,
    every entry already projected (``[n_codebooks, codebook_size, latent_dim]``). Build with
    :func:`streamdec.codecs.formats.read_dac_codebooks`.
    """

    tables: Tensor

    def __init__(self, tables: Tensor) -> None:
        super().__init__()
        self.register_buffer("tables", tables)

    @property
    def n_codebooks(self) -> int:
        return int(self.tables.shape[0])

    @property
    def codebook_size(self) -> int:
        return int(self.tables.shape[1])

    def latents(self, codes: Tensor) -> Tensor:  # [..., T, n] integer -> [..., T, latent_dim]
        """Codes of the first ``n <= n_codebooks`` codebooks (last axis) to latents ``[..., T, latent_dim]``."""
        if codes.is_floating_point() or codes.is_complex():
            raise DTypeError(f"codes have dtype {codes.dtype}; pass integer codes (e.g. codes.long())")
        n = codes.shape[-1]
        if not 1 <= n <= self.n_codebooks:
            raise ShapeError(
                f"codes have {n} codebooks on their last axis (shape {tuple(codes.shape)}); this model has "
                f"{self.n_codebooks}: pass [..., frames, n] with 1 <= n <= {self.n_codebooks}"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ShapeError(
                f"codes must lie in [0, {self.codebook_size}); got {int(codes.min())}..{int(codes.max())}"
            )
        codes = codes.to(self.tables.device).long()
        out = self.tables[0][codes[..., 0]]
        for i in range(1, n):
            out = out + self.tables[i][codes[..., i]]
        return out
