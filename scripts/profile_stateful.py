"""Where a stateful step's device time goes, fused against per-layer, beside a whole-clip decode.

For each step bucket (streams x frames) and each way of running a step (``fused``: one gather of every
layer's state, residual adds in the conv epilogue, which reads a delay line's history and new samples
where they lie, activation row peaks handed over; ``fused-joined``: the same with each delay line's
output concatenated first, as steps were run before the epilogue read the two parts; ``split-64``: the
fused step with every input split in 64-sample tiles instead of tiles sized to its rows; ``pack-8``: the
fused step with the convolutions packing only rows shorter than a tile, 8 samples of each, instead of
pieces sized to the rows; ``per-layer``:
``StatePool(fused=False)``, a gather and a scatter per layer and nothing handed over), it prints the
eager step's kernel launches and kernel time under torch.profiler, and the captured graph's replay time
(CUDA events: a warm-up, then the median of ``--repeats`` runs of ``--replays`` replays) and its graph
memory. All ways start from the same primed state and must give the same bits (printed). Then the top
kernels of the first bucket, each way, and of a whole-clip decode of as many frames (its kernel time
also with ``pack-8``'s convolutions):

    python3 scripts/profile_stateful.py --codec auk-24k --batch 256 --frames 4
    python3 scripts/profile_stateful.py --codec auk-24k --batch 1 --frames 4 --buckets 16x4 64x4
    python3 scripts/profile_stateful.py --ways fused pack-8
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from bench_step import parse_bucket, time_graph
from torch.profiler import DeviceType, ProfilerActivity, profile

from streamdec.codecs import load_codec, stateful
from streamdec.codecs.stateful import StatefulNet
from streamdec.engine.slots import StatePool
from streamdec.kernels import f16_launch, sizing

_WAYS = {"fused": True, "fused-joined": True, "split-64": True, "pack-8": True, "per-layer": False}


def _joined_identity(call: str, identity: Any, x: torch.Tensor, states: Any) -> tuple[None, torch.Tensor]:
    """A residual's identity path as one tensor, concatenated before the add (the ``fused-joined`` way)."""
    return None, getattr(identity, call)(x, states)


@contextlib.contextmanager
def _way(name: str) -> Iterator[None]:
    """Within it, ``fused-joined`` steps concatenate each residual's delayed identity before the add,
    ``split-64`` steps split their inputs in 64-sample tiles, and ``pack-8`` convolutions pack only rows
    shorter than a tile, in 8-sample pieces."""
    original, tiles = stateful._identity_parts, sizing.SPLIT_BLOCKS_T
    pieces, long_rows = f16_launch.PACK_ROW_NS, f16_launch.PACK_LONG_ROWS
    if name == "fused-joined":
        stateful._identity_parts = _joined_identity
    if name == "split-64":
        sizing.SPLIT_BLOCKS_T = (64,)
    if name == "pack-8":
        f16_launch.PACK_ROW_NS, f16_launch.PACK_LONG_ROWS = (8,), False
    try:
        yield
    finally:
        stateful._identity_parts, sizing.SPLIT_BLOCKS_T = original, tiles
        f16_launch.PACK_ROW_NS, f16_launch.PACK_LONG_ROWS = pieces, long_rows


def top_kernels(prof: profile, rows: int) -> str:
    return str(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60))


def profiled(fn: Callable[[], Any]) -> tuple[profile, float, int]:
    """``fn`` once under the profiler: (profile, ms of kernels, device launches: kernels, copies, sets)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages()) / 1e3
    launches = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    return prof, total, launches


def _graph_row(fn: Callable[[], Any], replays: int, repeats: int) -> tuple[float, float]:
    """(replay ms, graph memory GiB) of ``fn`` (already run once: compiled, allocator warm) captured alone
    in a fresh graph pool: the memory is what the capture reserved."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    memory = (torch.cuda.memory_reserved() - before) / 2**30
    ms = time_graph(graph.replay, replays, repeats)
    del graph
    torch.cuda.empty_cache()
    return ms, memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--buckets", nargs="*", default=[], help="more buckets to time, streams x frames")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ways", nargs="+", choices=list(_WAYS), default=list(_WAYS))
    ap.add_argument("--whole-frames", type=int, default=64, help="frames a row of the whole clip")
    ap.add_argument(
        "--whole-rows", type=int, help="rows of the whole clip (default: the first bucket's frames)"
    )
    args = ap.parse_args()
    buckets = [(args.batch, args.frames), *(parse_bucket(b) for b in args.buckets)]
    codec = load_codec(args.codec, device="cuda", dtype=torch.float32)
    print("precision", codec.use_auto_precision())
    net = StatefulNet(codec)
    slots = max(b for b, _ in buckets)
    cuda = torch.device("cuda")
    pools = {
        way: StatePool(net, slots, device=cuda, dtype=torch.float32, fused=_WAYS[way]) for way in args.ways
    }
    gen = torch.Generator(device="cuda").manual_seed(0)
    prime = torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device="cuda", generator=gen)
    every = torch.arange(slots, device="cuda")
    tops: dict[str, profile] = {}
    print(f"{'bucket':>8} {'way':>10} {'launches':>9} {'kernel ms':>10} {'replay ms':>10} {'graph GiB':>10}")
    with torch.inference_mode(), codec.numerics():
        for batch, frames in buckets:
            # padding rows at the scratch slot, the live ones anywhere in the pool, as a server's batches are
            index = torch.randperm(slots, device="cuda", generator=gen)[:batch]
            if batch >= 4:
                index[batch // 2 :: 3] = slots
            live = index != slots
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda", generator=gen)
            outs = {}
            for way, pool in pools.items():
                with _way(way):
                    pool.prime(every, prime)
                    outs[way] = (pool.step(index, z)[live], pool.flat[:slots].clone())  # scratch row: any
                    pool.step(index, z)  # warm-up (Triton compiles, allocator)
                    step = functools.partial(pool.step, index, z)
                    prof, kernel_ms, launches = profiled(step)
                    tops.setdefault(way, prof)
                    replay_ms, gib = _graph_row(step, args.replays, args.repeats)
                bucket = f"{batch}x{frames}"
                print(
                    f"{bucket:>8} {way:>10} {launches:>9} {kernel_ms:>10.2f} {replay_ms:>10.2f} {gib:>10.2f}"
                )
            (fa, fs) = next(iter(outs.values()))
            same_audio = all(torch.equal(fa, a) for a, _ in outs.values())
            same_state = all(torch.equal(fs, s) for _, s in outs.values())
            print(f"{'':>8} same bits, every way: audio {same_audio}, new state {same_state}")
        rows = args.whole_rows or max(1, args.batch * args.frames // args.whole_frames)
        whole = torch.randn(rows, args.whole_frames, codec.latent_dim, device="cuda")
        codec.decode(whole)
        whole_prof, whole_ms, whole_launches = profiled(lambda: codec.decode(whole))
        with _way("pack-8"):
            codec.decode(whole)
            _, pack8_ms, _ = profiled(lambda: codec.decode(whole))
    for way, prof in tops.items():
        print(f"== step {args.batch}x{args.frames}, {way}")
        print(top_kernels(prof, args.rows))
    print(
        f"== whole clip {tuple(whole.shape[:2])}: {whole_ms:.2f} ms of kernels ({pack8_ms:.2f} with pack-8), "
        f"{whole_launches} launches"
    )
    print(top_kernels(whole_prof, args.rows))


if __name__ == "__main__":
    main()
