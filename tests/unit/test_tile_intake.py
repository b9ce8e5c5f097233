"""A stream behind real time decodes the chunks already at hand in larger calls, exactly."""

from __future__ import annotations

from collections import deque

import pytest
import torch

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
