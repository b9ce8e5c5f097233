"""A stream behind real time decodes the chunks already at hand in larger calls, exactly."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamdec
from streamdec import StreamDecoder
from streamdec.engine.simulated import simulated_engine

pytestmark = pytest.mark.timeout(60)


class _Backlog:
    """An async source whose chunks have all arrived already, and that says so through take_ready()."""

    def __init__(self, chunks: list[torch.Tensor], offer_ready: bool) -> None:
        self.chunks = deque(chunks)
        if not offer_ready:
            self.take_ready = None  # type: ignore[assignment]

    def __aiter__(self) -> _Backlog:
        return self

    async def __anext__(self) -> torch.Tensor:
        if not self.chunks:
            raise StopAsyncIteration
        return self.chunks.popleft()

    def take_ready(self) -> torch.Tensor | None:
        return self.chunks.popleft() if self.chunks else None


@pytest.mark.parametrize("mode", ["stateful", "halo"])
async def test_chunks_at_hand_share_one_call(mode: str) -> None:
    """Ten 4-frame chunks at hand: with take_ready the calls carry up to the largest size, same audio."""
    codec = streamdec.load_codec("tiny")
    latents = torch.randn(40, codec.latent_dim, generator=torch.Generator().manual_seed(3))
    calls: dict[bool, int] = {}
    audio: dict[bool, torch.Tensor] = {}
    for offer in (False, True):
        engine = simulated_engine(codec, max_streams=2 if mode == "stateful" else 0)
        async with StreamDecoder(codec, engine=engine, mode=mode, min_emit=4, max_emit=16) as dec:  # type: ignore[arg-type]
            source = _Backlog(list(latents.split(4)), offer)
            audio[offer] = torch.cat([t.samples async for t in dec.decode_tiles(source)], dim=-1)
            calls[offer] = dec.stats.engine.windows
            expected = await dec.decode(latents)
    assert torch.equal(audio[True], expected) and torch.equal(audio[False], expected)
    assert calls[True] < calls[False]
    assert calls[True] <= 5  # 40 frames in calls of up to 16, plus the prime or the last window


@pytest.mark.parametrize("mode", ["stateful", "halo"])
async def test_a_plain_async_generator_is_read_ahead_so_a_slow_engine_catches_up(mode: str) -> None:
    """A source without take_ready whose chunks come faster than the engine's calls (4 frames due every
    5 ms against 40 ms a call): once the stream finds a chunk already waiting, the chunks that come while
    a call is in flight are pulled meanwhile, so later calls take several at once and the stream catches
    up, where pulling one chunk per call would make a call per chunk; the audio is the whole clip's."""
    from streamdec.engine.simulated import SimulatedCost

    codec = streamdec.load_codec("tiny")
    latents = torch.randn(96, codec.latent_dim, generator=torch.Generator().manual_seed(5))
    chunks = latents.split(4)

    async def produce() -> AsyncIterator[torch.Tensor]:  # a model ahead of the decoder: chunks on a clock
        start = time.monotonic()
        for k, chunk in enumerate(chunks):
            delay = start + 0.005 * k - time.monotonic()
            if delay > 0:  # a chunk already due is at hand: no turn of the loop before it comes
                await asyncio.sleep(delay)
            yield chunk

    engine = simulated_engine(
        codec, cost=SimulatedCost(40.0, 0.0), max_streams=2 if mode == "stateful" else 0
    )
    async with StreamDecoder(codec, engine=engine, mode=mode, min_emit=4, max_emit=16) as dec:  # type: ignore[arg-type]
        tiles = [t async for t in dec.decode_tiles(produce())]
        calls = dec.stats.engine.windows
        expected = await dec.decode(latents)
    assert torch.equal(torch.cat([t.samples for t in tiles], dim=-1), expected)
    assert max(t.frames for t in tiles) == 16  # a largest step's worth came in during a call
    assert calls <= len(chunks) // 2


async def test_read_ahead_is_bounded_by_what_the_next_call_takes() -> None:
    """A consumer that stops asking for tiles stops intake after at most one call's worth of chunks
    read ahead, although the source has every chunk at hand."""
    codec = streamdec.load_codec("tiny")
    latents = torch.randn(200, codec.latent_dim, generator=torch.Generator().manual_seed(6))
    pulled = 0

    async def produce() -> AsyncIterator[torch.Tensor]:
        nonlocal pulled
        for chunk in latents.split(2):
            pulled += 1
            yield chunk

    engine = simulated_engine(codec, max_streams=2)
    decoder = StreamDecoder(codec, engine=engine, min_emit=4, max_emit=16)  # type: ignore[arg-type]
    async with decoder as dec, dec.decode_tiles(produce()) as tiles:
        first = await tiles.__anext__()
        await asyncio.sleep(0.2)  # a listener that stopped reading
        held = pulled
        await asyncio.sleep(0.1)
        assert pulled == held  # intake stopped
        # what the first call took, plus at most the next call's room (16 frames and the lag), a chunk each
        assert 2 * held <= first.frames + dec.right + 16 + dec.right + 2 * 2 + 12


