"""Opus on the wire, server side: a start with format "opus" gets an Ogg Opus stream that an independent
reader and decoder (sphn: its own Ogg code, its own libopus) plays in step with the PCM decode, at a fifth
of the bytes or less."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from streamdec.audio.libopus import libopus_available
from streamdec.protocol import parse_audio
from support.server_support import (
    clip,
    next_json,
    offline,
    raw,
    ready,
    running_server,
    send_latents,
    start,
    tiny_codec,
)

sphn = pytest.importorskip(
    "sphn", reason="the independent decoder is the `opus` extra: pip install -e '.[opus]'"
)
pytestmark = pytest.mark.skipif(
    not libopus_available(), reason="the server encodes with the system's libopus: apt-get install libopus0"
)

FRAMES = 100  # 2 s of the tiny codec


async def _stream(url: str, fmt: str) -> tuple[list[tuple[int, int, bytes]], dict[str, object]]:
    """(start_sample, n_samples, payload) of every audio message of one stream, and its done."""
    messages: list[tuple[int, int, bytes]] = []
    async with raw(url) as ws:
        await ready(ws)
        await start(ws, 1, format=fmt)
        assert (await next_json(ws))["type"] == "started"
        await send_latents(ws, 1, clip(FRAMES, seed=7), chunk=10)
        await ws.send('{"type":"end","stream":1}')
        while True:
            msg = await ws.recv()
            if isinstance(msg, str):
                done = dict(json.loads(msg))
                assert done["type"] == "done", done
                return messages, done
            audio = parse_audio(msg)
            messages.append((audio.start_sample, audio.n_samples, audio.pcm))


def _pre_skip(ogg: bytes) -> int:
    """The OpusHead's pre-skip, in 48 kHz samples (the head is the first packet of the first page)."""
    body = 27 + ogg[26]
    assert ogg[body : body + 8] == b"OpusHead"
    return int(struct.unpack_from("<H", ogg, body + 10)[0])


async def test_an_opus_stream_decodes_in_step_with_the_pcm_decode() -> None:
    """Headers count the real samples; the decode, less the announced pre-skip, lines up to the sample."""
    codec = tiny_codec()
    async with running_server(codec) as server:
        opus, done = await _stream(server.url, "opus")
        pcm, _ = await _stream(server.url, "pcm_s16le")
    total = FRAMES * 480
    assert done["status"] == "completed" and done["samples"] == total
    assert sum(n for _, n, _ in opus) == total
    assert [s for s, _, _ in opus] == list(np.cumsum([0] + [n for _, n, _ in opus])[:-1])
    ogg = b"".join(p for _, _, p in opus)
    decoded = sphn.OpusStreamReader(24000).append_bytes(ogg)
    skip = _pre_skip(ogg) * 24000 // 48000
    assert skip == 156  # libopus's encoder delay at 24 kHz
    decoded = decoded[skip : skip + total]
    assert len(decoded) == total  # the padded tail carried the last real samples out
    reference = offline(codec, clip(FRAMES, seed=7))[0]
    span, n = 200, total - 400
    scores = [
        float(np.dot(reference[span : span + n], decoded[span + k : span + k + n]))
        for k in range(-span, span)
    ]
    assert abs(int(np.argmax(scores)) - span) <= 1  # in step: a wrong pre-skip is off by 156
    pcm_bytes = sum(len(p) for _, _, p in pcm)
    assert len(ogg) <= pcm_bytes / 5
