"""Opus streams through the Python client, and the two measures the Opus tests assert on."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamdec.clients import connect
from streamdec.protocol import AUDIO_HEADER

__all__ = ["lag", "receive", "snr_db"]


async def receive(
    url: str, fmt: str, *, latents: Any = None, text: str | None = None
) -> tuple[np.ndarray, int]:
    """The stream's samples as the client yields them, and the bytes of its audio messages (headers too)."""
    async with connect(url) as conn:
        stream = await conn.open_stream(format=fmt, text=text)
        if latents is not None:
            await stream.send(latents)
            await stream.end()
        frames = [frame async for frame in stream]
        assert stream.done is not None and stream.done["status"] == "completed"
    audio = np.concatenate([frame.samples[0] for frame in frames])
    assert len(audio) == stream.done["samples"]
    messages = frames[:-1] if fmt == "opus" else frames  # an Opus stream's last frame is the decoder's rest
    return audio, sum(AUDIO_HEADER.size + len(frame.pcm) for frame in messages)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((reference - test) ** 2)))


def lag(reference: np.ndarray, test: np.ndarray, span: int = 200) -> int:
    """The shift of ``test`` against ``reference`` that correlates best, within +-span samples."""
    n = len(reference) - 2 * span
    scores = [
        float(np.dot(reference[span : span + n], test[span + k : span + k + n])) for k in range(-span, span)
    ]
    return int(np.argmax(scores)) - span
