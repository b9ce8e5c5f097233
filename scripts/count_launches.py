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
from streamdec.kernels import alias_free as af
from streamdec.kernels import conv as conv_ops

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
    """CPU float32 calls take the fp16x3 and fused-activation paths, each op calling its own CUDA
    implementation (whose Triton launches are counted, not run)."""

    def is_float32(x: torch.Tensor) -> bool:
        return x.dtype == torch.float32

    for name in ("takes_split", "triton_conv_supported", "f16_conv_supported", "fused_supported"):
        setattr(routing, name, is_float32)
    for module in (conv_ops, af):
        module.direct_cuda_call = is_float32  # type: ignore[attr-defined]


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
