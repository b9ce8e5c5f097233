"""The engine interface: submit one planned window, get its emitted audio back.

An engine owns the device work. The async shell (:mod:`streamdec.streaming`) hands it windows that the
sans-I/O session (:mod:`streamdec.session`) planned, already fitted to a window bucket by the exactness
rule, and awaits the emitted slice. Engines may batch windows of many streams into one decode; they never
change what a stream hears, because each window already carries its full context.

Contract of :meth:`Engine.decode_window`:

* ``request.latents`` is ``[window_frames, latent_dim]`` on the CPU, owned by the request.
* The result is ``[channels, emit_frames * hop_size]`` float32 on the CPU that aliases no engine buffer
  (the caller may keep it forever; it may be a view of its device call's output, which it then keeps).
* Cancelling the awaiting task withdraws the window: a queued window is never decoded, an in-flight one
  is decoded and its result dropped.
* Decoding never runs on the event loop thread.

Two ways to ask: ``await decode_request(request)`` (or ``decode_window``/``decode_step``), or
``submit(request, on_done)`` from the event loop, which returns at once and calls ``on_done`` on that loop
with the result (a server carrying many streams submits one call per chunk, and a coroutine and a future
per call would cost it more than the rest of the hand-off). :meth:`Engine.submit` runs ``decode_request``
by callbacks; :class:`~.core.DecodeEngine` hands requests to its device thread and results back without
either.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import torch

from ..errors import EngineError
from .output import DecodedAudio

__all__ = [
    "CallbackCall", "DeviceCall", "Engine", "EngineStats", "OnDone", "StepKind", "StepRequest", "Submission",
    "WarmupReport", "WindowRequest",
]  # fmt: skip

StepKind = Literal["prime", "step", "flush"]
#: ``on_done(audio, None)`` with a request's result, or ``on_done(None, error)``
OnDone = Callable[[DecodedAudio | None, BaseException | None], None]


class Submission(Protocol):
    """A request given to :meth:`Engine.submit`."""

    def cancel(self) -> None:
        """Withdraw it: a queued request is never decoded, one in flight is decoded and its result
        dropped; ``on_done`` is not called after this. Idempotent."""


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


@dataclass(frozen=True, eq=False)
class StepRequest:
    """One stateful call of one stream (its ``slot``): the stream's next latents, decoded once.

    ``prime`` takes a stream's first frames and returns the audio of all but its last ``right_frames``;
    ``step`` returns as many frames of audio as it takes, ``right_frames`` behind; ``flush`` (the stream's
    last frames, possibly none) returns everything that is left: its frames plus ``right_frames``.
    """

    stream_id: int
    slot: int
    kind: StepKind
    latents: torch.Tensor  # [frames, latent_dim], CPU
    deadline: float = 0.0

    @property
    def frames(self) -> int:
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

    windows: int = 0  # windows and stateful calls decoded
    decodes: int = 0  # device calls (one call may hold many windows)
    frames: int = 0  # latent frames decoded (a halo window's halo included; a stateful frame once)
    decode_seconds: float = 0.0  # time the device spent in calls (two lanes' overlap counted once)
    cancelled: int = 0  # windows withdrawn before they were decoded
    queued: int = 0  # windows waiting right now
    by_tier: dict[str, int] = field(default_factory=dict)  # device calls per tier (eager, graph, compiled)

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self, by_tier=dict(self.by_tier))


class DeviceCall(NamedTuple):
    """One device call as the engine saw it, for a benchmark's timeline (times: ``time.monotonic()``)."""

    kind: str  # "window", "prime", "step" or "flush"
    frames: int
    batch: int  # the bucket's rows
    live: int  # rows that carried work
    queued: int  # work still queued when the call was launched
    decided: float  # when the device thread chose this batch (after any hold)
    due: float  # the earliest deadline among the call's work
    launched: float  # when the device thread began the call
    finished: float  # when its results had been handed over
    device_s: float | None  # device time between its events (simulated: the model's; None on the CPU)
    estimate_s: float | None  # the replay time the scheduler planned with
    lane: int = 0  # 0: the main lane; 1: primes and flushes in a lane of their own (engine.lanes)