async def test_a_source_error_read_ahead_comes_after_the_chunks_before_it() -> None:
    """A source that raises after some chunks: the error is raised once the stream wants the chunk that
    failed, after the tiles of the chunks before it, as without reading ahead."""
    from streamdec.engine.simulated import SimulatedCost

    codec = streamdec.load_codec("tiny")
    latents = torch.randn(40, codec.latent_dim, generator=torch.Generator().manual_seed(7))

    async def produce() -> AsyncIterator[torch.Tensor]:
        for chunk in latents.split(4):
            yield chunk
        raise ValueError("the model failed")

    engine = simulated_engine(codec, cost=SimulatedCost(20.0, 0.0), max_streams=2)
    got: list[int] = []
    async with StreamDecoder(codec, engine=engine, min_emit=4, max_emit=16) as dec:  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="the model failed"):
            async for tile in dec.decode_tiles(produce()):
                got.append(tile.frames)
        assert dec.stats.open_streams == 0
    # every frame whose right context had arrived went out before the error
    assert sum(got) == 40 - dec.right


async def test_a_stream_reading_ahead_still_flushes_for_its_listener() -> None:
    """A stream that fell behind (its first chunks all at hand) reads ahead; when its source then slows
    down, waiting for the reader times out at the flush time and the ready frames go out below the
    smallest step, as without reading ahead; the audio is the whole clip's."""
    from streamdec.engine.simulated import SimulatedCost

    codec = streamdec.load_codec("tiny")
    latents = torch.randn(40, codec.latent_dim, generator=torch.Generator().manual_seed(8))

    async def produce() -> AsyncIterator[torch.Tensor]:
        for i in range(40):
            if i >= 20:
                await asyncio.sleep(0.03)  # slower than the listener needs
            yield latents[i : i + 1]

    engine = simulated_engine(codec, cost=SimulatedCost(5.0, 0.0), max_streams=2)
    decoder = StreamDecoder(codec, engine=engine, min_emit=4, max_emit=16, listener_prebuffer=0.02)  # type: ignore[arg-type]
    async with decoder as dec:
        tiles = [t async for t in dec.decode_tiles(produce())]
        expected = await dec.decode(latents)
    assert torch.equal(torch.cat([t.samples for t in tiles], dim=-1), expected)
    assert any(t.frames < 4 for t in tiles[:-1])  # flushed below the smallest step before the end


@settings(max_examples=25, deadline=None)
@given(
    frames=st.integers(1, 24),
    chunk=st.integers(1, 5),
    mode=st.sampled_from(["stateful", "halo"]),
    managed=st.booleans(),
)
def test_a_stream_that_ends_leaves_no_reader_and_closes_its_source(
    frames: int, chunk: int, mode: str, managed: bool
) -> None:
    """For every length and chunking of a source whose chunks are at hand (so the stream reads ahead once
    it has fallen behind, possibly only after the source's end): once the stream has given its last tile,
    iterated inside ``async with`` or not, no reader task of it is left and its source is closed; the
    audio is the whole clip's."""
    codec = streamdec.load_codec("tiny")
    latents = torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(frames))
    closed: list[bool] = []

    async def produce() -> AsyncIterator[torch.Tensor]:
        try:
            for piece in latents.split(chunk):
                yield piece
        finally:
            closed.append(True)

    async def run() -> tuple[torch.Tensor, torch.Tensor, list[asyncio.Task[object]]]:
        engine = simulated_engine(codec, max_streams=2 if mode == "stateful" else 0)
        async with StreamDecoder(codec, engine=engine, mode=mode, min_emit=4, max_emit=16) as dec:  # type: ignore[arg-type]
            if managed:
                async with dec.decode_tiles(produce()) as tiles:
                    got = [t.samples async for t in tiles]
            else:
                got = [t.samples async for t in dec.decode_tiles(produce())]
            await asyncio.sleep(0)
            readers = [
                t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "_read_source"
            ]
            return torch.cat(got, dim=-1), await dec.decode(latents), readers

    audio, expected, readers = asyncio.run(run())
    assert not readers
    assert closed == [True]
    assert torch.equal(audio, expected)
