"""The capacity probe's verdict kept between starts: a warm start reuses it while nothing it rests on changed.

The probe (:mod:`.probe`) paces real-time streams for about three seconds of every GPU start. What it
concludes depends on the code, the codec and its precision, the decoder's settings (mode, slots, tiles,
hold lead), the listener it models, the device and the software stack, and on how long the device takes
for each captured graph. The first group is the verdict's fingerprint; the last is measured again at
every warm-up anyway (each graph's replay is timed when it is captured). A start whose fingerprint
matches a stored verdict, and whose replays took what they took when that verdict was measured (in
total within :data:`REPLAY_TOLERANCE`, and none more than :data:`REPLAY_SLOWEST` longer), takes that
verdict instead of probing again; any other start probes and stores what it found, where its first paced
run passed (the server's rule: a verdict that had to step down is not carried forward). A device shared
with another process since, other clocks, another torch or commit: each shows in one of the two and makes
the start probe.

Only on CUDA: a CPU engine's capacity depends on what else the host runs, which nothing here can see.
Verdicts are small JSON files named by the fingerprint's digest in one directory
(``streamdec serve --capacity-cache``, empty to probe at every start); deleting one forces a probe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .probe import CapacityReport, PacedRun

__all__ = ["REPLAY_SLOWEST", "REPLAY_TOLERANCE", "KeptVerdict", "VerdictStore", "replays_agree", "replays_of"]

log = logging.getLogger("streamdec.server")

#: The replays' total may differ from the stored verdict's by this share (one timed replay per graph).
REPLAY_TOLERANCE = 0.10
#: And no single graph may take more than this share longer than it did then.
REPLAY_SLOWEST = 0.25
_FORMAT = 1


def _sources_digest() -> str:
    """A digest of the package's and the server's sources: the code that decides the verdict."""
    import streamdec

    # Installed, the server is a subpackage of streamdec; in a checkout, a folder beside it.
    roots = {Path(streamdec.__file__).resolve().parent, Path(__file__).resolve().parent}
    files = sorted({p.resolve() for root in roots for p in root.rglob("*.py")})
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def replays_of(engines: list[Any]) -> list[dict[str, float]]:
    """Each engine's measured replay times, ``"kind BATCHxFRAMES"`` -> ms (what the warm-up timed)."""
    return [
        {f"{k.kind} {k.batch}x{k.frames}": float(ms) for k, ms in engine.measured_replay_ms().items() if ms}
        for engine in engines
    ]


def replays_agree(now: list[dict[str, float]], then: list[dict[str, float]]) -> bool:
    """Whether the replays measured now are those a stored verdict was measured with (module docstring)."""
    if len(now) != len(then) or any(a.keys() != b.keys() for a, b in zip(now, then, strict=True)):
        return False
    total_now = sum(sum(d.values()) for d in now)
    total_then = sum(sum(d.values()) for d in then)
    if total_then <= 0 or abs(total_now - total_then) > REPLAY_TOLERANCE * total_then:
        return False
    return all(a[k] <= (1 + REPLAY_SLOWEST) * b[k] for a, b in zip(now, then, strict=True) for k in a)


class VerdictStore:
    """Stored probe verdicts in ``directory``, one per fingerprint (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    @staticmethod
    def fingerprint(facts: Mapping[str, Any]) -> dict[str, Any]:
        """``facts`` (the decoder's and the listener's settings, as the server knows them) with what the
        process adds: the devices, the software, the sources."""
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory} bytes")
        try:
            import triton

            triton_version: str | None = triton.__version__
        except ImportError:  # pragma: no cover - every CUDA host here has Triton
            triton_version = None
        fingerprint = {
            "format": _FORMAT,
            **facts,
            "devices": devices,
            "cuda": torch.version.cuda,
            "torch": torch.__version__,
            "triton": triton_version,
            "sources": _sources_digest(),
        }
        # as a stored verdict reads back: JSON has lists, not tuples, and string keys
        normal: dict[str, Any] = json.loads(json.dumps(fingerprint, sort_keys=True))
        return normal

    def _path(self, fingerprint: Mapping[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:24]
        return self.directory / f"capacity-{digest}.json"

    def load(
        self, fingerprint: Mapping[str, Any], replays: list[dict[str, float]]
    ) -> tuple[CapacityReport, str] | None:
        """The stored verdict for ``fingerprint`` and when it was measured, where the replays agree; else
        None. A file that cannot be read or parsed counts as none (the start probes and rewrites it)."""
        path = self._path(fingerprint)
        try:
            stored = json.loads(path.read_text())
            if stored["fingerprint"] != fingerprint or not replays_agree(replays, stored["replays_ms"]):
                return None
            report = stored["report"]
            runs = tuple(PacedRun(**run) for run in report.pop("runs"))
            return CapacityReport(**report, runs=runs), str(stored["measured_at"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("stored capacity verdict %s unreadable (%s): probing", path, exc)
            return None

    def store(
        self, fingerprint: Mapping[str, Any], replays: list[dict[str, float]], report: CapacityReport
    ) -> Path | None:
        """Keep ``report`` for the next start (written whole, then renamed into place); None where the
        directory cannot be written (a warning: the next start probes again)."""
        path = self._path(fingerprint)
        record = {
            "fingerprint": dict(fingerprint),
            "replays_ms": replays,
            "report": dataclasses.asdict(report),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(record, indent=1, sort_keys=True))
            partial.replace(path)
        except OSError as exc:
            log.warning(
                "could not keep the capacity verdict in %s (%s): the next start probes again", path, exc
            )
            return None
        return path


class KeptVerdict:
    """One start's view of its stored verdict: the fingerprint of ``facts`` and the engines' replays, taken
    once, for :meth:`load` before probing and :meth:`store` after."""

    def __init__(self, store: VerdictStore, facts: Mapping[str, Any], engines: list[Any]) -> None:
        self.store = store
        self.fingerprint = store.fingerprint(facts)
        self.replays = replays_of(engines)

    def load(self) -> tuple[CapacityReport, str] | None:
        return self.store.load(self.fingerprint, self.replays)

    def store_report(self, report: CapacityReport) -> Path | None:
        return self.store.store(self.fingerprint, self.replays, report)
