"""Stateful streaming on a real GPU: accuracy on auk-24k in fp16x3, graphs against eager, every family."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

import streamdec
from streamdec.codecs import Codec, load_codec
from streamdec.engine import DecodeEngine
from streamdec.engine.base import StepRequest
from streamdec.engine.lanes import DeviceClock
from support.cuda_checks import float64_twin, snr_db

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


async def _stream(dec: streamdec.StreamDecoder, clip: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    chunks, at, i = [], 0, 0
    while at < clip.shape[0]:
        chunks.append(clip[at : at + sizes[i % len(sizes)]])
        at += sizes[i % len(sizes)]
        i += 1
    return torch.cat([t.samples async for t in dec.decode_tiles(chunks)], dim=-1)


def test_stateful_fp16x3_matches_whole_clip_and_float64(auk: Codec) -> None:
    """Stateful fp16x3 through captured graphs: >= 110 dB against the whole-clip fp16x3 decode and
    >= 115 dB against a float64 decode of the same weights (auk-24k, 3 streams of 200 frames)."""
    gen = torch.Generator().manual_seed(3)
    clips = [torch.randn(200, 64, generator=gen) for _ in range(3)]
    exact = float64_twin(auk)
    truth = [exact.decode(c[None].double())[0].cpu() for c in clips]
    del exact
    torch.cuda.empty_cache()
    assert auk.use_auto_precision() == "fp16x3"

    async def run() -> list[torch.Tensor]:
        engine = DecodeEngine(auk, compile=False, max_streams=8, batch_buckets=(1, 2, 4))
        async with streamdec.StreamDecoder(auk, engine=engine) as dec:
            await dec.warmup()
            outs = await asyncio.gather(*(_stream(dec, c, [4, 3, 5]) for c in clips))
            assert engine.stats.by_tier.get("graph", 0) > 0, engine.stats.by_tier
        return list(outs)

    outs = asyncio.run(run())
    for clip, out, exact_out in zip(clips, outs, truth, strict=True):
        whole = auk.decode(clip[None])[0].cpu()
        vs_whole, vs_f64 = snr_db(whole, out), snr_db(exact_out, out)
        print(
            f"stateful fp16x3 auk-24k 200 frames: {vs_whole:.1f} dB vs whole fp16x3, {vs_f64:.1f} dB vs float64"
        )
        assert vs_whole >= 110.0
        assert vs_f64 >= 115.0
    auk.precision = "fp32"


async def _calls(engine: DecodeEngine, clip: torch.Tensor, slot: int) -> list[torch.Tensor]:
    assert engine.net is not None
    n0 = engine.net.min_prime_frames + 3
    outs = [await engine.decode_step(StepRequest(0, slot, "prime", clip[:n0]))]
    at = n0
    while at + 4 <= clip.shape[0] - 4:
        outs.append(await engine.decode_step(StepRequest(0, slot, "step", clip[at : at + 4])))
        at += 4
    outs.append(await engine.decode_step(StepRequest(0, slot, "flush", clip[at:])))
    return outs


def test_plain_step_graph_is_bit_identical_to_eager(auk: Codec) -> None:
    """A captured stateful call replays exactly the eager arithmetic at the same batch bucket."""
    clip = torch.randn(60, 64, generator=torch.Generator().manual_seed(5))

    async def run(graphs: bool) -> list[torch.Tensor]:
        engine = DecodeEngine(auk, compile=False, graphs=graphs, max_streams=4, batch_buckets=(4,))
        try:
            assert engine.net is not None
            n0 = engine.net.min_prime_frames + 3
            await engine.warmup_steps(
                (("prime", n0), ("step", 4), ("flush", 60 - n0 - 4 * ((60 - n0 - 4) // 4)))
            )
            return await _calls(engine, clip, engine.open_slot())
        finally:
            await engine.aclose()

    assert auk.use_auto_precision() == "fp16x3"
    graphed, eager = asyncio.run(run(True)), asyncio.run(run(False))
    auk.precision = "fp32"
    for g, e in zip(graphed, eager, strict=True):
        assert torch.equal(g, e)


def test_graphs_recorded_without_a_run_first_replay_the_eager_bits(auk: Codec) -> None:
    """Warm-up captures a bucket without running its call first where a call of its kind and length
    already ran here (the 4-row bucket's run loaded what the 2-row one needs): those graphs too replay
    the eager arithmetic."""
    clip = torch.randn(60, 64, generator=torch.Generator().manual_seed(6))

    async def run(graphs: bool) -> tuple[list[torch.Tensor], int]:
        engine = DecodeEngine(auk, compile=False, graphs=graphs, max_streams=4, batch_buckets=(2, 4))
        try:
            assert engine.net is not None
            n0 = engine.net.min_prime_frames + 3
            await engine.warmup_steps(
                (("prime", n0), ("step", 4), ("flush", 60 - n0 - 4 * ((60 - n0 - 4) // 4)))
            )
            straight = engine.tiers.recorded_straight if graphs else 0
            return await _calls(engine, clip, engine.open_slot()), straight  # one stream: the 2-row buckets
        finally:
            await engine.aclose()

    assert auk.use_auto_precision() == "fp16x3"
    (graphed, straight), (eager, _) = asyncio.run(run(True)), asyncio.run(run(False))
    auk.precision = "fp32"
    print(f"captures without a run first: {straight} of 6")
    assert straight > 0
    for g, e in zip(graphed, eager, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("name", ["tiny", "dac-tiny", "oobleck-tiny", "bigvgan-tiny"])
def test_each_family_streams_statefully_on_cuda(name: str) -> None:
    """Every family's stateful stream through graphs equals its whole-clip decode within 1e-5 (fp32)."""
    codec = load_codec(name, device="cuda", dtype=torch.float32)
    clip = torch.randn(150, codec.latent_dim, generator=torch.Generator().manual_seed(1))

    async def run() -> torch.Tensor:
        engine = DecodeEngine(codec, compile=False, max_streams=2, batch_buckets=(1, 2))
        async with streamdec.StreamDecoder(codec, engine=engine) as dec:
            await dec.warmup()
            return await _stream(dec, clip, [4, 1, 7])

    out = asyncio.run(run())
    torch.testing.assert_close(out, codec.decode(clip[None])[0].cpu(), atol=1e-5, rtol=0)


def test_edge_lane_streams_beside_steps_and_reused_slots(auk: Codec) -> None:
    """fp16x3 auk-24k with primes and flushes on a CUDA stream of their own beside the steps: 36 streams
    starting 3 ms apart through 10 slots, every fourth dropped after its first tile (its slot freed at
    once, a later stream's prime on it waiting for the dropped stream's call still on the device). Each
    kept stream is >= 110 dB against its whole-clip decode, the edge calls ran on the edge lane, and the
    device's busy time is at most the sum of its calls' times."""
    assert auk.use_auto_precision() == "fp16x3"
    gen = torch.Generator().manual_seed(5)
    clips = [torch.randn(40 + 7 * (i % 9), 64, generator=gen) for i in range(36)]

    async def run() -> tuple[dict[int, torch.Tensor], DecodeEngine]:
        engine = DecodeEngine(auk, compile=False, max_streams=10, batch_buckets=(1, 2, 4, 8, 16))
        assert engine.lanes == 2
        gate = asyncio.Semaphore(10)
        outs: dict[int, torch.Tensor] = {}
        async with streamdec.StreamDecoder(auk, engine=engine) as dec:
            await dec.warmup()

            async def one(i: int) -> None:
                await asyncio.sleep(0.003 * i)
                async with gate:
                    chunks = [clips[i][at : at + 4] for at in range(0, clips[i].shape[0], 4)]
                    if i % 4 == 3:
                        async with dec.decode_tiles(chunks) as tiles:
                            async for _ in tiles:
                                break  # dropped: its slot goes back with its call maybe in flight
                        return
                    outs[i] = torch.cat([t.samples async for t in dec.decode_tiles(chunks)], dim=-1)

            await asyncio.gather(*(one(i) for i in range(len(clips))))
            calls = engine.recent_calls()
            assert {c.lane for c in calls if c.kind in ("prime", "flush")} == {1}
            assert {c.lane for c in calls if c.kind == "step"} == {0}
            own = sum(c.device_s or 0.0 for c in calls)
            assert 0 < engine.stats.decode_seconds <= own + 1e-6
        return outs, engine

    outs, _ = asyncio.run(run())
    assert len(outs) == 27
    for i, out in outs.items():
        whole = auk.decode(clips[i][None])[0].cpu()
        assert snr_db(whole, out) >= 110.0, i
    auk.precision = "fp32"


def test_device_clock_reads_real_events_on_two_streams() -> None:
    """The edge lane's clock over real CUDA events: calls on two streams of different priority, read as
    they finish with anchors adopted every 5 ms, land where the first event puts them (to a microsecond,
    a second of uptime being too short for float32 to round), and no read goes backwards."""
    main, edge = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
    x = torch.randn(1024, 1024, device="cuda")
    origin = torch.cuda.Event(enable_timing=True)
    origin.record(main)
    clock: DeviceClock[torch.cuda.Event] = DeviceClock(origin, every=0.005)
    pending: list[tuple[torch.cuda.Event, torch.cuda.Event, float]] = []
    spans: list[tuple[float, float, torch.cuda.Event, torch.cuda.Event]] = []

    def finish(every: bool) -> None:
        for call in [c for c in pending if every or c[1].query()]:
            pending.remove(call)
            began, done, launched = call
            spans.append((*clock.span(began, done, launched, time.monotonic()), began, done))

    for i in range(120):
        stream = edge if i % 3 == 0 else main
        launched = time.monotonic()
        began, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            began.record(stream)
            y = x
            for _ in range(1 + i % 4):
                y = y @ x
            done.record(stream)
        pending.append((began, done, launched))
        if i % 5 == 0:
            time.sleep(0.002)
        finish(every=False)
    torch.cuda.synchronize()
    finish(every=True)
    assert len(spans) == 120 and len(clock._anchors) > 2
    for start, end, began, done in spans:
        assert start == pytest.approx(origin.elapsed_time(began) / 1e3, abs=1e-6)
        assert end == pytest.approx(origin.elapsed_time(done) / 1e3, abs=1e-6)
