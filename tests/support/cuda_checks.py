"""Helpers for the GPU tests (no tests here): auk-24k's layer shapes, error measures against a float64
reference, and a compiled call captured in a CUDA graph.

The split-convolution tests (TF32 and float16) and the precision and stateful tests judge their results
the same way; the thresholds stay in the tests.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator

import pytest
import torch

from streamdec.codecs import Codec, load_codec
from streamdec.engine.graphs import CapturedGraph, static_forward

#: the float16 split kernel's tests: a GPU with TMA
NEEDS_TMA = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="the float16 split kernel needs TMA (compute capability 9.0)",
)

# auk-24k's dense-conv shapes at one 70-frame window: (Cin = Cout, kernel, dilation, output samples)
AUK_LAYERS = [(1536, 7, 1, 70), (768, 3, 1, 350), (768, 11, 5, 350), (384, 7, 3, 1400), (96, 11, 5, 8400)]


def layer_case(
    batch: int, channels: int, ksize: int, dilation: int, tout: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded CUDA ``(x, w)`` for one square layer: ``x`` long enough for ``tout`` outputs, ``w`` scaled to
    keep the output near unit size."""
    gen = torch.Generator().manual_seed(channels + ksize)
    x = torch.randn(batch, channels, tout + (ksize - 1) * dilation, generator=gen).cuda()
    w = (torch.randn(channels, channels, ksize, generator=gen) / (channels * ksize) ** 0.5).cuda()
    return x, w


def rel_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest absolute error of ``out`` against ``exact``, relative to ``exact``'s peak."""
    return float((out.double() - exact).abs().max() / exact.abs().max())


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``out`` against ``ref``, in dB (computed in float64)."""
    noise = (out.double() - ref.double()).pow(2).sum().clamp_min(1e-300)
    return float(10 * torch.log10(ref.double().pow(2).sum() / noise))


def float64_twin(codec: Codec) -> Codec:
    """A float64 copy of ``codec`` (same weights, caches rebuilt): what reference decodes run on."""
    exact = copy.deepcopy(codec).double()
    exact.refresh_cache()
    return exact


def whole_auk_against_float64(precision: str) -> tuple[Codec, float, float]:
    """auk-24k (random weights, 2 x 70 frames) decoded in ``precision`` and by its float64 twin, both
    through ``static_forward``: ``(codec, max abs error, SNR in dB)``; prints the figures."""
    codec = load_codec("auk-24k", device="cuda", dtype=torch.float32)
    z = torch.randn(2, 70, 64, generator=torch.Generator().manual_seed(1)).cuda()
    exact = float64_twin(codec)
    with torch.inference_mode():
        truth = static_forward(exact)(z.double())
    del exact
    codec.precision = precision
    with torch.inference_mode(), codec.numerics():
        out = static_forward(codec)(z)
    err, snr = float((out.double() - truth).abs().max()), snr_db(truth, out)
    print(f"auk-24k 2x70 {precision} vs float64: max abs {err:.3g}, SNR {snr:.1f} dB")
    return codec, err, snr


def random_chunks(clip: torch.Tensor, seed: int, largest: int) -> Iterator[torch.Tensor]:
    """``clip`` in consecutive chunks of seeded random lengths from 1 to ``largest`` frames."""
    r, start = random.Random(seed), 0
    while start < clip.shape[0]:
        n = r.randint(1, largest)
        yield clip[start : start + n]
        start += n


def captured_replay(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fn`` compiled (fullgraph) and captured in a CUDA graph on ``x``, then ``x`` refilled with new values
    and the graph replayed: ``(the replay's output, eager fn of the new x, eager fn of the first x)``."""
    compiled = torch.compile(fn, fullgraph=True)
    with torch.no_grad():
        eager = fn(x)
        compiled(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        return out, fn(x), eager


def replay(graph: CapturedGraph, x: torch.Tensor) -> torch.Tensor:
    """Write ``x`` into a captured decode's input, replay it and return a copy of its output."""
    with torch.inference_mode():
        graph.static_in.copy_(x)
        graph.graph.replay()
        torch.cuda.synchronize()
        return graph.static_out.clone()
