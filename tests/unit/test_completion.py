"""Inflight.cut: every live waiter gets its own slice of the batch output, as values the engine can no
longer change, and a waiter withdrawn in flight gets nothing."""

from __future__ import annotations

import asyncio

import torch

from streamdec.engine.completion import Inflight, Waiter


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

    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[torch.Tensor], torch.Tensor]]] = {}
    item.cut(by_loop)
    host.fill_(float("nan"))  # the engine reuses its buffer: what was handed out must not change

    delivered = dict(by_loop[loop])
    assert withdrawn.future not in delivered and len(delivered) == 3
    for w in waiters:
        assert torch.equal(delivered[w.future], expected[w.row, :, w.lo : w.hi])
    assert item.host.numel() == 0  # the engine's block is let go at once
