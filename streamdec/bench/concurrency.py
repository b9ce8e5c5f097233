"""Concurrency sweep: N real-time streams at once, through ``StreamDecoder`` and through the websocket server.

Every stream is a clip of random latents that *arrives in real time*: chunk ``k`` (``burst`` frames) is
available at ``start + k * burst / frame_rate``. Stream starts are spread uniformly over ``stagger`` s.

* **TTFA** (``ttfa_ms``): from the arrival of the chunk that completes the stream's first window (found by
  running the planner on the arrival schedule) to the first audio in the listener's hands. The wait for
  those latents (``first_window_wait_ms``) is the policy's, not the decoder's: no decoder can beat it.
  ``ttfa_from_start_ms`` adds it back (from the first chunk's arrival).
* **Underruns**: the listener starts playing ``prebuffer`` after its first audio and then needs frame
  ``f`` at ``play_start + f / frame_rate``; a tile that arrives after its frame's time is an underrun,
  playback stalls until it arrives, and later deadlines move by the stall (``stall_ms``).
* ``ideal``: the same listener fed by a decoder that takes no time (pure planning): underruns there are
  the emission policy's own, whatever the hardware.
* GPU utilisation: NVML's share of time a kernel ran, sampled every 50 ms (``gpu_util_source: nvml``);
  ``busy_fraction`` is always the engine's booked device seconds over wall seconds.

The websocket server runs in this process on its own thread and event loop, sharing the warm engine;
clients connect (one connection and stream each) before the clock starts, on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import settings
from ..codecs import Codec
from ..engine import Engine
from ..engine.base import DeviceCall
from ..planning import StreamPlanner
from ..session import FIRST_CALL_DUE_S, StatefulSession, StepPolicy
from ..streaming import StreamDecoder
from .common import Budget, Latents, Progress
from .meta import UtilSampler
from .stats import summary

__all__ = [
    "ConcurrencySettings", "ServerThread", "listen", "point_seconds", "simulate_policy", "sweep", "underruns_of",
]  # fmt: skip

# Streams start this far after the schedule is fixed, so that the first one is not late from the outset.
_START_LEAD_S = 0.05
# Per concurrency point, on top of its streams' seconds and stagger: connecting and draining.
_POINT_SLACK_S = 2.0


def point_seconds(seconds: float, stagger: float) -> float:
    """The wall time one concurrency point is budgeted: its streams, their stagger and the slack."""
    return seconds + stagger + _POINT_SLACK_S


@dataclass(frozen=True)
class ConcurrencySettings:
    streams: tuple[int, ...]
    seconds: float
    burst: int
    stagger: float
    prebuffer_ms: float
    min_emit: int
    max_emit: int
    ttfa_limit_ms: float
    seed: int = 0
    # how long after it is submitted a stream's first call is due (StreamDecoder(first_call_due=...))
    first_call_ms: float = FIRST_CALL_DUE_S * 1e3
    # each point's device calls (the engine's record) and underruns on one clock, for finding stalls
    timeline: bool = False


@dataclass
class _Record:
    start: float  # arrival of chunk 0
    tiles: list[tuple[float, int, int]] = field(default_factory=list)  # (arrival, start frame, frames)
    error: str | None = None


def listen(tiles: list[tuple[float, int, int]], prebuffer_s: float, frame_s: float) -> tuple[int, float]:
    """``(underruns, stall seconds)`` of a listener fed ``tiles``; see the module docstring."""
    events = underruns_of(tiles, prebuffer_s, frame_s)
    return len(events), sum(stall for _, stall in events)


def underruns_of(
    tiles: list[tuple[float, int, int]], prebuffer_s: float, frame_s: float
) -> list[tuple[float, float]]:
    """Each underrun of a listener fed ``tiles``: ``(arrival of the late tile, seconds it stalled)``."""
    if not tiles:
        return []
    play = tiles[0][0] + prebuffer_s
    stall, events = 0.0, []
    for arrived, start_frame, _frames in tiles:
        deadline = play + start_frame * frame_s + stall
        if arrived > deadline:
            events.append((arrived, arrived - deadline))
            stall += arrived - deadline
    return events


def simulate_policy(
    left: int, right: int, min_emit: int, max_emit: int, frames: int, burst: int, frame_s: float
) -> tuple[int, list[tuple[float, int, int]]]:
    """Plan a real-time halo stream with a zero-time decoder: ``(chunk completing window 1, tiles)``."""
    planner = StreamPlanner(left, right, min_emit=min_emit, max_emit=max_emit)
    chunks = -(-frames // burst)
    first: int | None = None
    tiles = []
    for k in range(chunks):
        received, ended = min(frames, (k + 1) * burst), k == chunks - 1
        while (w := planner.next_window(received, ended)) is not None:
            first = k if first is None else first
            tiles.append((k * burst * frame_s, w.emit_start, w.emit_frames))
    assert first is not None
    return first, tiles


def simulate_stateful(
    policy: StepPolicy, latent_dim: int, frames: int, burst: int, frame_s: float
) -> tuple[int, list[tuple[float, int, int]]]:
    """The same for a stateful stream: ``(chunk completing its prime, tiles)``."""
    session = StatefulSession(policy, latent_dim=latent_dim, hop_size=1, pad_latent=torch.zeros(latent_dim))
    chunks = -(-frames // burst)
    first: int | None = None
    tiles = []
    for k in range(chunks):
        session.feed(torch.zeros(min(burst, frames - k * burst), latent_dim))
        if k == chunks - 1:
            session.end()
        while (job := session.next_job()) is not None:
            first = k if first is None else first
            if job.emit_frames:
                tiles.append((k * burst * frame_s, job.emit_start, job.emit_frames))
    assert first is not None
    return first, tiles


async def _paced(clip: torch.Tensor, start: float, burst: int, frame_s: float) -> Any:
    for k in range(0, int(clip.shape[0]), burst):
        delay = start + (k // burst) * burst * frame_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield clip[k : k + burst]


async def _decoder_stream(
    decoder: StreamDecoder, clip: torch.Tensor, rec: _Record, s: ConcurrencySettings, frame_s: float
) -> None:
    delay = rec.start - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    try:
        async with decoder.decode_tiles(_paced(clip, rec.start, s.burst, frame_s)) as tiles:
            async for tile in tiles:
                rec.tiles.append((time.perf_counter(), tile.start_frame, tile.frames))
    except Exception as exc:  # recorded per stream: one failure must not hide the others' figures
        rec.error = f"{type(exc).__name__}: {exc}"


async def _client_stream(
    url: str,
    clip: torch.Tensor,
    rec: _Record,
    s: ConcurrencySettings,
    frame_s: float,
    hop: int,
    connected: asyncio.Semaphore,
    go: asyncio.Event,
) -> None:
    from streamdec.clients import connect

    try:
        async with connect(url, open_timeout=30) as conn:
            stream = await conn.open_stream(format="pcm_f32le")
            connected.release()
            await go.wait()

            async def send() -> None:
                for k in range(0, int(clip.shape[0]), s.burst):
                    delay = rec.start + (k // s.burst) * s.burst * frame_s - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await stream.send(clip[k : k + s.burst])
                await stream.end()

            sender = asyncio.create_task(send())
            async for frame in stream:
                rec.tiles.append((time.perf_counter(), frame.start_sample // hop, frame.n_samples // hop))
            await sender
    except Exception as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        connected.release()


class ServerThread:
    """A :class:`~streamdec.server.StreamServer` on 127.0.0.1:0 in its own thread and event loop.

    It serves through a fresh ``StreamDecoder`` over the given (already warm) engine and never closes that
    engine: the caller owns it.
    """

    def __init__(
        self, codec: Codec, engine: Engine, min_emit: int, max_emit: int, max_connections: int,
        first_call_due: float = FIRST_CALL_DUE_S,
    ) -> None:  # fmt: skip
        self.codec, self.engine, self.first_call_due = codec, engine, first_call_due
        self.min_emit, self.max_emit, self.max_connections = min_emit, max_emit, max_connections
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="bench-server", daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(120) or self._error is not None:
            raise RuntimeError(f"benchmark server did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from streamdec.server import ServerConfig, StreamServer

        decoder = StreamDecoder(
            self.codec, min_emit=self.min_emit, max_emit=self.max_emit, engine=self.engine,
            first_call_due=self.first_call_due,
        )  # fmt: skip
        config = ServerConfig(  # no capacity probe: this bench measures concurrency itself
            host="127.0.0.1", port=0, max_connections=self.max_connections, send_timeout=60.0,
            probe_capacity=False,
        )  # fmt: skip
        server = StreamServer(decoder, config)
        await server.start()
        await server.warmup()  # the engine is warm already: this only marks the server ready
        self.url = server.url
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await server.shutdown(grace=5.0)


def _point(
    records: list[_Record], s: ConcurrencySettings, first_chunk: int, frame_s: float, frames: int
) -> dict[str, Any]:
    ttfa, from_start, stalls, underruns, broken = [], [], [], 0, 0
    streams_underrun = 0
    late: list[tuple[float, float]] = []
    errors = [r.error for r in records if r.error]
    for r in records:
        got = sum(t[2] for t in r.tiles)
        if r.error or got != frames or not r.tiles:
            broken += 1
            continue
        completing = r.start + first_chunk * s.burst * frame_s
        ttfa.append(r.tiles[0][0] - completing)
        from_start.append(r.tiles[0][0] - r.start)
        events = underruns_of(r.tiles, s.prebuffer_ms / 1e3, frame_s)
        underruns += len(events)
        streams_underrun += bool(events)
        stalls.append(sum(stall for _, stall in events))
        late.extend(events)
    t = summary(ttfa, 1e3)
    ok = broken == 0 and underruns == 0 and t["p99"] is not None and t["p99"] <= s.ttfa_limit_ms
    extra: dict[str, Any] = {}
    if s.timeline and records:
        t0 = min(r.start for r in records)
        # (ms after the first stream's start, ms stalled), in arrival order
        extra["underruns_at"] = sorted([round((at - t0) * 1e3, 1), round(st * 1e3, 1)] for at, st in late)
    return {
        "streams": len(records),
        "ttfa_ms": t,
        "ttfa_from_start_ms": summary(from_start, 1e3),
        "underrun_events": underruns,
        "streams_with_underruns": streams_underrun,
        "stall_ms": summary(stalls, 1e3),
        "broken_streams": broken,
        "errors": errors[:5],
        "ok": ok,
        **extra,
    }


async def _run_point(
    n: int,
    s: ConcurrencySettings,
    engine: Engine,
    frames: int,
    latents: Latents,
    rng: random.Random,
    run: Any,
) -> tuple[list[_Record], dict[str, Any]]:
    clips = [latents(frames) for _ in range(n)]
    before = engine.stats
    sampler = UtilSampler(engine.device)
    t0 = time.perf_counter() + _START_LEAD_S
    records = [_Record(t0 + rng.uniform(0.0, s.stagger)) for _ in range(n)]
    began = time.perf_counter()
    monotonic_at_began = time.monotonic()  # the engine's clock
    with sampler:
        await run(clips, records, t0)
    wall = time.perf_counter() - began
    after = engine.stats
    decodes = after.decodes - before.decodes
    windows = after.windows - before.windows
    usage: dict[str, Any] = {
        "wall_s": wall,
        "windows": windows,
        "device_calls": decodes,
        "mean_batch": windows / decodes if decodes else None,
        "busy_fraction": (after.decode_seconds - before.decode_seconds) / wall if wall > 0 else None,
        "gpu_util_pct": sampler.mean(),
        "gpu_util_source": "nvml" if sampler.available else "engine decode_seconds / wall (busy_fraction)",
        "device_s_by_kind": device_seconds_by_kind(engine.recent_calls(), since=monotonic_at_began),
    }
    if s.timeline:
        first = min(r.start for r in records)  # the streams' clock, after any shift
        shift = monotonic_at_began + (first - began)  # the first stream's start on the engine's clock
        usage["device_calls_at"] = {
            "fields": [
                "decided_ms", "due_ms", "launched_ms", "finished_ms", "device_ms", "estimate_ms", "kind",
                "frames", "batch", "live", "queued", "lane",
            ],
            "calls": [
                [
                    round((c.decided - shift) * 1e3, 2), round((c.due - shift) * 1e3, 2),
                    round((c.launched - shift) * 1e3, 2), round((c.finished - shift) * 1e3, 2),
                    None if c.device_s is None else round(c.device_s * 1e3, 3),
                    None if c.estimate_s is None else round(c.estimate_s * 1e3, 3),
                    c.kind, c.frames, c.batch, c.live, c.queued, c.lane,
                ]
                for c in engine.recent_calls()
                if c.launched >= monotonic_at_began
            ],
        }  # fmt: skip
    return records, usage


def device_seconds_by_kind(calls: Sequence[DeviceCall], since: float) -> dict[str, float] | None:
    """Device seconds of the calls launched at or after ``since``, by kind of call ("prime", "step",
    "flush", "window"): where a stream's device time goes. None where the engine times no call (the CPU)."""
    totals: dict[str, float] = {}
    for call in calls:
        if call.launched >= since and call.device_s is not None:
            totals[call.kind] = totals.get(call.kind, 0.0) + call.device_s
    return {kind: round(seconds, 4) for kind, seconds in sorted(totals.items())} if totals else None


