"""Inflight.cut: every live waiter gets its own part of the call's output, as values the engine can no
longer change, and a waiter withdrawn in flight gets nothing; each part's finiteness and s16 form, which
the call computes once for all its rows, equal what the per-tile functions give for that part alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.engine.completion import Inflight, Waiter
from streamdec.engine.output import CallOutput, DecodedAudio
from streamdec.io import pcm16
from streamdec.session import all_finite


async def test_cut_hands_each_waiter_its_slice_and_nothing_aliases_the_engine_buffer() -> None:
    loop = asyncio.get_running_loop()
    host = torch.randn(3, 2, 50)
    expected = host.clone()
    waiters = [
        Waiter(loop.create_future(), loop, row, lo, hi) for row, lo, hi in ((2, 5, 40), (0, 0, 50), (1, 7, 8))
    ]
    withdrawn = Waiter(loop.create_future(), loop, 1, 0, 50)
    withdrawn.future.cancel()
    item = Inflight(host, [*waiters, withdrawn], None)

    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[DecodedAudio], DecodedAudio]]] = {}
    item.cut(by_loop)
    host.fill_(float("nan"))  # the engine reuses its buffer: what was handed out must not change

    delivered = dict(by_loop[loop])
    assert withdrawn.future not in delivered and len(delivered) == 3
    for w in waiters:
        part = delivered[w.future]
        assert torch.equal(part.samples, expected[w.row, :, w.lo : w.hi])
        assert part.all_finite() and part.pcm16() == pcm16(expected[w.row, :, w.lo : w.hi])
    assert item.host.numel() == 0  # the engine's block is let go at once


async def test_a_call_whose_waiters_were_all_withdrawn_hands_nothing_out() -> None:
    loop = asyncio.get_running_loop()
    gone = Waiter(loop.create_future(), loop, 0, 0, 4)
    gone.future.cancel()
    item = Inflight(torch.randn(1, 1, 4), [gone], None)
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[DecodedAudio], DecodedAudio]]] = {}
    item.cut(by_loop)
    assert by_loop == {} and item.host.numel() == 0


_SPECIALS = (float("nan"), float("inf"), float("-inf"), 1.0, -1.0, 2.5, -3.0, 0.49999997, 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    channels=st.integers(1, 3),
    samples=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    specials=st.integers(0, 4),
    data=st.data(),
)
def test_each_part_is_checked_and_converted_as_it_would_be_alone(
    rows: int, channels: int, samples: int, seed: int, specials: int, data: st.DataObject
) -> None:
    """For every block, every part: all_finite() and pcm16() as the per-tile functions on the part's own
    samples; a row that holds NaN or Inf outside a part does not fail that part."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((rows, channels, samples)) * 0.9).astype(np.float32)
    for _ in range(specials):  # out-of-range and non-finite samples, anywhere
        at = tuple(int(rng.integers(n)) for n in values.shape)
        values[at] = _SPECIALS[int(rng.integers(len(_SPECIALS)))]
    call = CallOutput(torch.from_numpy(values.copy()))
    for row in range(rows):
        lo = data.draw(st.integers(0, samples - 1))
        hi = data.draw(st.integers(lo + 1, samples))
        part = call.part(row, lo, hi)
        alone = values[row, :, lo:hi]
        assert np.array_equal(part.samples.numpy(), alone, equal_nan=True)
        assert part.all_finite() == all_finite(alone)
        if all_finite(alone):  # non-finite audio never reaches the wire (its stream ends instead)
            assert part.pcm16() == pcm16(alone)


def test_a_part_built_without_a_call_computes_both_itself() -> None:
    samples = torch.tensor([[0.5, -2.0, float("nan")]])
    part = DecodedAudio(samples)
    assert not part.all_finite()
    finite = DecodedAudio(torch.tensor([[0.5, -2.0], [1.0, 0.25]]))
    assert finite.all_finite() and finite.pcm16() == pcm16(finite.samples)


@pytest.mark.parametrize("channels", [1, 2])
def test_the_block_is_converted_once_for_all_its_parts(channels: int) -> None:
    call = CallOutput(torch.rand(3, channels, 16) * 2 - 1)
    first = call.part(0, 0, 16).pcm16()
    block = call.s16()
    assert call.part(2, 3, 9).pcm16() == pcm16(call.samples[2, :, 3:9])
    assert call.s16() is block and first == pcm16(call.samples[0])
