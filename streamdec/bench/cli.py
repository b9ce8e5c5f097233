"""``streamdec bench``: tile sizes, tiers, baselines and concurrency, as JSON and PNG plots.

Example (what produced the committed CPU results)::

    streamdec bench --device cpu --threads 1 --max-point-s 20 --out bench/results/cpu --name bench
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from ..codecs.precision import PRECISIONS
from .config import BenchConfig
from .engines import TIERS

__all__ = ["configure_bench", "run_bench", "summary_table"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v for v in text.replace(",", " ").split() if v)
    bad = [n for n in names if n not in TIERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown tier(s) {bad}: pick from {', '.join(TIERS)}")
    return names


def configure_bench(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec bench`` arguments; unset ones take the device's defaults (BenchConfig.for_device)."""
    d = BenchConfig()
    a = parser.add_argument
    from ..codecs.registry import PRESETS

    a("--codec", help=f"a preset ({', '.join(sorted(PRESETS))}) or a checkpoint path "
      "(default: auk-24k on CUDA, tiny on the CPU)")  # fmt: skip
    a("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    a("--dtype", default=d.dtype, choices=("float32", "float16", "bfloat16"))
    a(
        "--precision",
        choices=PRECISIONS,
        help="CUDA convolutions (default fp32; with Triton, fp16x3 on an H100/H200 and tf32x3 are as "
        "accurate and faster)",
    )
    a("--sizes", type=_ints, help=f"emission sizes in frames (default {','.join(map(str, d.sizes))})")
    a(
        "--tiers",
        type=_names,
        help="tiers to sweep, in order (default CUDA: graph,eager,compiled; CPU: eager)",
    )
    a(
        "--compiled-sizes",
        type=_ints,
        default=d.compiled_sizes,
        help="sizes the compiled tier sweeps (slow compile)",
    )
    a("--clip-seconds", type=float, help="clip length for baselines and streaming (default 10, CPU 4)")
    a("--repeats", type=int, help="timed repeats per window size (default 20, CPU 5)")
    a("--warm-calls", type=int, default=d.warm_calls, help="untimed calls before the timed ones")
    a("--ttfa-repeats", type=int, help="streams per size for time to first audio (default 10, CPU 5)")
    a(
        "--max-point-s",
        type=float,
        default=d.max_point_s,
        help="longest a clip-streaming measurement may take; longer ones are estimated",
    )
    a(
        "--xfade-frames",
        type=int,
        default=d.xfade_frames,
        help="crossfade baseline overlap (capped at the chunk)",
    )
    a("--seed-tile", type=int, default=d.seed_tile, help="the seed approach's tile, frames")
    a("--streams", type=_ints, help="concurrency sweep, streams (default CUDA 1..128, CPU 1,2,3,4,6,8)")
    a("--conc-seconds", type=float, default=d.conc_seconds, help="length of each real-time stream")
    a(
        "--burst",
        type=int,
        default=d.burst,
        help="frames per latent chunk; chunks arrive at the codec frame rate",
    )
    a("--stagger", type=float, default=d.stagger, help="stream starts spread over this many seconds")
    a("--prebuffer-ms", type=float, default=d.prebuffer_ms, help="listener prebuffer before playback starts")
    a("--conc-min-emit", type=int, default=d.conc_min_emit, help="concurrency policy: first tile")
    a("--conc-max-emit", type=int, default=d.conc_max_emit, help="concurrency policy: largest tile")
    a("--conc-tier", choices=TIERS, help="tier serving the concurrency sweep (default CUDA graph, CPU eager)")
    a(
        "--batch-buckets",
        type=_ints,
        default=d.batch_buckets,
        help="GPU batch buckets for the concurrency sweep",
    )
    a(
        "--ttfa-limit-ms",
        type=float,
        default=d.ttfa_limit_ms,
        help="p99 time to first audio a passing N must meet",
    )
    a("--no-baselines", dest="baselines", action="store_false")
    a("--no-concurrency", dest="concurrency", action="store_false")
    a("--no-websocket", dest="websocket", action="store_false", help="concurrency through StreamDecoder only")
    a(
        "--budget-s",
        type=float,
        help="wall-clock budget: the default sweep shrinks to fit it, and points that still do not fit are "
        "skipped and listed (never an error)",
    )
    a(
        "--compile-estimate-s",
        type=float,
        default=d.compile_estimate_s,
        help="assumed cost of the first compile",
    )
    a("--threads", type=int, help="torch CPU threads (default: torch's)")
    a("--seed", type=int, default=d.seed)
    a("--out", default=d.out, help="output folder (default bench/results)")
    a("--name", help="file stem (default <date>-<device>-bench)")
    a("--no-plots", dest="plots", action="store_false")
    a("--quiet", action="store_true", help="no progress bar")
    a("--replot", metavar="JSON", help="only redraw the plots of an existing result file, beside it")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The run's settings: what the user gave, else the device's defaults shrunk to fit ``--budget-s``."""
    from ..cli import check_device

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    values: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(BenchConfig)}
    values.update(BenchConfig.for_device(device))
    given = {f.name for f in dataclasses.fields(BenchConfig) if getattr(args, f.name, None) is not None}
    for name in given - {"device"}:
        values[name] = getattr(args, name)
    values["device"] = device
    if values["budget_s"] is not None:
        values.update(fit_budget(values, values["budget_s"], keep=given))
    return BenchConfig(**values)


#: about how long the full default sweep takes with an idle device, in seconds (CPU: tiny, 1 thread)
_NOMINAL_S = {"cpu": 600.0, "cuda": 900.0}


#: which emission sizes a short run keeps first: a small and a large tile, then the ends, then the rest
_SIZE_ORDER = (8, 64, 1, 256, 16, 4, 128, 32, 2)


def _size_priority(size: int) -> int:
    return _SIZE_ORDER.index(size) if size in _SIZE_ORDER else len(_SIZE_ORDER) + size


def fit_budget(
    values: dict[str, Any], budget_s: float, keep: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    """Smaller defaults for a run that must fit ``budget_s`` seconds: fewer sizes, a shorter clip, fewer
    repeats and stream counts. Settings the user gave (``keep``) stay. The budget still guards each point,
    so a slow device skips points (listed in the result) instead of running over; nothing fails.
    """
    share = budget_s / _NOMINAL_S["cuda" if str(values["device"]).startswith("cuda") else "cpu"]
    if share >= 1:
        return {}
    sizes = tuple(values["sizes"])
    count = max(2, round(len(sizes) * share * 2))
    smaller: dict[str, Any] = {
        "sizes": tuple(sorted(sorted(sizes, key=_size_priority)[:count])),
        "clip_seconds": round(max(1.0, min(values["clip_seconds"], values["clip_seconds"] * share * 2)), 1),
        "repeats": max(3, min(values["repeats"], round(values["repeats"] * share * 2))),
        "ttfa_repeats": max(2, min(values["ttfa_repeats"], round(values["ttfa_repeats"] * share * 2))),
        "streams": tuple(values["streams"])[: max(1, round(len(values["streams"]) * share))],
        "conc_seconds": round(max(1.0, min(values["conc_seconds"], values["conc_seconds"] * share * 2)), 1),
        "max_point_s": min(values["max_point_s"], max(1.0, budget_s / 20)),
    }
    if budget_s < 4 * values["compile_estimate_s"]:
        smaller["tiers"] = tuple(t for t in values["tiers"] if t != "compiled") or ("eager",)
    return {k: v for k, v in smaller.items() if k not in keep}


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _snr(error: dict[str, Any]) -> str:
    return "exact" if error.get("bit_exact") else f"{_fmt(error.get('snr_db'))} dB"


def summary_table(result: dict[str, Any]) -> str:
    """A short plain-text digest of a result (the full figures are in the JSON)."""
    lines = [f"codec {result['meta']['codec']['name']} on {result['meta']['device_name']}"]
    lines.append(
        f"{'tier':<9}{'emit':>5}{'window':>7}{'p50 ms':>9}{'p99 ms':>9}{'ttfa p50':>9}{'vs whole':>9}{'us/frame':>10}"
    )
    for tier in result["tiles"]["tiers"]:
        for p in tier["points"]:
            s = p["stream"]
            lines.append(
                f"{tier['tier']:<9}{p['emit_frames']:>5}{p['window_frames']:>7}{_fmt(p['window_ms']['p50']):>9}"
                f"{_fmt(p['window_ms']['p99']):>9}{_fmt(p['ttfa_ms']['p50']):>9}{_fmt(s.get('vs_whole'), '.2f'):>9}"
                f"{_fmt(s.get('us_per_emitted_frame'), '.0f'):>10}"
            )
    base = result.get("baselines") or {}
    if base:
        lines.append(
            f"whole clip {base['whole']['frames']} frames: {_fmt(base['whole']['decode_ms']['p50'])} ms"
        )
        for key in ("naive", "crossfade"):
            for row in base.get(key) or []:
                e = row["error"]
                lines.append(
                    f"{key:<9} chunk {row['chunk_frames']:>4}: {_fmt(row['decode_ms']['p50'])} ms, "
                    f"SNR {_snr(e)}, click {_fmt(e['click_energy_db'])} dB"
                )
    conc = result.get("concurrency") or {}
    for name in ("decoder", "websocket"):
        for p in conc.get(name) or []:
            lines.append(
                f"{name:<9} N={p['streams']:>4}: ttfa p50 {_fmt(p['ttfa_ms']['p50'])} p99 {_fmt(p['ttfa_ms']['p99'])} ms, "
                f"underruns {p['underrun_events']} ({p['streams_with_underruns']} streams), "
                f"busy {_fmt(p['busy_fraction'], '.2f')}, util {_fmt(p['gpu_util_pct'], '.0f')}%"
            )
    if conc:
        lines.append(f"max streams (p99 ttfa <= limit, no underruns): {conc.get('max_streams')}")
    for err in result.get("errors", []):
        lines.append(f"ERROR in {err['section']}: {err['error']}")
    for skip in result.get("skipped", []):
        lines.append(f"skipped: {skip}")
    return "\n".join(lines)


def _replot(path: Path) -> int:
    from .plots import write_plots

    result = json.loads(path.read_text())
    written = write_plots(result, path.with_suffix(""))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def run_bench(args: argparse.Namespace) -> int:
    """Run ``streamdec bench``; prints a digest and the files written. Exit 1 if a section failed (an
    error, not a point the budget skipped)."""
    if args.replot:
        return _replot(Path(args.replot))
    from .runner import run

    cfg = config_from_args(args)
    if cfg.budget_s is not None:
        print(f"budget {cfg.budget_s:g} s: sizes {','.join(map(str, cfg.sizes))}, {cfg.clip_seconds:g} s clip, "
              f"{cfg.repeats} repeats, streams {','.join(map(str, cfg.streams))}; tiers {','.join(cfg.tiers)}")  # fmt: skip
    result = asyncio.run(run(cfg, quiet=args.quiet))
    print(summary_table(result))
    print(f"wrote {result['json']}" + "".join(f", {p}" for p in result.get("plots", [])))
    if result["skipped"]:
        print(
            f"{len(result['skipped'])} points did not fit the budget (listed above and in the JSON's 'skipped')"
        )
    return 1 if result["errors"] else 0
