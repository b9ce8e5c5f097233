"""The thin async shell: ``StreamDecoder`` and its ``decode_tiles`` iterator.

Data flows one way: chunks -> :class:`~streamdec.session.StreamSession` (plans windows, decides when to
flush) -> engine (decodes off the event loop) -> tiles. The shell only moves data and reads the clock. Intake is pull-based: a chunk is read from the caller's iterable only when
the session has no due window, so a slow consumer of tiles stops chunk intake instead of growing buffers.

Example::

    async with StreamDecoder(codec, min_emit=4, max_emit=64) as dec:
        async for tile in dec.decode_tiles(chunks):
            play(tile.samples)
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import weakref
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol

import numpy as np
import torch

from .codecs import Codec
from .codecs.stateful import StatefulNet, supports_stateful
from .engine import DecodedAudio, Engine, EngineStats, StepRequest, WarmupReport, WindowRequest, create_engine
from .engine.base import Submission
from .errors import (
    ConcurrentIterationError,
    ConfigError,
    EngineClosedError,
    NonFiniteOutputError,
    ShapeError,
)
from .planning import StreamPlanner, default_window_sizes, plan_tiles
from .session import (
    FIRST_CALL_DUE_S,
    FlushPolicy,
    Job,
    SessionOptions,
    StatefulSession,
    StepJob,
    StepPolicy,
    StreamSession,
    Tile,
    all_finite,
    as_latents,
)

Mode = Literal["stateful", "halo"]
#: stateful stream slots a decoder allocates when ``max_streams`` is not given
DEFAULT_MAX_STREAMS = 64
#: the largest stateful step when ``max_emit`` is not given: more frames per call buy little once a
#: frame is decoded once, and every step size is a captured shape
DEFAULT_MAX_STEP = 16

__all__ = ["ChunkSource", "DecoderStats", "PushStream", "StreamDecoder", "TileStream"]

Chunks = AsyncIterable[Any] | Iterable[Any]
_monotonic = time.monotonic


@dataclass
class DecoderStats:
    """What a decoder has done; ``engine`` holds the engine's own counters."""

    mode: str = "halo"
    open_streams: int = 0
    streams: int = 0  # streams opened in total
    tiles: int = 0
    frames: int = 0  # frames emitted in tiles
    warm: bool = False
    engine: EngineStats = field(default_factory=EngineStats)


