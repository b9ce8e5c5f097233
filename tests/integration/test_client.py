"""The Python client, ``streamdec stream`` and ``streamdec serve`` against real servers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import wave
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed

import streamdec
from streamdec.clients import connect
from streamdec.clients.cli import Playback, configure_stream, run_stream
from streamdec.errors import ServerError
from streamdec.io import pcm16
from support.server_support import offline, raw, ready, running_server, send_latents, serve_command, start

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def codec() -> Any:
    return streamdec.load_codec("dac-tiny", device="cpu")


def clip(codec: Any, frames: int, seed: int) -> torch.Tensor:
    return torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(seed))


async def test_client_streams_two_streams_exactly(codec: Any) -> None:
    """connect / open_stream / send / end / async for: two streams on one connection equal offline decode."""
    a, b = clip(codec, 50, 1), clip(codec, 23, 2)
    limits = _limits(max_frames_per_message=16)
    async with running_server(codec, limits=limits) as server, connect(server.url) as conn:
        assert conn.codec.latent_dim == codec.latent_dim and conn.limits.max_frames_per_message == 16
        s1 = await conn.open_stream(format="pcm_f32le")
        s2 = await conn.open_stream(format="pcm_f32le", dtype="bfloat16")
        assert (s1.id, s2.id) == (0, 1)
        out: dict[int, list[np.ndarray]] = {0: [], 1: []}

        async def consume(stream: Any) -> None:
            async for frame in stream:
                out[stream.id].append(frame.samples)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, s1)
            tg.start_soon(consume, s2)
            await s1.send(a)  # 50 frames: split into messages of at most 16
            await s2.send(b)
            await s1.end()
            await s2.end()
        assert s1.done is not None and s1.done["status"] == "completed"
    np.testing.assert_allclose(np.concatenate(out[0], axis=1), offline(codec, a), atol=1e-4, rtol=0)
    ref_b = offline(codec, b.to(torch.bfloat16))
    np.testing.assert_allclose(np.concatenate(out[1], axis=1), ref_b, atol=1e-4, rtol=0)


def _limits(**kw: int) -> Any:
    from streamdec.protocol import Limits

    return Limits(**kw)


async def test_client_raises_server_errors(codec: Any) -> None:
    """A refused start and a stream ending in error raise ServerError with the server's code."""
    async with running_server(codec, limits=_limits(max_streams=1)) as server, connect(server.url) as conn:
        stream = await conn.open_stream()
        with pytest.raises(ServerError) as refused:
            await conn.open_stream()
        assert refused.value.code == "too_many_streams"
        await stream.send(torch.full((3, codec.latent_dim), float("nan")))
        with pytest.raises(ServerError) as failed:
            async for _ in stream:
                pass
        assert (failed.value.code, failed.value.stream) == ("non_finite", stream.id)
        assert stream.done is not None and stream.done["status"] == "error"


async def test_client_sends_the_token(codec: Any) -> None:
    """connect(token=...) passes auth; without it the handshake fails with 401."""
    async with running_server(codec, token="t0k") as server:
        async with connect(server.url, token="t0k") as conn:
            assert conn.ready["protocol"] == 1
        with pytest.raises(Exception, match="401"):
            async with connect(server.url):
                pass


def test_playback_counts_underruns() -> None:
    """A listener starting at first audio underruns whenever received audio < elapsed wall time."""
    play = Playback(sample_rate=1000)
    play.on_audio(10.0, 500)  # starts playing: 0.5 s buffered
    play.on_audio(10.4, 100)  # 0.4 s elapsed < 0.5 s received: fine
    play.on_audio(10.7, 100)  # 0.7 s elapsed > 0.6 s received: underrun
    play.on_audio(10.75, 100)  # still starved (0.75 > 0.7): same underrun
    play.on_audio(10.76, 500)  # 0.76 < 0.8: recovered
    play.on_audio(12.0, 100)  # 2.0 > 1.3: second underrun
    assert play.underruns == 2
    assert play.worst_deficit == pytest.approx(0.7)


def test_playback_prebuffer_delays_the_start() -> None:
    """With a prebuffer the listener starts that much later: the same arrivals underrun less."""
    play = Playback(sample_rate=1000, prebuffer=0.2)
    play.on_audio(10.0, 100)  # first audio; playing starts at 10.2
    play.on_audio(10.25, 100)  # 0.05 s played < 0.1 s received: fine (without the prebuffer: starved)
    play.on_audio(10.45, 100)  # 0.25 s played > 0.2 s received: underrun
    assert play.underruns == 1
    assert play.worst_deficit == pytest.approx(0.05)


