"""Inflight.cut: every live waiter gets its own part of the call's output, as values the engine can no
longer change, and a waiter withdrawn in flight gets nothing; each part's finiteness and s16 form, which
the call computes once for all its rows, equal what the per-tile functions give for that part alone. A
loop's Mailbox hands every result posted to it to its receiver, in order, with one delivery pending at a
time, and drops those withdrawn meanwhile."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.engine.completion import Inflight, Mailbox, Waiter
from streamdec.engine.output import CallOutput, DecodedAudio
from streamdec.io import pcm16
from streamdec.session import all_finite


class _Receiver:
    """A submitted request as completion sees it: records what it is handed."""

    def __init__(self, mailbox: Mailbox, name: Any = None) -> None:
        self.mailbox, self.name = mailbox, name
        self.cancelled = False
        self.got: list[tuple[DecodedAudio | None, BaseException | None]] = []

    def on_done(self, audio: DecodedAudio | None, error: BaseException | None) -> None:
        self.got.append((audio, error))


def _posts() -> dict[Mailbox, list[Any]]:
    return {}


async def test_cut_hands_each_waiter_its_slice_and_nothing_aliases_the_engine_buffer() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    host = torch.randn(3, 2, 50)
    expected = host.clone()
    waiters = [Waiter(_Receiver(mailbox), row, lo, hi) for row, lo, hi in ((2, 5, 40), (0, 0, 50), (1, 7, 8))]
    withdrawn = Waiter(_Receiver(mailbox), 1, 0, 50)
    withdrawn.awaiting.cancelled = True
    item = Inflight(host, [*waiters, withdrawn], None)

    posts = _posts()
    item.cut(posts)
    host.fill_(float("nan"))  # the engine reuses its buffer: what was handed out must not change

    delivered = {id(a): audio for a, audio, _ in posts[mailbox]}
    assert id(withdrawn.awaiting) not in delivered and len(delivered) == 3
    for w in waiters:
        part = delivered[id(w.awaiting)]
        assert part is not None
        assert torch.equal(part.samples, expected[w.row, :, w.lo : w.hi])
        assert part.all_finite() and part.pcm16() == pcm16(expected[w.row, :, w.lo : w.hi])
    assert item.host.numel() == 0  # the engine's block is let go at once


async def test_a_call_whose_waiters_were_all_withdrawn_hands_nothing_out() -> None:
    gone = Waiter(_Receiver(Mailbox(asyncio.get_running_loop())), 0, 0, 4)
    gone.awaiting.cancelled = True
    item = Inflight(torch.randn(1, 1, 4), [gone], None)
    posts = _posts()
    item.cut(posts)
    assert posts == {} and item.host.numel() == 0


async def test_parts_made_in_inference_mode_may_still_be_written_to() -> None:
    """The device thread decodes under inference mode; what callers get back is ordinary audio."""
    mailbox = Mailbox(asyncio.get_running_loop())
    receiver = _Receiver(mailbox)
    with torch.inference_mode():
        item = Inflight(torch.randn(1, 1, 4), [Waiter(receiver, 0, 0, 4)], None)
        posts = _posts()
        item.cut(posts)
    ((_, audio, _),) = posts[mailbox]
    assert audio is not None
    audio.samples.fill_(0.5)
    assert bool((audio.samples == 0.5).all())


async def test_a_mailbox_delivers_every_post_in_order_and_drops_the_withdrawn() -> None:
    loop = asyncio.get_running_loop()
    mailbox = Mailbox(loop)
    receivers = [_Receiver(mailbox, i) for i in range(6)]
    delivered: list[Any] = []
    for r in receivers:
        r.on_done = lambda audio, error, r=r: delivered.append(r.name)  # type: ignore[method-assign]
    mailbox.post([(r, None, None) for r in receivers[:3]])
    mailbox.post([(r, None, None) for r in receivers[3:]])
    receivers[4].cancelled = True  # withdrawn after its result was posted
    while len(delivered) < 5:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert delivered == [0, 1, 2, 3, 5]


async def test_a_mailbox_posted_to_from_threads_loses_nothing() -> None:
    """Posts from two threads while the loop delivers: every result arrives exactly once."""
    loop = asyncio.get_running_loop()
    mailbox = Mailbox(loop)
    counts = [0] * 2000
    done = asyncio.Event()

    class Counter:
        cancelled = False

        def __init__(self, i: int) -> None:
            self.i, self.mailbox = i, mailbox

        def on_done(self, audio: Any, error: Any) -> None:
            counts[self.i] += 1
            if sum(counts) == len(counts):
                done.set()

    def poster(first: int) -> None:
        for i in range(first, len(counts), 2):
            mailbox.post([(Counter(i), None, None)])

    threads = [threading.Thread(target=poster, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    await asyncio.wait_for(done.wait(), 30)
    for t in threads:
        t.join()
    await asyncio.sleep(0.01)
    assert counts == [1] * len(counts)


async def test_a_failing_receiver_does_not_cost_the_others_their_results() -> None:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context["exception"]))
    mailbox = Mailbox(loop)
    bad, good = _Receiver(mailbox), _Receiver(mailbox)

    def boom(audio: Any, error: Any) -> None:
        raise RuntimeError("receiver failed")

    bad.on_done = boom  # type: ignore[method-assign]
    mailbox.post([(bad, None, None), (good, None, None)])
    while not good.got:
        await asyncio.sleep(0)
    assert isinstance(seen[0], RuntimeError) and good.got == [(None, None)]


# 3e38: finite, but two of them overflow a float32 sum (the block's quick check), never a float64 one
_SPECIALS = (float("nan"), float("inf"), float("-inf"), 1.0, -1.0, 2.5, -3.0, 0.49999997, 1e-9, 3e38, -3e38)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    channels=st.integers(1, 3),
    samples=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    specials=st.integers(0, 6),
    data=st.data(),
)
def test_each_part_is_checked_and_converted_as_it_would_be_alone(
    rows: int, channels: int, samples: int, seed: int, specials: int, data: st.DataObject
) -> None:
    """For every block, every part: all_finite() and pcm16() as the per-tile functions on the part's own
    samples; a row that holds NaN or Inf outside a part does not fail that part."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((rows, channels, samples)) * 0.9).astype(np.float32)
    for _ in range(specials):  # out-of-range, huge and non-finite samples, anywhere
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


def test_finite_audio_whose_row_sum_overflows_is_still_finite() -> None:
    """The block's per-row check may call huge finite audio non-finite; the part's exact check does not."""
    call = CallOutput(torch.tensor([[[3e38, 3e38, 0.5]], [[0.1, 0.2, 0.3]]]))
    assert call.part(0, 0, 3).all_finite() and call.part(1, 0, 3).all_finite()
    nan = CallOutput(torch.tensor([[[3e38, float("nan"), 0.5]]]))
    assert not nan.part(0, 0, 3).all_finite() and nan.part(0, 2, 3).all_finite()


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
