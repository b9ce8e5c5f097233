"""The load test's pure analysis: listener model, sample checks, sweep decisions, /metrics and /proc parsing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.bench.loadstats import (
    Limits,
    StreamRecord,
    SweepPlan,
    decided,
    first_window_chunk,
    histogram_delta_quantile,
    largest_holding,
    listener_underruns,
    loop_lag_ms,
    next_streams,
    parse_prometheus,
    percentile,
    proc_cpu_seconds,
    sample_problem,
    summarize_point,
    summarize_stream,
    tier_calls,
    verdict,
)

RATE, HOP = 24000, 480


def test_listener_fed_in_time_never_underruns() -> None:
    """Audio arriving before its play time, with a prebuffer, never stalls the listener."""
    arrivals = [(1.0 + 0.02 * k, k * HOP, HOP) for k in range(50)]  # 20 ms of audio every 20 ms
    assert listener_underruns(arrivals, 0.1, RATE) == (0, 0.0)


def test_listener_counts_a_late_message_and_shifts_later_deadlines() -> None:
    """A message 50 ms after its play time is one underrun of 50 ms; the next, equally late, is then on time."""
    arrivals = [(0.0, 0, RATE), (1.15, RATE, RATE), (2.15, 2 * RATE, RATE)]  # 1 s messages, prebuffer 0.1
    underruns, stall = listener_underruns(arrivals, 0.1, RATE)
    assert underruns == 1
    assert stall == pytest.approx(0.05)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=40),
    prebuffer=st.floats(0.0, 0.3),
)
def test_listener_stall_never_exceeds_the_lateness_it_saw(gaps: list[float], prebuffer: float) -> None:
    """For all arrival schedules: stalls are >= 0, zero without underruns, and at most the last arrival time."""
    t, arrivals = 0.0, []
    for k, gap in enumerate(gaps):
        t += gap
        arrivals.append((t, k * HOP, HOP))
    underruns, stall = listener_underruns(arrivals, prebuffer, RATE)
    assert stall >= 0
    assert (underruns == 0) == (stall == 0)
    assert stall <= arrivals[-1][0] + 1e-9


@pytest.mark.parametrize(
    ("arrivals", "status", "done", "problem"),
    [
        ([(0, 0, 960), (1, 960, 960)], "completed", 1920, None),
        ([(0, 0, 960), (1, 1920, 960)], "completed", 1920, "at sample 1920 where 960"),
        ([(0, 0, 960)], "completed", 960, "960 samples received"),
        ([(0, 0, 960), (1, 960, 960)], "error", 1920, "done status 'error'"),
        ([(0, 0, 960), (1, 960, 960)], None, None, "done status None"),
    ],
    ids=["complete", "gap", "short", "error-status", "no-done"],
)
def test_sample_problem_names_what_is_wrong(
    arrivals: list[tuple[float, int, int]], status: str | None, done: int | None, problem: str | None
) -> None:
    """A stream's audio must be contiguous from 0, frames * hop long, and completed."""
    record = StreamRecord(0, 4, arrivals=arrivals, status=status, done_samples=done)
    found = sample_problem(record, HOP)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_stream_summary_times_first_audio_from_first_chunk_and_from_decodable() -> None:
    """TTFA counts from the first chunk sent; the decodable figure from the chunk completing the context."""
    record = StreamRecord(3, 4, first_sent=10.0, decodable_sent=10.16, arrivals=[(10.17, 0, 4 * HOP)])
    record.status, record.done_samples = "completed", 4 * HOP
    s = summarize_stream(record, hop=HOP, rate=RATE, prebuffer_s=0.1)
    assert s["ttfa_ms"] == pytest.approx(170.0)
    assert s["ttfa_decodable_ms"] == pytest.approx(10.0)
    assert s["problem"] is None


def test_first_window_chunk_waits_for_the_right_context() -> None:
    """With right context 7 and a first tile of 4 frames, 11 frames are needed: the third 4-frame chunk."""
    assert first_window_chunk(52, 7, 4, 64, 400, 4) == 2
    assert first_window_chunk(0, 0, 4, 64, 400, 4) == 0
    assert first_window_chunk(52, 7, 4, 64, 8, 4) == -1  # shorter than a window: only the end decodes


