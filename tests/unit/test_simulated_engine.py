"""The simulated engine (a measurement tool): cost model, stand-in audio, batching, and the Engine contract."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec import StreamDecoder
from streamdec.engine.base import Engine, StepRequest, WindowRequest
from streamdec.engine.core import DecodeEngine
from streamdec.engine.scheduler import BucketKey
from streamdec.engine.simulated import (
    ReplayTable,
    SimulatedCost,
    SimulatedTier,
    bucket_seconds,
    call_seconds,
    plan_calls,
    simulated_engine,
    sine_period,
    stand_in_audio,
)
from streamdec.errors import ConfigError, EngineClosedError

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("text", "cost"),
    [("2,0.01", SimulatedCost(2.0, 0.01)), ("0,0", SimulatedCost()), (" 1.5 ", SimulatedCost(1.5, 0.0))],
)
def test_cost_parses_fixed_and_per_frame_ms(text: str, cost: SimulatedCost) -> None:
    assert SimulatedCost.parse(text) == cost


@pytest.mark.parametrize("text", ["", "a,b", "1,2,3", "-1,0", "nan", "1,inf"])
def test_bad_cost_is_a_config_error_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="simulated cost"):
        SimulatedCost.parse(text)


def test_call_seconds_is_fixed_plus_per_frame_over_all_rows() -> None:
    assert call_seconds(SimulatedCost(2.0, 0.5), [10, 30]) == pytest.approx((2.0 + 0.5 * 40) / 1000)


def test_a_replay_table_interpolates_between_a_buckets_empty_and_full_replays() -> None:
    """A call of ``live`` of a bucket's rows costs its empty replay plus that share of the rest; a bucket
    the table did not measure costs what the fixed and per-frame model says for its live rows."""
    step = BucketKey(64, 4, "step")
    cost = SimulatedCost(2.0, 0.5, ReplayTable({step: 11.0}, {step: 3.0}))
    assert bucket_seconds(cost, step, 64) == pytest.approx(0.011)
    assert bucket_seconds(cost, step, 16) == pytest.approx(0.005)
    assert bucket_seconds(cost, step, 0) == pytest.approx(0.003)
    other = BucketKey(16, 4, "step")
    assert bucket_seconds(cost, other, 3) == call_seconds(cost, [4] * 3)
    unmeasured_empty = SimulatedCost(replays=ReplayTable({step: 11.0}))
    assert bucket_seconds(unmeasured_empty, step, 1) == pytest.approx(0.011)  # no empty replay: full


def test_a_replay_table_reads_a_stateful_warmup_and_refuses_anything_else() -> None:
    table = ReplayTable.from_warmup(
        {"replay_ms": {"step 64x4": 11.0, "prime 16x12": 5.2}, "empty_replay_ms": {"step 64x4": 1.7}}
    )
    assert table.full_ms == {BucketKey(64, 4, "step"): 11.0, BucketKey(16, 12, "prime"): 5.2}
    assert table.empty_ms == {BucketKey(64, 4, "step"): 1.7}
    for bad in ({}, {"replay_ms": {}}, {"replay_ms": {"step": 1.0}}, {"replay_ms": {"step 4x4": "slow"}}):
        with pytest.raises(ConfigError, match="replay"):
            ReplayTable.from_warmup(bad)


async def test_a_stateful_stream_on_measured_replays_costs_each_call_its_bucket_at_its_live_rows(
    codec: Any,
) -> None:
    """Every call sleeps, and reports as its device time, the table's replay of its bucket at the rows it
    carried; the scheduler plans with the bucket's full replay."""
    table = ReplayTable(
        {
            BucketKey(b, f, k): 10.0 + f + b
            for k in ("prime", "step", "flush")
            for b in (1, 2, 4)
            for f in range(33)
        },
        {BucketKey(b, f, k): 1.0 for k in ("prime", "step", "flush") for b in (1, 2, 4) for f in range(33)},
    )
    cost = SimulatedCost(replays=table)
    slept: list[float] = []
    engine = simulated_engine(codec, cost=cost, max_batch=4, max_streams=4, sleep=slept.append)
    latents = torch.randn(3, 40, codec.latent_dim)

    async def stream(dec: StreamDecoder, z: torch.Tensor) -> int:
        return sum([tile.samples.shape[-1] async for tile in dec.decode_tiles(list(z.split(4)))])

    try:
        async with StreamDecoder(codec, mode="stateful", engine=engine, min_emit=4, max_emit=8) as dec:
            samples = await asyncio.gather(*(stream(dec, z) for z in latents))
    finally:
        await engine.aclose()
    assert samples == [40 * codec.hop_size] * 3
    calls = engine.recent_calls()
    assert {c.kind for c in calls} == {"prime", "step", "flush"}
    for call in calls:
        key = BucketKey(call.batch, call.frames, call.kind)
        assert call.device_s == pytest.approx(table.seconds(key, call.live))
        assert call.estimate_s == pytest.approx(table.seconds(key, call.batch))
    assert sorted(slept) == pytest.approx(sorted(c.device_s for c in calls))


