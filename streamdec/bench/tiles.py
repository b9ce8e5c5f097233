"""Tile sweep: per emission size and decode tier, what a window costs and what a stream costs.

For emission size ``e`` a window is ``left + e + right`` frames (the halo is ``left + right``, recomputed
for every window). Per size and tier:

* ``window_ms`` / ``device_ms``: one window through the engine, alone (wall: submit to audio on the CPU;
  device: the engine's own count), p50/p99 over ``repeats`` fresh random windows after ``warm_calls``.
* ``ttfa_ms``: one stream through :class:`~streamdec.StreamDecoder` whose first chunk holds exactly the
  ``e + right`` frames the first window needs; time from handing over that chunk to holding the first tile.
* ``stream``: the whole clip streamed through one ``StreamDecoder`` with tiles of ``e`` frames, latents all
  available (so windows run back to back): device and wall seconds, their ratio to one whole-clip decode
  through the same engine, microseconds of device time per emitted frame, and the error against the
  whole-clip decode. Where that would take longer than ``max_point_s`` it is estimated from the window
  median (``measured: false``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch

from ..codecs import Codec
from ..engine import Engine
from ..streaming import StreamDecoder
from .common import Budget, Latents, Progress
from .engines import decode_timed
from .quality import error_metrics, seam_samples
from .stats import summary

__all__ = ["SweepSettings", "sweep_tier"]


@dataclass(frozen=True)
class SweepSettings:
    sizes: tuple[int, ...]
    repeats: int
    warm_calls: int
    ttfa_repeats: int
    max_point_s: float


def _warmup_report(report: Any, seconds: float) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3),
        "engine_seconds": round(float(report.seconds), 3),
        "graphs": report.graphs,
        "graph_memory_bytes": report.graph_memory_bytes,
        "buckets": [list(b) for b in report.buckets],
        "failed": [list(b) for b in report.failed],
        "notes": list(report.notes),
    }


async def warm(engine: Engine, window_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Start and warm ``engine`` for ``window_sizes``; the seconds it took are reported, never timed."""
    began = time.perf_counter()
    await engine.start()
    report = await engine.warmup(window_sizes)
    return _warmup_report(report, time.perf_counter() - began)


async def window_latency(
    engine: Engine, latents: Latents, left: int, emit: int, right: int, settings: SweepSettings
) -> dict[str, Any]:
    walls, devices = [], []
    for i in range(settings.warm_calls + settings.repeats):
        wall, dev = await decode_timed(engine, latents(left + emit + right), left, emit)
        if i >= settings.warm_calls:
            walls.append(wall)
            devices.append(dev)
    return {"window_ms": summary(walls, 1e3), "device_ms": summary(devices, 1e3)}


def _decoder(codec: Codec, engine: Engine, emit: int) -> StreamDecoder:
    left, right = codec.context_frames()
    # One window size per emission size: every window of the stream replays the same graph.
    return StreamDecoder(
        codec, min_emit=emit, max_emit=emit, window_sizes=(left + emit + right,), engine=engine
    )


async def _handover(first: torch.Tensor, handed: list[float]) -> AsyncIterator[torch.Tensor]:
    handed.append(time.perf_counter())
    yield first


async def first_audio(decoder: StreamDecoder, latents: Latents, emit: int, repeats: int) -> dict[str, Any]:
    """TTFA from handing over the chunk that completes the first window to holding the first tile."""
    times = []
    for _ in range(repeats):
        handed: list[float] = []
        async with decoder.decode_tiles(_handover(latents(emit + decoder.right), handed)) as tiles:
            async for _tile in tiles:
                times.append(time.perf_counter() - handed[0])
                break
    return summary(times, 1e3)


