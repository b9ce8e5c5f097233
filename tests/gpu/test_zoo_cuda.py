"""Each zoo family through StreamDecoder on a GPU (plain graphs and compiled buckets), equal to offline.

Runs only where CUDA is available (the ``cuda`` marker). Precisions fp32 and tf32x3 (within 1e-4 of
float64), so the tolerances are about the engine: plain graphs replay the eager arithmetic; compiled buckets may fuse
differently (1e-4, the project's compiled tolerance).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamdec.codecs import Codec, load_codec
from streamdec.codecs.precision import Precision
from streamdec.engine.core import DecodeEngine
from streamdec.streaming import StreamDecoder
from support.cuda_checks import random_chunks

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]
FAMILIES = ["dac-tiny", "oobleck-tiny", "bigvgan-tiny"]


async def _streams(
    codec: Codec, engine: DecodeEngine, clips: list[torch.Tensor], emit: tuple[int, int]
) -> list[torch.Tensor]:
    async with StreamDecoder(codec, engine=engine, min_emit=emit[0], max_emit=emit[1]) as dec:
        await dec.warmup()

        async def one(i: int) -> torch.Tensor:
            return torch.cat(
                [t.samples async for t in dec.decode_tiles(random_chunks(clips[i], i, 20))], dim=-1
            )

        return list(await asyncio.gather(*(one(i) for i in range(len(clips)))))


@pytest.mark.parametrize(
    ("compile", "precision"),
    [
        pytest.param(False, "fp32", id="graphs"),
        pytest.param(False, "tf32x3", id="graphs-tf32x3"),
        pytest.param(True, "fp32", id="compiled", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("name", FAMILIES)
def test_family_streams_on_cuda_equal_offline(name: str, compile: bool, precision: Precision) -> None:
    """Eight concurrent streams of one family, batched on the GPU, equal each whole-clip decode."""
    codec = load_codec(name, device="cuda")
    codec.precision = precision
    gen = torch.Generator().manual_seed(0)
    clips = [torch.randn(20 + 13 * i, codec.latent_dim, generator=gen) for i in range(8)]
    engine = DecodeEngine(codec, compile=compile, batch_buckets=(1, 2, 4, 8))
    # Compiling costs tens of seconds per window size: the compiled variant uses one (16 emitted frames).
    outs = asyncio.run(_streams(codec, engine, clips, (16, 16) if compile else (4, 32)))
    if compile:  # a failed compile falls back to plain graphs: make sure this test measured compiled ones
        assert engine.stats.by_tier.get("compiled", 0) > 0, engine.stats.by_tier
    # Plain graphs replay eager arithmetic, but the whole clip is another shape, which cuDNN may compute with
    # another kernel: 1e-5 covers that in fp32; tf32x3's accumulation error (~1e-5) needs the 1e-4 budget.
    tol = 1e-4 if compile or precision == "tf32x3" else 1e-5
    for clip, out in zip(clips, outs, strict=True):
        want = codec.decode(clip[None].cuda())[0].cpu()
        assert out.shape == want.shape
        assert (out - want).abs().max().item() <= tol


@pytest.mark.parametrize("length", [15, 16, 17, 100, 1000])
def test_centred_activation_fused_equals_reference_on_cuda(length: int) -> None:
    """BigVGAN's centred activation through the Triton kernel (shifted) equals its reference path."""
    from streamdec.codecs.layers import AliasFreeActivation, refresh_caches

    act = AliasFreeActivation(8, causal=False).cuda()
    gen = torch.Generator().manual_seed(length)
    with torch.no_grad():
        act.act.alpha.copy_(torch.randn(8, generator=gen) * 0.3)
        act.act.beta.copy_(torch.randn(8, generator=gen) * 0.3)
    refresh_caches(act)
    x = torch.randn(4, 8, length, generator=gen).cuda()
    with torch.inference_mode():
        fused, reference = act(x), act.reference(x)
    assert (fused - reference).abs().max().item() <= 1e-5
