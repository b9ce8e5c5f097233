"""The two lanes' bookkeeping: slot fences across lanes and the device's busy time as a union."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.codecs import load_codec
from streamdec.engine import DecodeEngine
from streamdec.engine.lanes import EDGE, MAIN, BusyUnion, SlotFences, lane_of
from streamdec.errors import ConfigError


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


def test_the_engine_keeps_an_edge_lane_only_where_asked_or_on_a_gpu_with_slots() -> None:
    codec = load_codec("tiny")
    assert DecodeEngine(codec, max_streams=4).lanes == 1  # a CPU: one lane unless asked
    assert DecodeEngine(codec, max_streams=4, edge_lane=True).lanes == 2
    assert DecodeEngine(codec).lanes == 1
    with pytest.raises(ConfigError, match="edge_lane needs stateful slots"):
        DecodeEngine(codec, edge_lane=True)


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
