"""StreamDecoder.push_stream: a stream driven by callbacks, no task; the same audio as decode_tiles, and
close, pause and bad input behave as a server needs."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Literal

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamdec
from streamdec import StreamDecoder, Tile
from streamdec.engine.simulated import SimulatedCost, simulated_engine
from streamdec.errors import NonFiniteError, NonFiniteOutputError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def codec() -> streamdec.Codec:
    return streamdec.load_codec("tiny")


class _Source:
    """A chunk queue as a server's intake is: put and end tell the stream (its pump)."""

    def __init__(self) -> None:
        self.chunks: deque[Any] = deque()
        self.ended = False
        self.listener: Any = None

    def take_ready(self) -> Any:
        return self.chunks.popleft() if self.chunks else None

    @property
    def exhausted(self) -> bool:
        return self.ended and not self.chunks

    def put(self, chunk: Any) -> None:
        self.chunks.append(chunk)
        self.listener()

    def end(self) -> None:
        self.ended = True
        self.listener()


class _TellingSource(_Source):
    """A source that also says whether it holds input (a chunk or the end), as a server's intake does."""

    def has_input(self) -> bool:
        return self.ended or bool(self.chunks)


class _Listener:
    """Collects a push stream's tiles and its end; ``keep_going`` is what on_tile answers."""

    def __init__(self) -> None:
        self.tiles: list[Tile] = []
        self.ended = asyncio.get_running_loop().create_future()
        self.keep_going = True

    def on_tile(self, tile: Tile) -> bool:
        self.tiles.append(tile)
        return self.keep_going

    def on_end(self, error: BaseException | None) -> None:
        self.ended.set_result(error)

    def audio(self) -> torch.Tensor:
        at = 0
        for tile in self.tiles:
            assert tile.start_sample == at, "tiles in order and gap-free"
            at = tile.end_sample
        return torch.cat([t.samples for t in self.tiles], dim=-1)


def _open(dec: StreamDecoder, telling: bool = False, **kwargs: Any) -> tuple[Any, _Source, _Listener]:
    source, listener = (_TellingSource() if telling else _Source()), _Listener()
    stream = dec.push_stream(source, listener.on_tile, listener.on_end, **kwargs)
    source.listener = stream.pump
    return stream, source, listener


@settings(max_examples=20, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    pause_every=st.integers(0, 3),
    mode=st.sampled_from(["stateful", "halo"]),
    seed=st.integers(0, 2**16),
    telling=st.booleans(),
)
def test_pushed_equals_offline_for_every_chunking(
    codec: Any,
    chunks: list[int],
    pause_every: int,
    mode: Literal["stateful", "halo"],
    seed: int,
    telling: bool,
) -> None:
    """For all chunkings, with the loop let run between some puts or not, from a source that says whether
    it holds input or not: push_stream's audio is decode()'s."""
    total = max(sum(chunks), 1)
    latents = torch.randn(total, codec.latent_dim, generator=torch.Generator().manual_seed(seed))

    async def run() -> tuple[torch.Tensor, torch.Tensor]:
        engine = simulated_engine(codec, max_streams=4 if mode == "stateful" else 0)
        async with StreamDecoder(codec, engine=engine, mode=mode, max_emit=16) as dec:
            _, source, listener = _open(dec, telling)
            begin = 0
            for i, n in enumerate([*chunks[:-1], total - sum(chunks[:-1])]):
                source.put(latents[begin : begin + n].numpy())
                begin += n
                if pause_every and i % pause_every == 0:
                    await asyncio.sleep(0.002)  # results come back between chunks
            source.end()
            assert await listener.ended is None
            assert dec.stats.open_streams == 0
            return listener.audio(), await dec.decode(latents)

    pushed, offline = asyncio.run(run())
    assert torch.equal(pushed, offline)


def _held_engine(codec: Any) -> tuple[Any, threading.Event, threading.Event]:
    """A simulated engine whose device call blocks until released: a call stays in flight."""
    entered, release = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:
        entered.set()
        release.wait(10)

    return simulated_engine(codec, cost=SimulatedCost(1.0, 0.0), max_streams=2, sleep=sleep), entered, release


