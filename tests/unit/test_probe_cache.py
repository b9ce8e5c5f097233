"""The capacity probe's kept verdicts: a start reuses one only when its fingerprint and replays match."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from streamdec.engine.scheduler import BucketKey
from streamdec.server.probe import CapacityReport, PacedRun
from streamdec.server.probe_cache import (
    REPLAY_SLOWEST,
    REPLAY_TOLERANCE,
    KeptVerdict,
    VerdictStore,
    replays_agree,
)


class _Engine:
    """What the store reads of an engine: the replay times warm-up measured."""

    def __init__(self, replays: dict[BucketKey, float]) -> None:
        self._replays = replays

    def measured_replay_ms(self) -> dict[BucketKey, float]:
        return dict(self._replays)


REPLAYS = {BucketKey(64, 4, "step"): 12.0, BucketKey(16, 4, "step"): 4.0, BucketKey(64, 12, "prime"): 20.0}
# as a server passes them: tuples among them (a codec's config), which a stored verdict reads back as lists
FACTS: dict[str, Any] = {
    "codec": "auk-24k",
    "config": {"channels": (1536, 768)},
    "mode": "stateful",
    "slots": (64,),
    "margin_s": 0.035,
}
REPORT = CapacityReport(57.0, 238, (PacedRun(64, 0.068, 0, 0.28),), 0.035, 64)


def _kept(tmp_path: Path, replays: dict[BucketKey, float] = REPLAYS, **facts: Any) -> KeptVerdict:
    return KeptVerdict(VerdictStore(tmp_path), {**FACTS, **facts}, [_Engine(replays)])


def test_a_stored_verdict_comes_back_whole(tmp_path: Path) -> None:
    first = _kept(tmp_path)
    assert first.load() is None  # nothing kept yet: the start probes
    path = first.store_report(REPORT)
    assert path is not None and path.parent == tmp_path
    found = _kept(tmp_path).load()
    assert found is not None
    report, measured_at = found
    assert report == REPORT and report.summary() == REPORT.summary()
    assert measured_at.endswith("Z")


def test_another_setting_or_other_code_misses(tmp_path: Path) -> None:
    _kept(tmp_path).store_report(REPORT)
    assert _kept(tmp_path, slots=[128]).load() is None
    assert _kept(tmp_path, margin_s=0.05).load() is None
    kept = _kept(tmp_path)
    record = json.loads(next(tmp_path.glob("capacity-*.json")).read_text())
    record["fingerprint"]["sources"] = "a digest of other sources"  # the file says another commit made it
    next(tmp_path.glob("capacity-*.json")).write_text(json.dumps(record))
    assert kept.load() is None


def test_replays_must_agree_in_total_and_each(tmp_path: Path) -> None:
    _kept(tmp_path).store_report(REPORT)
    near = {k: v * (1 + REPLAY_TOLERANCE / 2) for k, v in REPLAYS.items()}
    assert _kept(tmp_path, near).load() is not None
    slower = {k: v * (1 + 2 * REPLAY_TOLERANCE) for k, v in REPLAYS.items()}  # a shared or slower device
    assert _kept(tmp_path, slower).load() is None
    faster = {k: v * (1 - 2 * REPLAY_TOLERANCE) for k, v in REPLAYS.items()}  # it might hold more now
    assert _kept(tmp_path, faster).load() is None
    one_slow = dict(REPLAYS)
    one_slow[BucketKey(16, 4, "step")] *= 1 + 2 * REPLAY_SLOWEST  # the total within tolerance, one far off
    assert abs(sum(one_slow.values()) - sum(REPLAYS.values())) <= REPLAY_TOLERANCE * sum(REPLAYS.values())
    assert _kept(tmp_path, one_slow).load() is None
    fewer = {k: v for k, v in REPLAYS.items() if k.kind == "step"}  # other buckets
    assert _kept(tmp_path, fewer).load() is None


def test_replays_agree_needs_the_same_engines() -> None:
    one = [{"step 64x4": 12.0}]
    assert replays_agree(one, one)
    assert not replays_agree(one + one, one)
    assert not replays_agree([{"step 32x4": 12.0}], one)
    assert not replays_agree([{"step 64x4": 0.0}], [{"step 64x4": 0.0}])


def test_an_unreadable_verdict_counts_as_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kept = _kept(tmp_path)
    path = kept.store_report(REPORT)
    assert path is not None
    path.write_text("{ not json")
    with caplog.at_level(logging.WARNING, logger="streamdec.server"):
        assert kept.load() is None
    assert "unreadable" in caplog.text
    assert kept.store_report(REPORT) == path and kept.load() is not None  # the next probe rewrites it


def test_an_unwritable_directory_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    kept = KeptVerdict(VerdictStore(blocker / "capacity"), FACTS, [_Engine(REPLAYS)])
    with caplog.at_level(logging.WARNING, logger="streamdec.server"):
        assert kept.store_report(REPORT) is None
    assert "next start probes again" in caplog.text
    assert list(tmp_path.iterdir()) == [blocker]  # no partial file left behind


def test_only_a_verdict_whose_first_run_passed_is_kept() -> None:
    from streamdec.server.app import _clean

    assert _clean(REPORT)
    stepped_down = CapacityReport(
        57.0, 238, (PacedRun(64, -0.076, 13, 0.32), PacedRun(32, 0.086, 0, 0.24)), 0.035, 32
    )
    assert not _clean(stepped_down)  # a stall or a busy host: the next start probes again
    assert not _clean(CapacityReport(0.5, 0, (PacedRun(1, -0.2, 3, 0.9),), 0.035, 0))
