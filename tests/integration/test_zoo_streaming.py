"""Every zoo family streams exactly: StreamDecoder tiles and the websocket server equal codec.decode."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamdec
from streamdec.clients.client import connect
from support.server_support import running_server

torch.set_num_threads(2)
FAMILIES = ["dac-tiny", "oobleck-tiny", "bigvgan-tiny", "vits-tiny"]


@functools.cache
def _codec(name: str) -> streamdec.Codec:
    # float64: the test checks the streaming arithmetic of both modes, not float32 rounding (convolutions
    # over windows or kept histories of different lengths sum in different orders)
    return streamdec.load_codec(name, dtype=torch.float64)


@functools.cache
def _clip(name: str, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random latents ``[T, D]`` and their whole-clip decode ``[channels, T*hop]`` (cached: the slow part)."""
    codec = _codec(name)
    latents = torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(seed))
    return latents, codec.decode(latents[None])[0]


def _split(latents: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for n in sizes:
        out.append(latents[at : at + n])
        at += n
    return [*out, latents[at:]]


async def _stream(
    codec: streamdec.Codec, chunks: list[torch.Tensor], min_emit: int, max_emit: int, mode: str = "stateful"
) -> torch.Tensor:
    async with streamdec.StreamDecoder(codec, mode=mode, min_emit=min_emit, max_emit=max_emit) as dec:  # type: ignore[arg-type]
        tiles = [tile async for tile in dec.decode_tiles(chunks)]
    at = 0
    for tile in tiles:
        assert tile.start_sample == at, "tiles must be in order and gap-free"
        at = tile.end_sample
    return torch.cat([t.samples for t in tiles], dim=-1)


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frames=st.sampled_from([1, 7, 30]),
    chunk_sizes=st.lists(st.integers(0, 12), max_size=6),
    min_emit=st.sampled_from([1, 4]),
    grow=st.integers(0, 3),
    mode=st.sampled_from(["stateful", "halo"]),
)
def test_streamed_equals_whole_clip_decode(
    name: str, frames: int, chunk_sizes: list[int], min_emit: int, grow: int, mode: str
) -> None:
    """For every chunking, emission policy and decode mode, stitched tiles equal codec.decode within 1e-5."""
    codec = _codec(name)
    latents, reference = _clip(name, frames, 0)
    audio = asyncio.run(_stream(codec, _split(latents, chunk_sizes), min_emit, min_emit << grow, mode))
    assert audio.shape == (codec.channels, frames * codec.hop_size)
    torch.testing.assert_close(audio, reference, atol=1e-5, rtol=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", FAMILIES)
async def test_websocket_stream_equals_offline(name: str) -> None:
    """Through a loopback server and the client library, each family's audio equals offline decode."""
    codec = _codec(name)
    latents, reference = _clip(name, 23, 1)
    async with running_server(codec) as server, connect(server.url) as conn:
        assert conn.ready["codec"]["channels"] == codec.channels
        stream = await conn.open_stream(format="pcm_f32le")
        for part in _split(latents, [5, 1, 9]):
            await stream.send(part)
        await stream.end()
        frames = [frame.samples async for frame in stream]
    audio = np.concatenate(frames, axis=1)
    assert audio.shape == tuple(reference.shape)
    np.testing.assert_allclose(audio, reference.numpy(), atol=1e-4, rtol=0)
