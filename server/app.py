"""The WebSocket server: one :class:`StreamServer`, one :class:`_Connection` per client.

Each connection runs three kinds of task in one task group::

    socket --reader--> ServerState (validate) --stream queue (bounded)--> stream task: decode_tiles
                                                                                 |
    socket <--writer-- outbox (bounded) <--------- audio / started / error / done -+

Backpressure is the chain of bounded waits: a listener that stops reading blocks the writer in
``send``; the outbox fills; stream tasks stop taking tiles, so ``decode_tiles`` stops pulling chunks;
stream queues fill; the reader stops reading the socket, and TCP pushes back on the sender. A send that
makes no progress for ``send_timeout`` ends the connection with 1013. Decoding runs on the engine's
worker, never on the event loop, so keepalive pings keep flowing.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from importlib import resources
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import anyio
import torch
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from streamdec.engine.base import WarmupReport
from streamdec.errors import ProtocolError
from streamdec.protocol import (
    CLOSE_CODES,
    STREAM_ENDING_CODES,
    STREAM_PATH,
    Cancel,
    CodecInfo,
    ErrorCode,
    ServerState,
    Start,
    error_code_for,
    error_message,
)
from streamdec.streaming import StreamDecoder

from .config import ServerConfig
from .looplag import LoopLagMonitor
from .metrics import ServerMetrics

__all__ = ["StreamServer"]

log = logging.getLogger("streamdec.server")

Status = Literal["completed", "cancelled", "error"]
_CLOSE_GOING_AWAY = object()  # outbox sentinel: everything before it was sent, now close with 1001


class _Overloaded(Exception):
    """The listener accepted nothing for ``send_timeout`` seconds."""


@dataclass(eq=False)
class _Stream:
    """One wire stream: its latent queue and the scope its decoding runs in."""

    id: int
    chunks_in: MemoryObjectSendStream[torch.Tensor]
    chunks_out: MemoryObjectReceiveStream[torch.Tensor]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop_status: Status | None = None  # set by cancel or a protocol error in this stream
    failure: BaseException | None = None
    first_latent_at: float | None = None
    audio_sent: bool = False

    def stop(self, status: Status, failure: BaseException | None = None) -> None:
        """End the decode now; the stream task then reports ``failure`` (if any) and ``done``."""
        if self.stop_status is None:
            self.stop_status, self.failure = status, failure
        self.chunks_in.close()
        self.scope.cancel()


class _Connection:
    """One client: reader, writer and stream tasks around a sans-I/O :class:`ServerState`."""

    def __init__(self, server: StreamServer, ws: ServerConnection) -> None:
        self.server = server
        self.ws = ws
        self.state = ServerState(server.codec, server.limits, accepting_streams=not server.shutting_down)
        self.streams: dict[int, _Stream] = {}
        self._outbox_in, self._outbox_out = anyio.create_memory_object_stream[Any](server.config.outbox)
        self._tg: TaskGroup | None = None
        self._fatal: ErrorCode | None = None  # set when the connection must close with an error

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self) -> None:
        with self._outbox_in, self._outbox_out:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._guarded, self._writer)
                await self._send(self.state.ready())
                await self._guarded(self._reader)
                tg.cancel_scope.cancel()  # the socket closed or failed: drop every stream
        # A stream task cancelled before its first step never entered its `with` block: close its queue.
        for stream in list(self.streams.values()):
            stream.chunks_in.close()
            stream.chunks_out.close()
        if self._fatal is ErrorCode.OVERLOADED:
            timeout = self.server.config.send_timeout
            await self._close_with(
                ErrorCode.OVERLOADED, f"listener too slow: nothing was read for {timeout:g} s"
            )
        elif self._fatal is ErrorCode.INTERNAL:
            await self._close_with(ErrorCode.INTERNAL, "internal server error")

    async def _guarded(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a connection task; any way it fails ends the connection (and frees every stream)."""
        try:
            await task()
        except ConnectionClosed:
            pass  # the peer went away while we were sending
        except _Overloaded:
            self._fatal = ErrorCode.OVERLOADED
        except Exception:
            log.exception("connection handler failed")
            self._fatal = ErrorCode.INTERNAL
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    async def _close_with(self, code: ErrorCode, message: str) -> None:
        """Send a connection-level error and its close code, even to a listener that stopped reading.

        The error and the close frame queue behind the audio the listener has not read yet; if it never
        reads them within ``close_timeout``, the TCP connection is aborted.
        """
        self.server.metrics.errors[code.value] += 1
        with anyio.move_on_after(self.server.config.close_timeout):
            async with anyio.create_task_group() as tg:
                # Started in this order, each writes its frame before its first wait, so error precedes close.
                tg.start_soon(self._send_quietly, error_message(code, message))
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

    async def close_going_away(self) -> None:
        """Shutdown: take no new streams, let open ones finish, flush what they sent, then close 1001."""
        self.state.accepting_streams = False
        while self.streams:
            await anyio.sleep(0.01)  # shutdown only; polling keeps the stream bookkeeping free of events
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # already ending
            await self._outbox_in.send(_CLOSE_GOING_AWAY)

    # -- outbound ----------------------------------------------------------------------------------
    async def _send(self, message: Any) -> None:
        await self._outbox_in.send(message)

    async def _writer(self) -> None:
        """Sends the outbox in order; a send with no progress for ``send_timeout`` means overloaded."""
        timeout, metrics = self.server.config.send_timeout, self.server.metrics
        async for message in self._outbox_out:
            if message is _CLOSE_GOING_AWAY:
                await self.ws.close(1001, "server shutting down")
                return
            with anyio.move_on_after(timeout) as scope:
                await self.ws.send(message)
            if scope.cancelled_caught:
                raise _Overloaded
            metrics.bytes_out += len(message)

    async def _error(self, exc: BaseException, stream: int | None) -> None:
        code = error_code_for(exc)
        self.server.metrics.errors[code.value] += 1
        await self._send(error_message(code, str(exc), stream))

    # -- inbound -----------------------------------------------------------------------------------
    async def _reader(self) -> None:
        async for message in self.ws:  # ends on a normal close; raises ConnectionClosedError otherwise
            self.server.metrics.bytes_in += len(message)
            try:
                if isinstance(message, str):
                    await self._on_text(message)
                else:
                    await self._on_latents(message)
            except ProtocolError as exc:
                await self._on_protocol_error(exc)

    async def _on_protocol_error(self, exc: ProtocolError) -> None:
        stream = self.streams.get(exc.stream) if exc.stream is not None else None
        if stream is not None and exc.code in STREAM_ENDING_CODES:
            stream.stop("error", exc)  # its task reports the error after the audio already queued
        else:
            await self._error(exc, exc.stream)

    async def _on_text(self, text: str) -> None:
        msg = self.state.receive_text(text)
        if isinstance(msg, Start):
            await self._start(msg)
            return
        stream = self.streams[msg.stream]
        if isinstance(msg, Cancel):
            stream.stop("cancelled")
        else:
            stream.chunks_in.close()  # end: decode the rest, then done

    async def _start(self, msg: Start) -> None:
        chunks_in, chunks_out = anyio.create_memory_object_stream[torch.Tensor](
            self.server.config.stream_queue
        )
        stream = _Stream(msg.stream, chunks_in, chunks_out)
        self.streams[msg.stream] = stream
        await self._send(self.state.started(msg.stream))
        assert self._tg is not None
        self._tg.start_soon(self._run_stream, stream)

    async def _on_latents(self, data: bytes) -> None:
        msg = self.state.receive_binary(data)
        stream = self.streams[msg.stream]
        if stream.first_latent_at is None:
            stream.first_latent_at = time.monotonic()
        if msg.latents.shape[0] == 0:
            return  # an empty message only advances seq
        # Waits while the stream is behind (backpressure). A stream that ended meanwhile (cancel, error)
        # has closed its queue; its done tells the client.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.chunks_in.send(msg.latents)

    # -- one stream --------------------------------------------------------------------------------
    async def _run_stream(self, stream: _Stream) -> None:
        try:
            status, failure = await self._decode(stream)
            if failure is not None:
                if error_code_for(failure) is ErrorCode.INTERNAL:
                    log.error("stream %d failed", stream.id, exc_info=failure)
                await self._error(failure, stream.id)
            self.server.metrics.streams[status] += 1
            await self._send(self.state.done(stream.id, status))
        finally:  # also when the connection is torn down around it; the id may already be reused
            if self.streams.get(stream.id) is stream:
                del self.streams[stream.id]

    async def _decode(self, stream: _Stream) -> tuple[Status, BaseException | None]:
        """Decode one stream into the outbox; returns its done status and the error that ended it."""
        failure: BaseException | None = None
        with stream.chunks_in, stream.chunks_out, stream.scope:  # the queue closes with the stream, always
            try:
                async with self.server.decoder.decode_tiles(
                    stream.chunks_out, allow_non_finite=False
                ) as tiles:
                    async for tile in tiles:
                        await self._send_audio(stream, tile.samples)
            except Exception as exc:  # bad input or engine failure: this stream only
                failure = exc
                self.state.close_input(stream.id)
        status: Status = stream.stop_status or ("error" if failure else "completed")
        return status, stream.failure or failure

    async def _send_audio(self, stream: _Stream, samples: torch.Tensor) -> None:
        if not stream.audio_sent and stream.first_latent_at is not None:
            self.server.metrics.ttfa.observe(time.monotonic() - stream.first_latent_at)
        stream.audio_sent = True
        self.server.metrics.audio_samples += int(samples.shape[1])
        await self._send(self.state.audio(stream.id, samples))


