"""PNG plots of one result file (matplotlib, headless): latency, halo overhead, quality, concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_plots"]

_TIER_STYLE = {"eager": "tab:blue", "graph": "tab:orange", "compiled": "tab:green"}


def _p(summary: dict[str, Any] | None, key: str = "p50") -> float | None:
    return None if summary is None else summary.get(key)


def _xy(points: list[dict[str, Any]], xkey: str, get: Any) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for p in points:
        y = get(p)
        if y is not None:
            xs.append(p[xkey])
            ys.append(y)
    return xs, ys


def _tiers_with_points(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Tiers that measured something (a tier skipped for time draws no empty legend entry)."""
    return [t for t in result["tiles"]["tiers"] if t["points"]]


def _log2_axis(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])


def _has_data(ax: Any) -> bool:
    """True if a curve on ``ax`` has a point (reference lines drawn across the panel do not count)."""
    return any(len(line.get_xdata()) and not line.get_gid() for line in ax.get_lines())


def _title(result: dict[str, Any]) -> str:
    m = result["meta"]
    return f"{m['codec']['name']} on {m['device_name']} (torch {m['torch']}, {m['date_utc'][:10]})"


def _finish(
    fig: Any,
    axes: tuple[Any, ...],
    ticks: list[int],
    result: dict[str, Any],
    path: Path,
    plt: Any,
    *,
    legend_size: int = 8,
) -> None:
    """Log2 x-axis, grid and legend on every panel; title, layout, write ``path`` and free the figure.

    A panel with nothing measured (a section the time budget skipped) says so instead of failing to
    log-scale an empty axis."""
    for ax in axes:
        if not _has_data(ax):
            ax.set_xscale("linear")
            ax.set_yscale("linear")
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
            continue
        _log2_axis(ax, ticks)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=legend_size)
    fig.suptitle(_title(result))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency(result: dict[str, Any], path: Path, plt: Any) -> None:
    sizes = list(result["config"]["sizes"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for tier in _tiers_with_points(result):
        color = _TIER_STYLE.get(tier["tier"])
        xs, ys = _xy(tier["points"], "emit_frames", lambda p: _p(p["window_ms"]))
        ax1.plot(xs, ys, "o-", color=color, label=f"streamdec {tier['tier']} (p50)")
        xs, ys = _xy(tier["points"], "emit_frames", lambda p: _p(p["window_ms"], "p99"))
        ax1.plot(xs, ys, ":", color=color, label=f"streamdec {tier['tier']} (p99)")
        xs, ys = _xy(tier["points"], "emit_frames", lambda p: _p(p["ttfa_ms"]))
        ax2.plot(xs, ys, "o-", color=color, label=f"streamdec {tier['tier']}")
    base = result.get("baselines") or {}
    for key, label, color in (
        ("naive", "naive chunks (eager)", "tab:red"),
        ("crossfade", "crossfade (eager)", "tab:purple"),
    ):
        rows = base.get(key) or []
        xs, ys = _xy(rows, "chunk_frames", lambda p: _p(p["decode_ms"]))
        ax1.plot(xs, ys, "s--", color=color, label=label)
    if "whole" in base:
        ax1.axhline(base["whole"]["decode_ms"]["p50"], color="gray", ls="--", gid="reference",
                    label=f"whole clip, {base['whole']['frames']} frames (eager)")  # fmt: skip
    if "seed_tiles" in base:
        ax1.axhline(base["seed_tiles"]["decode_ms"]["p50"], color="black", ls="-.", gid="reference",
                    label=f"seed {base['seed_tiles']['tile_frames']}-frame tile (eager)")  # fmt: skip
    ax1.set(xlabel="emission / chunk size (frames)", ylabel="decode latency per window (ms)", yscale="log",
            title="Decode latency per window")  # fmt: skip
    ax2.set(
        xlabel="emission size (frames)",
        ylabel="ms",
        title="Time to first audio after the completing chunk (p50)",
    )
    _finish(fig, (ax1, ax2), sizes, result, path, plt, legend_size=7)


def _halo(result: dict[str, Any], path: Path, plt: Any) -> None:
    sizes = list(result["config"]["sizes"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    tiers = _tiers_with_points(result)
    first = tiers[0]["points"] if tiers else []
    xs, ys = _xy(first, "emit_frames", lambda p: p["decoded_per_emitted"])
    ax1.plot(xs, ys, "k.-", label="decoded / emitted frames (planned)")
    for tier in _tiers_with_points(result):
        color = _TIER_STYLE.get(tier["tier"])
        for measured, style, note in ((True, "o-", ""), (False, "o", " (estimated)")):
            pts = [p for p in tier["points"] if p["stream"].get("measured", True) is measured]
            kw = {"color": color} if measured else {"markeredgecolor": color, "markerfacecolor": "none"}
            xs, ys = _xy(pts, "emit_frames", lambda p: p["stream"].get("vs_whole"))
            if xs:
                ax1.plot(xs, ys, style, label=f"{tier['tier']}: stream / whole-clip time{note}", **kw)
            xs, ys = _xy(pts, "emit_frames", lambda p: p["stream"].get("us_per_emitted_frame"))
            if xs:
                ax2.plot(xs, ys, style, label=f"{tier['tier']}{note}", **kw)
    ax1.set(xlabel="emission size (frames)", ylabel="ratio", yscale="log",
            title=f"Halo overhead, {result['config']['clip_seconds']:g} s clip")  # fmt: skip
    ax2.set(xlabel="emission size (frames)", ylabel="device µs per emitted frame", yscale="log",
            title="Streaming cost per emitted frame (real time = 20,000 µs)")  # fmt: skip
    _finish(fig, (ax1, ax2), sizes, result, path, plt)


def _quality(result: dict[str, Any], path: Path, plt: Any) -> None:
    base = result.get("baselines") or {}
    sizes = list(result["config"]["sizes"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for key, label, color in (("naive", "naive chunks", "tab:red"), ("crossfade", "crossfade", "tab:purple")):
        rows = base.get(key) or []
        xs, ys = _xy(rows, "chunk_frames", lambda p: p["error"]["snr_db"])
        ax1.plot(xs, ys, "s--", color=color, label=label)
        xs, ys = _xy(rows, "chunk_frames", lambda p: p["error"]["click_energy_db"])
        ax2.plot(xs, ys, "s--", color=color, label=label)
    for tier in _tiers_with_points(result):
        tier_color = _TIER_STYLE.get(tier["tier"])
        xs, ys = _xy(tier["points"], "emit_frames", lambda p: (p["stream"].get("error") or {}).get("snr_db"))
        ax1.plot(xs, ys, "o-", color=tier_color, label=f"streamdec {tier['tier']}")
        xs, ys = _xy(tier["points"], "emit_frames",
                     lambda p: (p["stream"].get("error") or {}).get("click_energy_db"))  # fmt: skip
        ax2.plot(xs, ys, "o-", color=tier_color, label=f"streamdec {tier['tier']}")
    ax1.set(xlabel="chunk / emission size (frames)", ylabel="SNR vs whole-clip decode (dB)",
            title="Error against the whole decode (higher is better)")  # fmt: skip
    ax2.set(xlabel="chunk / emission size (frames)", ylabel="dB",
            title="Click energy: error/signal within ±5 ms of seams (lower is better)")  # fmt: skip
    _finish(fig, (ax1, ax2), sizes, result, path, plt)


def _concurrency(result: dict[str, Any], path: Path, plt: Any) -> None:
    conc = result.get("concurrency") or {}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    for name, marker, color in (("decoder", "o-", "tab:blue"), ("websocket", "s--", "tab:orange")):
        points = conc.get(name) or []
        xs, ys = _xy(points, "streams", lambda p: _p(p["ttfa_ms"], "p99"))
        ax1.plot(xs, ys, marker, color=color, label=f"{name} p99")
        xs, ys = _xy(points, "streams", lambda p: _p(p["ttfa_ms"]))
        ax1.plot(xs, ys, marker, color=color, alpha=0.35, label=f"{name} p50")
        xs, ys = _xy(points, "streams", lambda p: p["streams_with_underruns"])
        ax2.plot(xs, ys, marker, color=color, label=f"{name}: streams with underruns")
        util = [(p["streams"], p["gpu_util_pct"] if p["gpu_util_pct"] is not None else 100 * (p["busy_fraction"] or 0))
                for p in points]  # fmt: skip
        if util:
            ax3.plot([u[0] for u in util], [u[1] for u in util], marker, color=color, label=name)
    limit = result["config"]["ttfa_limit_ms"]
    ax1.axhline(limit, color="red", lw=0.8, gid="reference", label=f"{limit:g} ms")
    src = (
        "NVML"
        if any(p.get("gpu_util_pct") is not None for p in conc.get("decoder") or [])
        else "engine busy time"
    )
    ax1.set(xlabel="concurrent real-time streams", ylabel="ms", yscale="log", title="Time to first audio")
    ax2.set(xlabel="concurrent real-time streams", ylabel="streams", title="Streams with underruns")
    ax3.set(xlabel="concurrent real-time streams", ylabel="%", title=f"Device utilisation ({src})")
    streams = sorted({p["streams"] for name in ("decoder", "websocket") for p in conc.get(name) or []})
    _finish(fig, (ax1, ax2, ax3), streams or [1], result, path, plt)


def write_plots(result: dict[str, Any], stem: Path) -> list[Path]:
    """Write ``<stem>-latency.png``, ``-halo.png``, ``-quality.png``, ``-concurrency.png``; return them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for suffix, draw in (
        ("latency", _latency),
        ("halo", _halo),
        ("quality", _quality),
        ("concurrency", _concurrency),
    ):
        path = stem.with_name(f"{stem.name}-{suffix}.png")
        draw(result, path, plt)
        written.append(path)
    return written