def _request(
    frames: int, deadline: float = 0.0, first: float = 0.0, emit: tuple[int, int] = (0, 4), dim: int = 8
) -> WindowRequest:
    latents = torch.zeros(frames, dim)
    latents[:, 0] = first
    return WindowRequest(0, latents, emit[0], emit[1], deadline)


def test_plan_calls_orders_by_deadline_and_caps_the_batch() -> None:
    requests = [_request(8, deadline=d) for d in (3.0, 1.0, 2.0, 0.5, 9.0)]
    assert plan_calls(requests, 2) == [[3, 1], [2, 0], [4]]


def test_stand_in_audio_has_the_emitted_shape_and_follows_the_latents() -> None:
    """``[channels, emit * hop]`` float32, never silent, and a function of the emitted frames only."""
    period = sine_period(480)
    quiet, loud = _request(20, first=-3.0, emit=(5, 6)), _request(20, first=3.0, emit=(5, 6))
    a, b = stand_in_audio(quiet, period, 2), stand_in_audio(loud, period, 2)
    assert a.shape == (2, 6 * 480) and a.dtype == torch.float32
    assert float(a.abs().max()) > 0 and not torch.equal(a, b)
    assert float(b.abs().max()) <= 0.5 + 1e-6
    shifted = WindowRequest(0, quiet.latents[2:], 3, 6)  # same emitted frames, another window
    assert torch.equal(stand_in_audio(shifted, period, 2), a)


@pytest.mark.parametrize("kind", ["prime", "step", "flush"])
def test_a_call_on_first_latents_alone_equals_the_call_on_whole_latents(kind: str) -> None:
    """The engine hands the simulated device each frame's first latent only, in numpy: the same audio,
    and the same tails for the next call, as from the stacked ``[rows, n, D]`` tensor, bit for bit."""
    latents = torch.randn(3, 12, 8)
    whole = SimulatedTier(SimulatedCost(), 480, 2, slots=4, right_frames=7)
    first = SimulatedTier(SimulatedCost(), 480, 2, slots=4, right_frames=7)
    rows = [2, 0, 3]
    for tier in (whole, first):
        tier.tails[:] = np.arange(5 * 7, dtype=np.float32).reshape(5, 7) / 35
    a = whole.call(kind, torch.tensor(rows), latents)
    b = first.call(kind, np.array(rows, dtype=np.int64), latents[:, :, 0].numpy().copy())
    assert torch.equal(a, b)
    assert np.array_equal(whole.tails, first.tails)
    assert torch.equal(whole.windows(latents, 2, 9), first.windows(latents[:, :, 0].numpy(), 2, 9))


async def test_float16_requests_decode_as_their_float32_values(codec: Any) -> None:
    """A request in another float dtype takes the stacked path: the same audio as its float32 values."""
    engine = simulated_engine(codec)
    window = _request(16, dim=codec.latent_dim)
    half = WindowRequest(0, window.latents.half(), window.emit_offset, window.emit_frames)
    exact = WindowRequest(0, half.latents.float(), window.emit_offset, window.emit_frames)
    try:
        got, expected = await asyncio.gather(engine.decode_window(half), engine.decode_window(exact))
    finally:
        await engine.aclose()
    assert torch.equal(got, expected)


async def test_two_loops_waking_the_device_thread_at_once_lose_no_request(codec: Any) -> None:
    """Each loop wakes the sleeping device thread once per turn, and both may find it asleep at the same
    moment: every request of both is decoded, each exactly once."""
    engine = simulated_engine(codec)
    await engine.start()

    async def burst() -> list[tuple[int, ...]]:
        shapes = []
        for _ in range(40):  # waves: the device thread sleeps between them
            done = await asyncio.gather(
                *(engine.decode_window(_request(16, dim=codec.latent_dim)) for _ in range(5))
            )
            shapes += [tuple(o.shape) for o in done]
        return shapes

    other = asyncio.to_thread(asyncio.run, burst())
    try:
        mine, theirs = await asyncio.gather(burst(), other)
    finally:
        await engine.aclose()
    assert mine == theirs == [(codec.channels, 4 * codec.hop_size)] * 200
    assert engine.stats.windows == 400


