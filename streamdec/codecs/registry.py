"""Decoder families and named presets: ``load_codec`` dispatches here.

A family is a :class:`~streamdec.codecs.base.Codec` subclass registered under its ``family`` name;
checkpoints name their family in metadata. A preset is a family, an architecture config and a seed
for random weights (for tests, demos and benchmarks; no pretrained weights ship with streamdec).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from streamdec.codecs.auk import AUK_24K, TINY, AuKDecoder
from streamdec.codecs.base import Codec
from streamdec.codecs.bigvgan import (
    BIGVGAN_22K,
    BIGVGAN_24K,
    BIGVGAN_44K,
    BIGVGAN_44K_256X,
    BIGVGAN_TINY,
    BigVGANGenerator,
)
from streamdec.codecs.dac import DAC_16K, DAC_24K, DAC_44K, DAC_TINY, DACDecoder
from streamdec.codecs.oobleck import OOBLECK_44K, OOBLECK_TINY, OobleckDecoder
from streamdec.codecs.vits import PIPER_MEDIUM, VITS_TINY, VITSGenerator
from streamdec.errors import CodecError

__all__ = [
    "FAMILIES",
    "PRESETS",
    "Preset",
    "build_codec",
    "build_preset",
    "family_class",
    "finalize",
    "register_family",
]

FAMILIES: dict[str, type[Codec]] = {}


def register_family(cls: type[Codec]) -> type[Codec]:
    """Register a Codec subclass under ``cls.family`` (usable as a class decorator)."""
    FAMILIES[cls.family] = cls
    return cls


register_family(AuKDecoder)
register_family(DACDecoder)
register_family(OobleckDecoder)
register_family(BigVGANGenerator)
register_family(VITSGenerator)


@dataclass(frozen=True)
class Preset:
    """A named random-weight codec: family, architecture config (JSON-like) and seed."""

    family: str
    config: Mapping[str, Any]
    seed: int


PRESETS: Mapping[str, Preset] = {
    "tiny": Preset("auk", TINY.to_dict(), seed=1234),
    "auk-24k": Preset("auk", AUK_24K.to_dict(), seed=2024),
    # Model zoo: the published architectures with random weights (load real weights from their files),
    # and a `-tiny` twin of each family for CPU tests.
    "dac-tiny": Preset("dac", DAC_TINY.to_dict(), seed=11),
    "dac-44k": Preset("dac", DAC_44K.to_dict(), seed=12),
    "dac-24k": Preset("dac", DAC_24K.to_dict(), seed=13),
    "dac-16k": Preset("dac", DAC_16K.to_dict(), seed=14),
    "oobleck-tiny": Preset("oobleck", OOBLECK_TINY.to_dict(), seed=21),
    "oobleck-44k": Preset("oobleck", OOBLECK_44K.to_dict(), seed=22),
    "bigvgan-tiny": Preset("bigvgan", BIGVGAN_TINY.to_dict(), seed=31),
    "bigvgan-24k": Preset("bigvgan", BIGVGAN_24K.to_dict(), seed=32),
    "bigvgan-22k": Preset("bigvgan", BIGVGAN_22K.to_dict(), seed=33),
    "bigvgan-44k-256x": Preset("bigvgan", BIGVGAN_44K_256X.to_dict(), seed=34),
    "bigvgan-44k": Preset("bigvgan", BIGVGAN_44K.to_dict(), seed=35),
    "vits-tiny": Preset("vits", VITS_TINY.to_dict(), seed=41),
    "vits-medium": Preset("vits", PIPER_MEDIUM.to_dict(), seed=42),
}


def family_class(family: str) -> type[Codec]:
    try:
        return FAMILIES[family]
    except KeyError:
        raise CodecError(
            f"unknown codec family {family!r}; registered families: {sorted(FAMILIES)}"
        ) from None


def build_codec(family: str, name: str, config: Mapping[str, Any]) -> Codec:
    """Build the architecture on the CPU with uninitialised weights (fast: no default init runs)."""
    with torch.device("meta"):
        codec = family_class(family).from_config(name, config)
    _materialize_on_cpu(codec)
    return codec


def _materialize_on_cpu(module: torch.nn.Module) -> None:
    """``module.to_empty(device="cpu")`` at a fraction of its cost: ``to_empty`` goes through
    ``torch.empty_like`` of each meta tensor, which infers strides in Python (about a millisecond a
    tensor, a second for auk-24k); ``torch.empty`` of the shape is microseconds. Shared tensors stay
    shared."""
    made: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            made[id(t)] = torch.empty(t.shape, dtype=t.dtype)
        return made[id(t)]

    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and p.is_meta:
                m._parameters[name] = torch.nn.Parameter(empty(p), requires_grad=p.requires_grad)
        for name, b in m._buffers.items():
            if b is not None and b.is_meta:
                m._buffers[name] = empty(b)


def build_preset(name: str) -> Codec:
    preset = PRESETS[name]
    codec = build_codec(preset.family, name, preset.config)
    codec.init_random(preset.seed)
    return codec


def finalize(codec: Codec, device: str | torch.device, dtype: torch.dtype) -> Codec:
    """Move to ``device``/``dtype``, rebuild caches, switch to eval mode."""
    if not dtype.is_floating_point:
        raise CodecError(
            f"codec dtype {dtype} is not floating point; use torch.float32 (or float64/bfloat16)"
        )
    codec = codec.to(device=device, dtype=dtype)
    codec.refresh_cache()
    codec.eval()
    codec.requires_grad_(False)
    return codec
