"""CPU lists and pinning (``streamdec serve --cpus``): parsed as Linux writes them, refused with a typed error
when they name CPUs the process may not use, applied to every thread of a process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamdec.affinity import available_cpus, check_cpus, format_cpus, parse_cpus, pin, thread_cpus
from streamdec.errors import ConfigError

linux_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"), reason="needs Linux"
)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), (" 0 , 2-3,8", {0, 2, 3, 8}), ("4-4,4", {4})],
)
def test_cpu_lists_parse_as_linux_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus
    assert parse_cpus(format_cpus(cpus)) == cpus


def test_cpu_lists_are_written_with_runs_as_ranges() -> None:
    assert format_cpus({5, 0, 1, 2, 7, 8}) == "0-2,5,7-8"
    assert format_cpus([]) == ""


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "0,,1", "1-", "0.5"])
def test_a_malformed_cpu_list_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="expected CPU numbers and ranges"):
        parse_cpus(text)


@linux_affinity
def test_cpus_this_process_may_not_use_are_refused_naming_those_it_may() -> None:
    allowed = available_cpus()
    outside = max(allowed) + 1
    with pytest.raises(ConfigError, match=f"may run on {format_cpus(allowed)} only"):
        check_cpus(frozenset({outside}))
    with pytest.raises(ConfigError, match="may run on"):
        pin(frozenset(), os.getpid())
    assert check_cpus(allowed) == allowed


@linux_affinity
def test_pin_moves_every_thread_of_a_process_and_threads_started_later_inherit() -> None:
    """A child with a thread already running is pinned from outside: both its threads, and the thread it
    starts afterwards, run on the one CPU."""
    script = (
        "import sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "print('more', flush=True); sys.stdin.readline()\n"
    )
    cpu = frozenset({min(available_cpus())})
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready"
            pin(cpu, child.pid)
            before = thread_cpus(child.pid)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "more"
            after = thread_cpus(child.pid)
        finally:
            child.kill()
    assert len(before) == 2 and set(before.values()) == {cpu}
    assert len(after) == 3 and set(after.values()) == {cpu}
