"""GPU decode benchmark: eager, plain graph and compiled graph replay per (batch, window); engine overheads.

Run on a CUDA machine (not a test: nothing here asserts a time)::

    python scripts/bench_gpu.py --codec auk-24k --precision tf32x3 --windows 70 126 318 --batches 1 16 64 \
        --out bench/results/h200/decode.json

Writes one JSON (rewritten after every measurement, so a run cut short still leaves its figures) with the
command, device, torch version, commit, the FLOP/byte floor per frame and, per (batch, window): median
replay time, microseconds per decoded window frame, and the error of each graph tier against eager.
Inputs are random latents, never zeros. Timing: CUDA events around each call, after warm-up; median.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec import settings
from streamdec.bench.meta import ResultFile, script_header
from streamdec.bench.stats import median_ms
from streamdec.codecs import Codec, load_codec
from streamdec.codecs.precision import PRECISIONS
from streamdec.engine.base import WindowRequest
from streamdec.engine.core import DecodeEngine
from streamdec.engine.graphs import GraphTiers, TierOptions, static_forward
from streamdec.engine.scheduler import BucketKey

# Ceilings measured on this workplace's H200 (KINDS.md): copy bandwidth and bf16 matrix rate; the fp32 and
# tf32 rates are datasheet leads (dense, no sparsity).
H200_BYTES_PER_S = 4.3e12
H200_FLOPS = {"fp32_cuda_cores": 67e12, "tf32_tensor": 495e12, "bf16_tensor_measured": 788e12}


class _ConvCounter(TorchDispatchMode):
    """Counts dense-conv FLOPs and bytes, and bytes every op writes, on meta tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.dense_io = 0
        self.dense_flops = 0
        self.other_flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.written += t.numel() * t.element_size()
        if "conv" in str(func):
            x, w = args[0], args[1]
            flops = 2 * (x.numel() if "transpose" in str(func) else out.numel()) * w.shape[1] * w.shape[-1]
            if w.shape[0] == 1 and w.shape[1] == 1:  # the alias-free filter: one tap set, [B*C, 1, T]
                self.other_flops += flops
            else:
                self.dense_flops += flops
                self.dense_io += (x.numel() + out.numel()) * x.element_size()
        return out


def floor_per_frame(name: str, frames: int = 318) -> dict[str, Any]:
    """FLOPs and bytes per latent frame, and the time floors they imply on an H200."""
    codec = load_codec(name, device="cpu").to("meta")
    z = torch.randn(1, frames, codec.latent_dim, device="meta")
    counter, flop_mode = _ConvCounter(), FlopCounterMode(display=False)
    with torch.inference_mode(), flop_mode, counter:
        codec.synthesize(codec.denormalize(z).transpose(1, 2))
    weights = sum(p.numel() * p.element_size() for p in codec.parameters())
    per = {
        "gflop_per_frame_dense_conv": counter.dense_flops / frames / 1e9,
        "gflop_per_frame_filters": counter.other_flops / frames / 1e9,
        "gflop_per_frame_flopcounter": flop_mode.get_total_flops() / frames / 1e9,
        "mb_per_frame_dense_conv_io": counter.dense_io / frames / 1e6,
        "mb_per_frame_written_eager": counter.written / frames / 1e6,
        "weights_mb": weights / 1e6,
    }
    # Fused floor: each dense conv reads its input and writes its output once, and a fused activation
    # kernel reads a conv output and writes the next conv input once: twice the dense-conv I/O.
    fused_bytes = 2 * counter.dense_io / frames
    eager_bytes = 2 * counter.written / frames  # every op's output written once and read once
    flops = counter.dense_flops / frames
    per["us_per_frame_memory_fused"] = fused_bytes / H200_BYTES_PER_S * 1e6
    per["us_per_frame_memory_eager_traffic"] = eager_bytes / H200_BYTES_PER_S * 1e6
    for unit, rate in H200_FLOPS.items():
        per[f"us_per_frame_compute_{unit}"] = flops / rate * 1e6
    # tf32x3 (streamdec.codecs.precision) multiplies three split operand pairs on the TF32 tensor cores
    per["us_per_frame_compute_tf32x3"] = 3 * flops / H200_FLOPS["tf32_tensor"] * 1e6
    # fp16x3: three float16 products, at the rate measured for bfloat16 (the tensor cores run both alike)
    per["us_per_frame_compute_fp16x3"] = 3 * flops / H200_FLOPS["bf16_tensor_measured"] * 1e6
    return per


def _reps(estimate_ms: float, target_ms: float, lo: int = 3, hi: int = 20) -> int:
    return max(lo, min(hi, int(target_ms / max(estimate_ms, 1e-3))))


