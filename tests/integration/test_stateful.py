"""Stateful mode through StreamDecoder: every latent frame decoded once, audio equal to the whole clip."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamdec
from streamdec.errors import (
    ConfigError,
    DTypeError,
    NonFiniteError,
    ShapeError,
    StreamEndedError,
    TooManyStreamsError,
)

FAMILIES = ["tiny", "dac-tiny", "oobleck-tiny", "bigvgan-tiny", "vits-tiny"]
pytestmark = pytest.mark.timeout(900)
_CODECS: dict[str, streamdec.Codec] = {}


def codec_of(name: str) -> streamdec.Codec:
    if name not in _CODECS:
        # float64: the property checks the streaming algebra, not float32 rounding (convolutions over
        # different lengths sum in different orders, about 1e-5 apart after a dozen layers)
        _CODECS[name] = streamdec.load_codec(name, dtype=torch.float64)
    return _CODECS[name]


def split(latents: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Chunks of the given sizes (cycled; 0 gives an empty chunk), the last one taking what is left."""
    if not any(sizes):
        return [latents[:0], latents]
    chunks, at, i = [], 0, 0
    while at < latents.shape[0]:
        n = sizes[i % len(sizes)]
        chunks.append(latents[at : at + n])
        at += n
        i += 1
    return chunks


async def paced(chunks: list[torch.Tensor], delay: float) -> AsyncIterator[torch.Tensor]:
    for chunk in chunks:
        await asyncio.sleep(delay)
        yield chunk


async def collect(dec: streamdec.StreamDecoder, chunks: object) -> torch.Tensor:
    tiles = [tile async for tile in dec.decode_tiles(chunks)]  # type: ignore[arg-type]
    starts = [t.start_frame for t in tiles]
    assert starts == sorted(starts)
    return torch.cat([t.samples for t in tiles], dim=-1)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(FAMILIES),
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=2),
    sizes=st.lists(st.integers(0, 13), min_size=1, max_size=6),
    min_emit=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 3),
    edge_lane=st.booleans(),
)
def test_stateful_streams_equal_whole_clip(
    name: str, lengths: list[int], sizes: list[int], min_emit: int, seed: int, edge_lane: bool
) -> None:
    """For any chunking (0-13 frames) and length (1-300), concurrent stateful streams at different
    phases, sharing batches, each equal codec.decode of their clip within 1e-5, with primes and flushes
    queued in a lane of their own or with the steps."""
    codec = codec_of(name)
    gen = torch.Generator().manual_seed(seed)
    clips = [torch.randn(n, codec.latent_dim, generator=gen) for n in lengths]

    async def run() -> list[torch.Tensor]:
        async with streamdec.StreamDecoder(
            codec, mode="stateful", min_emit=min_emit, max_streams=4, edge_lane=edge_lane
        ) as dec:
            assert dec.engine.lanes == (2 if edge_lane else 1)
            outs = await asyncio.gather(
                *(
                    collect(dec, paced(split(c, sizes[i:] + sizes[:i]), 0.0005 * i))
                    for i, c in enumerate(clips)
                )
            )
            stats = dec.stats
        assert stats.engine.frames == sum(lengths)  # every frame decoded once
        assert stats.open_streams == 0
        return list(outs)

    for clip, out in zip(clips, asyncio.run(run()), strict=True):
        reference = codec.decode(clip[None])[0]
        assert out.shape == reference.shape
        torch.testing.assert_close(out, reference, atol=1e-6, rtol=0)


def test_default_mode_is_stateful_and_halo_stays_available() -> None:
    """Built-in families default to stateful; mode='halo' keeps windows; an unknown mode is refused."""
    codec = codec_of("tiny")
    assert streamdec.StreamDecoder(codec).mode == "stateful"
    assert streamdec.StreamDecoder(codec, mode="halo").max_streams is None
    with pytest.raises(ConfigError, match="unknown mode"):
        streamdec.StreamDecoder(codec, mode="cached")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_streams"):
        streamdec.StreamDecoder(codec, mode="halo", max_streams=4)


def test_slots_are_refused_beyond_max_streams_and_reused_after_cancel_and_end() -> None:
    """A stream beyond max_streams is refused at once; a cancelled or finished stream frees its slot."""
    codec = codec_of("tiny")
    clip = torch.randn(40, codec.latent_dim)

    async def run() -> None:
        async with streamdec.StreamDecoder(codec, max_streams=1) as dec:
            first = dec.decode_tiles(paced(split(clip, [4]), 0.001))
            with pytest.raises(TooManyStreamsError, match="all 1 stream slots"):
                dec.decode_tiles([clip])
            await anext(first)
            await first.aclose()  # cancel: the slot is free at once
            assert dec.engine.open_slots == 0
            out = await collect(dec, split(clip, [5]))  # reuses the slot, from a clean state
            torch.testing.assert_close(out, codec.decode(clip[None])[0], atol=1e-5, rtol=0)
            assert dec.engine.open_slots == 0
            out = await collect(dec, [clip])  # and again after a normal end
            torch.testing.assert_close(out, codec.decode(clip[None])[0], atol=1e-5, rtol=0)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("chunk", "error"),
    [
        pytest.param(torch.randn(3, 7), ShapeError, id="latent-dim"),
        pytest.param(torch.ones(3, 64, dtype=torch.int32), DTypeError, id="dtype"),
        pytest.param(torch.full((3, 64), float("nan")), NonFiniteError, id="nan"),
    ],
)
def test_bad_chunks_raise_typed_errors_and_free_the_slot(chunk: torch.Tensor, error: type[Exception]) -> None:
    """Bad input ends a stateful stream with the same typed errors as halo mode, and frees its slot."""
    codec = codec_of("tiny")

    async def run() -> None:
        async with streamdec.StreamDecoder(codec, max_streams=1) as dec:
            with pytest.raises(error):
                await collect(dec, [torch.randn(10, 64), chunk])
            assert dec.engine.open_slots == 0

    asyncio.run(run())


def test_chunk_after_end_is_refused() -> None:
    """Feeding a stateful session after end() raises StreamEndedError."""
    codec = codec_of("tiny")
    dec = streamdec.StreamDecoder(codec, max_streams=1)
    assert dec.policy is not None
    session = streamdec.session.StatefulSession(
        dec.policy, latent_dim=64, hop_size=codec.hop_size, pad_latent=codec.pad_latent
    )
    session.end()
    with pytest.raises(StreamEndedError):
        session.feed(torch.randn(2, 64))
