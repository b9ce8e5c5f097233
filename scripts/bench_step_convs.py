"""Every float16 split convolution of a stateful step, at its default launch and at each alternative (a CUDA GPU).

The launch rules in :mod:`streamdec.kernels.f16_launch` were swept on whole-clip decodes (16 x 70, 1 x 70);
a stateful step hands the convolution other shapes: hundreds of short rows, packed. This script runs one
eager step of each ``--buckets`` bucket (streams x frames, live rows anywhere in the pool) and records
every top-level call of the convolution kernel with its operands already split, grouped by shape
(``count`` calls of the step have that shape). Each distinct call is then timed at the default launch
and at every ``--tiles`` x packing x split-K choice the call can take: the call captured five times in
one CUDA graph, replays timed with CUDA events after a warm-up, median of ``--reps``
(:func:`streamdec.bench.stats.graph_ms`). Every alternative must give the default's bits
(``bits_equal``). Per bucket it sums the step's convolution time at the default launches and at the
best launch of each call, so the gain a better planner could make shows::

    python3 scripts/bench_step_convs.py --codec auk-24k --buckets 256x4 512x4 --out step-convs.json

The baseline is the Triton kernel with the output channels along the GEMM's M. ``--variants`` also times
each call with the warp-specialized Gluon kernel at the same launch (``specialized``) and with the output
channels along N (``channels_n``, layers of up to ``--channels-n-max`` channels), and checks their bits
against the baseline; ``planned_ms`` sums what the planner picks now. ``--whole 16x70 1x70`` adds the calls of
whole-clip decodes; ``--tiles`` with no value skips the launch sweep, and ``--tiles-kernel specialized``
runs the sweep's launches on the warp-specialized kernel::

    python3 scripts/bench_step_convs.py --buckets 256x4 512x4 --whole 16x70 1x70 --tiles --variants specialized
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_step import parse_bucket

from streamdec.bench.meta import ResultFile, script_header
from streamdec.bench.stats import graph_ms
from streamdec.codecs import load_codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool
from streamdec.kernels import _triton_conv_f16 as t16
from streamdec.kernels import f16_launch
from streamdec.kernels._triton_conv import launch_sms
from streamdec.kernels.f16_launch import Tiles, channels_as_n

Call = tuple[tuple[Any, ...], dict[str, Any]]


def record_calls(step: Callable[[], Any]) -> list[tuple[Call, int]]:
    """The convolution calls one run of ``step`` makes (operands cloned), one per distinct shape, with counts.
    A transposed layer's call (``phases`` > 1) is recorded once, not again for the plain call it makes."""
    original = t16.conv1d_f16x3
    found: dict[tuple[Any, ...], list[Any]] = {}
    depth = 0

    def spy(*args: Any, **kwargs: Any) -> Tensor:
        nonlocal depth
        if depth == 0:
            key = tuple(
                (tuple(a.shape), a.dtype) if isinstance(a, Tensor) else a for a in args
            ) + tuple(sorted((k, (tuple(v.shape), v.dtype) if isinstance(v, Tensor) else v)
                             for k, v in kwargs.items()))  # fmt: skip
            if key in found:
                found[key][1] += 1
            else:
                clone = tuple(a.clone() if isinstance(a, Tensor) else a for a in args)
                kw = {k: v.clone() if isinstance(v, Tensor) else v for k, v in kwargs.items()}
                found[key] = [(clone, kw), 1]
        depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth -= 1

    t16.conv1d_f16x3 = spy
    try:
        step()
        torch.cuda.synchronize()
    finally:
        t16.conv1d_f16x3 = original
    return [(call, count) for call, count in found.values()]


def describe(call: Call) -> dict[str, Any]:
    args, kwargs = call
    x_hi, w_hi, dilation = args[0], args[3], args[7]
    batch, tin, cp = x_hi.shape
    ksize, cout, _ = w_hi.shape
    tout = tin - (ksize - 1) * dilation
    launch = f16_launch.plan(
        batch=batch, padded_channels=cp, cout=cout, tout=tout, ksize=ksize, sms=launch_sms(x_hi.device)
    )
    return {
        "x": [batch, tin, cp], "w": [ksize, cout, cp], "dil": dilation, "tout": tout,
        "phases": kwargs.get("phases", 1), "residual": kwargs.get("residual") is not None,
        "default": launch._asdict(),
    }  # fmt: skip


