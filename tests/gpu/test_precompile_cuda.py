"""Parallel precompile on a real GPU: discovery skips launches, workers compile exactly what a launch
would, and a warm-up with it captures graphs that replay like one without it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamdec.codecs import load_codec
from streamdec.engine import DecodeEngine
from streamdec.kernels import precompile

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]
# Collected everywhere, run on GPU hosts only: the CPU suite's environment may have no Triton.
scale_kernel = pytest.importorskip("support.triton_kernel", reason="needs Triton").scale_kernel

# Compiled by no other test: this process has no binary of it yet.
_FACTOR = 7.0
_LOADED_FACTOR = 5.0


def _launch(x: torch.Tensor, out: torch.Tensor) -> None:
    scale_kernel[(triton_cdiv(x.numel(), 256),)](x, out, x.numel(), FACTOR=_FACTOR, BLOCK=256)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_discovery_records_the_variant_and_launches_nothing() -> None:
    x = torch.randn(1000, device="cuda")
    out = torch.zeros(1000, device="cuda")
    with precompile.discovering() as found:
        _launch(x, out)
        _launch(x, out)  # the same variant again: recorded once, its launch skipped again
    torch.cuda.synchronize()
    assert [v.name for v in found] == ["scale_kernel"]
    assert int(out.abs().sum()) == 0, "a declined compile must skip its launch"

    report = precompile.compile_variants(found, precompile.current_target(), workers=1)
    assert report.variants == 1 and report.failed == 0, report.describe()
    _launch(x, out)
    torch.testing.assert_close(out, x * _FACTOR, rtol=0, atol=0)


def test_a_loaded_variant_launches_without_asking_to_compile() -> None:
    """After the workers compiled a variant and this process loaded it, a launch of it (as inside a
    capture without a run first) finds it: nothing asks the compile hook, and the launch runs."""
    x = torch.randn(777, device="cuda")
    out = torch.zeros(777, device="cuda")

    def launch() -> None:
        scale_kernel[(triton_cdiv(x.numel(), 128),)](x, out, x.numel(), FACTOR=_LOADED_FACTOR, BLOCK=128)

    with precompile.discovering() as found:
        launch()
    assert len(found) == 1
    assert precompile.compile_variants(found, precompile.current_target(), workers=1).failed == 0
    report = precompile.load_variants(found)
    assert (report.variants, report.failed) == (1, 0), report.describe()
    with precompile.discovering() as missing:
        launch()
    torch.cuda.synchronize()
    assert missing == []
    torch.testing.assert_close(out, x * _LOADED_FACTOR, rtol=0, atol=0)


def test_stateful_warmup_with_precompile_replays_like_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same stateful buckets warmed with and without the parallel precompile replay bit-identically
    (in one process the second warm-up finds every variant compiled, so this checks the capture path
    with the precompile step in it, and that the step reports what it did)."""
    codec = load_codec("tiny", device="cuda", dtype=torch.float32)
    assert codec.use_auto_precision() == "fp16x3"

    async def replay(parallel: str) -> tuple[list[str], torch.Tensor]:
        monkeypatch.setenv("STREAMDEC_PARALLEL_COMPILE", parallel)
        engine = DecodeEngine(codec, compile=False, max_streams=4, batch_buckets=(1, 2, 4))
        try:
            report = await engine.warmup_steps((("step", 4),))
            graph = engine.tiers.buckets[next(k for k in engine.tiers.buckets if k.batch == 4)]
            z = torch.randn(graph.static_in.shape, generator=torch.Generator().manual_seed(1))
            with torch.inference_mode():  # the static input is an inference tensor
                # A step's output depends on the state it reads, and the two warm-ups left different
                # states in the scratch row their captures use (a first eager run per capture, or none):
                # start both replays from the same state.
                assert engine.tiers.state is not None
                engine.tiers.state.flat.zero_()
                graph.static_in.copy_(z)
                graph.graph.replay()
                torch.cuda.synchronize()
            return list(report.notes), graph.static_out.clone()
        finally:
            await engine.aclose()

    notes_on, out_on = asyncio.run(replay("1"))
    _, out_off = asyncio.run(replay("0"))
    codec.precision = "fp32"
    assert any("Triton variants" in n for n in notes_on), notes_on
    torch.testing.assert_close(out_on, out_off, rtol=0, atol=0)
