"""The client library surfaces the server's first error, with its code, as a plain ServerError."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from streamdec.clients import connect
from streamdec.errors import ServerError, ShapeError
from streamdec.protocol import encode_latents
from support.server_support import running_server


def _nan_latents(frames: int = 12) -> np.ndarray:
    latents = np.random.default_rng(0).standard_normal((frames, 64)).astype(np.float32)
    latents[3, 7] = np.nan
    return latents


def _short_payload(stream: int) -> bytes:
    """A latent message that announces 2 frames but carries 1: the server answers bad_payload."""
    one_frame = encode_latents(stream, 0, np.zeros((1, 64), np.float32))
    return one_frame[:12] + struct.pack("<I", 2) + one_frame[16:]


async def test_non_finite_surfaces_with_its_code(codec: Any) -> None:
    """A NaN chunk: iterating the stream raises ServerError non_finite (no ExceptionGroup, no echo)."""
    async with running_server(codec) as server:
        with pytest.raises(ServerError) as caught:
            async with connect(server.url) as conn:
                stream = await conn.open_stream()
                await stream.send(_nan_latents())
                await stream.send(np.zeros((4, 64), np.float32))  # in flight when the stream ended
                await stream.end()
                async for _ in stream:
                    pass
    assert caught.value.code == "non_finite" and caught.value.stream == 0
    assert "NaN" in str(caught.value)


async def test_bad_payload_surfaces_with_its_code(codec: Any) -> None:
    """A payload of the wrong size: the stream raises bad_payload, not a later unknown_stream."""
    async with running_server(codec) as server:
        with pytest.raises(ServerError) as caught:
            async with connect(server.url) as conn:
                stream = await conn.open_stream()
                await conn.ws.send(_short_payload(stream.id))
                await stream.send(np.zeros((4, 64), np.float32))
                await stream.end()
                async for _ in stream:
                    pass
    assert caught.value.code == "bad_payload"


async def test_latent_dim_is_checked_before_sending(codec: Any) -> None:
    """Latents of the wrong width raise ShapeError naming the server's latent_dim; nothing is sent."""
    async with running_server(codec) as server, connect(server.url) as conn:
        stream = await conn.open_stream()
        with pytest.raises(ShapeError, match=r"\[frames, 64\]"):
            await stream.send(np.zeros((5, 32), np.float32))
        assert server.metrics.errors["bad_payload"] == 0
        await stream.send(np.zeros((5, 64), np.float32))  # the stream is still usable
        await stream.end()
        frames = [frame async for frame in stream]
    assert sum(f.n_samples for f in frames) == 5 * 480
