"""Server counters and their Prometheus text rendering, written by hand (no client library needed).

Labels are low-cardinality only: error code and stream status, never a stream or connection id.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from streamdec.engine import EngineStats
from streamdec.protocol import ErrorCode
from streamdec.streaming import DecoderStats

from .placement import DeviceLoad

__all__ = ["Histogram", "ServerMetrics", "render_device_loads", "render_engine"]

# Seconds; first audio is tens of ms on a GPU and up to seconds on a loaded CPU.
_TTFA_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    """A cumulative Prometheus histogram over fixed upper bounds."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        out += [
            f'{name}_bucket{{le="+Inf"}} {self.n}',
            f"{name}_sum {self.total:.6f}",
            f"{name}_count {self.n}",
        ]
        return out


@dataclass
class ServerMetrics:
    """What the server counts; the app updates it, ``/metrics`` renders it."""

    connections: int = 0
    connections_total: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    audio_samples: int = 0  # samples per channel sent, all streams
    errors: Counter[str] = field(default_factory=Counter)
    streams: Counter[str] = field(default_factory=Counter)  # finished streams by done status, or "lost"
    refused: int = 0  # starts refused by admission (over_capacity)
    handshakes_refused: int = 0  # connections dropped at accept: max_handshakes were in the handshake
    accept_errors: int = 0  # accept() calls that failed for want of file descriptors or memory
    ttfa: Histogram = field(default_factory=lambda: Histogram(_TTFA_BUCKETS))

    def render(
        self,
        decoder: DecoderStats,
        *,
        sample_rate: int,
        hop_size: int,
        warm: bool,
        capacity: int | None = None,
        handshaking: int = 0,
    ) -> str:
        """Prometheus text exposition format 0.0.4."""
        engine = decoder.engine
        decoded_audio = decoder.frames * hop_size / sample_rate
        rtf = engine.decode_seconds / decoded_audio if decoded_audio else 0.0
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, lines: list[str]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *lines])

        metric("streamdec_warm", "gauge", "1 once warm-up finished.", [f"streamdec_warm {int(warm)}"])
        metric(
            "streamdec_connections",
            "gauge",
            "Open WebSocket connections.",
            [f"streamdec_connections {self.connections}"],
        )
        metric(
            "streamdec_connections_total",
            "counter",
            "WebSocket connections accepted.",
            [f"streamdec_connections_total {self.connections_total}"],
        )
        metric(
            "streamdec_open_streams",
            "gauge",
            "Streams being decoded now.",
            [f"streamdec_open_streams {decoder.open_streams}"],
        )
        metric(
            "streamdec_streams_total",
            "counter",
            "Finished streams by done status; lost: the connection ended before the stream's done.",
            [
                f'streamdec_streams_total{{status="{s}"}} {self.streams[s]}'
                for s in ("completed", "cancelled", "error", "lost")
            ],
        )
        metric(
            "streamdec_capacity_streams",
            "gauge",
            "Real-time streams admitted at most (measured at warm-up or --max-streams-total); -1: unbounded.",
            [f"streamdec_capacity_streams {-1 if capacity is None else capacity}"],
        )
        metric(
            "streamdec_streams_refused_total",
            "counter",
            "Starts refused by admission (over_capacity).",
            [f"streamdec_streams_refused_total {self.refused}"],
        )
        metric(
            "streamdec_handshakes",
            "gauge",
            "Connections in their opening handshake now.",
            [f"streamdec_handshakes {handshaking}"],
        )
        metric(
            "streamdec_handshakes_refused_total",
            "counter",
            "Connections dropped at accept because max_handshakes were in their handshake.",
            [f"streamdec_handshakes_refused_total {self.handshakes_refused}"],
        )
        metric(
            "streamdec_accept_errors_total",
            "counter",
            "accept() calls that failed for want of file descriptors or memory (EMFILE, ENFILE, ...).",
            [f"streamdec_accept_errors_total {self.accept_errors}"],
        )
        metric(
            "streamdec_errors_total",
            "counter",
            "Error messages sent, by wire code.",
            [f'streamdec_errors_total{{code="{c.value}"}} {self.errors[c.value]}' for c in ErrorCode],
        )
        metric(
            "streamdec_received_bytes_total",
            "counter",
            "WebSocket message bytes received.",
            [f"streamdec_received_bytes_total {self.bytes_in}"],
        )
        metric(
            "streamdec_sent_bytes_total",
            "counter",
            "WebSocket message bytes sent.",
            [f"streamdec_sent_bytes_total {self.bytes_out}"],
        )
        metric(
            "streamdec_time_to_first_audio_seconds",
            "histogram",
            "From a stream's first latent message received to its first audio message sent.",
            self.ttfa.lines("streamdec_time_to_first_audio_seconds"),
        )
        metric(
            "streamdec_audio_seconds_total",
            "counter",
            "Audio sent, in seconds per channel.",
            [f"streamdec_audio_seconds_total {self.audio_samples / sample_rate:.6f}"],
        )
        metric(
            "streamdec_realtime_factor",
            "gauge",
            "Decode seconds per second of audio decoded since start (below 1 is faster than real time).",
            [f"streamdec_realtime_factor {rtf:.6f}"],
        )
        return "\n".join(out) + "\n" + render_engine(engine)


def render_engine(engine: EngineStats) -> str:
    """The engine's counters as Prometheus text: ``/metrics`` carries them, and so does the load test's
    in-process decoder target, so both report how busy the device was and how full its calls."""
    return "\n".join([
        "# HELP streamdec_window_decode_seconds Device time of the engine's calls (sum), and the windows "
        "and stateful calls they decoded (count).",
        "# TYPE streamdec_window_decode_seconds summary",
        f"streamdec_window_decode_seconds_sum {engine.decode_seconds:.6f}",
        f"streamdec_window_decode_seconds_count {engine.windows}",
        "# HELP streamdec_engine_calls_total Device calls the engine made (each decodes a batch).",
        "# TYPE streamdec_engine_calls_total counter",
        f"streamdec_engine_calls_total {engine.decodes}",
        "# HELP streamdec_engine_tier_calls_total Device calls by how they ran: a captured graph, compiled, "
        "or eager (eager-frozen: a shape no warm-up captured, decoded eagerly on the device thread).",
        "# TYPE streamdec_engine_tier_calls_total counter",
        *(f'streamdec_engine_tier_calls_total{{tier="{t}"}} {n}' for t, n in sorted(engine.by_tier.items())),
        "# HELP streamdec_engine_queued_windows Windows and stateful calls waiting for the engine.",
        "# TYPE streamdec_engine_queued_windows gauge",
        f"streamdec_engine_queued_windows {engine.queued}",
    ]) + "\n"  # fmt: skip


def render_device_loads(loads: list[DeviceLoad]) -> str:
    """Per-device gauges (``--devices``): streams placed on each device and the slots it has."""
    out = [
        "# HELP streamdec_device_open_streams Streams placed on each device now.",
        "# TYPE streamdec_device_open_streams gauge",
        *(f'streamdec_device_open_streams{{device="{d.device}"}} {d.open_streams}' for d in loads),
        "# HELP streamdec_device_capacity_streams Streams each device holds at most (its slots); -1: unbounded.",
        "# TYPE streamdec_device_capacity_streams gauge",
        *(
            f'streamdec_device_capacity_streams{{device="{d.device}"}} {-1 if d.capacity is None else d.capacity}'
            for d in loads
        ),
    ]
    return "\n".join(out) + "\n"
