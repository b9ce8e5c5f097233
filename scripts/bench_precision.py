"""Speed and accuracy of the float16 precisions side by side, in one process: ``fp16x3`` against ``fp16``.

For each precision (``--precisions``, switched on one codec, same weights): captured whole-clip decodes of
every ``--windows`` shape (batch x frames; 16 x 70 and 1 x 70 are the kernel figures the docs quote) and
stateful steps of every ``--steps`` bucket (streams x frames), each timed by CUDA events (warm-up, then
``--repeats`` runs of ``--replays`` replays; the median run), on random latents; then the SNR and the
largest error of a 2 x 250-frame decode against the float64 decode of the same weights.

    python3 scripts/bench_precision.py --out bench/results/h200/precision-fp16.json
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from bench_step import capture_graph, parse_bucket, time_graph

from streamdec.bench.meta import ResultFile, script_header
from streamdec.codecs import Codec, load_codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.graphs import static_forward
from streamdec.engine.slots import StatePool


def _accuracy(codec: Codec, exact: Codec, z: torch.Tensor) -> dict[str, float]:
    with torch.inference_mode(), codec.numerics():
        out = static_forward(codec)(z).double()
    with torch.inference_mode():
        truth = static_forward(exact)(z.double())
    noise = (out - truth).pow(2).sum().clamp_min(1e-300)
    return {
        "snr_db": float(10 * torch.log10(truth.pow(2).sum() / noise)),
        "max_abs": float((out - truth).abs().max()),
    }


def _speed(
    codec: Codec, windows: list[tuple[int, int]], steps: list[tuple[int, int]], replays: int, repeats: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"windows": {}, "steps": {}}
    with torch.inference_mode(), codec.numerics():
        for batch, frames in windows:
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda")
            ms = time_graph(capture_graph(static_forward(codec), z), replays, repeats)
            out["windows"][f"{batch}x{frames}"] = {
                "replay_ms": ms,
                "us_per_frame": 1e3 * ms / (batch * frames),
            }
        if steps:
            net = StatefulNet(codec)
            slots = max(b for b, _ in steps)
            pool = StatePool(net, slots, device=torch.device("cuda"), dtype=torch.float32)
            every = torch.arange(slots, device="cuda")
            pool.prime(every, torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device="cuda"))
            for batch, frames in steps:
                index = torch.randperm(slots, device="cuda")[:batch]
                z = torch.randn(batch, frames, codec.latent_dim, device="cuda")
                ms = time_graph(capture_graph(pool.step, index, z), replays, repeats)
                out["steps"][f"{batch}x{frames}"] = {
                    "replay_ms": ms,
                    "us_per_frame": 1e3 * ms / (batch * frames),
                }
            del pool
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--precisions", default="fp16x3,fp16")
    ap.add_argument("--windows", nargs="+", default=["16x70", "1x70"])
    ap.add_argument("--steps", nargs="*", default=["256x4", "64x4"])
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/precision-fp16.json")
    args = ap.parse_args()
    precisions = args.precisions.split(",")
    result = ResultFile(
        args.out,
        script_header(
            codec=args.codec, precision=",".join(precisions), commit=None,
            timing="CUDA events, captured graphs, median of repeats",
        )
        | {"settings": vars(args), "precisions": {}},
    )  # fmt: skip
    torch.manual_seed(0)
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    exact = copy.deepcopy(codec).double()
    exact.refresh_cache()
    z = torch.randn(2, 250, codec.latent_dim, generator=torch.Generator().manual_seed(1)).cuda()
    windows = [parse_bucket(w) for w in args.windows]
    steps = [parse_bucket(s) for s in args.steps]
    for precision in precisions:
        codec.precision = precision
        figures = _accuracy(codec, exact, z) | _speed(codec, windows, steps, args.replays, args.repeats)
        result.result["precisions"][precision] = figures
        result.save()
        shapes = ", ".join(
            f"{kind} {shape} {f['us_per_frame']:.1f} us/frame ({f['replay_ms']:.2f} ms)"
            for kind in ("windows", "steps")
            for shape, f in figures[kind].items()
        )
        print(
            f"{precision:7s} {figures['snr_db']:.1f} dB vs float64 (max abs {figures['max_abs']:.2g}); {shapes}"
        )


if __name__ == "__main__":
    main()