async def sweep(
    codec: Codec,
    engine: Engine,
    s: ConcurrencySettings,
    *,
    websocket: bool,
    latents: Latents,
    budget: Budget,
    progress: Progress,
    mode: str | None = None,
) -> dict[str, Any]:
    """Both paths over ``s.streams``; each path stops once a point is far past the limits (``_hopeless``).

    ``mode`` is the decoder's (``StreamDecoder(mode=...)``; None: its default for the codec). The engine
    is warm: the heap is frozen first, as ``streamdec serve`` does after warm-up."""
    settings.freeze_heap()
    left, right = codec.context_frames()
    frame_s = codec.hop_size / codec.sample_rate
    frames = round(s.seconds / frame_s)
    decoder = StreamDecoder(
        codec, mode=mode, min_emit=s.min_emit, max_emit=s.max_emit, engine=engine,  # type: ignore[arg-type]
        first_call_due=s.first_call_ms / 1e3,
    )  # fmt: skip
    if decoder.policy is not None:
        first_chunk, ideal_tiles = simulate_stateful(
            decoder.policy, codec.latent_dim, frames, s.burst, frame_s
        )
    else:
        first_chunk, ideal_tiles = simulate_policy(
            left, right, s.min_emit, s.max_emit, frames, s.burst, frame_s
        )
    ideal_underruns, ideal_stall = listen(ideal_tiles, s.prebuffer_ms / 1e3, frame_s)
    out: dict[str, Any] = {
        "mode": decoder.mode,
        "frames_per_stream": frames,
        "first_window_chunk": first_chunk,
        "first_window_wait_ms": first_chunk * s.burst * frame_s * 1e3,
        "ideal": {"underruns": ideal_underruns, "stall_ms": ideal_stall * 1e3, "tiles": len(ideal_tiles)},
        "decoder": [],
        "websocket": [],
    }
    rng = random.Random(s.seed)

    async def via_decoder(clips: list[torch.Tensor], records: list[_Record], t0: float) -> None:
        await asyncio.gather(
            *(_decoder_stream(decoder, c, r, s, frame_s) for c, r in zip(clips, records, strict=True))
        )

    paths: list[tuple[str, Any]] = [("decoder", via_decoder)]
    server: ServerThread | None = None
    if websocket:
        server = ServerThread(
            codec, engine, s.min_emit, s.max_emit, max(s.streams) + 8, first_call_due=s.first_call_ms / 1e3
        )

        async def via_websocket(clips: list[torch.Tensor], records: list[_Record], t0: float) -> None:
            assert server is not None
            connected, go = asyncio.Semaphore(0), asyncio.Event()
            tasks = [
                asyncio.create_task(
                    _client_stream(server.url, c, r, s, frame_s, codec.hop_size, connected, go)
                )
                for c, r in zip(clips, records, strict=True)
            ]
            for _ in tasks:
                await connected.acquire()
            # The clock starts once every client is connected: shift the schedule to now.
            shift = time.perf_counter() + _START_LEAD_S - t0
            for r in records:
                r.start += shift
            go.set()
            await asyncio.gather(*tasks)

        paths.append(("websocket", via_websocket))

    per_point = point_seconds(s.seconds, s.stagger)
    with server if server is not None else contextlib.nullcontext():
        for name, run in paths:
            for n in s.streams:
                progress.step(f"concurrency {name}: {n} streams")
                if not budget.allows(per_point, f"concurrency {name} N={n}"):
                    break
                records, usage = await _run_point(n, s, engine, frames, latents, rng, run)
                point = _point(records, s, first_chunk, frame_s, frames)
                point.update(usage)
                out[name].append(point)
                if _hopeless(point, s):
                    out.setdefault("stopped", {})[name] = f"after N={n}: far past the limits"
                    break
    for name, _ in paths:
        passing = [p["streams"] for p in out[name] if p["ok"]]
        out.setdefault("max_streams", {})[name] = _largest_prefix(out[name])
        out.setdefault("passing", {})[name] = passing
    return out


def _largest_prefix(points: list[dict[str, Any]]) -> int:
    """The largest N such that it and every smaller N measured met the limits (0 if N=1 failed)."""
    best = 0
    for p in points:
        if not p["ok"]:
            break
        best = p["streams"]
    return best


def _hopeless(point: dict[str, Any], s: ConcurrencySettings) -> bool:
    """Far past the limits: more streams can only be worse, so the sweep stops (from N = 4 on, so that
    one unlucky stall at small N does not end it)."""
    p99 = point["ttfa_ms"]["p99"]
    if point["broken_streams"] == point["streams"] or (p99 is not None and p99 > 20 * s.ttfa_limit_ms):
        return True
    return bool(
        point["streams"] >= 4
        and (
            (p99 is not None and p99 > 10 * s.ttfa_limit_ms)
            or point["streams_with_underruns"] * 2 > point["streams"]
        )
    )
