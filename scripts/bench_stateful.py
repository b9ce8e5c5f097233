"""Streams per GPU, stateful against halo windows, in one run: real-time streams through StreamDecoder.

Each stream is a clip of random latents arriving in real time in ``--burst``-frame chunks; starts are
spread over ``--stagger`` seconds. A point holds when every stream plays (p99 time to first audio within
``--ttfa-limit-ms`` from the chunk that makes its first audio decodable, no underrun of a listener that
starts ``--prebuffer-ms`` after its first audio). For each mode: warm-up time, graphs, graph memory, state
memory, then the sweep; then the device time per second of streamed audio against a whole-clip decode of
the same audio at the same batch.

    python3 scripts/bench_stateful.py --codec auk-24k --streams 64,128,256,384,512,640 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch

from streamdec.bench.common import Budget, Latents, Progress
from streamdec.bench.concurrency import ConcurrencySettings, sweep
from streamdec.bench.meta import ResultFile, script_header
from streamdec.codecs import load_codec
from streamdec.engine import DecodeEngine
from streamdec.engine.core import (
    DEFAULT_EDGE_BATCH_LIMIT,
    DEFAULT_HOLD_LEAD_S,
    DEFAULT_LAUNCH_INTERVAL_S,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_PRIME_HOLD_LEAD_S,
)
from streamdec.session import FIRST_CALL_DUE_S
from streamdec.streaming import StreamDecoder


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


#: the modes a run may name: the decoder's two, and stateful with one engine setting changed
_MODES = ("stateful", "halo", "stateful-one-lane", "stateful-common-lead")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--streams", type=_ints, default=(64, 128, 256, 384, 512, 640))
    ap.add_argument(
        "--modes", default="stateful,halo",
        help="stateful, halo, stateful-one-lane (primes and flushes on the steps' CUDA stream) and "
             "stateful-common-lead (primes held to --hold-lead-ms, as every other call, instead of their "
             "own --prime-hold-lead-ms)",
    )  # fmt: skip
    ap.add_argument("--halo-streams", type=_ints, default=(16, 32, 64, 96, 128))
    ap.add_argument("--seconds", type=float, default=6.0, help="audio per stream")
    ap.add_argument("--burst", type=int, default=4, help="frames per chunk")
    ap.add_argument("--stagger", type=float, default=1.0)
    ap.add_argument("--prebuffer-ms", type=float, default=100.0)
    ap.add_argument("--ttfa-limit-ms", type=float, default=100.0)
    ap.add_argument("--min-emit", type=int, default=4)
    ap.add_argument("--max-emit", type=int, default=16, help="stateful: largest step; halo: largest tile")
    ap.add_argument("--halo-max-emit", type=int, default=16)
    ap.add_argument("--batch-buckets", type=_ints, default=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument(
        "--edge-batch-limit", type=int, default=DEFAULT_EDGE_BATCH_LIMIT,
        help="the largest batch of stateful primes and flushes (the engine's edge_batch_limit)",
    )  # fmt: skip
    ap.add_argument(
        "--hold-lead-ms", type=float, default=DEFAULT_HOLD_LEAD_S * 1e3,
        help="how long before a deadline held work must be done (the engine's hold_lead)",
    )  # fmt: skip
    ap.add_argument(
        "--prime-hold-lead-ms", type=float, default=DEFAULT_PRIME_HOLD_LEAD_S * 1e3,
        help="how long before its deadline a held prime must be done (the engine's prime_hold_lead; mode "
             "stateful-common-lead uses --hold-lead-ms)",
    )  # fmt: skip
    ap.add_argument(
        "--launch-interval-ms", type=float, default=DEFAULT_LAUNCH_INTERVAL_S * 1e3,
        help="the shortest time between two launch rounds (the engine's launch_interval)",
    )  # fmt: skip
    ap.add_argument(
        "--first-call-ms", type=float, default=FIRST_CALL_DUE_S * 1e3,
        help="how long after it is submitted a stream's first call is due (StreamDecoder's first_call_due)",
    )  # fmt: skip
    ap.add_argument(
        "--max-inflight", type=int, default=DEFAULT_MAX_INFLIGHT,
        help="replays queued on the device at once (the engine's max_inflight)",
    )  # fmt: skip
    ap.add_argument(
        "--timeline", action="store_true",
        help="record each point's device calls and underruns on one clock (device_calls_at, underruns_at)",
    )  # fmt: skip
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    unknown = sorted(set(args.modes.split(",")) - set(_MODES))
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(_MODES)}")
    asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> None:
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    precision = codec.use_auto_precision() if args.precision == "auto" else args.precision
    if args.precision != "auto":
        codec.precision = precision
    header = script_header(
        codec=args.codec, precision=precision, commit=None, timing="wall clock per stream; engine CUDA events"
    )
    result = ResultFile(
        args.out, {**header, "settings": vars(args) | {"streams": list(args.streams)}, "modes": {}}
    )
    budget = Budget(args.budget_s)
    latents = Latents(codec.latent_dim, seed=0)
    for name in args.modes.split(","):
        mode = "stateful" if name.startswith("stateful") else name
        streams = args.streams if mode == "stateful" else args.halo_streams
        max_emit = args.max_emit if mode == "stateful" else args.halo_max_emit
        settings = ConcurrencySettings(
            streams=streams, seconds=args.seconds, burst=args.burst, stagger=args.stagger,
            prebuffer_ms=args.prebuffer_ms, min_emit=args.min_emit, max_emit=max_emit,
            ttfa_limit_ms=args.ttfa_limit_ms, timeline=args.timeline, first_call_ms=args.first_call_ms,
        )  # fmt: skip
        slots = max(streams) + 8 if mode == "stateful" else 0
        engine = DecodeEngine(
            codec, compile=False, max_streams=slots, batch_buckets=args.batch_buckets,
            hold_lead=args.hold_lead_ms / 1e3, edge_batch_limit=args.edge_batch_limit,
            prime_hold_lead=(args.hold_lead_ms if name == "stateful-common-lead" else args.prime_hold_lead_ms) / 1e3,
            max_inflight=args.max_inflight, launch_interval=args.launch_interval_ms / 1e3,
            edge_lane=False if name == "stateful-one-lane" else None,
        )  # fmt: skip
        entry: dict[str, Any] = {}
        result.result["modes"][name] = entry
        try:
            decoder = StreamDecoder(
                codec, mode=mode, min_emit=args.min_emit, max_emit=max_emit, engine=engine,
                first_call_due=args.first_call_ms / 1e3,
            )  # fmt: skip
            began = time.perf_counter()
            report = await decoder.warmup()
            entry["warmup"] = {
                "seconds": time.perf_counter() - began,
                "graphs": report.graphs,
                "graph_memory_gib": report.graph_memory_bytes / 2**30,
                "state_memory_gib": engine.state_memory_bytes() / 2**30,
                "state_bytes_per_stream": engine.net.state_bytes() if engine.net is not None else 0,
                "failed": list(report.failed),
                "replay_ms": engine.step_replay_ms(),
                "empty_replay_ms": engine.step_empty_ms(),
            }
            decoder.freeze()
            result.save()
            progress = Progress(len(streams), quiet=True)
            entry["sweep"] = await sweep(
                codec, engine, settings, websocket=False, latents=latents, budget=budget,
                progress=progress, mode=mode,
            )  # fmt: skip
            result.save()
            entry["device_per_audio_second"] = _device_cost(entry["sweep"], codec, args.seconds)
            result.save()
        finally:
            await engine.aclose()
            torch.cuda.empty_cache()
    result.result["whole_clip"] = _whole_clip_cost(codec, result.result["modes"])
    _against_whole_clip(result.result)
    result.save()
    for line in _summary(result.result):
        print(line, flush=True)


def _summary(result: dict[str, Any]) -> list[str]:
    """One line per mode and point: what held, and the device time against a whole clip at batch 32."""
    lines = []
    for mode, entry in result["modes"].items():
        costs = {row["streams"]: row for row in entry.get("device_per_audio_second", [])}
        for point in (entry.get("sweep") or {}).get("decoder", []):
            verdict = "holds" if point.get("ok") else "fails"
            parts = [f"bench_stateful: {mode} {point['streams']} streams: {verdict}"]
            ttfa = (point.get("ttfa_ms") or {}).get("p99")
            if ttfa is not None:
                parts.append(f"p99 first audio {ttfa:.1f} ms")
            parts.append(f"{point.get('streams_with_underruns', 0)} streams under-ran")
            parts.append(f"busy {100 * (point.get('busy_fraction') or 0):.1f} %")
            parts.append(f"mean batch {point.get('mean_batch') or 0:.1f}")
            cost = costs.get(point["streams"]) or {}
            against = cost.get("over_whole_clip", {}).get("32")
            if against:
                kinds = ", ".join(f"{kind} {v:.3f}" for kind, v in against.items() if kind != "all")
                parts.append(
                    f"{cost['device_s_per_audio_s']:.5f} device s per audio s, {against['all']:.2f}x a whole clip "
                    f"at batch 32 ({kinds})"
                )
            lines.append(", ".join(parts))
    return lines


def _device_cost(sweep_out: dict[str, Any], codec: Any, seconds: float) -> list[dict[str, Any]]:
    """Engine device seconds per second of streamed audio at each point, with the mean batch, and split
    by kind of call (primes, steps, flushes) where the calls were timed."""
    rows = []
    for point in sweep_out["decoder"]:
        audio_s = point["streams"] * seconds
        busy = point.get("busy_fraction") or 0.0
        by_kind = point.get("device_s_by_kind") or {}
        rows.append({
            "streams": point["streams"],
            "device_s_per_audio_s": busy * point["wall_s"] / audio_s,
            "by_kind": {kind: device_s / audio_s for kind, device_s in by_kind.items()},
            "mean_batch": point.get("mean_batch"),
        })  # fmt: skip
    return rows


def _against_whole_clip(result: dict[str, Any]) -> None:
    """Each point's device time per audio second over a whole-clip decode's at batch 8 and 32, in all
    and by kind of call: the figure the stateful mode is held to."""
    whole = result["whole_clip"]
    for entry in result["modes"].values():
        for row in entry.get("device_per_audio_second", []):
            row["over_whole_clip"] = {
                batch: {
                    "all": row["device_s_per_audio_s"] / w["device_s_per_audio_s"],
                    **{kind: v / w["device_s_per_audio_s"] for kind, v in row["by_kind"].items()},
                }
                for batch, w in whole.items()
                if batch != "1"
            }


def _whole_clip_cost(codec: Any, modes: dict[str, Any]) -> dict[str, Any]:
    """Device seconds per second of audio of a whole-clip decode (eager, CUDA events) at batch 1, 8, 32."""
    out = {}
    frames = 250
    audio_s = frames * codec.hop_size / codec.sample_rate
    for batch in (1, 8, 32):
        z = torch.randn(batch, frames, codec.latent_dim, device="cuda")
        codec.decode(z)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(3):
            start.record()
            codec.decode(z)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        out[str(batch)] = {"device_s_per_audio_s": times[1] / (batch * audio_s), "frames": frames}
        del z
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    main()
