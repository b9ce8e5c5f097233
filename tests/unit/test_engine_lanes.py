"""The two lanes' bookkeeping: slot fences across lanes and the device's busy time as a union."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.cli_errors import UsageError
from streamdec.codecs import load_codec
from streamdec.engine import DecodeEngine
from streamdec.engine.lanes import EDGE, MAIN, BusyUnion, DeviceClock, SlotFences, lane_of
from streamdec.engine.scheduler import BucketKey
from streamdec.engine.simulated import SimulatedCost, simulated_engine
from streamdec.errors import ConfigError
from streamdec.server.cli import _decoder, configure_serve


@dataclass(eq=False)
class FakeFence:
    passed: bool = False
    queries: int = 0

    def query(self) -> bool:
        self.queries += 1
        return self.passed


def test_edges_take_the_edge_lane_only_where_there_are_two() -> None:
    assert [lane_of(k, 2) for k in ("prime", "step", "flush", "window")] == [EDGE, MAIN, EDGE, MAIN]
    assert {lane_of(k, 1) for k in ("prime", "step", "flush", "window")} == {MAIN}


def test_a_call_waits_for_the_other_lanes_unfinished_call_on_its_slots_once() -> None:
    fences: SlotFences[FakeFence] = SlotFences(8)
    prime = FakeFence()
    fences.mark(EDGE, [1, 2, 3], prime)
    assert fences.waits(EDGE, [1, 2, 3]) == []  # same lane: the stream orders them
    assert fences.waits(MAIN, [0, 1, 2, 5]) == [prime]  # one wait for the call, not one per slot
    step = FakeFence()
    fences.mark(MAIN, [0, 1], step)
    assert fences.waits(EDGE, [1, 2]) == [step]  # slot 1 now follows the step; slot 2 still the prime
    assert fences.waits(MAIN, [2]) == [prime]


def test_a_passed_fence_is_forgotten() -> None:
    fences: SlotFences[FakeFence] = SlotFences(4)
    flush = FakeFence(passed=True)
    fences.mark(EDGE, [0], flush)
    assert fences.waits(MAIN, [0]) == []
    assert fences.waits(MAIN, [0]) == []
    assert flush.queries == 1


def test_busy_union_counts_an_overlap_once() -> None:
    busy = BusyUnion()
    assert busy.add(MAIN, 0.0, 10.0) == 10.0
    assert busy.add(EDGE, 2.0, 4.0) == 0.0  # wholly under the step
    assert busy.add(EDGE, 9.0, 12.0) == 2.0
    assert busy.add(MAIN, 11.0, 20.0) == 8.0  # shares 11-12 with the edge call already added


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_busy_union_is_the_measure_of_the_union_for_any_order(data: st.DataObject) -> None:
    """Two lanes of back-to-back calls at integer times, added in any order: the sum is the union."""
    lanes: list[list[tuple[int, int]]] = []
    for _ in range(2):
        t, spans = 0, []
        for gap, length in data.draw(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=8)):
            t += gap
            spans.append((t, t + length))
            t += length
        lanes.append(spans)
    calls = [(lane, a, b) for lane, spans in enumerate(lanes) for a, b in spans]
    order = data.draw(st.permutations(calls))
    busy = BusyUnion()
    total = sum(busy.add(lane, a, b) for lane, a, b in order)
    covered = {t for _, a, b in calls for t in range(a, b)}
    assert total == len(covered)


class FakeEvent:
    """A timed device event at ``ns`` nanoseconds: the interval to a later one read as the device gives it,
    float32 milliseconds; reading backwards fails the test."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def elapsed_time(self, end_event: FakeEvent, /) -> float:
        assert end_event.ns >= self.ns, "an interval read backwards"
        return float(np.float32((end_event.ns - self.ns) / 1e6))


@dataclass
class TimedCall:
    lane: int
    launched: int  # ns on the host's clock, which the device's shares here
    began: int
    done: int


