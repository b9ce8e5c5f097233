"""Every fused alias-free activation call of a stateful step and of a whole-clip decode, kernel beside kernel.

One run records the activation kernel's launches (``_triton_alias_free.launch_blocked``, operands
cloned) in one eager step of each ``--buckets`` bucket (streams x frames, live rows anywhere in the pool)
and one decode of each ``--whole`` clip (batch x frames), grouped by shape (``count`` calls have it).
Each distinct call is then run by every ``--variants`` kernel on the same random inputs: its outputs and
peaks must equal the first variant's (``bits_equal``; ``max_abs_diff`` says by how much where not), and
it is timed as ten calls captured in one CUDA graph, replays timed with CUDA events after a warm-up,
median of ``--reps`` (:func:`streamdec.bench.stats.graph_ms`). Per workload it sums the calls' time for
each variant and the byte floor (each input and output sample read or written once at the card's copy
rate)::

    python3 scripts/bench_activation.py --buckets 256x4 --whole 16x70 --out activation-halo.json

The first variant (``blocked``, the kernel before ``halo``) is the reference for bits and time.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_step import parse_bucket

from streamdec.bench.meta import ResultFile, script_header
from streamdec.bench.stats import graph_ms, median_ms
from streamdec.codecs import load_codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool
from streamdec.kernels import _triton_alias_free as tk

# (x, filt, a, b, out, peak, head, start): launch_blocked's positional arguments as the ops pass them
Call = tuple[Any, ...]


def record_calls(work: Callable[[], Any]) -> list[tuple[Call, int]]:
    """The activation launches one run of ``work`` makes, one per distinct shape (operands cloned), with
    counts."""
    original = tk.launch_blocked
    signature = inspect.signature(original)
    found: dict[tuple[Any, ...], list[Any]] = {}

    def spy(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = tuple(bound.arguments[name] for name in list(signature.parameters)[:8])
        key = tuple((tuple(a.shape), a.stride()) if isinstance(a, Tensor) else a for a in call)
        if key in found:
            found[key][1] += 1
        else:
            found[key] = [tuple(a.clone() if isinstance(a, Tensor) else a for a in call), 1]
        original(*args, **kwargs)

    tk.launch_blocked = spy
    try:
        work()
        torch.cuda.synchronize()
    finally:
        tk.launch_blocked = original
    return [(call, count) for call, count in found.values()]


def describe(call: Call) -> dict[str, Any]:
    x, _, a, _, out, peak, head, start = call
    return {
        "rows": x.shape[0], "channels": a.shape[0], "x_len": x.shape[1], "outputs": out.shape[1],
        "head_len": 0 if head is None else head.shape[-1], "start": start or 0, "peak": peak is not None,
    }  # fmt: skip


def randomize(call: Call, gen: torch.Generator) -> Call:
    """The call with fresh random samples (scaled like activations) and history, NaN-poisoned outputs."""
    x, filt, a, b, out, peak, head, start = call
    x.copy_(torch.randn(x.shape, device=x.device, generator=gen) * 3)
    if head is not None:
        head.copy_(torch.randn(head.shape, device=head.device, generator=gen) * 3)
    return x, filt, a, b, torch.full_like(out, float("nan")), peak, head, start


def measure(call: Call, variants: list[str], reps: int, gen: torch.Generator) -> dict[str, Any]:
    x, filt, a, b, out, peak, head, start = randomize(call, gen)
    row = describe(call)
    results: dict[str, tuple[Tensor, Tensor | None]] = {}
    for variant in variants:
        y = torch.full_like(out, float("nan"))
        p = None if peak is None else torch.zeros_like(peak)
        launch = functools.partial(tk.launch_blocked, x, filt, a, b, y, p, head, start or 0, variant=variant)
        launch()
        torch.cuda.synchronize()
        results[variant] = (y.clone(), None if p is None else p.clone())
        row[f"{variant}_ms"] = graph_ms(launch, calls=10, reps=reps)
    ref_y, ref_p = results[variants[0]]
    for variant, (y, p) in results.items():
        same = torch.equal(y, ref_y) and (p is None or (ref_p is not None and torch.equal(p, ref_p)))
        row[f"{variant}_bits_equal"] = bool(same)
        row[f"{variant}_max_abs_diff"] = float((y - ref_y).abs().max()) if y.numel() else 0.0
        row[f"{variant}_finite"] = bool(torch.isfinite(y).all())
    row["plan"] = tk.halo_plan(x.shape[0] // a.shape[0], a.shape[0], out.shape[1])._asdict()
    row["bytes"] = 4 * (x.numel() + (0 if head is None else head.numel()) + out.numel())
    return row


def copy_bandwidth() -> float:
    src = torch.randn(256 * 1024 * 1024, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10, warm=2)
    return 2 * src.numel() * 4 / (ms * 1e-3)


def workloads(codec: Any, buckets: list[str], whole: list[str]) -> list[tuple[str, Callable[[], Any]]]:
    """``(name, one run)`` of each bucket's eager stateful step and each whole clip's eager decode."""
    steps = [parse_bucket(text) for text in buckets]
    gen = torch.Generator(device="cuda").manual_seed(0)
    out: list[tuple[str, Callable[[], Any]]] = []
    if steps:
        net = StatefulNet(codec)
        slots = max(batch for batch, _ in steps)
        pool = StatePool(net, slots, device=torch.device("cuda"), dtype=torch.float32)
        pool.prime(
            torch.arange(slots, device="cuda"),
            torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device="cuda", generator=gen),
        )
        for batch, frames in steps:
            index = torch.randperm(slots, device="cuda", generator=gen)[:batch]
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda", generator=gen)
            out.append((f"{batch}x{frames}", functools.partial(pool.step, index, z)))
    for batch, frames in (parse_bucket(text) for text in whole):
        z = torch.randn(batch, frames, codec.latent_dim, device="cuda", generator=gen)
        out.append((f"whole {batch}x{frames}", functools.partial(codec.decode, z)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--buckets", nargs="*", default=["256x4"], help="stateful steps, streams x frames")
    ap.add_argument("--whole", nargs="*", default=["16x70"], help="whole-clip decodes, batch x frames")
    ap.add_argument(
        "--variants", nargs="+", default=["blocked", "halo", "halo8", "halo16"], choices=tk.VARIANTS
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="activation-halo.json")
    args = ap.parse_args()

    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    precision = codec.use_auto_precision()
    header = script_header(codec=args.codec, precision=precision, commit=args.commit, timing="cuda graphs")
    out = ResultFile(
        args.out, {**header, "args": vars(args), "copy_bytes_per_s": copy_bandwidth(), "workloads": []}
    )
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode(), codec.numerics():
        for name, work in workloads(codec, args.buckets, args.whole):
            rows = []
            for call, count in record_calls(work):
                row = {"count": count, **measure(call, args.variants, args.reps, gen)}
                rows.append(row)
                times = "  ".join(f"{v} {row[f'{v}_ms'] * 1e3:.1f}" for v in args.variants)
                same = all(row[f"{v}_bits_equal"] for v in args.variants)
                print(f"{name} {row['rows']}x{row['outputs']} (head {row['head_len']}, start {row['start']}, "
                      f"peak {row['peak']}) n={count}: us {times}; bits equal {same}", flush=True)  # fmt: skip
                torch.cuda.empty_cache()
            summary: dict[str, Any] = {
                "workload": name,
                "calls": sum(r["count"] for r in rows),
                "layers": rows,
            }
            for v in args.variants:
                summary[f"{v}_ms"] = sum(r[f"{v}_ms"] * r["count"] for r in rows)
            summary["bits_equal"] = all(r[f"{v}_bits_equal"] for r in rows for v in args.variants)
            summary["max_abs_diff"] = max(r[f"{v}_max_abs_diff"] for r in rows for v in args.variants)
            summary["floor_ms"] = (
                sum(r["bytes"] * r["count"] for r in rows) / out.result["copy_bytes_per_s"] * 1e3
            )
            out.result["workloads"].append(summary)
            out.save()
            line = "  ".join(f"{v} {summary[f'{v}_ms']:.3f}" for v in args.variants)
            print(f"{name}: activations ms {line}; floor {summary['floor_ms']:.3f}; bits equal "
                  f"{summary['bits_equal']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
