"""BigVGAN v2 generator: a mel spectrogram (treated as a latent sequence) to mono audio.

::

    mel [B,T,M] --> conv_pre (k7, pad 3) --> stage_0 .. stage_(n-1) --> activation_post
                --> conv_post (k7, pad 3) --> tanh or clamp(-1, 1) --> [B, 1, T*prod(upsample_rates)]

    stage i:  ups.i.0  ConvTranspose1d(k_i, stride u_i, padding (k_i-u_i)//2)
              then the mean of resblocks[i*K .. i*K+K-1]  (one AMP block per resblock kernel size)
    AMPBlock1: for d in dilations: x = x + conv2(act(conv1_d(act(x))))   (centred convs)
    AMPBlock2: for d in dilations: x = x + conv_d(act(x))

Every activation is the alias-free one (x2 up, Snake or SnakeBeta, x2 down) with BigVGAN's *centred*
down filter: the non-causal twin of the AuK decoder. Names, shapes and config keys mirror
``bigvgan.BigVGAN`` (``num_mels``, ``upsample_rates``, ``upsample_kernel_sizes``,
``upsample_initial_channel``, ``resblock``, ``resblock_kernel_sizes``, ``resblock_dilation_sizes``,
``activation``, ``snake_logscale``, ``use_tanh_at_final``, ``use_bias_at_final``, ``sampling_rate``), so a
``bigvgan_generator.pt`` state dict loads key for key after weight-norm folding (its filter buffers are
checked against ours and dropped).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from streamdec.codecs import hifigan
from streamdec.codecs._random import init_snake
from streamdec.codecs.config import Coercers, nested_ints
from streamdec.codecs.geometry import Interval, hull, through
from streamdec.codecs.layers import AliasFreeActivation, PaddedConv1d, PaddedConvTranspose1d, Snake, SnakeBeta
from streamdec.codecs.stateful import Mean, Node, Seq, Stateless, layout_of
from streamdec.errors import CodecError

__all__ = [
    "BIGVGAN_22K",
    "BIGVGAN_24K",
    "BIGVGAN_44K",
    "BIGVGAN_44K_256X",
    "BIGVGAN_TINY",
    "BigVGANConfig",
    "BigVGANGenerator",
]


@dataclass(frozen=True)
class BigVGANConfig(hifigan.HiFiGANConfig):
    """The generator keys of a BigVGAN ``config.json`` (training keys are ignored by the reader).

    ``from_dict(data, ignore_unknown=True)`` reads a whole ``config.json``, which also holds training
    settings.
    """

    family_label = "BigVGAN"
    coercers: ClassVar[Coercers] = {
        "resblock_dilation_sizes": nested_ints,
        **dict.fromkeys(("snake_logscale", "use_tanh_at_final", "use_bias_at_final"), bool),
        **dict.fromkeys(("resblock", "activation"), str),
    }

    num_mels: int = 100
    upsample_rates: tuple[int, ...] = (4, 4, 2, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (8, 8, 4, 4, 4, 4)
    upsample_initial_channel: int = 1536
    resblock: str = "1"
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    activation: str = "snakebeta"
    snake_logscale: bool = True
    use_tanh_at_final: bool = False
    use_bias_at_final: bool = False
    sampling_rate: int = 24000

    def __post_init__(self) -> None:
        self._check_sizes()
        if self.resblock not in ("1", "2"):
            raise CodecError(f"BigVGAN resblock={self.resblock!r}; it must be '1' or '2'")
        if self.activation not in ("snake", "snakebeta"):
            raise CodecError(f"BigVGAN activation={self.activation!r}; it must be 'snake' or 'snakebeta'")
        hifigan.check_upsample_kernels(self.family_label, self)

    def _check_sizes(self) -> None:
        hifigan.check_stage_sizes(self.family_label, self)
        if (
            len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes)
            or not self.resblock_kernel_sizes
        ):
            raise CodecError(
                f"BigVGAN config has {len(self.resblock_kernel_sizes)} resblock_kernel_sizes and "
                f"{len(self.resblock_dilation_sizes)} resblock_dilation_sizes; it needs one dilation list each"
            )
        flat = [*self.upsample_rates, *self.upsample_kernel_sizes, *self.resblock_kernel_sizes]
        flat += [d for ds in self.resblock_dilation_sizes for d in ds]
        if min([*flat, self.num_mels, self.sampling_rate]) < 1 or not all(self.resblock_dilation_sizes):
            raise CodecError(f"BigVGAN config {self} has a non-positive size or an empty dilation list")
        hifigan.check_width_halving(self.family_label, self)

    @property
    def hop_size(self) -> int:
        return math.prod(self.upsample_rates)


# The published v2 generators (their config.json files, generator keys only).
BIGVGAN_24K = BigVGANConfig()  # bigvgan_v2_24khz_100band_256x
BIGVGAN_22K = BigVGANConfig(num_mels=80, sampling_rate=22050)  # bigvgan_v2_22khz_80band_256x
BIGVGAN_44K_256X = BigVGANConfig(num_mels=128, sampling_rate=44100)  # bigvgan_v2_44khz_128band_256x
BIGVGAN_44K = BigVGANConfig(  # bigvgan_v2_44khz_128band_512x
    num_mels=128,
    upsample_rates=(8, 4, 2, 2, 2, 2),
    upsample_kernel_sizes=(16, 8, 4, 4, 4, 4),
    sampling_rate=44100,
)
BIGVGAN_TINY = BigVGANConfig(num_mels=8, upsample_initial_channel=64)


def _act(channels: int, cfg: BigVGANConfig) -> AliasFreeActivation:
    snake = SnakeBeta if cfg.activation == "snakebeta" else Snake
    return AliasFreeActivation(channels, causal=False, act=snake(channels, log_scale=cfg.snake_logscale))


class AMPBlock(hifigan.HiFiGANBlock):
    """AMPBlock1 (``convs1`` at the dilations, ``convs2`` at dilation 1) or AMPBlock2 (``convs`` only),
    each activation the alias-free one."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], cfg: BigVGANConfig) -> None:
        super().__init__(channels, kernel, dilations, cfg.resblock, lambda: _act(channels, cfg))


