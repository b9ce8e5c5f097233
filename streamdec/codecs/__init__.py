"""Decoder families, their shared layers, checkpoint I/O and exact context computation.

``load_codec(name_or_path, device, dtype)`` returns a :class:`Codec`; ``save_codec(codec, path)`` writes a
safetensors file that ``load_codec`` rebuilds. ``PRESETS`` names the random-weight codecs
(``"tiny"``, ``"auk-24k"``, and the zoo's ``dac-*``, ``oobleck-*``, ``bigvgan-*``); ``FAMILIES`` maps a
family name (checkpoint metadata) to its class. ``load_codec`` also reads DAC ``.pth``, Stable Audio Open
``model.safetensors`` and BigVGAN generator files (:mod:`streamdec.codecs.formats`); :class:`ModuleCodec`
wraps any other decoder module (:mod:`streamdec.codecs.adapter`).
"""

from __future__ import annotations

from streamdec.codecs.adapter import ModuleCodec, measure_context
from streamdec.codecs.auk import AuKConfig, AuKDecoder
from streamdec.codecs.base import Codec
from streamdec.codecs.bigvgan import BigVGANConfig, BigVGANGenerator
from streamdec.codecs.checkpoint import save_codec
from streamdec.codecs.dac import DACConfig, DACDecoder
from streamdec.codecs.loading import load_codec
from streamdec.codecs.oobleck import OobleckConfig, OobleckDecoder
from streamdec.codecs.registry import FAMILIES, PRESETS, Preset, register_family

__all__ = [
    "FAMILIES",
    "PRESETS",
    "AuKConfig",
    "AuKDecoder",
    "BigVGANConfig",
    "BigVGANGenerator",
    "Codec",
    "DACConfig",
    "DACDecoder",
    "ModuleCodec",
    "OobleckConfig",
    "OobleckDecoder",
    "Preset",
    "load_codec",
    "measure_context",
    "register_family",
    "save_codec",
]