async def test_close_withdraws_the_call_in_flight_and_gives_the_slot_back(codec: Any) -> None:
    """close(): the decoded result is dropped, no tile or end is reported, and the slot is free again."""
    engine, entered, release = _held_engine(codec)
    async with StreamDecoder(codec, engine=engine, max_emit=16) as dec:
        stream, source, listener = _open(dec)
        source.put(np.zeros((40, codec.latent_dim), np.float32))
        await asyncio.to_thread(entered.wait, 10)  # the prime is on the device
        stream.close()
        assert dec.stats.open_streams == 0 and engine.open_slots == 0
        release.set()
        await asyncio.sleep(0.05)  # the device finishes; its result must go nowhere
        assert listener.tiles == [] and not listener.ended.done()


async def test_an_end_that_comes_while_a_call_is_in_flight_still_flushes_the_stream(codec: Any) -> None:
    """A source that says it holds no chunk but has ended: the returning call's stream flushes and ends."""
    engine, entered, release = _held_engine(codec)
    async with StreamDecoder(codec, engine=engine, max_emit=16) as dec:
        _, source, listener = _open(dec, telling=True)
        source.put(np.zeros((40, codec.latent_dim), np.float32))
        await asyncio.to_thread(entered.wait, 10)  # the prime is on the device
        source.end()  # its pump finds the call in flight and does nothing
        release.set()
        assert await listener.ended is None
        assert listener.audio().shape[-1] == 40 * codec.hop_size


async def test_a_paused_stream_submits_nothing_until_resumed(codec: Any) -> None:
    """on_tile returning False holds the next call back; resume() lets it go."""
    async with StreamDecoder(codec, engine=simulated_engine(codec, max_streams=2), max_emit=4) as dec:
        stream, source, listener = _open(dec)
        listener.keep_going = False
        source.put(np.zeros((40, codec.latent_dim), np.float32))
        source.end()
        await asyncio.sleep(0.05)
        assert len(listener.tiles) == 1 and dec.stats.engine.windows == 1
        listener.keep_going = True
        stream.resume()
        assert await listener.ended is None
        assert listener.audio().shape[-1] == 40 * codec.hop_size


async def test_bad_input_ends_the_stream_with_its_typed_error(codec: Any) -> None:
    """A non-finite chunk ends the stream through on_end with NonFiniteError, and frees its slot."""
    async with StreamDecoder(codec, engine=simulated_engine(codec, max_streams=2)) as dec:
        _, source, listener = _open(dec)
        bad = np.zeros((8, codec.latent_dim), np.float32)
        bad[3, 0] = np.nan
        source.put(bad)
        assert isinstance(await listener.ended, NonFiniteError)
        assert dec.stats.open_streams == 0 and dec.engine.open_slots == 0  # type: ignore[attr-defined]


def _overflowing(codec: Any, frames: int = 30) -> np.ndarray:
    """Finite latents of +-3e38, which overflow inside the codec into NaN or Inf audio."""
    huge = np.full((frames, codec.latent_dim), 3e38, np.float32)
    huge[::2] *= -1
    return huge


@pytest.mark.parametrize("mode", ["stateful", "halo"])
async def test_checked_latents_still_get_their_audio_checked(codec: Any, mode: str) -> None:
    """latents_checked skips the scan of the latents only: audio that overflowed inside the codec ends
    the stream with NonFiniteOutputError, and no tile of it reaches on_tile."""
    async with StreamDecoder(codec, mode=mode) as dec:  # type: ignore[arg-type]
        _, source, listener = _open(dec, latents_checked=True)
        source.put(_overflowing(codec))
        source.end()
        error = await listener.ended
        assert isinstance(error, NonFiniteOutputError) and "frames 0.." in str(error)
        assert listener.tiles == [] and dec.stats.open_streams == 0


async def test_allow_non_finite_delivers_non_finite_audio(codec: Any) -> None:
    """allow_non_finite=True turns the output check off too: the overflowed audio reaches on_tile."""
    async with StreamDecoder(codec) as dec:
        _, source, listener = _open(dec, allow_non_finite=True)
        source.put(_overflowing(codec))
        source.end()
        assert await listener.ended is None
        audio = listener.audio()
        assert audio.shape[-1] == 30 * codec.hop_size and not torch.isfinite(audio).all()
