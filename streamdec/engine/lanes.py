"""Two lanes of device work: steps and windows on one CUDA stream, a stream's edges on another.

A stream's prime and flush (its *edges*) are small calls: a few rows, a few hundred short kernels, each
bound by its latency rather than by the device's width. Replayed on the engine's stream they queue behind
a step of hundreds of rows and keep the next step waiting for their whole length. On a second stream of
higher priority they replay beside the step: their blocks take multiprocessors as the step's blocks
retire, so a stream's first audio does not wait for the step in flight (the device time stays about the
same: docs/stateful.md). This module holds the bookkeeping that makes that safe and measurable, with no
torch in it:

* :class:`SlotFences` - a slot's layer state is written by whichever lane ran its last call; a call on
  the other lane must wait for that call's event first. A stream has one call in flight at a time, so
  this is a slot changing hands: a dropped stream's slot primed for the next stream while the dropped
  stream's step still runs.
* :class:`BusyUnion` - the device's busy time is the union of the two lanes' calls, not their sum.
* :class:`DeviceClock` - the union needs both lanes' calls on one clock, read from the device's events.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "EDGE",
    "EDGE_KINDS",
    "MAIN",
    "BusyUnion",
    "DeviceClock",
    "Fence",
    "SlotFences",
    "Stamp",
    "lane_of",
]

MAIN, EDGE = 0, 1
#: the stateful calls that run on the edge lane where the engine keeps one
EDGE_KINDS = frozenset({"prime", "flush"})


def lane_of(kind: str, lanes: int) -> int:
    """The lane a call of ``kind`` runs on, with ``lanes`` lanes (1: everything on the main one)."""
    return EDGE if lanes > 1 and kind in EDGE_KINDS else MAIN


class Fence(Protocol):
    """A point in a lane's work (a recorded CUDA event): ``query()`` says whether it has passed."""

    def query(self) -> bool: ...


F = TypeVar("F", bound=Fence)


class SlotFences(Generic[F]):
    """Per slot, the lane and fence of the last call that touched its state (see the module docstring).

    Used by the device thread alone (it launches every call), so it takes no lock.
    """

    def __init__(self, slots: int) -> None:
        self._lane: list[int] = [MAIN] * slots
        self._fence: list[F | None] = [None] * slots

    def waits(self, lane: int, slots: Iterable[int]) -> list[F]:
        """The fences a call on ``lane`` over ``slots`` must wait for: the other lane's last calls on
        them that have not passed yet, each once."""
        out: list[F] = []
        for slot in slots:
            fence = self._fence[slot]
            if fence is None or self._lane[slot] == lane:
                continue
            if fence.query():
                self._fence[slot] = None  # passed: no later call needs to ask again
            elif not any(f is fence for f in out):
                out.append(fence)
        return out

    def mark(self, lane: int, slots: Iterable[int], fence: F) -> None:
        """``slots`` were last touched by a call on ``lane`` that ends at ``fence``."""
        for slot in slots:
            self._lane[slot] = lane
            self._fence[slot] = fence


class BusyUnion:
    """Seconds the device was busy with either lane's calls, each overlap counted once.

    Calls on one lane never overlap each other, so a call can only overlap the other lane's calls; each
    call, when its times are known, adds its length less what it shares with the other lane's calls
    already added. Whichever of two overlapping calls is added second subtracts their overlap, so it is
    subtracted exactly once. ``keep`` bounds the calls remembered per lane (calls finish within a few
    replays of each other, so a few dozen are plenty).
    """

    def __init__(self, lanes: int = 2, keep: int = 64) -> None:
        self._spans: list[deque[tuple[float, float]]] = [deque(maxlen=keep) for _ in range(lanes)]

    def add(self, lane: int, start: float, end: float) -> float:
        """Add a call on ``lane`` busy from ``start`` to ``end``; returns the seconds it adds to the union."""
        shared = 0.0
        for other, spans in enumerate(self._spans):
            if other == lane:
                continue
            for a, b in spans:
                shared += max(0.0, min(b, end) - max(a, start))
        self._spans[lane].append((start, end))
        return max(0.0, end - start - shared)


class Stamp(Protocol):
    """A completed timed point in a lane's work (a recorded CUDA event with timing)."""

    def elapsed_time(self, end_event: Any, /) -> float:
        """Milliseconds from this point to ``end_event``, read as the device gives them (float32)."""
        ...


S = TypeVar("S", bound=Stamp)


class DeviceClock(Generic[S]):
    """Finished calls' start and end in seconds on one clock, as precise after days as after seconds.

    The device gives the time between two events as float32 milliseconds (``cudaEventElapsedTime``), so
    times read from one event recorded at start-up lose precision with uptime: a quarter of a
    millisecond after an hour, 8 ms after a day, as long as a call itself. The clock instead reads each
    call from an *anchor* at most about ``every`` seconds older, a finished call's start adopted as the
    next anchor, with each anchor's own time kept in float64.

    A call is read from the newest anchor adopted before the call was launched: its start was recorded
    after that anchor had passed on the device, so it is never read backwards (the device's reading of a
    negative interval is not something to rely on). A call on the other lane launched just before an
    adoption is read from the anchor before. After an idle gap the first calls are read from an anchor
    as old as the gap, so they carry its rounding; they cannot overlap calls before the gap.

    Used by both lanes' completers, so it takes a lock of its own.
    """

    def __init__(self, origin: S, every: float = 1.0, keep: int = 8) -> None:
        self._lock = threading.Lock()
        self._every = every
        # (host time when adopted, its event, its time in seconds on this clock); the origin was recorded
        # before any call was launched, so it stays the fallback of a call in flight across every anchor
        self._origin: tuple[float, S, float] = (-math.inf, origin, 0.0)
        self._anchors: deque[tuple[float, S, float]] = deque([self._origin], maxlen=keep)

    def span(self, began: S, done: S, launched: float, now: float) -> tuple[float, float]:
        """A finished call's start and end: ``began`` and ``done`` its events, ``launched`` the host time
        (``time.monotonic()``) before ``began`` was recorded, ``now`` a host time after both completed."""
        length = began.elapsed_time(done) / 1000.0
        with self._lock:
            anchors = self._anchors
            _, anchor, at = self._origin  # none kept was adopted before the launch: in flight that long
            for adopted, stamp, stamp_at in reversed(anchors):
                if adopted < launched:
                    anchor, at = stamp, stamp_at
                    break
            start = at + anchor.elapsed_time(began) / 1000.0
            if start - anchors[-1][2] >= self._every:
                anchors.append((now, began, start))
        return start, start + length