class StreamDecoder:
    """Decodes any number of concurrent latent streams through one engine.

    ``mode="stateful"`` (the default wherever the codec supports it, as every built-in family does) keeps
    each stream's layer state in one of ``max_streams`` device slots, so every latent frame is decoded
    once; a stream beyond the slots is refused with :class:`~streamdec.errors.TooManyStreamsError`.
    ``mode="halo"`` decodes overlapping windows that carry the decoder's context instead (any codec).
    Both give the whole-clip decode's audio.

    ``min_emit``/``max_emit`` set the emission schedule (halo: first tile, then doubling up to
    ``max_emit``; stateful: the fewest new frames worth a call, and the largest call);
    ``window_sizes`` the window lengths (default: one per emission size, ``left + emit + right``), which
    are also the shapes a GPU engine captures. ``engine`` defaults to :func:`create_engine` for the
    codec's device, built with ``engine_options``. ``listener_prebuffer`` is how long a listener buffers
    before playing (100 ms, as a browser AudioWorklet player does): it sets each stream's deadline, which
    orders the engine's work and decides when ready frames are flushed below the emission target.
    ``first_call_due`` is how long after it is submitted a stream's first call is due (80 ms): a longer
    one lets a busy engine batch the first calls of more streams that start together, at the price of
    their first audio coming later.
    """

    def __init__(
        self,
        codec: Codec,
        *,
        mode: Mode | None = None,
        max_streams: int | None = None,
        min_emit: int = 4,
        max_emit: int | None = None,
        window_sizes: Iterable[int] | None = None,
        engine: Engine | None = None,
        allow_non_finite: bool = False,
        listener_prebuffer: float = 0.1,
        first_call_due: float = FIRST_CALL_DUE_S,
        **engine_options: Any,
    ) -> None:
        self.codec = codec
        if mode is None and engine is not None and engine.max_streams == 0:
            mode = "halo"  # a ready engine without state slots serves windows
        self.mode: Mode = self._pick_mode(codec, mode)
        self.left, self.right = codec.context_frames()
        if max_emit is None:
            max_emit = max(min_emit, DEFAULT_MAX_STEP if self.mode == "stateful" else 64)
        self.min_emit, self.max_emit = min_emit, max_emit
        if window_sizes is None:
            window_sizes = default_window_sizes(self.left, self.right, min_emit, max_emit)
        # Validates the policy once, with the numbers in the message, before any stream exists.
        self.window_sizes = self._planner(min_emit, max_emit, window_sizes).window_sizes
        self.allow_non_finite = allow_non_finite
        if listener_prebuffer < 0:
            raise ConfigError(f"listener_prebuffer must be >= 0 seconds, got {listener_prebuffer}")
        self.listener_prebuffer = listener_prebuffer
        if not (math.isfinite(first_call_due) and first_call_due >= 0):
            raise ConfigError(f"first_call_due must be a finite number of seconds >= 0, got {first_call_due}")
        self.flush_policy = FlushPolicy(prebuffer_s=listener_prebuffer, first_call_s=first_call_due)
        self.policy: StepPolicy | None = None
        if self.mode == "stateful":
            if engine is None:
                engine_options["max_streams"] = DEFAULT_MAX_STREAMS if max_streams is None else max_streams
            elif max_streams is not None and max_streams != engine.max_streams:
                raise ConfigError(
                    f"max_streams={max_streams} differs from the engine's {engine.max_streams}: the engine's "
                    "slot pool is sized when it is built"
                )
            self._net = StatefulNet(codec)
            self.policy = self._policy(min_emit, max_emit)
        elif max_streams is not None:
            raise ConfigError("max_streams sizes the stateful slot pool: drop it with mode='halo'")
        if engine is None:
            engine = create_engine(codec, **engine_options)
        elif engine_options:
            raise ConfigError(
                f"engine options {sorted(engine_options)} were given with a ready engine: build the engine "
                "with them instead"
            )
        if self.mode == "stateful" and engine.max_streams < 1:
            raise ConfigError("mode='stateful' needs an engine built with max_streams >= 1")
        self.engine = engine
        # Every session pads with it: read once on the host (the engine took its own copy when it was
        # built), not computed from the codec's buffers, and copied off its device, at each stream's start.
        self._pad_latent = codec.pad_latent.detach().to("cpu", torch.float32)
        self._stats = DecoderStats(mode=self.mode)
        self._ids = itertools.count()
        self._closed = False

    @staticmethod
    def _pick_mode(codec: Codec, mode: Mode | None) -> Mode:
        if mode is None:
            return "stateful" if supports_stateful(codec) else "halo"
        if mode not in ("stateful", "halo"):
            raise ConfigError(f"unknown mode {mode!r}: pick 'stateful' or 'halo'")
        if mode == "stateful" and not supports_stateful(codec):
            raise ConfigError(
                f"codec {getattr(codec, 'name', type(codec).__name__)!r} has no streaming layout: use mode='halo'"
            )
        return mode

    def _policy(self, min_emit: int, max_emit: int) -> StepPolicy:
        return StepPolicy.default(self._net.right_frames, self._net.min_prime_frames, min_emit, max_emit)

    @property
    def max_streams(self) -> int | None:
        """How many streams may be open at once (stateful slots), or None where only memory limits it."""
        return self.engine.max_streams if self.mode == "stateful" else None

    def _planner(self, min_emit: int, max_emit: int, sizes: Iterable[int]) -> StreamPlanner:
        return StreamPlanner(self.left, self.right, min_emit=min_emit, max_emit=max_emit, window_sizes=sizes)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> StreamDecoder:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._closed:
            raise EngineClosedError("StreamDecoder is closed: create a new one")
        await self.engine.start()

    async def warmup(self) -> WarmupReport:
        """Prepare every decode shape (compile and capture on a GPU). Explicit, and may take a while."""
        if self.policy is not None:
            report = await self.engine.warmup_steps(self.policy.shapes())
        else:
            report = await self.engine.warmup(self.window_sizes)
        self._stats.warm = True
        return report

    def freeze(self) -> None:
        """No new graph captures from now on (see :meth:`Engine.freeze`); call after :meth:`warmup`."""
        self.engine.freeze()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.engine.aclose()

    @property
    def stats(self) -> DecoderStats:
        stats = DecoderStats(**{**self._stats.__dict__})
        stats.engine = self.engine.stats
        return stats

    # -- streams -----------------------------------------------------------------------------------
    def decode_tiles(
        self,
        chunks: Chunks,
        *,
        min_emit: int | None = None,
        max_emit: int | None = None,
        allow_non_finite: bool | None = None,
    ) -> TileStream:
        """Decode one stream: iterate the returned object for its tiles, in order.

        ``chunks`` is an async or plain iterable of ``[T, D]`` / ``[1, T, D]`` arrays or tensors; an async
        one may also offer ``take_ready()`` (the next chunk if it is already at hand, else None, never
        waiting), so that a stream behind real time decodes its backlog in larger calls. Bad
        chunks raise :class:`~streamdec.errors.InputError` subclasses out of the iteration. Breaking out,
        ``aclose()`` or cancelling the consuming task stops the stream's work and frees it.
        """
        if self._closed:
            raise EngineClosedError("decode_tiles() on a closed StreamDecoder")
        own_sizes = min_emit is not None or max_emit is not None
        min_emit = self.min_emit if min_emit is None else min_emit
        max_emit = self.max_emit if max_emit is None else max_emit
        session, slot = self._session(min_emit, max_emit, allow_non_finite, own_sizes)
        return TileStream(self, session, chunks, next(self._ids), slot=slot)

    def _session(
        self,
        min_emit: int,
        max_emit: int,
        allow_non_finite: bool | None,
        own_sizes: bool,
        latents_checked: bool = False,
    ) -> tuple[StreamSession | StatefulSession, int | None]:
        """A new stream's session, and its engine slot when stateful (TooManyStreamsError when every
        slot is taken: the stream is refused now)."""
        options = SessionOptions(
            latent_dim=self.codec.latent_dim,
            hop_size=self.codec.hop_size,
            pad_latent=self._pad_latent,
            allow_non_finite=self.allow_non_finite if allow_non_finite is None else allow_non_finite,
            latents_checked=latents_checked,
            flush_policy=self.flush_policy,
            sample_rate=self.codec.sample_rate,
        )
        if self.policy is not None:
            policy = self._policy(min_emit, max_emit) if own_sizes else self.policy
            return StatefulSession(policy, **options), self.engine.open_slot()
        return StreamSession(self._planner(min_emit, max_emit, self.window_sizes), **options), None

    def push_stream(
        self,
        source: ChunkSource,
        on_tile: Callable[[Tile], bool],
        on_end: Callable[[BaseException | None], None],
        *,
        allow_non_finite: bool | None = None,
        latents_checked: bool = False,
    ) -> PushStream:
        """Decode one stream without a task (see :class:`PushStream`): call its ``pump()`` whenever
        ``source`` gained a chunk or ended; tiles go to ``on_tile`` on the event loop, in order.

        ``latents_checked=True`` says the owner refused non-finite latents before putting them in
        ``source`` (a server validates every message), so the stream does not scan them again; its
        decoded audio is still checked (:class:`~streamdec.errors.NonFiniteOutputError`) unless
        ``allow_non_finite``.
        """
        if self._closed:
            raise EngineClosedError("push_stream() on a closed StreamDecoder")
        session, slot = self._session(
            self.min_emit, self.max_emit, allow_non_finite, own_sizes=False, latents_checked=latents_checked
        )
        return PushStream(self, session, source, next(self._ids), slot=slot, on_tile=on_tile, on_end=on_end)

    async def decode(self, latents: Any, *, max_in_flight: int = 8) -> torch.Tensor:
        """Decode whole clips through the engine, tiled: ``[T, D] -> [C, T*hop]``, ``[B, T, D] -> [B, C, T*hop]``.

        Memory beyond the output stays bounded for any length: at most ``max_in_flight`` windows are
        decoded at once. Audio that overflowed inside the codec raises
        :class:`~streamdec.errors.NonFiniteOutputError` unless the decoder allows non-finite values.
        """
        batched = isinstance(latents, torch.Tensor | np.ndarray) and len(latents.shape) == 3
        clips = list(latents) if batched else [latents]
        rows = [as_latents(c, self.codec.latent_dim, allow_non_finite=self.allow_non_finite) for c in clips]
        frames = {int(r.shape[0]) for r in rows}
        if len(frames) != 1:
            raise ShapeError(f"clips in one batch have different lengths {sorted(frames)}")
        (n,) = frames
        hop = self.codec.hop_size
        out = torch.empty(len(rows), self.codec.channels, n * hop)
        windows = plan_tiles(n, self.window_sizes[-1], self.left, self.right, self.window_sizes)
        limit = asyncio.Semaphore(max_in_flight)

        async def one(row: int, ws: int, wf: int, es: int, ee: int) -> None:
            async with limit:
                request = WindowRequest(-1, rows[row][ws : ws + wf].clone(), es - ws, ee - es)
                out[row, :, es * hop : ee * hop] = await self.engine.decode_window(request)

        await asyncio.gather(*(one(r, *w) for r in range(len(rows)) for w in windows))
        if not self.allow_non_finite and not all_finite(out.numpy()):
            # as a stream's tiles are checked: finite latents can still overflow inside the codec
            bad = next(r for r in range(len(rows)) if not all_finite(out[r].numpy()))
            raise _overflow_error(f"clip {bad}")
        return out if batched else out[0]


