"""A measurement tool, not a decoder: an engine that models a device's delay and returns stand-in audio.

``SimulatedEngine`` lets the host path (websocket server, protocol, ``StreamDecoder``, event loop) be
measured on any machine, a 2-core CPU included, without the codec's cost hiding it. It honours the
:class:`~streamdec.engine.base.Engine` contract exactly (off-loop work, batching of whatever is queued,
cancellation, a fresh ``[channels, emit_frames * hop]`` float32 tensor per window), but its "decode" is:

* a delay from :class:`SimulatedCost`: ``fixed_ms`` per device call plus ``per_frame_ms`` per window
  frame of every row in the call (``0,0`` measures the host path alone);
* audio that is a cheap pure function of each *emitted* frame's latents (:func:`stand_in_audio`): frame
  ``f`` becomes ``hop`` samples of one sine period scaled by ``0.2 + 0.3 * tanh(latents[f, 0])``. So a
  stream's audio depends on its latents only, never on how they were chunked or windowed, and the
  streamed audio of any stream equals :meth:`StreamDecoder.decode` of the same latents, bit for bit: a
  load test can check routing, order and completeness of every sample.

Never use it to produce audio anyone listens to. Select it with
``StreamDecoder(codec, engine=SimulatedEngine(codec, cost=SimulatedCost(2.0, 0.01)))`` or
``streamdec serve --engine simulated --simulated-cost-ms 2,0.01``; the codec only supplies geometry
(hop size, channels, latent width) and is never called.

The logic is in small pure functions (:func:`call_seconds`, :func:`stand_in_audio`, :func:`plan_calls`)
so that it can become a tier of a general engine unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..codecs import Codec
from ..errors import ConfigError, EngineClosedError
from .base import Engine, EngineStats, WarmupReport, WindowRequest

__all__ = ["SimulatedCost", "SimulatedEngine", "call_seconds", "plan_calls", "stand_in_audio"]


@dataclass(frozen=True)
class SimulatedCost:
    """The modelled device time of one call: ``fixed_ms + per_frame_ms * (sum of window frames)``."""

    fixed_ms: float = 0.0
    per_frame_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "per_frame_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"simulated cost {name}={value!r} must be a finite number >= 0 ms")

    @classmethod
    def parse(cls, text: str) -> SimulatedCost:
        """``"FIXED,PER_FRAME"`` in milliseconds, e.g. ``"2,0.01"``; a single number is the fixed part."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if not 1 <= len(values) <= 2:
            raise ConfigError(
                f"simulated cost {text!r}: expected 'FIXED,PER_FRAME' in ms (e.g. '2,0.01') or 'FIXED'"
            )
        return cls(values[0], values[1] if len(values) == 2 else 0.0)

    def __str__(self) -> str:
        return f"{self.fixed_ms:g},{self.per_frame_ms:g}"


def call_seconds(cost: SimulatedCost, window_frames: Sequence[int]) -> float:
    """Modelled seconds of one device call decoding windows of these lengths as one batch."""
    return (cost.fixed_ms + cost.per_frame_ms * sum(window_frames)) / 1000.0