class _Stage:
    """Geometry view of one stage: ``ups[i]`` then the mean of its AMP blocks (no parameters here)."""

    def __init__(self, up: PaddedConvTranspose1d, blocks: list[AMPBlock]) -> None:
        self.up, self.blocks = up, blocks

    def input_interval(self, lo: int, hi: int) -> Interval:
        return self.up.input_interval(*hull(b.input_interval(lo, hi) for b in self.blocks))


class BigVGANGenerator(hifigan.HiFiGANGenerator):
    """The BigVGAN v2 generator (module docstring); build through :func:`streamdec.codecs.load_codec`."""

    family: ClassVar[str] = "bigvgan"
    config_class = BigVGANConfig
    config: BigVGANConfig

    def __init__(self, name: str, config: BigVGANConfig) -> None:
        block = functools.partial(AMPBlock, cfg=config)
        latents, rate = config.num_mels, config.sampling_rate
        super().__init__(name, config, latent_dim=latents, sample_rate=rate, block=block, nested_ups=True)
        ch = self.final_width
        self.activation_post = _act(ch, config)
        self.conv_post = PaddedConv1d.centred(ch, 1, 7, bias=config.use_bias_at_final)

    def _stages(self) -> list[_Stage]:
        k = len(self.config.resblock_kernel_sizes)
        blocks = [cast(AMPBlock, b) for b in self.resblocks]
        ups = [cast(PaddedConvTranspose1d, u[0]) for u in cast(list[nn.ModuleList], list(self.ups))]
        return [_Stage(up, blocks[i * k : (i + 1) * k]) for i, up in enumerate(ups)]

    def synthesize(self, x: Tensor, *, clamp: bool = True) -> Tensor:
        """Mel ``[B, M, T]`` -> ``[B, 1, T*hop]``; ``clamp=False`` skips the final tanh or clamp."""
        x = self.conv_pre(x)
        for stage in self._stages():
            x = hifigan.mean_of(stage.blocks, stage.up(x))
        x = self.conv_post(self.activation_post(x))
        if not clamp:
            return x
        return torch.tanh(x) if self.config.use_tanh_at_final else x.clamp(-1.0, 1.0)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through([self.conv_pre, *self._stages(), self.activation_post, self.conv_post], lo, hi)

    def stream_layout(self) -> Node:
        stages: list[Node] = [
            Seq([layout_of(stage.up), Mean([b.stream_layout() for b in stage.blocks], stage.up.out_channels)])
            for stage in self._stages()
        ]
        final = torch.tanh if self.config.use_tanh_at_final else _clamp
        layers = [
            layout_of(self.conv_pre),
            *stages,
            layout_of(self.activation_post),
            layout_of(self.conv_post),
        ]
        return Seq([*layers, Stateless(final)])

    def _init_activations(self, gen: torch.Generator) -> None:
        """Snake log-scales ``alpha ~ N(0, 0.3^2)``, ``beta ~ N(1, 0.3^2)`` (linear scales: ``exp`` of
        those). No normalisation: BigVGAN takes log-mel spectrograms as they are."""
        for module in self.modules():
            if isinstance(module, SnakeBeta):
                init_snake(module, gen)


def _clamp(x: Tensor) -> Tensor:
    return x.clamp(-1.0, 1.0)
