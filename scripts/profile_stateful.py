"""Where a stateful step's device time goes: the top kernels of one eager step against a whole-clip decode
of as many frames, under torch.profiler (same codec, precision and run).

    python3 scripts/profile_stateful.py --codec auk-24k --batch 256 --frames 4
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from streamdec.codecs import load_codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool


def _top(prof: profile, rows: int) -> str:
    return str(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args()
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    print("precision", codec.use_auto_precision())
    net = StatefulNet(codec)
    pool = StatePool(net, args.batch, device=torch.device("cuda"), dtype=torch.float32)
    slots = torch.arange(args.batch, device="cuda")
    z = torch.randn(args.batch, args.frames, codec.latent_dim, device="cuda")
    prime = torch.randn(args.batch, net.min_prime_frames + 4, codec.latent_dim, device="cuda")
    whole = torch.randn(max(1, args.batch * args.frames // 64), 64, codec.latent_dim, device="cuda")
    with torch.inference_mode(), codec.numerics():
        pool.prime(slots, prime)
        for _ in range(2):
            pool.step(slots, z)
            codec.decode(whole)
        torch.cuda.synchronize()
        for label, fn in (("step", lambda: pool.step(slots, z)), ("whole", lambda: codec.decode(whole))):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            total = sum(e.device_time_total for e in prof.key_averages()) / 1e3
            print(f"== {label}: {total:.1f} ms of kernels")
            print(_top(prof, args.rows))


if __name__ == "__main__":
    main()
