"""Kernel time and error of each split convolution on every conv layer of a codec (a CUDA GPU).

For each distinct conv layer of a float32 decode of random latents at ``batch x frames`` (transposed
layers in their one-conv-per-phase form), on the input the layer sees there: float32 cuDNN, plain TF32
cuDNN, the TF32 split (``tf32x3``, ``streamdec.kernels._triton_conv``) and the float16 split
(``fp16x3``, ``_triton_conv_f16``) at its default launch and at each ``--f16-tiles`` x split-K choice.
Each gets its error against a float64 convolution (max abs over the output's peak) and its GPU time:
operands split and packed beforehand, the call captured five times in one CUDA graph, the replay timed
with CUDA events after a warm-up, median of ``--reps``. The float16 split's pre-pass (row peaks, then scale, split and
channels-last copy in one kernel) is timed on its own. Every float16 launch must give the default's bits exactly
(``bits_equal``): the chunked reduction does not depend on the launch. ``--f16-only`` times the float16
split's launches alone, without the float64 reference and the other kernels (a quick launch sweep at a
large batch). Run::

    python scripts/bench_conv_kernels.py --codec auk-24k --frames 70 --batches 1 16 --out conv.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec.bench.meta import ResultFile, script_header
from streamdec.bench.stats import graph_ms
from streamdec.codecs import load_codec
from streamdec.codecs.layers import PaddedConv1d, SplitConv
from streamdec.kernels.f16_launch import Tiles
from streamdec.kernels.split import pack_split_weight, pack_split_weight_f16, split_tf32


def conv_inputs(codec: torch.nn.Module, z: Tensor) -> dict[str, tuple[Tensor, Tensor, int, int]]:
    """Per distinct conv layer: ``(padded input, [Cout, Cin, k] weight, dilation, count)`` of its ordinary
    convolution form from one decode of ``z``; ``count`` layers of the decode have that shape."""
    found: dict[str, tuple[Tensor, Tensor, int, int]] = {}
    seen: dict[tuple[Any, ...], str] = {}
    hooks = []
    for name, m in codec.named_modules():
        if not isinstance(m, SplitConv):
            continue
        weight = m.triton_weight()
        if weight is None:
            continue

        def grab(mod: SplitConv, args: tuple[Tensor, ...], name: str = name, w: Tensor = weight) -> None:
            x = args[0]
            if isinstance(mod, PaddedConv1d):
                x, dilation = F.pad(x, (mod.pad_left, mod.pad_right)), mod.dilation[0]
            else:  # causal transpose, one conv per phase: taps - 1 samples of left context
                x, dilation = F.pad(x, (w.shape[2] - 1, 0)), 1
            key = (tuple(x.shape), tuple(w.shape), dilation)
            if key in seen:
                first = found[seen[key]]
                found[seen[key]] = (*first[:3], first[3] + 1)
            else:
                seen[key] = name
                found[name] = (x.detach().clone(), w.detach().clone(), dilation, 1)

        hooks.append(m.register_forward_pre_hook(grab))
    with torch.inference_mode():
        codec.decode(z)  # type: ignore[operator]
    for h in hooks:
        h.remove()
    return found


def measure(
    x: Tensor, w: Tensor, dilation: int, tiles16: list[Any], reps: int, f16_only: bool = False
) -> dict[str, Any]:
    """Errors and GPU times of every kernel on one layer (see the module docstring)."""
    from streamdec.kernels import _triton_conv as t32
    from streamdec.kernels import _triton_conv_f16 as t16

    truth = None if f16_only else F.conv1d(x.double(), w.double(), dilation=dilation)

    def rel(y: Tensor) -> float | None:
        if truth is None:
            return None
        return float((y.double() - truth).abs().max()) / float(truth.abs().max())

    row: dict[str, Any] = {}
    cudnn = torch.backends.cudnn
    with torch.inference_mode():
        for label, tf32 in () if f16_only else (("fp32_cudnn", False), ("tf32_cudnn", True)):
            cudnn.allow_tf32 = tf32
            row[f"err_{label}"] = rel(F.conv1d(x, w, dilation=dilation))
            row[f"ms_{label}"] = graph_ms(lambda: F.conv1d(x, w, dilation=dilation), reps=reps)
        cudnn.allow_tf32 = False
        if not f16_only:
            x_hi, x_lo = split_tf32(x)
            p32 = pack_split_weight(w)

            def tf32x3() -> Tensor:
                return t32.conv1d_split(x_hi, x_lo, p32[0], p32[1], None, dilation)

            row["err_tf32x3"] = rel(tf32x3())
            row["ms_tf32x3"] = graph_ms(tf32x3, reps=reps)
        h16, l16, inv = t16.split_f16(x)
        p16, winv = pack_split_weight_f16(w)

        def f16(tiles: Any = None, split: bool | None = None) -> Tensor:
            return t16.conv1d_f16x3(h16, l16, inv, p16[0], p16[1], winv, None, dilation, tiles, split)

        default = f16()
        row["err_fp16x3"] = rel(default)
        row["ms_fp16x3"] = graph_ms(f16, reps=reps)
        row["ms_fp16x3_split_prepass"] = graph_ms(lambda: t16.split_f16(x), reps=reps)
        variants: list[dict[str, Any]] = []
        for tiles in tiles16:
            for split in (False, True):
                try:
                    y = f16(tiles, split)
                except Exception as e:  # a launch this layer cannot take (shared memory)
                    variants.append({"tiles": list(tiles), "split": split, "error": repr(e)[:200]})
                    continue
                variants.append({
                    "tiles": list(tiles), "split": split, "bits_equal": bool(torch.equal(y, default)),
                    "ms": graph_ms(lambda tiles=tiles, split=split: f16(tiles, split), reps=reps),
                })  # fmt: skip
    row["fp16x3_variants"] = variants
    timed = [v for v in variants if "ms" in v]
    best = min(timed, key=lambda v: v["ms"]) if timed else None
    row["ms_fp16x3_best"] = best["ms"] if best else None
    row["fp16x3_best"] = best
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codec", default="auk-24k")
    parser.add_argument("--frames", type=int, default=70)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument(
        "--f16-tiles", nargs="*", default=["128,128,8,3", "128,64,8,2", "64,64,4,3", "64,128,4,3"],
        help="float16 launch shapes to time besides the default: block_m,block_n,warps,stages",
    )  # fmt: skip
    parser.add_argument("--f16-only", action="store_true", help="float16 launches only, no reference")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", default="conv.json")
    args = parser.parse_args()

    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    header = script_header(codec=args.codec, precision="per kernel", commit=args.commit, timing="cuda graphs")
    out = ResultFile(args.out, {**header, "args": vars(args), "shapes": []})
    tiles16 = [Tiles(*map(int, spec.split(","))) for spec in args.f16_tiles]
    for batch in args.batches:
        z = torch.randn(batch, args.frames, codec.latent_dim, generator=torch.Generator().manual_seed(batch))
        layers = conv_inputs(codec, z.cuda())
        totals: dict[str, float] = {}
        rows = []
        for name, (x, w, dilation, count) in layers.items():
            row: dict[str, Any] = {
                "layer": name, "count": count, "input": list(x.shape), "weight": list(w.shape), "dil": dilation
            }  # fmt: skip
            row.update(measure(x, w, dilation, tiles16, args.reps, args.f16_only))
            best = row["fp16x3_best"]
            for key, value in row.items():
                if key.startswith("ms_") and isinstance(value, float):
                    totals[key] = totals.get(key, 0.0) + value * count
            rows.append(row)
            print(
                f"b={batch} {name} {row['input']} {row['weight']} d={dilation} "
                + " ".join(
                    f"{k}={v:.3g}" for k, v in row.items() if k.startswith(("ms_", "err_")) and v is not None
                )
                + f" best={best and (best['tiles'], best['split'])}"
                + f" all_bits_equal={all(v.get('bits_equal', True) for v in row['fp16x3_variants'])}",
                flush=True,
            )
            torch.cuda.empty_cache()
        out.result["shapes"].append(
            {"batch": batch, "frames": args.frames, "layers": rows, "total_ms_per_decode": totals}
        )
        out.save()
        print(
            f"b={batch} summed over the decode's layers:",
            {k: round(v, 3) for k, v in totals.items()},
            flush=True,
        )


if __name__ == "__main__":
    main()
