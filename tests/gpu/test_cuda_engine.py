"""The GPU engine on a real GPU: graph tiers vs eager, cross-stream batching, retirement, memory.

Runs only where CUDA is available (the ``cuda`` marker; CPU CI skips it). Every test runs at three codec
precisions: ``fp32`` (CUDA cores), ``tf32x3`` (split operands on TF32 tensor cores) and ``fp16x3`` (split
float16 operands, where the GPU has TMA; elsewhere the codec falls back as ``precision`` documents); the
eager references run under the codec's own numerics, as the engine does. Plain TF32 is not a precision these
tolerances can hold (see ``streamdec.codecs.precision``).
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from streamdec.codecs import Codec, load_codec
from streamdec.engine.base import WindowRequest
from streamdec.engine.core import DecodeEngine
from streamdec.engine.graphs import static_forward
from streamdec.engine.scheduler import BucketKey
from streamdec.errors import CaptureFrozenError
from streamdec.streaming import StreamDecoder
from support.cuda_checks import random_chunks, replay, snr_db

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", params=["fp32", "tf32x3", "fp16x3"])
def codec(request: pytest.FixtureRequest) -> Codec:
    codec = load_codec("tiny", device="cuda", dtype=torch.float32)
    codec.precision = request.param
    return codec


def _eager(codec: Codec, x: torch.Tensor) -> torch.Tensor:
    """The eager decode of a CUDA batch, under the codec's numerics (as the engine's worker runs it)."""
    with torch.inference_mode(), codec.numerics():
        return static_forward(codec)(x)


def _latents(frames: int, seed: int, dim: int = 64, batch: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (frames, dim) if batch is None else (batch, frames, dim)
    return torch.randn(shape, generator=gen)  # random, never zeros


def _eager_slice(codec: Codec, latents: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Eager decode of one window as a batch of one, emitted frames lo..hi, on the CPU."""
    audio = _eager(codec, latents[None].cuda())[0]
    return audio[:, lo * codec.hop_size : hi * codec.hop_size].cpu()


async def test_plain_graph_equals_eager(codec: Codec) -> None:
    """A plain bucket graph replays bit-identically to the eager decode of the same batch."""
    engine = DecodeEngine(codec, compile=False, batch_buckets=(1, 4))
    report = await engine.warmup((70,))
    assert set(report.buckets) == {(1, 70), (4, 70)} and report.graphs == 2 and not report.failed
    graph = engine.tiers.buckets[BucketKey(4, 70)]
    assert graph.tier == "graph"
    x = _latents(70, 1, batch=4).cuda()
    assert torch.equal(replay(graph, x), _eager(codec, x))
    window = _latents(70, 2)
    out = await engine.decode_window(WindowRequest(0, window, 52, 11))
    assert torch.equal(out, _eager_slice(codec, window, 52, 63))
    assert engine.stats.by_tier == {"graph": 1}
    await engine.aclose()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # Inductor/Triton internals may warn; not the engine's warnings
async def test_compiled_graph_matches_eager(codec: Codec) -> None:
    """A compiled bucket graph is within 1e-4 of eager and at least 70 dB SNR."""
    engine = DecodeEngine(codec, compile=True, batch_buckets=(2,))
    report = await engine.warmup((70,))
    assert report.buckets == ((2, 70),) and not report.failed, report.notes
    graph = engine.tiers.buckets[BucketKey(2, 70)]
    assert graph.tier == "compiled"
    x = _latents(70, 3, batch=2).cuda()
    out = replay(graph, x)
    ref = _eager(codec, x)
    assert (out - ref).abs().max().item() <= 1e-4
    assert snr_db(ref, out) >= 70.0
    window = _latents(70, 4)
    got = await engine.decode_window(WindowRequest(0, window, 10, 40))
    want = _eager_slice(codec, window, 10, 50)
    assert (got - want).abs().max().item() <= 1e-4 and snr_db(want, got) >= 70.0
    await engine.aclose()


@pytest.mark.parametrize("completion", ["thread", "poll"])
async def test_32_streams_batched_match_whole_clip(codec: Codec, completion: str) -> None:
    """32 concurrent streams with random chunkings, batched together, equal each whole-clip decode."""
    engine = DecodeEngine(codec, compile=False, completion=completion, batch_buckets=(1, 2, 4, 8, 16, 32))
    rng = random.Random(7)
    async with StreamDecoder(codec, engine=engine, min_emit=4, max_emit=64) as dec:
        await dec.warmup()
        clips = [
            _latents(rng.choice([30, 61, 90, 150, 257, 400]) + rng.randrange(9), 100 + i) for i in range(32)
        ]

        async def one(i: int) -> torch.Tensor:
            tiles = [t.samples async for t in dec.decode_tiles(random_chunks(clips[i], i, 40))]
            return torch.cat(tiles, dim=-1)

        outs = await asyncio.gather(*(one(i) for i in range(32)))
        stats = engine.stats
    for clip, out in zip(clips, outs, strict=True):
        whole = codec.decode(clip[None].cuda())[0].cpu()
        assert out.shape == whole.shape
        assert (out - whole).abs().max().item() <= 1e-4
    assert stats.decodes < stats.windows  # windows of different streams shared replays
    assert stats.queued == 0


