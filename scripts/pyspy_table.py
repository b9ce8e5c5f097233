"""Where a process's threads spent their CPU, from a py-spy raw profile: per thread, the share of busy samples
each function took itself and with what it called.

Samples whose innermost frame is a wait (``select``, a condition, an event, a CUDA event, a sleep) count
as idle and are left out of the shares, so a table reads as "of the time this thread was working". A
thread blocked inside a C call made straight from its own code (``queue.SimpleQueue.get``) shows no such
frame and counts as busy in the calling function. Record with

    py-spy record --pid PID --duration 12 --rate 250 --format raw --threads --output serve.raw
    python scripts/pyspy_table.py serve.raw --top 25 > serve.txt
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import dataclass, field
from pathlib import Path

#: innermost frames that mean the thread was waiting, not working
_WAITS = (
    "select (selectors",
    "Condition.wait",
    "Event.wait",
    "Event.synchronize",  # a CUDA event: the GPU is working
    "wait (threading",
    "sleep",
    "epoll",
)


@dataclass
class _Thread:
    busy: int = 0
    idle: int = 0
    own: collections.Counter[str] = field(default_factory=collections.Counter)
    inclusive: collections.Counter[str] = field(default_factory=collections.Counter)


def _name(frame: str) -> str:
    """``function (path/file.py:line)`` -> ``function file.py``."""
    function, _, where = frame.partition(" (")
    return f"{function} {where.split(':')[0].rsplit('/', 1)[-1]}".strip()


def read(path: Path) -> dict[str, _Thread]:
    threads: dict[str, _Thread] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = threads.setdefault(frames[0], _Thread())
        n = int(count)
        if any(wait in frames[-1] for wait in _WAITS):
            thread.idle += n
            continue
        thread.busy += n
        thread.own[_name(frames[-1])] += n
        # a recursive function counts once per sample; first seen first, so ties print in one order
        for name in dict.fromkeys(_name(f) for f in frames[1:]):
            thread.inclusive[name] += n
    return threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, help="py-spy record --format raw output")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--min-samples", type=int, default=50, help="threads with fewer busy samples are left out"
    )
    args = ap.parse_args()
    threads = read(args.raw)
    print(f"# {args.raw.name}: busy and idle samples per thread")
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1].busy):
        print(f"{t.busy:7d} busy {t.idle:7d} idle  {name}")
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1].busy):
        if t.busy < args.min_samples:
            continue
        print(f"\n## {name}: {t.busy} busy samples\n-- itself (% of busy samples)")
        for fn, n in t.own.most_common(args.top):
            print(f"{100 * n / t.busy:5.1f}  {fn}")
        print("-- with what it called (frames under every sample left out)")
        shown = [(fn, n) for fn, n in t.inclusive.most_common() if n < t.busy * 0.995]
        for fn, n in shown[: args.top]:
            print(f"{100 * n / t.busy:5.1f}  {fn}")


if __name__ == "__main__":
    main()