def test_verdict_lists_every_broken_limit() -> None:
    """A point with wrong audio, a slow p99 and underruns fails for all three reasons."""
    streams = [
        {"index": i, "ttfa_ms": 100.0, "ttfa_decodable_ms": 30.0 + i, "underruns": 1, "stall_ms": 5.0,
         "messages": 3, "gaps_ms": [1.0], "audio_s": 1.0, "problem": "short" if i == 0 else None}
        for i in range(10)
    ]  # fmt: skip
    point = summarize_point(streams)
    reasons = verdict(point, Limits(ttfa_p99_ms=20.0))
    assert len(reasons) == 3
    assert not verdict(point, Limits(ttfa_p99_ms=100.0, max_underruns=10))[1:]


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([], 99) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile(list(range(101)), 99) == 99.0


# -- the sweep -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("runs", "confirm", "expected"),
    [([], 2, None), ([True], 2, None), ([True, True], 2, True), ([False, True], 2, None),
     ([False, True, False], 2, False), ([False], 1, False), ([True], 1, True)],
)  # fmt: skip
def test_decided_needs_confirm_agreeing_runs(runs: list[bool], confirm: int, expected: bool | None) -> None:
    assert decided(runs, confirm) is expected


def _sweep(
    threshold: int, plan: SweepPlan, noise: dict[int, list[bool]] | None = None
) -> tuple[dict[int, list[bool]], int]:
    """Run the sweep against an oracle: N holds iff N <= threshold, except scripted noisy outcomes first."""
    runs: dict[int, list[bool]] = {}
    noise = {k: list(v) for k, v in (noise or {}).items()}
    steps = 0
    while (n := next_streams(runs, plan)) is not None:
        steps += 1
        assert steps < 200, "the sweep does not terminate"
        outcome = noise[n].pop(0) if noise.get(n) else n <= threshold
        runs.setdefault(n, []).append(outcome)
    return runs, steps


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.integers(0, 3000),
    start=st.integers(1, 200),
    growth=st.floats(1.2, 4.0),
    resolution=st.floats(0.01, 0.5),
    confirm=st.integers(1, 3),
)
def test_sweep_finds_the_threshold_within_its_resolution(
    threshold: int, start: int, growth: float, resolution: float, confirm: int
) -> None:
    """For all thresholds and plans: the result holds, the bracket above it fails, and it is tight."""
    plan = SweepPlan(start=start, growth=growth, resolution=resolution, max_streams=4096, confirm=confirm)
    runs, _ = _sweep(threshold, plan)
    largest, failing = largest_holding(runs, confirm)
    if threshold == 0:
        assert largest is None
        return
    assert largest is not None and largest <= threshold
    if failing is None:
        assert largest == min(threshold, plan.max_streams) or largest == plan.max_streams
    else:
        assert failing > threshold
        assert failing - largest <= max(1, math.ceil(largest * resolution))
    assert all(len(r) >= confirm for r in runs.values())


def test_one_noisy_failure_does_not_stop_the_sweep() -> None:
    """A single failed run at 100 streams is repeated, outvoted, and the sweep goes on to the real limit."""
    plan = SweepPlan(start=50, growth=2.0, resolution=0.1, confirm=2)
    runs, _ = _sweep(700, plan, noise={100: [False]})
    assert runs[100][0] is False
    assert largest_holding(runs, 2)[0] is not None
    assert largest_holding(runs, 2)[0] >= 640  # type: ignore[operator]


# -- server figures --------------------------------------------------------------------------------
METRICS = """# HELP x y
# TYPE streamdec_event_loop_lag_seconds histogram
streamdec_event_loop_lag_seconds_bucket{le="0.001"} %d
streamdec_event_loop_lag_seconds_bucket{le="0.01"} %d
streamdec_event_loop_lag_seconds_bucket{le="+Inf"} %d
streamdec_sent_bytes_total 1.5e3
streamdec_errors_total{code="bad_json"} 0
"""