def _errors(ref: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
    diff = (out.double() - ref.double()).pow(2).sum()
    snr = 10 * torch.log10(ref.double().pow(2).sum() / diff.clamp_min(1e-300))
    return {
        "bit_equal": bool(torch.equal(out, ref)),
        "max_abs_err": float((out - ref).abs().max()),
        "snr_db": float(snr),
    }


class Bench(ResultFile):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        timing = "CUDA events around each call on a side stream, after warm-up; median of reps"
        header = script_header(codec=args.codec, precision=args.precision, commit=args.commit, timing=timing)
        super().__init__(args.out, {**header, "floor": floor_per_frame(args.codec), "accuracy": {},
                                    "shapes": [], "compile": [], "engine": {}, "skipped": []})  # fmt: skip
        self.codec: Codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
        self.codec.precision = args.precision
        self.forward = static_forward(self.codec)
        self.stream = torch.cuda.Stream()

    def accuracy(self, batch: int = 2, frames: int = 70) -> None:
        """Eager decode error of each precision against a float64 decode of the same weights."""
        z = self.inputs(batch, frames, 7)
        exact = copy.deepcopy(self.codec).double()
        exact.precision = "fp32"
        exact.refresh_cache()
        with torch.inference_mode(), exact.numerics():
            truth = static_forward(exact)(z.double())
        del exact
        for precision in PRECISIONS:
            self.codec.precision = precision
            with torch.inference_mode(), self.codec.numerics():
                out = self.forward(z)
            self.result["accuracy"][precision] = {"shape": f"{batch}x{frames}", **_errors(truth, out)}
            print(f"accuracy {precision:7s}: {self.result['accuracy'][precision]}")
        self.codec.precision = self.args.precision
        self.save()

    def inputs(self, batch: int, frames: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch, frames, self.codec.latent_dim, generator=gen).cuda()

    def record(self, key: BucketKey, tier: str, ms: float, extra: dict[str, Any]) -> None:
        row = {
            "batch": key.batch,
            "window": key.frames,
            "tier": tier,
            "ms": round(ms, 3),
            "us_per_frame": round(ms * 1e3 / (key.batch * key.frames), 2),
            **extra,
        }
        self.result["shapes"].append(row)
        self.save()
        print(
            f"{tier:9s} b={key.batch:3d} w={key.frames:4d} {ms:9.2f} ms {row['us_per_frame']:8.2f} us/frame"
        )

    def eager_and_graph(self, key: BucketKey) -> None:
        x = self.inputs(key.batch, key.frames, 1)
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            began = time.perf_counter()
            ref = self.forward(x)
            torch.cuda.synchronize()
            first = (time.perf_counter() - began) * 1e3
            ms = median_ms(lambda: self.forward(x), _reps(first, self.args.target_ms), stream=self.stream)
            self.record(key, "eager", ms, {})
            tiers = self._tiers(compile=False)
            tiers.warm([key])
            graph = tiers.buckets[key]
            graph.static_in.copy_(x)
            graph.graph.replay()
            torch.cuda.synchronize()
            errors = _errors(ref, graph.static_out)
            ms = median_ms(graph.graph.replay, _reps(ms, self.args.target_ms), stream=self.stream)
            self.record(key, "graph", ms, {"vs_eager": errors})
            del tiers, graph, ref
        torch.cuda.empty_cache()

    def _tiers(self, compile: bool) -> GraphTiers:
        options = TierOptions(compile=compile, compile_dynamic=self.args.compile_dynamic)
        return GraphTiers(
            self.forward,
            latent_dim=self.codec.latent_dim,
            dtype=torch.float32,
            device=torch.device("cuda"),
            stream=self.stream,
            pad_latent=self.codec.pad_latent,
            options=options,
        )

    def compiled(self, keys: list[BucketKey]) -> None:
        tiers = self._tiers(compile=True)
        for key in keys:
            if self.elapsed() > self.args.budget_s:
                self.result["skipped"].append({"batch": key.batch, "window": key.frames, "tier": "compiled"})
                self.save()
                continue
            began = time.perf_counter()
            with torch.inference_mode(), torch.cuda.stream(self.stream):
                notes = tiers.warm([key])
                seconds = time.perf_counter() - began
                self.result["compile"].append({"batch": key.batch, "window": key.frames, "seconds": seconds})
                graph = tiers.buckets.get(key)
                if graph is None or graph.tier != "compiled":
                    self.result["compile"][-1]["failed"] = notes
                    self.save()
                    continue
                x = self.inputs(key.batch, key.frames, 1)
                ref = self.forward(x)
                eager_ms = None
                if self.args.eager_with_compiled:
                    estimate = graph.replay_ms or 10
                    eager_ms = median_ms(
                        functools.partial(self.forward, x), _reps(estimate, 300, hi=10), stream=self.stream
                    )
                graph.static_in.copy_(x)
                graph.graph.replay()
                torch.cuda.synchronize()
                errors = _errors(ref, graph.static_out)
                del ref
                ms = median_ms(
                    graph.graph.replay, _reps(graph.replay_ms or 10, self.args.target_ms), stream=self.stream
                )
            extra = {"vs_eager": errors, "warm_seconds": round(seconds, 1)}
            if eager_ms is not None:
                extra["eager_ms"] = round(eager_ms, 3)
            self.record(key, "compiled", ms, extra)
        self.result["compiled_pool_reserved_gb"] = torch.cuda.memory_reserved() / 1e9
        del tiers
        torch.cuda.empty_cache()

    async def engine_overheads(self) -> None:
        """Submit-to-result latency of one window (thread vs poll completion), and batched throughput."""
        frames = self.args.windows[0]
        for completion in ("thread", "poll"):
            engine = DecodeEngine(self.codec, compile=False, batch_buckets=(1,), completion=completion)
            await engine.warmup((frames,))
            replay = engine.tiers.buckets[BucketKey(1, frames)].replay_ms
            lat = []
            for i in range(self.args.latency_reps):
                req = WindowRequest(0, self.inputs(1, frames, 100 + i)[0].cpu(), 52, frames - 59)
                began = time.perf_counter()
                await engine.decode_window(req)
                lat.append((time.perf_counter() - began) * 1e3)
            await engine.aclose()
            self.result["engine"][f"latency_{completion}"] = {
                "window": frames,
                "replay_ms": replay,
                "submit_to_result_ms_median": statistics.median(lat),
                "submit_to_result_ms_p90": sorted(lat)[int(0.9 * len(lat))],
                "overhead_ms_median": statistics.median(lat) - (replay or 0.0),
            }
            self.save()
            print(f"engine {completion}: {self.result['engine'][f'latency_{completion}']}")

    async def engine_throughput(self) -> None:
        frames, n = self.args.throughput_window, self.args.throughput_streams
        engine = DecodeEngine(self.codec, compile=False, batch_buckets=(1, 16, 64))
        report = await engine.warmup((frames,))
        reqs = [WindowRequest(i, self.inputs(1, frames, 500 + i)[0].cpu(), 52, frames - 59) for i in range(n)]
        await asyncio.gather(*(engine.decode_window(r) for r in reqs))  # warm pinned buffers
        began = time.perf_counter()
        rounds = 3
        for _ in range(rounds):
            await asyncio.gather(*(engine.decode_window(r) for r in reqs))
        wall = (time.perf_counter() - began) / rounds
        stats = engine.stats
        replays = await engine.replay_ms()
        await engine.aclose()
        self.result["engine"]["throughput"] = {
            "window": frames,
            "concurrent_windows": n,
            "wall_ms_per_round": wall * 1e3,
            "us_per_window_frame": wall * 1e6 / (n * frames),
            "replay_ms": {f"{b}x{f}": ms for (b, f), (_, ms) in replays.items()},
            "decodes": stats.decodes,
            "windows": stats.windows,
            "by_tier": stats.by_tier,
            "warmup_seconds": report.seconds,
            "graph_memory_gb": report.graph_memory_bytes / 1e9,
        }
        self.save()
        print(f"engine throughput: {self.result['engine']['throughput']}")


def _order_compiled(windows: list[int], batches: list[int]) -> list[BucketKey]:
    # Batch 1 at the smallest window first (the reference figure), then each window's batched compile,
    # whose dynamic batch dimension serves every larger batch without another compile.
    keys = [BucketKey(b, w) for w in windows for b in batches]
    return sorted(keys, key=lambda k: (k.frames != windows[0], k.frames, k.batch == 1, k.batch))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codec", default="auk-24k")
    parser.add_argument("--windows", type=int, nargs="+", default=[70, 126, 318])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--compiled-batches", type=int, nargs="*", default=None)
    parser.add_argument("--compile-dynamic", default="batch", choices=["none", "batch", "all"])
    parser.add_argument("--target-ms", type=float, default=1500.0, help="time per measurement (sets reps)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no compile after this")
    parser.add_argument("--latency-reps", type=int, default=40)
    parser.add_argument("--throughput-window", type=int, default=126)
    parser.add_argument("--throughput-streams", type=int, default=64)
    parser.add_argument("--skip", nargs="*", default=[], choices=["accuracy", "plain", "compiled", "engine"])
    parser.add_argument("--floor-only", action="store_true", help="print the FLOP/byte floor (CPU) and exit")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="the codec's precision")
    parser.add_argument("--eager-with-compiled", action="store_true", help="time eager next to each compiled")
    parser.add_argument("--inductor-cache-dir", default=None)
    parser.add_argument("--out", default="bench/results/gpu-engine.json")
    args = parser.parse_args()
    if args.floor_only:
        print(json.dumps(floor_per_frame(args.codec), indent=2))
        return
    if args.inductor_cache_dir:
        settings.use_inductor_cache_dir(args.inductor_cache_dir)  # at start, before anything compiles
    bench = Bench(args)
    print(json.dumps(bench.result["floor"], indent=2))
    if "accuracy" not in args.skip:
        bench.accuracy()
    if "engine" not in args.skip:  # the engine applies the codec's numerics itself
        asyncio.run(bench.engine_overheads())
        asyncio.run(bench.engine_throughput())
    with bench.codec.numerics():  # eager calls, captures and compiles all at the codec's precision
        if "plain" not in args.skip:
            for w in args.windows:
                for b in args.batches:
                    bench.eager_and_graph(BucketKey(b, w))
        if "compiled" not in args.skip:
            bench.compiled(_order_compiled(args.windows, args.compiled_batches or args.batches))
    bench.result["total_seconds"] = bench.elapsed()
    bench.save()
    print(f"done in {bench.elapsed():.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
