"""What BigVGAN and VITS share: HiFi-GAN's layout of upsampling stages and residual blocks.

Both generators are ``conv_pre``, then per stage a transposed convolution (``ups``) and the mean of ``K``
residual blocks (``resblocks[i*K .. i*K+K-1]``, one per resblock kernel size), then an activation and
``conv_post``. A block is kind ``"1"`` (``convs1`` at the dilations, ``convs2`` at dilation 1, two
activations per unit) or ``"2"`` (``convs`` at the dilations, one activation per unit). The families differ
in their activations, in what surrounds the stages and in their state-dict keys; those stay in their modules.
AuK's causal stages take their mean the same way (:func:`mean_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from streamdec.codecs._random import init_conv
from streamdec.codecs.base import ConfiguredCodec
from streamdec.codecs.config import JSONConfig
from streamdec.codecs.layers import PaddedConv1d, PaddedConvTranspose1d
from streamdec.codecs.residual import ResidualUnits
from streamdec.errors import CodecError

__all__ = [
    "HiFiGANBlock",
    "HiFiGANConfig",
    "HiFiGANGenerator",
    "check_stage_sizes",
    "check_upsample_kernels",
    "check_width_halving",
    "mean_of",
    "upsample_stages",
]


class HiFiGANConfig(JSONConfig):
    """The config keys both families name alike (each family's frozen dataclass declares them as fields)."""

    upsample_initial_channel: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]


def check_stage_sizes(label: str, cfg: HiFiGANConfig) -> None:
    """One kernel per upsample rate, at least one stage."""
    if len(cfg.upsample_rates) != len(cfg.upsample_kernel_sizes) or not cfg.upsample_rates:
        raise CodecError(
            f"{label} config has {len(cfg.upsample_rates)} upsample_rates and "
            f"{len(cfg.upsample_kernel_sizes)} upsample_kernel_sizes; it needs the same, non-zero number"
        )


def check_upsample_kernels(label: str, cfg: HiFiGANConfig) -> None:
    """Each stage gives exactly ``T * rate`` samples."""
    for u, k in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True):
        if k < u or (k - u) % 2:
            raise CodecError(
                f"{label} upsample kernel {k} with rate {u}: streamdec needs kernel >= rate and "
                f"kernel - rate even, so that each stage gives exactly T*rate samples"
            )


def check_width_halving(label: str, cfg: HiFiGANConfig) -> None:
    """Each stage halves the width."""
    if cfg.upsample_initial_channel % 2 ** len(cfg.upsample_rates):
        raise CodecError(
            f"{label} upsample_initial_channel={cfg.upsample_initial_channel} must be divisible by "
            f"2^{len(cfg.upsample_rates)} (each stage halves the width)"
        )


def centred_conv(channels: int, kernel: int, dilation: int) -> PaddedConv1d:
    """The blocks' convolution, padded as the references' ``get_padding``."""
    pad = (kernel * dilation - dilation) // 2
    return PaddedConv1d(channels, channels, kernel, dilation=dilation, pad_left=pad, pad_right=pad)