class StreamServer:
    """Serves protocol v1 for one :class:`~streamdec.StreamDecoder` (which the caller owns and closes).

    Use as ``async with StreamServer(decoder, config) as server:``; ``server.url`` is the stream URL
    with the real port. Call :meth:`warmup` (or set ``warm``) before clients connect: until then
    ``/healthz`` answers 503 and handshakes are refused with 503.
    """

    def __init__(self, decoder: StreamDecoder, config: ServerConfig | None = None) -> None:
        self.decoder = decoder
        self.config = config or ServerConfig()
        self.codec = CodecInfo.from_codec(decoder.codec)
        self.limits = self.config.limits.resolved(self.codec.latent_dim)
        self.metrics = ServerMetrics()
        self.warm = False
        self.shutting_down = False
        self._connections: set[_Connection] = set()
        self._server: Server | None = None
        self.loop_lag: LoopLagMonitor | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen; connections are accepted from here on."""
        cfg = self.config
        self.loop_lag = LoopLagMonitor.start()
        self._server = await serve(
            self._handle,
            cfg.host,
            cfg.port,
            process_request=self._process_request,
            compression=None,  # protocol v1: permessage-deflate off
            max_size=self.limits.max_message_bytes,  # bigger messages close with 1009
            max_queue=cfg.stream_queue,  # frames buffered by the websocket layer before it stops reading
            write_limit=cfg.write_limit,
            ping_interval=cfg.ping_interval,
            ping_timeout=cfg.ping_timeout,
            close_timeout=cfg.close_timeout,
        )

    async def warmup(self) -> WarmupReport:
        """Warm the decoder up; ``/healthz`` turns 200 afterwards."""
        report = await self.decoder.warmup()
        self.warm = True
        return report

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight streams finish (up to ``grace`` seconds), close all with 1001."""
        if self._server is None:
            return
        self.shutting_down = True
        self._server.server.close()  # the listening socket: no new TCP connections
        with anyio.move_on_after(self.config.grace if grace is None else grace):
            async with anyio.create_task_group() as tg:
                for conn in list(self._connections):
                    tg.start_soon(conn.close_going_away)
        self._server.close(close_connections=True)  # whatever is still open gets 1001 now
        with anyio.move_on_after(self.config.close_timeout):
            await self._server.wait_closed()
        for conn in list(self._connections):  # peers that never read their close frame: drop them
            conn.ws.transport.abort()
        await self._server.wait_closed()
        self._server = None
        lag, self.loop_lag = self.loop_lag, None
        if lag is not None:
            lag.stop()

    async def __aenter__(self) -> StreamServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the server first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"ws://{host}:{self.port}{STREAM_PATH}"

    @property
    def open_streams(self) -> int:
        """Wire streams whose task is still running, on all connections."""
        return sum(len(conn.streams) for conn in self._connections)

    # -- websocket ---------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        if len(self._connections) >= self.config.max_connections:
            self.metrics.errors[ErrorCode.OVERLOADED.value] += 1
            await ws.send(
                error_message(
                    ErrorCode.OVERLOADED,
                    f"max_connections={self.config.max_connections} reached; retry later",
                )
            )
            await ws.close(CLOSE_CODES[ErrorCode.OVERLOADED], "too many connections")
            return
        if self.config.send_buffer is not None:
            # Bounds what the kernel holds for a listener that stops reading, so a stall is seen sooner.
            sock = ws.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.send_buffer)
        conn = _Connection(self, ws)
        self._connections.add(conn)
        self.metrics.connections += 1
        self.metrics.connections_total += 1
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)
            self.metrics.connections -= 1

    # -- plain HTTP --------------------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        route = {"/healthz": self._healthz, "/metrics": self._metrics, "/": self._index}.get(url.path)
        if route is not None:
            return route()
        if url.path != STREAM_PATH:
            return _respond(HTTPStatus.NOT_FOUND, f"no route {url.path}; the stream is at {STREAM_PATH}\n")
        if not self._authorized(request.headers, url.query):
            self.metrics.errors[ErrorCode.UNAUTHORIZED.value] += 1
            body = error_message(
                ErrorCode.UNAUTHORIZED,
                "missing or wrong token: send 'Authorization: Bearer TOKEN' or ?token=TOKEN",
            )
            return _respond(
                HTTPStatus.UNAUTHORIZED, body, "application/json", [("WWW-Authenticate", "Bearer")]
            )
        if not self.warm or self.shutting_down:
            why = "warming up" if not self.warm else "shutting down"
            return _respond(HTTPStatus.SERVICE_UNAVAILABLE, f"server is {why}; retry later\n")
        return None

    def _authorized(self, headers: Headers, query: str) -> bool:
        token = self.config.token
        if not token:
            return True
        offered = parse_qs(query).get("token", [])
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            offered.append(auth[len("Bearer ") :].strip())
        return any(hmac.compare_digest(t.encode(), token.encode()) for t in offered)

    def _healthz(self) -> Response:
        body = {
            "status": "ok"
            if self.warm and not self.shutting_down
            else ("shutting_down" if self.shutting_down else "warming_up"),
            "warm": self.warm,
            "codec": self.codec.to_json(),
            "connections": len(self._connections),
            "open_streams": self.open_streams,
        }
        status = HTTPStatus.OK if body["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
        return _respond(status, json.dumps(body), "application/json")

    def _metrics(self) -> Response:
        text = self.metrics.render(
            self.decoder.stats,
            sample_rate=self.codec.sample_rate,
            hop_size=self.codec.hop_size,
            warm=self.warm,
        )
        text += self.loop_lag.render() if self.loop_lag is not None else ""
        return _respond(HTTPStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8")

    def _index(self) -> Response:
        page = resources.files(__package__ or "streamdec.server").joinpath("static/index.html").read_text()
        return _respond(HTTPStatus.OK, page, "text/html; charset=utf-8")


def _respond(
    status: HTTPStatus,
    body: str,
    content_type: str = "text/plain; charset=utf-8",
    extra: list[tuple[str, str]] | None = None,
) -> Response:
    data = body.encode()
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(data))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
            *(extra or []),
        ]
    )
    return Response(status.value, status.phrase, headers, data)
