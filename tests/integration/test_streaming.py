"""The async API in halo mode (stateful mode: test_stateful.py): streamed audio equals the whole-clip
decode, and the stream lifecycle is clean."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamdec
from streamdec.errors import DTypeError, EngineClosedError, NonFiniteError, ShapeError, StreamEndedError


@pytest.fixture(scope="module")
def codec() -> streamdec.Codec:
    return streamdec.load_codec("tiny")


_REFERENCE: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _clip(codec: streamdec.Codec, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random latents and their whole-clip decode, cached: the reference is the slow part."""
    key = (codec.name, frames, seed)
    if key not in _REFERENCE:
        latents = torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(seed))
        _REFERENCE[key] = latents, codec.decode(latents[None])[0]
    return _REFERENCE[key]


def _split(latents: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for n in sizes:
        out.append(latents[at : at + n])
        at += n
    out.append(latents[at:])
    return out


async def _collect(dec: streamdec.StreamDecoder, chunks: object, **kwargs: object) -> list[streamdec.Tile]:
    return [tile async for tile in dec.decode_tiles(chunks, **kwargs)]  # type: ignore[arg-type]


def _stitch(tiles: list[streamdec.Tile]) -> torch.Tensor:
    at = 0
    for tile in tiles:
        assert tile.start_sample == at, "tiles must be in order and gap-free"
        at = tile.end_sample
    return torch.cat([t.samples for t in tiles], dim=-1)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frames=st.sampled_from([1, 9, 40, 97, 150]),
    seed=st.integers(0, 2),
    chunk_sizes=st.lists(st.integers(0, 40), max_size=12),
    min_emit=st.sampled_from([1, 2, 4, 8]),
    grow=st.integers(0, 4),
    as_async=st.booleans(),
)
def test_streamed_equals_whole_clip_decode(
    fast_codec: streamdec.Codec,
    frames: int,
    seed: int,
    chunk_sizes: list[int],
    min_emit: int,
    grow: int,
    as_async: bool,
) -> None:
    """For every chunking and emission policy, stitched tiles equal codec.decode within 1e-5.

    The property is the planner's and the stitching's, so it runs on dac-tiny: with "tiny", one-frame
    tiles of a 150-frame clip alone took a minute on a 2-core CPU (each window recomputes its context).
    """
    codec = fast_codec
    latents, reference = _clip(codec, frames, seed)
    chunks = _split(latents, chunk_sizes)

    async def source() -> AsyncIterator[torch.Tensor]:
        for c in chunks:
            yield c

    async def run() -> list[streamdec.Tile]:
        async with streamdec.StreamDecoder(
            codec, mode="halo", min_emit=min_emit, max_emit=min_emit << grow
        ) as dec:
            return await _collect(dec, source() if as_async else chunks)

    tiles = asyncio.run(run())
    audio = _stitch(tiles)
    assert audio.shape == (codec.channels, frames * codec.hop_size)
    assert audio.dtype == torch.float32
    torch.testing.assert_close(audio, reference, atol=1e-5, rtol=0)


async def test_concurrent_streams_on_one_decoder(codec: streamdec.Codec) -> None:
    """Several decode_tiles calls run at once on one decoder, each exact."""
    clips = [_clip(codec, n, seed) for n, seed in [(60, 10), (33, 11), (80, 12), (5, 13)]]
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=16) as dec:
        results = await asyncio.gather(*(_collect(dec, _split(lat, [7] * 20)) for lat, _ in clips))
        assert dec.stats.open_streams == 0
        assert dec.stats.streams == len(clips)
    for tiles, (_, reference) in zip(results, clips, strict=True):
        torch.testing.assert_close(_stitch(tiles), reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["stateful", "halo"])
async def test_each_tiles_s16_is_its_own_samples_in_s16(codec: streamdec.Codec, mode: str) -> None:
    """Tiles of concurrent streams share device calls; each tile's pcm16() (its call's block converted
    once) is exactly io.pcm16 of its own samples, and its samples are exact against the whole clip."""
    from streamdec.io import pcm16

    clips = [_clip(codec, n, seed) for n, seed in [(40, 20), (27, 21), (52, 22)]]
    async with streamdec.StreamDecoder(codec, mode=mode, min_emit=2, max_emit=8) as dec:
        results = await asyncio.gather(*(_collect(dec, _split(lat, [3] * 20)) for lat, _ in clips))
    for tiles, (_, reference) in zip(results, clips, strict=True):
        assert all(tile.pcm16() == pcm16(tile.samples) for tile in tiles)
        torch.testing.assert_close(_stitch(tiles), reference, atol=1e-5, rtol=0)


