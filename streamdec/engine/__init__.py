"""Decode engines: where planned windows become audio.

* :mod:`.base`  - the interface every engine implements (submit a window, await its emitted audio)
* :mod:`.eager` - plain PyTorch calls on a worker thread (CPU, or any device without graphs)
* :mod:`.cuda`  - CUDA graph replay with a cross-stream scheduler (codec on a CUDA device)

:func:`create_engine` picks one from the codec's device.
"""

from __future__ import annotations

from typing import Any

from ..codecs import Codec
from .base import Engine, EngineStats, WarmupReport, WindowRequest
from .eager import EagerEngine

__all__ = ["EagerEngine", "Engine", "EngineStats", "WarmupReport", "WindowRequest", "create_engine"]


def create_engine(codec: Codec, **options: Any) -> Engine:
    """The engine for ``codec``'s device: CUDA graphs on a GPU, the eager worker elsewhere.

    ``options`` go to the engine's constructor; ``eager=True`` forces the eager engine on any device.
    """
    eager = bool(options.pop("eager", False))
    if codec.pad_latent.device.type == "cuda" and not eager:
        from .cuda import CudaGraphEngine  # imported lazily: nothing CUDA-specific loads on CPU hosts

        return CudaGraphEngine(codec, **options)
    return EagerEngine(codec, **{k: v for k, v in options.items() if k in {"max_batch", "threads"}})
