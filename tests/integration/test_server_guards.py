"""The server under load and attack: admission, keepalive under backpressure, cancellation, connection
hygiene, HTTP surface, error budget, stream accounting and shutdown. Real servers and clients on loopback."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import anyio
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

import streamdec
from streamdec.clients import connect
from streamdec.engine import create_engine
from streamdec.engine.simulated import SimulatedCost, simulated_engine
from streamdec.errors import ServerError
from streamdec.protocol import Limits
from streamdec.server import ServerConfig, StreamServer
from support.server_support import (
    RecordingEngine,
    clip,
    collect,
    http,
    next_json,
    offline,
    raw,
    ready,
    running_server,
    send_latents,
    start,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def codec(fast_codec: Any) -> Any:
    """Streams here must run ahead of real time on a CPU: the fast codec (dac-tiny)."""
    return fast_codec


async def closed_with(ws: Any) -> tuple[int | None, list[dict[str, Any]]]:
    """Read to the end: the close code received and every text message before it."""
    texts: list[dict[str, Any]] = []
    with contextlib.suppress(ConnectionClosed):  # iteration ends quietly on 1000, raises otherwise
        async for msg in ws:
            if isinstance(msg, str):
                texts.append(json.loads(msg))
    rcvd = ws.protocol.close_rcvd
    return (rcvd.code if rcvd else None), texts


# -- admission -------------------------------------------------------------------------------------


async def test_a_start_past_capacity_is_refused_with_a_retry_hint(codec: Any) -> None:
    """With max_streams_total=2 the third start gets over_capacity + retry_after_ms; a freed slot admits."""
    async with running_server(codec, max_streams_total=2, retry_after=0.25) as server, raw(server.url) as ws:
        await ready(ws)
        for s in (1, 2, 3):
            await start(ws, s)
        replies = [await next_json(ws) for _ in range(3)]
        assert replies[:2] == [{"type": "started", "stream": 1}, {"type": "started", "stream": 2}]
        assert {k: replies[2][k] for k in ("type", "code", "stream", "retry_after_ms")} == {
            "type": "error", "code": "over_capacity", "stream": 3, "retry_after_ms": 250,
        }  # fmt: skip
        health = await http(server.port, "/healthz")
        assert health.status == 503 and json.loads(health.body)["status"] == "full"
        await ws.send(json.dumps({"type": "cancel", "stream": 1}))
        assert (await next_json(ws))["type"] == "done"
        await start(ws, 3)  # the id was never opened: it is free, and so is a slot now
        assert await next_json(ws) == {"type": "started", "stream": 3}
        assert server.metrics.refused == 1


async def test_capacity_counts_streams_of_every_connection(codec: Any) -> None:
    """Admission is server-wide: a second connection is refused while the first holds the capacity."""
    async with (
        running_server(codec, max_streams_total=1) as server,
        raw(server.url) as a,
        raw(server.url) as b,
    ):
        await ready(a)
        await ready(b)
        await start(a, 0)
        assert (await next_json(a))["type"] == "started"
        await start(b, 0)
        assert (await next_json(b))["code"] == "over_capacity"


async def test_the_decoder_bound_is_never_exceeded(codec: Any) -> None:
    """StreamDecoder.max_streams, when the decoder has it, caps admission below --max-streams-total."""
    dec = streamdec.StreamDecoder(codec, mode="stateful", max_streams=1, max_emit=16)
    async with (
        dec,
        StreamServer(dec, ServerConfig(port=0, max_streams_total=8, probe_capacity=False)) as server,
    ):
        server.warm = True
        async with raw(server.url) as ws:
            await ready(ws)
            await start(ws, 0)
            await start(ws, 1)
            assert [(await next_json(ws)).get("code") for _ in range(2)] == [None, "over_capacity"]


async def test_warmup_measures_capacity_and_healthz_reports_it(codec: Any) -> None:
    """Without --max-streams-total, warm-up measures real-time streams; /healthz and /metrics show it.
    (A simulated device of 2 ms calls: a real codec's figure depends on how busy this machine is.)"""
    fast = simulated_engine(codec, cost=SimulatedCost(2.0, 0.0), max_streams=3)
    async with running_server(codec, engine=fast, probe_capacity=True) as server:
        health = json.loads((await http(server.port, "/healthz")).body)
        assert health["capacity_source"] == "measured" and health["capacity"] >= 1
        assert server.admission.capacity == health["capacity"]
        metrics = (await http(server.port, "/metrics")).body.decode()
        assert f"streamdec_capacity_streams {health['capacity']}" in metrics


# -- keepalive and flow control --------------------------------------------------------------------


async def test_a_slow_reader_with_a_fast_producer_keeps_its_connection(codec: Any) -> None:
    """A client producing at once and reading slower than real time for longer than the keepalive
    timeout: pings flow both ways, the producer is paused by max_buffered_frames, the audio is exact."""
    latents = clip(480, 21, codec.latent_dim)
    limits = Limits(max_frames_per_message=16, max_buffered_frames=64)
    async with running_server(codec, limits=limits, ping_interval=0.1, ping_timeout=1.0) as server:
        async with connect(server.url, ping_interval=0.1, ping_timeout=1.0) as conn:
            stream = await conn.open_stream(format="pcm_f32le")
            chunks: list[np.ndarray] = []
            async with anyio.create_task_group() as tg:

                async def produce() -> None:
                    await stream.send(latents)  # waits whenever 64 frames are ahead of the audio
                    await stream.end()

                tg.start_soon(produce)
                async for frame in stream:  # ~4 s of reading: well past the 1 s ping timeout
                    chunks.append(frame.samples)
                    await anyio.sleep(0.05)
            assert stream.done is not None and stream.done["status"] == "completed"
        assert server.metrics.errors.total() == 0
    np.testing.assert_allclose(np.concatenate(chunks, axis=1), offline(codec, latents), atol=1e-4, rtol=0)


async def test_latents_past_the_buffer_bound_end_only_that_stream(codec: Any) -> None:
    """A producer ignoring max_buffered_frames gets backlog_full on that stream; the connection lives."""
    limits = Limits(max_frames_per_message=32, max_buffered_frames=64)
    async with running_server(codec, limits=limits) as server, raw(server.url) as ws:
        assert (await ready(ws))["limits"]["max_buffered_frames"] == 64
        await start(ws, 1)
        await send_latents(ws, 1, clip(640, 2, codec.latent_dim), chunk=32)
        got, _ = await collect(ws, {1: "pcm_s16le"})
        # later messages of the ended stream get unknown_stream, before its done or after it
        codes = [e["code"] for e in got[1].errors]
        assert codes[0] == "backlog_full" and set(codes[1:]) <= {"unknown_stream"}
        assert got[1].done is not None and got[1].done["status"] == "error"
        assert got[1].done["frames"] < 640  # the refused messages are not counted
        await start(ws, 2)
        while (msg := await next_json(ws)).get("stream") == 1:  # echoes of stream 1's last messages
            assert msg["code"] == "unknown_stream"
        assert msg == {"type": "started", "stream": 2}


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancel_and_disconnect_stop_a_streams_decoding(codec: Any) -> None:
    """After cancel (done arrives) and after a dropped connection, no window of that stream is asked for."""
    engine = RecordingEngine(create_engine(codec))
    async with running_server(codec, engine=engine) as server:
        async with raw(server.url) as ws:
            await ready(ws)
            await start(ws, 1)
            await send_latents(ws, 1, clip(2000, 3, codec.latent_dim), chunk=100)
            await wait_until(lambda: len(engine.calls) >= 2)
            await ws.send(json.dumps({"type": "cancel", "stream": 1}))
            got, _ = await collect(ws, {1: "pcm_s16le"})
            assert got[1].done is not None and got[1].done["status"] == "cancelled"
            cancelled_id, calls_at_done = engine.calls[0], engine.calls.count(engine.calls[0])
        sock = socket.create_connection(("127.0.0.1", server.port))
        async with raw(server.url, sock=sock) as ws:
            await ready(ws)
            await start(ws, 1)
            await send_latents(ws, 1, clip(2000, 4, codec.latent_dim), chunk=100)
            await wait_until(lambda: len(set(engine.calls)) >= 2)
            dropped_id = engine.calls[-1]
            sock.shutdown(socket.SHUT_RDWR)  # the client vanishes without a close frame
            await wait_until(lambda: server.open_streams == 0 and server.decoder.stats.open_streams == 0)
            calls_at_drop = engine.calls.count(dropped_id)
        async with raw(server.url) as ws:  # more work afterwards: the engine only sees the new stream
            await ready(ws)
            await start(ws, 1)
            await send_latents(ws, 1, clip(200, 5, codec.latent_dim), chunk=100)
            await ws.send(json.dumps({"type": "end", "stream": 1}))
            await collect(ws, {1: "pcm_s16le"})
        assert engine.calls.count(cancelled_id) == calls_at_done
        assert engine.calls.count(dropped_id) == calls_at_drop
        assert server.metrics.streams == {"cancelled": 1, "lost": 1, "completed": 1}


# -- connection hygiene ----------------------------------------------------------------------------


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not(codec: Any) -> None:
    """No stream and no message for idle_timeout: idle_timeout error, close 1000; an open stream is kept."""
    async with running_server(codec, idle_timeout=0.3) as server, raw(server.url) as idle, \
            raw(server.url) as busy:  # fmt: skip
        await ready(idle)
        await ready(busy)
        await start(busy, 1)
        code, texts = await closed_with(idle)
        assert code == 1000 and [t.get("code") for t in texts] == ["idle_timeout"]
        await anyio.sleep(0.5)  # busy has an open stream: still connected
        await send_latents(busy, 1, clip(20, 1, codec.latent_dim), chunk=20)
        await busy.send(json.dumps({"type": "end", "stream": 1}))
        got, _ = await collect(busy, {1: "pcm_s16le"})
        assert got[1].done is not None and got[1].done["status"] == "completed"


async def test_connections_per_client_address_are_limited(codec: Any) -> None:
    """One connection past max_connections_per_client gets overloaded and close 1013."""
    async with running_server(codec, max_connections_per_client=2) as server, raw(server.url) as a, \
            raw(server.url) as b, raw(server.url) as c:  # fmt: skip
        await ready(a)
        await ready(b)
        code, texts = await closed_with(c)
        assert code == 1013 and texts[0]["code"] == "overloaded" and "per_client" in texts[0]["message"]


async def _recv_in_thread(sock: socket.socket) -> bytes:
    """A blocking recv off the event loop (the server runs on it), or ConnectionResetError's empty reply."""
    sock.settimeout(30)
    try:
        return bytes(await anyio.to_thread.run_sync(sock.recv, 1))
    except ConnectionResetError:
        return b""


async def test_half_open_handshakes_are_capped_and_timed_out(codec: Any) -> None:
    """Past max_handshakes, a new TCP connection is dropped at accept; silent ones go after open_timeout."""
    async with running_server(codec, max_handshakes=2, open_timeout=0.5) as server:
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        await wait_until(lambda: server._handshaking == 2)
        extra = socket.create_connection(("127.0.0.1", server.port))
        assert await _recv_in_thread(extra) == b""  # closed by the server before any byte
        assert server.metrics.handshakes_refused == 1
        for sock in silent:
            assert await _recv_in_thread(sock) == b""  # open_timeout passed: dropped
        async with raw(server.url) as ws:  # and the slots are free again
            await ready(ws)
        for sock in (*silent, extra):
            sock.close()


async def test_a_garbage_flood_spends_the_error_budget_then_1008(codec: Any) -> None:
    """More rejected messages than error_budget: too_many_errors and close 1008."""
    async with running_server(codec, error_budget=5, error_refill=0.0) as server, raw(server.url) as ws:
        await ready(ws)
        with contextlib.suppress(ConnectionClosed):  # sends after the server closed may fail
            for _ in range(20):
                await ws.send("{")
        code, texts = await closed_with(ws)
        assert code == 1008
        assert [t["code"] for t in texts] == ["bad_json"] * 6 + ["too_many_errors"]
        assert server.metrics.errors["too_many_errors"] == 1


# -- HTTP surface ----------------------------------------------------------------------------------


async def test_origin_allow_list(codec: Any) -> None:
    """A page elsewhere is refused 403 forbidden_origin; no Origin, the own page and listed ones connect."""
    async with running_server(codec, allow_origins=("https://app.example.com",)) as server:
        own = f"http://127.0.0.1:{server.port}"
        for origin in (None, own, "https://app.example.com"):
            async with raw(server.url, origin=origin) as ws:
                await ready(ws)
        with pytest.raises(InvalidStatus) as info:
            async with raw(server.url, origin="http://evil.example"):
                pass
        assert info.value.response.status_code == 403
        assert json.loads(info.value.response.body)["code"] == "forbidden_origin"


async def test_token_protects_metrics_and_healthz_unless_healthz_is_public(codec: Any) -> None:
    """With a token, /metrics and /healthz need it; public_healthz keeps /healthz open for probes."""
    async with running_server(codec, token="s3cret") as server:
        assert (await http(server.port, "/metrics")).status == 401
        assert (await http(server.port, "/healthz")).status == 401
        ok = await http(server.port, "/metrics", headers={"Authorization": "bearer s3cret"})
        assert ok.status == 200 and b"streamdec_warm 1" in ok.body
    async with running_server(codec, token="s3cret", public_healthz=True) as server:
        assert (await http(server.port, "/healthz")).status == 200
        assert (await http(server.port, "/metrics")).status == 401


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
async def test_only_get_and_head_are_served(codec: Any, method: str) -> None:
    """Any other method gets 405 with Allow: GET, HEAD; no response carries a Server banner."""
    async with running_server(codec) as server:
        reply = await http(server.port, "/healthz", method=method)
        assert reply.status == 405 and reply.headers["allow"] == "GET, HEAD"
        head = await http(server.port, "/healthz", method="HEAD")
        assert head.status == 200 and head.body == b"" and int(head.headers["content-length"]) > 0
        for response in (reply, head, await http(server.port, "/metrics")):
            assert "server" not in response.headers


# -- output and accounting -------------------------------------------------------------------------


async def test_latents_that_overflow_the_codec_get_non_finite_output(codec: Any) -> None:
    """Finite latents of 3e38 decode to NaN: error non_finite_output and done error, no audio."""
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        await start(ws, 1, format="pcm_f32le")
        await send_latents(ws, 1, clip(40, 1, codec.latent_dim).sign() * 3e38, chunk=40)
        await ws.send(json.dumps({"type": "end", "stream": 1}))
        got, _ = await collect(ws, {1: "pcm_f32le"})
        assert [e["code"] for e in got[1].errors] == ["non_finite_output"]
        assert got[1].done is not None and got[1].done["status"] == "error"
        assert np.isfinite(got[1].audio).all()
        assert server.metrics.streams["error"] == 1


async def test_the_server_checks_the_audio_of_a_decoder_that_allows_non_finite(codec: Any) -> None:
    """A decoder built with allow_non_finite=True (for its library users) still never puts NaN on the
    wire: the server's streams check their audio, and the error names the frames that overflowed."""
    async with running_server(codec, decoder={"allow_non_finite": True}) as server, raw(server.url) as ws:
        await ready(ws)
        await start(ws, 1, format="pcm_f32le")
        await send_latents(ws, 1, clip(40, 1, codec.latent_dim).sign() * 3e38, chunk=40)
        await ws.send(json.dumps({"type": "end", "stream": 1}))
        got, _ = await collect(ws, {1: "pcm_f32le"})
        (error,) = got[1].errors
        assert error["code"] == "non_finite_output" and error["stream"] == 1
        assert "decoded audio of frames 0.." in error["message"]
        assert got[1].done is not None and got[1].done["status"] == "error"
        assert got[1].audio.shape[1] == 0


# -- shutdown --------------------------------------------------------------------------------------


async def test_shutdown_answers_503_then_cuts_streams_with_done_then_1001(codec: Any) -> None:
    """During grace /healthz is 503; a stream still open at grace end gets shutting_down and done."""
    async with running_server(codec, grace=1.0) as server, raw(server.url) as ws:
        await ready(ws)
        await start(ws, 1)
        assert (await next_json(ws))["type"] == "started"
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.shutdown)
            await wait_until(lambda: server.shutting_down)
            health = await http(server.port, "/healthz")
            assert health.status == 503 and json.loads(health.body)["status"] == "shutting_down"
            code, texts = await closed_with(ws)
        assert code == 1001
        assert [(t["type"], t.get("code"), t.get("status")) for t in texts] == [
            ("error", "shutting_down", None),
            ("done", None, "error"),
        ]