def plan_calls(requests: Sequence[WindowRequest], max_batch: int) -> list[list[int]]:
    """Indices of ``requests`` grouped into device calls: most urgent first, at most ``max_batch`` each.

    A device batches rows of one shape; the simulated one has no shapes, so any windows share a call.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].deadline)
    return [order[i : i + max_batch] for i in range(0, len(order), max_batch)]


def sine_period(hop: int) -> torch.Tensor:
    """``[hop]`` float32: one period of a sine, the shape every stand-in frame repeats."""
    return torch.sin(torch.arange(hop, dtype=torch.float64) * (2 * math.pi / hop)).float()


def stand_in_audio(request: WindowRequest, period: torch.Tensor, channels: int) -> torch.Tensor:
    """``[channels, emit_frames * hop]`` float32 for the emitted frames of ``request`` (see module doc)."""
    lo = request.emit_offset
    first = request.latents[lo : lo + request.emit_frames, 0].float()
    gain = 0.2 + 0.3 * torch.tanh(first)  # [emit_frames]: never silent, bounded well inside [-1, 1]
    mono = (gain[:, None] * period[None, :]).reshape(1, -1)  # [1, emit_frames * hop], a fresh tensor
    return mono.expand(channels, -1).clone() if channels > 1 else mono


@dataclass(eq=False)
class _Pending:
    request: WindowRequest
    future: asyncio.Future[torch.Tensor]
    loop: asyncio.AbstractEventLoop


_STOP = object()


class SimulatedEngine(Engine):
    """A modelled device on a worker thread; see the module docstring. A measurement tool only."""

    def __init__(
        self,
        codec: Codec,
        *,
        cost: SimulatedCost | None = None,
        max_batch: int = 256,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        self.cost = cost or SimulatedCost()
        self.max_batch = max_batch
        self.device = torch.device("cpu")
        self.hop_size = codec.hop_size
        self.channels = codec.channels
        self._period = sine_period(codec.hop_size)
        self._sleep = sleep
        self._queue: queue.SimpleQueue[_Pending | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stats = EngineStats()
        self._lock = threading.Lock()  # guards _stats between the worker and readers

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed: create a new one")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="streamdec-simulated", daemon=True)
            self._thread.start()

    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        await self.start()
        return WarmupReport(
            buckets=tuple((1, f) for f in window_sizes),
            notes=(f"simulated engine (a measurement tool): cost {self.cost} ms per call, per frame",),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._thread.join)
        self._fail_queued()

    # -- requests ----------------------------------------------------------------------------------
    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        if self._closed:
            raise EngineClosedError("decode_window() after aclose(): the engine is closed")
        if self._thread is None:
            await self.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[torch.Tensor] = loop.create_future()
        with self._lock:
            self._stats.queued += 1
        self._queue.put(_Pending(request, future, loop))
        return await future  # cancelling the caller cancels `future`; the worker then skips the window

    @property
    def stats(self) -> EngineStats:
        with self._lock:
            return self._stats.snapshot()

    # -- worker ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            while True:  # drain: everything queued now shares this round, as on a device
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._queue.put(_STOP)
                    break
                batch.append(item)
            self._round([p for p in batch if isinstance(p, _Pending)])

    def _round(self, pending: list[_Pending]) -> None:
        live = [p for p in pending if not p.future.cancelled()]
        with self._lock:
            self._stats.queued -= len(pending)
            self._stats.cancelled += len(pending) - len(live)
        for call in plan_calls([p.request for p in live], self.max_batch):
            self._call([live[i] for i in call])

    def _call(self, group: list[_Pending]) -> None:
        began = time.perf_counter()
        frames = [p.request.window_frames for p in group]
        delay = call_seconds(self.cost, frames)
        if delay > 0:
            self._sleep(delay)
        results = [(p, stand_in_audio(p.request, self._period, self.channels)) for p in group]
        with self._lock:
            self._stats.decodes += 1
            self._stats.windows += len(group)
            self._stats.frames += sum(frames)
            self._stats.decode_seconds += time.perf_counter() - began
            self._stats.by_tier["simulated"] = self._stats.by_tier.get("simulated", 0) + 1
        _deliver(results)

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Pending):
                error = EngineClosedError("engine closed before this window was decoded")
                item.loop.call_soon_threadsafe(_set_exception, item.future, error)


def _deliver(results: list[tuple[_Pending, torch.Tensor]]) -> None:
    """Resolve a call's futures with one wake-up per event loop, not one per window.

    Each ``call_soon_threadsafe`` writes to the loop's self-pipe; at hundreds of windows per call that
    is hundreds of syscalls and wake-ups where one does.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[torch.Tensor], torch.Tensor]]] = {}
    for p, audio in results:
        by_loop.setdefault(p.loop, []).append((p.future, audio))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop closed meanwhile: nobody awaits these
            loop.call_soon_threadsafe(_set_results, items)


def _set_results(items: list[tuple[asyncio.Future[torch.Tensor], torch.Tensor]]) -> None:
    for future, value in items:
        if not future.done():
            future.set_result(value)


def _set_exception(future: asyncio.Future[torch.Tensor], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
