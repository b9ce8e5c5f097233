"""Async Python client for protocol v1.

Example::

    async with connect("ws://127.0.0.1:8765/v1/stream", token=None) as conn:
        stream = await conn.open_stream(format="pcm_f32le")
        await stream.send(latents)          # [T, latent_dim]; split to the server's max_frames_per_message
        await stream.end()
        async for frame in stream:          # AudioFrame, in order, until the server's done
            play(frame.samples)             # float32 [channels, n]

One task reads the socket all the time (so keepalive pings are answered whatever the streams do) and
routes each message to its stream. Flow control is the server's ``max_buffered_frames`` (in ``ready``):
:meth:`ClientStream.send` waits while the stream is that many frames ahead of the audio received, so a
producer faster than decoding is paused, never refused. Audio received and not yet iterated waits in the
stream (at most the audio of the latents sent): iterate every stream you open.

Behind a balancer, :func:`open_stream_retrying` connects and starts a stream, and on a refusal for
capacity or shutdown, or a failed connection, tries a new connection after a backoff (bounded, full
jitter, never sooner than the server's ``retry_after_ms``): the balancer sends it to another replica.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import torch
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from streamdec.errors import ConfigError, ServerError, ShapeError
from streamdec.protocol import (
    AUDIO_FORMATS,
    DEFAULT_DTYPE,
    DEFAULT_FORMAT,
    LATENT_DTYPES,
    OPUS_FORMAT,
    STREAM_ENDING_CODES,
    AudioMessage,
    Cancel,
    ClientControl,
    CodecInfo,
    Done,
    End,
    ErrorMessage,
    Ready,
    ServerControl,
    Start,
    Started,
    decode_audio_samples,
    encode_latents,
    encode_text,
    parse_audio,
    parse_server_text,
)

from .opus import OpusStreamDecoder

__all__ = [
    "AudioFrame",
    "ClientStream",
    "Connection",
    "RetryPolicy",
    "connect",
    "open_stream_retrying",
    "retryable",
]

#: audio messages are one tile each; this bounds a tile at 16 Mi samples of float32
DEFAULT_MAX_SIZE = 64 * 2**20
_ENDING_CODES = frozenset(code.value for code in STREAM_ENDING_CODES)


@dataclass(frozen=True, eq=False)
class AudioFrame:
    """One audio message: ``pcm`` is the raw interleaved payload, ``samples`` float32 ``[channels, n]``.

    In ``opus`` ``pcm`` is the message's share of the Ogg Opus stream and ``samples`` the decoded audio it
    released, at the codec's rate; ``start_sample`` and ``n_samples`` describe those samples (the decoder
    holds a little back, so they lag the header's). The last frame of a completed Opus stream carries
    what the end released (``seq`` one past the last message's, ``pcm`` empty).
    """

    stream: int
    seq: int
    start_sample: int
    n_samples: int
    pcm: bytes
    samples: np.ndarray


class ClientStream:
    """One stream on a :class:`Connection`; iterate it for :class:`AudioFrame` until ``done``.

    After iteration ``done`` holds the server's ``done`` message. A stream that ends in ``error`` raises
    :class:`~streamdec.errors.ServerError` out of the iteration, with the server's code and message.
    """

    def __init__(self, conn: Connection, stream: int, dtype: str, fmt: str) -> None:
        self.conn, self.id, self.dtype, self.format = conn, stream, dtype, fmt
        self._opus = _opus_decoder(conn.ready_message) if fmt == OPUS_FORMAT else None
        # Unbounded: what waits here is the audio of latents this client chose to send (see send()).
        self._in, self._out = anyio.create_memory_object_stream[AudioMessage | Done](math.inf)
        self._seq = 0
        self._expected_sample = 0
        self._frames_sent = 0
        self._samples_received = 0  # counted as the reading task routes them: the server's progress
        self._progress = anyio.Event()
        self._ended = False  # done arrived or the connection ended: nothing more will be acknowledged
        self.done_message: Done | None = None
        self.errors: list[ServerError] = []  # every error message the server sent about this stream

    @property
    def done(self) -> dict[str, Any] | None:
        """The server's ``done`` message as JSON, once iteration ended (``done_message``: typed)."""
        return None if self.done_message is None else self.done_message.to_json()

    @property
    def frames_ahead(self) -> int:
        """Latent frames sent whose audio has not arrived yet (an upper bound of what the server holds)."""
        return self._frames_sent - self._samples_received // self.conn.codec.hop_size

    async def send(self, latents: torch.Tensor | np.ndarray) -> None:
        """Send ``[T, latent_dim]`` latents, as many messages as ``max_frames_per_message`` requires.

        Waits while the stream is ``max_buffered_frames`` frames ahead of the audio received (the server
        would refuse more with ``backlog_full``); the wait ends as audio arrives.
        Raises :class:`~streamdec.errors.ShapeError` before sending when the shape does not fit the
        server's codec (its ``latent_dim`` from ``ready``).
        """
        _check_latent_dim(latents, self.conn.codec)
        step = self.conn.limits.max_frames_per_message
        for begin in range(0, max(len(latents), 1), step):
            chunk = latents[begin : begin + step]
            await self._room_for(len(chunk))
            await self.conn.ws.send(encode_latents(self.id, self._seq, chunk, self.dtype))
            self._seq += 1
            self._frames_sent += len(chunk)

    async def _room_for(self, frames: int) -> None:
        cap = self.conn.limits.max_buffered_frames
        while self.frames_ahead + frames > cap and not self._ended:
            await self._progress.wait()

    def _received(self, n_samples: int) -> None:
        self._samples_received += n_samples
        self._progress.set()
        self._progress = anyio.Event()

    def _finish(self) -> None:
        self._ended = True
        self._in.close()
        self._received(0)  # a sender waiting for room stops waiting

    async def end(self) -> None:
        """No more latents: the server decodes the rest, sends it, then ``done``."""
        await self.conn.send_control(End(self.id))

    async def cancel(self) -> None:
        """Stop now: the server drops what is pending and sends ``done`` with status ``cancelled``."""
        await self.conn.send_control(Cancel(self.id))

    def _cause(self) -> ServerError:
        """The error that ended the stream: the first stream-ending one. Latents still in flight when the
        stream ended draw unknown_stream errors that can arrive before it; they are echoes, not the cause."""
        ending = [e for e in self.errors if e.code in _ENDING_CODES]
        return (ending or self.errors or [ServerError("internal", "stream failed", stream=self.id)])[0]

    def __aiter__(self) -> AsyncIterator[AudioFrame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[AudioFrame]:
        decoded, seq = 0, 0  # Opus: decoded samples released so far; the next frame's seq
        async for item in self._out:
            if isinstance(item, Done):
                self.done_message = item
                if item.status == "error":
                    raise self._cause()
                if self._opus is not None and item.status == "completed":
                    rest = self._opus.finish(item.samples)[None]
                    yield AudioFrame(self.id, seq, decoded, rest.shape[1], b"", rest)
                return
            if item.start_sample != self._expected_sample:
                raise ServerError(
                    "internal",
                    f"audio gap: start_sample {item.start_sample}, expected {self._expected_sample}",
                    stream=self.id,
                )
            self._expected_sample += item.n_samples
            seq = item.seq + 1
            if self._opus is None:
                samples = decode_audio_samples(item, self.format, self.conn.codec.channels)
                yield AudioFrame(item.stream, item.seq, item.start_sample, item.n_samples, item.pcm, samples)
            else:
                released = self._opus.push(item.pcm, item.n_samples)[None]
                yield AudioFrame(item.stream, item.seq, decoded, released.shape[1], item.pcm, released)
                decoded += released.shape[1]
        raise self.conn.closed_error(self.id)


def _opus_decoder(ready: Ready) -> OpusStreamDecoder:
    """The decoder of an ``opus`` stream; raises ConfigError where the server does not send Opus."""
    _check_opus(ready)
    assert ready.opus is not None
    return OpusStreamDecoder(ready.codec.sample_rate, ready.opus.sample_rate)


def _check_opus(ready: Ready) -> None:
    if ready.opus is None:
        raise ConfigError(
            "this server does not send Opus (its ready has no 'opus': a server before protocol 1.2, one "
            "without libopus, or a codec of several channels): ask for pcm_s16le or pcm_f32le"
        )


class Connection:
    """A connected client; ``codec`` and ``limits`` come from the server's ``ready``."""

    def __init__(self, ws: ClientConnection, ready: Ready) -> None:
        self.ws = ws
        self.ready_message = ready
        self.codec = ready.codec
        self.limits = ready.limits
        self.errors: list[ServerError] = []  # error messages about no open stream (stream null or unknown)
        self._streams: dict[int, ClientStream] = {}
        self._pending: dict[int, MemoryObjectSendStream[Started | ErrorMessage]] = {}
        self._ids = itertools.count()
        self._handles: list[ClientStream] = []  # every stream opened; all are closed with the connection

    @property
    def ready(self) -> dict[str, Any]:
        """The server's ``ready`` message as JSON (``ready_message``: typed)."""
        return self.ready_message.to_json()

    async def send_control(self, msg: ClientControl) -> None:
        """Send one control message (``Start``, ``End``, ``Cancel``)."""
        await self.ws.send(encode_text(msg))

    async def open_stream(
        self,
        *,
        stream: int | None = None,
        dtype: str = DEFAULT_DTYPE,
        format: str = DEFAULT_FORMAT,
        text: str | None = None,
    ) -> ClientStream:
        """Start a stream and wait for ``started``; raises ServerError if the server refuses it.

        With ``text`` the server's voice speaks it (``ready_message.voice`` names the voice): send no
        latents and no ``end``, just iterate the audio. A server without a voice refuses with ``no_voice``.
        """
        if dtype not in LATENT_DTYPES or format not in AUDIO_FORMATS:
            raise ValueError(
                f"dtype {dtype!r} / format {format!r}: pick from {list(LATENT_DTYPES)} / "
                f"{list(AUDIO_FORMATS)}"
            )
        if format == OPUS_FORMAT:
            _check_opus(self.ready_message)  # refuse before the start: the stream could not be played
        if text is not None and self.ready_message.minor < 1:
            # A v1.0 server would ignore the text and wait for latents forever.
            raise ServerError(
                "no_voice",
                "this server speaks protocol 1.0, which has no text in: upgrade it and start it with "
                "`streamdec serve --voice piper-joe`",
                stream=stream,
            )
        sid = next(i for i in self._ids if i not in self._streams) if stream is None else stream
        reply_in, reply_out = anyio.create_memory_object_stream[Started | ErrorMessage](1)
        self._pending[sid] = reply_in
        try:
            with reply_in, reply_out:
                await self.send_control(Start(sid, dtype, format, text))
                reply = await reply_out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise self.closed_error(sid) from None
        finally:
            self._pending.pop(sid, None)
        if isinstance(reply, ErrorMessage):
            raise reply.to_exception()
        handle = ClientStream(self, sid, dtype, format)
        self._streams[sid] = handle
        self._handles.append(handle)
        return handle

    def closed_error(self, stream: int) -> ServerError:
        """What a stream raises when the connection ended before its ``done``."""
        last = self.errors[-1] if self.errors else None
        code = last.code if last else "internal"
        why = f": {last}" if last else ""
        return ServerError(
            code,
            f"connection closed ({self.ws.close_code}) before stream {stream} was done{why}",
            stream=stream,
        )

    # -- the reading task --------------------------------------------------------------------------
    async def _dispatch(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    audio = parse_audio(message)
                    handle = self._streams.get(audio.stream)
                    if handle is not None:
                        handle._received(audio.n_samples)
                        handle._in.send_nowait(audio)
                else:
                    await self._on_text(parse_server_text(message))
        except ConnectionClosed:
            pass
        finally:
            for handle in self._streams.values():
                handle._finish()
            for reply in self._pending.values():
                reply.close()

    async def _on_text(self, msg: ServerControl) -> None:
        stream = getattr(msg, "stream", None)
        handle = self._streams.get(stream) if stream is not None else None
        reply = self._pending.get(stream) if stream is not None else None
        if reply is not None and isinstance(msg, Started | ErrorMessage):
            await reply.send(msg)
        elif isinstance(msg, ErrorMessage) and handle is not None:
            handle.errors.append(msg.to_exception())
        elif isinstance(msg, ErrorMessage):
            self.errors.append(msg.to_exception())
        elif isinstance(msg, Done) and handle is not None:
            del self._streams[handle.id]
            handle._in.send_nowait(msg)
            handle._finish()


def _check_latent_dim(latents: torch.Tensor | np.ndarray, codec: CodecInfo) -> None:
    shape = tuple(latents.shape)
    if len(shape) != 2 or shape[1] != codec.latent_dim:
        raise ShapeError(
            f"latents of shape {shape}: the server's codec {codec.name!r} takes [frames, {codec.latent_dim}]; "
            "send the latents of the model this codec belongs to"
        )


@contextlib.asynccontextmanager
async def connect(
    url: str, *, token: str | None = None, max_size: int = DEFAULT_MAX_SIZE, **kwargs: Any
) -> AsyncIterator[Connection]:
    """Connect, wait for ``ready``, and keep a reading task running until the block exits.

    ``token`` goes in an ``Authorization: Bearer`` header. Other keyword arguments go to
    :func:`websockets.asyncio.client.connect` (``proxy`` defaults to None: a local server is the
    common case, and environment proxies break loopback connections).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else None
    kwargs.setdefault("proxy", None)
    async with ws_connect(
        url, additional_headers=headers, compression=None, max_size=max_size, **kwargs
    ) as ws:
        first = parse_server_text(await ws.recv())  # a ready of another protocol version raises here
        if isinstance(first, ErrorMessage):
            raise first.to_exception()
        if not isinstance(first, Ready):
            raise ServerError("bad_message", f"expected ready first, got {first!r:.200}")
        conn = Connection(ws, first)
        tg: TaskGroup
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn._dispatch)
            try:
                yield conn
            except Exception as exc:  # re-raised below, outside the task group: not in an ExceptionGroup
                failure = exc
            finally:
                tg.cancel_scope.cancel()
                for handle in conn._handles:
                    handle._in.close()
                    handle._out.close()
        if failure is not None:
            raise failure


# -- retrying a refused or failed start ------------------------------------------------------------------
#: Server error codes that say "not here, not now": another connection (through a balancer, another
#: replica) or a later try may succeed. Anything else is the client's fault and is raised at once.
RETRYABLE_CODES = frozenset({"over_capacity", "overloaded", "shutting_down"})
#: HTTP statuses of a refused handshake worth retrying: a balancer with no healthy backend (502/503/504)
#: or a replica that is warming up or draining (503).
RETRYABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retry with exponential backoff and full jitter.

    Try ``k`` (0-based) waits ``uniform(0, min(cap, base * 2**k))`` seconds, but never less than the
    server's ``retry_after_ms`` when the refusal carried one; after ``attempts`` tries the last error is
    raised. Full jitter spreads clients refused together over the whole window, so they do not return
    together (the "thundering herd" a fixed delay causes).
    """

    attempts: int = 6
    base: float = 0.1
    cap: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"attempts={self.attempts} must be >= 1 (1: no retry)")
        if self.base <= 0 or self.cap < self.base:
            raise ConfigError(f"base={self.base} must be > 0 and cap={self.cap} >= base (seconds)")

    def delay(self, attempt: int, retry_after_ms: int | None, rng: random.Random) -> float:
        """Seconds to wait after failed try ``attempt`` (0-based)."""
        wait = rng.uniform(0.0, min(self.cap, self.base * 2.0**attempt))
        return max(wait, (retry_after_ms or 0) / 1000)


def retryable(exc: BaseException) -> bool:
    """Whether a failed connect or start may succeed on a new connection: a refusal for capacity or
    shutdown, a refused or reset TCP connection, a balancer's 5xx, a connection dropped mid-handshake."""
    if isinstance(exc, ServerError):
        return exc.code in RETRYABLE_CODES
    if isinstance(exc, InvalidStatus):
        return exc.response.status_code in RETRYABLE_STATUSES
    return isinstance(exc, OSError | InvalidMessage | ConnectionClosed)


@contextlib.asynccontextmanager
async def open_stream_retrying(
    url: str,
    *,
    retry: RetryPolicy | None = None,
    token: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    format: str = DEFAULT_FORMAT,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    **kwargs: Any,
) -> AsyncIterator[tuple[Connection, ClientStream]]:
    """Connect and start one stream, retrying on a new connection when :func:`retryable` says so.

    Only the start is retried: once ``started`` arrived the stream is yours, and a failure after that
    (audio already delivered) is raised as it is. ``kwargs`` go to :func:`connect`.
    """
    policy, rng = retry or RetryPolicy(), rng or random.Random()
    for attempt in range(policy.attempts):
        stack = contextlib.AsyncExitStack()
        try:
            conn = await stack.enter_async_context(connect(url, token=token, **kwargs))
            stream = await conn.open_stream(dtype=dtype, format=format)
        except Exception as exc:
            await stack.aclose()
            if not retryable(exc) or attempt + 1 == policy.attempts:
                raise
            await sleep(policy.delay(attempt, getattr(exc, "retry_after_ms", None), rng))
            continue
        async with stack:
            yield conn, stream
        return
