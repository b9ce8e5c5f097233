"""The kernel launches of a batched stateful call on the CUDA path (fp16x3, fused activation), counted on a
CPU: each Triton launch is counted under Triton's interpreter without running, and each aten op that
launches a kernel on a GPU is counted by a dispatch mode (views and no-op casts are not). The outputs are
garbage; the shapes, and so the path through the layers, are those of the GPU. Needs Triton installed
(``pip install triton``); a CUDA graph replays exactly these launches.

    python scripts/count_launches.py --codec auk-24k --rows 16 --live 4
"""

from __future__ import annotations

import argparse
import collections
import os

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported

from typing import Any

import torch
import triton.runtime.interpreter as interpreter
from torch.utils._python_dispatch import TorchDispatchMode

import streamdec
from streamdec.codecs.layers import routing
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool
from streamdec.kernels import _triton_alias_free as tk
from streamdec.kernels import _triton_conv_f16 as tc
from streamdec.kernels import alias_free as af

#: aten ops that launch nothing on a GPU: views, metadata, allocation
_NO_KERNEL = {
    "view", "slice", "alias", "unsqueeze", "squeeze", "reshape", "as_strided", "transpose", "t", "permute",
    "expand", "detach", "empty", "empty_like", "new_empty", "empty_strided", "select", "_unsafe_view",
    "unbind", "split", "split_with_sizes", "narrow", "lift_fresh",
}  # fmt: skip


class _AtenKernels(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        no_op = name in ("contiguous", "to", "clone") and bool(args) and out is args[0]
        if name not in _NO_KERNEL and not no_op:
            self.counts[name] += 1
        return out


triton_launches: collections.Counter[str] = collections.Counter()


def _count_launch(self: Any, *args: Any, **kwargs: Any) -> None:
    triton_launches[self.fn.__name__] += 1


def _route_as_cuda() -> None:
    """CPU float32 calls take the fp16x3 and fused-activation paths, each op launching as its CUDA
    implementation launches."""

    def is_float32(x: torch.Tensor) -> bool:
        return x.dtype == torch.float32

    for name in ("takes_split", "triton_conv_supported", "f16_conv_supported", "fused_supported"):
        setattr(routing, name, is_float32)

    def conv(x: Any, w_hi: Any, w_lo: Any, w_inv: Any, bias: Any, dilation: int, pad_left: int = 0,
             pad_right: int = 0, residual: Any = None, peak: Any = None, phases: int = 1, head: Any = None,
             products: int = 3, residual_head: Any = None, keep: Any = None, keep_slots: Any = None) -> Any:  # fmt: skip
        target = (keep, keep_slots) if keep is not None else None
        parts = tc.split_f16(x, pad_left, pad_right, peak, head, tails=products == 3, keep=target)
        return tc.conv1d_f16x3(*parts, w_hi, w_lo, w_inv, bias, dilation, residual=residual, phases=phases,
                               products=products, residual_head=residual_head)  # fmt: skip

    def whole(x: Any, filt: Any, a: Any, b: Any, peak: Any = None) -> Any:
        batch, channels, length = x.shape
        flat = x.contiguous().view(batch * channels, length)
        out = torch.empty_like(flat)
        tk.launch_blocked(flat, filt.contiguous().view(-1), a.contiguous(), b.contiguous(), out, peak)
        return out.view(batch, channels, length)

    def whole_peak(x: Any, filt: Any, a: Any, b: Any) -> Any:
        peak = torch.zeros(x.shape[0], dtype=torch.int32)
        return whole(x, filt, a, b, peak), peak

    ops = {
        "conv1d_split_f16": conv,
        "conv1d_split_f16_keep": lambda keep, slots, *a, **k: conv(*a, keep=keep, keep_slots=slots, **k),
        "alias_free_activation": whole,
        "alias_free_activation_peak": whole_peak,
        "alias_free_activation_window": lambda head, x, f, a, b, start, n, keep=None, slots=None: (
            af.window_launch(tk, head, x, f, a, b, start, n, None, keep, slots)
        ),
        "alias_free_activation_window_peak": lambda *a: af.window_peak_launch(tk, *a),
    }
    for name, impl in ops.items():
        setattr(torch.ops.streamdec, name, impl)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--rows", type=int, default=16, help="the call's batch bucket")
    ap.add_argument("--live", type=int, default=4, help="rows that are real (the rest are padding)")
    ap.add_argument("--prime-frames", type=int, default=12)
    ap.add_argument("--step-frames", type=int, default=4)
    args = ap.parse_args()
    interpreter.InterpretedFunction.run = _count_launch
    _route_as_cuda()
    codec = streamdec.load_codec(args.codec)
    codec.precision = "fp16x3"
    net = StatefulNet(codec)
    pool = StatePool(net, args.rows, device=torch.device("cpu"), dtype=torch.float32)
    slots, live = torch.arange(args.rows), torch.tensor([args.live])
    calls = (("prime", args.prime_frames), ("step", args.step_frames), ("flush", args.step_frames))
    with torch.inference_mode():
        for kind, frames in calls:
            z = torch.randn(args.rows, frames, codec.latent_dim)
            triton_launches.clear()
            with _AtenKernels() as aten:
                pool.fn(kind)(slots, z, live)
            total = sum(triton_launches.values()) + sum(aten.counts.values())
            print(f"{kind} {args.rows}x{frames}, {args.live} rows live: {total} launches")
            print(f"  triton: {dict(triton_launches.most_common())}")
            print(f"  aten:   {dict(aten.counts.most_common())}")


if __name__ == "__main__":
    main()
