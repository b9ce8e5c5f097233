"""Where a stateful step's convolutions wait, by Nsight Compute's warp-stall sampling (a CUDA GPU).

Run under ``ncu``, the script records the ``fp16x3`` convolution calls of one ``auk-24k`` step
(``--streams`` x 4 frames, random latents) and, for each output width, replays the call with the most
taps once between ``cudaProfilerStart`` and ``cudaProfilerStop``, so that ``--profile-from-start off``
profiles exactly those launches::

    ncu --clock-control none --profile-from-start off -k regex:conv1d_f16x3 -o convs \\
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
        python3 scripts/ncu_step_convs.py
    ncu --import convs.ncu-rep --page source --print-source sass --csv > convs-source.csv

``--stalls convs-source.csv`` (no GPU needed) then reads that per-instruction export and prints, per
profiled kernel, the share of the warps' stall samples by reason and the instructions they sit at.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: output widths whose widest call is profiled, in the step's order
WIDTHS = (768, 384, 192, 96, 48)


def profile(streams: int) -> None:
    import torch
    from bench_step_convs import record_calls

    from streamdec.codecs import load_codec
    from streamdec.codecs.stateful import StatefulNet
    from streamdec.engine.slots import StatePool
    from streamdec.kernels import _triton_conv_f16 as t16

    codec = load_codec("auk-24k", device="cuda", dtype=torch.float32)
    codec.use_auto_precision()
    net = StatefulNet(codec)
    pool = StatePool(net, streams, device=torch.device("cuda"), dtype=torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode(), codec.numerics():
        every = torch.arange(streams, device="cuda")
        primer = torch.randn(
            streams, net.min_prime_frames + 4, codec.latent_dim, device="cuda", generator=gen
        )
        pool.prime(every, primer)
        z = torch.randn(streams, 4, codec.latent_dim, device="cuda", generator=gen)
        calls = record_calls(lambda: pool.step(every, z))
        picked = []
        for width in WIDTHS:
            found = [call for call, _ in calls if call[0][3].shape[1] == width]
            if found:  # the most taps, dilation 1 first
                picked.append(max(found, key=lambda call: (call[0][3].shape[0], call[0][7] == 1)))
        for args, kwargs in picked:  # compiled and warm before the profiled range
            for _ in range(3):
                t16.conv1d_f16x3(*args, **kwargs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for args, kwargs in picked:
            t16.conv1d_f16x3(*args, **kwargs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    for args, _ in picked:
        print(f"profiled: x {list(args[0].shape)} w {list(args[3].shape)} dilation {args[7]}", flush=True)


def kernels(rows: list[list[str]]) -> Iterator[tuple[list[str], list[list[str]]]]:
    """The source page's kernels: each one's header row and its instruction rows."""
    header: list[str] = []
    body: list[list[str]] = []
    for row in rows:
        if row and row[0] == "Kernel Name":
            if header:
                yield header, body
            header, body = [], []
        elif row and row[0] == "Address":
            header = row
        elif header and len(row) == len(header):
            body.append(row)
    if header:
        yield header, body


def _count(row: list[str], col: dict[str, int], name: str) -> int:
    return int(row[col[name]] or 0)


def stalls(path: Path, top: int) -> None:
    rows = list(csv.reader(path.open()))
    for number, (header, body) in enumerate(kernels(rows)):
        col = {name: i for i, name in enumerate(header)}
        samples = col["Warp Stall Sampling (All Samples)"]
        reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
        total = sum(int(r[samples] or 0) for r in body)
        by_reason = {name: sum(_count(r, col, name) for r in body) for name in reasons}
        shares = ", ".join(
            f"{name[6:]} {n / total:.1%}" for name, n in sorted(by_reason.items(), key=lambda kv: -kv[1]) if n
        )
        print(f"kernel {number}: {total} samples; by reason: {shares}")
        for row in sorted(body, key=lambda r: -int(r[samples] or 0))[:top]:
            n = int(row[samples] or 0)
            main = max(reasons, key=lambda name, row=row: _count(row, col, name))
            print(f"  {n / total:6.1%}  {row[col['Source']].strip()[:64]:64s}  mostly {main[6:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--stalls", type=Path, help="summarize an exported source page instead (no GPU)")
    ap.add_argument("--top", type=int, default=8, help="instructions to list per kernel with --stalls")
    args = ap.parse_args()
    if args.stalls:
        stalls(args.stalls, args.top)
    else:
        profile(args.streams)


if __name__ == "__main__":
    main()
