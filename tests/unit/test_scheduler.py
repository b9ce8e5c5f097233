"""The GPU engine's scheduler (pure packing) and its async machinery, run on the CPU with a fake codec."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from streamdec.codecs import load_codec
from streamdec.engine.base import WindowRequest
from streamdec.engine.core import BusyMeter, DecodeEngine, default_batch_buckets
from streamdec.engine.scheduler import (
    BucketKey,
    CoverTable,
    Scheduler,
    linear_cost,
    normalise_buckets,
    plan_cover,
)
from streamdec.errors import ConfigError, EngineClosedError, ShapeError

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


# -- plan_cover --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "overhead", "cover"),
    [
        (1, 4.0, [1]),
        (3, 4.0, [4]),
        (16, 4.0, [16]),
        (17, 4.0, [16, 1]),
        (28, 4.0, [32]),
        (64, 4.0, [64]),
        (130, 4.0, [64, 64, 2]),
        (17, 0.0, [16, 1]),
        (3, 0.0, [2, 1]),
        (17, 1000.0, [32]),
    ],
    ids=lambda v: str(v),
)
def test_plan_cover_picks_cheapest_buckets(count: int, overhead: float, cover: list[int]) -> None:
    """The cover minimises total cost (launch overhead vs padded rows), largest bucket first."""
    assert plan_cover(count, BUCKETS, lambda b: b + overhead) == cover


@given(st.integers(1, 300), st.floats(0.0, 50.0))
def test_plan_cover_always_covers(count: int, overhead: float) -> None:
    """Every cover holds at least ``count`` rows and is sorted largest first."""
    cover = plan_cover(count, BUCKETS, lambda b: b + overhead)
    assert sum(cover) >= count
    assert cover == sorted(cover, reverse=True)
    assert sum(cover) - cover[-1] < count  # no bucket in it is wholly padding


@given(
    st.lists(st.integers(1, 600), min_size=1, max_size=10, unique=True).map(sorted),
    st.lists(st.floats(0.0, 100.0), min_size=10, max_size=10),
    st.lists(st.integers(0, 1200), min_size=1, max_size=20),
)
def test_cover_table_plans_every_count_as_afresh(
    buckets: list[int], extra: list[float], counts: list[int]
) -> None:
    """One table asked for counts in any order (growing, shrinking, repeated) gives each count the cover
    planned for it alone, so the scheduler's one table a group changes no replay it picks."""
    costs = dict(zip(buckets, (b + e for b, e in zip(buckets, extra, strict=False)), strict=False))
    table = CoverTable(buckets, [costs[b] for b in buckets])
    for count in counts:
        assert table.cover(count) == plan_cover(count, buckets, costs.__getitem__)


