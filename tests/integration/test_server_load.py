"""The server under abuse and load: random malformed frames, stalled listeners, keepalive while decoding."""

from __future__ import annotations

import json
import random
import socket
import struct
import time
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed

from streamdec.engine.simulated import simulated_engine
from streamdec.protocol import ErrorCode, decode_audio_samples, encode_latents, parse_audio
from support.server_support import (
    Received,
    clip,
    collect,
    offline,
    raw,
    ready,
    running_server,
    send_latents,
    start,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def malformed(rng: random.Random) -> str | bytes:
    """One frame from a mix of broken binary, broken JSON, and valid-looking messages with bad fields."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == 1:  # a latent header with random fields and a payload of random length and content
        n = rng.randrange(0, 12)
        payload = rng.randbytes(rng.choice([n * 256, rng.randrange(0, 3000)]))
        return struct.pack("<4sIII", b"SDLT", rng.randrange(4), rng.randrange(4), n) + payload
    if kind == 2:
        return "".join(rng.choice("{}[]:,\"' abc0123\\\n") for _ in range(rng.randrange(0, 30)))
    if kind == 3:
        return json.dumps(rng.choice([[], 1, "start", None, {"type": None}]))
    obj: dict[str, Any] = {"type": rng.choice(["start", "end", "cancel", "play", 3, None])}
    if rng.random() < 0.9:
        obj["stream"] = rng.choice([0, 1, 2, 3, -1, 2**32, 1.5, "1", None, True])
    if rng.random() < 0.5:
        obj["dtype"] = rng.choice(["float32", "float16", "bfloat16", "int8", 5])
    if rng.random() < 0.5:
        obj["format"] = rng.choice(["pcm_s16le", "pcm_f32le", "mp3"])
    return json.dumps(obj)


async def test_random_malformed_frames_neither_crash_nor_leak(codec: Any) -> None:
    """1,000 seeded random frames: every one answered or applied, the connection stays up, no stream leaks."""
    rng = random.Random(20261130)
    frames = [malformed(rng) for _ in range(1000)]
    # error_budget: this test is about parsing, not about closing a flood (tested on its own)
    async with running_server(
        codec, limits=_limits(max_streams=4, max_frames_per_message=8), error_budget=10**6
    ) as server:
        async with raw(server.url) as ws:
            await ready(ws)
            errors: list[dict[str, Any]] = []

            async def drain() -> None:
                async for msg in ws:
                    if isinstance(msg, str) and json.loads(msg)["type"] == "error":
                        errors.append(json.loads(msg))

            async with anyio.create_task_group() as tg:
                tg.start_soon(drain)
                for frame in frames:
                    await ws.send(frame)
                # every frame was read and handled (text frames here are ASCII: characters == bytes)
                await wait_until(lambda: server.metrics.bytes_in == sum(len(f) for f in frames))
                ending = {"bad_payload", "out_of_order", "non_finite"}  # latents reached a started stream
                await wait_until(lambda: len(errors) >= 500 and any(e["code"] in ending for e in errors))
                tg.cancel_scope.cancel()
            assert {e["code"] for e in errors} <= {c.value for c in ErrorCode}
            codes = {e["code"] for e in errors}
            assert {"bad_json", "bad_message", "unknown_stream"} <= codes
            for s in range(4):  # whatever the fuzz left open ends now
                await ws.send(json.dumps({"type": "cancel", "stream": s}))
            # the same connection still decodes exactly
            latents = clip(16, 1)
            await start(ws, 77, format="pcm_f32le")
            await send_latents(ws, 77, latents, chunk=8)
            await ws.send(json.dumps({"type": "end", "stream": 77}))
            audio: list[np.ndarray] = []
            while True:  # skip what the fuzzed streams still send; keep stream 77
                msg = await ws.recv()
                if isinstance(msg, bytes) and parse_audio(msg).stream == 77:
                    audio.append(decode_audio_samples(parse_audio(msg), "pcm_f32le", 1))
                elif (
                    isinstance(msg, str)
                    and json.loads(msg).get("stream") == 77
                    and json.loads(msg)["type"] == "done"
                ):
                    assert json.loads(msg)["status"] == "completed"
                    break
            np.testing.assert_allclose(
                np.concatenate(audio, axis=1), offline(codec, latents), atol=1e-4, rtol=0
            )
        await wait_until(lambda: server.open_streams == 0 and server.decoder.stats.open_streams == 0)
        async with raw(server.url) as other:  # and serves new connections
            await ready(other)


def _limits(**kw: int) -> Any:
    from streamdec.protocol import Limits

    return Limits(**kw)


async def _stalled_listener(server: Any, frames: int) -> Any:
    """A connection that starts a long f32 stream and reads nothing (a 4 KiB receive buffer, no pings)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    cm = raw(server.url, sock=sock, max_queue=1, ping_interval=None, close_timeout=1)
    ws = await cm.__aenter__()
    await ready(ws)
    await start(ws, 1, format="pcm_f32le")
    await send_latents(ws, 1, clip(frames, 9, server.codec.latent_dim), chunk=32)
    return cm, ws


async def _wait_stalled(server: Any) -> None:
    """Until the server has stopped sending and decoding: every bounded buffer on the path is full."""
    last = (-1, -1)
    with anyio.fail_after(60):
        while True:
            await anyio.sleep(0.5)
            now = (server.metrics.bytes_out, server.decoder.stats.frames)
            if now == last and now[0] > 0:
                return
            last = now


async def test_stalled_listener_is_closed_1013_and_freed(fast_codec: Any) -> None:
    """A listener that reads nothing for send_timeout gets overloaded + 1013; its stream is freed."""
    async with running_server(fast_codec, send_timeout=0.5, close_timeout=30, outbox=2, send_buffer=8192,
                              decoder={"max_emit": 8}) as server:  # fmt: skip
        cm, ws = await _stalled_listener(server, frames=2000)
        try:
            await wait_until(lambda: server.metrics.errors["overloaded"] == 1, timeout=60)
            await wait_until(lambda: server.open_streams == 0 and server.decoder.stats.open_streams == 0)
            seen: list[Any] = []
            with pytest.raises(ConnectionClosed) as info:
                async for msg in ws:
                    seen.append(msg)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1013
            last = json.loads(seen[-1])
            assert (last["type"], last["code"], last["stream"]) == ("error", "overloaded", None)
        finally:
            await cm.__aexit__(None, None, None)


async def test_stalled_listener_gets_1013_before_socket_buffers_hold_much(codec: Any) -> None:
    """Default socket buffers on both sides: a listener that reads nothing is closed with 1013 once its
    backlog stops draining, with at most 1 MiB (about 5 s of f32 audio) written for it, not megabytes."""
    engine = simulated_engine(codec, max_streams=2)  # audio as fast as the host path makes it
    async with running_server(codec, engine=engine, send_timeout=0.5, close_timeout=30) as server:
        cm = raw(server.url, max_queue=1, ping_interval=None, close_timeout=1)
        ws = await cm.__aenter__()
        try:
            await ready(ws)
            await start(ws, 1, format="pcm_f32le")
            await send_latents(ws, 1, clip(4000, 9, codec.latent_dim), chunk=32)  # 7.7 MB of f32 audio
            await wait_until(lambda: server.metrics.errors["overloaded"] == 1, timeout=60)
            assert server.metrics.bytes_out <= 1 << 20
            await wait_until(lambda: server.open_streams == 0)
        finally:
            await cm.__aexit__(None, None, None)


def _tile_latencies(rec: Received, sent_at: list[float], chunk: int, codec: Any, total: int) -> list[float]:
    """Per audio message: arrival minus the send time of the latent message that made it decodable."""
    out, right = [], codec.context_frames()[1]
    for arrived, start_sample, n in rec.arrivals:
        needed = min((start_sample + n) // codec.hop_size + right, total)  # frames the tile's window needs
        out.append(arrived - sent_at[(needed - 1) // chunk])
    return out


async def _paced_stream(url: str, latents: torch.Tensor, chunk: int, codec: Any) -> list[float]:
    """Send at real time and return each tile's latency."""
    rate = codec.sample_rate / codec.hop_size
    sent_at: list[float] = []
    async with raw(url) as ws:
        await ready(ws)
        await start(ws, 0)
        async with anyio.create_task_group() as tg:

            async def pace() -> None:
                t0 = time.monotonic()
                for i, begin in enumerate(range(0, len(latents), chunk)):
                    await anyio.sleep(max(0.0, t0 + (begin + chunk) / rate - time.monotonic()))
                    sent_at.append(time.monotonic())
                    await ws.send(encode_latents(0, i, latents[begin : begin + chunk]))
                await ws.send(json.dumps({"type": "end", "stream": 0}))

            tg.start_soon(pace)
            got, _ = await collect(ws, {0: "pcm_s16le"})
    return _tile_latencies(got[0], sent_at, chunk, codec, len(latents))


async def test_slow_reader_does_not_delay_another_connection(fast_codec: Any) -> None:
    """With a stalled listener connected, another connection's tile latency p99 grows by at most 50 ms."""
    latents = clip(300, 5, fast_codec.latent_dim)
    async with running_server(fast_codec, send_timeout=120, outbox=2, send_buffer=8192,
                              decoder={"max_emit": 8}) as server:  # fmt: skip
        baseline = await _paced_stream(server.url, latents, 4, fast_codec)
        received_before = server.metrics.bytes_in
        cm, _ = await _stalled_listener(server, frames=2000)
        try:
            await _wait_stalled(server)
            # decoding paused: the server read the listener's 2000 frames (so it still sees its control
            # frames) but decodes only as far as the listener reads
            assert server.metrics.bytes_in - received_before >= 2000 * fast_codec.latent_dim * 4
            assert server.decoder.stats.frames - len(latents) < 2000
            loaded = await _paced_stream(server.url, latents, 4, fast_codec)
            assert server.open_streams == 1  # the slow listener is still connected, still stalled
        finally:
            await cm.__aexit__(None, None, None)
    p99_base, p99_loaded = np.percentile(baseline, 99), np.percentile(loaded, 99)
    assert len(loaded) >= 30
    assert p99_loaded - p99_base <= 0.050, (p99_base, p99_loaded)


async def test_keepalive_pings_flow_while_decoding(codec: Any) -> None:
    """Server pings every 50 ms get their pongs during a long decode, and client pings are answered."""
    latents = clip(400, 3)
    async with running_server(codec, ping_interval=0.05, ping_timeout=2.0) as server:
        async with raw(server.url, ping_interval=None) as ws, anyio.create_task_group() as tg:
            await ready(ws)
            await start(ws, 0, format="pcm_f32le")
            rtts: list[float] = []

            async def ping_loop() -> None:
                while True:
                    with anyio.fail_after(2.0):
                        rtts.append(await (await ws.ping()))
                    await anyio.sleep(0.05)

            tg.start_soon(ping_loop)
            await send_latents(ws, 0, latents, chunk=20)
            await ws.send(json.dumps({"type": "end", "stream": 0}))
            got, _ = await collect(ws, {0: "pcm_f32le"})
            tg.cancel_scope.cancel()
            (conn,) = server._connections
            assert conn.ws.latency > 0  # the server's keepalive pings were answered
        assert len(rtts) >= 2
        np.testing.assert_allclose(got[0].audio, offline(codec, latents), atol=1e-4, rtol=0)
