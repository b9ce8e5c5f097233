"""Several devices in one process: one :class:`~streamdec.StreamDecoder` (one engine) per device, and a
group that places each new stream on the device with the most free capacity (:mod:`.placement`).

One process drives every device: each engine already decodes off the event loop on its own worker, so
the process's one event loop only moves bytes and small control messages for all of them, and one
listening port, one admission count and one ``/healthz`` describe the whole host to a balancer. The
alternative, one process per GPU behind the balancer, needs no code (``deploy/``) and isolates a device
fault; the group is for hosts where one port per host is wanted.

:class:`DecoderGroup` offers what :class:`~.app.StreamServer` uses of a decoder (``codec``, ``mode``,
``max_streams``, ``stats``, ``warmup``, ``freeze``, ``decode_tiles``, ``push_stream``), so the server needs no branch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from streamdec.engine.base import EngineStats, WarmupReport
from streamdec.errors import ConfigError, TooManyStreamsError
from streamdec.streaming import DecoderStats, PushStream, StreamDecoder, TileStream

from .placement import DeviceLoad, place

__all__ = ["DecoderGroup"]


class DecoderGroup:
    """Several decoders of one codec, one per device; ``names[i]`` names ``decoders[i]``'s device."""

    def __init__(self, decoders: Sequence[StreamDecoder], names: Sequence[str]) -> None:
        if not decoders or len(decoders) != len(names):
            raise ConfigError(
                f"a DecoderGroup needs one name per decoder, got {len(decoders)} and {len(names)}"
            )
        modes = {d.mode for d in decoders}
        if len(modes) != 1:
            raise ConfigError(f"the decoders of a group must share one mode, got {sorted(modes)}")
        self.decoders, self.names = list(decoders), list(names)
        self.codec = decoders[0].codec
        self.mode = decoders[0].mode
        self.min_emit = decoders[0].min_emit  # the decoders are built alike
        self.flush_policy = decoders[0].flush_policy

    @property
    def max_streams(self) -> int | None:
        """Slots on all devices together (None: halo mode, no slot bound)."""
        bounds = [d.max_streams for d in self.decoders]
        return None if any(b is None for b in bounds) else sum(b for b in bounds if b is not None)

    def device_loads(self) -> list[DeviceLoad]:
        return [
            DeviceLoad(name, d.stats.open_streams, d.max_streams)
            for name, d in zip(self.names, self.decoders, strict=True)
        ]

    def decode_tiles(self, chunks: Any, **options: Any) -> TileStream:
        """One stream, on the device with the most free capacity (see :func:`.placement.place`)."""
        return self._placed().decode_tiles(chunks, **options)

    def push_stream(self, *args: Any, **options: Any) -> PushStream:
        """One stream without a task (:meth:`StreamDecoder.push_stream`), placed as ``decode_tiles``."""
        return self._placed().push_stream(*args, **options)

    def _placed(self) -> StreamDecoder:
        chosen = place(self.device_loads())
        if chosen is None:
            raise TooManyStreamsError(
                f"every device is full ({self.max_streams} slots on {len(self.decoders)} devices); "
                "retry later or start the server with more --slots"
            )
        return self.decoders[chosen]

    @property
    def stats(self) -> DecoderStats:
        parts = [d.stats for d in self.decoders]
        total = DecoderStats(mode=self.mode, warm=all(p.warm for p in parts), engine=_sum_engine(parts))
        for name in ("open_streams", "streams", "tiles", "frames"):
            setattr(total, name, sum(getattr(p, name) for p in parts))
        return total

    def state_memory_bytes(self) -> int:
        return sum(d.engine.state_memory_bytes() for d in self.decoders)

    async def warmup(self) -> WarmupReport:
        """Warm every device in turn; the report adds up seconds, graphs and graph memory."""
        reports = [await d.warmup() for d in self.decoders]
        return WarmupReport(
            seconds=sum(r.seconds for r in reports),
            graphs=sum(r.graphs for r in reports),
            graph_memory_bytes=sum(r.graph_memory_bytes for r in reports),
            notes=tuple(note for r in reports for note in r.notes),
        )

    def freeze(self) -> None:
        for d in self.decoders:
            d.freeze()

    async def start(self) -> None:
        for d in self.decoders:
            await d.start()

    async def aclose(self) -> None:
        for d in self.decoders:
            await d.aclose()

    async def __aenter__(self) -> DecoderGroup:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _sum_engine(parts: Sequence[DecoderStats]) -> EngineStats:
    total = EngineStats()
    for field in dataclasses.fields(EngineStats):
        if field.name != "by_tier":
            setattr(total, field.name, sum(getattr(p.engine, field.name) for p in parts))
    for p in parts:
        for tier, n in p.engine.by_tier.items():
            total.by_tier[tier] = total.by_tier.get(tier, 0) + n
    return total
