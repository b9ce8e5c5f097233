"""Which device takes a new stream, and which devices ``--devices`` names. Pure: no torch, no I/O.

A websocket stream is placed once, when it starts, and stays on its device until it ends (its layer
state lives in one of that device's slots). Placement therefore looks at streams, not at momentary
queue depth: the device with the most free slots takes the new stream::

    free(d) = capacity(d) - open_streams(d)      (capacity None: unbounded, free = infinity)
    chosen  = argmax free(d); ties: fewest open streams, then the first listed

so two equal GPUs fill evenly and a larger one (more slots) takes more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from streamdec.errors import ConfigError

__all__ = ["DeviceLoad", "parse_devices", "place"]


@dataclass(frozen=True)
class DeviceLoad:
    """One device's streams now."""

    device: str  # "cuda:0", or any name in tests
    open_streams: int
    capacity: int | None  # streams the device holds at most (its slots); None: no bound

    @property
    def free(self) -> float:
        return math.inf if self.capacity is None else self.capacity - self.open_streams

    @property
    def load(self) -> float | None:
        """Share of the capacity in use (None when unbounded)."""
        return None if not self.capacity else self.open_streams / self.capacity


def place(loads: Sequence[DeviceLoad]) -> int | None:
    """Index in ``loads`` of the device for a new stream; None when every device is full."""
    candidates = [i for i, d in enumerate(loads) if d.free > 0]
    if not candidates:
        return None
    return min(candidates, key=lambda i: (-loads[i].free, loads[i].open_streams, i))


def parse_devices(spec: str, cuda_count: int) -> list[str]:
    """``--devices``: ``all`` (every CUDA device) or a comma-separated list such as ``cuda:0,cuda:1``.

    ``cuda_count`` is how many CUDA devices this host has. Refuses an empty list, a duplicate (two
    engines on one device share its memory and compete for it: raise ``--slots`` instead), a malformed
    name and an index the host does not have.
    """
    if spec.strip() == "all":
        if cuda_count < 1:
            raise ConfigError("--devices all: no CUDA device here; use --device cpu (one engine) instead")
        return [f"cuda:{i}" for i in range(cuda_count)]
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"--devices {spec!r} names no device: write all, or e.g. cuda:0,cuda:1")
    for name in names:
        kind, _, index = name.partition(":")
        if kind != "cuda" or not index.isdigit():
            raise ConfigError(f"--devices: {name!r} is not a CUDA device; write cuda:N (N from 0), or all")
        if int(index) >= cuda_count:
            raise ConfigError(
                f"--devices: {name} does not exist, this host has {cuda_count} CUDA device(s) "
                f"(cuda:0 to cuda:{cuda_count - 1})"
            )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"--devices names {', '.join(duplicates)} twice: one engine per device; raise --slots for more "
            "streams on one device"
        )
    return names
