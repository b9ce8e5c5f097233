"""Garbage-collector pauses: how long each collection stopped the interpreter, as /metrics lines.

A collection runs on whichever thread allocated last while every other thread waits for the interpreter
lock, so a collection of the oldest generation, which walks every object the open streams hold, stalls
every stream at once. Next to the event-loop lag (:mod:`.looplag`), this tells whether a stall was the
collector's: the count and the time per generation, and the longest pause since the previous scrape.

Hook (one line each in the server): ``self.gc_pauses = GcPauseMonitor.start()`` when it starts
listening, ``self.gc_pauses.stop()`` when it stops, and append ``self.gc_pauses.render()`` to the
``/metrics`` text.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GcPauseMonitor"]

_GENERATIONS = (0, 1, 2)


@dataclass
class GcPauseMonitor:
    """Times every collection through :data:`gc.callbacks` (process-wide) until :meth:`stop`."""

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_recent: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # since the last render()
    _began: float = 0.0

    @classmethod
    def start(cls) -> GcPauseMonitor:
        monitor = cls()
        gc.callbacks.append(monitor._callback)
        return monitor

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Called with the collection's start and stop, on the collecting thread, which holds the lock.
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = info["generation"]
        pause = time.perf_counter() - self._began
        self.collections[generation] += 1
        self.seconds[generation] += pause
        if pause > self.max_recent[generation]:
            self.max_recent[generation] = pause

    def render(self) -> str:
        """Prometheus text: collections and their time per generation (counters), and the longest pause
        of each since the previous scrape (a gauge)."""
        peaks, self.max_recent = self.max_recent, [0.0, 0.0, 0.0]
        name = "streamdec_gc"
        lines = [
            f"# HELP {name}_collections_total Garbage collections by generation (2: a full collection).",
            f"# TYPE {name}_collections_total counter",
            *(f'{name}_collections_total{{generation="{g}"}} {self.collections[g]}' for g in _GENERATIONS),
            f"# HELP {name}_pause_seconds_total Time the garbage collector stopped the interpreter.",
            f"# TYPE {name}_pause_seconds_total counter",
            *(f'{name}_pause_seconds_total{{generation="{g}"}} {self.seconds[g]:.6f}' for g in _GENERATIONS),
            f"# HELP {name}_pause_max_seconds Longest collection since the previous scrape.",
            f"# TYPE {name}_pause_max_seconds gauge",
            *(f'{name}_pause_max_seconds{{generation="{g}"}} {peaks[g]:.6f}' for g in _GENERATIONS),
        ]
        return "\n".join(lines) + "\n"
