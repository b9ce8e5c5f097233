"""The precisions on a real GPU, for auk-24k: accuracy against float64, and graphs against eager.

Runs only where CUDA is available (the ``cuda`` marker). The figures each test prints are the ones the
README quotes; scripts/bench_gpu.py times the same precisions.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from streamdec.codecs import Codec
from streamdec.codecs.precision import Precision
from streamdec.engine.core import DecodeEngine
from streamdec.engine.graphs import static_forward
from streamdec.engine.scheduler import BucketKey
from support.cuda_checks import float64_twin, replay, snr_db

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


def _latents(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, frames, 64, generator=torch.Generator().manual_seed(seed)).cuda()


def _eager(codec: Codec, z: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(), codec.numerics():
        return static_forward(codec)(z)


def test_precisions_rank_by_accuracy(auk: Codec) -> None:
    """Against a float64 decode of the same weights, each precision at its documented floor.

    tf32x3's products are float32-exact. Through the Triton split conv (the default where Triton is) the
    accumulator restarts every step and the decode is float32-accurate (120 dB on the H200); through
    cuDNN (``STREAMDEC_TRITON_CONV=0``) one tensor-core accumulator carries each whole reduction and it
    lands between fp32 and tf32 (83 dB), see streamdec.codecs.precision.
    """
    z = _latents(2, 70, 1)
    exact = float64_twin(auk)
    truth = _eager(exact, z.double())
    del exact
    errors: dict[Precision, tuple[float, float]] = {}
    triton_conv = False
    f16 = torch.cuda.get_device_capability() >= (9, 0)  # the float16 split kernel needs TMA
    for precision in ("fp32", "tf32x3", "fp16x3", "fp16", "tf32"):
        auk.precision = precision
        triton_conv |= any(getattr(m, "packed_split", None) is not None for m in auk.modules())
        out = _eager(auk, z)
        errors[precision] = (float((out.double() - truth).abs().max()), snr_db(truth, out))
        print(f"auk-24k 2x70 {precision:7s} vs float64: max abs {errors[precision][0]:.3g}, "
              f"SNR {errors[precision][1]:.1f} dB")  # fmt: skip
    auk.precision = "fp32"
    assert errors["fp32"][1] >= 100.0 and errors["fp32"][0] <= 1e-5
    if triton_conv:
        assert errors["tf32x3"][1] >= 100.0 and errors["tf32x3"][0] <= 1e-5
    else:
        assert errors["tf32x3"][1] >= 75.0 and errors["tf32x3"][0] <= 2e-4
        assert errors["fp32"][0] < errors["tf32x3"][0]
    assert errors["tf32x3"][0] < errors["tf32"][0] / 5  # TF32 really ran in both
    if triton_conv and f16:
        assert errors["fp16x3"][1] >= 100.0 and errors["fp16x3"][0] <= 1e-5
        # one float16 product: 11 bits of each operand, so TF32's accuracy, not float32's
        assert 40.0 <= errors["fp16"][1] < errors["fp16x3"][1] - 20.0


@pytest.mark.filterwarnings("ignore")  # Inductor/Triton internals may warn; not the engine's warnings
@pytest.mark.parametrize("split", ["tf32x3", "fp16x3"])
async def test_split_graphs_match_eager(auk: Codec, split: Precision) -> None:
    """A split precision: a plain graph replays eager bit for bit; a compiled one is within 1e-4 and 70 dB
    of its eager decode and of fp32."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auk.precision = "fp32"
        z = _latents(1, 70, 2)
        fp32 = _eager(auk, z)
        auk.precision = split
        eager = _eager(auk, z)
        for compile in (False, True):
            engine = DecodeEngine(auk, compile=compile, batch_buckets=(1,))
            report = await engine.warmup((70,))
            graph = engine.tiers.buckets[BucketKey(1, 70)]
            assert graph.tier == ("compiled" if compile else "graph"), report.notes
            out = replay(graph, z)
            await engine.aclose()
            if not compile:
                assert torch.equal(out, eager)
            for name, ref in ((f"{split} eager", eager), ("fp32 eager", fp32)):
                err, snr = float((out - ref).abs().max()), snr_db(ref, out)
                print(f"auk-24k 1x70 {split} {graph.tier} vs {name}: max abs {err:.3g}, SNR {snr:.1f} dB")
                assert err <= 1e-4 and snr >= 70.0
    auk.precision = "fp32"