def _overflow_error(what: str) -> NonFiniteOutputError:
    """The error for decoded audio of ``what`` (its frames, its clip) that holds NaN or Inf although the
    latents were finite: they overflowed inside the codec."""
    return NonFiniteOutputError(
        f"decoded audio of {what} holds NaN or Inf although the latents were finite: they overflow inside "
        "the codec; rescale the latents to the codec's range"
    )


class _StreamCore:
    """What both ways of driving a stream share: its session, engine calls, output checks and slot."""

    def __init__(
        self,
        decoder: StreamDecoder,
        session: StreamSession | StatefulSession,
        stream_id: int,
        slot: int | None,
    ) -> None:
        self.decoder = decoder
        self.session = session
        self.stream_id = stream_id
        self.slot = slot  # the engine's state slot of a stateful stream, given back when the stream ends
        self._closed = False
        decoder._stats.open_streams += 1
        decoder._stats.streams += 1

    @property
    def first_audio_at(self) -> float | None:
        """``time.monotonic()`` of the stream's first tile, None before it."""
        return self.session.first_audio_at

    def _feed_at_hand(self, take: Callable[[], Any]) -> bool:
        """Feed the chunks ``take()`` has at hand (None: none) up to what the next call can take; True
        when ``take()`` ran out (so asking it again now is pointless)."""
        session = self.session
        while session.call_room > 0 and not session.ended:
            chunk = take()
            if chunk is None:
                return True
            session.feed(chunk)
        return False

    def _engine_call(self, job: Job | StepJob) -> Coroutine[Any, Any, DecodedAudio]:
        """The engine's coroutine that decodes ``job`` (not started)."""
        return self.decoder.engine.decode_request(self._request(job))

    def _request(self, job: Job | StepJob, now: float | None = None) -> WindowRequest | StepRequest:
        """What the engine is asked to decode for ``job``, submitted at ``now`` (default: the clock's)."""
        deadline = self.session.deadline(time.monotonic() if now is None else now)
        if isinstance(job, Job):
            window = job.window
            request: WindowRequest | StepRequest = WindowRequest(
                self.stream_id, job.latents, window.emit_offset, window.emit_frames, deadline
            )
        elif job.kind == "whole":  # a stream too short to prime: one window of its own length
            request = WindowRequest(self.stream_id, job.latents, 0, job.emit_frames, deadline)
        else:
            assert self.slot is not None
            request = StepRequest(self.stream_id, self.slot, job.kind, job.latents, deadline)
        return request

    def _tile(self, job: Job | StepJob, audio: DecodedAudio, began: float) -> Tile:
        """The checked tile of a finished call; the session learns how long the call took."""
        now = _monotonic()
        session = self.session
        session.decoded(now - began)
        if not (session.allow_non_finite or audio.all_finite()):
            self._check_output(job, audio)
        # either kind of session completes its own kind of job (the stream cut it)
        tile = session.complete(job, audio.samples, audio)  # type: ignore[arg-type]
        session.first_audio(now)
        stats = self.decoder._stats
        stats.tiles += 1
        stats.frames += tile.frames
        return tile

    def _check_output(self, job: Job | StepJob, audio: DecodedAudio) -> None:
        # Runs whether or not the latents were checked: finite latents can still overflow inside the
        # codec, and NaN audio would play as silence or noise with no word of why.
        if self.session.allow_non_finite or audio.all_finite():
            return
        start, end = (
            (job.window.emit_start, job.window.emit_end)
            if isinstance(job, Job)
            else (job.emit_start, job.emit_end)
        )
        raise _overflow_error(f"frames {start}..{end}")

    def __del__(self) -> None:
        # A stream dropped without being closed (a `break` outside `async with`) still gives back its
        # slot and count; an iterator's source is closed by the garbage collector's own finalizers.
        if not getattr(self, "_closed", True):
            self._free()

    def _free(self) -> None:
        if not self._closed:
            self._closed = True
            self.decoder._stats.open_streams -= 1
            if self.slot is not None:
                self.decoder.engine.close_slot(self.slot)


