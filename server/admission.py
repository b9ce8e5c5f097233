"""Admission by capacity: how many real-time streams the server takes, and the answer to one more.

Pure: no sockets, no clock, no engine. :class:`StreamServer` measures the engine once at warm-up
(:mod:`.probe`), builds an :class:`AdmissionController` and asks it before every ``start``, passing the
live load. Two bounds, the smallest wins::

    capacity = min( --max-streams-total   (operator override; else the warm-up measurement),
                    StreamDecoder.max_streams   (the decoder's own hard bound, when it has one) )

and, whatever the capacity, a new stream is refused while the engine is already behind (more windows
queued than the admitted streams can keep waiting in steady state). A measured capacity of 0 (the engine
cannot keep one real-time stream's listener supplied) refuses every stream, saying so; an operator who
wants streams served anyway, at best effort, sets ``--max-streams-total``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamdec.errors import ConfigError

__all__ = ["SAFETY_FACTOR", "AdmissionController", "Load", "Refusal", "realtime_streams"]

#: Share of the measured throughput that admission hands out. The probe times the calls of streams paced
#: in real time, but streams arrive unevenly, start together, and share the host with the server's own
#: work (and, on one machine, the load generator's); half the measured real-time factor keeps admitted
#: streams ahead of their listeners past their first tiles on the hosts this was tried on.
SAFETY_FACTOR = 0.5

#: Windows an admitted stream may have waiting in the engine in steady state (one decoding, one queued).
#: A queue deeper than this per admitted stream means the engine is behind: new streams wait.
QUEUED_WINDOWS_PER_STREAM = 2


def realtime_streams(audio_seconds: float, wall_seconds: float, safety: float = SAFETY_FACTOR) -> int:
    """Real-time streams one engine sustains: decoded audio per wall second, times ``safety``, floored.

    ``audio_seconds`` of audio (all streams together) took ``wall_seconds`` to decode in one batch.
    0 when that is below one stream: an engine slower than that serves nobody in real time.
    """
    if audio_seconds <= 0 or wall_seconds <= 0:
        raise ConfigError(
            f"a capacity probe needs positive durations, got {audio_seconds=} and {wall_seconds=}"
        )
    if not 0 < safety <= 1:
        raise ConfigError(f"safety={safety} must be in (0, 1]")
    return math.floor(audio_seconds / wall_seconds * safety)


@dataclass(frozen=True)
class Load:
    """The live load a decision is taken against."""

    open_streams: int  # streams admitted and not yet done, on every connection
    queued_windows: int = 0  # windows waiting for the engine now


@dataclass(frozen=True)
class Refusal:
    """Why a stream was refused, for the ``over_capacity`` error, and when to try again."""

    reason: str
    retry_after_ms: int


class AdmissionController:
    """Decides whether one more stream may start.

    ``measured``: real-time streams from the warm-up probe (None before it ran, or when no probe runs;
    0 when the engine cannot serve one, and then every stream is refused);
    ``override``: ``--max-streams-total``, which replaces the measurement; ``hard_limit``: the decoder's
    own bound (``StreamDecoder.max_streams``), never exceeded. With neither a measurement nor an
    override the server admits up to ``hard_limit`` (unbounded without one): it has no figure to go by.
    """

    def __init__(
        self,
        *,
        measured: int | None = None,
        override: int | None = None,
        hard_limit: int | None = None,
        retry_after_ms: int = 1000,
    ) -> None:
        if measured is not None and measured < 0:
            raise ConfigError(f"measured={measured} streams must be >= 0 (or None)")
        for name, value in (("override", override), ("hard_limit", hard_limit)):
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value} streams must be >= 1 (or None)")
        if retry_after_ms < 0:
            raise ConfigError(f"retry_after_ms={retry_after_ms} must be >= 0")
        self.measured, self.override, self.hard_limit = measured, override, hard_limit
        self.retry_after_ms = retry_after_ms

    @property
    def capacity(self) -> int | None:
        """Streams admitted at most; None: no bound known."""
        base = self.override if self.override is not None else self.measured
        bounds = [b for b in (base, self.hard_limit) if b is not None]
        return min(bounds) if bounds else None

    @property
    def source(self) -> str:
        """Where the capacity comes from, for logs and ``/healthz``."""
        if self.override is not None:
            return "max_streams_total"
        return "measured" if self.measured is not None else "unbounded"

    def full(self, load: Load) -> bool:
        """Whether a new stream would be refused now (``/healthz`` answers 503 then)."""
        return self.check(load) is not None

    def check(self, load: Load) -> Refusal | None:
        """None to admit one more stream; else why not."""
        cap = self.capacity
        if cap == 0:
            return Refusal(
                "this server cannot serve one real-time stream: at warm-up its engine could not keep one "
                "stream's listener supplied (capacity 0, measured); use another server, or start this one "
                "with --max-streams-total N to serve N streams at best effort (they may under-run)",
                self.retry_after_ms,
            )
        if cap is not None and load.open_streams >= cap:
            return Refusal(
                f"{load.open_streams} streams open, capacity {cap} real-time streams ({self.source}); "
                "retry later or use another server",
                self.retry_after_ms,
            )
        backlog = QUEUED_WINDOWS_PER_STREAM * max(load.open_streams, 1)
        if load.queued_windows > backlog:
            return Refusal(
                f"the engine is behind: {load.queued_windows} windows queued for {load.open_streams} "
                f"streams (more than {QUEUED_WINDOWS_PER_STREAM} each); retry later",
                self.retry_after_ms,
            )
        return None
