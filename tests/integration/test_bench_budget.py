"""`streamdec bench` fits any time budget: it shrinks its sweep and never fails because of the budget."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamdec.bench.cli import config_from_args, configure_bench, fit_budget

BIN = Path(sys.executable).with_name("streamdec")


def _config(*args: str) -> Any:
    parser = argparse.ArgumentParser()
    configure_bench(parser)
    return config_from_args(parser.parse_args(["--device", "cpu", *args]))


@pytest.mark.parametrize("budget", [10, 60, 120, 300])
def test_a_budget_shrinks_the_default_sweep(budget: int) -> None:
    """Below the full run's length every sweep is no larger than the default, and some are smaller."""
    full, short = _config(), _config("--budget-s", str(budget))
    assert set(short.sizes) <= set(full.sizes) and len(short.sizes) >= 2
    assert short.clip_seconds <= full.clip_seconds and short.repeats <= full.repeats
    assert set(short.streams) <= set(full.streams) and len(short.streams) >= 1
    assert (short.sizes, short.clip_seconds, short.streams) != (full.sizes, full.clip_seconds, full.streams)


def test_settings_the_user_gave_are_kept() -> None:
    """An explicit --sizes or --streams survives the shrinking."""
    cfg = _config("--budget-s", "30", "--sizes", "1,2,4", "--streams", "1,2")
    assert cfg.sizes == (1, 2, 4) and cfg.streams == (1, 2)


def test_a_long_budget_changes_nothing() -> None:
    """A budget longer than the full run leaves the defaults alone."""
    values = {"device": "cpu", "sizes": (1, 2), "clip_seconds": 4.0, "repeats": 5, "ttfa_repeats": 5,
              "streams": (1, 2), "conc_seconds": 4.0, "max_point_s": 8.0, "compile_estimate_s": 60.0,
              "tiers": ("eager",)}  # fmt: skip
    assert fit_budget(values, 10_000.0) == {}


def test_plots_of_a_run_that_measured_nothing(tmp_path: Path) -> None:
    """A run whose every section the budget skipped still gets its four plots, marked as not measured."""
    pytest.importorskip("matplotlib")
    from streamdec.bench.plots import write_plots

    result = {
        "meta": {"codec": {"name": "tiny"}, "device_name": "cpu", "torch": "x", "date_utc": "2026-01-01"},
        "config": {"sizes": [8, 64], "clip_seconds": 1.0, "ttfa_limit_ms": 100.0},
        "baselines": None,
        "tiles": {"tiers": []},
        "concurrency": None,
    }
    written = write_plots(result, tmp_path / "empty")
    assert [p.name for p in written] == [
        f"empty-{s}.png" for s in ("latency", "halo", "quality", "concurrency")
    ]
    assert all(p.stat().st_size > 0 for p in written)


def test_bench_with_a_one_minute_budget_exits_zero(tmp_path: Path) -> None:
    """`streamdec bench --budget-s 60` completes, writes its JSON and plots, and exits 0."""
    pytest.importorskip("matplotlib")
    result = subprocess.run(
        [
            str(BIN),
            "bench",
            "--budget-s",
            "60",
            "--threads",
            "1",
            "--quiet",
            "--out",
            str(tmp_path),
            "--name",
            "b",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    on_disk = json.loads((tmp_path / "b.json").read_text())
    assert on_disk["errors"] == []
    assert on_disk["config"]["budget_s"] == 60
    assert (tmp_path / "b-latency.png").exists()
