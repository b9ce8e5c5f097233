"""Time one stream's decode calls on this CPU, stateful and halo, for the codecs named: what a real-time
stream costs the engine per call and per second of audio, the figures behind the CPU default mode.

Each call is decoded alone (one stream, no batching) through the engine ``streamdec serve`` builds on a
CPU (one intra-op thread beside the event loop); the median of ``--repeats`` calls is kept.

    python scripts/cpu_call_costs.py --codecs tiny,dac-tiny --out bench/results/cpu/cpu-call-costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import streamdec
from streamdec.bench.meta import git_commit
from streamdec.engine import StepRequest, WindowRequest


async def timed(call: Any, repeats: int) -> float:
    """Median milliseconds of ``repeats`` awaited calls (``call()`` builds a fresh awaitable)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        await call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


async def stateful_rows(codec: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    async with streamdec.StreamDecoder(codec, mode="stateful") as dec:
        await dec.warmup()
        engine, policy, dim = dec.engine, dec.policy, codec.latent_dim
        assert policy is not None
        for kind, n in policy.shapes():
            if kind == "flush":
                continue
            slot = engine.open_slot()
            if kind == "step":  # a step needs a primed slot
                prime = policy.prime_sizes[0]
                await engine.decode_step(StepRequest(0, slot, "prime", torch.randn(prime, dim), 0.0))

            async def call(kind: Any = kind, n: int = n, slot: int = slot) -> Any:
                return await engine.decode_step(StepRequest(0, slot, kind, torch.randn(n, dim), 0.0))

            ms = await timed(call, repeats)
            engine.close_slot(slot)
            emit = n - policy.right_frames if kind == "prime" else n
            rows.append({"mode": "stateful", "call": f"{kind} {n}", "emits_frames": emit, "ms": round(ms, 2)})
    return rows


async def halo_rows(codec: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    left, right = codec.context_frames()
    async with streamdec.StreamDecoder(codec, mode="halo") as dec:
        await dec.warmup()
        for size in dec.window_sizes:
            emit = size - left - right

            async def call(size: int = size, emit: int = emit) -> Any:
                latents = torch.randn(size, codec.latent_dim)
                return await dec.engine.decode_window(WindowRequest(0, latents, left, emit, 0.0))

            ms = await timed(call, repeats)
            rows.append({"mode": "halo", "call": f"window {size}", "emits_frames": emit, "ms": round(ms, 2)})
    return rows


async def measure(name: str, repeats: int) -> list[dict[str, Any]]:
    codec = streamdec.load_codec(name, device="cpu")
    rate = codec.sample_rate / codec.hop_size
    rows = await stateful_rows(codec, repeats) + await halo_rows(codec, repeats)
    for row in rows:
        audio_ms = row["emits_frames"] / rate * 1e3
        row.update(codec=name, audio_ms=round(audio_ms, 1), ms_per_audio_ms=round(row["ms"] / audio_ms, 3))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codecs", default="tiny,dac-tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    rows = [row for name in args.codecs.split(",") for row in asyncio.run(measure(name, args.repeats))]
    commit, dirty = git_commit(Path(__file__).resolve().parent.parent)
    result = {
        "command": "python scripts/cpu_call_costs.py " + " ".join(sys.argv[1:]),
        "git_commit": commit,
        "git_dirty": dirty,
        "host": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15_at_start": load_at_start,
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
        "calls": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(f"{row['codec']:9} {row['mode']:8} {row['call']:10} {row['ms']:7.1f} ms for {row['audio_ms']:6.1f} ms "
              f"of audio ({row['ms_per_audio_ms']:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