@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=4, unique=True).map(sorted),
    st.lists(st.integers(0, 20), min_size=4, max_size=4),
    st.integers(0, 40),
)
def test_a_cover_is_the_cheapest_found_by_exhaustive_search(
    buckets: list[int], extra: list[int], count: int
) -> None:
    """Against every multiset of buckets that covers ``count``: no cover is cheaper, then pads fewer
    rows, then replays fewer (whole costs, so sums compare exactly)."""
    costs = {b: b + e for b, e in zip(buckets, extra, strict=False)}
    cover = CoverTable(buckets, [costs[b] for b in buckets]).cover(count)
    assert sum(cover) >= count

    def key(taken: list[int]) -> tuple[int, int, int]:
        return sum(costs[b] for b in taken), sum(taken) - count, len(taken)

    ranges = [range(-(-count // b) + 1) for b in buckets]
    best = min(
        key([b for b, m in zip(buckets, ms, strict=True) for _ in range(m)])
        for ms in itertools.product(*ranges)
        if sum(b * m for b, m in zip(buckets, ms, strict=True)) >= count
    )
    assert key(cover) == best


def test_normalise_buckets_refuses_empty_and_zero() -> None:
    """A bucket set must be non-empty and >= 1."""
    with pytest.raises(ConfigError, match="batch buckets"):
        normalise_buckets(())
    with pytest.raises(ConfigError, match="batch buckets"):
        normalise_buckets((0, 4))
    assert normalise_buckets((8, 1, 4, 4)) == (1, 4, 8)


# -- hold: the latest start that meets every deadline -------------------------------------------------


def _replay_s(key: BucketKey) -> float:
    """A device like a GPU's: 6.5 ms a call plus 0.035 ms a row-frame."""
    return 6.5e-3 + 0.035e-3 * key.batch * key.frames


@settings(max_examples=200, deadline=None)
@given(
    work=st.lists(
        st.tuples(
            st.sampled_from([("step", 4), ("step", 8), ("prime", 12), ("flush", 1)]), st.floats(0.0, 0.3)
        ),
        min_size=1,
        max_size=120,
    ),
    lead=st.floats(0.0, 0.05),
    prime_lead=st.none() | st.floats(0.0, 0.05),
    busy_for=st.floats(0.0, 0.05),
)
def test_hold_ends_in_time_for_every_deadline(
    work: list[tuple[tuple[str, int], float]], lead: float, prime_lead: float | None, busy_for: float
) -> None:
    """For all queues: popping after the hold and replaying back to back (earliest group first, each
    group's cover in turn), every replay ends its kind's lead (``lead``, or primes' own where given)
    before its group's earliest deadline, unless the queue was late already (then there is no hold)."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    for i, ((kind, frames), deadline) in enumerate(work):
        s.push(i, frames, deadline, kind=kind)
    now = 0.0
    leads = None if prime_lead is None else {"prime": prime_lead}
    wait = s.hold(now, _replay_s, lead, device_free_at=now + busy_for, leads=leads)
    t = now + busy_for if wait is None else now + wait
    ends_before_deadline = True
    while (popped := s.pop_batch()) is not None:
        key, items = popped
        t = max(t, now + busy_for) + _replay_s(key)
        due = min(work[i][1] for i in items)
        own = prime_lead if key.kind == "prime" and prime_lead is not None else lead
        ends_before_deadline &= t <= due - own + 1e-9
    if wait is not None:
        assert wait > 0 and ends_before_deadline


def test_hold_waits_for_more_work_until_the_latest_start() -> None:
    """A few steps due in 100 ms on an idle device wait until 100 ms - lead - their replay."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    for i in range(3):
        s.push(i, 4, 0.1, kind="step")
    wait = s.hold(0.0, _replay_s, 0.04)
    assert wait == pytest.approx(0.1 - 0.04 - _replay_s(BucketKey(4, 4, "step")))


def test_a_kind_with_a_lead_of_its_own_waits_longer_for_company() -> None:
    """Primes due in 80 ms wait until 80 ms - 70 ms - their replay with the common lead, and 30 ms later
    with a lead of 40 ms of their own; a step queued beside them keeps the common lead."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    for i in range(3):
        s.push(i, 12, 0.08, kind="prime")
    prime = _replay_s(BucketKey(4, 12, "prime"))
    assert s.hold(0.0, _replay_s, 0.07) == pytest.approx(0.08 - 0.07 - prime)
    assert s.hold(0.0, _replay_s, 0.07, leads={"prime": 0.04}) == pytest.approx(0.08 - 0.04 - prime)
    s.push(3, 4, 0.09, kind="step")  # due later, but its lead is the common one
    step = _replay_s(BucketKey(1, 4, "step"))
    assert s.hold(0.0, _replay_s, 0.07, leads={"prime": 0.04}) == pytest.approx(
        min(0.08 - 0.04 - prime, 0.09 - 0.07 - prime - step)
    )


def test_hold_pops_at_once_when_due_full_or_unmeasured() -> None:
    """Work due now, a full largest bucket, or a replay time nobody measured: no hold."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    s.push(0, 11, 0.0, kind="prime")
    assert s.hold(0.0, _replay_s, 0.04) is None
    s = Scheduler(BUCKETS)
    for i in range(64):
        s.push(i, 4, 10.0, kind="step")
    assert s.hold(0.0, _replay_s, 0.04) is None
    s = Scheduler(BUCKETS)
    s.push(0, 4, 10.0, kind="step")
    assert s.hold(0.0, lambda key: None, 0.04) is None


# -- Scheduler ---------------------------------------------------------------------------------------


def test_most_urgent_group_goes_first() -> None:
    """The group holding the earliest deadline is replayed first, its windows most urgent first."""
    s: Scheduler[str] = Scheduler(BUCKETS)
    s.push("a70", 70, deadline=5.0)
    s.push("b126", 126, deadline=1.0)
    s.push("c126", 126, deadline=3.0)
    s.push("d126", 126, deadline=2.0)
    key, items = s.pop_batch() or (None, [])
    assert key == BucketKey(4, 126)
    assert items == ["b126", "d126", "c126"]
    assert s.pop_batch() == (BucketKey(1, 70), ["a70"])
    assert s.pop_batch() is None


def test_ties_are_fifo() -> None:
    """Equal deadlines keep arrival order."""
    s: Scheduler[int] = Scheduler((1, 2, 4))
    for i in range(4):
        s.push(i, 70, deadline=0.0)
    assert s.pop_batch() == (BucketKey(4, 70), [0, 1, 2, 3])


def test_cancelled_ticket_is_never_popped() -> None:
    """A withdrawn window frees its slot: later pops skip it and pending drops at once."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    tickets = [s.push(i, 70, deadline=float(i)) for i in range(3)]
    assert s.cancel(tickets[0])
    assert not s.cancel(tickets[0])
    assert s.pending == 2
    assert s.pop_batch() == (BucketKey(2, 70), [1, 2])
    assert not s.cancel(tickets[1])  # already popped
    assert s.pending == 0


def test_empty_groups_are_dropped() -> None:
    """Many distinct lengths leave no bookkeeping behind once served or cancelled."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    for frames in range(1, 200):
        t = s.push(frames, frames, 0.0)
        if frames % 2:
            s.cancel(t)
    while s.pop_batch() is not None:
        pass
    assert s._groups == {} and s._live == {}


def test_over_full_group_takes_largest_bucket_first() -> None:
    """More windows than the largest bucket: the most urgent 64 go first."""
    s: Scheduler[int] = Scheduler(BUCKETS, cost=linear_cost(4.0))
    for i in range(100):
        s.push(i, 126, deadline=float(100 - i))
    key, items = s.pop_batch() or (None, [])
    assert key == BucketKey(64, 126)
    assert items == list(range(99, 35, -1))


def test_measured_cost_changes_the_choice() -> None:
    """With a cost table where batch 4 costs as much as batch 2, three windows share one replay of 4."""
    costs = {1: 1.0, 2: 1.2, 4: 1.2}
    s: Scheduler[int] = Scheduler((1, 2, 4), cost=lambda key: costs[key.batch])
    for i in range(3):
        s.push(i, 70, 0.0)
    assert s.pop_batch() == (BucketKey(4, 70), [0, 1, 2])


def test_a_remembered_cover_is_replanned_after_the_cost_changes() -> None:
    """Covers are remembered per (kind, frames, count); forget_plans() makes a changed cost count."""
    costs = {1: 1.0, 2: 1.2, 4: 5.0}
    s: Scheduler[int] = Scheduler((1, 2, 4), cost=lambda key: costs[key.batch])
    for i in range(6):
        s.push(i, 70, 0.0)
    assert s.pop_batch() == (BucketKey(2, 70), [0, 1])  # 4 costs more than two 2s
    costs[4] = 1.2
    for i in range(6, 8):
        s.push(i, 70, 0.0)
    assert s.pop_batch() == (BucketKey(2, 70), [2, 3])  # six live again: the remembered cover
    s.forget_plans()
    for i in range(8, 10):
        s.push(i, 70, 0.0)
    assert s.pop_batch() == (BucketKey(4, 70), [4, 5, 6, 7])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from((70, 126, 318, 33)), st.floats(0, 100), st.booleans()),
        min_size=1,
        max_size=150,
    )
)
def test_every_live_window_is_popped_once(items: list[tuple[int, float, bool]]) -> None:
    """Whatever arrives or is cancelled: each live window comes out once, in a bucket of its own length,
    and each pop starts with the most urgent live window."""
    s: Scheduler[int] = Scheduler(BUCKETS)
    tickets = [s.push(i, frames, deadline) for i, (frames, deadline, _) in enumerate(items)]
    for t, (_, _, cancel) in zip(tickets, items, strict=True):
        if cancel:
            s.cancel(t)
    live = {i for i, (_, _, cancel) in enumerate(items) if not cancel}
    seen: list[int] = []
    while live - set(seen):
        remaining = sorted(live - set(seen), key=lambda i: (items[i][1], i))
        key, batch = s.pop_batch() or (BucketKey(0, 0), [])
        assert batch and batch[0] == remaining[0]
        assert len(batch) <= key.batch
        assert all(items[i][0] == key.frames for i in batch)
        assert [items[i][1] for i in batch] == sorted(items[i][1] for i in batch)
        seen.extend(batch)
    assert sorted(seen) == sorted(live)
    assert s.pop_batch() is None and s.pending == 0


