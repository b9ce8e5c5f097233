"""How real-time stateful streams batch under a modelled device cost: the scheduler's behaviour without a GPU.

Runs the concurrency sweep of ``streamdec bench`` (real-time 4-frame chunks, starts spread over a second,
100 ms listener prebuffer) through ``StreamDecoder`` on the simulated device tier, whose calls cost
``--fixed-ms`` plus ``--per-frame-ms`` for every row-frame (the defaults fit an H200's auk-24k fp16x3 step
graphs: 16x4 9.2 ms, 64x4 14.3 ms, 256x4 42.1 ms, ``bench/results/h200/step-packing.json``). It prints each
point's outcome and the calls made by (kind, frames) with their mean rows, so one sees whether batches
stay small and why. The codec supplies only geometry; on a loaded CPU the host path adds its own delays,
so under-runs here are an upper bound, while the batch sizes show what the scheduling does:

    python3 scripts/sim_batching.py --codec auk-24k --streams 96 192

With ``--replays`` (a ``scripts/bench_stateful.py`` result) each stateful call instead costs the replay
time that GPU measured for its bucket, with as many rows live as the call has (interpolated between the
bucket's full and empty replays), and the device time per second of streamed audio is compared with that
result's whole-clip decode at batch 32: the scheduling's device cost on that GPU, modelled. The hold
lead, first-call due, edge batch limit and stagger, named as ``bench_stateful.py`` names them, compare
scheduling choices side by side (a 2-core host carries 384 streams here, not 512):

    python3 scripts/sim_batching.py --streams 384 --replays bench/results/h100/stateful-512-fused-calls-2.json

``--mode halo`` runs halo streams instead, on the fixed and per-frame cost model. It also times the
scheduler's cover planning, which runs under the engine's lock before every call and in every hold, so
a call waits for it: the total, the number of plans and the longest (``planning``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from pathlib import Path
from typing import Any

import torch

from streamdec.bench.common import Budget, Latents, Progress
from streamdec.bench.concurrency import ConcurrencySettings, sweep
from streamdec.bench.meta import environment
from streamdec.codecs import load_codec
from streamdec.engine import scheduler
from streamdec.engine.core import DEFAULT_EDGE_BATCH_LIMIT, DEFAULT_HOLD_LEAD_S, DEFAULT_PRIME_HOLD_LEAD_S
from streamdec.engine.simulated import ReplayTable, SimulatedCost, SimulatedTier, simulated_engine
from streamdec.session import FIRST_CALL_DUE_S


def _count_calls(
    calls: collections.Counter[tuple[str, int]], rows: collections.Counter[tuple[str, int]]
) -> None:
    """Wrap the simulated tier's stateful call so every call's kind, frames and rows are counted."""
    original = SimulatedTier.call

    def call(
        self: SimulatedTier,
        kind: str,
        slots: torch.Tensor,
        latents: torch.Tensor,
        seconds: float | None = None,
    ) -> torch.Tensor:
        key = (kind, int(latents.shape[1]))
        calls[key] += 1
        rows[key] += int(latents.shape[0])
        return original(self, kind, slots, latents, seconds)

    SimulatedTier.call = call  # type: ignore[method-assign,assignment]


def _time_planning(planning: dict[str, float]) -> None:
    """Wrap the scheduler's cover planning so its total seconds, plans and longest plan are recorded."""
    original = scheduler.Scheduler._cover

    def cover(self: scheduler.Scheduler[Any], kind: str, frames: int, count: int) -> list[int]:
        began = time.perf_counter()
        try:
            return original(self, kind, frames, count)
        finally:
            took = time.perf_counter() - began
            planning["s"] += took
            planning["plans"] += 1
            planning["longest_s"] = max(planning["longest_s"], took)

    scheduler.Scheduler._cover = cover  # type: ignore[method-assign]


