"""Single float16 split-convolution calls in the shapes of a stateful step, for Nsight Compute (a CUDA GPU).

Each ``--cases`` entry ``BATCH:CIN:COUT:K:DIL:TOUT`` is one layer call with seeded random operands (split
as the codec splits them, a residual added as auk-24k's residual units add it). Every call runs once to
compile and warm up, then once inside the NVTX range ``conv``, so that Nsight Compute profiles exactly one
launch per case::

    ncu --nvtx --nvtx-include "conv/" --section SpeedOfLight --section WarpStateStats \\
        python3 scripts/profile_conv_calls.py --specialized 0

The default cases are auk-24k's heaviest step calls of each launch family at 256 streams x 4 frames:
the 768-channel layer (packed 64 x 64 tiles), the 384-channel one (packed 128 x 128) and the 192-, 96-, 48-
and 24-channel ones (64 x 128 tiles, a row a program).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamdec.kernels import _triton_conv_f16 as tc
from streamdec.kernels.split import pack_split_weight_f16

DEFAULT_CASES = [
    "256:768:768:11:1:20", "256:384:384:11:1:80", "256:192:192:11:1:240", "256:96:96:11:1:480",
    "256:48:48:11:1:960", "256:24:24:11:1:1920",
]  # fmt: skip


def run_case(spec: str, specialized: bool) -> None:
    batch, cin, cout, ksize, dilation, tout = (int(v) for v in spec.split(":"))
    gen = torch.Generator(device="cuda").manual_seed(cin + ksize)
    x = torch.randn(batch, cin, tout + (ksize - 1) * dilation, device="cuda", generator=gen)
    w = torch.randn(cout, cin, ksize, device="cuda", generator=gen) / (cin * ksize) ** 0.5
    residual = torch.randn(batch, cout, tout, device="cuda", generator=gen)
    packed, inverse = pack_split_weight_f16(w)
    args = (*tc.split_f16(x), packed[0], packed[1], inverse, None, dilation)
    for profiled in (False, True):
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("conv")
        tc.conv1d_f16x3(*args, residual=residual, specialized=specialized)
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    launch = tc.plan(
        batch=batch, padded_channels=args[0].shape[2], cout=cout, tout=tout, ksize=ksize,
        sms=tc.launch_sms(x.device),
    )  # fmt: skip
    print(f"{spec}: {launch}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="BATCH:CIN:COUT:K:DIL:TOUT")
    ap.add_argument(
        "--specialized", type=int, choices=(0, 1), default=0, help="1: the warp-specialized Gluon kernel"
    )
    args = ap.parse_args()
    with torch.inference_mode():
        for spec in args.cases:
            run_case(spec, bool(args.specialized))


if __name__ == "__main__":
    main()
