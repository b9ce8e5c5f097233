"""How real-time stateful streams batch under a modelled device cost: the scheduler's behaviour without a GPU.

Runs the concurrency sweep of ``streamdec bench`` (real-time 4-frame chunks, starts spread over a second,
100 ms listener prebuffer) through ``StreamDecoder`` on the simulated device tier, whose calls cost
``--fixed-ms`` plus ``--per-frame-ms`` for every row-frame (the defaults fit an H200's auk-24k fp16x3 step
graphs: 16x4 9.2 ms, 64x4 14.3 ms, 256x4 42.1 ms, ``bench/results/h200/step-packing.json``). It prints each
point's outcome and the calls made by (kind, frames) with their mean rows, so one sees whether batches
stay small and why. The codec supplies only geometry; on a loaded CPU the host path adds its own delays,
so under-runs here are an upper bound, while the batch sizes show what the scheduling does:

    python3 scripts/sim_batching.py --codec auk-24k --streams 96 192
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
from pathlib import Path
from typing import Any

import torch

from streamdec.bench.common import Budget, Latents, Progress
from streamdec.bench.concurrency import ConcurrencySettings, sweep
from streamdec.codecs import load_codec
from streamdec.engine.simulated import SimulatedCost, SimulatedTier, simulated_engine


def _count_calls(
    calls: collections.Counter[tuple[str, int]], rows: collections.Counter[tuple[str, int]]
) -> None:
    """Wrap the simulated tier's stateful call so every call's kind, frames and rows are counted."""
    original = SimulatedTier.call

    def call(self: SimulatedTier, kind: str, slots: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        key = (kind, int(latents.shape[1]))
        calls[key] += 1
        rows[key] += int(latents.shape[0])
        return original(self, kind, slots, latents)

    SimulatedTier.call = call  # type: ignore[method-assign]


async def _run(args: argparse.Namespace) -> None:
    calls: collections.Counter[tuple[str, int]] = collections.Counter()
    rows: collections.Counter[tuple[str, int]] = collections.Counter()
    _count_calls(calls, rows)
    codec = load_codec(args.codec, device="cpu", dtype=torch.float32)
    engine = simulated_engine(
        codec, cost=SimulatedCost(args.fixed_ms, args.per_frame_ms), max_batch=args.max_batch,
        max_streams=max(args.streams) + 8,
    )  # fmt: skip
    settings = ConcurrencySettings(
        streams=tuple(args.streams), seconds=args.seconds, burst=4, stagger=1.0, prebuffer_ms=100.0,
        min_emit=4, max_emit=16, ttfa_limit_ms=100.0, timeline=args.out is not None,
    )  # fmt: skip
    try:
        out: dict[str, Any] = await sweep(
            codec, engine, settings, websocket=False, latents=Latents(codec.latent_dim, seed=0),
            budget=Budget(args.budget_s), progress=Progress(len(args.streams), quiet=True), mode="stateful",
        )  # fmt: skip
    finally:
        await engine.aclose()
    if args.out is not None:
        Path(args.out).write_text(json.dumps(out, indent=1))
    for p in out["decoder"]:
        print(
            f"{p['streams']:4d} streams: ok={p['ok']} under-ran {p['streams_with_underruns']}, "
            f"mean batch {p['mean_batch']:.1f}, device busy {p['busy_fraction']:.2f}, "
            f"p99 first audio {p['ttfa_ms']['p99']:.0f} ms"
        )
    for key in sorted(calls):
        print(
            f"{key[0]:5s} {key[1]:2d} frames: {calls[key]:5d} calls, {rows[key] / calls[key]:6.1f} rows each"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--streams", type=int, nargs="+", default=[96, 192])
    ap.add_argument("--fixed-ms", type=float, default=6.5)
    ap.add_argument("--per-frame-ms", type=float, default=0.035)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--out", default=None, help="write the sweep, with each point's timeline, as JSON here")
    asyncio.run(_run(ap.parse_args()))


if __name__ == "__main__":
    main()
