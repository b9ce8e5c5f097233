"""How long ``streamdec serve`` takes from process start to serving, optionally with a py-spy profile of it.

Starts the server with the given arguments, copies its output to a log, stops the clock at its "serving
codec" line, then stops it with SIGINT and waits for it. With ``--pyspy PATH`` the whole start-up is
sampled by ``py-spy record`` (every thread, raw format; ``scripts/pyspy_table.py`` turns it into a
table), which slows the process a little, so time a start without it too:

    TRITON_CACHE_DIR=/tmp/tc python3 scripts/time_serve_start.py --log cold.log -- \\
        --device cuda --codec auk-24k --port 0
    TRITON_CACHE_DIR=/tmp/tc python3 scripts/time_serve_start.py --log warm.log --pyspy warm.raw -- \\
        --device cuda --codec auk-24k --port 0
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

_READY = "serving codec"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", required=True, help="where the server's output and the start-up time go")
    ap.add_argument("--pyspy", help="also record a py-spy raw profile of the start-up here")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then the arguments of streamdec serve")
    args = ap.parse_args()
    serve = [a for a in args.serve_args if a != "--"]
    command = [sys.executable, "-m", "streamdec", "serve", *serve]
    log = Path(args.log)
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    spy = None
    if args.pyspy:
        spy = subprocess.Popen(
            ["py-spy", "record", "--pid", str(proc.pid), "--rate", "200", "--format", "raw", "--threads",
             "--output", args.pyspy, "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
    lines = [f"$ {shlex.join(command)}"]
    ready = None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if _READY in line:
            ready = time.monotonic() - began
            break
        if time.monotonic() - began > args.timeout:
            break
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its profile when interrupted
        spy.wait(timeout=60)
    lines.append(
        f"start-up (process start to serving): {ready:.1f} s"
        if ready is not None
        else "start-up: never served"
    )
    proc.send_signal(signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
    lines.extend(rest.splitlines())
    log.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if ready is not None else 1)


if __name__ == "__main__":
    main()
