"""Where a decode's GPU time goes: torch.profiler's kernel table for one (batch, window) at each precision.

A diagnostic for choosing the next optimisation, not a benchmark (profiling adds overhead; the figures to
quote come from scripts/bench_gpu.py). ``--compiled`` profiles the ``torch.compile``d decode (the kernels
the compiled buckets replay) instead of the eager one. Each table ends with the GPU time per decode summed
by kind of kernel. Run on a CUDA machine::

    python scripts/profile_decode.py --codec auk-24k --batch 1 --frames 70 --precisions tf32 tf32x3 \
        --out profile.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec.codecs import load_codec
from streamdec.codecs.precision import PRECISIONS
from streamdec.engine.graphs import static_forward

# Kernel-name fragments by what the kernel does, for the per-decode summary (first match wins). Inductor's
# kernels come first: their names list the ops they were fused next to ("..._conv1d_split_f16_...").
KINDS = (
    ("inductor (adds, pads, casts)", ("triton_poi_", "triton_red_", "triton_per_")),
    ("split conv", ("_conv1d_f16x3", "_chunk_sum", "_conv1d_split")),
    ("split pre-pass", ("_row_amax", "_split_kernel")),
    ("fused activation", ("_af_",)),
    ("cudnn / cublas", ("cudnn", "sm90", "sm80", "cutlass", "gemm", "conv")),
)


def summarise(events: list, calls: int) -> str:
    """GPU milliseconds per decode by kernel kind (``events``: ``key_averages()`` rows)."""
    totals: dict[str, float] = {}
    for e in events:
        us = e.self_device_time_total
        if us <= 0:
            continue
        kind = next((k for k, fragments in KINDS if any(f in e.key for f in fragments)), "other")
        totals[kind] = totals.get(kind, 0.0) + us / 1000 / calls
    lines = [f"  {kind:30s} {ms:8.3f} ms" for kind, ms in sorted(totals.items(), key=lambda kv: -kv[1])]
    return (
        "GPU time per decode by kind:\n"
        + "\n".join(lines)
        + f"\n  {'total':30s} {sum(totals.values()):8.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codec", default="auk-24k")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--frames", type=int, default=70)
    parser.add_argument("--precisions", nargs="+", default=["tf32", "tf32x3"], choices=PRECISIONS)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--compiled", action="store_true", help="profile the torch.compile'd decode")
    parser.add_argument("--out", default="profile.txt")
    args = parser.parse_args()
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    forward = static_forward(codec)
    if args.compiled:
        forward = torch.compile(forward, dynamic=False)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(args.batch, args.frames, codec.latent_dim, generator=gen).cuda()
    report = []
    for precision in args.precisions:
        codec.precision = precision
        with torch.inference_mode(), codec.numerics():
            for _ in range(3):  # warm-up: cuDNN heuristics, allocator
                forward(z)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    forward(z)
                torch.cuda.synchronize()
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=90
        )
        mode = "compiled" if args.compiled else "eager"
        head = f"== {args.codec} {args.batch}x{args.frames} precision={precision} {mode}, {args.calls} calls"
        report.append(f"{head}\n{table}\n{summarise(list(prof.key_averages()), args.calls)}")
        print(report[-1])
    Path(args.out).write_text("\n".join(report))


if __name__ == "__main__":
    main()
