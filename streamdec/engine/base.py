"""The engine interface: submit one planned window, await its emitted audio.

An engine owns the device work. The async shell (:mod:`streamdec.streaming`) hands it windows that the
sans-I/O session (:mod:`streamdec.session`) planned, already fitted to a window bucket by the exactness
rule, and awaits the emitted slice. Engines may batch windows of many streams into one decode; they never
change what a stream hears, because each window already carries its full context.

Contract of :meth:`Engine.decode_window`:

* ``request.latents`` is ``[window_frames, latent_dim]`` on the CPU, owned by the request.
* The result is ``[channels, emit_frames * hop_size]`` float32 on the CPU, a fresh tensor that aliases no
  engine buffer (the caller may keep it forever).
* Cancelling the awaiting task withdraws the window: a queued window is never decoded, an in-flight one
  is decoded and its result dropped.
* Decoding never runs on the event loop thread.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field

import torch

__all__ = ["Engine", "EngineStats", "WarmupReport", "WindowRequest"]


@dataclass(frozen=True, eq=False)
class WindowRequest:
    """One window of one stream, ready to decode."""

    stream_id: int
    latents: torch.Tensor  # [window_frames, latent_dim], CPU
    emit_offset: int  # first emitted frame, counted from the window's start
    emit_frames: int  # frames emitted from this window
    deadline: float = 0.0  # time.monotonic() at which the stream's listener runs out of audio

    @property
    def window_frames(self) -> int:
        return int(self.latents.shape[0])


@dataclass(frozen=True)
class WarmupReport:
    """What ``warmup()`` did: seconds spent, graphs made, device memory they hold."""

    seconds: float = 0.0
    graphs: int = 0
    graph_memory_bytes: int = 0
    buckets: tuple[tuple[int, int], ...] = ()  # (batch, frames) keys warmed
    failed: tuple[tuple[int, int], ...] = ()  # keys whose compile/capture failed (fell back)
    notes: tuple[str, ...] = ()


@dataclass
class EngineStats:
    """Counters an engine keeps; read them, never write them from outside."""

    windows: int = 0  # windows decoded
    decodes: int = 0  # device calls (one call may hold many windows)
    frames: int = 0  # window frames decoded (halo included)
    decode_seconds: float = 0.0  # wall time spent in device calls
    cancelled: int = 0  # windows withdrawn before they were decoded
    queued: int = 0  # windows waiting right now
    by_tier: dict[str, int] = field(default_factory=dict)  # device calls per tier (eager, graph, compiled)

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self, by_tier=dict(self.by_tier))


class Engine(abc.ABC):
    """Decodes planned windows off the event loop; see the module docstring for the contract."""

    #: name of the codec device, "cpu" or "cuda:N"
    device: torch.device

    @abc.abstractmethod
    async def start(self) -> None:
        """Start workers. Idempotent."""

    @abc.abstractmethod
    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        """Prepare every decode shape the planner will ask for (compile, capture). Explicit, may be slow."""

    @abc.abstractmethod
    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        """Decode one window and return its emitted slice ``[channels, emit_frames * hop]``."""

    def freeze(self) -> None:  # noqa: B027 - a deliberate no-op default: engines without graphs ignore it
        """After warm-up: a shape that would need a new compile or capture is an error (or a counted
        eager fallback, by engine option), never a silent stall. Engines without graphs ignore it."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop workers; windows still queued fail with :class:`~streamdec.errors.EngineClosedError`."""

    @property
    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters."""
