"""Run the GPU tests (tests/gpu) one pytest process per file, side by side on the one GPU.

Most of a GPU test run on a fresh host is Triton compiling kernels on the test process's one thread, so
files run in parallel processes finish in about the time of the slowest file rather than of all of them.
The tests time nothing and measure only their own process's memory, so sharing the GPU changes no result.
Each file's output goes to its own log; a file's summary is printed as it finishes, the whole log of any
file that failed at the end. Exits non-zero when any file failed.

    python3 scripts/test_gpu.py -m "cuda and not slow"            # make test-gpu
    python3 scripts/test_gpu.py -m "cuda and slow" --logs out/    # make test-gpu-slow, logs kept
    python3 scripts/test_gpu.py -m cuda -- -x -k stateful         # anything after -- goes to pytest
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "gpu"
# pytest's exit codes: 0 all passed, 5 nothing collected (every test deselected by -m in that file)
_PASSED = (0, 5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", dest="marks", default="cuda and not slow", help="pytest marker expression")
    ap.add_argument("--jobs", type=int, default=0, help="files at once (default: every file)")
    ap.add_argument("--logs", help="keep each file's log in this directory (default: a temporary one)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then more arguments for pytest")
    args = ap.parse_args()
    extra = [a for a in args.pytest_args if a != "--"]
    files = sorted(_TESTS.glob("test_*.py"))
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="streamdec-test-gpu-"))
    logs.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or len(files)
    print(f"{len(files)} files, {jobs} at a time, logs in {logs}", flush=True)

    began = time.monotonic()
    waiting = list(files)
    running: dict[Path, tuple[subprocess.Popen[bytes], float]] = {}
    failed: list[Path] = []
    # Stopped (Ctrl-C, or a time limit's SIGTERM), it stops its pytest processes too: none is left on the GPU.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                path = waiting.pop(0)
                with (logs / f"{path.stem}.log").open("wb") as log:
                    command = [sys.executable, "-m", "pytest", "-m", args.marks, str(path), *extra]
                    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                running[path] = (proc, time.monotonic())
            time.sleep(0.2)
            for path, (proc, started) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[path]
                if code not in _PASSED:
                    failed.append(path)
                summary = _summary(logs / f"{path.stem}.log")
                mark = "ok  " if code in _PASSED else "FAIL"
                print(f"{mark} {path.name}: {summary} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        for path, (proc, _) in running.items():
            proc.kill()
            proc.wait()
            print(f"stopped {path.name}: {_summary(logs / f'{path.stem}.log')}", flush=True)

    for path in failed:
        print(f"\n===== {path.name} =====\n{(logs / f'{path.stem}.log').read_text(errors='replace')}")
    verdict = f"{len(failed)} of {len(files)} files failed" if failed else f"all {len(files)} files passed"
    print(f"{verdict} in {time.monotonic() - began:.0f} s")
    return 1 if failed else 0


_TALLY = re.compile(r"\b\d+ (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b.* in [\d.]+s")


def _summary(log: Path) -> str:
    """pytest's tally ("12 passed, 3 deselected in 75.21s"), or the log's last line where it has none."""
    lines = [line.strip("= ") for line in log.read_text(errors="replace").splitlines() if line.strip()]
    tallies = [line for line in lines if _TALLY.search(line)]
    return tallies[-1] if tallies else lines[-1] if lines else "no output"


if __name__ == "__main__":
    sys.exit(main())
