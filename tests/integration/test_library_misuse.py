"""Library misuse ends in typed errors and leaks nothing, in both decode modes."""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

import streamdec
from streamdec.errors import ConcurrentIterationError, ConfigError, InputError, NonFiniteOutputError

MODES = ["stateful", "halo"]


@pytest.fixture(scope="module")
def codec() -> streamdec.Codec:
    return streamdec.load_codec("tiny")


@pytest.mark.parametrize("mode", MODES)
def test_break_without_async_with_frees_the_stream(codec: streamdec.Codec, mode: str) -> None:
    """Breaking out of `async for` on a bare decode_tiles() gives back its count (and slot) once dropped."""

    async def run() -> None:
        async with streamdec.StreamDecoder(codec, mode=mode, min_emit=1) as dec:  # type: ignore[arg-type]
            async for _tile in dec.decode_tiles([torch.randn(40, 64)]):
                break
            gc.collect()
            assert dec.stats.open_streams == 0
            if mode == "stateful":
                assert dec.engine.open_slots == 0  # type: ignore[attr-defined]

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_break_without_async_with_frees_a_stream_reading_ahead(codec: streamdec.Codec, mode: str) -> None:
    """The same with a plain async generator that never yields again: the read-ahead's pull still waits
    on it, but holds the stream only weakly, so the dropped stream gives back its count and slot."""

    async def run() -> None:
        stalled = asyncio.Event()

        async def source() -> object:
            yield torch.randn(16, 64)
            await stalled.wait()  # a producer that stalls: the pull read ahead never finishes
            yield torch.randn(4, 64)

        async with streamdec.StreamDecoder(codec, mode=mode, min_emit=1) as dec:  # type: ignore[arg-type]
            gen = source()
            async for _tile in dec.decode_tiles(gen):
                break
            assert gen.ag_running  # type: ignore[attr-defined]  # the pull read ahead waits in the source
            gc.collect()
            assert dec.stats.open_streams == 0
            if mode == "stateful":
                assert dec.engine.open_slots == 0  # type: ignore[attr-defined]
            stalled.set()
            while gen.ag_running:  # type: ignore[attr-defined]  # the pull finishes, nobody takes its chunk
                await asyncio.sleep(0.001)
            await gen.aclose()  # type: ignore[attr-defined]

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_two_consumers_of_one_stream_are_refused(codec: streamdec.Codec, mode: str) -> None:
    """A second task iterating the same stream gets ConcurrentIterationError, the first keeps going."""

    async def run() -> None:
        refused = asyncio.Event()

        async def slow() -> object:
            await refused.wait()  # the first consumer waits in here until the second was refused
            yield torch.randn(12, 64)
            yield torch.randn(12, 64)

        async with streamdec.StreamDecoder(codec, mode=mode) as dec:  # type: ignore[arg-type]
            tiles = dec.decode_tiles(slow())
            async with tiles:
                first = asyncio.ensure_future(anext(tiles))
                await asyncio.sleep(0.05)
                with pytest.raises(ConcurrentIterationError, match="one consumer"):
                    await anext(tiles)
                refused.set()
                await first

    asyncio.run(run())


def test_unknown_engine_option_is_a_config_error(codec: streamdec.Codec) -> None:
    """A misspelt option names itself and the options that exist."""
    with pytest.raises(ConfigError, match="max_batchh"):
        streamdec.StreamDecoder(codec, max_batchh=4)


def test_meta_device_chunk_is_an_input_error(codec: streamdec.Codec) -> None:
    """A chunk on the meta device (no data) is refused with a typed error, not NotImplementedError."""

    async def run() -> None:
        async with streamdec.StreamDecoder(codec) as dec:
            with pytest.raises(InputError, match="meta device"):
                async for _ in dec.decode_tiles([torch.empty(8, 64, device="meta")]):
                    pass

    asyncio.run(run())


@pytest.mark.parametrize("mode", MODES)
def test_finite_latents_that_overflow_give_a_typed_error(codec: streamdec.Codec, mode: str) -> None:
    """Latents of +-3e38 are finite but overflow inside the codec: NonFiniteOutputError, not NaN audio,
    from a stream and from a whole-clip decode alike."""
    huge = torch.full((30, 64), 3e38)
    huge[::2] *= -1

    async def run() -> None:
        async with streamdec.StreamDecoder(codec, mode=mode) as dec:  # type: ignore[arg-type]
            with pytest.raises(NonFiniteOutputError, match="NaN or Inf"):
                async for _ in dec.decode_tiles([huge]):
                    pass
            assert dec.stats.open_streams == 0
            with pytest.raises(NonFiniteOutputError, match="clip 1 holds NaN or Inf"):  # whole clips too
                await dec.decode(torch.stack([torch.zeros(30, 64), huge]))

    asyncio.run(run())
