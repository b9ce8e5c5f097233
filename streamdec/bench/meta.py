"""What a result file records about where and how it was made, and GPU utilisation sampling."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .. import settings
from ..kernels import alias_free

__all__ = [
    "ResultFile",
    "UtilSampler",
    "device_slug",
    "environment",
    "finish_environment",
    "git_commit",
    "script_header",
]


def git_commit(root: Path) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the checkout at ``root``; ``$STREAMDEC_COMMIT`` where set (a copied tree
    whose git HEAD is not the code that runs, as on a GPU host) or where git cannot tell."""
    pinned = settings.COMMIT.value()
    if pinned:
        return pinned, None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return settings.COMMIT.value() or "unknown", None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def device_slug(device: torch.device) -> str:
    """Short device name for file names: ``cpu``, ``h200``, ``a100-sxm4-80gb``..."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "").strip()
    return "-".join(name.split()) or "cuda"


def environment(device: torch.device) -> dict[str, Any]:
    """Command, date, commit, versions, device and machine load at the time of the call."""
    root = Path(__file__).resolve().parents[2]
    commit, dirty = git_commit(root)
    env: dict[str, Any] = {
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "argv": list(sys.argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_start": _load_average(),
        "platform": platform.platform(),
        # Switches that change what is measured (fused kernels, graph/compile escape hatches); the TF32
        # policy is the codec's precision, recorded with the codec.
        "streamdec_env": settings.recorded(),
    }
    env["fused_alias_free"] = {"disabled": alias_free.ENV_DISABLED}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_multiprocessors"] = props.multi_processor_count
    return env


def finish_environment(env: dict[str, Any]) -> None:
    env["load_average_end"] = _load_average()


def script_header(*, codec: str, precision: str, commit: str | None, timing: str) -> dict[str, Any]:
    """The head of a GPU script's JSON (``scripts/bench_gpu.py``, ``bench_kernels.py``): the command,
    date, device, versions, commit (``commit``, else git's), codec, precision, the ``STREAMDEC_*``
    switches and how it timed. Needs CUDA."""
    return {
        "command": " ".join([sys.executable, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": commit or git_commit(Path(__file__).resolve().parents[2])[0],
        "codec": codec,
        "dtype": "float32",
        "precision": precision,
        # switches that change what runs (STREAMDEC_TRITON_CONV, STREAMDEC_NO_FUSED, ...)
        "streamdec_env": settings.recorded(),
        "timing": timing,
    }


class ResultFile:
    """A script's JSON result, rewritten whole after every measurement, so a run cut short still leaves
    its figures; ``elapsed()`` is the time since it was created (the scripts' time budgets)."""

    def __init__(self, out: str | Path, result: dict[str, Any]) -> None:
        self.out = Path(out)
        self.result = result
        self.began = time.monotonic()
        self.save()

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")


class UtilSampler:
    """Samples ``torch.cuda.utilization()`` (NVML: share of time a kernel ran) every ``interval`` s.

    ``available`` is False where NVML cannot be read (no pynvml, no GPU); callers then report the
    engine's busy time instead and say so.
    """

    def __init__(self, device: torch.device, interval: float = 0.05) -> None:
        self.device = device
        self.interval = interval
        self.samples: list[float] = []
        self.available = False
        if device.type == "cuda":
            try:
                torch.cuda.utilization(device)
                self.available = True
            except Exception:  # pynvml missing or NVML refused: fall back to engine busy time
                self.available = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> UtilSampler:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="bench-util", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(float(torch.cuda.utilization(self.device)))
            except Exception:
                return
            time.sleep(self.interval)

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
