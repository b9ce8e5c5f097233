"""The capacity probe's pure parts: the listener's clock, the paced producer, the margin, a run's verdict."""

from __future__ import annotations

import time

import anyio
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamdec.engine.scheduler import BucketKey
from streamdec.server.probe import (
    PROBE_MARGIN_SHARE,
    START_PERIODS,
    CapacityReport,
    ListenerClock,
    PacedChunks,
    PacedRun,
    engine_hold_lead,
    probe_margin,
    replay_bound,
    start_offsets,
)

RATE = 1000  # samples per second: positions and times in milliseconds read alike


@given(
    prebuffer=st.integers(0, 300),
    tiles=st.lists(st.tuples(st.integers(1, 200), st.integers(0, 400)), min_size=1, max_size=30),
)
def test_listener_clock_counts_every_stall_and_plays_on_from_it(
    prebuffer: int, tiles: list[tuple[int, int]]
) -> None:
    """For any tiles (length, gap since the previous arrival): slack is the play time minus the arrival;
    a late tile stalls playback by exactly its lateness; underruns and the least slack follow."""
    listener = ListenerClock(RATE, prebuffer / RATE)
    now, position, stalled, slacks = 0.0, 0, 0.0, []
    first: float | None = None
    for length, gap in tiles:
        now += gap / RATE
        first = now if first is None else first
        plays_at = first + prebuffer / RATE + position / RATE + stalled
        slack = listener.arrive(now, position)
        assert slack == pytest.approx(plays_at - now)
        stalled += max(-slack, 0.0)
        slacks.append(slack)
        position += length
    assert listener.underruns == sum(1 for s in slacks if s < 0)
    assert listener.min_slack == min(slacks)
    assert slacks[0] == pytest.approx(prebuffer / RATE)


def test_a_tile_on_time_after_a_stall_is_not_a_second_underrun() -> None:
    """Playback resumes from the late tile: the next one, as late again, is on time."""
    listener = ListenerClock(RATE, 0.1)
    listener.arrive(0.0, 0)  # plays 0.1 .. 0.2
    assert listener.arrive(0.25, 100) == pytest.approx(-0.05)  # due at 0.2
    assert listener.arrive(0.35, 200) == pytest.approx(0.0)  # 0.25 + 0.1
    assert (listener.underruns, listener.min_slack) == (1, pytest.approx(-0.05))


def test_paced_chunks_are_at_hand_only_from_their_moment() -> None:
    """Nothing before a chunk's moment; from long ago, every chunk in order, then nothing."""
    clip = torch.arange(40.0).reshape(10, 4)
    future = PacedChunks(clip, 4, 50.0, time.monotonic() + 1000)
    assert future.take_ready() is None
    past = PacedChunks(clip, 4, 50.0, time.monotonic() - 1000)
    taken = []
    while (chunk := past.take_ready()) is not None:
        taken.append(chunk)
    assert [int(c.shape[0]) for c in taken] == [4, 4, 2]
    assert torch.equal(torch.cat(taken), clip)


async def test_paced_chunks_iterate_the_whole_clip() -> None:
    clip = torch.randn(9, 3)
    got = [chunk async for chunk in PacedChunks(clip, 4, 1e6, time.monotonic())]
    assert torch.equal(torch.cat(got), clip)
    with anyio.fail_after(5):
        assert [c async for c in PacedChunks(clip, 4, 1e6, time.monotonic())][-1].shape[0] == 1


@pytest.mark.parametrize(
    ("mode", "aim"), [("stateful", 0.1), ("halo", 0.04)], ids=["stateful-prebuffer", "halo-flush-margin"]
)
def test_the_margin_is_half_what_the_session_aims_to_keep(mode: str, aim: float) -> None:
    """Stateful tiles go out as soon as min_emit frames arrive (a prebuffer early); halo tiles are held
    until the flush margin before the deadline."""
    assert probe_margin(mode, 0.1, 0.04) == pytest.approx(PROBE_MARGIN_SHARE * aim)
    assert probe_margin("halo", 0.02, 0.04) == pytest.approx(PROBE_MARGIN_SHARE * 0.02)


