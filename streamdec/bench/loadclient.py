"""The load generator's client process: many paced streams over raw protocol-v1 websockets, one event loop.

A process is given its streams (:class:`ClientPlan`), opens their connections, reports that it is
connected, waits for the common start time, then for each stream sends ``start`` and latent chunks on a
TTS-like schedule (``chunk_frames`` frames every ``period / speedup`` seconds, from the stream's start
offset), then ``end``. It records when each chunk went out and when each audio message came back
(:class:`~streamdec.bench.loadstats.StreamRecord`) and returns the records; the parent analyses them.

It speaks the wire format directly (``streamdec.protocol`` encodes latents; audio headers are unpacked
with ``struct``), so the generator's own cost per message stays small: samples are never decoded, except
the one sampled stream's payloads, which are kept for the offline comparison.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .loadstats import StreamRecord

__all__ = ["ClientPlan", "StreamPlan", "client_main", "stream_latents"]

_AUDIO = b"SDAU"
_AUDIO_HEADER_BYTES = 24


@dataclass(frozen=True)
class StreamPlan:
    """One stream: its latents' seed and length, when it starts, and which chunk makes it decodable."""

    index: int
    seed: int
    frames: int
    offset_s: float  # start, after the common start time
    decodable_chunk: int  # chunk whose sending makes the first tile decodable; -1: the end does


@dataclass(frozen=True)
class ClientPlan:
    """What one client process does."""

    url: str
    streams: tuple[StreamPlan, ...]
    streams_per_connection: int
    chunk_frames: int
    period_s: float  # chunk period after the speed-up
    latent_dim: int
    fmt: str = "pcm_s16le"
    sampled: int = -1  # index of the stream whose audio payloads are kept
    token: str | None = None
    open_timeout: float = 60.0
    drain_s: float = 30.0  # after its last chunk, how long a stream may take to finish


@dataclass
class ClientReport:
    records: list[StreamRecord] = field(default_factory=list)
    send_late_ms: list[float] = field(default_factory=list)  # how late chunks left, vs their schedule
    # the in-process target: how late its event loop took each chunk, vs its schedule (the decoder's lag)
    pull_late_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    latent_messages: int = 0
    error: str | None = None


def stream_latents(seed: int, frames: int, latent_dim: int) -> np.ndarray:
    """``[frames, latent_dim]`` float32 standard-normal latents of one stream; the parent rebuilds them."""
    return np.random.default_rng(seed).standard_normal((frames, latent_dim), dtype=np.float32)


def _messages(stream_id: int, plan: StreamPlan, client: ClientPlan) -> list[bytes]:
    from streamdec.protocol import encode_latents

    latents = stream_latents(plan.seed, plan.frames, client.latent_dim)
    step = client.chunk_frames
    return [
        encode_latents(stream_id, k, latents[b : b + step]) for k, b in enumerate(range(0, plan.frames, step))
    ]


class _Connection:
    """One websocket with its streams (ids 0..k-1); a reader task routes audio to their records."""

    def __init__(
        self, ws: Any, plans: Sequence[StreamPlan], client: ClientPlan, report: ClientReport
    ) -> None:
        self.ws, self.client, self.report = ws, client, report
        self.plans = list(plans)
        self.records = [StreamRecord(p.index, p.frames) for p in plans]
        self.messages = [_messages(i, p, client) for i, p in enumerate(plans)]
        self.open = len(plans)
        self.all_done = asyncio.Event()

    async def read(self) -> None:
        sampled = next((i for i, p in enumerate(self.plans) if p.index == self.client.sampled), -1)
        pcm: list[bytes] = []
        async for message in self.ws:
            now = time.monotonic()
            if isinstance(message, bytes):
                if message[:4] != _AUDIO:
                    continue
                stream, _seq, start, n = _unpack_audio(message)
                self.records[stream].arrivals.append((now, start, n))
                if stream == sampled:
                    pcm.append(message[_AUDIO_HEADER_BYTES:])
                continue
            self._on_text(json.loads(message))
            if self.open == 0:
                break
        if sampled >= 0:
            self.records[sampled].pcm = b"".join(pcm)
        self.all_done.set()

    def _on_text(self, msg: dict[str, Any]) -> None:
        stream = msg.get("stream")
        if not isinstance(stream, int) or not 0 <= stream < len(self.records):
            if msg.get("type") == "error":
                for record in self.records:
                    record.errors.append(f"{msg.get('code')}: {msg.get('message')}")
            return
        record = self.records[stream]
        if msg["type"] == "done":
            record.status, record.done_samples = msg.get("status"), msg.get("samples")
            self.open -= 1
        elif msg["type"] == "error":
            record.errors.append(f"{msg.get('code')}: {msg.get('message')}")

    async def send_stream(self, i: int, t0: float) -> None:
        plan, record, messages = self.plans[i], self.records[i], self.messages[i]
        begin = t0 + plan.offset_s
        for k, message in enumerate(messages):
            due = begin + k * self.client.period_s
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            self.report.send_late_ms.append(max(0.0, now - due) * 1000.0)
            if k == 0:  # the stream starts right before its first chunk, as a TTS front end would
                await self.ws.send(json.dumps({"type": "start", "stream": i, "format": self.client.fmt}))
                record.first_sent = now
            await self.ws.send(message)
            self.report.latent_messages += 1
            if k == plan.decodable_chunk:
                record.decodable_sent = now
        now = time.monotonic()
        await self.ws.send(json.dumps({"type": "end", "stream": i}))
        if record.decodable_sent is None:
            record.decodable_sent = now


