"""Server settings: one frozen dataclass, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamdec.errors import ConfigError
from streamdec.protocol import Limits

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and every bound a connection lives under.

    Memory per connection is bounded by ``limits.max_streams * stream_queue`` latent messages in and
    ``outbox`` messages out; a listener whose socket accepts nothing for ``send_timeout`` seconds is
    disconnected with 1013 and its streams are freed.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # when set, handshakes need "Authorization: Bearer T" or "?token=T"
    limits: Limits = field(default_factory=Limits)
    max_connections: int = 64  # one more is told "overloaded" and closed with 1013
    stream_queue: int = 4  # latent messages buffered per stream before the connection stops reading
    outbox: int = 16  # messages queued per connection before its streams stop decoding
    send_timeout: float = 10.0  # seconds a send may make no progress before the listener is "too slow"
    grace: float = 30.0  # on shutdown, seconds in-flight streams get to finish before 1001
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    close_timeout: float = 5.0
    write_limit: int = 256 * 1024  # bytes buffered in user space per connection before send() waits
    send_buffer: int | None = None  # SO_SNDBUF of each accepted socket (None: the OS autotunes, up to MBs)

    def __post_init__(self) -> None:
        for name in ("max_connections", "stream_queue", "outbox", "write_limit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("send_timeout", "grace", "close_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0 seconds")
        if self.send_buffer is not None and self.send_buffer < 1:
            raise ConfigError(f"send_buffer={self.send_buffer} must be >= 1 byte, or None for the OS default")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port} is not in [0, 65535]; 0 picks a free port")
