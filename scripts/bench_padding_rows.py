"""What a stateful step graph costs with some of its rows padding: kernels that skip them against kernels
that compute them, in one run.

A replay that holds fewer streams than its bucket fills the rest with padding rows. Each bucket (streams x
frames) is captured twice over the same pool: as the engine captures it (the call reads how many rows are
real and its kernels skip the rest, :mod:`streamdec.kernels.rows`) and computing every row. The first is
then timed with that count set to each ``--fills`` fraction of the bucket, the second once (its cost does
not depend on the fill). Timing is by CUDA events after a warm-up: ``--repeats`` runs of ``--replays``
replays, the median run reported. Before timing, both graphs replay once from the same states and the
script checks that the real rows' audio and new states are the same bits:

    python3 scripts/bench_padding_rows.py --buckets 256x4 64x4 --out bench/results/h200/padding-rows.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_step import capture, parse_bucket, time_graph

from streamdec.bench.meta import ResultFile, script_header


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from streamdec.codecs import load_codec
    from streamdec.codecs.stateful import StatefulNet
    from streamdec.engine.slots import StatePool

    torch.manual_seed(0)
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    precision = codec.use_auto_precision()
    net = StatefulNet(codec)
    buckets = [parse_bucket(b) for b in args.buckets]
    slots = max(b for b, _ in buckets)
    cuda = torch.device("cuda")
    pool = StatePool(net, slots, device=cuda, dtype=torch.float32)
    out: dict[str, Any] = {"precision": precision, "buckets": {}}
    every = torch.arange(slots, device=cuda)
    with torch.inference_mode(), codec.numerics():
        for batch, frames in buckets:
            # Fresh states for each bucket: hundreds of timed steps of random latents before the check
            # would leave states that have run off to infinity, where equal bits compare unequal (NaN).
            pool.prime(every, torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device=cuda))
            real = max(1, batch // 2)
            # The engine's layout: real rows first (anywhere in the pool), padding rows on the scratch slot.
            index = torch.full((batch,), pool.scratch, device=cuda)
            index[:real] = torch.randperm(slots, device=cuda)[:real]
            z = torch.randn(batch, frames, codec.latent_dim, device=cuda)
            live = torch.tensor([real], device=cuda)
            skipping = capture(pool.step, index, z, live)
            computing = capture(pool.step, index, z)
            same = _same_bits(pool, skipping, computing, index[:real], real)
            entry: dict[str, Any] = {
                "real_rows_same_bits": same,
                "finite": bool(torch.isfinite(pool.flat).all()),
                "every_row_ms": time_graph(computing[0].replay, args.replays, args.repeats),
                "skipping_ms": {},
            }
            for fill in args.fills:
                rows = round(fill * batch)
                live.fill_(rows)
                entry["skipping_ms"][str(rows)] = time_graph(skipping[0].replay, args.replays, args.repeats)
            out["buckets"][f"{batch}x{frames}"] = entry
            print(
                f"{batch}x{frames}: every row {entry['every_row_ms']:.2f} ms; skipping, by real rows: "
                + ", ".join(f"{r}: {ms:.2f}" for r, ms in entry["skipping_ms"].items())
                + f"; real rows same bits: {same}"
            )
    return out


def _same_bits(
    pool: Any,
    skipping: tuple[torch.cuda.CUDAGraph, torch.Tensor],
    computing: tuple[torch.cuda.CUDAGraph, torch.Tensor],
    slots: torch.Tensor,
    real: int,
) -> bool:
    """One replay of each graph from the same states: equal audio in the real rows, equal new states."""
    before = pool.flat.clone()
    computing[0].replay()
    audio, states = computing[1][:real].clone(), pool.flat[slots].clone()
    pool.flat.copy_(before)
    skipping[0].replay()
    return _bits_equal(skipping[1][:real], audio) and _bits_equal(pool.flat[slots], states)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (so that NaN equals the same NaN), float32."""
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--buckets", nargs="+", default=["256x4", "64x4"])
    ap.add_argument("--fills", type=float, nargs="+", default=[1.0, 0.85, 0.5, 0.25, 0.0])
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results/padding-rows.json")
    args = ap.parse_args()
    result = ResultFile(
        args.out,
        script_header(codec=args.codec, precision="auto", commit=None, timing="CUDA events, captured graphs")
        | {"settings": vars(args)},
    )
    result.result.update(measure(args))
    result.save()


if __name__ == "__main__":
    main()
