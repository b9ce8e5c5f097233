"""Pure analysis for the load test: what one stream heard, whether a point holds, where a sweep goes next.

No I/O and no clocks: every function takes the recorded times (``time.monotonic()`` seconds, one clock
for all processes of the host) and returns figures, so each rule is tested on its own.

Per stream (:func:`summarize_stream`):

* ``ttfa_ms``: first audio message received minus the moment the first latent chunk was sent;
* ``ttfa_decodable_ms``: first audio minus the moment the first tile's frames became decodable, i.e. the
  chunk that completed its right context was sent. That is the part the server adds (decode included):
  no server can beat the wait for the lookahead;
* ``underruns`` / ``stall_ms``: a listener starts playing ``prebuffer`` after the first audio arrives and
  needs sample ``s`` at ``play + s / rate`` (later by every stall so far); a message that arrives after
  its first sample's time is an underrun, and playback waits for it;
* ``gaps_ms``: time between consecutive audio messages;
* a sample check: messages contiguous from sample 0, ``frames * hop`` samples, ``done`` completed.

A sweep (:func:`next_streams`) never decides on one run: a stream count *holds* once ``confirm`` runs
at it passed and *fails* once ``confirm`` runs failed, whichever comes first. A run in which the load
generator itself fell behind (:func:`generator_problem`) does not vote.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Arrival",
    "Limits",
    "StreamRecord",
    "SweepPlan",
    "decided",
    "first_window_chunk",
    "gc_pause_max_ms",
    "generator_problem",
    "histogram_delta_quantile",
    "largest_holding",
    "listener_underruns",
    "loop_lag_ms",
    "parse_prometheus",
    "percentile",
    "proc_cpu_seconds",
    "summarize_point",
    "summarize_stream",
    "tier_calls",
    "verdict",
]

Arrival = tuple[float, int, int]  # (received at, start sample, samples per channel)


@dataclass
class StreamRecord:
    """What a client saw of one stream; filled in by the load generator's client processes."""

    index: int
    frames: int
    first_sent: float | None = None  # the first latent chunk went out
    decodable_sent: float | None = None  # the chunk (or end) that made the first tile decodable went out
    arrivals: list[Arrival] = field(default_factory=list)
    status: str | None = None  # the done message's status; None: no done arrived
    done_samples: int | None = None
    errors: list[str] = field(default_factory=list)
    pcm: bytes | None = None  # the sampled stream's audio payloads, concatenated


@dataclass(frozen=True)
class Limits:
    """When a point holds: p99 of ``ttfa_decodable_ms`` at most ``ttfa_p99_ms`` and no underrun."""

    ttfa_p99_ms: float = 20.0
    max_underruns: int = 0
    generator_late_ms: float = 50.0  # a chunk sent later than this after its time voids the run


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """``n``, p50, p90, p99 and max of ``values``, rounded to 0.01."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values) if values else None),
    }


def first_window_chunk(left: int, right: int, min_emit: int, max_emit: int, frames: int, chunk: int) -> int:
    """Index of the chunk whose arrival makes the first window decodable (``-1``: only the end does).

    Runs the real planner on the arrival schedule, so it stays right if the emission policy changes.
    """
    from streamdec.planning import StreamPlanner  # pure integer arithmetic

    planner = StreamPlanner(left, right, min_emit=min_emit, max_emit=max_emit)
    chunks = -(-frames // chunk)
    for k in range(chunks):
        if planner.next_window(min(frames, (k + 1) * chunk), ended=False) is not None:
            return k
    return -1


def listener_underruns(arrivals: Sequence[Arrival], prebuffer_s: float, rate: int) -> tuple[int, float]:
    """``(underruns, stall seconds)`` of the modelled listener (see the module docstring)."""
    if not arrivals:
        return 0, 0.0
    play = arrivals[0][0] + prebuffer_s
    stall, underruns = 0.0, 0
    for received, start, _n in arrivals:
        due = play + start / rate + stall
        if received > due:
            underruns += 1
            stall += received - due
    return underruns, stall


def sample_problem(record: StreamRecord, hop: int) -> str | None:
    """Why this stream's audio is wrong (gap, overlap, count, status), or None when it is complete."""
    if record.errors:
        return f"errors: {'; '.join(record.errors)[:200]}"
    if record.status != "completed":
        return f"done status {record.status!r}"
    expected, position = record.frames * hop, 0
    for _t, start, n in record.arrivals:
        if start != position:
            return f"audio message at sample {start} where {position} was expected"
        position += n
    if position != expected or record.done_samples != expected:
        return f"{position} samples received, done says {record.done_samples}, expected {expected}"
    return None