def test_busy_meter_reads_the_share_of_recent_time_spent_on_calls() -> None:
    """Back-to-back 10 ms calls read as busy all the time; half as many as half; idle, it decays."""
    full, half = BusyMeter(1.0), BusyMeter(1.0)
    for i in range(1, 1001):
        full.add(i * 0.01, 0.01)
        if i % 2 == 0:
            half.add(i * 0.01, 0.01)
    assert full.fraction(10.0) == pytest.approx(1.0, abs=0.01)
    assert half.fraction(10.0) == pytest.approx(0.5, abs=0.01)
    assert full.fraction(14.0) < 0.05 and BusyMeter(1.0).fraction(5.0) == 0.0


# -- the engine's async machinery on the CPU (eager tier) ----------------------------------------------


class FakeCodec(nn.Module):
    """A one-conv 'codec' with context (2, 2), hop 4 and 2 channels: enough to check slicing and batching."""

    latent_dim, hop_size, channels, sample_rate = 8, 4, 2, 16

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.conv = nn.Conv1d(8, 8, 5, padding=2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen))
        self.register_buffer("global_mean", torch.full((8,), 0.25))
        self.calls: list[tuple[int, ...]] = []
        self.gate = threading.Event()  # synthesize() waits here: lets a test hold the device thread
        self.gate.set()

    @property
    def pad_latent(self) -> Tensor:
        return -self.global_mean

    def denormalize(self, z: Tensor) -> Tensor:
        return z + self.global_mean

    def numerics(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def synthesize(self, x: Tensor) -> Tensor:  # [B, 8, T] -> [B, 2, 4T]
        self.calls.append(tuple(x.shape))
        self.gate.wait(timeout=30)
        y = self.conv(x)
        b, _, t = y.shape
        return y.view(b, 2, 4, t).permute(0, 1, 3, 2).reshape(b, 2, 4 * t)

    @torch.inference_mode()
    def decode(self, z: Tensor) -> Tensor:
        return self.synthesize(self.denormalize(z).transpose(1, 2)).float()


def _request(frames: int, seed: int, emit_offset: int = 2, emit_frames: int = 3, deadline: float = 0.0):
    latents = torch.randn(frames, 8, generator=torch.Generator().manual_seed(seed))
    return WindowRequest(seed, latents, emit_offset, emit_frames, deadline)


def _expected(codec: FakeCodec, req: WindowRequest) -> Tensor:
    audio = codec.decode(req.latents[None])[0]
    return audio[:, req.emit_offset * 4 : (req.emit_offset + req.emit_frames) * 4]


@pytest.mark.parametrize("completion", ["thread", "poll"])
async def test_cpu_engine_decodes_and_batches(completion: str) -> None:
    """Concurrent windows of many streams come back right and share device calls."""
    codec = FakeCodec()
    engine = DecodeEngine(codec, completion=completion, max_inflight=1)  # type: ignore[arg-type]
    await engine.start()
    requests = [_request(12 if i % 3 else 9, i, emit_offset=i % 4) for i in range(40)]
    outs = await asyncio.gather(*(engine.decode_window(r) for r in requests))
    for r, out in zip(requests, outs, strict=True):
        assert out.shape == (2, r.emit_frames * 4)
        torch.testing.assert_close(out, _expected(codec, r), rtol=1e-5, atol=1e-5)
    stats = engine.stats
    assert stats.windows == 40 and stats.decodes < 40 and stats.queued == 0
    assert stats.by_tier == {"eager": stats.decodes}
    await engine.aclose()


async def test_engine_keeps_a_record_of_its_device_calls() -> None:
    """Each device call is recorded once its results are handed over: its bucket, rows carrying work,
    the earliest deadline among them, and the times it was chosen, launched and finished, in that order."""
    codec = FakeCodec()
    engine = DecodeEngine(codec, max_inflight=1)  # type: ignore[arg-type]
    await engine.start()
    assert engine.recent_calls() == []
    requests = [_request(12, i, deadline=10.0 + i) for i in range(5)]
    await asyncio.gather(*(engine.decode_window(r) for r in requests))
    # The completion thread records a call right after handing its results over: the awaiting loop may
    # resume first.
    for _ in range(500):
        if len(engine.recent_calls()) == engine.stats.decodes:
            break
        await asyncio.sleep(0.002)
    calls = engine.recent_calls()
    assert len(calls) == engine.stats.decodes >= 1
    assert sum(c.live for c in calls) == 5
    for c in calls:
        assert (c.kind, c.frames) == ("window", 12) and 1 <= c.live <= c.batch
        assert c.decided <= c.launched <= c.finished
        assert c.device_s is None  # CPU: no device events
    assert min(c.due for c in calls) == 10.0
    await engine.aclose()


async def test_cpu_engine_cancel_frees_slot() -> None:
    """A window cancelled while queued is never decoded and counts as cancelled."""
    codec = FakeCodec()
    engine = DecodeEngine(codec, max_inflight=1)  # type: ignore[arg-type]
    await engine.start()
    codec.gate.clear()  # the first decode holds the device thread; everything after it stays queued
    first = asyncio.ensure_future(engine.decode_window(_request(12, 1, deadline=0.0)))
    doomed = asyncio.ensure_future(engine.decode_window(_request(11, 2, deadline=1.0)))
    await asyncio.sleep(0.01)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    codec.gate.set()
    assert (await first).shape == (2, 12)
    assert (await engine.decode_window(_request(12, 3))).shape == (2, 12)
    assert (1, 8, 11) not in codec.calls
    assert engine.stats.cancelled == 1 and engine.stats.queued == 0
    await engine.aclose()


async def test_cpu_engine_results_are_independent_of_each_other_and_of_the_engine() -> None:
    """Two results of one batch are views of that call's own output block: writing to one changes
    neither the other nor anything the engine decodes next."""
    codec = FakeCodec()
    engine = DecodeEngine(codec)  # type: ignore[arg-type]
    await engine.start()
    r1, r2 = _request(12, 1), _request(12, 2)
    a, b = await asyncio.gather(engine.decode_window(r1), engine.decode_window(r2))
    a.fill_(7.0)
    torch.testing.assert_close(b, _expected(codec, r2), rtol=1e-5, atol=1e-5)
    again = await engine.decode_window(_request(12, 1))
    torch.testing.assert_close(again, _expected(codec, r1), rtol=1e-5, atol=1e-5)
    await engine.aclose()


async def test_cpu_engine_stages_latents_of_any_float_dtype_as_float32() -> None:
    """Windows in float16 or float64 decode as their float32 values would (the staging casts)."""
    codec = FakeCodec()
    engine = DecodeEngine(codec)  # type: ignore[arg-type]
    await engine.start()
    base = [_request(12, i) for i in range(3)]
    mixed = [
        WindowRequest(r.stream_id, r.latents.to(dtype), r.emit_offset, r.emit_frames, r.deadline)
        for r, dtype in zip(base, (torch.float16, torch.float64, torch.float32), strict=True)
    ]
    outs = await asyncio.gather(*(engine.decode_window(r) for r in mixed))
    for r, out in zip(mixed, outs, strict=True):
        as_f32 = WindowRequest(r.stream_id, r.latents.float(), r.emit_offset, r.emit_frames, r.deadline)
        torch.testing.assert_close(out, _expected(codec, as_f32), rtol=1e-5, atol=1e-5)
    await engine.aclose()


async def test_cpu_engine_rejects_bad_windows_and_closed_use() -> None:
    """Shape errors are typed; after aclose() every call raises EngineClosedError."""
    engine = DecodeEngine(FakeCodec())  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="expected"):
        await engine.decode_window(WindowRequest(0, torch.randn(10, 7), 0, 1))
    with pytest.raises(ShapeError, match="outside"):
        await engine.decode_window(WindowRequest(0, torch.randn(10, 8), 8, 5))
    await engine.aclose()
    with pytest.raises(EngineClosedError):
        await engine.decode_window(_request(12, 0))