def _finish_all(clock: DeviceClock[FakeEvent], calls: list[TimedCall]) -> list[tuple[float, float]]:
    """Each call's span as the clock reads it, the calls handed over in the order they end (a completer
    per lane, each a microsecond after its call's end)."""
    spans: dict[int, tuple[float, float]] = {}
    for i in sorted(range(len(calls)), key=lambda i: calls[i].done):
        c = calls[i]
        spans[i] = clock.span(FakeEvent(c.began), FakeEvent(c.done), c.launched / 1e9, (c.done + 1_000) / 1e9)
    return [spans[i] for i in range(len(calls))]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_device_clock_never_reads_backwards_and_keeps_each_call_to_a_microsecond(
    data: st.DataObject,
) -> None:
    """Two lanes launching calls at random, each lane in order, finishing in any order across lanes; anchors
    adopted often (every 10 ms) so that calls launched before an adoption are read past it."""
    calls: list[TimedCall] = []
    for lane in (MAIN, EDGE):
        host = free = 0
        ms = 1_000_000
        for gap, latency, length in data.draw(
            st.lists(
                st.tuples(st.integers(0, 300 * ms), st.integers(0, 40 * ms), st.integers(1, 40 * ms)),
                max_size=30,
            )
        ):
            host += gap
            began = max(host + latency, free)  # a lane's calls run in turn
            calls.append(TimedCall(lane, host, began, began + length))
            free = began + length
            host += 1_000  # the next launch comes after this one's
    spans = _finish_all(DeviceClock(FakeEvent(0), every=0.01), calls)
    for c, (start, end) in zip(calls, spans, strict=True):
        assert start == pytest.approx(c.began / 1e9, abs=1e-6)
        assert end == pytest.approx(c.done / 1e9, abs=1e-6)


def test_a_call_in_flight_past_every_kept_anchor_is_read_from_the_origin() -> None:
    """Keeping two anchors, a long call on one lane outlives five adopted from the other: its start is
    read from the origin, which came before every call, never from an anchor after it."""
    ms = 1_000_000
    long = TimedCall(MAIN, 1 * ms, 2 * ms, 500 * ms)
    short = [TimedCall(EDGE, t * ms, t * ms + 100_000, t * ms + 3 * ms) for t in (10, 20, 30, 40, 50)]
    clock: DeviceClock[FakeEvent] = DeviceClock(FakeEvent(0), every=0.001, keep=2)
    spans = _finish_all(clock, [long, *short])
    assert spans[0] == pytest.approx((0.002, 0.5), abs=1e-6)


def test_the_device_clock_places_calls_to_a_microsecond_after_a_day() -> None:
    """A day of one call a second, then two overlapping calls: read from the first event, their times would
    be off by milliseconds (float32 at 8.6e7 ms); from the clock's anchors, their overlap is exact."""
    s = 1_000_000_000
    calls = [TimedCall(MAIN, t * s, t * s + 300_000, t * s + 20_300_000) for t in range(1, 86_400)]
    day = 86_400 * s
    step = TimedCall(MAIN, day, day + 1_000_000, day + 31_000_000)
    prime = TimedCall(EDGE, day + 500_000, day + 5_700_000, day + 12_800_000)
    spans = _finish_all(DeviceClock(FakeEvent(0)), [*calls, step, prime])
    (step_start, step_end), (prime_start, prime_end) = spans[-2:]
    assert step_end - step_start == pytest.approx(0.030, abs=1e-6)
    assert prime_start - step_start == pytest.approx(0.0047, abs=1e-6)
    assert prime_end - prime_start == pytest.approx(0.0071, abs=1e-6)
    origin = FakeEvent(0)  # the same two calls read from the first event, as a single epoch would
    read = [origin.elapsed_time(FakeEvent(t)) / 1e3 for t in (step.began, prime.began)]
    assert abs((read[1] - read[0]) - 0.0047) > 1e-3


def test_the_engine_keeps_an_edge_lane_only_where_asked_or_on_a_gpu_with_slots() -> None:
    codec = load_codec("tiny")
    assert DecodeEngine(codec, max_streams=4).lanes == 1  # a CPU: one lane unless asked
    assert DecodeEngine(codec, max_streams=4, edge_lane=True).lanes == 2
    assert DecodeEngine(codec).lanes == 1
    with pytest.raises(ConfigError, match="edge_lane needs stateful slots"):
        DecodeEngine(codec, edge_lane=True)


