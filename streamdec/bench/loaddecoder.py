"""The load test's in-process target: the same paced streams straight into one ``StreamDecoder``.

``streamdec loadtest --target decoder`` measures what the decoder holds without the websocket path, in a
process of its own (:func:`decoder_main`) that loads the codec and engine as ``streamdec serve`` does,
warms up once, and then runs each point's streams as async generators feeding ``decode_tiles``. It
records the same :class:`~streamdec.bench.loadstats.StreamRecord` fields as the websocket clients, so
both targets go through one analysis and one sweep, and "the websocket path holds X % of what
StreamDecoder holds" compares like with like.

The streams' generators share this process's event loop, as an in-process caller's would, so they are
a schedule, not a load generator that can fall behind: a chunk counts as sent at its scheduled time (a
TTS model producing latents in real time elsewhere does not wait for this loop). When the loop takes a
chunk late, that lateness is the decoder's own, as a websocket server's late read of a socket is the
server's: it counts against the stream's first audio and its listener, and is reported apart
(``pull_late_ms``), never as a late load generator (which would void the run).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .. import settings
from .loadclient import ClientReport, StreamPlan, stream_latents
from .loadstats import StreamRecord

__all__ = ["DecoderOptions", "decoder_main"]


@dataclass(frozen=True)
class DecoderOptions:
    """What ``streamdec serve`` would be started with."""

    codec: str
    device: str
    engine: str  # "auto" or "simulated"
    simulated_cost_ms: str
    precision: str
    min_emit: int
    max_emit: int | None  # None: StreamDecoder's default for its mode
    inductor_cache: str | None = None
    #: stateful slots, as ``serve --max-streams-total N`` allocates N (None: the decoder's default)
    slots: int | None = None
    #: the CPUs the process runs on once warm, as ``serve --cpus`` (None: wherever the scheduler puts it)
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class DecoderRun:
    streams: tuple[StreamPlan, ...]
    chunk_frames: int
    period_s: float
    latent_dim: int
    sampled: int


async def _build(options: DecoderOptions) -> Any:
    from streamdec import StreamDecoder, load_codec, supports_stateful
    from streamdec.codecs.precision import check_precision

    codec = load_codec(options.codec, device=options.device)
    if options.precision == "auto":
        codec.use_auto_precision()
    else:
        codec.precision = check_precision(options.precision)
    stateful = supports_stateful(codec)
    extra: dict[str, Any] = {}
    if options.engine == "simulated":
        from streamdec.engine.simulated import DEFAULT_SIMULATED_SLOTS, SimulatedCost, simulated_engine

        slots = (options.slots or DEFAULT_SIMULATED_SLOTS) if stateful else 0
        cost = SimulatedCost.parse(options.simulated_cost_ms)
        extra["engine"] = simulated_engine(codec, cost=cost, max_streams=slots)
    else:
        if options.slots is not None and stateful:
            extra.update(max_streams=options.slots)
        if codec.pad_latent.device.type == "cuda":  # as serve: warm every bucket, then never capture again
            extra.update(on_frozen_miss="eager")
            if options.inductor_cache:
                extra.update(inductor_cache_dir=options.inductor_cache)
    decoder = StreamDecoder(codec, min_emit=options.min_emit, max_emit=options.max_emit, **extra)
    await decoder.start()
    await decoder.warmup()
    decoder.freeze()
    settings.freeze_heap()  # as serve does after warm-up
    if options.cpus is not None:
        from streamdec.affinity import pin

        pin(frozenset(options.cpus))
    return decoder


async def _one(
    decoder: Any,
    plan: StreamPlan,
    latents: Any,
    run: DecoderRun,
    t0: float,
    record: StreamRecord,
    report: ClientReport,
) -> None:
    import torch

    from streamdec.io import pcm16

    hop = decoder.codec.hop_size
    pcm: list[bytes] = []

    async def chunks() -> AsyncIterator[torch.Tensor]:
        begin = due = t0 + plan.offset_s
        for k, start in enumerate(range(0, plan.frames, run.chunk_frames)):
            due = begin + k * run.period_s
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            report.pull_late_ms.append(max(0.0, time.monotonic() - due) * 1000.0)
            report.latent_messages += 1
            record.first_sent = due if k == 0 else record.first_sent
            record.decodable_sent = due if k == plan.decodable_chunk else record.decodable_sent
            yield latents[start : start + run.chunk_frames]
        if record.decodable_sent is None:  # the end makes it decodable: sent with the last chunk
            record.decodable_sent = due

    try:
        async with decoder.decode_tiles(chunks()) as tiles:
            async for tile in tiles:
                record.arrivals.append((time.monotonic(), tile.start_frame * hop, tile.frames * hop))
                if plan.index == run.sampled:
                    pcm.append(pcm16(tile.samples))
        record.status, record.done_samples = "completed", sum(n for _t, _s, n in record.arrivals)
    except Exception as exc:  # one stream's failure is its record's, not the run's
        record.errors.append(f"{type(exc).__name__}: {exc}")
    if plan.index == run.sampled:
        record.pcm = b"".join(pcm)


async def _serve_runs(options: DecoderOptions, pipe: Connection) -> None:
    import torch

    from streamdec.server.gcpause import GcPauseMonitor
    from streamdec.server.looplag import LoopLagMonitor
    from streamdec.server.metrics import render_engine

    decoder = await _build(options)
    lag = LoopLagMonitor.start()
    gc_pauses = GcPauseMonitor.start()  # as serve's /metrics: whether a stall was the collector's
    codec = decoder.codec
    left, right = decoder.left, decoder.right
    geometry = {
        "name": codec.name,
        "latent_dim": codec.latent_dim,
        "hop_size": codec.hop_size,
        "sample_rate": codec.sample_rate,
        "channels": codec.channels,
        "context": [left, right],
    }
    loop = asyncio.get_running_loop()

    def _metrics() -> str:  # what serve's /metrics gives: the loop's lag, the collector, the engine
        text: str = lag.render() + gc_pauses.render() + render_engine(decoder.stats.engine)
        return text

    pipe.send(("ready", geometry))
    while True:
        message = await loop.run_in_executor(None, pipe.recv)
        if message[0] == "metrics":
            pipe.send(("metrics", _metrics()))
            continue
        if message[0] != "run":
            break
        run: DecoderRun = message[1]
        # Every stream's latents are made before the run starts, as a client process makes its messages
        # before its clock starts: at 512 streams that is 100-250 ms of the loop, which the run's
        # figures (loop lag, CPU) must not count. They start from the metrics sent with t0.
        latents = [torch.from_numpy(stream_latents(p.seed, p.frames, run.latent_dim)) for p in run.streams]
        await asyncio.sleep(2 * lag.interval)  # the lag monitor wakes late once, for that: before the run
        t0 = time.monotonic() + 0.3
        pipe.send(("started", (t0, _metrics())))
        report = ClientReport(records=[StreamRecord(p.index, p.frames) for p in run.streams])
        cpu0 = time.process_time()
        await asyncio.gather(
            *(
                _one(decoder, p, z, run, t0, r, report)
                for p, z, r in zip(run.streams, latents, report.records, strict=True)
            )
        )
        report.cpu_s = time.process_time() - cpu0
        pipe.send(("report", report))
    lag.stop()
    gc_pauses.stop()
    await decoder.aclose()


def decoder_main(options: DecoderOptions, pipe: Connection) -> None:
    """Entry point of the decoder process: build and warm the decoder, then serve runs sent on ``pipe``."""
    try:
        asyncio.run(_serve_runs(options, pipe))
    except Exception as exc:  # the parent reports it and stops
        pipe.send(("failed", f"{type(exc).__name__}: {exc}"))
    pipe.close()
