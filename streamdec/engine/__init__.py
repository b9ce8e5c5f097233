"""The decode engine: where planned windows and stateful calls become audio.

* :mod:`.base`      - the interface (submit a window or a stateful call, await its audio)
* :mod:`.core`      - the engine: one scheduler, graph tiers on a GPU, the eager tier on a CPU
* :mod:`.scheduler` - pure cross-stream batch packing
* :mod:`.graphs`    - compiled and plain CUDA graphs, captured once and replayed
* :mod:`.slots`     - the device pool of per-stream layer state (stateful mode)
* :mod:`.simulated` - a simulated device for host-path measurements (stand-in audio, modelled delay)

:func:`create_engine` builds the engine for a codec.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..codecs import Codec
from ..errors import ConfigError
from .base import Engine, EngineStats, StepRequest, WarmupReport, WindowRequest
from .core import DecodeEngine
from .output import DecodedAudio

__all__ = [
    "DecodeEngine",
    "DecodedAudio",
    "Engine",
    "EngineStats",
    "StepRequest",
    "WarmupReport",
    "WindowRequest",
    "create_engine",
]


def create_engine(codec: Codec, **options: Any) -> Engine:
    """The engine for ``codec``: CUDA graphs on a GPU, the eager tier elsewhere.

    ``options`` go to :class:`DecodeEngine` (an unknown one is a ``ConfigError``); ``eager=True`` turns
    graphs off on any device.
    """
    if options.pop("eager", False):
        options["graphs"] = False
    known = set(inspect.signature(DecodeEngine).parameters) - {"codec"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown engine option(s) {unknown}: the engine takes {sorted(known)} (and eager)")
    return DecodeEngine(codec, **options)