def test_an_engine_holding_work_on_a_gpu_caps_the_aim_at_its_hold_lead() -> None:
    """A GPU engine holds a busy device's calls until hold_lead before their deadlines, so tiles of a
    loaded engine arrive about that early: the margin is half of it, never more than without a hold. A
    CPU engine, or one that does not hold, keeps the session's aim."""
    assert probe_margin("stateful", 0.1, 0.04, 0.04) == pytest.approx(PROBE_MARGIN_SHARE * 0.04)
    assert probe_margin("halo", 0.02, 0.04, 0.04) == pytest.approx(PROBE_MARGIN_SHARE * 0.02)
    gpu = _Member(_ReplayEngine("cuda", {}))
    gpu.engine.hold_lead = 0.04  # type: ignore[attr-defined]
    assert engine_hold_lead(gpu) == 0.04
    assert engine_hold_lead(_Group(gpu, gpu)) == 0.04
    cpu = _Member(_ReplayEngine("cpu", {}))
    cpu.engine.hold_lead = 0.04  # type: ignore[attr-defined]
    assert engine_hold_lead(cpu) is None and engine_hold_lead(_Group(gpu, cpu)) is None
    gpu.engine.hold_lead = None  # type: ignore[attr-defined]
    assert engine_hold_lead(gpu) is None


@pytest.mark.parametrize(
    ("slack", "underruns", "busy", "passed"),
    [(0.05, 0, 0.5, True), (0.049, 0, 0.1, False), (0.2, 1, 0.1, False), (0.2, 0, 0.51, False)],
    ids=["at-margin-and-safety", "below-margin", "underran", "engine-too-busy"],
)
def test_a_paced_run_passes_only_with_margin_kept_no_underrun_and_the_engine_half_idle(
    slack: float, underruns: int, busy: float, passed: bool
) -> None:
    assert PacedRun(2, slack, underruns, busy).passed(0.05) is passed


def test_the_report_names_every_run_and_the_capacity() -> None:
    report = CapacityReport(1.06, 0, (PacedRun(1, -0.006, 1, 0.93),), 0.05, 0)
    text = report.summary()
    assert "1.06x real time (bound 0)" in text
    assert "1 paced: least slack -6 ms, engine busy 93%, 1 underruns" in text
    assert text.endswith("margin 50 ms, busy at most 50% -> 0 real-time streams")


@pytest.mark.parametrize(
    ("bound", "hard", "passing", "busy", "runs", "capacity"),
    [
        (8, None, 2, 0.01, [8, 4, 2], 2),
        (8, None, 8, 0.01, [8], 8),
        (0, None, 1, 0.01, [1], 1),
        (0, None, 0, 0.01, [1], 0),
        (5, None, 0, 0.01, [5, 2, 1], 0),
        (8, 3, 3, 0.01, [3], 3),
        (8, None, 8, 0.2, [8, 2], 2),
        (8, None, 1, 0.15, [8, 3, 1], 1),
        (1, None, 1, 0.6, [1], 0),
    ],
    ids=[
        "halved-twice",
        "bound-holds",
        "bound-zero-one-passes",
        "bound-zero-none",
        "none",
        "slots-bound",
        "busy-sets-the-count",
        "busy-then-margin",
        "one-stream-too-busy",
    ],
)
async def test_the_search_from_the_bound_stops_at_the_first_run_that_keeps_margin_and_safety(
    monkeypatch: pytest.MonkeyPatch, bound: int, hard: int | None, passing: int, busy: float,
    runs: list[int], capacity: int,
) -> None:  # fmt: skip
    """Paced runs start at max(bound, 1) (never past the slots); a run with the engine busier than the
    safety factor is followed by the count its busy share allows, one that only lost the margin by half
    the count; 0 when even one stream fails. Here runs of up to ``passing`` streams keep the margin and
    each stream keeps the engine ``busy`` of the time."""
    from streamdec.server import probe

    async def throughput(decoder: object, frames: int, latent_dim: int, streams: int) -> float:
        return streams * frames / 50 / (2 * bound + 1.5)  # realtime_factor (2 bound + 1.5) x 0.5

    async def paced_run(decoder: object, streams: int, frames: int, **kw: float) -> PacedRun:
        return PacedRun(streams, 0.06 if streams <= passing else 0.01, 0, busy * streams)

    monkeypatch.setattr(probe, "throughput", throughput)
    monkeypatch.setattr(probe, "paced_run", paced_run)
    report = await probe.measure_capacity(
        object(), latent_dim=8, frame_rate=50.0, sample_rate=24000, prebuffer=0.1, margin=0.05,
        hard_limit=hard,
    )  # fmt: skip
    assert report.bound == bound
    assert ([r.streams for r in report.runs], report.capacity) == (runs, capacity)


