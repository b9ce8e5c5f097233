"""The decode tiers the benchmark compares, each an :class:`~streamdec.engine.Engine`.

* ``eager``    - plain PyTorch calls (CPU: the eager worker; CUDA: the GPU engine with graphs off, so the
  staging, copies and completion path are the same as for the graph tiers)
* ``graph``    - the GPU engine replaying plain CUDA graphs (no ``torch.compile``)
* ``compiled`` - the GPU engine replaying CUDA graphs of the ``torch.compile``-d decode
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import torch

from ..engine import DecodeEngine, Engine, WindowRequest
from ..errors import ConfigError

__all__ = ["TIERS", "decode_timed", "engine_label", "make_engine"]

TIERS = ("eager", "graph", "compiled")


def make_engine(codec: Any, tier: str, batch_buckets: Iterable[int] = (1,), max_batch: int = 64) -> Engine:
    """A fresh engine of ``tier`` for ``codec`` (graph tiers need a CUDA codec)."""
    cuda = codec.pad_latent.device.type == "cuda"
    if tier not in TIERS:
        raise ConfigError(f"unknown tier {tier!r}: pick from {TIERS}")
    if not cuda:
        if tier != "eager":
            raise ConfigError(f"tier {tier!r} needs a CUDA device; on {codec.pad_latent.device} use 'eager'")
        return DecodeEngine(codec, batch_buckets=_up_to(max_batch), graphs=False)
    return DecodeEngine(
        codec,
        batch_buckets=tuple(batch_buckets),
        graphs=tier != "eager",
        compile=tier == "compiled",
    )


def engine_label(engine: Engine) -> str:
    return type(engine).__name__


async def decode_timed(
    engine: Engine, latents: torch.Tensor, emit_offset: int, emit_frames: int
) -> tuple[float, float]:
    """Decode one window through ``engine``: ``(wall seconds, device seconds)``.

    Wall time runs from submitting the window to holding its audio on the CPU (so the device work has
    finished). Device time is what the engine counted for this call: CUDA-event time on the GPU engine,
    the worker's decode time on the eager worker. Calls must not overlap for the second figure to be this
    call's own.
    """
    before = engine.stats.decode_seconds
    began = time.perf_counter()
    await engine.decode_window(WindowRequest(0, latents, emit_offset, emit_frames))
    wall = time.perf_counter() - began
    # The GPU engine books device time right after it hands out the audio, from its completion thread.
    for _ in range(200):
        after = engine.stats.decode_seconds
        if after != before:
            break
        await asyncio.sleep(0.0005)
    return wall, max(0.0, after - before)


def _up_to(largest: int) -> tuple[int, ...]:
    """Powers of two up to ``largest``, and ``largest`` itself: the batch buckets of a CPU engine."""
    sizes = {largest}
    size = 1
    while size < largest:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))