async def test_first_tile_is_min_emit_frames(codec: streamdec.Codec) -> None:
    """Frames arriving one at a time: the first tile holds min_emit frames, later ones grow."""
    latents, _ = _clip(codec, 97, 0)
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=32) as dec:
        tiles = await _collect(dec, _split(latents, [1] * 97))
    assert [t.frames for t in tiles][:5] == [2, 4, 8, 16, 32]
    assert sum(t.frames for t in tiles) == 97


@pytest.mark.parametrize("frames", [700, 64], ids=["tiled", "single-window"])
async def test_whole_clip_decode_through_engine(codec: streamdec.Codec, frames: int) -> None:
    """dec.decode tiles a long clip through the engine and equals codec.decode, batched or not."""
    latents, reference = _clip(codec, frames, 3)
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=8, max_emit=64) as dec:
        single = await dec.decode(latents)
        batch = await dec.decode(torch.stack([latents, latents.flip(0)]))
    torch.testing.assert_close(single, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[0], reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[1], codec.decode(latents.flip(0)[None])[0], atol=1e-5, rtol=0)


async def test_event_loop_keeps_ticking_while_decoding(codec: streamdec.Codec) -> None:
    """Decoding runs off the event loop: a ticker task keeps ticking during a long decode."""
    latents, _ = _clip(codec, 700, 4)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=8, max_emit=64) as dec:
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await dec.decode(latents, max_in_flight=1)
        windows = dec.stats.engine.windows
        task.cancel()
    # A blocked loop would tick at most once per window boundary; a free one ticks throughout.
    assert ticks > 2 * windows


async def test_cancel_frees_stream_and_closes_source(codec: streamdec.Codec) -> None:
    """Cancelling the consuming task stops the stream: slot freed, source closed, nothing queued."""
    latents, _ = _clip(codec, 150, 5)
    closed = asyncio.Event()
    got_tile = asyncio.Event()

    async def source() -> AsyncIterator[torch.Tensor]:
        try:
            for chunk in _split(latents, [3] * 50):
                yield chunk
                await asyncio.sleep(0.001)
        finally:
            closed.set()

    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:

        async def consume() -> None:
            async for _ in dec.decode_tiles(source()):
                got_tile.set()

        task = asyncio.create_task(consume())
        await got_tile.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed.is_set()
        assert dec.stats.open_streams == 0
        await asyncio.sleep(0.05)
        assert dec.stats.engine.queued == 0


async def test_break_out_of_loop_frees_stream(codec: streamdec.Codec) -> None:
    """Leaving the loop early inside `async with` frees the stream at once."""
    latents, _ = _clip(codec, 150, 5)
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:
        async with dec.decode_tiles(_split(latents, [10] * 15)) as tiles:
            async for _ in tiles:
                break
        assert dec.stats.open_streams == 0


async def test_slow_consumer_stops_chunk_intake(codec: streamdec.Codec) -> None:
    """Backpressure: while the consumer holds a tile, no more chunks are pulled from the source."""
    latents, _ = _clip(codec, 150, 6)
    pulled = 0

    def source() -> Iterator[torch.Tensor]:
        nonlocal pulled
        for chunk in _split(latents, [1] * 150):
            pulled += 1
            yield chunk

    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:
        tiles = dec.decode_tiles(source())
        first = await tiles.__anext__()
        pulled_at_first = pulled
        await asyncio.sleep(0.2)  # a slow listener; a push-based design would keep reading here
        assert pulled == pulled_at_first
        assert pulled_at_first <= first.frames + dec.right + 1
        assert tiles.session.snapshot()["buffered"] <= pulled_at_first
        await tiles.aclose()


_BAD = [
    (np.zeros((4, 63), np.float32), ShapeError, "latent_dim=64"),
    (np.zeros((2, 4, 64), np.float32), ShapeError, r"\[T, 64\]"),
    (np.zeros(64, np.float32), ShapeError, r"\[T, 64\]"),
    (np.zeros((4, 64), np.int16), DTypeError, "floating"),
    (torch.zeros(4, 64, dtype=torch.int64), DTypeError, "floating"),
    ([[0.0] * 64], DTypeError, "numpy array or torch tensor"),
    (np.full((4, 64), np.nan, np.float32), NonFiniteError, "allow_non_finite"),
    (np.full((4, 64), np.inf, np.float32), NonFiniteError, "frame 0"),
]