class HiFiGANBlock(ResidualUnits):
    """A residual block of kind ``"1"`` or ``"2"`` (module docstring); ``act()`` makes each activation."""

    def __init__(
        self, channels: int, kernel: int, dilations: tuple[int, ...], kind: str, act: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        self.two_convs = kind == "1"
        if self.two_convs:
            self.convs1 = nn.ModuleList(centred_conv(channels, kernel, d) for d in dilations)
            self.convs2 = nn.ModuleList(centred_conv(channels, kernel, 1) for _ in dilations)
        else:
            self.convs = nn.ModuleList(centred_conv(channels, kernel, d) for d in dilations)
        # one instance per use: every layer appears once in the graph
        per_unit = 2 if self.two_convs else 1
        self.activations = nn.ModuleList(act() for _ in range(per_unit * len(dilations)))

    def units(self) -> list[list[nn.Module]]:
        """The residual branches, in order: ``[act, conv1, act, conv2]`` or ``[act, conv]``."""
        acts = list(self.activations)
        if self.two_convs:
            pairs = zip(self.convs1, self.convs2, strict=True)
            return [[acts[2 * i], c1, acts[2 * i + 1], c2] for i, (c1, c2) in enumerate(pairs)]
        return [[acts[i], c] for i, c in enumerate(self.convs)]


def upsample_stages(
    cfg: HiFiGANConfig, block: Callable[[int, int, tuple[int, ...]], nn.Module], *, nested_ups: bool = False
) -> tuple[nn.ModuleList, nn.ModuleList, int]:
    """``(ups, resblocks, final width)``: stage ``i`` halves the width with ``ups[i]`` and holds
    ``block(width, kernel, dilations)`` for each resblock kernel size. ``nested_ups`` puts each transposed
    convolution in a list of one (BigVGAN's ``ups.i.0`` keys)."""
    ch0 = cfg.upsample_initial_channel
    ups, resblocks = nn.ModuleList(), nn.ModuleList()
    for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)):
        cout = ch0 // 2 ** (i + 1)
        up = PaddedConvTranspose1d(ch0 // 2**i, cout, k, u, (k - u) // 2)
        ups.append(nn.ModuleList([up]) if nested_ups else up)
        pairs = zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)
        resblocks.extend(block(cout, rk, ds) for rk, ds in pairs)
    return ups, resblocks, ch0 // 2 ** len(cfg.upsample_rates)


def mean_of(blocks: Sequence[nn.Module], x: Tensor) -> Tensor:
    """The mean of parallel blocks on one input, summed in order as the reference generators do."""
    out: Tensor = blocks[0](x)
    for block in blocks[1:]:
        out = out + block(x)
    return out / len(blocks)


class _StageView(Protocol):
    @property
    def up(self) -> PaddedConvTranspose1d: ...
    @property
    def blocks(self) -> Sequence[ResidualUnits]: ...


class HiFiGANGenerator(ConfiguredCodec):
    """A generator with ``conv_pre``, stages of ``up`` and ``blocks`` (:meth:`_stages`) and ``conv_post``.

    ``__init__`` builds ``conv_pre`` (k7, centred), ``ups`` and ``resblocks`` (:func:`upsample_stages`) and
    keeps the last stage's width in ``final_width``; the family adds what follows the stages.
    """

    conv_post: PaddedConv1d

    def __init__(
        self,
        name: str,
        config: HiFiGANConfig,
        *,
        latent_dim: int,
        sample_rate: int,
        block: Callable[[int, int, tuple[int, ...]], nn.Module],
        nested_ups: bool = False,
    ) -> None:
        super().__init__(name, config, latent_dim=latent_dim, sample_rate=sample_rate)
        self.conv_pre = PaddedConv1d.centred(latent_dim, config.upsample_initial_channel, 7)
        self.ups, self.resblocks, self.final_width = upsample_stages(config, block, nested_ups=nested_ups)

    def _stages(self) -> Sequence[_StageView]:
        raise NotImplementedError

    def _init_activations(self, gen: torch.Generator) -> None:
        """Seeded values for the activations' parameters, drawn before any convolution's (none here)."""

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights (conv N(0, gain^2/fan_in), residual gain 0.5, biases N(0, 0.02^2)) and the
        family's activation parameters (:meth:`_init_activations`). No normalisation: the latents are decoded
        as they come."""
        gen = torch.Generator().manual_seed(seed)
        self._init_activations(gen)
        init_conv(self.conv_pre, 1.0, gen)
        for stage in self._stages():
            init_conv(stage.up, 1.0, gen)
            for block in stage.blocks:
                for unit in block.units():
                    for j, conv in enumerate(unit[1::2]):
                        init_conv(conv, 0.5 if j == len(unit) // 2 - 1 else 1.0, gen)
        init_conv(self.conv_post, 0.3, gen)
        self.global_mean.zero_()
        self.global_log_std.fill_(1.0)
        self.refresh_cache()
