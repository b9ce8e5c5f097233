"""Decoder families, their shared layers, checkpoint I/O and exact context computation.

``load_codec(name_or_path, device, dtype)`` returns a :class:`Codec`; ``save_codec(codec, path)`` writes a
safetensors file that ``load_codec`` rebuilds. ``PRESETS`` names the random-weight codecs
(``"tiny"``, ``"auk-24k"``); ``FAMILIES`` maps a family name (checkpoint metadata) to its class.
"""

from __future__ import annotations

from streamdec.codecs.auk import AuKConfig, AuKDecoder
from streamdec.codecs.base import Codec
from streamdec.codecs.checkpoint import save_codec
from streamdec.codecs.loading import load_codec
from streamdec.codecs.registry import FAMILIES, PRESETS, Preset, register_family

__all__ = [
    "FAMILIES",
    "PRESETS",
    "AuKConfig",
    "AuKDecoder",
    "Codec",
    "Preset",
    "load_codec",
    "register_family",
    "save_codec",
]
