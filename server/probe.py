"""The warm-up capacity probe: how many real-time streams this engine serves without a listener running dry.

Throughput with every chunk at hand overstates what can be admitted: such streams batch into large calls,
while real-time streams arrive at different phases and make small calls of their own; and a stream
admitted in real time must get every tile to its listener before the listener's buffer runs out, which
fails first at start-up, when the first tile went out quickly from an idle engine and the next ones wait
behind other streams' calls. So the probe has two steps::

    1. throughput    streams with every chunk at hand, decoded in the calls a real-time stream makes;
                     bound = audio seconds per wall second x SAFETY_FACTOR (may be 0); on a device
                     with captured step graphs, at least what the measured replays allow
                     (:func:`replay_bound`)
    2. paced         n = max(bound, 1) streams paced at real time (one min_emit-frame chunk per chunk
                     period; starts spread evenly over min(n + 1, START_PERIODS) chunk periods
                     (:func:`start_offsets`), so each stream's first call lands while earlier ones step,
                     and their chunks arrive at n different phases, as independent clients' do, while
                     all n overlap however large n is), each tile checked against a listener that starts
                     playing ``prebuffer`` after its first tile. n passes when every tile arrived at least
                     ``margin`` before it was needed and the engine was busy at most SAFETY_FACTOR of the
                     run (what these streams really cost, start-up included). Else n drops: to what the
                     measured busy share allows at SAFETY_FACTOR when the engine was too busy, else by
                     half; down to 0.

The margin is half of what the stream's session aims to keep in hand (:func:`probe_margin`): on the quiet
server at warm-up an admitted stream keeps at least that, and the other half is left for what warm-up
cannot see (other processes on the host, the clients, handshakes of refused clients). A stateful stream
sends each ``min_emit`` frames as soon as they arrive, so while the engine keeps up its tiles arrive a
whole prebuffer early: the margin is half the prebuffer. A halo stream holds ready frames back to decode
larger windows until ``decode time + FlushPolicy.margin_s`` before its listener runs dry, so it aims for
``margin_s`` (40 ms): the margin is half that. On a GPU the engine itself holds queued calls of a busy
device until ``hold_lead`` (50 ms) before their deadlines, to batch them (``DecodeEngine``): its replays
take a fraction of a chunk period, so under load every tile arrives about ``hold_lead`` early by design,
and a stream's aim is at most that (:func:`engine_hold_lead`). On the CPU the probe keeps the margin of the
prebuffer: admission there was verified under load with it (``docs/serving-capacity.md``), and the rest of
the prebuffer covers a shared host's scheduling delay.

A few streams say little about a GPU: they decode in small batches whose cost is mostly fixed (a step of
16 streams costs two thirds of one of 64), and the engine holds their calls until shortly before their
deadlines once the device is busy, so their wall time measures the pacing, not the device. The replay
times the engine measured at warm-up do: ``B`` streams stepping ``f`` frames at a time need
``frame_rate / f`` replays of the ``B x f`` graph a second, so the device is busy ``replay x frame_rate /
f`` of the time for them; the largest batch bucket gives the most streams at SAFETY_FACTOR. The paced run
then checks that figure, start-up and the engine's real batching included, and steps down from it.

Capacity 0 means this engine cannot keep one real-time stream ahead of its listener here: the server then
refuses every ``start`` (see :mod:`.admission`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import torch

from .admission import SAFETY_FACTOR, realtime_streams

__all__ = [
    "PROBE_MARGIN_SHARE",
    "CapacityReport",
    "ListenerClock",
    "PacedChunks",
    "PacedRun",
    "engine_hold_lead",
    "measure_capacity",
    "probe_margin",
    "replay_bound",
    "start_offsets",
]

#: Audio seconds per probe stream: the start-up and a second and more of steady state.
PROBE_SECONDS = 2.0
#: Streams of the throughput step: enough windows that the engine batches as under load.
THROUGHPUT_STREAMS = 4
#: Share of the listener's prebuffer a paced probe stream must keep in hand at every tile.
PROBE_MARGIN_SHARE = 0.5
#: The paced streams' starts spread over at most this many chunk periods (about 0.5-1 s): every stream
#: still overlaps the others for most of its PROBE_SECONDS.
START_PERIODS = 12


def start_offsets(streams: int, period: float) -> list[float]:
    """When each paced stream starts, in seconds from the first: evenly over ``min(streams + 1,
    START_PERIODS)`` chunk periods. Below START_PERIODS streams, ``1 + 1/streams`` periods apart: one
    stream's first call per period, each at its own phase (``i / streams`` of a period)."""
    spread = min(streams + 1, START_PERIODS) * period
    return [i * spread / streams for i in range(streams)]