@pytest.mark.parametrize(
    ("chunk", "error", "match"),
    _BAD,
    ids=["latent-dim", "batch-of-two", "rank-1", "int16", "int64", "list", "nan", "inf"],
)
async def test_bad_chunk_raises_typed_error(
    codec: streamdec.Codec, chunk: object, error: type[Exception], match: str
) -> None:
    """Each kind of bad chunk raises its typed error, with the fix in the message, and frees the stream."""
    good = torch.randn(10, codec.latent_dim)
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:
        with pytest.raises(error, match=match):
            await _collect(dec, [good, chunk, good])
        assert dec.stats.open_streams == 0


async def test_non_finite_allowed_when_asked(codec: streamdec.Codec) -> None:
    """allow_non_finite=True lets NaN through to the decoder instead of raising."""
    bad = torch.randn(20, codec.latent_dim)
    bad[3, 5] = float("nan")
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:
        tiles = await _collect(dec, [bad], allow_non_finite=True)
    assert sum(t.frames for t in tiles) == 20


async def test_empty_chunks_are_fine(codec: streamdec.Codec) -> None:
    """Empty chunks, including an empty stream, decode to exactly frames * hop samples."""
    latents, reference = _clip(codec, 40, 7)
    empty = torch.empty(0, codec.latent_dim)
    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=8) as dec:
        tiles = await _collect(dec, [empty, latents[:20], empty, empty, latents[20:], empty])
        assert await _collect(dec, [empty]) == []
        assert await _collect(dec, []) == []
    torch.testing.assert_close(_stitch(tiles), reference, atol=1e-5, rtol=0)


def test_chunk_after_end_raises(codec: streamdec.Codec) -> None:
    """The sans-I/O session refuses a chunk after end() with StreamEndedError."""

    async def run() -> None:
        async with streamdec.StreamDecoder(codec, mode="halo") as dec:
            tiles = dec.decode_tiles([])
            tiles.session.end()
            with pytest.raises(StreamEndedError, match="after the stream ended"):
                tiles.session.feed(torch.randn(2, codec.latent_dim))
            await tiles.aclose()

    asyncio.run(run())


async def test_closed_decoder_refuses_work(codec: streamdec.Codec) -> None:
    """After aclose(), new streams and windows fail with EngineClosedError."""
    dec = streamdec.StreamDecoder(codec, mode="halo")
    await dec.start()
    await dec.aclose()
    with pytest.raises(EngineClosedError):
        dec.decode_tiles([])
    with pytest.raises(EngineClosedError):
        await dec.decode(torch.randn(5, codec.latent_dim))


async def test_eager_engine_leaves_a_core_for_the_event_loop(codec: streamdec.Codec) -> None:
    """While the eager engine runs, intra-op threads are capped (default cores - 1), then restored."""
    before = torch.get_num_threads()
    async with streamdec.StreamDecoder(codec, mode="halo", cpu_threads=1) as dec:
        assert torch.get_num_threads() == 1
        await dec.decode(torch.randn(10, codec.latent_dim))
    assert torch.get_num_threads() == before


async def test_listener_about_to_run_dry_gets_frames_below_the_target(codec: streamdec.Codec) -> None:
    """A source at real-time pace: tiles go out before the doubling target rather than starve the
    listener, and the stream is still exact."""
    latents, reference = _clip(codec, 40, 8)

    async def realtime() -> AsyncIterator[torch.Tensor]:
        for i in range(40):
            await asyncio.sleep(0.02)  # 50 frames per second
            yield latents[i : i + 1]

    async with streamdec.StreamDecoder(codec, mode="halo", min_emit=2, max_emit=32) as dec:
        tiles = await _collect(dec, realtime())
    targets = [2, 4, 8, 16, 32]
    sizes = [t.frames for t in tiles]
    assert any(size < targets[min(i, 4)] for i, size in enumerate(sizes[:-1])), sizes
    torch.testing.assert_close(_stitch(tiles), reference, atol=1e-5, rtol=0)
