"""Completion of device work: from a recorded CUDA event to resolved asyncio futures.

The device thread launches a replay, queues the copy of its output into pinned host memory and records
an event, all on the engine's stream, then hands an :class:`Inflight` to a completer and moves on. Two
completers, chosen by the engine's ``completion`` option (``scripts/bench_gpu.py`` measures both):

* :class:`ThreadCompleter` - one thread blocks in ``event.synchronize()`` for each replay in launch order,
  turns the pinned buffer into the call's :class:`~.output.CallOutput` (one copy, so nothing handed out
  aliases an engine buffer; each window's audio is a view of it) and resolves the futures with one
  ``call_soon_threadsafe`` per event loop, for that replay and every later one already complete: a
  server's loop wakes once per batch of results.
* :class:`PollCompleter` - an asyncio task on the engine's loop checks ``event.query()`` for the oldest
  replay every ``interval`` seconds; no thread, but latency up to one interval and the loop does the cut.

Replays complete in launch order (one stream), so both look only at the oldest one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .output import CallOutput, DecodedAudio

__all__ = ["Completer", "Inflight", "PollCompleter", "ThreadCompleter", "Waiter"]

#: results to hand to each event loop: (future, value) pairs
_Deliveries = dict[asyncio.AbstractEventLoop, list[tuple["asyncio.Future[DecodedAudio]", DecodedAudio]]]


@dataclass(eq=False)
class Waiter:
    """One window awaiting its audio: where to put it and how to cut it out of the batch output."""

    future: asyncio.Future[DecodedAudio]
    loop: asyncio.AbstractEventLoop
    row: int  # row of the batch output
    lo: int  # first sample of the emitted slice, relative to the copied columns
    hi: int


@dataclass(eq=False)
class Inflight:
    """One launched device call: the output copy in ``host`` is valid once ``done`` has completed."""

    host: torch.Tensor  # [live rows, channels, samples] pinned (or plain on CPU), owned by this record
    waiters: list[Waiter]
    done: torch.cuda.Event | None  # None: already complete (CPU decode)
    began: torch.cuda.Event | None = None
    on_finish: Callable[[Inflight], None] | None = None
    error: BaseException | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def elapsed_s(self) -> float | None:
        """Device time between the two events, once both have completed."""
        if self.began is None or self.done is None:
            return None
        return float(self.began.elapsed_time(self.done)) / 1000.0

    def complete(self) -> bool:
        """Whether the output copy is valid now (never waits)."""
        return self.done is None or bool(self.done.query())  # type: ignore[no-untyped-call]

    def deliver(self) -> None:
        """Hand every live waiter its part of the output and resolve its future on its own loop."""
        by_loop: _Deliveries = {}
        self.cut(by_loop)
        _resolve_on_loops(by_loop)

    def cut(self, by_loop: _Deliveries) -> None:
        """Each live waiter's part of the output (views of one :class:`CallOutput`) into ``by_loop``, the
        results for each loop."""
        live = [w for w in self.waiters if not w.future.cancelled()]  # withdrawn in flight: decoded, dropped
        host, self.host = self.host, torch.empty(0)
        if not live:
            return
        # One copy for the whole call: the engine may reuse its buffer, and a pinned one goes back to the
        # caching host allocator now.
        output = CallOutput(host.clone())
        for w in live:
            by_loop.setdefault(w.loop, []).append((w.future, output.part(w.row, w.lo, w.hi)))

    def fail(self, error: BaseException) -> None:
        for w in self.waiters:
            _call_soon(w.loop, _fail, w.future, error)


class Completer:
    """Interface: ``submit`` an inflight record; ``close`` after the last one."""

    def submit(self, item: Inflight) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ThreadCompleter(Completer):
    """Waits on events in a dedicated thread (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Inflight | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="streamdec-complete", daemon=True)
        self._thread.start()

    def submit(self, item: Inflight) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        ahead: collections.deque[Inflight | None] = collections.deque()  # taken from the queue, in order
        while True:
            if not ahead:
                ahead.append(self._queue.get())
            with contextlib.suppress(queue.Empty):
                while True:
                    ahead.append(self._queue.get_nowait())
            # The oldest replay (waited for), then every later one that is complete already.
            batch: list[Inflight] = []
            while ahead and ahead[0] is not None and (not batch or ahead[0].complete()):
                batch.append(ahead.popleft())  # type: ignore[arg-type]
            if not batch:
                return  # closed: None came next
            self._complete(batch)

    @staticmethod
    def _complete(batch: list[Inflight]) -> None:
        """Resolve the batch's futures with one wake-up of each loop; then tell the engine."""
        by_loop: _Deliveries = {}
        for item in batch:
            try:
                if item.done is not None:
                    item.done.synchronize()
                item.cut(by_loop)
            except Exception as exc:  # a failed copy or sync must still release every waiter
                item.fail(exc)
        _resolve_on_loops(by_loop)
        for item in batch:
            if item.on_finish is not None:
                item.on_finish(item)


class PollCompleter(Completer):
    """Polls ``event.query()`` from a task on ``loop`` (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = 1e-4) -> None:
        self.loop = loop
        self.interval = interval
        self._pending: collections.deque[Inflight] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._task = self.loop.create_task(self._run())

    def submit(self, item: Inflight) -> None:
        # deque.append is atomic; the loop learns of it through a thread-safe wake-up.
        self._pending.append(item)
        _call_soon(self.loop, self._wake.set)

    def close(self) -> None:
        self._closed = True
        _call_soon(self.loop, self._wake.set)

    async def wait_closed(self) -> None:
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._wake.clear()
                if not self._pending:
                    await self._wake.wait()
                continue
            item = self._pending[0]
            if item.done is not None and not item.done.query():  # type: ignore[no-untyped-call]
                await asyncio.sleep(self.interval)
                continue
            self._pending.popleft()
            try:
                item.deliver()
            except Exception as exc:
                item.fail(exc)
            finally:
                if item.on_finish is not None:
                    item.on_finish(item)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    # A loop closed under us (a test tearing down) has nobody left to tell.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _resolve_on_loops(by_loop: _Deliveries) -> None:
    for loop, pairs in by_loop.items():
        _call_soon(loop, _resolve_all, pairs)


def _resolve_all(pairs: list[tuple[asyncio.Future[DecodedAudio], DecodedAudio]]) -> None:
    for future, value in pairs:
        if not future.done():
            future.set_result(value)


def _fail(future: asyncio.Future[DecodedAudio], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
