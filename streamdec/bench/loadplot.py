"""The load test's plot: every run's p99 first-audio time, underruns and server cost against stream count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_sweep"]


def plot_sweep(result: dict[str, Any], path: Path) -> Path:
    """Write a PNG of ``result['runs']`` (a ``streamdec loadtest`` JSON) to ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (ttfa, cost) = plt.subplots(1, 2, figsize=(11, 4))
    for holds, colour, label in ((True, "tab:green", "run holds"), (False, "tab:red", "run fails")):
        chosen = [r for r in runs if r["holds"] is holds]
        ttfa.scatter(
            [r["streams_requested"] for r in chosen],
            [r["ttfa_decodable_ms"]["p99"] or 0 for r in chosen],
            c=colour,
            label=label,
        )
    ttfa.axhline(result["limits"]["ttfa_p99_ms"], ls="--", c="grey", label="limit")
    largest = result["result"]["largest_streams"]
    if largest:
        ttfa.axvline(largest, ls=":", c="tab:green", label=f"largest holding: {largest}")
    ttfa.set(xlabel="concurrent streams", ylabel="p99 first audio after decodable (ms)", yscale="log")
    ttfa.legend(fontsize=8)
    ordered = sorted(runs, key=lambda r: r["streams_requested"])
    xs = [r["streams_requested"] for r in ordered]
    cost.plot(xs, [r["server"]["cpu_cores"] or 0 for r in ordered], "o-", label="server CPU (cores)")
    cost.plot(
        xs,
        [(r["server"]["loop_lag_ms"]["p99"] or 0) / 10 for r in ordered],
        "s-",
        label="loop lag p99 (10 ms)",
    )
    cost.set(xlabel="concurrent streams", title=result["server"].get("engine", ""))
    cost.legend(fontsize=8)
    env = result["environment"]
    fig.suptitle(
        f"streamdec loadtest: {env.get('device_name')} @ {str(env.get('git_commit'))[:10]}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