async def test_windows_queued_during_a_call_share_the_next_call(codec: Any) -> None:
    """Like a device: while one call runs, arriving windows queue and then go out as one batch."""
    entered, release = threading.Event(), threading.Event()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        entered.set()
        release.wait(10)

    engine = simulated_engine(codec, cost=SimulatedCost(1.0, 0.0), sleep=sleep)
    await engine.start()
    first = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
    await asyncio.to_thread(entered.wait, 10)
    rest = [asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim))) for _ in range(5)]
    await asyncio.sleep(0.05)  # let the five reach the queue
    release.set()
    outputs = await asyncio.gather(first, *rest)
    stats = engine.stats
    await engine.aclose()
    assert [tuple(o.shape) for o in outputs] == [(codec.channels, 4 * codec.hop_size)] * 6
    assert stats.windows == 6 and stats.decodes == 2
    assert slept == [pytest.approx(0.001)] * 2


async def test_requests_arriving_between_launch_rounds_go_out_together_in_the_next(codec: Any) -> None:
    """An idle engine launches a request at once; what arrives within ``launch_interval`` of that round's
    start waits for the next round and shares one call there, however far apart it came."""
    engine = simulated_engine(codec, launch_interval=1.0)
    await engine.start()
    try:
        began = time.monotonic()
        await engine.decode_window(_request(16, dim=codec.latent_dim))
        first_s = time.monotonic() - began
        second = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
        await asyncio.sleep(0.05)
        third = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
        await asyncio.gather(second, third)
        stats = engine.stats
    finally:
        await engine.aclose()
    assert first_s < 0.5  # not held for a round: nothing had launched before it
    assert stats.windows == 3 and stats.decodes == 2
    assert [c.live for c in engine.recent_calls()] == [1, 2]


async def test_closing_while_work_waits_for_its_round_fails_that_work_and_stops(codec: Any) -> None:
    """A request waiting for the next launch round is never decoded after ``aclose()``: it fails with
    EngineClosedError, and the device thread stops by the end of the pause."""
    engine = simulated_engine(codec, launch_interval=1.0)
    await engine.start()
    await engine.decode_window(_request(16, dim=codec.latent_dim))
    waiting = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
    await asyncio.sleep(0.05)
    await engine.aclose()
    with pytest.raises(EngineClosedError):
        await waiting
    assert engine.stats.decodes == 1


@pytest.mark.parametrize("interval", [-0.001, float("nan"), float("inf")])
def test_a_bad_launch_interval_is_a_config_error(codec: Any, interval: float) -> None:
    with pytest.raises(ConfigError, match="launch_interval"):
        simulated_engine(codec, launch_interval=interval)