def probe_margin(mode: str, prebuffer: float, flush_margin: float, hold_lead: float | None = None) -> float:
    """Seconds a paced probe stream must keep in hand at every tile: half its session's aim (above), at
    most the engine's ``hold_lead`` where it holds work to that lead."""
    aim = prebuffer if mode == "stateful" else min(prebuffer, flush_margin)
    if hold_lead is not None:
        aim = min(aim, hold_lead)
    return PROBE_MARGIN_SHARE * aim


def _members(decoder: object) -> list[Any]:
    """The decoders of a DecoderGroup (one per device), or the decoder itself."""
    return list(getattr(decoder, "decoders", None) or [decoder])


def _gpu_engine(member: object) -> Any | None:
    """The member's engine where it runs on a CUDA device, else None."""
    engine = getattr(member, "engine", None)
    return engine if getattr(getattr(engine, "device", None), "type", None) == "cuda" else None


def cuda_engines(decoder: object) -> list[Any] | None:
    """The engine of each of the decoder's members, where every one runs on a CUDA device; else None."""
    engines = [_gpu_engine(member) for member in _members(decoder)]
    return None if any(engine is None for engine in engines) else engines


def engine_hold_lead(decoder: object) -> float | None:
    """The ``hold_lead`` of the decoder's engines where they hold work on a GPU (module docstring), else
    None."""
    leads = []
    for member in _members(decoder):
        lead = getattr(_gpu_engine(member), "hold_lead", None)
        if lead is None:  # a CPU engine, or one that does not hold work
            return None
        leads.append(float(lead))
    return min(leads)


class _Decoder(Protocol):
    """What the probe uses of a StreamDecoder (or a DecoderGroup)."""

    min_emit: int

    def decode_tiles(self, chunks: Any) -> Any: ...

    @property
    def stats(self) -> Any: ...


def _busy_seconds(decoder: _Decoder) -> float:
    """Seconds the decoder's engines have spent in device calls so far, per engine."""
    engines = len(_members(decoder))
    return float(decoder.stats.engine.decode_seconds) / engines


def replay_bound(decoder: _Decoder, frame_rate: float, safety: float = SAFETY_FACTOR) -> int | None:
    """Real-time streams the measured step replays allow at ``safety`` busy, over all of the decoder's
    engines (module docstring); None where there are none: halo mode, an eager engine, no graphs."""
    total = 0.0
    for member in _members(decoder):
        engine = _gpu_engine(member)
        if getattr(member, "mode", None) != "stateful" or engine is None:
            return None
        best = 0.0
        for key, replay_ms in engine.measured_replay_ms().items():
            if key.kind == "step" and key.frames == member.min_emit and replay_ms:
                best = max(best, key.batch * safety / (replay_ms / 1e3 * frame_rate / key.frames))
        if best == 0.0:
            return None
        total += best
    return math.floor(total)


