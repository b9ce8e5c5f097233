"""Plot a ``scripts/bench_stateful.py`` result: p99 time to first audio and underruns against streams.

python3 scripts/plot_stateful.py bench/results/h200/stateful-vs-halo.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("result")
    ap.add_argument("--out", default=None, help="PNG path (default: beside the JSON)")
    args = ap.parse_args()
    result = json.loads(Path(args.result).read_text())
    fig, (ttfa, under) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, entry in result["modes"].items():
        points = entry.get("sweep", {}).get("decoder", [])
        streams = [p["streams"] for p in points]
        ttfa.plot(streams, [p["ttfa_ms"]["p99"] for p in points], marker="o", label=mode)
        under.plot(streams, [p["streams_with_underruns"] for p in points], marker="o", label=mode)
    limit = result["settings"]["ttfa_limit_ms"]
    ttfa.axhline(limit, color="grey", linestyle="--", linewidth=1)
    ttfa.set(xlabel="concurrent real-time streams", ylabel="p99 time to first audio (ms)", yscale="log")
    under.set(xlabel="concurrent real-time streams", ylabel="streams with an underrun")
    for ax in (ttfa, under):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['codec']} {result['precision']} on {result['device']}: stateful vs halo")
    fig.tight_layout()
    fig.savefig(args.out or Path(args.result).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