async def _run(args: argparse.Namespace) -> None:
    calls: collections.Counter[tuple[str, int]] = collections.Counter()
    rows: collections.Counter[tuple[str, int]] = collections.Counter()
    _count_calls(calls, rows)
    planning = {"s": 0.0, "plans": 0, "longest_s": 0.0}
    _time_planning(planning)
    codec = load_codec(args.codec, device="cpu", dtype=torch.float32)
    measured = json.loads(Path(args.replays).read_text()) if args.replays else None
    replays = ReplayTable.from_warmup(measured["modes"]["stateful"]["warmup"]) if measured else None
    engine = simulated_engine(
        codec, cost=SimulatedCost(args.fixed_ms, args.per_frame_ms, replays), max_batch=args.max_batch,
        max_streams=max(args.streams) + 8 if args.mode == "stateful" else 0, hold_lead=args.hold_lead_ms / 1e3,
        prime_hold_lead=args.prime_hold_lead_ms / 1e3,
        edge_batch_limit=args.edge_batch_limit, overlap=args.overlap, edge_lane=args.edge_lane,
    )  # fmt: skip
    settings = ConcurrencySettings(
        streams=tuple(args.streams), seconds=args.seconds, burst=4, stagger=args.stagger, prebuffer_ms=100.0,
        min_emit=4, max_emit=16, ttfa_limit_ms=100.0, timeline=args.out is not None,
        first_call_ms=args.first_call_ms,
    )  # fmt: skip
    try:
        out: dict[str, Any] = await sweep(
            codec, engine, settings, websocket=False, latents=Latents(codec.latent_dim, seed=0),
            budget=Budget(args.budget_s), progress=Progress(len(args.streams), quiet=True), mode=args.mode,
        )  # fmt: skip
    finally:
        await engine.aclose()
    if args.out is not None:
        record = {
            "environment": environment(torch.device("cpu")),
            "what": "simulated device: the engine's scheduling, each call costing the model's time",
            "settings": vars(args),
            "replays": None if measured is None else {"from": args.replays, "device": measured.get("device")},
            "sweep": out,
            "planning": planning,
        }
        Path(args.out).write_text(json.dumps(record, indent=1))
    whole = measured["whole_clip"]["32"]["device_s_per_audio_s"] if measured else None
    for p in out["decoder"]:
        print(
            f"{p['streams']:4d} streams: ok={p['ok']} under-ran {p['streams_with_underruns']}, "
            f"mean batch {p['mean_batch']:.1f}, device busy {p['busy_fraction']:.2f}, "
            f"p99 first audio {p['ttfa_ms']['p99']:.0f} ms"
        )
        if whole and args.mode == "stateful":
            audio_s = p["streams"] * args.seconds
            by_kind = p.get("device_s_by_kind") or {}
            kinds = {k: s / audio_s / whole for k, s in sorted(by_kind.items())}
            # the model's time, not the host's sleeps; on the modelled device with lanes each call's own
            # span, and the total the engine's busy time, their union (as a GPU run reports them)
            modelled = p["busy_fraction"] * p["wall_s"] if args.overlap else sum(by_kind.values())
            total = modelled / audio_s
            print(
                f"      device s per audio s {total:.5f}, {total / whole:.3f}x the whole clip at batch 32 ("
                + ", ".join(f"{k} {v:.3f}" for k, v in kinds.items())
                + ")"
            )
    print(
        f"cover planning under the engine's lock: {planning['s'] * 1e3:.1f} ms in {planning['plans']:.0f} plans, "
        f"the longest {planning['longest_s'] * 1e3:.2f} ms"
    )
    for key in sorted(calls):
        print(
            f"{key[0]:5s} {key[1]:2d} frames: {calls[key]:5d} calls, {rows[key] / calls[key]:6.1f} rows each"
        )


def _rates(text: str) -> tuple[float, float]:
    try:
        main, edge = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected two shares of speed, MAIN,EDGE (e.g. 0.75,0.6), got {text!r}"
        ) from None
    return main, edge


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--streams", type=int, nargs="+", default=[96, 192])
    ap.add_argument("--fixed-ms", type=float, default=6.5)
    ap.add_argument("--per-frame-ms", type=float, default=0.035)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--replays", default=None, help="a bench_stateful.py result: its GPU's replay times")
    ap.add_argument("--hold-lead-ms", type=float, default=DEFAULT_HOLD_LEAD_S * 1e3)
    ap.add_argument(
        "--prime-hold-lead-ms", type=float, default=DEFAULT_PRIME_HOLD_LEAD_S * 1e3, help="primes' own lead"
    )
    ap.add_argument(
        "--mode", choices=("stateful", "halo"), default="stateful",
        help="halo: the streams decode halo windows on the fixed and per-frame cost model (not with --replays)",
    )  # fmt: skip
    ap.add_argument("--first-call-ms", type=float, default=FIRST_CALL_DUE_S * 1e3)
    ap.add_argument("--edge-batch-limit", type=int, default=DEFAULT_EDGE_BATCH_LIMIT)
    ap.add_argument(
        "--overlap", type=_rates, default=None, metavar="MAIN,EDGE",
        help="run the calls on a modelled device whose lanes run at once, each at that share of its speed "
             "while the other lane runs too (the engine waits for them as for a GPU's; default: one call at "
             "a time on the device thread)",
    )  # fmt: skip
    ap.add_argument(
        "--edge-lane",
        action="store_true",
        help="primes and flushes in a lane of their own (with --overlap: beside the steps)",
    )
    ap.add_argument("--stagger", type=float, default=1.0, help="seconds over which the streams start")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--out", default=None, help="write the sweep, with each point's timeline, as JSON here")
    args = ap.parse_args()
    if args.mode == "halo" and args.replays:  # the table prices stateful calls only: it would model nothing
        ap.error(
            "--replays prices stateful steps, primes and flushes; --mode halo uses the fixed and per-frame costs"
        )
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
