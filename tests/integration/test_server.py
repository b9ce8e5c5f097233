"""The WebSocket server over real loopback connections: decoding, every error code, lifecycle."""

from __future__ import annotations

import json
import struct
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

from streamdec.io import pcm16
from streamdec.protocol import LATENT_HEADER, encode_latents
from streamdec.server.direct import DirectMessages
from support.server_support import (
    POISON,
    clip,
    collect,
    next_json,
    offline,
    raw,
    ready,
    running_server,
    send_latents,
    start,
)

pytestmark = pytest.mark.timeout(120)


async def run_stream(
    ws: Any, stream: int, latents: torch.Tensor, chunk: int, fmt: str, dtype: str = "float32"
) -> Any:
    await start(ws, stream, format=fmt, dtype=dtype)
    await send_latents(ws, stream, latents, chunk, dtype)
    await ws.send(json.dumps({"type": "end", "stream": stream}))


# -- decoding ----------------------------------------------------------------------------------------


async def test_ready_describes_codec_and_limits(codec: Any) -> None:
    """The first message is ready with protocol 1, the codec geometry and the limits."""
    async with running_server(codec, limits=_limits(max_streams=3)) as server, raw(server.url) as ws:
        msg = await ready(ws)
    left, right = codec.context_frames()
    assert msg["protocol"] == 1
    assert msg["codec"] == {"name": codec.name, "latent_dim": 64, "hop_size": 480, "sample_rate": 24000,
                            "channels": 1, "context": [left, right]}  # fmt: skip
    assert msg["limits"]["max_streams"] == 3
    assert (
        msg["limits"]["max_message_bytes"]
        >= LATENT_HEADER.size + msg["limits"]["max_frames_per_message"] * 256
    )


def _limits(**kw: int) -> Any:
    from streamdec.protocol import Limits

    return Limits(**kw)


