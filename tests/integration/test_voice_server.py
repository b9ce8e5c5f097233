"""Text in over the websocket: a server with a voice speaks a start's text; one without says no_voice."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from streamdec.clients.client import connect
from streamdec.errors import ServerError
from streamdec.voice.cli import say, say_remote
from support.server_support import http, running_server, tiny_codec
from support.voice import codec, needs_espeak, voice

torch.set_num_threads(2)
TEXT = "What time is it?"


def voice_server(**config: object) -> object:
    """A real server on port 0 whose codec is the voice's decoder and whose voice speaks text."""
    return running_server(codec(), voice=voice(), **config)


@needs_espeak
async def test_text_over_the_websocket_gives_the_audio_of_say() -> None:
    """A start carrying text streams back what the library's say makes (float32 on the wire, 1e-5)."""
    local = await say(codec(), voice(), TEXT)
    async with voice_server() as server:
        remote, rate = await say_remote(server.url, TEXT)
    assert rate == 22050 and remote.shape == local.shape and local.shape[-1] > 22050 // 2
    torch.testing.assert_close(remote, local, atol=1e-5, rtol=0)


@needs_espeak
async def test_a_text_streams_done_counts_the_voices_frames() -> None:
    """done reports the frames the voice made; completed means samples == frames x hop."""
    async with voice_server() as server, connect(server.url) as conn:
        stream = await conn.open_stream(text=TEXT)
        samples = sum([frame.n_samples async for frame in stream])
    assert stream.done is not None and stream.done["status"] == "completed"
    assert stream.done["frames"] > 0 and samples == stream.done["samples"] == stream.done["frames"] * 256


async def test_ready_and_healthz_name_the_voice() -> None:
    """ready (minor >= 1) and /healthz say which voice speaks text; a latent-only server says null."""
    async with voice_server() as server, connect(server.url) as conn:
        health = json.loads((await http(server.port, "/healthz")).body)
        assert conn.ready["voice"] == health["voice"] == "piper-joe" and conn.ready["minor"] >= 1
    async with running_server(tiny_codec()) as server, connect(server.url) as conn:
        health = json.loads((await http(server.port, "/healthz")).body)
        assert conn.ready["voice"] is None and health["voice"] is None


def _unknown_phoneme(monkeypatch: pytest.MonkeyPatch) -> str:
    """The voice loses the phoneme 'ɪ' (as in "it"), so TEXT cannot be spoken."""
    monkeypatch.setattr(voice(), "id_map", {k: v for k, v in voice().id_map.items() if k != "ɪ"})
    return TEXT


@pytest.mark.parametrize(
    ("make_text", "names"),
    [
        (lambda _: "  ...  ", "nothing to say"),
        (lambda _: "x" * 2001, "2001 characters"),
        (_unknown_phoneme, r"U\+026A"),
    ],
    ids=["empty", "too-long", "unknown-phoneme"],
)
@needs_espeak  # the connection goes on with new text
async def test_text_the_voice_cannot_speak_ends_the_stream_with_bad_text(
    monkeypatch: pytest.MonkeyPatch, make_text: object, names: str
) -> None:
    """Empty, over-long or unspeakable text: error bad_text (saying why) for that stream, done error, no audio."""
    text = make_text(monkeypatch)  # type: ignore[operator]
    async with voice_server() as server, connect(server.url) as conn:
        stream = await conn.open_stream(text=text)
        with pytest.raises(ServerError, match=names) as caught:
            async for _ in stream:
                pytest.fail("audio for text that cannot be spoken")
        again = await conn.open_stream(text="Hello.")  # the connection goes on
        assert sum([f.n_samples async for f in again]) > 0
    assert caught.value.code == "bad_text" and caught.value.stream == stream.id
    assert stream.done is not None and stream.done["status"] == "error" and stream.done["samples"] == 0