def _unpack_audio(message: bytes) -> tuple[int, int, int, int]:
    stream = int.from_bytes(message[4:8], "little")
    seq = int.from_bytes(message[8:12], "little")
    start = int.from_bytes(message[12:20], "little")
    n = int.from_bytes(message[20:24], "little")
    return stream, seq, start, n


async def _connect(client: ClientPlan, plans: Sequence[StreamPlan], report: ClientReport) -> _Connection:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {client.token}"} if client.token else None
    ws = await connect(
        client.url,
        additional_headers=headers,
        proxy=None,
        compression=None,
        max_size=2**26,
        open_timeout=client.open_timeout,
        ping_interval=None,  # the server pings; a client ping adds load the product does not ask for
    )
    ready = json.loads(await ws.recv())
    if ready.get("type") != "ready":
        raise RuntimeError(f"expected ready, got {ready!r:.200}")
    return _Connection(ws, plans, client, report)


async def _run(client: ClientPlan, pipe: Connection) -> ClientReport:
    report = ClientReport()
    k = client.streams_per_connection
    groups = [client.streams[i : i + k] for i in range(0, len(client.streams), k)]
    limit = asyncio.Semaphore(32)  # handshakes in flight: a storm of them is not what is measured

    async def connect_one(plans: Sequence[StreamPlan]) -> _Connection:
        async with limit:
            return await _connect(client, plans, report)

    connections = await asyncio.gather(*(connect_one(g) for g in groups))
    loop = asyncio.get_running_loop()
    pipe.send(("connected", len(connections)))
    t0 = await loop.run_in_executor(None, pipe.recv)
    cpu0 = time.process_time()
    readers = [asyncio.create_task(c.read()) for c in connections]
    senders = [asyncio.create_task(c.send_stream(i, t0)) for c in connections for i in range(len(c.plans))]
    last_start = max(p.offset_s for p in client.streams)
    longest = max(len(m) for c in connections for m in c.messages) * client.period_s
    deadline = t0 + last_start + longest + client.drain_s
    _done, pending = await asyncio.wait([*readers, *senders], timeout=max(0.0, deadline - time.monotonic()))
    for task in pending:
        task.cancel()
    for task in (*readers, *senders):
        if task.done() and not task.cancelled() and task.exception() is not None:
            report.error = report.error or f"{type(task.exception()).__name__}: {task.exception()}"
    report.cpu_s = time.process_time() - cpu0
    await asyncio.gather(*(c.ws.close() for c in connections), return_exceptions=True)
    for c in connections:
        for record in c.records:
            if record.status is None and not record.errors:
                record.errors.append("no done before the drain timeout" if pending else "connection closed")
        report.records.extend(c.records)
    return report


def client_main(client: ClientPlan, pipe: Connection) -> None:
    """Entry point of a client process: run the plan, send the :class:`ClientReport` back on ``pipe``."""
    try:
        report = asyncio.run(_run(client, pipe))
    except Exception as exc:  # reported to the parent, which fails the run with the reason
        report = ClientReport(error=f"{type(exc).__name__}: {exc}")
    pipe.send(("report", report))
    pipe.close()