class Engine(abc.ABC):
    """Decodes planned windows off the event loop; see the module docstring for the contract."""

    #: name of the codec device, "cpu" or "cuda:N"
    device: torch.device

    @property
    def lanes(self) -> int:
        """Lanes of device work that may run at once (1 unless the engine keeps more)."""
        return 1

    @abc.abstractmethod
    async def start(self) -> None:
        """Start workers. Idempotent."""

    @abc.abstractmethod
    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        """Prepare every decode shape the planner will ask for (compile, capture). Explicit, may be slow."""

    @abc.abstractmethod
    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        """Decode one window and return its emitted slice ``[channels, emit_frames * hop]``."""

    #: stateful stream slots (``max_streams``), or 0 where the engine keeps no per-stream state
    max_streams: int = 0

    def open_slot(self) -> int:
        """Reserve a stateful stream slot; :class:`~streamdec.errors.TooManyStreamsError` when all are taken."""
        raise EngineError("this engine keeps no per-stream state: use mode='halo'")

    def close_slot(self, slot: int) -> None:
        """Give a slot back: its stream's queued calls are withdrawn by their callers first."""
        raise EngineError("this engine keeps no per-stream state")

    async def decode_step(self, request: StepRequest) -> torch.Tensor:
        """Decode one stateful call and return its audio ``[channels, frames * hop]`` (see StepRequest)."""
        raise EngineError("this engine keeps no per-stream state: use mode='halo'")

    async def decode_request(self, request: WindowRequest | StepRequest) -> DecodedAudio:
        """:meth:`decode_window` or :meth:`decode_step`, with the audio's checks and s16 form at hand: an
        engine that batches computes them once per device call (:mod:`.output`); this default, per request."""
        if isinstance(request, StepRequest):
            return DecodedAudio(await self.decode_step(request))
        return DecodedAudio(await self.decode_window(request))

    def submit(
        self,
        request: WindowRequest | StepRequest,
        on_done: OnDone,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Submission:
        """Queue ``request`` from the running event loop without awaiting it: ``on_done`` is called on that
        loop once, with the audio (as :meth:`decode_request` returns it) or the error, never from inside
        this call, unless the returned submission is cancelled first. A request an engine refuses at once
        (bad shape, engine closed) may raise here instead. ``loop`` is that running loop where the caller
        holds it: a caller that submits for every chunk passes it, because asking asyncio for it costs a
        system call on Python 3.11 (its check of the process id). This default runs
        :meth:`decode_request` by callbacks (:class:`CallbackCall`)."""
        if loop is None:
            loop = asyncio.get_running_loop()
        call = CallbackCall(loop, self.decode_request(request), on_done)
        call.start_soon()
        return call

    def state_memory_bytes(self) -> int:
        """Device memory of the per-stream state this engine keeps (0 where it keeps none)."""
        return 0

    async def warmup_steps(self, keys: tuple[tuple[str, int], ...]) -> WarmupReport:
        """Prepare every stateful call shape ``(kind, frames)`` at every batch bucket."""
        raise EngineError("this engine keeps no per-stream state: use mode='halo'")

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

    def recent_calls(self) -> list[DeviceCall]:
        """The latest device calls, oldest first (a bounded record; engines that keep none give [])."""
        return []


class CallbackCall:
    """One engine coroutine run without a task: stepped from the callbacks of the futures it awaits.

    A task per call would cost a wake-up and a task object per chunk; the engine's coroutine awaits
    futures (its result) and stepping it by hand is what a task's own step does. ``done(result, error)``
    is called once, unless :meth:`cancel` came first; cancelling throws ``CancelledError`` into the
    coroutine, as cancelling a task would, so the engine withdraws the work it queued.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, DecodedAudio],
        done: OnDone,
    ) -> None:
        self._loop, self._coro, self._done = loop, coro, done
        self._waiting: asyncio.Future[Any] | None = None
        self._started = False
        self._over = False

    def start_soon(self) -> None:
        """Take the coroutine's first step on the loop's next pass (so ``done`` never runs inside the
        caller's own call)."""
        self._loop.call_soon(self._step_unless_over)

    def _step_unless_over(self) -> None:
        if not self._over:
            self._started = True
            self._step()

    def _step(self, error: BaseException | None = None) -> None:
        try:
            waited = self._coro.send(None) if error is None else self._coro.throw(error)
        except StopIteration as stop:
            self._end(stop.value, None)
            return
        except Exception as exc:
            self._end(None, exc)
            return
        except asyncio.CancelledError:  # its future cancelled by someone else: the stream must still end
            self._end(None, EngineError("the engine call was cancelled outside its stream"))
            return
        if waited is None:  # a bare yield (asyncio.sleep(0)): step again on the next loop pass
            self._loop.call_soon(self._step_unless_over)
            return
        waited._asyncio_future_blocking = False  # as a task does for the future it waits on
        self._waiting = waited
        waited.add_done_callback(self._wake)

    def _wake(self, future: asyncio.Future[Any]) -> None:
        self._waiting = None
        if not self._over:
            self._step()

    def _end(self, result: Any, error: BaseException | None) -> None:
        self._over = True
        self._done(result, error)

    def cancel(self) -> None:
        if self._over:
            return
        self._over = True
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.remove_done_callback(self._wake)
            waiting.cancel()
        if self._started:
            with contextlib.suppress(
                BaseException
            ):  # CancelledError, re-raised by the coroutine, is expected
                self._coro.throw(asyncio.CancelledError())
        self._coro.close()
