"""Where a real-time point lost its listeners: its device calls and underruns on one clock.

Reads a JSON written with ``--timeline`` (``scripts/bench_stateful.py``, ``scripts/sim_batching.py``) and
prints, for each point that recorded one: the calls by (kind, frames, batch) with their device time
against the estimate the scheduler planned with; the engine's own slack (its earliest deadline minus
when the call's results were handed over); the longest stretches between one call's results and the
next call's decision while work was queued (the hold, or a device thread that did not run); and the
underruns per 100 ms of the point::

    python3 scripts/show_timeline.py bench/results/h200/stateful-timeline.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def _points(result: dict[str, Any]) -> list[dict[str, Any]]:
    if "decoder" in result:
        return list(result["decoder"])
    return [p for mode in result.get("modes", {}).values() for p in mode.get("sweep", {}).get("decoder", [])]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(point: dict[str, Any]) -> None:
    timeline = point["device_calls_at"]
    calls = sorted(
        (dict(zip(timeline["fields"], c, strict=True)) for c in timeline["calls"]),
        key=lambda c: c["launched_ms"],
    )
    print(
        f"== {point['streams']} streams: ok {point['ok']}, {point['underrun_events']} underruns in "
        f"{point['streams_with_underruns']} streams, device busy {point['busy_fraction']:.2f}, {len(calls)} calls"
    )
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        groups[(c["kind"], c["frames"], c["batch"])].append(c)
    for (kind, frames, batch), group in sorted(groups.items()):
        device = [c["device_ms"] for c in group if c["device_ms"] is not None]
        timing = (
            f"device p50 {statistics.median(device):.1f} max {max(device):.1f} ms"
            if device
            else "no device time"
        )
        print(
            f"  {kind} {frames} x {batch}: {len(group)} calls, {statistics.mean(c['live'] for c in group):.0f} "
            f"rows live, {timing}, estimate {group[0]['estimate_ms']}"
        )
    if "due_ms" in timeline["fields"]:  # files recorded before calls carried their deadline lack these
        _show_slack(calls)
    bins = Counter(int(at // 100) * 100 for at, _ in point.get("underruns_at", []))
    if bins:
        print("  underruns per 100 ms (start ms: count):", dict(sorted(bins.items())))


def _show_slack(calls: list[dict[str, Any]]) -> None:
    """The engine's slack at each step, the longest waits after a call's results, decision to launch."""
    slack = [c["due_ms"] - c["finished_ms"] for c in calls if c["kind"] == "step"]
    if slack:
        print(f"  step slack (earliest deadline - results handed over): min {min(slack):.1f}, "
              f"p10 {_pct(slack, 0.1):.1f}, p50 {_pct(slack, 0.5):.1f} ms")  # fmt: skip
    waits = [
        (
            c["decided_ms"] - prev["finished_ms"],
            c["decided_ms"],
            c["queued"] + c["live"],
            c["due_ms"] - c["decided_ms"],
        )
        for prev, c in itertools.pairwise(calls)
        if c["decided_ms"] > prev["finished_ms"]
    ]
    print("  longest waits after a call's results (ms, at ms, work queued, ms to its earliest deadline):")
    for wait, at, queued, to_due in sorted(waits, reverse=True)[:6]:
        print(f"    {wait:6.1f} at {at:7.0f}: {queued} queued, due in {to_due:.1f}")
    late = [c["launched_ms"] - c["decided_ms"] for c in calls]
    print(f"  decision to launch: p50 {statistics.median(late):.2f}, max {max(late):.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path)
    args = ap.parse_args()
    for point in _points(json.loads(args.result.read_text())):
        if "device_calls_at" in point:
            show(point)


if __name__ == "__main__":
    main()