async def stream_clip(
    codec: Codec,
    decoder: StreamDecoder,
    clip: torch.Tensor,
    emit: int,
    reference: torch.Tensor | None,
) -> dict[str, Any]:
    """Stream ``clip`` in chunks of ``emit`` frames (all available at once); time and check it."""
    engine = decoder.engine
    chunks = [clip[i : i + emit] for i in range(0, int(clip.shape[0]), emit)]
    before = engine.stats
    began = time.perf_counter()
    pieces = []
    async with decoder.decode_tiles(chunks) as tiles:
        async for tile in tiles:
            pieces.append(tile.samples)
    wall = time.perf_counter() - began
    await _settle(engine, before.decodes)
    after = engine.stats
    audio = torch.cat(pieces, dim=-1)
    out: dict[str, Any] = {
        "measured": True,
        "windows": after.windows - before.windows,
        "device_s": after.decode_seconds - before.decode_seconds,
        "wall_s": wall,
    }
    if reference is not None:
        seams = seam_samples(int(clip.shape[0]), emit, codec.hop_size)
        out["error"] = error_metrics(audio, reference, seams, codec.sample_rate)
    return out


async def _settle(engine: Engine, decodes_before: int) -> None:
    """Wait (briefly) until the engine has booked the device time of its last call."""
    for _ in range(200):
        stats = engine.stats
        if stats.queued == 0 and stats.decodes > decodes_before:
            await asyncio.sleep(0.002)
            return
        await asyncio.sleep(0.0005)


async def whole_clip(engine: Engine, clip: torch.Tensor, repeats: int) -> dict[str, Any]:
    """One decode of the whole clip through ``engine`` (first call untimed: it may capture a graph)."""
    frames = int(clip.shape[0])
    await decode_timed(engine, clip, 0, frames)
    walls, devices = [], []
    for _ in range(repeats):
        wall, dev = await decode_timed(engine, clip, 0, frames)
        walls.append(wall)
        devices.append(dev)
    return {"frames": frames, "window_ms": summary(walls, 1e3), "device_ms": summary(devices, 1e3)}


async def sweep_tier(
    codec: Codec,
    engine: Engine,
    tier: str,
    sizes: tuple[int, ...],
    clip: torch.Tensor,
    reference: torch.Tensor | None,
    settings: SweepSettings,
    latents: Latents,
    budget: Budget,
    progress: Progress,
) -> dict[str, Any]:
    """Every measurement of the module docstring for one (already warm) engine and the given sizes."""
    left, right = codec.context_frames()
    frames = int(clip.shape[0])
    progress.start(f"{tier}: whole clip")
    whole = await whole_clip(engine, clip, max(3, settings.repeats // 4))
    whole_device = whole["device_ms"]["p50"] / 1e3
    points = []
    for emit in sizes:
        progress.step(f"{tier}: emit {emit}")
        if not budget.allows(5.0, f"tier {tier} emit {emit}"):
            continue
        window = left + emit + right
        point: dict[str, Any] = {
            "emit_frames": emit,
            "window_frames": window,
            "halo_ratio": (left + right) / emit,  # recomputed frames per emitted frame
            "decoded_per_emitted": window / emit,
        }
        point.update(await window_latency(engine, latents, left, emit, right, settings))
        decoder = _decoder(codec, engine, emit)
        point["ttfa_ms"] = await first_audio(decoder, latents, emit, settings.ttfa_repeats)
        windows = -(-frames // emit)
        estimate = windows * point["window_ms"]["p50"] / 1e3
        if estimate <= min(settings.max_point_s, max(0.0, budget.left() - 5.0)):
            stream = await stream_clip(codec, decoder, clip, emit, reference)
        else:
            stream = {
                "measured": False,
                "windows": windows,
                "device_s": windows * point["device_ms"]["p50"] / 1e3,
                "wall_s": estimate,
                "why": f"estimated from the window median: streaming would take about {estimate:.1f} s",
            }
        stream["vs_whole"] = stream["device_s"] / whole_device if whole_device else None
        stream["us_per_emitted_frame"] = stream["device_s"] / frames * 1e6
        point["stream"] = stream
        points.append(point)
    return {"tier": tier, "whole": whole, "points": points}