class _SourceEnd:
    """Where an async source stopped, as read ahead: its end (``error`` None) or the error it raised."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


#: a pull back within this long did not wait for its source: the chunk was made before it was asked for
_AT_HAND_S = 0.0002
#: what a read-ahead chunk whose shape says nothing counts for: the read-ahead stops after it, and feeding
#: it names what is wrong
_UNKNOWN_FRAMES = 1 << 30


def _chunk_frames(chunk: Any) -> int:
    """The frames of a chunk as a caller passes it (``[T, D]`` or ``[1, T, D]``), at least 1, so that
    empty chunks bound the read-ahead too."""
    shape = getattr(chunk, "shape", None)
    if shape is None:
        return _UNKNOWN_FRAMES
    return max(1, int(shape[-2]) if len(shape) >= 2 else 1)


async def _read_source(stream_ref: weakref.ref[TileStream], source: AsyncIterator[Any]) -> None:
    """A stream's reader: pulls ``source`` while its stream has room (:meth:`TileStream._has_room`) and
    hands each chunk, then the end or the error, to the stream in order. It holds the stream weakly
    between pulls, so a stream dropped without being closed is collected (and gives back its slot) while
    the reader waits on a source that may never yield again."""
    loop = asyncio.get_running_loop()
    while True:
        stream = stream_ref()
        if stream is None or stream._closed:
            return
        if not stream._has_room():
            room = stream._room = loop.create_future()
            del stream
            await room
            continue
        del stream
        item: tuple[Any, int] | _SourceEnd
        try:
            chunk = await source.__anext__()
        except StopAsyncIteration:
            item = _SourceEnd(None)
        except Exception as exc:  # the source's own error: raised to the consumer in order
            item = _SourceEnd(exc)
        else:
            item = (chunk, _chunk_frames(chunk))
        stream = stream_ref()
        if stream is None or stream._closed:
            return
        stream._arrived(item)
        if isinstance(item, _SourceEnd):
            return


class TileStream(_StreamCore, AsyncIterator[Tile]):
    """The async iterator ``decode_tiles`` returns; also an async context manager that always cleans up."""

    def __init__(
        self,
        decoder: StreamDecoder,
        session: StreamSession | StatefulSession,
        chunks: Chunks,
        stream_id: int,
        *,
        slot: int | None = None,
    ) -> None:
        super().__init__(decoder, session, stream_id, slot)
        self._busy = False  # an __anext__ is running: a second consumer is refused
        self._source: AsyncIterator[Any] | Iterator[Any] = (
            aiter(chunks) if isinstance(chunks, AsyncIterable) else iter(chunks)
        )
        self._is_async = isinstance(chunks, AsyncIterable)
        self._pending: asyncio.Future[Any] | None = None  # a pull from an async source still waiting
        # An async source without take_ready gets a reader once the stream falls behind it (see
        # _read_ahead): chunks that came in, then its end or its error, in order, with their frames.
        self._reads_ahead = self._is_async and getattr(self._source, "take_ready", None) is None
        self._reader: asyncio.Task[None] | None = None
        self._ahead: deque[tuple[Any, int] | _SourceEnd] = deque()
        self._ahead_frames = 0
        self._arrival: asyncio.Future[None] | None = None  # the stream waits for the reader's next item
        self._room: asyncio.Future[None] | None = None  # the reader waits for room
        self._behind = False  # a chunk was already waiting when the stream asked for it
        self._source_closed = False

    async def __aenter__(self) -> TileStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> TileStream:
        return self

    async def __anext__(self) -> Tile:
        if self._closed:
            raise StopAsyncIteration
        if self._busy:
            raise ConcurrentIterationError(
                f"stream {self.stream_id} is already being iterated by another task: one consumer per "
                "decode_tiles() stream (fan the tiles out yourself if several need them)"
            )
        self._busy = True
        try:
            job = await self._next_job()
            if job is None:
                await self.aclose()
                raise StopAsyncIteration
            began = time.monotonic()
            self._read_ahead()  # as the call goes out: it made room
            tile = self._tile(job, await self._engine_call(job), began)
        except StopAsyncIteration:
            raise
        except BaseException:
            # Bad input, engine failure or cancellation: the stream is over and its slot is freed.
            await self.aclose()
            raise
        finally:
            self._busy = False
        return tile

    async def _next_job(self) -> Job | StepJob | None:
        """Pull chunks until a window is due; None once the stream has ended and everything went out.

        A window is due when the emission schedule says so, or when the listener would otherwise run
        dry: waiting for a chunk stops at the flush time, and the ready frames go out below the target.
        """
        while True:
            self._take_ready()
            job = self.session.next_job()
            if job is not None or self.session.finished:
                return job
            try:
                chunk = await self._pull(timeout=self.session.flush_wait(time.monotonic()))
            except StopAsyncIteration:
                self.session.end()
                continue
            except TimeoutError:
                # The source kept us waiting past the flush time: send what is ready.
                job = self.session.next_job(flush=True)
                if job is not None:
                    return job
                continue
            self.session.feed(chunk)

    def _take_ready(self) -> None:
        """Feed the chunks already at hand, up to what the next call can take: those read ahead, or those
        an async source says it holds.

        Without this a stream that fell behind (a decode slower than its chunk period) pulls one chunk
        per call and every call carries one chunk's frames, so it never catches up; with it the calls grow
        to the largest size. A source may offer ``take_ready() -> chunk | None`` (never waits); any other
        async source is read ahead (:meth:`_read_ahead`).
        """
        if self._ahead:
            session = self.session
            while self._ahead and session.call_room > 0 and not session.ended:
                item = self._ahead[0]
                if isinstance(item, _SourceEnd):
                    return  # handed over by _pull when the session asks for more
                self._ahead.popleft()
                self._ahead_frames -= item[1]
                session.feed(item[0])
            return
        take = getattr(self._source, "take_ready", None)
        if take is None or self._pending is not None:  # a pull in flight gets the next chunk first
            return
        self._feed_at_hand(take)

    def _read_ahead(self) -> None:
        """Once the stream has fallen behind its source (a chunk was already waiting when it asked), let a
        reader pull the source's chunks in the background, up to what the next call can take: called as
        each call goes out, which makes room. A stream whose calls outlast its chunk period then finds its
        chunks at hand (:meth:`_take_ready`) and catches up, instead of taking one chunk per call and
        staying behind. A stream that keeps up pulls each chunk itself: the reader costs a task switch
        per chunk. Bounded by that room, so a consumer that stops asking for tiles still stops intake."""
        if not self._reads_ahead or self._closed or self.session.ended:  # ended: the source has no more
            return
        if self._reader is None:
            if not self._behind or self._pending is not None:  # one pull of the source at a time
                return
            source: AsyncIterator[Any] = self._source  # type: ignore[assignment]
            self._reader = asyncio.ensure_future(_read_source(weakref.ref(self), source))
        elif self._room is not None and self._has_room():
            room, self._room = self._room, None
            room.set_result(None)

    def _has_room(self) -> bool:
        return not self.session.ended and self._ahead_frames < self.session.call_room

    def _arrived(self, item: tuple[Any, int] | _SourceEnd) -> None:
        """The reader's next chunk, or the source's end or error."""
        self._ahead.append(item)
        if not isinstance(item, _SourceEnd):
            self._ahead_frames += item[1]
        arrival, self._arrival = self._arrival, None
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    async def _pull(self, timeout: float | None) -> Any:
        """The next chunk; StopAsyncIteration at the end; TimeoutError if ``timeout`` passes first.

        A plain iterable never times out: its chunks are always at hand, so nothing is flushed early.
        """
        if not self._is_async:
            try:
                return next(self._source)  # type: ignore[arg-type]
            except StopIteration:
                raise StopAsyncIteration from None
        if self._reader is not None:
            return await self._from_reader(timeout)
        if self._pending is None and timeout is None:  # no flush timer: no task needed
            asked = _monotonic()
            chunk = await self._source.__anext__()  # type: ignore[union-attr]
            # back without a turn of the event loop: the chunk was made before the stream asked
            self._behind = _monotonic() - asked < _AT_HAND_S
            return chunk
        if self._pending is None:
            # A task, so that a timeout leaves the pull running (cancelling it would close the source).
            self._pending = asyncio.ensure_future(self._source.__anext__())  # type: ignore[union-attr]
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            raise TimeoutError
        pending, self._pending = self._pending, None
        return pending.result()

    async def _from_reader(self, timeout: float | None) -> Any:
        """The reader's next item: a chunk, or the source's end (StopAsyncIteration) or error, raised."""
        if not self._ahead:
            self._read_ahead()  # the session took what it had: there may be room again
            arrival = self._arrival = asyncio.get_running_loop().create_future()
            if timeout is None:
                await arrival
            else:  # on a timeout only this wait ends; the reader goes on pulling
                done, _ = await asyncio.wait({arrival}, timeout=timeout)
                if not done:
                    raise TimeoutError
        item = self._ahead.popleft()
        if isinstance(item, _SourceEnd):
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        self._ahead_frames -= item[1]
        return item[0]

    async def aclose(self) -> None:
        """Stop the stream: nothing more is read or decoded, its reader and any pull still waiting are
        cancelled and an async source is closed. Also what the stream does at its own end. Idempotent."""
        self._free()
        self._ahead.clear()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        if self._is_async and not self._source_closed:
            self._source_closed = True
            close = getattr(self._source, "aclose", None)
            if close is not None:
                await close()


class ChunkSource(Protocol):
    """What a :class:`PushStream` reads its chunks from: a queue its owner fills and ends."""

    def take_ready(self) -> Any:
        """The next chunk if one is at hand, else None; never waits.

        A source may also offer ``has_input() -> bool``: True when ``take_ready`` would return a chunk or
        the producer ended, which lets a stream whose call came back skip looking when neither holds."""

    @property
    def exhausted(self) -> bool:
        """No chunk is at hand and none will come (the producer ended)."""


class PushStream(_StreamCore):
    """``decode_tiles`` turned inside out, for a server carrying many streams on one event loop: no task.

    The owner fills a :class:`ChunkSource` and calls :meth:`pump` when it put a chunk there or ended it;
    the stream then feeds the session and submits the next call to the engine at once. The engine's result
    comes back on the event loop as a callback (:meth:`Engine.submit`: no task, coroutine or future per
    call), which hands the tile to ``on_tile`` and submits the next call. So a chunk costs no wake-up of its own: the reader that received it submits its work, and the
    completion that returns the audio sends it. Timers replace the wait for a chunk: a flush is a
    ``call_later``.

    ``on_tile(tile)`` returns whether to go on; False pauses the stream (its listener is behind) until
    :meth:`resume`. ``on_end(error)`` is called once when the stream ends by itself: None when every tile
    went out, else the error that ended it (bad input, engine failure, a raising ``on_tile``). :meth:`close`
    ends it from outside (withdrawing the call in flight) and calls neither.
    """

    def __init__(
        self,
        decoder: StreamDecoder,
        session: StreamSession | StatefulSession,
        source: ChunkSource,
        stream_id: int,
        *,
        slot: int | None,
        on_tile: Callable[[Tile], bool],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        super().__init__(decoder, session, stream_id, slot)
        self.source = source
        self._on_tile, self._on_end = on_tile, on_end
        self._loop = asyncio.get_running_loop()
        self._call: Submission | None = None  # the engine call in flight (one at a time, in order)
        self._job: Job | StepJob | None = None  # what it decodes
        self._began = 0.0  # when it was submitted
        self._timer: asyncio.TimerHandle | None = None  # the flush time of the ready frames
        self._paused = False
        self._on_result = self._done  # bound once: every call is submitted with it
        # a source that can say whether it holds a chunk or ended, without handing a chunk out (optional)
        self._has_input: Callable[[], bool] | None = getattr(source, "has_input", None)

    def pump(self) -> None:
        """Feed what the source holds and submit the next call when one is due (nothing if one is in
        flight: its completion pumps again)."""
        if self._closed or self._call is not None or self._paused:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            job = self._next_job()
        except Exception as exc:  # bad input: the stream is over
            self._finish(exc)
            return
        if job is not None:
            self._submit(job)

    def resume(self) -> None:
        """The listener caught up: go on after ``on_tile`` returned False."""
        self._paused = False
        self.pump()

    def close(self) -> None:
        """Stop the stream from outside: the call in flight is withdrawn, nothing more is decoded."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        call, self._call = self._call, None
        if call is not None:
            call.cancel()  # withdrawn from the engine's queue before its slot is given back
        self._free()

    def _next_job(self) -> Job | StepJob | None:
        """The next call, or None: finished (then ended), or waiting for a chunk (then a flush timer)."""
        session = self.session
        take = self.source.take_ready
        while True:
            # the chunks at hand, up to what the next call can take (_take_ready, inline: every chunk
            # of every stream passes here); ran_out: the source has none left
            ran_out = False
            while session.call_room > 0 and not session.ended:
                chunk = take()
                if chunk is None:
                    ran_out = True
                    break
                session.feed(chunk)
            job = session.next_job()
            if job is not None:
                return job
            if session.finished:
                self._finish(None)
                return None
            chunk = None if session.ended or ran_out else self.source.take_ready()
            if chunk is not None:
                session.feed(chunk)
            elif not session.ended and self.source.exhausted:
                session.end()
            else:
                wait = session.flush_wait(_monotonic())
                if wait is not None:
                    self._timer = self._loop.call_later(wait, self._flush)
                return None

    def _take_ready(self) -> bool:
        """Feed chunks at hand up to what the next call can take (see ``TileStream._take_ready``); True
        when the source ran out."""
        return self._feed_at_hand(self.source.take_ready)

    def _flush(self) -> None:
        """The flush time came with no chunk: the ready frames go out below the emission target."""
        self._timer = None
        if self._closed or self._call is not None or self._paused:
            return
        job = self.session.next_job(flush=True)
        if job is not None:
            self._submit(job)
        else:
            self.pump()

    def _submit(self, job: Job | StepJob) -> None:
        now = _monotonic()
        self._job, self._began = job, now
        try:
            self._call = self.decoder.engine.submit(self._request(job, now), self._on_result, self._loop)
        except Exception as exc:  # refused at once (a bad request, the engine closed)
            self._job = None
            self._finish(exc)

    def _done(self, audio: DecodedAudio | None, error: BaseException | None) -> None:
        job, self._job, self._call = self._job, None, None
        if self._closed:
            return
        try:
            if error is not None:
                raise error
            assert job is not None and audio is not None
            go_on = self._on_tile(self._tile(job, audio, self._began))
        except Exception as exc:  # engine failure, bad output, or the owner's own check
            self._finish(exc)
            return
        if not go_on:
            self._paused = True
        elif self.session.awaits_input() and self._has_input is not None and not self._has_input():
            # No chunk at hand, no end, and nothing to decode or flush: the pump would only find that
            # out (the next chunk's put, or the end, pumps). Most tiles end here: their chunk came alone
            # and went whole into its call.
            return
        self.pump()

    def _finish(self, error: BaseException | None) -> None:
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._free()
        self._on_end(error)
