"""Which CPUs a process runs on: ``streamdec serve --cpus`` and the load test's ``--server-cpus``.

A server's event loop and its engine's threads take turns under one interpreter lock, so the process runs
about one core of Python at a time however many the host has. Left to the scheduler, those threads move
between cores, hand the lock across cores and find each stream's objects in another core's cache; kept
on one core, the same messages cost less CPU and the loop lags less (docs/serving-capacity.md). Pinning
is Linux's ``sched_setaffinity``, applied to every thread the process has when it is called (threads it
starts later inherit it).

A CPU list is written as Linux writes one (``taskset -c``, ``/sys/.../cpulist``): ``0``, ``0,2``,
``0-3,8``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from streamdec.errors import ConfigError

__all__ = ["available_cpus", "check_cpus", "format_cpus", "parse_cpus", "pin", "thread_cpus"]


def parse_cpus(text: str) -> frozenset[int]:
    """The CPUs a list names (``"0"``, ``"0,2"``, ``"0-3,8"``); ConfigError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            lo, hi = -1, -1
        if lo < 0 or hi < lo:
            raise ConfigError(f"CPU list {text!r}: expected CPU numbers and ranges such as 0, 0,2 or 0-3,8")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """``cpus`` as a CPU list, runs written as ranges: ``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def _supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (all of them where affinity is not supported)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def check_cpus(cpus: frozenset[int]) -> frozenset[int]:
    """``cpus`` if this process may pin itself to them; else a ConfigError that names the CPUs it may use."""
    if not _supported():
        raise ConfigError("pinning to CPUs needs Linux (sched_setaffinity); leave the CPU list out here")
    allowed = available_cpus()
    if not cpus or not cpus <= allowed:
        raise ConfigError(
            f"CPUs {format_cpus(cpus) or '(none)'}: this process may run on {format_cpus(allowed)} only"
        )
    return cpus


def _threads(pid: int | None) -> list[int]:
    """The thread ids of process ``pid`` (None: this one) now."""
    return [int(tid) for tid in os.listdir(f"/proc/{'self' if pid is None else pid}/task")]


def pin(cpus: frozenset[int], pid: int | None = None) -> None:
    """Run every thread of process ``pid`` (None: this one) on ``cpus`` from now on."""
    check_cpus(cpus)
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """The CPUs each thread of process ``pid`` may run on, by thread id (empty where not supported)."""
    if not _supported():
        return {}
    found = {}
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            found[tid] = frozenset(os.sched_getaffinity(tid))
    return found