async def test_row_is_bit_identical_whatever_its_batch(codec: Codec) -> None:
    """In the plain tier a window's audio does not depend on the other rows or its row position."""
    engine = DecodeEngine(codec, compile=False, batch_buckets=(8,))
    await engine.warmup((70,))
    graph = engine.tiers.buckets[BucketKey(8, 70)]
    target = _latents(70, 11).cuda()
    rows = []
    for position, seed in [(0, 20), (3, 21), (7, 22), (5, 23)]:
        batch = _latents(70, seed, batch=8).cuda()
        batch[position] = target
        rows.append(replay(graph, batch)[position])
    assert all(torch.equal(rows[0], r) for r in rows[1:])
    # Through the engine: alone (7 pad rows) and with companions, the same audio.
    request = WindowRequest(0, target.cpu(), 20, 30)
    alone = await engine.decode_window(request)
    mixed = await asyncio.gather(
        *(engine.decode_window(WindowRequest(i, _latents(70, 40 + i), 5, 9)) for i in range(6)),
        engine.decode_window(request),
    )
    assert torch.equal(alone, mixed[-1])
    await engine.aclose()


async def test_generation_retirement_keeps_outputs_valid(codec: Codec) -> None:
    """Ad-hoc graphs retire a whole generation at max_graphs; earlier and later outputs stay right."""
    engine = DecodeEngine(codec, compile=False, max_graphs=2, batch_buckets=(1,))
    await engine.start()
    kept = []
    for i, frames in enumerate([20, 21, 22, 23, 24, 20]):
        window = _latents(frames, 60 + i)
        out = await engine.decode_window(WindowRequest(0, window, 0, frames))
        kept.append((out, out.clone(), _eager_slice(codec, window, 0, frames)))
    assert engine.tiers.retired_generations >= 2
    assert engine.stats.by_tier == {"graph": 6}
    for out, copy, ref in kept:
        assert torch.equal(out, copy)  # nothing handed out aliases a graph buffer
        assert torch.equal(out, ref)  # plain graph == eager, before and after retirements
    assert not kept[0][0].is_pinned()
    await engine.aclose()


async def test_freeze_refuses_new_captures(codec: Codec) -> None:
    """After freeze(), a shape with no graph raises CaptureFrozenError, or decodes eagerly when asked."""
    strict = DecodeEngine(codec, compile=False, batch_buckets=(1,))
    await strict.warmup((70,))
    strict.freeze()
    assert (await strict.decode_window(WindowRequest(0, _latents(70, 1), 0, 70))).shape[-1] == 70 * 480
    with pytest.raises(CaptureFrozenError, match="frozen"):
        await strict.decode_window(WindowRequest(0, _latents(33, 1), 0, 33))
    await strict.aclose()
    lenient = DecodeEngine(codec, compile=False, batch_buckets=(1,), on_frozen_miss="eager")
    await lenient.warmup((70,))
    lenient.freeze()
    window = _latents(33, 2)
    out = await lenient.decode_window(WindowRequest(0, window, 0, 33))
    assert lenient.stats.by_tier == {"eager-frozen": 1}
    assert (out - _eager_slice(codec, window, 0, 33)).abs().max().item() <= 1e-5
    await lenient.aclose()


async def test_no_memory_growth_over_1000_streams(codec: Codec) -> None:
    """1,000 streams (some dropped mid-flight) leave device memory where the first 100 left it."""
    engine = DecodeEngine(codec, compile=False, batch_buckets=(1, 2, 4, 8, 16, 32, 64))
    rng = random.Random(3)
    async with StreamDecoder(codec, engine=engine, min_emit=4, max_emit=64) as dec:
        await dec.warmup()

        async def one(seed: int) -> None:
            # Clips at least as long as the largest window: every window is a warmed bucket, so no
            # ad-hoc capture (those grow memory by design, bounded by max_graphs) muddies the count.
            clip = _latents(rng.choice([130, 200, 261]), seed)
            drop = seed % 5 == 0
            chunks = (clip[i : i + 16] for i in range(0, clip.shape[0], 16))
            async with dec.decode_tiles(chunks) as tiles:
                async for tile in tiles:
                    assert tile.samples.shape[0] == codec.channels
                    if drop:
                        break  # a stream dropped mid-flight frees its slots

        async def wave(w: int) -> None:
            tasks = [asyncio.ensure_future(one(1000 * w + i)) for i in range(100)]
            await asyncio.sleep(0)
            for t in tasks[::17]:
                t.cancel()  # cancelled while queued or in flight
            await asyncio.gather(*tasks, return_exceptions=True)

        await wave(0)
        torch.cuda.synchronize()
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        graphs = engine.tiers.graph_count
        for w in range(1, 10):
            await wave(w)
        torch.cuda.synchronize()
        assert engine.tiers.graph_count == graphs
        # No growth: what the first wave left allocated is the ceiling (it may shrink as its last
        # results are collected).
        assert torch.cuda.memory_allocated() <= allocated
        assert torch.cuda.memory_reserved() <= reserved + (32 << 20)
        assert engine.stats.queued == 0 and engine._scheduler.pending == 0
        assert engine._scheduler._groups == {}
        assert dec.stats.open_streams == 0