class ListenerClock:
    """A listener as a browser player is: it starts playing ``prebuffer`` seconds after the first audio,
    then plays at the sample rate; audio that arrives after its play time stalls playback that long.
    Pure: the caller passes its clock. ``min_slack`` is the least time any audio arrived before it was
    needed (negative: the largest stall)."""

    def __init__(self, sample_rate: int, prebuffer: float) -> None:
        self.rate, self.prebuffer = sample_rate, prebuffer
        self.clock: float | None = None  # when sample 0 plays (moves on with each stall)
        self.min_slack = math.inf
        self.underruns = 0

    def arrive(self, now: float, start_sample: int) -> float:
        """Audio starting at ``start_sample`` arrived at ``now``; returns its slack (seconds)."""
        if self.clock is None:
            self.clock = now + self.prebuffer
        slack = self.clock + start_sample / self.rate - now
        self.min_slack = min(self.min_slack, slack)
        if slack < 0:
            self.underruns += 1
            self.clock -= slack  # playback waited for it
        return slack


class PacedChunks:
    """A producer in real time: chunk ``k`` of ``clip`` (``chunk`` frames each) is at hand from
    ``start + (k + 1) * chunk / frame_rate``. Offers ``take_ready()`` as the server's intake does, so a
    stream that fell behind takes its backlog in one call."""

    def __init__(self, clip: torch.Tensor, chunk: int, frame_rate: float, start: float) -> None:
        self.chunks = list(torch.split(clip, chunk))
        self.period, self.start = chunk / frame_rate, start
        self.next = 0

    def _due(self, k: int) -> float:
        return self.start + (k + 1) * self.period

    def take_ready(self) -> torch.Tensor | None:
        if self.next >= len(self.chunks) or time.monotonic() < self._due(self.next):
            return None
        return self._take()

    def _take(self) -> torch.Tensor:
        chunk = self.chunks[self.next]
        self.next += 1
        return chunk

    def __aiter__(self) -> PacedChunks:
        return self

    async def __anext__(self) -> torch.Tensor:
        if self.next >= len(self.chunks):
            raise StopAsyncIteration
        await anyio.sleep(max(self._due(self.next) - time.monotonic(), 0.0))
        return self._take()


