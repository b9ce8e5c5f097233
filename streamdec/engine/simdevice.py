"""A measurement tool: a modelled device whose two lanes of calls run at once, as a GPU's two streams do.

The simulated engine's default device (:mod:`.simulated`) sleeps each call's modelled time on the
engine's device thread, one call at a time: it cannot show what a second lane buys. :class:`SharedDevice`
instead runs each lane's calls in order on a clock of its own thread, and while both lanes have a call
running each goes at a share of its own speed (``rates``: on an H100, beside a step an edge call took
about 1.6-1.9 times as long and the step a few percent longer; docs/stateful.md). A call's modelled time
is its time alone. Each call gets two :class:`SimEvent` s, when it began and when it ended, which the
engine's completers wait on and its busy accounting reads like CUDA events, so the same lanes, fences of
time and busy union run as on a GPU.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["SharedDevice", "SimEvent"]


class SimEvent:
    """A point in a modelled lane's work, CUDA-event-like: set once the modelled device passes it."""

    def __init__(self) -> None:
        self._at: float | None = None
        self._passed = threading.Event()

    def stamp(self, at: float) -> None:
        self._at = at
        self._passed.set()

    def query(self) -> bool:
        return self._passed.is_set()

    def synchronize(self) -> None:
        self._passed.wait()

    def elapsed_time(self, end_event: SimEvent, /) -> float:
        """Milliseconds from this point to ``end_event`` (both passed)."""
        if self._at is None or end_event._at is None:
            raise RuntimeError("elapsed_time of a modelled event that has not passed")
        return (end_event._at - self._at) * 1e3


@dataclass(eq=False)
class _Call:
    left: float  # seconds of work left, at the call's own speed
    began: SimEvent = field(default_factory=SimEvent)
    done: SimEvent = field(default_factory=SimEvent)


class SharedDevice:
    """Two lanes of modelled calls on one device (see the module docstring).

    ``rates[i]``: the share of its own speed lane ``i``'s running call keeps while the other lane also
    runs one (1.0 each: the lanes never slow each other). A lane alone runs at full speed.
    """

    def __init__(
        self, rates: tuple[float, float] = (1.0, 1.0), clock: Callable[[], float] = time.monotonic
    ) -> None:
        if len(rates) != 2 or not all(math.isfinite(r) and 0 < r <= 1 for r in rates):
            raise ConfigError(f"rates must be two shares of speed in (0, 1], got {rates}")
        self.rates = rates
        self._clock = clock
        self._cond = threading.Condition()
        self._lanes: list[deque[_Call]] = [deque(), deque()]
        self._at = clock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="streamdec-simulated-device", daemon=True)
        self._thread.start()

    def origin(self) -> SimEvent:
        """An event passed now: the clock a run's call times are read against."""
        event = SimEvent()
        with self._cond:
            event.stamp(self._clock())
        return event

    def launch(self, lane: int, seconds: float) -> tuple[SimEvent, SimEvent]:
        """Queue a call of ``seconds`` (its time alone) on ``lane``; returns its began and done events."""
        call = _Call(max(0.0, seconds))
        with self._cond:
            self._advance(self._clock())
            queue = self._lanes[lane]
            queue.append(call)
            if len(queue) == 1:
                call.began.stamp(self._at)
            self._finish_empty()
            self._cond.notify()
        return call.began, call.done

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _speeds(self) -> list[float]:
        both = all(self._lanes)
        return [self.rates[i] if both else 1.0 for i in range(2)]

    def _advance(self, now: float) -> None:
        """Run the lanes' calls from the last advance to ``now``, one completion at a time (a completion
        changes the other lane's speed)."""
        while now > self._at:
            speeds = self._speeds()
            heads = [
                (q[0].left / s, i) for i, (q, s) in enumerate(zip(self._lanes, speeds, strict=True)) if q
            ]
            if not heads:
                self._at = now
                return
            step = min(now - self._at, min(t for t, _ in heads))
            for i, queue in enumerate(self._lanes):
                if queue:
                    queue[0].left -= step * speeds[i]
            self._at += step
            self._finish_empty()

    def _finish_empty(self) -> None:
        """Stamp the calls whose work is done (within a nanosecond) and start each lane's next call."""
        for queue in self._lanes:
            while queue and queue[0].left <= 1e-9:
                queue.popleft().done.stamp(self._at)
                if queue:
                    queue[0].began.stamp(self._at)

    def _next_done(self) -> float:
        """When the next running call ends at the current speeds (inf: none running)."""
        speeds = self._speeds()
        ends = [q[0].left / s for q, s in zip(self._lanes, speeds, strict=True) if q]
        return self._at + min(ends) if ends else math.inf

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                self._advance(self._clock())
                wait = self._next_done() - self._clock()
                if wait > 0:
                    self._cond.wait(None if math.isinf(wait) else wait)
