"""Opus through the Python client, on loopback: decoded to float32 at the codec's rate, in step with and as
long as the PCM stream; speech keeps >= 20 dB SNR against the PCM decode at <= 1/5 of its bytes."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from streamdec.audio.libopus import libopus_available
from streamdec.clients import connect
from streamdec.clients.cli import configure_stream, run_stream
from streamdec.errors import ConfigError
from streamdec.protocol import CodecInfo, Limits, OpusInfo, Ready
from support.opus import lag, receive
from support.server_support import clip, running_server, serve_command, tiny_codec

pytestmark = pytest.mark.skipif(
    not libopus_available(), reason="needs the system's libopus: apt-get install libopus0"
)

FRAMES = 100  # 2 s of the tiny codec


async def test_opus_decodes_in_step_with_the_pcm_stream_and_as_long() -> None:
    """Tiny codec (24 kHz, no resampling): exactly done.samples samples, best aligned at lag 0."""
    latents = clip(FRAMES, seed=7)
    async with running_server(tiny_codec()) as server:
        opus, opus_bytes = await receive(server.url, "opus", latents=latents)
        pcm, pcm_bytes = await receive(server.url, "pcm_f32le", latents=latents)
    assert len(opus) == len(pcm) == FRAMES * 480
    assert lag(pcm, opus) == 0
    assert opus_bytes <= pcm_bytes / 2 / 5  # against pcm_s16le, half of pcm_f32le


async def test_ready_announces_the_wire_rate_and_the_bitrate_it_keeps() -> None:
    """--opus-bitrate 24000: ready.opus says so, and the stream's bytes are 3 kB/s plus its framing."""
    latents = clip(FRAMES, seed=3)
    async with running_server(tiny_codec(), opus_bitrate=24000) as server:
        async with connect(server.url) as conn:
            assert conn.ready["opus"] == {"sample_rate": 24000, "bitrate": 24000}
        _, wire = await receive(server.url, "opus", latents=latents)
    seconds = FRAMES * 480 / 24000
    assert 3000 <= wire / seconds <= 3000 * 1.25


def test_a_client_refuses_opus_where_the_server_sends_none() -> None:
    """A ready without 'opus' (an older server, or one without libopus): ConfigError before the start."""
    from streamdec.clients.client import _check_opus

    ready = Ready(CodecInfo("toy", 4, 3, 24000, 1, (0, 0)), Limits(), minor=1)
    with pytest.raises(ConfigError, match=r"does not send Opus.*ask for pcm_s16le"):
        _check_opus(ready)
    _check_opus(Ready(ready.codec, ready.limits, opus=OpusInfo(24000, 56000)))


async def test_the_stream_command_writes_opus_decoded_as_float_wav(tmp_path: Path, capsys: Any) -> None:
    """`streamdec stream IN OUT.wav --format opus`: a 32-bit float WAV of done.samples samples; kB/s printed."""
    latents = clip(40, seed=5)
    np.save(tmp_path / "in.npy", latents.numpy()[None])
    parser = argparse.ArgumentParser()
    configure_stream(parser)
    async with running_server(tiny_codec()) as server:
        args = parser.parse_args([str(tmp_path / "in.npy"), "--url", server.url, str(tmp_path / "out.wav"),
                                  "--format", "opus"])  # fmt: skip
        assert await anyio.to_thread.run_sync(run_stream, args) == 0
    assert "audio on the wire" in capsys.readouterr().out
    data = (tmp_path / "out.wav").read_bytes()
    assert data[20:22] == b"\x03\x00"  # WAVE_FORMAT_IEEE_FLOAT
    assert len(data[data.index(b"data") + 8 :]) == 40 * 480 * 4


def test_serve_refuses_a_bitrate_libopus_would_not_honour() -> None:
    """`streamdec serve --opus-bitrate 1000` exits 2 with the range and the default."""
    cmd = serve_command("tiny", "--opus-bitrate", "1000")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "[6000, 510000]" in proc.stderr and "56000" in proc.stderr
