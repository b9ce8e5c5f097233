"""The WebSocket server: one :class:`StreamServer`; each client is a :class:`~.connection.Connection`.

Before a client gets a connection it passes, in order: the accept-time handshake cap
(``max_handshakes``, and ``open_timeout`` to finish), the HTTP checks (method GET/HEAD, route, token,
Origin, warm and not shutting down), then the connection caps (``max_connections`` in all,
``max_connections_per_client`` per address). Every ``start`` then asks the admission controller
(:mod:`.admission`) whether one more real-time stream fits.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import socket
import time
from asyncio.constants import ACCEPT_RETRY_DELAY
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import torch
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from streamdec.engine.base import WarmupReport
from streamdec.errors import ConfigError
from streamdec.protocol import CLOSE_CODES, STREAM_PATH, CodecInfo, ErrorCode, error_message
from streamdec.session import FlushPolicy
from streamdec.streaming import StreamDecoder

from .admission import AdmissionController, Load, Refusal
from .config import ServerConfig
from .connection import Connection
from .direct import DirectMessages
from .eventloop import running_loop_name
from .gcpause import GcPauseMonitor
from .guards import origin_allowed, token_offered
from .looplag import LoopLagMonitor
from .metrics import ServerMetrics, render_device_loads
from .opus import opus_info
from .probe import CapacityReport, cuda_engines, engine_hold_lead, measure_capacity, probe_margin
from .probe_cache import KeptVerdict, VerdictStore

if TYPE_CHECKING:
    from streamdec.voice import Voice

    from .devices import DecoderGroup

__all__ = ["StreamServer"]

log = logging.getLogger("streamdec.server")

#: At most one log line per this many seconds about failing accept() calls (EMFILE and the like).
_ACCEPT_LOG_EVERY = 10.0
#: The browser page's files (clients/web/), served at / and /web/NAME.
_WEB_PACKAGE = "streamdec.clients.web"
_WEB_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
              ".css": "text/css; charset=utf-8"}  # fmt: skip
#: The sample clip the page's "play a sample" button streams: seeded latents, this long.
SAMPLE_SECONDS, SAMPLE_SEED = 3.0, 0


def _clean(report: CapacityReport) -> bool:
    """Whether a probe's verdict may be kept for later starts: its first paced run passed. One that had to
    step down (a stall, a busy host) is not carried forward; the next start probes again."""
    return len(report.runs) == 1 and report.capacity > 0 and report.capacity == report.runs[0].streams


class StreamServer:
    """Serves protocol v1 for one :class:`~streamdec.StreamDecoder` (which the caller owns and closes).

    Use as ``async with StreamServer(decoder, config) as server:``; ``server.url`` is the stream URL
    with the real port. Call :meth:`warmup` (or set ``warm``) before clients connect: until then
    ``/healthz`` answers 503 and handshakes are refused with 503. :meth:`warmup` also measures how many
    real-time streams the engine sustains (unless ``max_streams_total`` is set), which admission uses.

    With a ``voice`` (:class:`streamdec.voice.Voice`, whose decoder is the decoder's codec) a ``start``
    may carry text, which the voice speaks (:mod:`.speech`); ``ready`` and ``/healthz`` name the voice.
    """

    def __init__(
        self,
        decoder: StreamDecoder | DecoderGroup,
        config: ServerConfig | None = None,
        *,
        voice: Voice | None = None,
    ) -> None:
        self.decoder = decoder
        self.config = config or ServerConfig()
        self.codec = CodecInfo.from_codec(decoder.codec)
        self.voice = voice
        self.voice_name = None if voice is None else _check_voice(voice, self.codec)
        self.opus = opus_info(self.codec, self.config.opus_bitrate)
        self.limits = self.config.limits.resolved(self.codec.latent_dim)
        self.metrics = ServerMetrics()
        self.admission = AdmissionController(
            override=self.config.max_streams_total,
            hard_limit=getattr(decoder, "max_streams", None),
            retry_after_ms=self.config.retry_after_ms,
        )
        self.capacity_report: CapacityReport | None = None  # what the warm-up probe measured
        self.capacity_measured_at: str | None = None  # when, where a start reused a kept verdict
        self.warm = False
        self.shutting_down = False
        self._connections: set[Connection] = set()
        # len(conn.streams) summed over _connections, kept by the connections as streams come and go:
        # admission reads it at every start, and a sum over every connection there is O(streams) each
        self._open_streams = 0
        self._per_client: Counter[str] = Counter()
        self._handshaking = 0
        self._server: Server | None = None
        self.loop_lag: LoopLagMonitor | None = None
        self.gc_pauses: GcPauseMonitor | None = None
        self._accept_logged_at = -_ACCEPT_LOG_EVERY
        self._previous_handler: Any = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen; connections are accepted from here on."""
        cfg = self.config
        self.loop_lag = LoopLagMonitor.start()
        self.gc_pauses = GcPauseMonitor.start()
        self._server = await serve(
            self._handle,
            cfg.host,
            cfg.port,
            process_request=self._process_request,
            server_header=None,  # no version banner
            create_connection=_counted_connection(self),
            open_timeout=cfg.open_timeout,
            compression=None,  # protocol v1: permessage-deflate off
            max_size=self.limits.max_message_bytes,  # bigger messages close with 1009
            max_queue=cfg.stream_queue,  # frames buffered by the websocket layer before it stops reading
            write_limit=cfg.write_limit,
            ping_interval=cfg.ping_interval,
            ping_timeout=cfg.ping_timeout,
            close_timeout=cfg.close_timeout,
        )
        loop = asyncio.get_running_loop()
        self._previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)

    async def warmup(self, before_probe: Callable[[], None] | None = None) -> WarmupReport:
        """Warm the decoder up and measure capacity; ``/healthz`` turns 200 afterwards. ``before_probe``
        runs between the two: ``streamdec serve`` freezes the heap there (:func:`settings.freeze_heap`),
        so that the probe meets the garbage collector as the server's streams will, not a full
        collection over everything warm-up made, which stalls every paced stream at once."""
        report = await self.decoder.warmup()
        if before_probe is not None:
            before_probe()
        if self.config.probe_capacity and self.config.max_streams_total is None:
            self.admission.measured = await self.measure_capacity()
        self.warm = True
        return report

    async def measure_capacity(self) -> int:
        """Real-time streams this engine serves with every listener kept supplied (see :mod:`.probe`):
        a throughput bound, then streams paced in real time, start-up included, checked against the
        listener's clock. 0 when not even one stream keeps half its listener's prebuffer in hand."""
        decoder = self.decoder
        policy = getattr(decoder, "flush_policy", None) or FlushPolicy()
        margin = probe_margin(decoder.mode, policy.prebuffer_s, policy.margin_s, engine_hold_lead(decoder))
        kept = self._kept_verdicts(margin, policy.prebuffer_s)
        found = kept.load() if kept is not None else None
        if found is not None:
            report, self.capacity_measured_at = found
        else:
            report = await measure_capacity(
                decoder,
                latent_dim=self.codec.latent_dim,
                frame_rate=self.codec.sample_rate / self.codec.hop_size,
                sample_rate=self.codec.sample_rate,
                prebuffer=policy.prebuffer_s,
                margin=margin,
                hard_limit=self.admission.hard_limit,
            )
            if kept is not None and _clean(report):
                kept.store_report(report)
        self.capacity_report = report
        if report.capacity == 0:
            log.warning("capacity 0: %s; every start is refused with over_capacity (--max-streams-total N "
                        "serves N streams at best effort)", report.summary())  # fmt: skip
        else:
            log.info("capacity: %s", report.summary())
        return report.capacity

    def _kept_verdicts(self, margin: float, prebuffer: float) -> KeptVerdict | None:
        """The stored probe verdict this start may reuse or must write (:mod:`.probe_cache`): only where
        every engine runs on CUDA and a directory is configured."""
        directory = self.config.capacity_cache
        engines = cuda_engines(self.decoder)
        if directory is None or engines is None:
            return None
        decoder = self.decoder
        facts = {
            "codec": self.codec.name,
            "config": decoder.codec.config_dict(),
            "precision": getattr(decoder.codec, "precision", None),
            "mode": decoder.mode,
            "emit": [decoder.min_emit, getattr(decoder, "max_emit", None)],
            "engines": len(engines),
            "slots": [getattr(e, "max_streams", None) for e in engines],
            "hold_lead": [getattr(e, "hold_lead", None) for e in engines],
            "prime_hold_lead": [getattr(e, "prime_hold_lead", None) for e in engines],
            "launch_interval": [getattr(e, "launch_interval", None) for e in engines],
            "lanes": [e.lanes for e in engines],
            "hard_limit": self.admission.hard_limit,
            "prebuffer_s": prebuffer,
            "margin_s": margin,
        }
        return KeptVerdict(VerdictStore(directory), facts, engines)

    async def shutdown(self, grace: float | None = None) -> None:
        """Shut down as PROTOCOL.md says: ``/healthz`` 503 and no new streams at once; in-flight streams get
        ``grace`` seconds to finish; streams still running then get ``shutting_down`` and ``done``; every
        connection closes with 1001 after its outbox is flushed; peers that never read are aborted.
        """
        if self._server is None:
            return
        self.shutting_down = True  # healthz 503, handshakes 503, start -> overloaded
        with anyio.move_on_after(self.config.grace if grace is None else grace):
            async with anyio.create_task_group() as tg:
                for conn in list(self._connections):
                    tg.start_soon(conn.drain)
        for conn in list(self._connections):
            conn.cut_streams("the server shut down before this stream finished (grace period over)")
        with anyio.move_on_after(self.config.close_timeout):
            async with anyio.create_task_group() as tg:
                for conn in list(self._connections):
                    tg.start_soon(conn.close_going_away)
        server = self._server
        if server is None:  # a second signal aborted everything meanwhile
            return
        server.close(close_connections=True)  # the listener; whatever is still open gets 1001 now
        with anyio.move_on_after(self.config.close_timeout):
            await server.wait_closed()
        self.abort()

    def abort(self) -> None:
        """Stop at once: close the listener and drop every connection without a word (a second signal)."""
        if self._server is None:
            return
        self.shutting_down = True
        self._server.close(close_connections=False)
        for conn in list(self._connections):
            conn.ws.transport.abort()
        for ws in list(self._server.connections):
            ws.transport.abort()
        self._server = None
        lag, self.loop_lag = self.loop_lag, None
        if lag is not None:
            lag.stop()
        pauses, self.gc_pauses = self.gc_pauses, None
        if pauses is not None:
            pauses.stop()
        # accept() retries that EMFILE scheduled still fire on the closed listener for up to a retry
        # delay: keep counting them as ours until then, not as a traceback each
        asyncio.get_running_loop().call_later(ACCEPT_RETRY_DELAY + 0.5, self._restore_handler)

    def _restore_handler(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() == self._loop_exception:
            loop.set_exception_handler(self._previous_handler)

    async def run_until_signalled(self, announce: Callable[[str], None] = print) -> None:
        """Serve until SIGINT/SIGTERM, then :meth:`shutdown`; a second signal during it stops at once."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            received = aiter(signals)
            first = await anext(received)
            announce(f"{signal.Signals(first).name}: finishing in-flight streams (up to "
                     f"{self.config.grace:g} s), then closing; send it again to stop at once")  # fmt: skip
            async with anyio.create_task_group() as tg:

                async def second_signal() -> None:
                    again = await anext(received)
                    announce(f"{signal.Signals(again).name} again: stopping now")
                    self.abort()
                    tg.cancel_scope.cancel()

                tg.start_soon(second_signal)
                await self.shutdown()
                tg.cancel_scope.cancel()

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
        """Wire streams open (started and not yet done), on all connections."""
        return self._open_streams

    def streams_changed(self, conn: Connection, delta: int) -> None:
        """``conn`` opened (+1) or forgot (-1) a stream; a connection already gone counts no more."""
        if conn in self._connections:
            self._open_streams += delta

    # -- admission ---------------------------------------------------------------------------------
    def load(self) -> Load:
        return Load(self.open_streams, self.decoder.stats.engine.queued)

    def admission_check(self) -> Refusal | None:
        """None: one more stream may start now."""
        return self.admission.check(self.load())

    # -- websocket ---------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        client = _client_address(ws)
        refusal = self._connection_refusal(client)
        if refusal is not None:
            self.metrics.errors[ErrorCode.OVERLOADED.value] += 1
            await ws.send(
                error_message(ErrorCode.OVERLOADED, refusal, retry_after_ms=self.config.retry_after_ms)
            )
            await ws.close(CLOSE_CODES[ErrorCode.OVERLOADED], "too many connections")
            return
        if self.config.send_buffer is not None:
            # Bounds what the kernel holds for a listener that stops reading, so a stall is seen sooner.
            sock = ws.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.send_buffer)
        conn = Connection(self, ws)
        self._connections.add(conn)
        self._per_client[client] += 1
        self.metrics.connections += 1
        self.metrics.connections_total += 1
        try:
            await conn.run()
        finally:
            self._open_streams -= len(conn.streams)  # what it still holds (a run cut short) goes with it
            self._connections.discard(conn)
            self._per_client[client] -= 1
            if self._per_client[client] <= 0:
                del self._per_client[client]
            self.metrics.connections -= 1

    def _connection_refusal(self, client: str) -> str | None:
        cfg = self.config
        if len(self._connections) >= cfg.max_connections:
            return f"max_connections={cfg.max_connections} reached; retry later"
        if self._per_client[client] >= cfg.max_connections_per_client:
            return (
                f"{self._per_client[client]} connections from {client} already, "
                f"max_connections_per_client={cfg.max_connections_per_client}; open streams on one of them"
            )
        return None

    def handshake_started(self) -> bool:
        """Accept time: count a connection in its opening handshake; False (drop it) past the cap."""
        if self._handshaking >= self.config.max_handshakes:
            self.metrics.handshakes_refused += 1
            return False
        self._handshaking += 1
        return True

    def handshake_ended(self) -> None:
        self._handshaking -= 1

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """accept() failing for want of file descriptors (EMFILE) or memory: count it, log one line per
        ``_ACCEPT_LOG_EVERY`` seconds instead of a traceback per retry; asyncio retries by itself."""
        if context.get("message") == "socket.accept() out of system resource":
            self.metrics.accept_errors += 1
            now = time.monotonic()
            if now - self._accept_logged_at >= _ACCEPT_LOG_EVERY:
                self._accept_logged_at = now
                log.warning("accept() failed (%s); %d times so far; new connections wait",
                            context.get("exception"), self.metrics.accept_errors)  # fmt: skip
            return
        if _is_retry_on_closed_listener(context):
            return  # the listener closed while asyncio waited to retry accept(): nothing to retry
        if self._previous_handler is not None:
            self._previous_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    # -- plain HTTP --------------------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        response = self._route(request)
        if response is not None and request.method == "HEAD":
            response.body = b""  # same headers (Content-Length included), no body
        return response

    def _route(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return _respond(
                HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD\n", extra=[("Allow", "GET, HEAD")]
            )
        path = urlsplit_path(request.path)[0]
        if path == "/healthz":
            if self.config.public_healthz or self._authorized(request):
                return self._healthz()
            return self._unauthorized()
        if path == "/metrics":
            return self._metrics() if self._authorized(request) else self._unauthorized()
        if path == "/":
            return self._web("index.html")
        if path.startswith("/web/"):
            return self._web(path.removeprefix("/web/"))
        if path == "/sample.npy":
            return self._sample()
        if path != STREAM_PATH:
            return _respond(HTTPStatus.NOT_FOUND, f"no route {path}; the stream is at {STREAM_PATH}\n")
        if not self._authorized(request):
            return self._unauthorized()
        headers = request.headers
        if not origin_allowed(headers.get("Origin"), headers.get("Host"), self.config.allow_origins):
            self.metrics.errors[ErrorCode.FORBIDDEN_ORIGIN.value] += 1
            body = error_message(
                ErrorCode.FORBIDDEN_ORIGIN,
                f"Origin {headers.get('Origin')!r} may not use this server; start it with "
                "--allow-origin ORIGIN to allow a page elsewhere",
            )
            return _respond(HTTPStatus.FORBIDDEN, body, "application/json")
        if request.method == "HEAD":
            return _respond(HTTPStatus.BAD_REQUEST, "a WebSocket handshake is a GET\n")
        if not self.warm or self.shutting_down:
            why = "warming up" if not self.warm else "shutting down"
            return _respond(HTTPStatus.SERVICE_UNAVAILABLE, f"server is {why}; retry later\n")
        return None

    def _authorized(self, request: Request) -> bool:
        token = self.config.token
        if not token:
            return True
        return token_offered(token, request.headers.get("Authorization"), urlsplit_path(request.path)[1])

    def _unauthorized(self) -> Response:
        self.metrics.errors[ErrorCode.UNAUTHORIZED.value] += 1
        body = error_message(
            ErrorCode.UNAUTHORIZED,
            "missing or wrong token: send 'Authorization: Bearer TOKEN' or ?token=TOKEN",
        )
        return _respond(HTTPStatus.UNAUTHORIZED, body, "application/json", [("WWW-Authenticate", "Bearer")])

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` reports; ``status`` is ``ok`` only when a new stream would be admitted."""
        load = self.load()
        if self.shutting_down:
            status = "shutting_down"
        elif not self.warm:
            status = "warming_up"
        else:
            status = "full" if self.admission.full(load) else "ok"
        return {
            "status": status,
            "warm": self.warm,
            "codec": self.codec.to_json(),
            "connections": len(self._connections),
            "open_streams": load.open_streams,
            "capacity": self.admission.capacity,
            "capacity_source": self.admission.source,
            "capacity_probe": None if self.capacity_report is None else self.capacity_report.summary(),
            "voice": self.voice_name,
            "event_loop": running_loop_name(),
            **self._devices(),
        }

    def _devices(self) -> dict[str, Any]:
        """With several devices (``--devices``): each one's streams, slots and load; else nothing."""
        loads = getattr(self.decoder, "device_loads", None)
        if loads is None:
            return {}
        return {
            "devices": [
                {"device": d.device, "open_streams": d.open_streams, "capacity": d.capacity, "load": d.load}
                for d in loads()
            ]
        }

    def _healthz(self) -> Response:
        body = self.health()
        status = HTTPStatus.OK if body["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
        return _respond(status, json.dumps(body), "application/json")

    def _metrics(self) -> Response:
        text = self.metrics.render(
            self.decoder.stats,
            sample_rate=self.codec.sample_rate,
            hop_size=self.codec.hop_size,
            warm=self.warm,
            capacity=self.admission.capacity,
            handshaking=self._handshaking,
        )
        text += self.loop_lag.render() if self.loop_lag is not None else ""
        text += self.gc_pauses.render() if self.gc_pauses is not None else ""
        loads = getattr(self.decoder, "device_loads", None)
        text += render_device_loads(loads()) if loads is not None else ""
        return _respond(HTTPStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8")

    def _web(self, name: str) -> Response:
        """A file of the browser page; only plain names of the kinds in ``_WEB_TYPES`` (no paths)."""
        kind = _WEB_TYPES.get(name[name.rfind(".") :] if "." in name else "")
        file = resources.files(_WEB_PACKAGE).joinpath(name)
        if kind is None or "/" in name or name.startswith(".") or not file.is_file():
            return _respond(HTTPStatus.NOT_FOUND, f"no page file {name!r}\n")
        return _respond(HTTPStatus.OK, file.read_text(), kind)

    def _sample(self) -> Response:
        """The page's sample clip: seeded N(0, 1) latents ``[frames, latent_dim]`` as float32 ``.npy``."""
        return Response(200, "OK", *_binary(sample_npy(self.codec, SAMPLE_SECONDS, SAMPLE_SEED)))


def sample_latents(codec: CodecInfo, seconds: float, seed: int) -> np.ndarray:
    """The sample clip's latents: ``seconds`` of frames of seeded N(0, 1) values, float32."""
    frames = max(round(seconds * codec.sample_rate / codec.hop_size), 1)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(frames, codec.latent_dim, generator=gen).numpy()


def sample_npy(codec: CodecInfo, seconds: float, seed: int) -> bytes:
    out = io.BytesIO()
    np.save(out, sample_latents(codec, seconds, seed).astype("<f4"))
    return out.getvalue()


def _binary(data: bytes) -> tuple[Headers, bytes]:
    headers = Headers(
        [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(len(data))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
        ]
    )
    return headers, data


def _check_voice(voice: Voice, codec: CodecInfo) -> str:
    """The voice's name, once it is clear that the codec is its decoder; else a ConfigError saying so."""
    if voice.sample_rate != codec.sample_rate or voice.latent_dim != codec.latent_dim:
        raise ConfigError(
            f"voice {voice.name!r} makes {voice.latent_dim}-dim latents for {voice.sample_rate} Hz audio, but "
            f"the codec {codec.name!r} takes {codec.latent_dim}-dim latents at {codec.sample_rate} Hz: serve "
            "the voice's own decoder (`streamdec serve --voice NAME` loads it)"
        )
    return voice.name


def urlsplit_path(target: str) -> tuple[str, str]:
    """``(path, query)`` of a request target."""
    path, _, query = target.partition("?")
    return path, query


def _is_retry_on_closed_listener(context: dict[str, Any]) -> bool:
    """asyncio's accept() retry (scheduled when accept() hit EMFILE) firing after the listener closed: its
    socket has no descriptor any more, so the selector raises ValueError."""
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    if getattr(callback, "__name__", "") != "_start_serving" or not isinstance(
        context.get("exception"), ValueError
    ):
        return False
    return any(isinstance(arg, socket.socket) and arg.fileno() == -1 for arg in getattr(handle, "_args", ()))


def _client_address(ws: ServerConnection) -> str:
    address = ws.remote_address
    return str(address[0]) if address else "?"


def _counted_connection(server: StreamServer) -> type[ServerConnection]:
    """A ServerConnection that counts itself while in the opening handshake, and is dropped at accept
    when ``max_handshakes`` connections are already there (half-open clients cannot pile up)."""

    class CountedConnection(DirectMessages):
        _counted = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._counted = server.handshake_started()
            if not self._counted:
                assert isinstance(transport, asyncio.Transport)
                transport.abort()  # the handshake then ends at once: nothing was received

        async def handshake(self, *args: Any, **kwargs: Any) -> None:
            try:
                await super().handshake(*args, **kwargs)
            finally:
                if self._counted:
                    self._counted = False
                    server.handshake_ended()

    return CountedConnection


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