@dataclass(frozen=True)
class PacedRun:
    """One paced run: ``streams`` started, the least slack any of their tiles had, underruns, and the
    share of the run's wall time the engine spent decoding."""

    streams: int
    min_slack_s: float
    underruns: int
    busy: float = 0.0

    def kept_margin(self, margin: float) -> bool:
        return self.underruns == 0 and self.min_slack_s >= margin

    def passed(self, margin: float, safety: float = SAFETY_FACTOR) -> bool:
        return self.kept_margin(margin) and self.busy <= safety

    def next_streams(self, margin: float, safety: float = SAFETY_FACTOR) -> int:
        """Streams to try after this run failed, always fewer than this run's: what its busy share allows
        at ``safety`` when the engine was too busy (a lost margin then follows from that), else half."""
        fewer = self.streams - 1
        if self.busy > safety:
            fewer = min(fewer, math.floor(self.streams * safety / self.busy))
        elif not self.kept_margin(margin):
            fewer = min(fewer, self.streams // 2)
        return max(fewer, 0)


@dataclass(frozen=True)
class CapacityReport:
    """What the probe measured: the throughput bound, each paced run, and the capacity it settled on."""

    realtime_factor: float  # audio seconds decoded per wall second in the throughput step
    bound: int  # realtime_factor x SAFETY_FACTOR, floored, or the replay bound where larger
    runs: tuple[PacedRun, ...]
    margin_s: float
    capacity: int

    def summary(self) -> str:
        paced = ", ".join(
            f"{r.streams} paced: least slack {r.min_slack_s * 1e3:.0f} ms, engine busy {r.busy:.0%}"
            + (f", {r.underruns} underruns" if r.underruns else "")
            for r in self.runs
        )
        return (
            f"throughput {self.realtime_factor:.2f}x real time (bound {self.bound}); {paced}; "
            f"margin {self.margin_s * 1e3:.0f} ms, busy at most {SAFETY_FACTOR:.0%} -> {self.capacity} "
            "real-time streams"
        )


def probe_clips(streams: int, frames: int, latent_dim: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(streams, frames, latent_dim, generator=gen) * 0.5


async def throughput(decoder: _Decoder, frames: int, latent_dim: int, streams: int) -> float:
    """Wall seconds to decode ``streams`` clips with every chunk at hand, in min_emit-frame calls."""
    clips = probe_clips(streams, frames, latent_dim)

    async def one(clip: torch.Tensor) -> None:
        # One call per min_emit chunk, the calls a real-time stream makes: with the whole clip at hand the
        # calls would be max_emit frames, several times cheaper per frame.
        async with decoder.decode_tiles(list(torch.split(clip, decoder.min_emit))) as tiles:
            async for _ in tiles:
                pass

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for clip in clips:
            tg.start_soon(one, clip)
    return time.perf_counter() - began


async def paced_run(
    decoder: _Decoder, streams: int, frames: int, *, latent_dim: int, frame_rate: float,
    sample_rate: int, prebuffer: float, margin: float,
) -> PacedRun:  # fmt: skip
    """``streams`` real-time streams started at :func:`start_offsets`; stops early once a tile arrives
    with less than ``margin`` in hand (the run has failed then; the rest would only cost warm-up time)."""
    clips = probe_clips(streams, frames, latent_dim)
    chunk = decoder.min_emit
    offsets = start_offsets(streams, chunk / frame_rate)
    listeners = [ListenerClock(sample_rate, prebuffer) for _ in range(streams)]
    busy_before = _busy_seconds(decoder)
    began = time.monotonic()

    async with anyio.create_task_group() as tg:

        async def one(i: int) -> None:
            source = PacedChunks(clips[i], chunk, frame_rate, began + offsets[i])
            await anyio.sleep(max(source.start - time.monotonic(), 0.0))
            async with decoder.decode_tiles(source) as tiles:
                async for tile in tiles:
                    if listeners[i].arrive(time.monotonic(), tile.start_sample) < margin:
                        tg.cancel_scope.cancel()

        for i in range(streams):
            tg.start_soon(one, i)
    wall = time.monotonic() - began
    return PacedRun(
        streams,
        min(listener.min_slack for listener in listeners),
        sum(listener.underruns for listener in listeners),
        (_busy_seconds(decoder) - busy_before) / wall if wall > 0 else 0.0,
    )


async def measure_capacity(
    decoder: _Decoder, *, latent_dim: int, frame_rate: float, sample_rate: int, prebuffer: float,
    margin: float, hard_limit: int | None = None,
) -> CapacityReport:  # fmt: skip
    """Real-time streams ``decoder`` serves with every tile arriving at least ``margin`` seconds before
    its listener needs it (see the module docstring); ``hard_limit`` (the decoder's slots) bounds every
    run."""
    frames = max(round(PROBE_SECONDS * frame_rate), 1)
    limit = hard_limit if hard_limit is not None else math.inf
    n = int(min(THROUGHPUT_STREAMS, limit))
    wall = await throughput(decoder, frames, latent_dim, n)
    audio = n * frames / frame_rate
    bound = max(realtime_streams(audio, wall, SAFETY_FACTOR), replay_bound(decoder, frame_rate) or 0)
    runs: list[PacedRun] = []
    streams = int(min(max(bound, 1), limit))
    while streams >= 1:
        run = await paced_run(
            decoder, streams, frames, latent_dim=latent_dim, frame_rate=frame_rate,
            sample_rate=sample_rate, prebuffer=prebuffer, margin=margin,
        )  # fmt: skip
        runs.append(run)
        if run.passed(margin):
            break
        streams = run.next_streams(margin)
    return CapacityReport(audio / wall, bound, tuple(runs), margin, streams)