@pytest.mark.parametrize("fmt", ["pcm_s16le", "pcm_f32le"])
async def test_stream_command_writes_the_wav(codec: Any, tmp_path: Path, fmt: str, capsys: Any) -> None:
    """`streamdec stream IN --url URL OUT.wav` writes the decoded audio and prints the three figures."""
    latents = clip(codec, 40, 3)
    np.save(tmp_path / "in.npy", latents.numpy()[None])
    parser = argparse.ArgumentParser()
    configure_stream(parser)
    async with running_server(codec) as server:
        args = parser.parse_args([str(tmp_path / "in.npy"), "--url", server.url, str(tmp_path / "out.wav"),
                                  "--chunk", "7", "--format", fmt, "--realtime"])  # fmt: skip
        assert await anyio.to_thread.run_sync(run_stream, args) == 0
    text = capsys.readouterr().out
    assert "time to first audio" in text and "real-time factor" in text and "underruns" in text
    ref = offline(codec, latents)
    if fmt == "pcm_s16le":
        with wave.open(str(tmp_path / "out.wav")) as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, codec.sample_rate)
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
        expected = np.frombuffer(pcm16(torch.from_numpy(ref)), "<i2")
        assert pcm.shape == expected.shape and np.abs(pcm.astype(int) - expected).max() <= 4
    else:
        data = (tmp_path / "out.wav").read_bytes()
        assert data[20:22] == b"\x03\x00"  # WAVE_FORMAT_IEEE_FLOAT
        pcm = np.frombuffer(data[data.index(b"data") + 8 :], "<f4")
        np.testing.assert_allclose(pcm, ref[0], atol=1e-4, rtol=0)


def test_serve_refuses_an_unknown_precision() -> None:
    proc = _serve("--precision", "bf16")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'bf16'" in out and "tf32x3" in out


def _serve(*extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STREAMDEC_TOKEN", None)
    # A known capacity (no warm-up probe): what dac-tiny measures follows this machine's load.
    cmd = serve_command("dac-tiny", "--max-streams-total", "4", *extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


async def _url_of(proc: subprocess.Popen[str]) -> str:
    def read() -> str:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ws://" in line:
                return line.split("ws://", 1)[1].split()[0]
        raise AssertionError(f"serve exited with {proc.wait()} before printing its URL")

    return "ws://" + await anyio.to_thread.run_sync(read)


async def test_serve_prints_url_and_sigterm_finishes_streams_then_1001(codec: Any) -> None:
    """`streamdec serve --port 0` prints ws://H:P/v1/stream; SIGTERM finishes the stream, closes 1001, exits 0.

    ``--precision tf32x3`` is accepted; on the CPU it computes float32, so the audio still equals offline.
    """
    proc = _serve("--grace", "20", "--precision", "tf32x3")
    try:
        url = await _url_of(proc)
        assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1/stream") and ":0/" not in url
        latents = clip(codec, 30, 4)
        async with raw(url) as ws:
            await ready(ws)
            await start(ws, 1, format="pcm_f32le")
            assert json.loads(await ws.recv())["type"] == "started"
            await send_latents(ws, 1, latents[:10], chunk=10)
            proc.send_signal(signal.SIGTERM)
            await anyio.sleep(0.3)
            await send_latents(ws, 1, latents[10:], chunk=10, first_seq=1)
            await ws.send(json.dumps({"type": "end", "stream": 1}))
            audio, done = [], None
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    msg = await ws.recv()
                    if isinstance(msg, bytes):
                        audio.append(np.frombuffer(msg[24:], "<f4"))
                    elif json.loads(msg)["type"] == "done":
                        done = json.loads(msg)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        assert done is not None and done["status"] == "completed"
        np.testing.assert_allclose(np.concatenate(audio), offline(codec, latents)[0], atol=1e-4, rtol=0)
        assert await anyio.to_thread.run_sync(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize(("flag", "value"), [("--chunk", "0"), ("--prebuffer-ms", "-5")])
def test_stream_command_refuses_bad_numbers(tmp_path: Path, flag: str, value: str, capsys: Any) -> None:
    """Bad numeric options exit with status 2 and say why, before anything is read or sent."""
    from streamdec.cli import main

    argv = ["stream", str(tmp_path / "missing.npy"), "--url", "ws://127.0.0.1:1/v1/stream",
            str(tmp_path / "out.wav"), flag, value]  # fmt: skip
    assert main(argv) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "out.wav").exists()