async def test_text_to_a_server_without_a_voice_is_refused_with_no_voice() -> None:
    """A latent-only server refuses a text start with no_voice and the command that adds a voice; the
    stream never opened, so its id is free and a latent stream may use it."""
    async with running_server(tiny_codec()) as server, connect(server.url) as conn:
        with pytest.raises(ServerError, match="--voice piper-joe") as caught:
            await conn.open_stream(stream=3, text=TEXT)
        assert caught.value.code == "no_voice" and caught.value.stream == 3
        latents = await conn.open_stream(stream=3)
        await latents.send(torch.zeros(8, 64))
        await latents.end()
        assert sum([f.n_samples async for f in latents]) == 8 * tiny_codec().hop_size


async def test_a_text_stream_takes_no_latents_and_can_be_cancelled() -> None:
    """Latents sent on a text stream are refused (unknown_stream, nothing ends); cancel ends it."""
    async with voice_server() as server, connect(server.url) as conn:
        stream = await conn.open_stream(text="I would like a cup of coffee, please. What time is it?")
        await stream.send(np.zeros((4, 192), dtype=np.float32))
        await stream.cancel()
        async for _ in stream:
            pass
    assert stream.done is not None and stream.done["status"] == "cancelled"
    assert [e.code for e in stream.errors] == ["unknown_stream"]


@needs_espeak
async def test_say_command_through_a_server(tmp_path: Path) -> None:
    """`streamdec say TEXT OUT.wav --url ws://...` writes what the server spoke."""
    out = tmp_path / "remote.wav"
    async with voice_server() as server:
        url = server.url
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamdec", "say", TEXT, str(out), "--url", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(child.communicate(), timeout=240)
    assert child.returncode == 0, stderr.decode()
    assert f"from {url}" in stdout.decode()
    with wave.open(str(out)) as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
        assert f.getframerate() == 22050 and pcm.size > 22050 // 2 and np.abs(pcm).max() > 1000


async def test_say_command_names_a_server_without_a_voice(tmp_path: Path) -> None:
    """`say --url` to a latent-only server exits 2 with no_voice and the fix on one line."""
    async with running_server(tiny_codec()) as server:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamdec", "say", TEXT, str(tmp_path / "x.wav"), "--url", server.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(child.communicate(), timeout=240)
    assert child.returncode == 2
    assert "no_voice" in stderr.decode() and "--voice piper-joe" in stderr.decode()
    assert not (tmp_path / "x.wav").exists()


def _serve(*flags: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "streamdec", "serve", "--port", "0", "--max-streams-total", "2", *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STREAMDEC_TOKEN", None)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _url_of(proc: subprocess.Popen[str], lines: list[str]) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "ws://" in line:
            return "ws://" + line.split("ws://", 1)[1].split()[0]
    raise AssertionError(f"exited with {proc.wait()} before printing its URL: {''.join(lines)}")


@needs_espeak
async def test_serve_voice_command_speaks_text_as_the_library_does() -> None:
    """`streamdec serve --voice piper-joe` says so at start, names the voice in ready, and speaks text as
    `say` does in the library."""
    local = await say(codec(), voice(), TEXT)
    proc, lines = _serve("--voice", "piper-joe"), []
    try:
        url = await anyio.to_thread.run_sync(_url_of, proc, lines)
        async with connect(url) as conn:
            assert conn.ready["voice"] == "piper-joe" and conn.codec.name == "piper-joe"
        remote, _ = await say_remote(url, TEXT)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "voice 'piper-joe' speaks a start's text" in "".join(lines)
    assert "Traceback" not in "".join(lines) + out
    torch.testing.assert_close(remote, local, atol=1e-5, rtol=0)


def test_serve_voice_refuses_another_codec() -> None:
    """--voice serves the voice's own decoder: a different --codec is a usage error (exit 2, one line)."""
    done = subprocess.run(
        [sys.executable, "-m", "streamdec", "serve", "--voice", "piper-joe", "--codec", "vits-tiny"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "drop --codec vits-tiny" in done.stderr, done.stderr
