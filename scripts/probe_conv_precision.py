"""Per-convolution error of each precision against float64, on a real GPU, and optionally its time.

For every conv layer of a codec, on the input it sees in a float32 decode of random latents, prints and
writes the error (max abs over the layer's output peak) of: plain fp32, plain TF32, the tf32x3 split
through cuDNN (heuristic algorithm choice, then ``cudnn.benchmark``), the same split as an explicit
im2col GEMM through cuBLAS (plain convolutions only), and the split through the Triton kernel of
``streamdec.kernels.conv`` (``tf32x3_triton``; transposed convolutions as one conv per phase). With
``--time``, also the median time of fp32 cuDNN, the cuDNN split and the Triton split per layer (CUDA
events, after warm-up), and their sums: the convolutions' share of one decode. Run::

    python scripts/probe_conv_precision.py --codec auk-24k --frames 70 --batch 16 --time --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec.bench.stats import timed
from streamdec.codecs import load_codec
from streamdec.codecs.layers import CausalConvTranspose1d, PaddedConv1d, SplitConv, polyphase_weight
from streamdec.kernels.conv import split_conv1d
from streamdec.kernels.split import pack_split_weight, split_input, split_tf32, split_weight


def _conv(m: SplitConv, x: Tensor, w: Tensor) -> Tensor:
    """The layer's convolution (padding already applied for PaddedConv1d) with weight ``w``, no bias."""
    if isinstance(m, PaddedConv1d):
        return F.conv1d(x, w, None, m.stride, 0, m.dilation)
    return F.conv_transpose1d(x, w, None, m.stride, m.padding, m.output_padding, 1, m.dilation)  # type: ignore[arg-type]


def _im2col_gemm(m: PaddedConv1d, x: Tensor, w: Tensor) -> Tensor:
    """conv1d as one GEMM over unfolded patches: [B, T_out, Cin*k] @ [Cin*k, Cout] (cuBLAS, no cuDNN)."""
    k, d, s = m.kernel_size[0], m.dilation[0], m.stride[0]
    patches = x.unfold(-1, (k - 1) * d + 1, s)[..., ::d]  # [B, Cin, T_out, k]
    cols = patches.permute(0, 2, 1, 3).reshape(x.shape[0], patches.shape[2], -1)
    return (cols @ w.reshape(w.shape[0], -1).T).transpose(1, 2)


def _triton(m: SplitConv, x: Tensor, w: Tensor, tiles: Any = None) -> Callable[[], Tensor] | None:
    """The layer through the Triton split conv as a call with its weight packed once (the op's CPU path
    off CUDA), or None if the layer has no such form. ``tiles`` (a ``_triton_conv.Tiles``) overrides the
    launch shape. The call includes what the layer adds around the kernel in eager mode: the input's split
    and, for transposed layers, the phase padding and interleave."""
    conv: Callable[[Tensor, Tensor, Tensor | None, int], Tensor] = split_conv1d
    if tiles is not None:
        from streamdec.kernels import _triton_conv

        def conv(x: Tensor, packed: Tensor, bias: Tensor | None, dilation: int) -> Tensor:
            return _triton_conv.conv1d_split(*split_tf32(x), *packed, bias, dilation, tiles=tiles)

    if isinstance(m, PaddedConv1d):
        packed = pack_split_weight(w)
        return lambda: conv(x, packed, None, m.dilation[0])
    if isinstance(m, CausalConvTranspose1d) and m.kernel_size[0] % m.stride[0] == 0:
        stride, (batch, _, length) = m.stride[0], x.shape
        packed = pack_split_weight(polyphase_weight(w, stride))

        def transposed() -> Tensor:
            phases = conv(F.pad(x, (packed.shape[1] - 1, 0)), packed, None, 1)
            return (
                phases.view(batch, stride, -1, length).permute(0, 2, 3, 1).reshape(batch, -1, length * stride)
            )

        return transposed
    return None


# Launch shapes --sweep times per layer: (block_m, block_n, block_k, warps, stages)
SWEEP = [
    (64, 128, 32, 4, 3),
    (64, 128, 32, 4, 4),
    (128, 128, 32, 8, 3),
    (128, 64, 32, 4, 3),
    (64, 64, 32, 4, 3),
    (64, 64, 32, 4, 5),
    (64, 64, 64, 4, 3),
    (128, 128, 32, 8, 2),
    (64, 256, 32, 8, 2),
    (64, 128, 16, 4, 4),
    (128, 128, 16, 8, 4),
    (64, 32, 32, 4, 3),
    (32, 64, 32, 4, 3),
]