#: kernel variants timed beside the Triton kernel with the output channels along M (``--variants``)
VARIANTS: dict[str, dict[str, Any]] = {
    # the warp-specialized Gluon kernel, same launch
    "specialized": {"specialized": True, "channels_n": False},
    "channels_n": {"channels_n": True},  # the output channels along the GEMM's N
}


def measure(
    call: Call,
    tiles: list[Tiles],
    reps: int,
    variants: Sequence[str] = (),
    channels_n_max: int = 192,
    channels_n_tiles: Sequence[Tiles] = (),
    tiles_specialized: bool = False,
) -> dict[str, Any]:
    args, kwargs = call

    def run(**launch: Any) -> Tensor:
        return t16.conv1d_f16x3(*args, **kwargs, **launch)

    base = {"specialized": False, "channels_n": False}
    default = run(**base)
    row = describe(call)
    row["ms"] = graph_ms(lambda: run(**base), reps=reps)
    for name in variants:
        if name == "channels_n" and row["w"][1] > channels_n_max:
            continue
        flags = VARIANTS[name]
        row[f"{name}_bits_equal"] = bool(torch.equal(run(**flags), default))
        row[f"{name}_ms"] = graph_ms(lambda flags=flags: run(**flags), reps=reps)
    variants = []
    sweep = {**base, "specialized": tiles_specialized}  # the kernel the launch sweep runs
    for tile in tiles:
        for pack in (True, False):
            for split in (False, True):
                launch = {"tiles": tile, "pack": pack, "split": split, **sweep}
                try:
                    y = run(**launch)
                except Exception as e:  # a launch this call cannot take (shared memory, registers)
                    variants.append(
                        {"tiles": list(tile), "pack": pack, "split": split, "error": repr(e)[:160]}
                    )
                    continue
                variants.append({
                    "tiles": list(tile), "pack": pack, "split": split, "specialized": tiles_specialized,
                    "bits_equal": bool(torch.equal(y, default)),
                    "ms": graph_ms(lambda launch=launch: run(**launch), reps=reps),
                })  # fmt: skip
    if row["w"][1] <= channels_n_max:  # the channels-along-N kernel at other tiles (samples x channels)
        for tile in channels_n_tiles:
            launch = {"tiles": tile, "channels_n": True}
            try:
                y = run(**launch)
            except Exception as e:  # shared memory or registers
                variants.append({"tiles": list(tile), "channels_n": True, "error": repr(e)[:160]})
                continue
            variants.append({
                "tiles": list(tile), "channels_n": True, "pack": False, "split": False,
                "bits_equal": bool(torch.equal(y, default)),
                "ms": graph_ms(lambda launch=launch: run(**launch), reps=reps),
            })  # fmt: skip
    row["variants"] = variants
    timed = [v for v in variants if "ms" in v]
    row["best"] = min(timed, key=lambda v: v["ms"]) if timed else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--buckets", nargs="+", default=["256x4"], help="streams x frames")
    ap.add_argument(
        "--tiles", nargs="*",
        default=["128,128,8,3", "128,64,8,3", "64,128,4,3", "64,128,4,4", "64,64,4,3", "64,64,4,5", "64,32,4,4"],
        help="launch shapes to time besides the default: block_m,block_n,warps,stages",
    )  # fmt: skip
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--variants", nargs="*", default=[], choices=sorted(VARIANTS),
        help="also time every call with these kernels and check their bits against the baseline: specialized "
        "(the warp-specialized Gluon kernel, same launch), channels_n (output channels along N, layers up to "
        "--channels-n-max)",
    )  # fmt: skip
    ap.add_argument("--channels-n-max", type=int, default=192)
    ap.add_argument(
        "--tiles-kernel", choices=("triton", "specialized"), default="triton",
        help="the kernel the --tiles launches run: the Triton kernel, or the warp-specialized Gluon one",
    )  # fmt: skip
    ap.add_argument(
        "--channels-n-tiles", nargs="*", default=[],
        help="channels-along-N launches to time besides the planned one: block_t,block_o,warps,stages",
    )  # fmt: skip
    ap.add_argument(
        "--whole", nargs="*", default=[], help="whole-clip decodes to record as well, batch x frames (16x70)"
    )
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="step-convs.json")
    args = ap.parse_args()

    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    precision = codec.use_auto_precision()
    header = script_header(codec=args.codec, precision=precision, commit=args.commit, timing="cuda graphs")
    out = ResultFile(args.out, {**header, "args": vars(args), "buckets": []})
    tiles = [Tiles(*map(int, spec.split(","))) for spec in args.tiles]
    cn_tiles = [Tiles(*map(int, spec.split(","))) for spec in args.channels_n_tiles]
    buckets = [parse_bucket(b) for b in args.buckets]
    net = StatefulNet(codec)
    slots = max(b for b, _ in buckets)
    cuda = torch.device("cuda")
    pool = StatePool(net, slots, device=cuda, dtype=torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode(), codec.numerics():
        pool.prime(
            torch.arange(slots, device="cuda"),
            torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device="cuda", generator=gen),
        )
        workloads = []
        for batch, frames in buckets:
            index = torch.randperm(slots, device="cuda", generator=gen)[:batch]
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda", generator=gen)
            workloads.append((f"{batch}x{frames}", functools.partial(pool.step, index, z)))
        for batch, frames in (parse_bucket(w) for w in args.whole):
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda", generator=gen)
            workloads.append((f"whole {batch}x{frames}", functools.partial(codec.decode, z)))
        for name, work in workloads:
            rows = []
            for call, count in record_calls(work):
                row = {
                    "count": count,
                    **measure(
                        call,
                        tiles,
                        args.reps,
                        args.variants,
                        args.channels_n_max,
                        cn_tiles,
                        tiles_specialized=args.tiles_kernel == "specialized",
                    ),
                }
                rows.append(row)
                best = row["best"]
                extra = "".join(
                    f" {v} {row[v + '_ms']:.4f} ms bits_equal={row[v + '_bits_equal']}"
                    for v in args.variants if v + "_ms" in row
                )  # fmt: skip
                print(
                    f"{name} x{row['x']} w{row['w']} d={row['dil']} p={row['phases']} n={count} "
                    f"default {row['ms']:.4f} ms ({row['default']['block_m']}x{row['default']['block_n']}"
                    f" rows={row['default']['rows']} split={row['default']['split']}){extra} best "
                    f"{best and round(best['ms'], 4)} {best and (best['tiles'], best['pack'], best['split'])} "
                    f"bits_equal={all(v.get('bits_equal', True) for v in row['variants'])}",
                    flush=True,
                )
                torch.cuda.empty_cache()
            default_ms = sum(r["ms"] * r["count"] for r in rows)
            best_ms = sum(min(r["ms"], r["best"]["ms"] if r["best"] else r["ms"]) * r["count"] for r in rows)
            summary = {
                "bucket": name, "calls": sum(r["count"] for r in rows), "distinct": len(rows),
                "default_ms": default_ms, "best_per_call_ms": best_ms, "layers": rows,
            }  # fmt: skip
            line = (  # the baseline puts every layer's channels along M; --variants channels_n adds the planned sum
                f"{name}: convolutions {default_ms:.2f} ms at the default launches with output channels along M, "
                f"{best_ms:.2f} at each call's best"
            )
            for variant in args.variants:  # a call the variant does not apply to counts at the baseline
                summary[f"{variant}_ms"] = sum(r.get(f"{variant}_ms", r["ms"]) * r["count"] for r in rows)
                summary[f"{variant}_bits_equal"] = all(r.get(f"{variant}_bits_equal", True) for r in rows)
                line += f"; {variant} {summary[variant + '_ms']:.2f} ms, same bits: {summary[variant + '_bits_equal']}"
            planned = [r.get("channels_n_ms", r["ms"]) if channels_as_n(r["w"][1]) else r["ms"] for r in rows]
            if "channels_n" in args.variants:
                summary["planned_ms"] = sum(ms * r["count"] for ms, r in zip(planned, rows, strict=True))
                line += f"; as planned now {summary['planned_ms']:.2f} ms"
            out.result["buckets"].append(summary)
            out.save()
            print(line, flush=True)


if __name__ == "__main__":
    main()
