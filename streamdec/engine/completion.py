"""Completion of device work: from a recorded CUDA event to results handed back on the event loop.

The device thread launches a replay, queues the copy of its output into pinned host memory and records
an event, all on the engine's stream, then hands an :class:`Inflight` to a completer and moves on. Three
completers, chosen by the engine's device and ``completion`` option (``scripts/bench_gpu.py`` measures
the GPU ones):

* :class:`ThreadCompleter` (GPU, ``"thread"``) - one thread blocks in ``event.synchronize()`` for each
  replay in launch order, turns the pinned buffer into the call's :class:`~.output.CallOutput` (one copy,
  so nothing handed out aliases an engine buffer; each window's audio is a view of it) and posts the
  results of that replay and of every later one already complete to their loops' :class:`Mailbox`.
* :class:`HostCompleter` (CPU and simulated devices) - a call made on the host is complete when it
  returns, so the device thread posts its results itself: no thread to wake per call.
* :class:`PollCompleter` (``"poll"``) - an asyncio task on the engine's loop checks ``event.query()`` for
  the oldest replay every ``interval`` seconds; no thread, but latency up to one interval and the loop
  does the cut.

Replays complete in launch order (one stream), so each looks only at the oldest one.

A :class:`Mailbox` is where an event loop's results wait: engine threads append to it, and it asks the
loop to deliver only when no delivery is pending already, so a busy loop takes the results of many
device calls in one callback and one wake-up of its self-pipe. Each result is handed to its request's
``on_done`` right there, not through a future (which would schedule one more callback per result).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .output import CallOutput, DecodedAudio

__all__ = [
    "Awaiting",
    "Completer",
    "HostCompleter",
    "Inflight",
    "Mailbox",
    "PollCompleter",
    "ThreadCompleter",
    "Waiter",
]

#: what an Inflight holds once its output was handed out: one shared empty tensor, not one per call
_NO_OUTPUT = torch.empty(0)
#: what a loop's mailbox holds: a request, and its audio or the error that ended it
Result = tuple["Awaiting", DecodedAudio | None, BaseException | None]


class Awaiting(Protocol):
    """A submitted request as completion sees it (the engine's record of it)."""

    cancelled: bool  # withdrawn: whatever comes back for it is dropped
    mailbox: Mailbox  # the loop it was submitted on

    def on_done(self, audio: DecodedAudio | None, error: BaseException | None) -> None: ...


class Mailbox:
    """One event loop's results from the engine's threads, delivered with at most one callback pending.

    ``post`` (any thread) appends and schedules a delivery unless one is scheduled and has not begun;
    the delivery clears that mark before it takes anything, so a result posted meanwhile is either taken
    by it or schedules the next one, never left behind.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._results: collections.deque[Result] = collections.deque()
        self._scheduled = False

    def post(self, results: Iterable[Result]) -> None:
        self._results.extend(results)
        if not self._scheduled:
            self._scheduled = True
            # A loop closed under us (a test tearing down) has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        results = self._results
        for _ in range(len(results)):  # what is here now; later posts schedule their own delivery
            awaiting, audio, error = results.popleft()
            if awaiting.cancelled:
                continue
            try:
                awaiting.on_done(audio, error)
            except Exception as exc:  # one failing receiver must not cost the others their results
                self.loop.call_exception_handler(
                    {"message": "exception in an engine result's callback", "exception": exc}
                )


@dataclass(eq=False)
class Waiter:
    """One request awaiting its audio: who to tell and how to cut its part out of the batch output."""

    awaiting: Awaiting
    row: int  # row of the batch output
    lo: int  # first sample of the emitted slice, relative to the copied columns
    hi: int


#: results to post, by mailbox
_Posts = dict[Mailbox, list[Result]]


@dataclass(eq=False)
class Inflight:
    """One launched device call: the output copy in ``host`` is valid once ``done`` has completed."""

    host: torch.Tensor  # [live rows, channels, samples] pinned (or plain on CPU)
    waiters: list[Waiter]
    done: torch.cuda.Event | None  # None: already complete (a call on the host)
    began: torch.cuda.Event | None = None
    on_finish: Callable[[Inflight], None] | None = None
    error: BaseException | None = None
    # ``host`` is this call's own fresh memory on the CPU (a call made on the host), not a buffer the engine
    # reuses: its parts are views of it, with no copy
    owned: bool = False
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
        """Hand every live waiter its part of the output on its own loop."""
        posts: _Posts = {}
        self.cut(posts)
        _post_all(posts)

    def cut(self, posts: _Posts) -> None:
        """Each live waiter's part of the output (views of one :class:`CallOutput`) into ``posts``."""
        live = [w for w in self.waiters if not w.awaiting.cancelled]  # withdrawn in flight: dropped
        host, self.host = self.host, _NO_OUTPUT
        if not live:
            return
        # One copy for the whole call: the engine may reuse its buffer, and a pinned one goes back to the
        # caching host allocator now; a call's own memory is only seen again as a tensor made outside
        # inference mode. Either way made outside inference mode (a device thread that decodes runs in it,
        # and the host completer runs there), so callers may write to their audio. The guard only where
        # that mode is on: a completer thread or a simulated device's thread would pay for it per call.
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                output = _call_output(host, self.owned)
        else:
            output = _call_output(host, self.owned)
        # A call's waiters almost always share one loop: its mailbox's list is looked up once per run
        # of waiters on it, not per waiter (setdefault would also build an empty list for each).
        mailbox: Mailbox | None = None
        results: list[Result] = []
        part = output.part
        for w in live:
            a = w.awaiting
            if a.mailbox is not mailbox:
                mailbox = a.mailbox
                results = posts.setdefault(mailbox, [])
            results.append((a, part(w.row, w.lo, w.hi), None))

    def fail(self, error: BaseException) -> None:
        posts: _Posts = {}
        for w in self.waiters:
            posts.setdefault(w.awaiting.mailbox, []).append((w.awaiting, None, error))
        _post_all(posts)


def _call_output(host: torch.Tensor, owned: bool) -> CallOutput:
    return CallOutput(torch.from_numpy(host.numpy()) if owned else host.clone())


class Completer:
    """Interface: ``submit`` an inflight record; ``close`` after the last one."""

    def submit(self, item: Inflight) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _complete(batch: list[Inflight]) -> None:
    """Post the batch's results with one delivery per loop; then tell the engine."""
    posts: _Posts = {}
    for item in batch:
        try:
            if item.done is not None:
                item.done.synchronize()
            item.cut(posts)
        except Exception as exc:  # a failed copy or sync must still release every waiter
            item.fail(exc)
    _post_all(posts)
    for item in batch:
        if item.on_finish is not None:
            item.on_finish(item)


class HostCompleter(Completer):
    """Completes each call on the thread that submits it (see the module docstring): host calls only."""

    def submit(self, item: Inflight) -> None:
        _complete([item])

    def close(self) -> None:
        pass


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
            _complete(batch)


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


def _post_all(posts: _Posts) -> None:
    for mailbox, results in posts.items():
        mailbox.post(results)
