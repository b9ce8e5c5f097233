"""CPU figures for the README: ms per window and real-time factor of the tiny codec, per emission size.

For each emission size ``e`` the window is ``left + e + right`` frames (the planner's default sizes). The
real-time factor is decode time over the audio the window emits (``e`` frames): below 1 keeps up with a
live stream on one worker. Warm-up decodes are excluded; figures are medians over ``--repeats`` runs on
fresh random latents.

    python scripts/bench_cpu.py --out bench/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import streamdec
from streamdec.bench.meta import git_commit


def measure(codec: streamdec.Codec, window: int, repeats: int, warmup: int) -> list[float]:
    generator = torch.Generator().manual_seed(window)
    times = []
    for i in range(warmup + repeats):
        latents = torch.randn(1, window, codec.latent_dim, generator=generator)
        began = time.perf_counter()
        codec.decode(latents)
        if i >= warmup:
            times.append(time.perf_counter() - began)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", default="tiny")
    parser.add_argument("--emit", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    codec = streamdec.load_codec(args.codec)
    left, right = codec.context_frames()
    frame_seconds = codec.hop_size / codec.sample_rate
    rows = []
    for emit in args.emit:
        window = left + emit + right
        times = measure(codec, window, args.repeats, args.warmup)
        median = statistics.median(times)
        rows.append(
            {
                "emit_frames": emit,
                "window_frames": window,
                "ms_per_window_p50": 1000 * median,
                "ms_per_window_min": 1000 * min(times),
                "ms_per_window_max": 1000 * max(times),
                "rtf": median / (emit * frame_seconds),
                "ms_per_emitted_frame": 1000 * median / emit,
            }
        )
        print(f"emit {emit:4d}  window {window:4d}  {1000 * median:8.1f} ms  RTF {rows[-1]['rtf']:.3f}")
    today = datetime.date.today().isoformat()
    result = {
        "what": "tiny codec eager decode per window on CPU",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": today,
        "commit": git_commit(Path(__file__).resolve().parents[1])[0],
        "device": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Other work on the machine inflates CPU timings: the 1-minute load average before and after.
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "torch": torch.__version__,
        "codec": codec.name,
        "context": [left, right],
        "repeats": args.repeats,
        "warmup_runs_excluded": args.warmup,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{today}-cpu-{codec.name}-windows.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