def _median_ms(fn: Callable[[], object], device: torch.device, reps: int = 10) -> float:
    for _ in range(3):  # warm-up: cuDNN heuristics, Triton compile, allocator
        fn()
    return statistics.median(timed(fn, device)[1] * 1e3 for _ in range(reps))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codec", default="auk-24k")
    parser.add_argument("--frames", type=int, default=70)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cuda", help="cpu runs the same code (no TF32 there)")
    parser.add_argument("--time", action="store_true", help="also time fp32, cuDNN split and Triton split")
    parser.add_argument(
        "--sweep", action="store_true", help="time the Triton split over the SWEEP launch shapes per layer"
    )
    parser.add_argument("--out", default="probe.json")
    args = parser.parse_args()
    codec = load_codec(args.codec, device=args.device, dtype=torch.float32)
    inputs: dict[str, Tensor] = {}
    hooks = []
    for name, m in codec.named_modules():
        if isinstance(m, SplitConv):
            pad = (m.pad_left, m.pad_right) if isinstance(m, PaddedConv1d) else (0, 0)
            hooks.append(m.register_forward_pre_hook(
                lambda mod, a, name=name, pad=pad: inputs.__setitem__(name, F.pad(a[0], pad).detach().clone())
            ))  # fmt: skip
    z = torch.randn(args.batch, args.frames, codec.latent_dim, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        codec.decode(z)
    for h in hooks:
        h.remove()
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    rows: list[dict[str, Any]] = []
    modules = dict(codec.named_modules())
    with torch.inference_mode():
        for name, x in inputs.items():
            m = modules[name]
            assert isinstance(m, SplitConv)
            w = m.weight.detach()
            truth = _conv(m, x.double(), w.double())
            peak = float(truth.abs().max())

            def rel(out: Tensor, truth: Tensor = truth, peak: float = peak) -> float:
                return float((out.double() - truth).abs().max()) / peak

            row: dict[str, Any] = {"layer": name, "input": list(x.shape), "weight": list(w.shape)}
            x3, w3 = split_input(x), split_weight(w, m.weight_in_dim)
            for label, tf32, bench, (xi, wi) in [
                ("fp32", False, False, (x, w)),
                ("tf32", True, False, (x, w)),
                ("tf32x3_cudnn", True, False, (x3, w3)),
                ("tf32x3_cudnn_benchmark", True, True, (x3, w3)),
            ]:
                cudnn.allow_tf32, cudnn.benchmark = tf32, bench
                row[label] = rel(_conv(m, xi, wi))
            if isinstance(m, PaddedConv1d):
                matmul.allow_tf32 = False
                row["gemm_fp32"] = rel(_im2col_gemm(m, x, w))
                matmul.allow_tf32 = True
                row["tf32x3_gemm"] = rel(_im2col_gemm(m, x3, w3))
                matmul.allow_tf32 = False
            cudnn.allow_tf32, cudnn.benchmark = False, False
            triton_call = _triton(m, x, w)
            if triton_call is not None:  # a causal transpose keeps its first T * stride outputs
                triton = triton_call()
                crop = truth[..., : triton.shape[-1]]
                row["tf32x3_triton"] = float((triton.double() - crop).abs().max()) / float(crop.abs().max())
            if args.time:
                row["ms_fp32"] = _median_ms(lambda m=m, x=x, w=w: _conv(m, x, w), x.device)
                cudnn.allow_tf32 = True
                row["ms_tf32x3_cudnn"] = _median_ms(lambda m=m, x3=x3, w3=w3: _conv(m, x3, w3), x.device)
                cudnn.allow_tf32 = False
                if triton_call is not None:
                    row["ms_tf32x3_triton"] = _median_ms(triton_call, x.device)
            if args.sweep and triton_call is not None:
                import triton

                from streamdec.kernels._triton_conv import Tiles

                sweep = []
                for shape in SWEEP:
                    call = _triton(m, x, w, Tiles(*shape))
                    assert call is not None
                    try:
                        out = call()
                    except triton.runtime.errors.OutOfResources as e:  # a shape this layer cannot launch
                        sweep.append({"tiles": shape, "error": str(e)})
                        continue
                    err = float((out.double() - truth[..., : out.shape[-1]]).abs().max()) / peak
                    sweep.append({"tiles": shape, "ms": _median_ms(call, x.device), "rel": err})
                row["sweep"] = sweep
                best = min((r for r in sweep if "ms" in r), key=lambda r: r["ms"])
                row["ms_tf32x3_triton_best"], row["best_tiles"] = best["ms"], best["tiles"]
            rows.append(row)
            print(" ".join(
                f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k != "sweep"
            ))  # fmt: skip
    methods = sorted(
        {k for r in rows for k in r if k not in {"layer", "input", "weight", "sweep", "best_tiles"}}
    )
    worst = {k: max(r[k] for r in rows if k in r) for k in methods if not k.startswith("ms_")}
    totals = {k: sum(r[k] for r in rows if k in r) for k in methods if k.startswith("ms_")}
    print("worst relative error per method:", json.dumps(worst))
    if totals:
        print("summed ms per method (layers where it applies):", json.dumps(totals))
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    meta = {"device": device, "torch": torch.__version__, "cudnn": cudnn.version()}
    Path(args.out).write_text(
        json.dumps(
            {"meta": meta, "args": vars(args), "worst": worst, "total_ms": totals, "rows": rows}, indent=1
        )
    )


if __name__ == "__main__":
    main()