async def test_every_stream_ends_in_exactly_one_status(codec: Any) -> None:
    """completed, cancelled, error and lost (a dropped connection) add up to the streams started."""
    async with running_server(codec) as server:
        async with raw(server.url) as ws:
            await ready(ws)
            for s in (1, 2, 3):
                await start(ws, s)
            await send_latents(ws, 1, clip(20, 1, codec.latent_dim), chunk=20)
            await ws.send(json.dumps({"type": "end", "stream": 1}))
            await ws.send(json.dumps({"type": "cancel", "stream": 2}))
            await ws.send(b"SDLT" + bytes(12) + b"x")  # stream 0 never started: not counted
            await send_latents(ws, 3, clip(2, 1, codec.latent_dim), chunk=1, first_seq=1)  # out_of_order
            await collect(ws, {1: "pcm_s16le", 2: "pcm_s16le", 3: "pcm_s16le"})
            await start(ws, 4)
            assert (await next_json(ws))["type"] == "started"
        await wait_until(lambda: server.open_streams == 0)
        assert server.metrics.streams == {"completed": 1, "cancelled": 1, "error": 1, "lost": 1}
        metrics = (await http(server.port, "/metrics")).body.decode()
        assert 'streamdec_streams_total{status="lost"} 1' in metrics


async def test_client_surfaces_over_capacity_with_its_retry_hint(codec: Any) -> None:
    """The reference client raises ServerError over_capacity carrying retry_after_ms."""
    async with (
        running_server(codec, max_streams_total=1, retry_after=2.0) as server,
        connect(server.url) as conn,
    ):
        await conn.open_stream()
        with pytest.raises(ServerError) as info:
            await conn.open_stream()
        assert (info.value.code, info.value.retry_after_ms) == ("over_capacity", 2000)