@pytest.mark.parametrize(
    "kwargs",
    [{"completion": "x"}, {"max_inflight": 0}, {"max_graphs": 0}, {"on_frozen_miss": "skip"}],
    ids=str,
)
def test_engine_refuses_bad_options(kwargs: dict[str, object]) -> None:
    """Bad options fail at construction with a ConfigError naming the value."""
    with pytest.raises(ConfigError):
        DecodeEngine(FakeCodec(), **kwargs)  # type: ignore[arg-type]


def test_env_flags_turn_tiers_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """STREAMDEC_NO_GRAPHS / STREAMDEC_NO_COMPILE override the constructor flags."""
    monkeypatch.setenv("STREAMDEC_NO_GRAPHS", "1")
    monkeypatch.setenv("STREAMDEC_NO_COMPILE", "1")
    engine = DecodeEngine(FakeCodec())  # type: ignore[arg-type]
    assert not engine.options.graphs and not engine.options.compile


@pytest.mark.parametrize(
    ("slots", "top"), [(0, 64), (1, 64), (64, 64), (65, 128), (200, 256), (448, 256), (4096, 256)]
)
def test_default_batch_buckets_follow_the_slots(slots: int, top: int) -> None:
    buckets = default_batch_buckets(slots)
    assert buckets[0] == 1 and buckets[-1] == top
    assert buckets == tuple(2**i for i in range(len(buckets)))


def test_a_stateful_engine_steps_in_large_buckets_and_keeps_windows_small() -> None:
    """By default real-time steps fill what the slots allow (within the frame budget); windows, primes
    and flushes keep their own limits; buckets given explicitly are every kind's."""
    codec = load_codec("tiny")
    engine = DecodeEngine(codec, max_streams=448)
    assert engine.buckets_for("step", 4)[-1] == 256
    assert engine.buckets_for("step", 16)[-1] == 64  # 1,024 rows x frames
    assert engine.buckets_for("window", 70)[-1] == 64
    assert engine.buckets_for("prime", 12)[-1] == engine.buckets_for("flush", 4)[-1] == 16
    assert DecodeEngine(codec, max_streams=32).buckets_for("step", 4)[-1] == 64
    explicit = DecodeEngine(codec, max_streams=448, batch_buckets=(1, 8, 128))
    assert explicit.buckets_for("window", 70) == explicit.buckets_for("step", 4) == (1, 8, 128)
