"""Plot ``scripts/bench_stateful.py`` results: p99 time to first audio and streams that under-ran, against
concurrent streams, every point of every file given, by mode; a point that held is filled, one that did not
is hollow:

    python3 scripts/plot_stateful.py bench/results/h200/stateful-vs-halo.json
    python3 scripts/plot_stateful.py A.json B.json --out streams.png --title "..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_COLOURS = {"stateful": "tab:blue", "halo": "tab:orange"}


def _points(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every point of every result, by mode."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        for mode, entry in result["modes"].items():
            by_mode.setdefault(mode, []).extend(entry.get("sweep", {}).get("decoder", []))
    return by_mode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", default=None, help="PNG path (default: beside the first JSON)")
    ap.add_argument("--title", default=None, help="default: codec, precision and device of the first JSON")
    args = ap.parse_args()
    results = [json.loads(Path(path).read_text()) for path in args.results]
    fig, (ttfa, under) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, points in _points(results).items():
        colour = _COLOURS.get(mode)
        for held in (True, False):
            chosen = [p for p in points if p["ok"] is held]
            if not chosen:
                continue
            style = {
                "color": colour,
                "marker": "o",
                "linestyle": "none",
                "markerfacecolor": colour if held else "none",
                "label": f"{mode}, {'held' if held else 'not held'}",
            }
            streams = [p["streams"] for p in chosen]
            ttfa.plot(streams, [p["ttfa_ms"]["p99"] for p in chosen], **style)
            under.plot(streams, [p["streams_with_underruns"] for p in chosen], **style)
    limit = results[0]["settings"]["ttfa_limit_ms"]
    ttfa.axhline(limit, color="grey", linestyle="--", linewidth=1)
    ttfa.set(xlabel="concurrent real-time streams", ylabel="p99 time to first audio (ms)", yscale="log")
    under.set(xlabel="concurrent real-time streams", ylabel="streams that under-ran", yscale="symlog")
    for ax in (ttfa, under):
        ax.set_xlim(left=0)
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    first = results[0]
    fig.suptitle(
        args.title or f"{first['codec']} {first['precision']} on {first['device']}: stateful vs halo"
    )
    fig.tight_layout()
    fig.savefig(args.out or Path(args.results[0]).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
