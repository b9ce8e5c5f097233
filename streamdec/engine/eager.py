"""The eager engine: one worker thread decodes windows with plain PyTorch calls (CPU, or any device).

The event loop never decodes, and it keeps a core: PyTorch's intra-op (OpenMP) pool is process-wide, and
when its threads fill every core, each wake-up of the event loop preempts one of them while the others
spin at the next barrier. On a 2-core machine that made a 60 ms window take 0.3 to 12 s. So while the
engine runs, intra-op threads are capped at ``threads`` (default: cores - 1), and restored on close.

The event loop never decodes. ``decode_window`` puts the request on a queue and awaits an asyncio future
that the worker resolves through ``loop.call_soon_threadsafe``. The worker drains whatever is queued,
groups windows of the same length, most urgent first, and decodes each group as one batch (up to
``max_batch`` rows): many streams share one decoder call, which is where CPU throughput comes from.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..codecs import Codec
from ..errors import ConfigError, EngineClosedError, EngineError
from .base import Engine, EngineStats, WarmupReport, WindowRequest

__all__ = ["EagerEngine"]


@dataclass(eq=False)
class _Pending:
    request: WindowRequest
    future: asyncio.Future[torch.Tensor]
    loop: asyncio.AbstractEventLoop


_STOP = object()


class EagerEngine(Engine):
    """Decodes windows on a dedicated worker thread; see the module docstring."""

    def __init__(self, codec: Codec, *, max_batch: int = 8, threads: int | None = None) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 1) - 1)
        self._saved_threads: int | None = None
        self.codec = codec
        self.device = codec.pad_latent.device
        self.max_batch = max_batch
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
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(min(self._saved_threads, self.threads))
            self._thread = threading.Thread(target=self._run, name="streamdec-eager", daemon=True)
            self._thread.start()

    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        """Decode one random window per size, so first requests do not pay allocator/first-call costs."""
        await self.start()
        began = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        for frames in window_sizes:
            latents = torch.randn(frames, self.codec.latent_dim, generator=generator)
            await self.decode_window(WindowRequest(-1, latents, 0, frames))
        return WarmupReport(
            seconds=time.perf_counter() - began,
            buckets=tuple((1, f) for f in window_sizes),
            notes=("eager engine: nothing to compile or capture",),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._thread.join)
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
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
        # Cancelling the caller cancels `future`; the worker sees it and skips the window.
        return await future

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
            while True:  # drain: everything queued now is a candidate for this round
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._queue.put(_STOP)
                    break
                batch.append(item)
            self._decode_round([p for p in batch if isinstance(p, _Pending)])

    def _decode_round(self, pending: list[_Pending]) -> None:
        live = [p for p in pending if not p.future.cancelled()]
        with self._lock:
            self._stats.queued -= len(pending)
            self._stats.cancelled += len(pending) - len(live)
        groups: dict[int, list[_Pending]] = defaultdict(list)
        for p in sorted(live, key=lambda p: p.request.deadline):
            groups[p.request.window_frames].append(p)
        for group in groups.values():
            for i in range(0, len(group), self.max_batch):
                self._decode_group(group[i : i + self.max_batch])

    def _decode_group(self, group: list[_Pending]) -> None:
        hop = self.codec.hop_size
        began = time.perf_counter()
        try:
            latents = torch.stack([p.request.latents for p in group]).to(self.device)
            audio = self.codec.decode(latents)  # [B, C, W * hop], float32
            outputs = []
            for row, p in enumerate(group):
                lo = p.request.emit_offset * hop
                hi = lo + p.request.emit_frames * hop
                outputs.append(audio[row, :, lo:hi].to("cpu", copy=True))
        except Exception as exc:  # delivered to every awaiting stream, typed
            error = EngineError(f"decode of {len(group)} window(s) failed: {exc}")
            error.__cause__ = exc
            for p in group:
                p.loop.call_soon_threadsafe(_set_exception, p.future, error)
            return
        with self._lock:
            self._stats.decodes += 1
            self._stats.windows += len(group)
            self._stats.frames += int(latents.shape[0] * latents.shape[1])
            self._stats.decode_seconds += time.perf_counter() - began
            self._stats.by_tier["eager"] = self._stats.by_tier.get("eager", 0) + 1
        for p, out in zip(group, outputs, strict=True):
            p.loop.call_soon_threadsafe(_set_result, p.future, out)

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Pending):
                error = EngineClosedError("engine closed before this window was decoded")
                item.loop.call_soon_threadsafe(_set_exception, item.future, error)


def _set_result(future: asyncio.Future[torch.Tensor], value: torch.Tensor) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[torch.Tensor], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
