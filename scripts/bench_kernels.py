"""Fused alias-free activation: per-layer kernel timings and whole auk-24k decodes, before and after.

Run on a CUDA machine (not a test: nothing here asserts a time)::

    python scripts/bench_kernels.py --out bench/results/h200/kernels.json

One run measures, with CUDA events after warm-up (median of reps):

* the copy bandwidth of the card (the byte ceiling used for the floors below);
* every distinct alias-free activation shape of auk-24k at each batch x window: the reference layer
  (eager PyTorch, several kernels) against the Triton kernel, with achieved bandwidth;
* whole-decode errors, fused vs reference (eager, same weights and latents), at every codec precision;
* whole-decode replay time per batch x window through the engine's own machinery
  (``streamdec.engine.graphs.GraphTiers``: torch.compile, then one CUDA graph per bucket; and plain graph
  capture without compile) for the fused kernel and the reference, with compile seconds, at the
  codec precision ``--precision`` names (default fp32).

The JSON is rewritten after every step, so a run cut short still leaves its figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec.bench.meta import ResultFile, script_header
from streamdec.bench.stats import graph_ms, median_ms
from streamdec.codecs import Codec, load_codec
from streamdec.codecs.layers import AliasFreeActivation
from streamdec.codecs.precision import PRECISIONS
from streamdec.engine.graphs import GraphTiers, TierOptions, static_forward
from streamdec.engine.scheduler import BucketKey
from streamdec.kernels import set_fused
from streamdec.kernels.alias_free import TAPS

# The fused activation's Triton kernel (the name its result rows carry).
KERNEL = "blocked"


def copy_bandwidth() -> float:
    src = torch.randn(256 * 1024 * 1024, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10, warm=2)
    return 2 * src.numel() * 4 / (ms * 1e-3)


def activation_shapes(codec_name: str, batch: int, frames: int) -> Counter[tuple[int, int, int]]:
    codec = load_codec(codec_name, device="cpu").to("meta")
    seen: Counter[tuple[int, int, int]] = Counter()

    def hook(_m: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen[tuple(args[0].shape)] += 1  # type: ignore[index]

    for m in codec.modules():
        if isinstance(m, AliasFreeActivation):
            m.register_forward_pre_hook(hook)
    with torch.inference_mode():
        codec.synthesize(torch.randn(batch, codec.latent_dim, frames, device="meta"))
    return seen


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    noise = (out.double() - ref.double()).pow(2).sum().clamp_min(1e-300)
    return float(10 * torch.log10(ref.double().pow(2).sum() / noise))


class Bench(ResultFile):
    def __init__(self, args: argparse.Namespace) -> None:
        import triton

        self.args = args
        timing = "CUDA events, median of reps after warm-up; graph replays on the engine's stream"
        header = script_header(codec=args.codec, precision=args.precision, commit=args.commit, timing=timing)
        super().__init__(args.out, {**header, "triton": triton.__version__, "layers": [], "decode_errors": [],
                                    "decode": [], "compile": [], "skipped": []})  # fmt: skip

    # -- per-layer ------------------------------------------------------------------------------------

    def layers(self, keys: list[BucketKey]) -> None:
        from streamdec.kernels import _triton_alias_free as tk

        bw = self.result["copy_bytes_per_s"]
        for key in keys:
            shapes = activation_shapes(self.args.codec, key.batch, key.frames)
            totals: dict[str, float] = Counter()
            act_bytes = 0
            for (b, c, t), count in sorted(shapes.items()):
                act = AliasFreeActivation(c).cuda()
                with torch.no_grad():
                    act.act.alpha.normal_(0, 0.3)
                    act.act.beta.normal_(1, 0.3)
                act.refresh_cache()
                x = torch.randn(b, c, t, device="cuda")
                nbytes = 2 * x.numel() * 4
                act_bytes += count * nbytes
                row: dict[str, Any] = {
                    "batch": key.batch,
                    "window": key.frames,
                    "shape": [b, c, t],
                    "count": count,
                }
                act.use_fused = False
                with torch.no_grad():
                    ref = act(x)
                    row["reference_us"] = graph_ms(lambda act=act, x=x: act(x), calls=10) * 1e3
                flat = x.view(b * c, t)
                launch, name = tk.launch_blocked, KERNEL
                out = torch.full_like(flat, float("nan"))
                args = (flat, act.filter.view(TAPS), act.act.alpha_exp, act.act.beta_inv, out)
                launch(*args)
                row[f"{name}_max_abs_err"] = float((out.view_as(x) - ref).abs().max())
                row[f"{name}_us"] = graph_ms(lambda launch=launch, args=args: launch(*args), calls=10) * 1e3
                row[f"{name}_pct_copy_bw"] = 100 * nbytes / (row[f"{name}_us"] * 1e-6) / bw
                for impl in ("reference", KERNEL):
                    totals[impl] += count * row[f"{impl}_us"]
                self.result["layers"].append(row)
                self.save()
            frames = key.batch * key.frames
            summary = {
                "batch": key.batch,
                "window": key.frames,
                "activation_mb_per_frame": act_bytes / frames / 1e6,
                "activation_floor_us_per_frame": act_bytes / frames / bw * 1e6,
                **{f"{impl}_sum_us_per_frame": us / frames for impl, us in totals.items()},
            }
            self.result.setdefault("layer_sums", []).append(summary)
            self.save()
            print(json.dumps(summary))

    # -- whole decodes --------------------------------------------------------------------------------

    def decode_errors(self, codec: Codec) -> None:
        z = torch.randn(2, 70, codec.latent_dim, generator=torch.Generator().manual_seed(9))
        for precision in PRECISIONS:
            codec.precision = precision
            set_fused(codec, False)
            ref = codec.decode(z)
            set_fused(codec, True)
            out = codec.decode(z)
            row = {
                "variant": KERNEL,
                "precision": precision,
                "batch": 2,
                "window": 70,
                "max_abs_err": float((out - ref).abs().max()),
                "snr_db": snr_db(ref, out),
            }
            self.result["decode_errors"].append(row)
            print(row)
        codec.precision = self.args.precision
        self.save()

    def tiers(self, codec: Codec, forward: Any, compile: bool, stream: torch.cuda.Stream) -> GraphTiers:
        return GraphTiers(
            forward,
            latent_dim=codec.latent_dim,
            dtype=torch.float32,
            device=torch.device("cuda"),
            stream=stream,
            pad_latent=codec.pad_latent,
            options=TierOptions(compile=compile, compile_dynamic="batch"),
        )

    def decode(self, codec: Codec, label: str, fused: bool, compile: bool, keys: list[BucketKey]) -> None:
        if self.elapsed() > self.args.budget_s:
            self.result["skipped"].append({"label": label, "why": f"past budget {self.args.budget_s} s"})
            self.save()
            return
        set_fused(codec, fused)
        forward = static_forward(codec)
        stream = torch.cuda.Stream()
        tiers = self.tiers(codec, forward, compile, stream)
        for key in sorted(keys, key=lambda k: -k.batch):
            if self.elapsed() > self.args.key_budget_s:
                self.result["skipped"].append({"label": label, "batch": key.batch, "why": "past key budget"})
                self.save()
                continue
            began = time.perf_counter()
            with torch.inference_mode(), torch.cuda.stream(stream), codec.numerics():
                notes = tiers.warm([key])
                seconds = time.perf_counter() - began
                graph = tiers.buckets.get(key)
                tier = None if graph is None else graph.tier
                if compile:
                    self.result["compile"].append(
                        {
                            "label": label,
                            "batch": key.batch,
                            "window": key.frames,
                            "seconds": seconds,
                            "notes": notes,
                        }
                    )
                if graph is None or (compile and tier != "compiled"):
                    self.result["skipped"].append({"label": label, "batch": key.batch, "why": notes})
                    self.save()
                    continue
                x = torch.randn(
                    key.batch, key.frames, codec.latent_dim, generator=torch.Generator().manual_seed(5)
                )
                x = x.cuda()
                eager = forward(x)
                graph.static_in.copy_(x)
                graph.graph.replay()
                stream.synchronize()
                err = float((graph.static_out - eager).abs().max())
                del eager
                est = graph.replay_ms or 10.0
                reps = max(5, min(30, int(self.args.target_ms / max(est, 0.05))))
                times = []
                for _ in range(reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    graph.graph.replay()
                    end.record(stream)
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                ms = statistics.median(times)
            row = {
                "label": label,
                "tier": tier,
                "fused": fused,
                "variant": KERNEL if fused else None,
                "batch": key.batch,
                "window": key.frames,
                "ms": round(ms, 3),
                "us_per_frame": round(ms * 1e3 / (key.batch * key.frames), 2),
                "reps": reps,
                "spread_ms": [round(min(times), 3), round(max(times), 3)],
                "graph_vs_eager_max_abs": err,
                "warm_seconds": round(seconds, 1),
            }
            self.result["decode"].append(row)
            self.save()
            print(
                f"{label:24s} {tier:9s} b={key.batch:3d} w={key.frames:4d} {ms:9.2f} ms {row['us_per_frame']:8.2f} us/frame"
            )
        del tiers
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codec", default="auk-24k")
    parser.add_argument("--shapes", nargs="+", default=["16x70", "1x70"], help="BATCHxWINDOW")
    parser.add_argument("--target-ms", type=float, default=1000.0)
    parser.add_argument("--budget-s", type=float, default=330.0, help="start no decode tier after this")
    parser.add_argument("--key-budget-s", type=float, default=400.0, help="start no bucket after this")
    parser.add_argument("--skip", nargs="*", default=[], choices=["layers", "plain", "compiled", "reference"])
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="the codec's precision")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", default="bench/results/kernels.json")
    args = parser.parse_args()
    keys = [BucketKey(*map(int, s.split("x"))) for s in args.shapes]
    bench = Bench(args)
    bench.result["copy_bytes_per_s"] = copy_bandwidth()
    print(f"copy bandwidth {bench.result['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    if "layers" not in args.skip:
        bench.layers(keys)
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    codec.precision = args.precision
    bench.decode_errors(codec)
    # Most valuable first: the fused kernel's figures, then the reference ("before").
    if "compiled" not in args.skip:
        bench.decode(codec, f"compiled-fused-{KERNEL}", True, True, keys)
        if "reference" not in args.skip:
            torch._dynamo.reset()
            bench.decode(codec, "compiled-reference", False, True, keys)
    if "plain" not in args.skip:
        bench.decode(codec, f"plain-fused-{KERNEL}", True, False, keys)
        if "reference" not in args.skip:
            bench.decode(codec, "plain-reference", False, False, keys)
    bench.result["total_seconds"] = bench.elapsed()
    bench.save()
    print(json.dumps(bench.result.get("layer_sums", []), indent=1))
    for row in bench.result["decode"]:
        print(
            f"{row['label']:24s} b={row['batch']:3d} w={row['window']:4d} {row['ms']:9.2f} ms {row['us_per_frame']:8.2f} us/frame"
        )
    print(f"done in {bench.elapsed():.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