async def test_concurrent_streams_on_several_connections_decode_exactly(codec: Any) -> None:
    """Three connections x two interleaved streams: gap-free audio equal to offline decode (f32 and s16)."""
    clips = {(c, s): clip(37 + 11 * c + 5 * s, seed=10 * c + s) for c in range(3) for s in range(2)}
    fmts = {0: "pcm_f32le", 1: "pcm_s16le"}
    results: dict[tuple[int, int], Any] = {}

    async def one_connection(url: str, c: int) -> None:
        async with raw(url) as ws:
            await ready(ws)
            for s in (0, 1):
                await start(ws, s, format=fmts[s])
            seqs = [0, 0]
            for begin in range(0, 100, 3 + c):  # interleave the two streams' messages
                for s in (0, 1):
                    part = clips[c, s][begin : begin + 3 + c]
                    if len(part):
                        await ws.send(encode_latents(s, seqs[s], part))
                        seqs[s] += 1
            for s in (0, 1):
                await ws.send(json.dumps({"type": "end", "stream": s}))
            got, other = await collect(ws, fmts)
            assert other == []
            for s in (0, 1):
                results[c, s] = got[s]

    async with running_server(codec) as server, anyio.create_task_group() as tg:
        for c in range(3):
            tg.start_soon(one_connection, server.url, c)
    for (c, s), latents in clips.items():
        rec, ref = results[c, s], offline(codec, latents)
        assert rec.started and rec.errors == []
        assert rec.done == {"type": "done", "stream": s, "status": "completed", "frames": len(latents),
                            "samples": len(latents) * 480}  # fmt: skip
        assert rec.audio.shape == ref.shape
        if fmts[s] == "pcm_f32le":
            np.testing.assert_allclose(rec.audio, ref, atol=1e-4, rtol=0)
        else:
            expected = np.frombuffer(pcm16(torch.from_numpy(ref)), "<i2").astype(np.float32)[None] / 32767
            # the server's s16 is computed from its float audio, itself within 1e-4 of offline
            assert np.abs(rec.audio - expected).max() <= (1e-4 * 32767 + 1) / 32767


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_half_precision_latents_decode(codec: Any, dtype: str) -> None:
    """float16 / bfloat16 payloads decode to the offline decode of the same rounded latents."""
    latents = clip(40, seed=3).to(getattr(torch, dtype))
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        await run_stream(ws, 5, latents, chunk=7, fmt="pcm_f32le", dtype=dtype)
        got, _ = await collect(ws, {5: "pcm_f32le"})
    np.testing.assert_allclose(got[5].audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_fragmented_and_whole_messages_keep_their_order(codec: Any) -> None:
    """Whole messages are handled as websockets parses them, fragmented ones go through its queue: a
    fragmented start, latents sent whole right behind it, a fragmented latent message and a fragmented end
    still decode in the order sent, equal to the offline decode."""
    latents = clip(30, seed=4)
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        start_text = json.dumps({"type": "start", "stream": 2, "format": "pcm_f32le"})
        await ws.send([start_text[:10], start_text[10:]])  # one message in two frames
        for seq, begin in enumerate(range(0, 20, 4)):
            await ws.send(encode_latents(2, seq, latents[begin : begin + 4]))
        tail = encode_latents(2, 5, latents[20:])
        await ws.send([tail[:100], tail[100:]])
        end_text = json.dumps({"type": "end", "stream": 2})
        await ws.send([end_text[:5], end_text[5:]])
        got, other = await collect(ws, {2: "pcm_f32le"})
    assert other == [] and got[2].errors == []
    np.testing.assert_allclose(got[2].audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_accepted_connections_hand_whole_messages_to_their_handler(codec: Any) -> None:
    """A connection StreamServer accepts is a DirectMessages whose handler is its Connection's: a whole
    message goes there from inside data_received, a fragmented one does not."""
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        (conn,) = server._connections
        assert isinstance(conn.ws, DirectMessages)
        handler = conn.ws.on_message
        assert handler == conn._on_direct_message
        handed: list[str | bytes] = []

        def recording(message: str | bytes) -> None:
            handed.append(message)
            handler(message)

        conn.ws.on_message = recording
        whole = json.dumps({"type": "start", "stream": 1})
        await ws.send(whole)
        assert (await next_json(ws))["type"] == "started"
        end = json.dumps({"type": "end", "stream": 1})
        await ws.send([end[:5], end[5:]])
        assert (await next_json(ws))["type"] == "done"
        assert handed == [whole]


async def test_text_that_is_not_utf8_closes_1007(codec: Any) -> None:
    """A text frame that is not UTF-8 is websockets' to refuse, as before messages were handled inline."""
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        ws.protocol.send_frame(Frame(Opcode.TEXT, b'{"type": "\xff"}'))
        ws.send_data()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007


async def test_stream_ids_are_reusable_after_done(codec: Any) -> None:
    """After done a stream id may start again; the new stream's seq restarts at 0."""
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        for seed in (1, 2):
            latents = clip(12, seed)
            await run_stream(ws, 9, latents, chunk=5, fmt="pcm_f32le")
            got, _ = await collect(ws, {9: "pcm_f32le"})
            np.testing.assert_allclose(got[9].audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_cancel_stops_the_stream(codec: Any) -> None:
    """cancel: done with status cancelled, the stream freed; another stream keeps going."""
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        await start(ws, 1)
        await start(ws, 2, format="pcm_f32le")
        await send_latents(ws, 1, clip(30, 1), chunk=10)
        await ws.send(json.dumps({"type": "cancel", "stream": 1}))
        latents = clip(20, 2)
        await send_latents(ws, 2, latents, chunk=10)
        await ws.send(json.dumps({"type": "end", "stream": 2}))
        got, _ = await collect(ws, {1: "pcm_s16le", 2: "pcm_f32le"})
        assert got[1].done is not None and got[1].done["status"] == "cancelled"
        assert got[1].done["samples"] == got[1].audio.shape[1]
        np.testing.assert_allclose(got[2].audio, offline(codec, latents), atol=1e-4, rtol=0)
        assert server.open_streams == 0 and server.decoder.stats.open_streams == 0


# -- error codes ---------------------------------------------------------------------------------------


def _latent(stream: int, seq: int, n_frames: int, payload: bytes) -> bytes:
    return struct.pack("<4sIII", b"SDLT", stream, seq, n_frames) + payload


ZERO = b"\0" * 256  # one float32 frame


# (id, messages sent after starting stream 1 as float32, expected code, expected stream, stream ends?)
_CASES: list[tuple[str, list[str | bytes], str, int | None, bool]] = [
    ("bad_json", ["{nope"], "bad_json", None, False),
    ("bad_message-type", ['{"type":"play","stream":1}'], "bad_message", None, False),
    ("bad_message-magic", [b"RIFF" + bytes(12)], "bad_message", None, False),
    ("bad_message-short", [b"SDLT"], "bad_message", None, False),
    ("bad_message-dtype", ['{"type":"start","stream":2,"dtype":"int8"}'], "bad_message", 2, False),
    ("unknown_stream", [_latent(7, 0, 1, ZERO)], "unknown_stream", 7, False),
    ("duplicate_stream", ['{"type":"start","stream":1}'], "duplicate_stream", 1, False),
    (
        "too_many_streams",
        ['{"type":"start","stream":2}', '{"type":"start","stream":3}'],
        "too_many_streams",
        3,
        False,
    ),
    ("bad_payload", [_latent(1, 0, 2, ZERO)], "bad_payload", 1, True),
    ("out_of_order", [_latent(1, 1, 1, ZERO)], "out_of_order", 1, True),
    ("non_finite", [_latent(1, 0, 1, struct.pack("<f", float("nan")) * 64)], "non_finite", 1, True),
    ("too_large", [_latent(1, 0, 9, ZERO * 9)], "too_large", 1, True),
    (
        "internal",
        [_latent(1, 0, 1, struct.pack("<f", POISON) * 64), '{"type":"end","stream":1}'],
        "internal",
        1,
        True,
    ),
]


@pytest.mark.parametrize(
    ("messages", "code", "stream", "ends"), [c[1:] for c in _CASES], ids=[c[0] for c in _CASES]
)
async def test_each_error_code_from_its_input(
    codec: Any, messages: list[str | bytes], code: str, stream: int | None, ends: bool
) -> None:
    """The input causes its code; a stream-ending code is followed by done(error); other connections live on."""
    limits = _limits(max_streams=2, max_frames_per_message=8)
    async with running_server(codec, failing=True, limits=limits) as server, raw(server.url) as ws, \
            raw(server.url) as bystander:  # fmt: skip
        await ready(ws)
        await ready(bystander)
        await start(ws, 1)
        assert await next_json(ws) == {"type": "started", "stream": 1}
        for m in messages:
            await ws.send(m)
        msg = await next_json(ws)
        while msg["type"] == "started":
            msg = await next_json(ws)
        assert (msg["type"], msg["code"], msg["stream"]) == ("error", code, stream), msg
        assert msg["message"]
        if ends:  # frames: latents the server accepted before the error (the bad message itself when valid)
            done = await next_json(ws)
            accepted = 1 if code == "internal" else 0  # a refused message is never counted
            assert done == {"type": "done", "stream": 1, "status": "error", "frames": accepted, "samples": 0}
        else:  # stream 1 still works
            latents = clip(9, 0)
            await send_latents(ws, 1, latents, chunk=8)
            await ws.send(json.dumps({"type": "end", "stream": 1}))
            got, _ = await collect(ws, {1: "pcm_s16le"}, until_done={1})
            assert got[1].done is not None and got[1].done["status"] == "completed"
        latents = clip(10, 4)
        await run_stream(bystander, 0, latents, chunk=4, fmt="pcm_f32le")
        got, _ = await collect(bystander, {0: "pcm_f32le"})
        np.testing.assert_allclose(got[0].audio, offline(codec, latents), atol=1e-4, rtol=0)
        assert server.metrics.errors[code] == 1


async def test_message_over_max_message_bytes_closes_1009(codec: Any) -> None:
    """A message larger than max_message_bytes closes the connection with 1009; others are unaffected."""
    async with running_server(codec) as server, raw(server.url) as ws:
        limit = (await ready(ws))["limits"]["max_message_bytes"]
        await ws.send(b"SDLT" + bytes(limit))
        with pytest.raises(ConnectionClosed) as info:
            while True:
                await ws.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        async with raw(server.url) as other:
            await ready(other)


async def test_too_many_connections_is_overloaded_1013(codec: Any) -> None:
    """Past max_connections a client gets error overloaded and close 1013; the first keeps working."""
    async with running_server(codec, max_connections=1) as server, raw(server.url) as first:
        await ready(first)
        async with raw(server.url) as second:
            msg = await next_json(second)
            assert (msg["type"], msg["code"], msg["stream"]) == ("error", "overloaded", None)
            with pytest.raises(ConnectionClosed) as info:
                await second.recv()
            assert info.value.rcvd is not None and info.value.rcvd.code == 1013
        latents = clip(6, 1)
        await run_stream(first, 0, latents, chunk=6, fmt="pcm_f32le")
        got, _ = await collect(first, {0: "pcm_f32le"})
        np.testing.assert_allclose(got[0].audio, offline(codec, latents), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/stream", None, 401),
        ("/v1/stream?token=wrong", None, 401),
        ("/v1/stream", {"Authorization": "Bearer wrong"}, 401),
        ("/v1/stream?token=s3cret", None, 101),
        ("/v1/stream", {"Authorization": "Bearer s3cret"}, 101),
    ],
    ids=["none", "wrong-query", "wrong-header", "query", "header"],
)
async def test_token_is_required_when_configured(
    codec: Any, path: str, headers: dict[str, str] | None, status: int
) -> None:
    """With a token, handshakes need it (header or ?token=); others get HTTP 401 with an unauthorized body."""
    async with running_server(codec, token="s3cret") as server:
        url = f"ws://127.0.0.1:{server.port}{path}"
        if status == 401:
            with pytest.raises(InvalidStatus) as info:
                async with raw(url, additional_headers=headers):
                    pass
            response = info.value.response
            assert response.status_code == 401
            assert json.loads(response.body)["code"] == "unauthorized"
        else:
            async with raw(url, additional_headers=headers) as ws:
                await ready(ws)


# -- lifecycle -------------------------------------------------------------------------------------------


async def test_disconnect_mid_stream_frees_the_stream(codec: Any) -> None:
    """A client that drops mid-stream leaves no open stream behind."""
    async with running_server(codec) as server:
        async with raw(server.url) as ws:
            await ready(ws)
            await start(ws, 1)
            await start(ws, 2)
            await send_latents(ws, 1, clip(200, 1), chunk=20)
            await ws.recv()  # something was decoded
        # The handler frees its streams, then returns and leaves the connection count: wait for both.
        with anyio.fail_after(10):
            while server.open_streams or server.decoder.stats.open_streams or server.metrics.connections:
                await anyio.sleep(0.01)
        assert server.open_streams == 0 and server.decoder.stats.open_streams == 0
        assert server.metrics.connections == 0


async def test_shutdown_finishes_in_flight_streams_then_sends_1001(codec: Any) -> None:
    """Shutdown: no new streams (overloaded), in-flight ones complete, then close 1001."""
    latents = clip(60, 7)
    # A grace far above the decode time on a loaded CPU: the stream must complete, not be cut.
    async with (
        running_server(codec, grace=120) as server,
        raw(server.url) as ws,
        anyio.create_task_group() as tg,
    ):
        await ready(ws)
        await start(ws, 1, format="pcm_f32le")
        assert await next_json(ws) == {"type": "started", "stream": 1}  # in flight before shutdown begins
        await send_latents(ws, 1, latents[:30], chunk=10)
        tg.start_soon(server.shutdown)
        with anyio.fail_after(5):
            while not server.shutting_down:
                await anyio.sleep(0.01)
        await start(ws, 2)
        await send_latents(ws, 1, latents[30:], chunk=10, first_seq=3)
        await ws.send(json.dumps({"type": "end", "stream": 1}))
        got, other = await collect(ws, {1: "pcm_f32le"})
        assert got[1].done is not None and got[1].done["status"] == "completed", got[1].errors
        assert [(o["code"], o["stream"]) for o in other] == [("overloaded", 2)]
        np.testing.assert_allclose(got[1].audio, offline(codec, latents), atol=1e-4, rtol=0)
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001


async def test_shutdown_grace_period_bounds_a_stream_that_never_ends(codec: Any) -> None:
    """A stream that never ends is cut after the grace period with 1001, and freed."""
    async with running_server(codec, grace=0.3) as server, raw(server.url) as ws:
        await ready(ws)
        await start(ws, 1)
        await send_latents(ws, 1, clip(10, 1), chunk=10)
        with anyio.fail_after(10):
            await server.shutdown()
        with pytest.raises(ConnectionClosed) as info:
            while True:
                await ws.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        assert server.decoder.stats.open_streams == 0


# -- HTTP ------------------------------------------------------------------------------------------------


async def _http_get(port: int, path: str) -> tuple[int, str, str]:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        with anyio.fail_after(5):
            while True:
                try:
                    data += await stream.receive()
                except anyio.EndOfStream:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    ctype = next((v for k, _, v in (h.partition(": ") for h in lines[1:]) if k.lower() == "content-type"), "")
    return int(lines[0].split()[1]), ctype, body.decode()


async def test_healthz_is_503_until_warm_then_200(codec: Any) -> None:
    """healthz answers 503 before warm-up, and handshakes are refused; 200 with JSON afterwards."""
    async with running_server(codec, warm=False) as server:
        status, _, body = await _http_get(server.port, "/healthz")
        assert status == 503 and json.loads(body)["status"] == "warming_up"
        with pytest.raises(InvalidStatus):
            async with raw(server.url):
                pass
        await server.warmup()
        status, ctype, body = await _http_get(server.port, "/healthz")
        assert status == 200 and ctype == "application/json"
        assert json.loads(body)["status"] == "ok"


async def test_metrics_and_index(codec: Any) -> None:
    """/metrics is Prometheus text with the documented families; / is an HTML page; others 404."""
    async with running_server(codec) as server:
        async with raw(server.url) as ws:
            await ready(ws)
            await run_stream(ws, 0, clip(20, 1), chunk=5, fmt="pcm_s16le")
            await collect(ws, {0: "pcm_s16le"})
            await ws.send("{")
            await next_json(ws)
            status, ctype, text = await _http_get(server.port, "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        assert values["streamdec_connections"] == "1"
        assert values['streamdec_errors_total{code="bad_json"}'] == "1"
        assert values['streamdec_streams_total{status="completed"}'] == "1"
        assert values["streamdec_time_to_first_audio_seconds_count"] == "1"
        assert float(values["streamdec_window_decode_seconds_count"]) > 0
        assert float(values["streamdec_received_bytes_total"]) > 20 * 256
        assert float(values["streamdec_sent_bytes_total"]) > 20 * 480 * 2
        assert abs(float(values["streamdec_audio_seconds_total"]) - 20 * 480 / 24000) < 1e-6
        assert "streamdec_realtime_factor" in values and "streamdec_open_streams" in values
        assert 'streamdec_gc_collections_total{generation="2"}' in values
        assert 'streamdec_gc_pause_max_seconds{generation="0"}' in values
        status, ctype, body = await _http_get(server.port, "/")
        assert status == 200 and ctype.startswith("text/html") and "/v1/stream" in body
        assert (await _http_get(server.port, "/nope"))[0] == 404
