"""One client connection: a reader, a writer and a watchdog in one task group; streams have no task.

::

    socket --reader--> ServerState (validate) --stream intake--> PushStream.pump: engine call --+
       ^                                                                                       |
       +-- written at once, or --writer-- outbox <-- audio (engine completion) / control ------+

A stream is driven by callbacks on the event loop (:class:`~streamdec.streaming.PushStream`): the reader
that received a latent message feeds it and submits the engine call at once; the engine's completion
hands the audio back, and it is written to the socket straight away when nothing waits before it. A
chunk thus costs one wake-up for its message and one for its result, not a task's wake-ups besides.

The reader never waits for a stream: it reads every frame as it arrives, so ping/pong (answered by the
websocket layer while someone reads), ``cancel`` and ``end`` are seen at once even when a stream is far
behind. A producer faster than decoding is held back by ``max_buffered_frames`` (advertised in
``ready``): frames wait in the stream's intake until the decoder takes them, the reference client sends
no further ahead than that, and a message past it ends that stream with ``backlog_full``. A connection
that :class:`~.app.StreamServer` accepts is a :class:`~.direct.DirectMessages`: whole messages come to
the connection from inside ``data_received``, without websockets' frame parser or a wake-up of the reader,
which takes the rest (those that came before, fragmented ones).

Backpressure towards the listener: a listener that stops reading blocks the writer in ``send``; the
outbox fills; a stream whose audio finds the outbox full is paused with that message parked until the
writer makes room, so it submits no further calls and takes no further latents. A send that makes
no progress for ``send_timeout`` ends the connection with 1013. Control messages (``started``, ``error``,
``done``) never wait for room in the outbox, so the reader is never blocked by a slow listener either;
there are at most ``max_streams`` of them plus the error budget.

A text stream (a ``start`` carrying ``text``, on a server with a voice) has a speaker task instead of a
client: it feeds the voice's latents into the stream's intake (:func:`.speech.speak`), where they wait
for the decoder exactly as a client's would, bounded by ``max_buffered_frames``. An ``opus`` stream
encodes each tile in a worker thread, its stream paused meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import anyio
import torch
from anyio.abc import TaskGroup
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from streamdec.errors import ProtocolError
from streamdec.protocol import (
    CLOSE_CODES,
    OPUS_FORMAT,
    STREAM_ENDING_CODES,
    Cancel,
    ErrorCode,
    ErrorMessage,
    ServerControl,
    ServerState,
    Start,
    encode_text,
    error_code_for,
)
from streamdec.session import Tile
from streamdec.streaming import PushStream

from .direct import DirectMessages, binary_frame_header
from .guards import ErrorBudget
from .opus import OpusEncoder, check_opus
from .speech import speak

if TYPE_CHECKING:
    from .app import StreamServer

__all__ = ["Connection"]

log = logging.getLogger("streamdec.server")

Status = Literal["completed", "cancelled", "error"]
_monotonic = time.monotonic
#: the largest header websockets puts before a server's (unmasked) binary frame
_FRAME_HEADER_MAX = 10


class _Backlog:
    """How long the writer may still wait for a listener whose socket stopped taking bytes.

    The clock starts when the kernel first refuses bytes (the transport's buffer is not empty) and restarts
    whenever that buffer shrank since the last send; it does not start when a send begins waiting: ``send``
    returns while its message fits under ``write_limit``, so a per-send clock would start only once that
    buffer had filled too, seconds of audio after the listener stopped reading.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None  # when the current backlog began or last drained a little
        self.after_send = 0  # bytes buffered right after the previous send

    def seconds_left(self, buffered: int, now: float) -> float:
        if buffered == 0:
            self.since = None  # the listener's socket took everything written so far
        elif self.since is None or buffered < self.after_send:
            self.since = now
        return self.timeout if self.since is None else max(self.since + self.timeout - now, 0.0)

    def sent(self, buffered: int) -> None:
        self.after_send = buffered


class _CloseWith(Exception):
    """Ends the connection: send an ``error`` with ``code`` (stream null), then its close code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _GoingAway:
    """Outbox sentinel: everything before it was sent; close with 1001 now."""


class _Outbox:
    """The connection's outgoing queue, sent in order by the writer task. Control messages always go in;
    audio only while fewer than ``limit`` items wait (the connection parks the rest, pausing its stream)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[Any] = deque()  # read, never changed, from outside
        self._changed: anyio.Event | None = None  # made only while someone waits: most puts wake nobody
        self.closed = False

    def __len__(self) -> int:
        return len(self.items)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def put(self, item: Any) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self.items.append(item)
        self._notify()

    async def get(self) -> Any:
        while not self.items:
            await self._wait()
        item = self.items.popleft()
        self._notify()
        return item

    def close(self) -> None:
        self.closed = True
        self._notify()


class _Intake:
    """A stream's latents between the reader and its :class:`PushStream`; tells ServerState what was taken.

    For a client's latents, unbounded as a queue because ServerState bounds it in frames
    (``max_buffered_frames``): the reader must never wait here. For a voice's (``capacity`` chunks), the
    speaker waits in :meth:`feed` for room.

    A deque and a callback, not a memory object stream: putting a chunk calls ``listener`` (the stream's
    ``pump``), which feeds the session and submits the engine call at once when one is due. It runs for
    every latent message.
    """

    def __init__(self, state: ServerState, stream: int, capacity: float = math.inf) -> None:
        self._chunks: deque[Any] = deque()
        self._capacity = capacity
        self._ended = False  # no more input: the decoder takes what is here, then the stream ends
        self._closed = False  # gone: nothing more is taken or handed out
        self.listener: Callable[[], None] | None = None  # told of every chunk put and of the end
        self._feeder: asyncio.Future[None] | None = None  # the voice, waiting for room
        self._state, self._stream = state, stream

    def put(self, latents: Any) -> None:
        if self._ended or self._closed:
            return  # a stream that ended meanwhile: its done tells the client
        self._chunks.append(latents)
        if self.listener is not None:
            self.listener()

    async def feed(self, latents: torch.Tensor) -> None:
        """The server's own producer (a voice): waits for room; raises once the stream has ended."""
        while len(self._chunks) >= self._capacity and not (self._ended or self._closed):
            self._feeder = asyncio.get_running_loop().create_future()
            await self._feeder
        if self._closed:
            raise anyio.BrokenResourceError
        if self._ended:
            raise anyio.ClosedResourceError
        self.put(latents)
        self._state.produced(self._stream, int(latents.shape[0]))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        _wake(self._feeder)
        if self.listener is not None:
            self.listener()

    def close(self) -> None:
        self._ended = self._closed = True
        self._chunks.clear()
        self.listener = None
        _wake(self._feeder)

    @property
    def exhausted(self) -> bool:
        """Nothing at hand and nothing more will come."""
        return self._ended and not self._chunks

    def has_input(self) -> bool:
        """Whether the stream has something to take note of: a chunk :meth:`take_ready` would hand out, or
        the end (see ``ChunkSource.take_ready``)."""
        return self._ended or bool(self._chunks)

    def take_ready(self) -> Any:
        """A chunk already received, or None (none at hand, or the stream ended); never waits."""
        if not self._chunks:
            return None
        latents = self._chunks.popleft()
        if self._feeder is not None:
            _wake(self._feeder)
        self._state.consumed(self._stream, len(latents))  # frames: a tensor's len is its shape[0] too
        return latents


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


@dataclass(eq=False)
class _Stream:
    """One wire stream: its intake, its decoding and what waits on its behalf."""

    id: int
    intake: _Intake
    text: str | None = None  # a text stream: the server's voice makes its latents
    decoder: PushStream | None = None
    speaker: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # the voice's task, if any
    encoding: anyio.CancelScope | None = None  # the opus encoder's work under way, if any
    parked: bytes | None = None  # audio that found the outbox full: the stream waits for room
    first_latent_at: float | None = None
    audio_sent: bool = False
    reported: bool = False  # its done was queued (else, at teardown, it counts as lost)
    opus: OpusEncoder | None = None  # format "opus": this stream's encoder


class Connection:
    """One client: reader, writer, watchdog and stream tasks around a sans-I/O :class:`ServerState`."""

    def __init__(self, server: StreamServer, ws: DirectMessages | ServerConnection) -> None:
        self.server = server
        self.ws = ws
        # A connection StreamServer accepted hands whole messages over as websockets parses them; a
        # plain ServerConnection has only the reader.
        self._direct = ws if isinstance(ws, DirectMessages) else None
        self.config = server.config
        self.state = ServerState(
            server.codec,
            server.limits,
            accepting_streams=not server.shutting_down,
            voice=server.voice_name,
            opus=server.opus,
        )
        self.streams: dict[int, _Stream] = {}
        self.outbox = _Outbox(self.config.outbox)
        self.budget = ErrorBudget(self.config.error_budget, self.config.error_refill)
        self.last_activity = time.monotonic()
        self._tg: TaskGroup | None = None
        self._fatal: _CloseWith | None = None  # set when the connection must close with an error
        self._sending = False  # a send is under way (the writer's or a stream's): others queue behind it
        self._parked: deque[_Stream] = deque()  # streams whose audio waits for room in the outbox
        self._backlog = _Backlog(self.config.send_timeout)
        # read for every message: bound once
        self._metrics = server.metrics
        self._write_limit = self.config.write_limit
        self._hop = server.codec.hop_size

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._guarded, self._writer)
            tg.start_soon(self._guarded, self._watchdog)
            self.outbox.put(self.state.ready())
            await self._guarded(self._reader)
            tg.cancel_scope.cancel()  # the socket closed or failed: drop every stream
        self.outbox.close()
        for stream in list(self.streams.values()):  # the connection went first: never reported
            self._release(stream)
            self._lost(stream)
        if self._fatal is not None:
            await self._close_with(self._fatal.code, str(self._fatal))

    async def _guarded(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a connection task; any way it fails ends the connection (and frees every stream)."""
        try:
            await task()
        except Exception as exc:
            self._end_by(exc)
            return
        self._end_by(None)

    def _end_by(self, exc: Exception | None) -> None:
        """End the connection: ``exc`` (if any) is what failed in one of its tasks or in a message."""
        if isinstance(exc, _CloseWith):
            self._fatal = self._fatal or exc
        elif exc is not None and not isinstance(exc, ConnectionClosed):  # closed: the peer went away
            log.error("connection handler failed", exc_info=exc)
            self._fatal = self._fatal or _CloseWith(ErrorCode.INTERNAL, "internal server error")
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    async def _close_with(self, code: ErrorCode, message: str) -> None:
        """Send a connection-level error and its close code, even to a listener that stopped reading.

        The error and the close frame queue behind the audio the listener has not read yet; if it never
        reads them within ``close_timeout``, the TCP connection is aborted.
        """
        self.server.metrics.errors[code.value] += 1
        text = encode_text(ErrorMessage(code, message))
        with anyio.move_on_after(self.config.close_timeout):
            async with anyio.create_task_group() as tg:
                # Started in this order, each writes its frame before its first wait, so error precedes close.
                tg.start_soon(self._send_quietly, text)
                tg.start_soon(self.ws.close, CLOSE_CODES[code], message[:120])
                tg.start_soon(self._discard_incoming)  # the peer's close reply must not wait behind latents
        if self.ws.state is not State.CLOSED:
            self.ws.transport.abort()

    async def _discard_incoming(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for _ in self.ws:
                pass

    async def _send_quietly(self, message: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(message)

    async def drain(self) -> None:
        """Shutdown, first part: take no new streams and wait until the open ones are done."""
        self.state.accepting_streams = False
        while self.streams:
            await anyio.sleep(0.01)  # shutdown only; polling keeps the stream bookkeeping free of events

    def cut_streams(self, why: str) -> None:
        """Shutdown at grace end: every stream still running ends with ``shutting_down`` and ``done``."""
        for stream in list(self.streams.values()):
            self._report(stream, "error", ProtocolError(ErrorCode.SHUTTING_DOWN.value, why, stream=stream.id))

    async def close_going_away(self) -> None:
        """Shutdown, last part: once every stream reported, flush the outbox, then close with 1001."""
        while self.streams:
            await anyio.sleep(0.01)
        with contextlib.suppress(anyio.ClosedResourceError):
            self.outbox.put(_GoingAway())
        await self.ws.wait_closed()

    # -- outbound ----------------------------------------------------------------------------------
    def _control(self, msg: ServerControl | bytes) -> None:
        with contextlib.suppress(anyio.ClosedResourceError):  # the connection is ending anyway
            self.outbox.put(msg)

    async def _writer(self) -> None:
        """Sends the outbox in order; a backlog that made no progress for ``send_timeout`` means overloaded."""
        timeout = self.config.send_timeout
        while True:
            item = await self.outbox.get()
            self._sending = True  # from the moment it left the outbox: nothing may overtake it
            self._admit_parked()
            if isinstance(item, _GoingAway):
                await self.ws.close(1001, "server shutting down")
                return
            data = item if isinstance(item, bytes) else encode_text(item)
            left = self._backlog.seconds_left(self.ws.transport.get_write_buffer_size(), time.monotonic())
            if self._fits(len(data)):
                await self.ws.send(data)  # returns without waiting: the transport stays below its limit
                self._sent(data)
                continue
            with anyio.move_on_after(left) as scope:
                await self.ws.send(data)
            if scope.cancelled_caught:
                raise _CloseWith(
                    ErrorCode.OVERLOADED, f"listener too slow: nothing was read for {timeout:g} s"
                )
            self._sent(data)

    def _fits(self, size: int) -> bool:
        """True when a message of ``size`` bytes cannot make ``send`` wait: the transport's buffer stays
        within the write limit, so it is never paused (``send`` waits only while it is)."""
        buffered = self.ws.transport.get_write_buffer_size()
        return buffered + size + _FRAME_HEADER_MAX <= self.config.write_limit

    def _sent(self, data: bytes | str) -> None:
        self._sending = False
        self._backlog.sent(self.ws.transport.get_write_buffer_size())
        self.server.metrics.bytes_out += len(data)

    def _offer_audio(self, stream: _Stream, data: bytes) -> bool:
        """Send an audio message now when nothing is queued before it and the send cannot wait (the usual
        case: no hop through the outbox and the writer task), else queue it behind the rest; False when
        the outbox is full: the message is parked and the stream paused until the writer makes room."""
        if self._writable(len(data)):
            self._write_now(data)
            return True
        return self._queue_audio(stream, data)

    def _offer_audio_parts(self, stream: _Stream, header: bytes, payload: bytes) -> bool:
        """:meth:`_offer_audio` of the message ``header + payload``, in one pass: a DirectMessages
        connection that may write at once (the usual case) writes the frame's header, the message's header
        and its payload as one buffer, the payload copied once; anything else takes the general path."""
        size = len(header) + len(payload)
        direct = self._direct
        transport = self.ws.transport
        if direct is not None and not self._sending and not self.outbox.items:
            protocol = direct.protocol
            buffered = transport.get_write_buffer_size()
            if (
                protocol.state is State.OPEN
                and not protocol.writes
                and not protocol.extensions
                and not transport.is_closing()
                and buffered + size + _FRAME_HEADER_MAX <= self._write_limit
            ):
                transport.write(b"".join((binary_frame_header(size), header, payload)))
                self._backlog.after_send = transport.get_write_buffer_size()
                self._metrics.bytes_out += size
                return True
        return self._offer_audio(stream, header + payload)

    def _queue_audio(self, stream: _Stream, data: bytes) -> bool:
        """Queue audio that cannot be written now behind what waits; park it when the outbox is full."""
        if len(self.outbox) < self.outbox.limit or self.outbox.closed:
            self._control(data)
            return True
        stream.parked = data
        self._parked.append(stream)
        return False

    def _writable(self, size: int) -> bool:
        return (
            not self._sending
            and not self.outbox.items
            and self.ws.protocol.state is State.OPEN
            and not self.ws.transport.is_closing()
            and self._fits(size)
        )

    def _write_now(self, data: bytes) -> None:
        """Frame and write ``data`` at once: what ``ws.send`` does when it cannot wait, without its
        coroutine (it runs for every audio message). A DirectMessages connection writes the frame's header
        and the message in one write; otherwise (or when websockets holds bytes to send first) websockets'
        protocol object frames it. The transport buffers what the socket does not take."""
        direct = self._direct
        if direct is None or not direct.write_binary(binary_frame_header(len(data)), data):
            self.ws.protocol.send_binary(data)
            for chunk in self.ws.protocol.data_to_send():
                self.ws.transport.write(chunk)
        self._sent(data)

    def _admit_parked(self) -> None:
        """Move parked audio into the outbox while it has room; each stream goes on decoding."""
        while self._parked and len(self.outbox) < self.outbox.limit:
            stream = self._parked.popleft()
            data, stream.parked = stream.parked, None
            if data is None or stream.reported:
                continue
            self._control(data)
            if stream.decoder is not None:
                stream.decoder.resume()

    def _error(self, exc: BaseException, stream: int | None, retry_after_ms: int | None = None) -> None:
        code = error_code_for(exc)
        self.server.metrics.errors[code.value] += 1
        self._control(ErrorMessage(code, str(exc), stream, retry_after_ms))

    async def _watchdog(self) -> None:
        """Closes a connection that has had no open stream and sent nothing for ``idle_timeout``."""
        idle = self.config.idle_timeout
        if idle is None:
            await anyio.sleep_forever()
            return
        while True:
            await anyio.sleep(max(self.last_activity + idle - time.monotonic(), 0.01))
            if self.streams:
                self.last_activity = time.monotonic()  # an open stream is never idle
            elif time.monotonic() - self.last_activity >= idle:
                raise _CloseWith(ErrorCode.IDLE_TIMEOUT, f"no stream and no message for {idle:g} s")

    # -- inbound -----------------------------------------------------------------------------------
    async def _reader(self) -> None:
        # A DirectMessages connection hands whole messages over as websockets parses them; this loop
        # takes the rest: those that came before, fragmented ones.
        if self._direct is not None:
            self._direct.on_message = self._on_direct_message
        try:
            async for message in self.ws:  # ends on a normal close; raises ConnectionClosedError otherwise
                self._on_message(message)
        finally:
            self._stop_direct()

    def _on_direct_message(self, message: str | bytes) -> None:
        """A message handed over from inside websockets' ``data_received``: what fails here ends the
        connection as a failing reader task does, and the messages after it are not handled."""
        try:
            if type(message) is bytes:  # most messages: latents, without _on_message's dispatch
                self.last_activity = _monotonic()
                self._metrics.bytes_in += len(message)
                try:
                    self._on_latents(message)
                except ProtocolError as exc:
                    self._on_protocol_error(exc)
            else:
                self._on_message(message)
        except Exception as exc:
            self._stop_direct()
            self._end_by(exc)

    def _stop_direct(self) -> None:
        """No more messages from inside ``data_received``: any still to come wait in websockets' queue."""
        if self._direct is not None:
            self._direct.on_message = None

    def _on_message(self, message: str | bytes) -> None:
        self.last_activity = time.monotonic()
        self.server.metrics.bytes_in += len(message)
        try:
            if isinstance(message, str):
                self._on_text(message)
            else:
                self._on_latents(message)
        except ProtocolError as exc:
            self._on_protocol_error(exc)

    def _on_protocol_error(self, exc: ProtocolError, retry_after_ms: int | None = None) -> None:
        stream = self.streams.get(exc.stream) if exc.stream is not None else None
        if stream is not None and exc.code in STREAM_ENDING_CODES:
            self._report(stream, "error", exc)  # the error follows the audio already queued
        else:
            self._error(exc, exc.stream, retry_after_ms)
        if not self.budget.spend(time.monotonic()):
            raise _CloseWith(
                ErrorCode.TOO_MANY_ERRORS,
                f"more than {self.budget.budget} rejected messages (recovering {self.budget.refill:g}/s); "
                "fix the client",
            )

    def _on_text(self, text: str) -> None:
        msg = self.state.receive_text(text)
        if isinstance(msg, Start):
            self._start(msg)
            return
        stream = self.streams[msg.stream]
        if isinstance(msg, Cancel):
            self._report(stream, "cancelled")
        else:
            stream.intake.end()  # end: decode the rest, then done

    def _start(self, msg: Start) -> None:
        codec = self.server.codec
        unservable = check_opus(codec.sample_rate, codec.channels) if msg.format == OPUS_FORMAT else None
        if unservable is not None:
            self.state.discard(msg.stream)
            self._on_protocol_error(ProtocolError(ErrorCode.BAD_MESSAGE.value, unservable, stream=msg.stream))
            return
        refusal = self.server.admission_check()
        if refusal is not None:
            self.state.discard(msg.stream)
            self.server.metrics.refused += 1
            self._on_protocol_error(
                ProtocolError(ErrorCode.OVER_CAPACITY.value, refusal.reason, stream=msg.stream),
                refusal.retry_after_ms,
            )
            return
        stream = _Stream(msg.stream, self._intake_for(msg), msg.text)
        if msg.format == OPUS_FORMAT:
            stream.opus = OpusEncoder(codec.sample_rate, codec.channels, self.config.opus_bitrate)
        self.streams[msg.stream] = stream
        self.server.streams_changed(self, 1)
        self._control(self.state.started(msg.stream))
        try:
            # latents_checked: ServerState checked every latent message already, so the session skips
            # its own pass over the data. allow_non_finite=False whatever the decoder's default: NaN on the
            # wire would play as silence or noise with no word (s16 would silently be zeros), so audio
            # that overflowed inside the codec ends the stream with non_finite_output instead.
            stream.decoder = self.server.decoder.push_stream(
                stream.intake, partial(self._on_tile, stream), partial(self._decoded, stream),
                latents_checked=True, allow_non_finite=False,
            )  # fmt: skip
        except Exception as exc:  # no slot left: this stream only
            self._report(stream, "error", exc)
            return
        stream.intake.listener = stream.decoder.pump
        assert self._tg is not None
        if stream.text is not None:
            stream.first_latent_at = time.monotonic()  # a text stream's first audio counts from its start
            self._tg.start_soon(self._speak, stream)

    def _intake_for(self, msg: Start) -> _Intake:
        if msg.text is None:  # a client's latents: ServerState bounds them in frames
            return _Intake(self.state, msg.stream)
        # The voice's chunks: the same bound, in chunks, and the speaker waits for room instead of failing.
        chunks = max(self.server.limits.max_buffered_frames // self.config.text_chunk_frames, 1)
        return _Intake(self.state, msg.stream, chunks)

    async def _speak(self, stream: _Stream) -> None:
        """Feed a text stream's intake with the voice's latents; bad text ends the stream (``bad_text``)."""
        assert self.server.voice is not None and stream.text is not None
        with stream.speaker:
            failure = await speak(
                self.server.voice, stream.text, stream.intake.feed, self.config.text_chunk_frames
            )
            if failure is not None:
                self._report(stream, "error", failure)
            else:
                stream.intake.end()  # every sentence is in: decode the rest, then done

    def _on_latents(self, data: bytes) -> None:
        # a view of the message's bytes: the stream's session copies what it buffers
        stream_id, latents = self.state.receive_latents(data, view=True)
        stream = self.streams[stream_id]
        if stream.first_latent_at is None:
            stream.first_latent_at = _monotonic()
        if latents.shape[0] > 0:  # an empty message only advances seq
            stream.intake.put(latents)

    # -- one stream --------------------------------------------------------------------------------
    def _on_tile(self, stream: _Stream, tile: Tile) -> bool:
        """A tile of ``stream`` came back from the engine; False pauses the stream (see _offer_audio)."""
        samples = tile.samples  # finite: the stream checked it (see _start)
        if not stream.audio_sent:
            stream.audio_sent = True
            if stream.first_latent_at is not None:
                self._metrics.ttfa.observe(_monotonic() - stream.first_latent_at)
        # the tile's length, as its session checked it: reading a tensor's shape is a call into torch
        n_samples = tile.frames * self._hop
        self._metrics.audio_samples += n_samples
        if stream.opus is not None:
            self._encode(stream, partial(self._send_opus, stream, samples))
            return False  # paused until the encoder's worker thread is done
        # s16 from the tile, which converts its whole device call at once; floats (pcm_f32le) as numpy
        s16 = tile.s16_source  # its engine's conversion straight away, without the tile's layer
        header, payload = self.state.audio_parts(
            stream.id, samples, tile.pcm16 if s16 is None else s16.pcm16, n_samples
        )
        return self._offer_audio_parts(stream, header, payload)

    def _decoded(self, stream: _Stream, failure: BaseException | None) -> None:
        """``stream`` ended by itself: every tile went out (failure None), or bad input or the engine
        ended it."""
        if failure is None and stream.opus is not None:
            self._encode(stream, partial(self._send_opus_tail, stream))
            return
        self._report(stream, "error" if failure is not None else "completed", failure)

    def _encode(self, stream: _Stream, work: Callable[[], Awaitable[None]]) -> None:
        """Run an opus stream's encoder work in a task that stopping the stream cancels."""

        async def run() -> None:
            with anyio.CancelScope() as scope:
                stream.encoding = scope
                try:
                    await work()
                except Exception as exc:
                    self._report(stream, "error", exc)
                finally:
                    stream.encoding = None

        assert self._tg is not None
        self._tg.start_soon(run)

    async def _send_opus(self, stream: _Stream, samples: torch.Tensor) -> None:
        # in a worker thread: encoding takes about 2 % of the audio's duration, which the event loop
        # (keepalive, cancel, every other stream) would otherwise wait through, per stream
        assert stream.opus is not None and stream.decoder is not None
        payload = await anyio.to_thread.run_sync(stream.opus.encode, samples)
        if self._offer_audio(stream, self.state.encoded_audio(stream.id, int(samples.shape[1]), payload)):
            stream.decoder.resume()

    async def _send_opus_tail(self, stream: _Stream) -> None:
        # the padded last frame; n_samples 0: the headers already counted every real sample
        assert stream.opus is not None
        tail = await anyio.to_thread.run_sync(stream.opus.flush)
        self._control(self.state.encoded_audio(stream.id, 0, tail))
        self._report(stream, "completed", None)

    def _report(self, stream: _Stream, status: Status, failure: BaseException | None = None) -> None:
        """End ``stream`` and queue its error (if any) and done, once; forget it. From outside (cancel, a
        protocol error in it, shutdown) its call in flight is withdrawn and audio it parked is dropped;
        the done follows whatever was queued before."""
        if stream.reported:
            return
        self._release(stream)
        if failure is not None:
            if error_code_for(failure) is ErrorCode.INTERNAL:
                log.error("stream %d failed", stream.id, exc_info=failure)
            self.state.close_input(stream.id)
            self._error(failure, stream.id)
        self.server.metrics.streams[status] += 1
        stream.reported = True
        self._control(self.state.done(stream.id, status))
        self._lost(stream)

    def _release(self, stream: _Stream) -> None:
        """Stop everything working for ``stream``: decoding, its voice, its encoder, its parked audio."""
        if stream.decoder is not None:
            stream.decoder.close()  # withdraws the call in flight, gives the slot back
        stream.intake.close()
        stream.speaker.cancel()
        if stream.encoding is not None:
            stream.encoding.cancel()
        stream.parked = None

    def _lost(self, stream: _Stream) -> None:
        """Forget ``stream``; one that never reported its done counts as ``lost`` (connection gone)."""
        if not stream.reported:
            stream.reported = True
            self.server.metrics.streams["lost"] += 1
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
            self.server.streams_changed(self, -1)
            self.last_activity = time.monotonic()
