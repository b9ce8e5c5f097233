"""Device time of stateful step graphs, with and without short rows packed, beside a whole-clip decode.

Each step bucket (streams x frames) is captured as one CUDA graph of ``StatePool.step`` over random
latents and timed by CUDA events: a warm-up, then ``--repeats`` runs of ``--replays`` replays, the median
run reported. The whole-clip reference is a captured decode of ``--whole`` (batch x frames) random
latents, timed the same way. The packing switch is read at import, so each setting runs in a child
process of its own (same commit, same GPU, one after the other), and the JSON holds both side by side:

    python3 scripts/bench_step.py --buckets 256x4 128x4 64x16 16x4 --out bench/results/h200/step-packing.json

``--against DIR`` also times the packed steps of another checkout of the package (``git worktree add DIR
COMMIT``, or an unpacked ``git archive``), imported from ``DIR`` in a child of its own, in the same run:
what a change did to a step's cost. ``--modes`` picks the switch settings of this checkout to time
(``no-dependent-launch``: packed, every kernel launched after the one before has finished;
``triton-conv``: packed, every convolution on the Triton kernel instead of the warp-specialized one where
that runs). Each step's
output after its last timed replay is digested, so the JSON also says whether two runs gave the same bits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from typing import Any

import torch

from streamdec.bench.meta import ResultFile, script_header

# switch settings of this checkout a run may time, each in a child process (the switches are read at import)
_MODES = {
    "packed": {"STREAMDEC_PACK_SHORT_ROWS": "1"},
    "one-row": {"STREAMDEC_PACK_SHORT_ROWS": "0"},
    "no-dependent-launch": {"STREAMDEC_PACK_SHORT_ROWS": "1", "STREAMDEC_DEPENDENT_LAUNCH": "0"},
    "triton-conv": {"STREAMDEC_PACK_SHORT_ROWS": "1", "STREAMDEC_SPECIALIZED_CONV": "0"},
}


def parse_bucket(text: str) -> tuple[int, int]:
    streams, frames = text.lower().split("x")
    return int(streams), int(frames)


def time_graph(run: Any, replays: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean device ms of one replay (``replays`` back to back)."""
    stream = torch.cuda.current_stream()
    for _ in range(3):
        run()
    results = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(replays):
            run()
        end.record(stream)
        end.synchronize()
        results.append(start.elapsed_time(end) / replays)
    return statistics.median(results)


def capture(fn: Any, *args: Any) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``fn(*args)`` captured (after two runs on a side stream): the graph and its output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


def capture_graph(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` captured: its graph's replay."""
    return capture(fn, *args)[0].replay


def _digest(audio: torch.Tensor) -> dict[str, Any]:
    """What the last replay left in a step's output: a digest of its bits (equal across runs, modes and
    checkouts that compute the same function in the same replays) and how much of it is finite."""
    bits = audio.detach().contiguous().view(torch.int32).cpu().numpy().tobytes()
    return {
        "output_sha256": hashlib.sha256(bits).hexdigest()[:16],
        "output_finite": float(torch.isfinite(audio).float().mean()),
    }


def measure(
    codec_name: str, buckets: list[tuple[int, int]], whole: tuple[int, int], replays: int, repeats: int
) -> dict[str, Any]:
    """One process's figures: every bucket's replay and per-frame device time, and the whole-clip one's."""
    from streamdec.codecs import load_codec
    from streamdec.codecs.stateful import StatefulNet
    from streamdec.engine.graphs import static_forward
    from streamdec.engine.slots import StatePool

    torch.manual_seed(0)
    codec = load_codec(codec_name, device="cuda", dtype=torch.float32)
    precision = codec.use_auto_precision()
    net = StatefulNet(codec)
    slots = max(b for b, _ in buckets)
    pool = StatePool(net, slots, device=torch.device("cuda"), dtype=torch.float32)
    out: dict[str, Any] = {"precision": precision, "buckets": {}}
    with torch.inference_mode(), codec.numerics():
        every = torch.arange(slots, device="cuda")
        pool.prime(every, torch.randn(slots, net.min_prime_frames + 4, codec.latent_dim, device="cuda"))
        for batch, frames in buckets:
            index = torch.randperm(slots, device="cuda")[:batch]  # live streams sit anywhere in the pool
            z = torch.randn(batch, frames, codec.latent_dim, device="cuda")
            graph, audio = capture(pool.step, index, z)
            ms = time_graph(graph.replay, replays, repeats)
            out["buckets"][f"{batch}x{frames}"] = {
                "replay_ms": ms,
                "us_per_frame": 1e3 * ms / (batch * frames),
                **_digest(audio),
            }
        z = torch.randn(whole[0], whole[1], codec.latent_dim, device="cuda")
        ms = time_graph(capture_graph(static_forward(codec), z), replays, repeats)
        out["whole_clip"] = {
            "shape": f"{whole[0]}x{whole[1]}",
            "replay_ms": ms,
            "us_per_frame": 1e3 * ms / (whole[0] * whole[1]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", default="auk-24k")
    ap.add_argument("--buckets", nargs="+", default=["256x4", "128x4", "64x4", "16x4", "128x8", "64x16"])
    ap.add_argument("--whole", default="8x250", help="whole-clip reference, batch x frames")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", nargs="+", choices=list(_MODES), default=list(_MODES))
    ap.add_argument("--against", help="another checkout of the package to time beside this one (packed)")
    ap.add_argument("--against-label", default="against", help="its name in the JSON (e.g. its commit)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/results/step-packing.json")
    args = ap.parse_args()
    buckets = [parse_bucket(b) for b in args.buckets]
    whole = parse_bucket(args.whole)
    if args.child:
        print(json.dumps(measure(args.codec, buckets, whole, args.replays, args.repeats)))
        return
    result = ResultFile(
        args.out,
        script_header(codec=args.codec, precision="auto", commit=None, timing="CUDA events, captured graphs")
        | {"settings": vars(args), "modes": {}},
    )
    runs = [(mode, _MODES[mode]) for mode in args.modes]
    if args.against:
        tree = os.path.abspath(args.against)
        path = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)  # its package first
        runs.append((args.against_label, {"STREAMDEC_PACK_SHORT_ROWS": "1", "PYTHONPATH": path}))
    for mode, extra in runs:
        env = {**os.environ, **extra}
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--child"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(child.stdout.strip().splitlines()[-1])
        result.result["modes"][mode] = figures
        result.save()
        for bucket, f in figures["buckets"].items():
            print(
                f"{mode:8s} step {bucket:>7s}: {f['replay_ms']:7.2f} ms  {f['us_per_frame']:6.1f} us/frame  "
                f"bits {f['output_sha256']} ({f['output_finite']:.0%} finite)"
            )
        w = figures["whole_clip"]
        print(
            f"{mode:8s} whole {w['shape']:>7s}: {w['replay_ms']:7.2f} ms  {w['us_per_frame']:6.1f} us/frame"
        )


if __name__ == "__main__":
    main()
