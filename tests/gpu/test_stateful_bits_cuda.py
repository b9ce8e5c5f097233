"""Stateful calls on a real GPU, bit for bit: the fused calls against the per-layer ones, and calls that skip
their padding rows against calls that compute every row (auk-24k, fp16x3).

Apart from ``test_stateful_cuda.py`` so that ``scripts/test_gpu.py`` runs the two files side by side: most
of each is Triton compiling the variants its calls launch.
"""

from __future__ import annotations

import pytest
import torch

from streamdec.codecs import Codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


@pytest.mark.parametrize("frames", [4, 1], ids=["step-longer-than-short-states", "one-frame-steps"])
def test_fused_calls_give_the_per_layer_bits(auk: Codec, frames: int) -> None:
    """fp16x3 auk-24k: the fused calls (one gather, residuals in the conv epilogue, row peaks handed over)
    give the per-layer calls' audio and new states bit for bit, with padding rows sharing the scratch
    slot and live rows anywhere in the pool."""
    assert auk.use_auto_precision() == "fp16x3"
    net = StatefulNet(auk)
    cuda = torch.device("cuda")
    fused, apart = (StatePool(net, 6, device=cuda, dtype=torch.float32, fused=f) for f in (True, False))
    gen = torch.Generator(device="cuda").manual_seed(7)
    every = torch.arange(6, device="cuda")
    prime = torch.randn(6, net.min_prime_frames + 2, 64, device="cuda", generator=gen)
    index = torch.tensor([4, 6, 1, 6, 0], device="cuda")  # 6: the scratch slot, twice
    live = index != 6
    calls = [("prime", every, prime)]
    calls += [("step", index, torch.randn(5, frames, 64, device="cuda", generator=gen)) for _ in range(3)]
    calls.append(("flush", index, torch.randn(5, 3, 64, device="cuda", generator=gen)))
    with torch.inference_mode(), auk.numerics():
        for kind, slots, z in calls:
            a, b = fused.fn(kind)(slots, z), apart.fn(kind)(slots, z)
            rows = slice(None) if kind == "prime" else live
            assert torch.equal(a[rows], b[rows]), kind
            assert torch.equal(fused.flat[:6], apart.flat[:6]), kind
    auk.precision = "fp32"


def test_padding_rows_are_skipped_without_changing_a_real_row(auk: Codec) -> None:
    """fp16x3 auk-24k, eager and in a captured step graph: with the count of real rows given, the real
    rows' audio and new states are the bits of a call that computes every row (the padding rows, on the
    scratch slot, come last); a prime's too."""
    assert auk.use_auto_precision() == "fp16x3"
    net = StatefulNet(auk)
    cuda = torch.device("cuda")
    pools = [StatePool(net, 6, device=cuda, dtype=torch.float32) for _ in range(2)]
    gen = torch.Generator(device="cuda").manual_seed(11)
    index = torch.tensor([4, 1, 0, 6, 6, 6, 6, 6], device="cuda")  # 6: the scratch slot
    live = torch.tensor([3], device="cuda")
    prime = torch.randn(8, net.min_prime_frames + 2, 64, device="cuda", generator=gen)
    z = torch.randn(8, 4, 64, device="cuda", generator=gen)
    with torch.inference_mode(), auk.numerics():
        primed = [pools[0].prime(index, prime), pools[1].prime(index, prime, live)]
        assert torch.equal(primed[0][:3], primed[1][:3])
        assert torch.equal(pools[0].flat[:6], pools[1].flat[:6])
        for _ in range(2):
            every_row, skipping = pools[0].step(index, z), pools[1].step(index, z, live)
            assert torch.equal(every_row[:3], skipping[:3])
            assert torch.equal(pools[0].flat[:6], pools[1].flat[:6])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = pools[1].step(index, z, live)
        expected = pools[0].step(index, z)
        graph.replay()
        assert torch.equal(captured[:3], expected[:3])
        assert torch.equal(pools[0].flat[:6], pools[1].flat[:6])
    auk.precision = "fp32"
