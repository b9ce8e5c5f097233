"""What a 256 x 4 stateful step's kernels cost with every row live and with none (the floor a bucket's
padding rows pay), beside a prime and a flush of 16 rows with 4 live and a whole clip of as many frames as
the step: kernels by name, launches and kernel ms under torch.profiler (eager calls, the fused pool, the
auto precision; one warm-up call first). Under dependent launch a kernel's time includes its wait for the
kernel before it, so the split between neighbouring kernels blurs; the totals and launch counts do not:

    python3 scripts/profile_step_floor.py > profile-step-floor.txt
"""

import functools
from collections.abc import Callable
from typing import Any

import torch
from profile_stateful import profiled, top_kernels

from streamdec.codecs import load_codec
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool

B, F = 256, 4
codec = load_codec("auk-24k", device="cuda", dtype=torch.float32)
print("precision", codec.use_auto_precision())
net = StatefulNet(codec)
pool = StatePool(net, B, device=torch.device("cuda"), dtype=torch.float32)
gen = torch.Generator(device="cuda").manual_seed(0)
every = torch.arange(B, device="cuda")
z = torch.randn(B, F, codec.latent_dim, device="cuda", generator=gen)


def prof(fn: Callable[[], Any], rows: int = 40, title: str = "") -> None:
    fn()  # warm-up: Triton compiles, allocator
    torch.cuda.synchronize()
    p, total, launches = profiled(fn)
    print(f"== {title}: {total:.2f} ms of kernels, {launches} launches")
    print(top_kernels(p, rows))


with torch.inference_mode(), codec.numerics():
    pool.prime(
        every, torch.randn(B, net.min_prime_frames + 4, codec.latent_dim, device="cuda", generator=gen)
    )
    for live in (B, 0):
        n = torch.tensor([live], device="cuda", dtype=torch.int64)
        prof(functools.partial(pool.step, every, z, n), title=f"step {B}x{F}, {live} rows live")
    for kind, frames in (("prime", 12), ("flush", 4)):
        zz = torch.randn(16, frames, codec.latent_dim, device="cuda", generator=gen)
        n = torch.tensor([4], device="cuda", dtype=torch.int64)
        call = functools.partial(getattr(pool, kind), every[:16], zz, n)
        prof(call, rows=25, title=f"{kind} 16x{frames}, 4 rows live")
    whole = torch.randn(16, 64, codec.latent_dim, device="cuda", generator=gen)
    prof(lambda: codec.decode(whole), title="whole clip 16x64")