def test_serve_edge_lane_flag_reaches_the_engine() -> None:
    """`serve --edge-lane on|off` sets the engine's lanes; auto leaves the engine its default (one on a CPU);
    asking for the lane where there are no primes or flushes, or of the one-lane simulated engine, is a
    usage error."""
    parser = argparse.ArgumentParser()
    configure_serve(parser)
    codec = load_codec("tiny")

    def lanes(*flags: str) -> int:
        return int(_decoder(parser.parse_args(["--codec", "tiny", *flags]), codec).engine.lanes)

    assert [lanes("--edge-lane", f) for f in ("on", "off", "auto")] == [2, 1, 1]
    with pytest.raises(UsageError, match="needs --mode stateful"):
        lanes("--edge-lane", "on", "--mode", "halo")
    with pytest.raises(UsageError, match="simulated engine models one lane"):
        lanes("--edge-lane", "off", "--engine", "simulated")


def _held_by_busy_engine(options: dict[str, float], kind: str, deadline: float) -> tuple[object, float]:
    """What a busy engine (the last second all on calls) with ``options`` decides at time 0 about one
    queued call of ``kind`` due at ``deadline``, its fewest frames, in its lane; and that call's replay."""
    engine = simulated_engine(
        load_codec("tiny"), cost=SimulatedCost(2.0, 0.01), max_streams=4, edge_lane=True, **options
    )
    engine._busy.add(0.0, 1.0)
    frames = max(engine._least_frames[kind], 1)
    lane = EDGE if kind == "prime" else MAIN
    engine._lanes[lane].scheduler.push(kind, frames, deadline=deadline, kind=kind)  # type: ignore[arg-type]
    replay = engine._replay_s(BucketKey(1, frames, kind))
    assert replay is not None
    return engine._ready_lane(0.0), replay


@pytest.mark.parametrize(("prime_lead", "held_for"), [(None, 0.05), (0.07, 0.07), (0.03, 0.03)])
def test_a_busy_engine_holds_primes_to_their_own_lead(prime_lead: float | None, held_for: float) -> None:
    """On a busy engine a prime due in 80 ms waits for company until its lead (and its replay) before its
    deadline: 50 ms by default, or what ``prime_hold_lead`` says."""
    options = {} if prime_lead is None else {"prime_hold_lead": prime_lead}
    decided, replay = _held_by_busy_engine(options, "prime", 0.08)
    assert decided == (None, pytest.approx(0.08 - held_for - replay))


@pytest.mark.parametrize(("step_lead", "held_for"), [(None, 0.05), (0.07, 0.07)])
def test_a_busy_engine_holds_steps_to_the_hold_lead(step_lead: float | None, held_for: float) -> None:
    """On a busy engine a step waits for company until ``hold_lead`` (and its replay) before its listener
    runs dry: 50 ms by default."""
    options = {} if step_lead is None else {"hold_lead": step_lead}
    decided, replay = _held_by_busy_engine(options, "step", 0.2)
    assert decided == (None, pytest.approx(0.2 - held_for - replay))


@pytest.mark.parametrize("lead", [-0.01, math.nan, math.inf])
def test_a_prime_lead_must_be_a_finite_number_of_seconds(lead: float) -> None:
    with pytest.raises(ConfigError, match="prime_hold_lead"):
        DecodeEngine(load_codec("tiny"), max_streams=4, prime_hold_lead=lead)


def test_the_most_urgent_ready_lane_goes_and_a_full_lane_lets_the_other_go() -> None:
    engine = DecodeEngine(load_codec("tiny"), max_streams=4, edge_lane=True, hold_lead=None, max_inflight=1)
    main, edge = engine._lanes
    main.scheduler.push("step", 4, deadline=5.0, kind="step")  # type: ignore[arg-type]
    edge.scheduler.push("prime", 12, deadline=9.0, kind="prime")  # type: ignore[arg-type]
    assert engine._ready_lane(0.0) == (main, None)
    main.inflight = 1  # a step in flight: the prime goes beside it
    assert engine._ready_lane(0.0) == (edge, None)
    edge.inflight = 1
    assert engine._ready_lane(0.0) == (None, None)
