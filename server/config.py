"""Server settings: one frozen dataclass, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamdec.errors import ConfigError
from streamdec.protocol import Limits

from .opus import DEFAULT_BITRATE, check_bitrate

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and every bound a connection lives under.

    Memory per connection is bounded by ``limits.max_streams * limits.max_buffered_frames`` latent frames
    in and ``outbox`` messages out; a listener whose socket accepts nothing for ``send_timeout`` seconds is
    disconnected with 1013 and its streams are freed.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # when set, handshakes and /metrics need "Authorization: Bearer T" or "?token=T"
    public_healthz: bool = False  # with a token: /healthz stays open for probes that cannot send one
    allow_origins: tuple[str, ...] = ()  # browser Origins allowed besides the server's own page
    limits: Limits = field(default_factory=Limits)
    max_streams_total: int | None = None  # real-time streams admitted on all connections; None: measured
    probe_capacity: bool = True  # measure real-time capacity at warm-up (unless max_streams_total is set)
    capacity_cache: str | None = None  # CUDA: where probe verdicts are kept between starts (.probe_cache)
    retry_after: float = 1.0  # seconds a refused stream is told to wait (``retry_after_ms``)
    max_connections: int = 64  # one more is told "overloaded" and closed with 1013
    max_connections_per_client: int = 16  # per client IP address; one more gets "overloaded" + 1013
    max_handshakes: int = 32  # connections in the opening handshake at once; more are refused at accept
    open_timeout: float = 5.0  # seconds a client gets to finish its opening handshake
    idle_timeout: float | None = 60.0  # seconds a connection with no open stream may send nothing
    error_budget: int = 32  # rejected messages a connection may have outstanding before close 1008
    error_refill: float = 1.0  # per second: the budget recovers at this rate
    stream_queue: int = 4  # latent messages the websocket layer buffers before it stops reading
    outbox: int = 16  # messages queued per connection before its streams stop decoding
    send_timeout: float = 10.0  # seconds a send may make no progress before the listener is "too slow"
    grace: float = 30.0  # on shutdown, seconds in-flight streams get to finish before 1001
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    close_timeout: float = 5.0
    write_limit: int = 256 * 1024  # bytes buffered in user space per connection before send() waits
    # SO_SNDBUF of each accepted socket (None: the OS autotunes it, up to net.ipv4.tcp_wmem's 4 MiB, which
    # holds 40 s of f32 audio for a listener that stopped reading before the server sees any stall). 64 KiB
    # still carries 8 f32 streams over a 100 ms round trip.
    send_buffer: int | None = 64 * 1024
    text_chunk_frames: int = 8  # with a voice: latent frames per chunk it hands a text stream (as `say`)
    opus_bitrate: int = DEFAULT_BITRATE  # bits per second of format "opus" (constant bit rate, mono)

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_client", "max_handshakes", "error_budget",
                     "stream_queue", "outbox", "write_limit", "text_chunk_frames"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("send_timeout", "grace", "close_timeout", "retry_after", "error_refill"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0 seconds")
        for name in ("open_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name}={value} must be > 0 seconds (idle_timeout: or None for none)")
        if self.max_streams_total is not None and self.max_streams_total < 1:
            raise ConfigError(
                f"max_streams_total={self.max_streams_total} must be >= 1, or None to measure capacity"
            )
        if self.send_buffer is not None and self.send_buffer < 1:
            raise ConfigError(f"send_buffer={self.send_buffer} must be >= 1 byte, or None for the OS default")
        check_bitrate(self.opus_bitrate)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port} is not in [0, 65535]; 0 picks a free port")
        for origin in self.allow_origins:
            if origin != "null" and "://" not in origin:
                raise ConfigError(
                    f"allow_origins entry {origin!r} is not an origin: write scheme://host[:port], "
                    "e.g. https://app.example.com"
                )

    @property
    def retry_after_ms(self) -> int:
        return round(self.retry_after * 1000)