async def test_requests_are_freed_without_the_cycle_collector(codec: Any) -> None:
    """A request and its scheduler ticket let go of each other when it leaves the queue: with a cycle
    between them, every chunk of every stream would leave work for the collector (at 600 server streams,
    about 37,000 objects a second, and full collections of tens of milliseconds that stall every stream)."""
    import gc

    engine = simulated_engine(codec, max_streams=2)
    await engine.start()
    slot = engine.open_slot()
    dim = codec.latent_dim
    assert engine.net is not None
    await engine.decode_step(
        StepRequest(0, slot, "prime", torch.randn(engine.net.min_prime_frames, dim), 0.0)
    )
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            await asyncio.gather(
                engine.decode_step(StepRequest(0, slot, "step", torch.randn(4, dim), 0.0)),
                engine.decode_window(_request(16, dim=dim)),
            )
        gc.collect()
        engine_garbage = [
            type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("streamdec.engine")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        engine.close_slot(slot)
        await engine.aclose()
    assert engine_garbage == []


async def test_a_cancelled_queued_window_is_never_decoded(codec: Any) -> None:
    entered, release = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:
        entered.set()
        release.wait(10)

    engine = simulated_engine(codec, cost=SimulatedCost(1.0, 0.0), sleep=sleep)
    first = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
    await asyncio.to_thread(entered.wait, 10)
    doomed = asyncio.ensure_future(engine.decode_window(_request(16, dim=codec.latent_dim)))
    await asyncio.sleep(0.01)
    doomed.cancel()
    release.set()
    await first
    await engine.aclose()
    assert engine.stats.windows == 1 and engine.stats.cancelled == 1
    with pytest.raises(EngineClosedError):
        await engine.decode_window(_request(16, dim=codec.latent_dim))


@settings(max_examples=25, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_streamed_equals_offline_for_every_chunking(codec: Any, chunks: list[int], seed: int) -> None:
    """For all chunkings: decode_tiles through the simulated engine equals decode() of the whole clip."""
    total = sum(chunks)
    latents = torch.randn(total, codec.latent_dim, generator=torch.Generator().manual_seed(seed))

    async def run() -> tuple[torch.Tensor, torch.Tensor]:
        async with StreamDecoder(codec, engine=simulated_engine(codec), max_emit=16) as dec:
            parts, begin = [], 0
            for n in chunks:
                parts.append(latents[begin : begin + n])
                begin += n
            tiles = [t.samples async for t in dec.decode_tiles(parts)]
            return torch.cat(tiles, dim=-1), await dec.decode(latents)

    streamed, offline = asyncio.run(run())
    assert streamed.shape == (codec.channels, total * codec.hop_size)
    assert torch.equal(streamed, offline)


def test_the_simulated_engine_is_the_one_engine_class(codec: Any) -> None:
    """Simulation is a tier of DecodeEngine, not a second implementation of the Engine interface."""
    import streamdec.engine.simulated  # noqa: F401 - every engine module imported before counting

    assert isinstance(simulated_engine(codec), DecodeEngine)
    ours = [c for c in Engine.__subclasses__() if c.__module__.startswith("streamdec.")]  # not tests' fakes
    assert ours == [DecodeEngine]


@settings(max_examples=20, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_stateful_streamed_equals_offline_for_every_chunking(
    codec: Any, chunks: list[int], seed: int
) -> None:
    """For all chunkings: stateful prime/step/flush through the simulated device equals decode(), bit for bit."""
    total = sum(chunks)
    latents = torch.randn(total, codec.latent_dim, generator=torch.Generator().manual_seed(seed))

    async def run() -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
        engine = simulated_engine(codec, max_streams=2)
        async with StreamDecoder(codec, engine=engine, mode="stateful", max_emit=8) as dec:
            parts = [latents[sum(chunks[:i]) : sum(chunks[: i + 1])] for i in range(len(chunks))]
            tiles = [t.samples async for t in dec.decode_tiles(parts)]
            return torch.cat(tiles, dim=-1), await dec.decode(latents), dec.stats.engine.by_tier

    streamed, offline, tiers = asyncio.run(run())
    assert streamed.shape == (codec.channels, total * codec.hop_size)
    assert torch.equal(streamed, offline)
    assert set(tiers) == {"simulated"}


async def test_stateful_streams_keep_their_own_lag_state(codec: Any) -> None:
    """Two interleaved stateful streams in shared calls: each hears its own frames, in order."""
    engine = simulated_engine(codec, max_streams=4)
    clips = [torch.randn(40, codec.latent_dim, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    async with StreamDecoder(codec, engine=engine, mode="stateful", min_emit=2, max_emit=4) as dec:

        async def one(clip: torch.Tensor) -> torch.Tensor:
            return torch.cat([t.samples async for t in dec.decode_tiles(list(clip.split(3)))], dim=-1)

        got = await asyncio.gather(*(one(c) for c in clips))
        want = [await dec.decode(c) for c in clips]
        steps = dec.stats.engine.windows
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert steps > 2 * 40 // 4  # stateful calls, not one window per clip


def test_stateful_without_slots_is_refused(codec: Any) -> None:
    with pytest.raises(ConfigError, match="max_streams"):
        StreamDecoder(codec, engine=simulated_engine(codec), mode="stateful")


@pytest.mark.parametrize("due", [0.05, 0.3])
async def test_a_streams_first_call_is_due_first_call_due_after_it_is_made(codec: Any, due: float) -> None:
    """The first call's deadline (what the engine batches first calls by) follows ``first_call_due``."""
    engine = simulated_engine(codec, max_streams=2)
    made: list[tuple[float, float]] = []  # (monotonic clock at submit, the request's deadline)
    submit = engine.submit

    def recording(request: Any, on_done: Any) -> Any:
        made.append((time.monotonic(), request.deadline))
        return submit(request, on_done)

    engine.submit = recording  # type: ignore[method-assign]
    clip = torch.randn(24, codec.latent_dim, generator=torch.Generator().manual_seed(3))
    async with StreamDecoder(codec, engine=engine, mode="stateful", first_call_due=due) as dec:
        tiles = [t async for t in dec.decode_tiles([clip])]
    assert tiles and made
    submitted, deadline = made[0]
    assert deadline - submitted == pytest.approx(due, abs=0.02)


@pytest.mark.parametrize("due", [-0.01, float("nan"), float("inf")])
def test_a_bad_first_call_due_is_a_config_error(codec: Any, due: float) -> None:
    with pytest.raises(ConfigError, match="first_call_due"):
        StreamDecoder(codec, engine=simulated_engine(codec, max_streams=2), first_call_due=due)
