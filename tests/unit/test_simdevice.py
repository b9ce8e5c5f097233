"""The modelled device with two lanes (a measurement tool): each lane in order, the lanes at once, each at
its share of speed while both run; its events read like CUDA events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from streamdec import StreamDecoder
from streamdec.codecs import load_codec
from streamdec.engine.lanes import EDGE, MAIN
from streamdec.engine.simdevice import SharedDevice
from streamdec.engine.simulated import SimulatedCost, simulated_engine
from streamdec.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


class Clock:
    """A clock the test moves: the device's thread reads it, so every time it stamps is one of these."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lane_runs_its_calls_in_turn_and_the_lanes_share_the_device() -> None:
    """At 0: a 10 ms step and a 2 ms edge call beside it, at half speed each while both run; then a second
    step queued behind the first. The edge call ends at 4 ms; the first step has done 2 ms of its work by
    then and the rest alone, ending at 12; the second starts there and ends at 13."""
    clock = Clock()
    device = SharedDevice((0.5, 0.5), clock=clock)
    try:
        step_began, step_done = device.launch(MAIN, 0.010)
        edge_began, edge_done = device.launch(EDGE, 0.002)
        next_began, next_done = device.launch(MAIN, 0.001)
        clock.now = 0.1
        device.launch(EDGE, 0.0)  # an advance to 0.1
        for event in (step_done, edge_done, next_began, next_done):
            event.synchronize()
        assert step_began.elapsed_time(edge_began) == 0.0
        assert step_began.elapsed_time(edge_done) == pytest.approx(4.0)
        assert step_began.elapsed_time(step_done) == pytest.approx(12.0)
        assert step_done.elapsed_time(next_began) == pytest.approx(0.0)
        assert next_began.elapsed_time(next_done) == pytest.approx(1.0)
    finally:
        device.close()


def test_a_call_launched_later_starts_when_launched() -> None:
    clock = Clock()
    device = SharedDevice(clock=clock)
    try:
        first = device.launch(MAIN, 0.001)
        clock.now = 0.5
        began, _ = device.launch(MAIN, 0.001)
        assert first[1].query()  # the launch at 0.5 s ran the device to then
        assert first[0].elapsed_time(first[1]) == pytest.approx(1.0)
        assert first[0].elapsed_time(began) == pytest.approx(500.0)
    finally:
        device.close()


@pytest.mark.parametrize("rates", [(0.0, 1.0), (1.0, 1.5), (1.0,), (float("nan"), 1.0)])
def test_shares_of_speed_must_be_in_zero_to_one(rates: Any) -> None:
    with pytest.raises(ConfigError, match="rates"):
        SharedDevice(rates)


def test_two_lanes_on_the_modelled_device_stream_exactly_and_count_an_overlap_once() -> None:
    """A simulated engine with an edge lane on the modelled device: 12 stateful streams give the offline
    decode bit for bit, primes and flushes ran on the edge lane, and the busy time is at most the sum of
    the calls' own times (their union)."""
    codec = load_codec("tiny")
    gen = torch.Generator().manual_seed(3)
    clips = [torch.randn(20 + 3 * i, codec.latent_dim, generator=gen) for i in range(12)]

    async def run() -> None:
        engine = simulated_engine(
            codec, cost=SimulatedCost(1.0, 0.02), max_streams=16, edge_lane=True, overlap=(0.7, 0.6)
        )
        async with StreamDecoder(codec, engine=engine, mode="stateful", max_emit=8) as dec:

            async def one(i: int) -> None:
                await asyncio.sleep(0.004 * i)
                chunks = [clips[i][at : at + 4] for at in range(0, clips[i].shape[0], 4)]
                streamed = torch.cat([t.samples async for t in dec.decode_tiles(chunks)], dim=-1)
                assert torch.equal(streamed, await dec.decode(clips[i]))

            await asyncio.gather(*(one(i) for i in range(len(clips))))
            calls = engine.recent_calls()
            assert {c.lane for c in calls if c.kind in ("prime", "flush")} == {EDGE}
            assert {c.lane for c in calls if c.kind == "step"} == {MAIN}
            own = sum(c.device_s or 0.0 for c in calls)
            assert all(c.device_s is not None and c.device_s > 0 for c in calls)
            assert 0 < engine.stats.decode_seconds <= own + 1e-9

    asyncio.run(run())