def summarize_stream(record: StreamRecord, *, hop: int, rate: int, prebuffer_s: float) -> dict[str, Any]:
    """Per-stream figures (see the module docstring); times in ms."""
    arrivals = record.arrivals
    first = arrivals[0][0] if arrivals else None
    underruns, stall = listener_underruns(arrivals, prebuffer_s, rate)

    def since(t: float | None) -> float | None:
        return None if first is None or t is None else (first - t) * 1000.0

    return {
        "index": record.index,
        "ttfa_ms": since(record.first_sent),
        "ttfa_decodable_ms": since(record.decodable_sent),
        "underruns": underruns,
        "stall_ms": stall * 1000.0,
        "messages": len(arrivals),
        "gaps_ms": [(b[0] - a[0]) * 1000.0 for a, b in itertools.pairwise(arrivals)],
        "audio_s": sum(n for _t, _s, n in arrivals) / rate,
        "problem": sample_problem(record, hop),
    }


def summarize_point(streams: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pool per-stream figures of one run into distributions and counts."""

    def values(key: str) -> list[float]:
        return [s[key] for s in streams if s[key] is not None]

    problems = [f"stream {s['index']}: {s['problem']}" for s in streams if s["problem"]]
    return {
        "streams": len(streams),
        "ttfa_ms": distribution(values("ttfa_ms")),
        "ttfa_decodable_ms": distribution(values("ttfa_decodable_ms")),
        "underruns": sum(s["underruns"] for s in streams),
        "streams_with_underrun": sum(1 for s in streams if s["underruns"]),
        "stall_ms": distribution([s["stall_ms"] for s in streams if s["underruns"]]),
        "gaps_ms": distribution([g for s in streams for g in s["gaps_ms"]]),
        "audio_messages": sum(s["messages"] for s in streams),
        "audio_s": round(sum(s["audio_s"] for s in streams), 3),
        "sample_problems": len(problems),
        "sample_problem_examples": problems[:5],
    }


def generator_problem(point: Mapping[str, Any], limits: Limits) -> str | None:
    """Why a run says nothing about the server: the load generator itself sent chunks late (its process
    was starved of CPU), so late audio may be its own. None when the run is valid."""
    late = point["clients"]["send_late_ms"]["max"]
    if late is not None and late > limits.generator_late_ms:
        return f"load generator sent a chunk {late:g} ms late (> {limits.generator_late_ms:g} ms): run void"
    return None


def verdict(point: Mapping[str, Any], limits: Limits) -> list[str]:
    """Why a run fails the limits (empty: it holds)."""
    reasons = []
    if point["sample_problems"]:
        reasons.append(f"{point['sample_problems']} stream(s) with wrong or missing audio")
    p99 = point["ttfa_decodable_ms"]["p99"]
    if p99 is None or p99 > limits.ttfa_p99_ms:
        reasons.append(f"p99 time to first audio after decodable {p99} ms > {limits.ttfa_p99_ms:g} ms")
    if point["underruns"] > limits.max_underruns:
        reasons.append(f"{point['underruns']} underrun(s) in {point['streams_with_underrun']} stream(s)")
    if point.get("reference", {}).get("ok") is False:
        reasons.append(f"sampled stream differs from the offline decode: {point['reference']}")
    return reasons


# -- sweep -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPlan:
    """Start at ``start`` streams, multiply by ``growth`` while points hold, then bisect the bracket down
    to ``resolution`` (a fraction of the lower end); never above ``max_streams``."""

    start: int = 50
    growth: float = 2.0
    resolution: float = 0.1
    max_streams: int = 4096
    confirm: int = 2


def decided(runs: Sequence[bool], confirm: int) -> bool | None:
    """True once ``confirm`` runs passed, False once ``confirm`` failed, None while undecided."""
    if sum(runs) >= confirm:
        return True
    if len(runs) - sum(runs) >= confirm:
        return False
    return None


def largest_holding(runs: Mapping[int, Sequence[bool]], confirm: int) -> tuple[int | None, int | None]:
    """``(largest N that holds below the smallest failing N, smallest failing N)``."""
    verdicts = {n: decided(r, confirm) for n, r in runs.items()}
    failing = min((n for n, v in verdicts.items() if v is False), default=None)
    holding = max((n for n, v in verdicts.items() if v and (failing is None or n < failing)), default=None)
    return holding, failing


def next_streams(runs: Mapping[int, Sequence[bool]], plan: SweepPlan) -> int | None:
    """The stream count to run next, or None when the sweep is done (see :class:`SweepPlan`)."""
    for n in sorted(runs):
        if decided(runs[n], plan.confirm) is None:
            return n  # repeat an undecided point before moving on
    lo, hi = largest_holding(runs, plan.confirm)
    if hi is None:
        if lo is None:
            return plan.start
        return (
            None
            if lo >= plan.max_streams
            else min(plan.max_streams, max(lo + 1, math.ceil(lo * plan.growth)))
        )
    if lo is None:
        return None if hi <= 1 else max(1, math.floor(hi / plan.growth))
    if hi - lo <= max(1, math.ceil(lo * plan.resolution)):
        return None
    return (lo + hi) // 2


# -- server figures --------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$")


def parse_prometheus(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            try:
                out[match.group(1)] = float(match.group(2))
            except ValueError:
                continue
    return out


def _delta_buckets(
    before: Mapping[str, float], after: Mapping[str, float], name: str
) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` of a histogram's observations between two scrapes, ascending
    (the last bound is infinite, its count the total)."""
    pattern = re.compile(re.escape(name) + r'_bucket\{le="([^"]+)"\}$')
    buckets = []
    for key, value in after.items():
        match = pattern.match(key)
        if match:
            bound = math.inf if match.group(1) == "+Inf" else float(match.group(1))
            buckets.append((bound, value - before.get(key, 0.0)))
    return sorted(buckets)


def histogram_delta_quantile(
    before: Mapping[str, float], after: Mapping[str, float], name: str, q: float
) -> float | None:
    """The ``q`` quantile (0..1) of a histogram's observations between two scrapes, linear within its
    bucket (as PromQL's ``histogram_quantile``); None without observations in between."""
    return _bucket_quantile(_delta_buckets(before, after, name), q)


def _bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """:func:`histogram_delta_quantile` of buckets :func:`_delta_buckets` parsed already."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # beyond the largest finite bucket: its bound is all we know
            inside = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / inside if inside else 1.0)
        prev_bound, prev_count = bound, count
    return prev_bound


def loop_lag_ms(
    before: Mapping[str, float], after: Mapping[str, float], name: str
) -> dict[str, float | None]:
    """p50, p99 and max of the event-loop lag between two scrapes, in ms: the quantiles from the
    histogram ``name``, the max from its gauge ``{name}_max``; None where unknown.

    The gauge holds the largest lag since the previous scrape, and the first of the two is a scrape, so
    the second's gauge is the largest lag between them, unless something else scraped the server
    meanwhile (a Prometheus watching a ``--url`` target). A gauge below the lower edge of the highest
    bucket the histogram filled in between shows that: it missed the interval's peak, and max is None.
    """
    buckets = _delta_buckets(before, after, name)
    peak = after.get(f"{name}_max")
    if peak is not None and peak < _highest_filled_lower_edge(buckets):
        peak = None
    figures: dict[str, float | None] = {}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        value = _bucket_quantile(buckets, q)
        if value is not None and peak is not None:
            # Linear interpolation inside a bucket can land above every lag observed (p99 206 ms from
            # the 100-250 ms bucket of a run whose largest lag was 146 ms); no quantile exceeds the max.
            value = min(value, peak)
        figures[label] = None if value is None else round(value * 1000, 3)
    figures["max"] = None if peak is None else round(peak * 1000, 3)
    return figures


def gc_pause_max_ms(after: Mapping[str, float]) -> float | None:
    """The longest garbage-collector pause of any generation since the scrape before ``after``, in ms
    (the server's ``streamdec_gc_pause_max_seconds`` gauges); None where the server does not report it."""
    peaks = [v for k, v in after.items() if k.startswith("streamdec_gc_pause_max_seconds{")]
    return round(max(peaks) * 1000, 3) if peaks else None


def tier_calls(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int] | None:
    """Device calls between two scrapes by tier (``streamdec_engine_tier_calls_total{tier=...}``), the
    tiers with none left out; None where the server does not report them."""
    prefix = 'streamdec_engine_tier_calls_total{tier="'
    tiers = {k[len(prefix) : -2]: v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix)}
    if not tiers:
        return None
    return {tier: int(n) for tier, n in sorted(tiers.items()) if n}


def _highest_filled_lower_edge(buckets: Sequence[tuple[float, float]]) -> float:
    """The lower edge of the highest bucket holding observations (every one in it is above that edge);
    0 when none does."""
    total = buckets[-1][1] if buckets else 0.0
    lower = 0.0
    for bound, count in buckets:
        if count >= total:
            return lower
        lower = bound
    return lower


def proc_cpu_seconds(stat: str, ticks_per_second: int) -> float:
    """User + system CPU seconds from the text of ``/proc/<pid>/stat`` (fields 14 and 15)."""
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / ticks_per_second