@given(st.integers(1, 5000))
def test_paced_starts_overlap_and_take_distinct_phases(streams: int) -> None:
    """However many streams: all start within START_PERIODS chunk periods (so they overlap), in order;
    below that, 1 + 1/n periods apart, each at its own phase of the period."""
    offsets = start_offsets(streams, 1.0)
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[-1] < min(streams + 1, START_PERIODS)
    if streams < START_PERIODS:
        phases = sorted(round(o % 1.0 * streams) % streams for o in offsets)
        assert phases == list(range(streams))


class _ReplayEngine:
    """Replays given as ``{"kind BATCHxFRAMES": ms}``; None: the graph was never measured."""

    def __init__(self, device: str, replays: dict[str, float | None]) -> None:
        self.device = torch.device(device)
        self.replays = replays

    def measured_replay_ms(self) -> dict[BucketKey, float]:
        measured = {}
        for name, ms in self.replays.items():
            kind, shape = name.split(" ")
            batch, frames = (int(v) for v in shape.split("x"))
            if ms is not None:
                measured[BucketKey(batch, frames, kind)] = ms
        return measured


class _Member:
    def __init__(self, engine: _ReplayEngine, mode: str = "stateful", min_emit: int = 4) -> None:
        self.engine, self.mode, self.min_emit = engine, mode, min_emit


class _Group:
    def __init__(self, *members: _Member) -> None:
        self.decoders = list(members)


H200_STEPS: dict[str, float | None] = {
    "step 64x4": 14.1, "step 256x4": 41.3, "step 128x8": 40.0, "prime 16x23": 12.8, "step 16x4": 9.2,
}  # fmt: skip


def test_replay_bound_takes_the_batch_bucket_that_serves_most_streams_at_half_busy() -> None:
    """256 streams stepping 4 frames at 50 Hz need 12.5 replays of 41.3 ms a second: 52 % busy, so 248
    streams at half busy; steps of other sizes and other calls do not count."""
    member = _Member(_ReplayEngine("cuda", H200_STEPS))
    assert replay_bound(member, 50.0) == int(256 * 0.5 / (0.0413 * 12.5))
    group = _Group(member, _Member(_ReplayEngine("cuda", H200_STEPS)))
    assert replay_bound(group, 50.0) == int(2 * 256 * 0.5 / (0.0413 * 12.5))


def test_replay_bound_is_none_without_step_graphs_on_a_gpu() -> None:
    """Halo mode, a CPU engine, no measured step of the stream's size: the probe keeps its wall-clock
    throughput bound."""
    assert replay_bound(_Member(_ReplayEngine("cuda", H200_STEPS), mode="halo"), 50.0) is None
    assert replay_bound(_Member(_ReplayEngine("cpu", H200_STEPS)), 50.0) is None
    assert replay_bound(_Member(_ReplayEngine("cuda", {"step 64x8": 20.0, "step 64x4": None})), 50.0) is None
    group = _Group(_Member(_ReplayEngine("cuda", H200_STEPS)), _Member(_ReplayEngine("cpu", {})))
    assert replay_bound(group, 50.0) is None