def test_parse_prometheus_reads_samples_with_labels() -> None:
    parsed = parse_prometheus(METRICS % (1, 2, 3))
    assert parsed["streamdec_sent_bytes_total"] == 1500.0
    assert parsed['streamdec_errors_total{code="bad_json"}'] == 0.0
    assert parsed['streamdec_event_loop_lag_seconds_bucket{le="+Inf"}'] == 3.0


def test_histogram_quantile_uses_only_observations_between_scrapes() -> None:
    """Before: 10 fast samples; between: 10 in (1 ms, 10 ms]. The median between is inside that bucket."""
    before = parse_prometheus(METRICS % (10, 10, 10))
    after = parse_prometheus(METRICS % (10, 20, 20))
    assert histogram_delta_quantile(before, after, "streamdec_event_loop_lag_seconds", 0.5) == pytest.approx(
        0.0055
    )
    assert histogram_delta_quantile(before, before, "streamdec_event_loop_lag_seconds", 0.5) is None


LAG = "streamdec_event_loop_lag_seconds"


def _lag_scrape(fast: int, slow: int, peak: float) -> dict[str, float]:
    """A scrape of the lag metrics: ``fast`` samples under 1 ms, ``slow`` in (100 ms, 250 ms]."""
    counts = {"0.001": fast, "0.01": fast, "0.1": fast, "0.25": fast + slow, "+Inf": fast + slow}
    text = "".join(f'{LAG}_bucket{{le="{le}"}} {n}\n' for le, n in counts.items())
    return parse_prometheus(text + f"{LAG}_max {peak}\n")


def test_loop_lag_p99_never_exceeds_the_max() -> None:
    """95 fast samples and 5 in the 100-250 ms bucket, the largest 146 ms: interpolating puts p99 at
    220 ms, above every sample; it is reported as the max instead. The median is left as it is."""
    before, after = _lag_scrape(0, 0, 0.0), _lag_scrape(95, 5, 0.146)
    assert histogram_delta_quantile(before, after, LAG, 0.99) == pytest.approx(0.22)
    figures = loop_lag_ms(before, after, LAG)
    assert figures == {"p50": 0.526, "p99": 146.0, "max": 146.0}


def test_loop_lag_max_is_the_end_scrape_s_gauge_unless_another_scraper_reset_it() -> None:
    """The max gauge resets at every scrape, so the end scrape's gauge is the interval's peak, however
    large the one before it was. A gauge below the lowest lag the histogram's top bucket allows was
    reset by another scraper meanwhile: the max is unknown and no quantile is clamped to it."""
    before = _lag_scrape(100, 5, 0.2)  # the previous run's peak, reset by this scrape
    after = _lag_scrape(200, 6, 0.12)  # one more slow sample this run: its peak, 120 ms
    assert loop_lag_ms(before, after, LAG) == {"p50": 0.505, "p99": 1.0, "max": 120.0}
    reset = _lag_scrape(195, 10, 0.004)  # five slow samples, but the gauge saw only a 4 ms lag
    assert loop_lag_ms(before, reset, LAG) == {"p50": 0.526, "p99": 220.0, "max": None}
    assert loop_lag_ms(before, before, LAG) == {"p50": None, "p99": None, "max": 200.0}


def test_proc_cpu_seconds_reads_utime_and_stime_after_the_command_name() -> None:
    """The command name may hold spaces and parentheses; fields 14 and 15 are counted after it."""
    stat = "4242 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 1 0 100 0 0"
    assert proc_cpu_seconds(stat, 100) == pytest.approx(4.0)


def test_device_calls_by_tier_are_counted_between_two_scrapes() -> None:
    """The engine's per-tier counters, as /metrics renders them, differenced by the load test: tiers with
    no call in between are left out, and a server without the counters reports None."""
    from streamdec.engine import EngineStats
    from streamdec.server.metrics import render_engine

    before = parse_prometheus(render_engine(EngineStats(decodes=5, by_tier={"graph": 5})))
    after = parse_prometheus(render_engine(EngineStats(decodes=9, by_tier={"graph": 7, "eager-frozen": 2})))
    assert tier_calls(before, after) == {"eager-frozen": 2, "graph": 2}
    assert tier_calls(after, after) == {}
    assert tier_calls({}, {"streamdec_engine_calls_total": 3.0}) is None
