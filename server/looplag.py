"""Event-loop lag: how late the server's event loop runs a callback it scheduled, as /metrics lines.

A task sleeps ``interval`` seconds and measures how much later than asked it woke up. Everything on the
loop (reading sockets, parsing, sending audio, resolving decode futures) delays that wake-up, so the lag
is the queueing delay any message of any stream sees on top of its own work: the host path's headroom.
At 0 the loop is idle between events; when it approaches the chunk period, streams start to starve.

Hook (one line each in the server): ``self.loop_lag = LoopLagMonitor.start()`` when it starts listening,
and append ``self.loop_lag.render()`` to the ``/metrics`` text.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .metrics import Histogram

__all__ = ["LAG_BUCKETS", "LoopLagMonitor"]

# Seconds: a healthy loop lags well under a millisecond; past tens of ms first audio visibly suffers.
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_NAME = "streamdec_event_loop_lag_seconds"


@dataclass
class LoopLagMonitor:
    """Samples the running loop's lag every ``interval`` seconds; ``render()`` gives Prometheus lines."""

    interval: float = 0.01
    last: float = 0.0  # lag of the latest sample
    max_recent: float = 0.0  # largest lag since the previous render()
    histogram: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, interval: float = 0.01) -> LoopLagMonitor:
        """A monitor sampling the running loop until that loop closes (or :meth:`stop`)."""
        monitor = cls(interval)
        monitor._task = asyncio.get_running_loop().create_task(monitor._run(), name="streamdec-loop-lag")
        return monitor

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def observe(self, lag: float) -> None:
        self.last = lag
        self.max_recent = max(self.max_recent, lag)
        self.histogram.observe(lag)

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter() + self.interval
            await asyncio.sleep(self.interval)
            self.observe(max(0.0, time.perf_counter() - asked))

    def render(self) -> str:
        """Prometheus text: the latest lag and the largest since the last scrape (gauges), and a histogram."""
        peak, self.max_recent = self.max_recent, 0.0
        lines = [
            f"# HELP {_NAME}_last Event-loop lag of the latest sample.",
            f"# TYPE {_NAME}_last gauge",
            f"{_NAME}_last {self.last:.6f}",
            f"# HELP {_NAME}_max Largest event-loop lag since the previous scrape.",
            f"# TYPE {_NAME}_max gauge",
            f"{_NAME}_max {peak:.6f}",
            f"# HELP {_NAME} How late the event loop ran a timer (sampled every {self.interval:g} s).",
            f"# TYPE {_NAME} histogram",
            *self.histogram.lines(_NAME),
        ]
        return "\n".join(lines) + "\n"
