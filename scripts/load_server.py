"""Offer N real-time streams to a streamdec server at once; report who was admitted and how they played.

Each offered stream is one client on its own connection, as N users would be: it sends ``start``, then
latents at real time (``--chunk`` frames every ``chunk / frame_rate`` seconds) for ``--seconds`` of audio,
then ``end``, and reads everything. A listener model plays each admitted stream as a browser player does:
it starts ``--prebuffer-ms`` after the first audio and plays at the sample rate; an audio message that
arrives after its play time is an underrun (the stall is counted, and playback resumes from it).

By default the script starts ``streamdec serve --codec tiny --port 0`` itself (``--serve-args`` adds
flags) and stops it afterwards; ``--url`` uses a running server instead. The JSON written to ``--out``
holds the command, the host, every stream's outcome and a summary.

    python scripts/load_server.py --streams 16 --seconds 6 --out bench/results/cpu/server-load-16-tiny.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from websockets.asyncio.client import connect

from streamdec.bench.meta import git_commit
from streamdec.protocol import (
    Done,
    End,
    ErrorMessage,
    Ready,
    Start,
    Started,
    encode_latents,
    encode_text,
    parse_audio,
    parse_server_text,
)


@dataclass
class StreamOutcome:
    """What one offered stream saw."""

    index: int
    admitted: bool = False
    refusal: str | None = None  # error code of a refused start
    retry_after_ms: int | None = None
    answer_s: float | None = None  # start sent -> started or error received
    ttfa_s: float | None = None  # first latent sent -> first audio received
    underruns: int = 0
    stall_s: float = 0.0  # total time the listener waited for audio after playback began
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (audio position s, stall s) each
    # one row per audio message: seconds since the first latent was sent when it arrived, its first
    # sample's position in the stream (s), its length (s), and its slack: how long before the listener
    # needed it it arrived (negative: an underrun of that much)
    timeline: list[tuple[float, float, float, float]] = field(default_factory=list)
    send_late_max_s: float = 0.0  # the most any latent message went out after its real-time moment
    play_s: float | None = None  # first audio -> last sample played (audio length + stalls + prebuffer)
    status: str | None = None  # done status
    audio_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class Listener:
    """Plays audio as it arrives: starts ``prebuffer`` after the first message, stalls when starved."""

    def __init__(self, sample_rate: int, prebuffer: float) -> None:
        self.rate, self.prebuffer = sample_rate, prebuffer
        self.clock: float | None = None  # wall time at which sample 0 plays (moves on with each stall)
        self.first: float | None = None
        self.underruns, self.stall = 0, 0.0
        self.stalls: list[tuple[float, float]] = []
        self.samples = 0
        self.timeline: list[tuple[float, float, float, float]] = []

    def arrive(self, now: float, start_sample: int, n_samples: int, since: float = 0.0) -> None:
        if self.clock is None:
            self.first, self.clock = now, now + self.prebuffer
        due = self.clock + start_sample / self.rate
        self.timeline.append(
            (round(now - since, 4), round(start_sample / self.rate, 4), round(n_samples / self.rate, 4),
             round(due - now, 4))
        )  # fmt: skip
        if now > due:  # starved: playback stops until this message is here
            self.underruns += 1
            self.stall += now - due
            self.stalls.append((round(start_sample / self.rate, 3), round(now - due, 4)))
            self.clock += now - due
        self.samples = start_sample + n_samples

    def end(self) -> float | None:
        if self.clock is None or self.first is None:
            return None
        return self.clock + self.samples / self.rate - self.first


async def offer(url: str, index: int, args: argparse.Namespace, out: StreamOutcome) -> None:
    """One client: start, paced latents, end, and read until done (or refusal)."""
    async with connect(url, proxy=None, compression=None, max_size=2**26, open_timeout=30) as ws:
        ready = parse_server_text(await ws.recv())
        assert isinstance(ready, Ready), ready
        codec = ready.codec
        rate = codec.sample_rate / codec.hop_size
        frames = round(args.seconds * rate)
        gen = torch.Generator().manual_seed(index)
        latents = torch.randn(frames, codec.latent_dim, generator=gen)
        asked = time.monotonic()
        await ws.send(encode_text(Start(index)))
        reply = parse_server_text(await ws.recv())
        out.answer_s = time.monotonic() - asked
        if isinstance(reply, ErrorMessage):
            out.refusal, out.retry_after_ms = reply.code.value, reply.retry_after_ms
            return
        assert isinstance(reply, Started), reply
        out.admitted = True
        listener = Listener(codec.sample_rate, args.prebuffer_ms / 1000)
        began = time.monotonic()

        async def produce() -> None:
            for seq, first in enumerate(range(0, frames, args.chunk)):
                at = began + (first + args.chunk) / rate
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                out.send_late_max_s = max(out.send_late_max_s, time.monotonic() - at)
                await ws.send(encode_latents(index, seq, latents[first : first + args.chunk]))
            await ws.send(encode_text(End(index)))

        producer = asyncio.create_task(produce())
        async for message in ws:
            now = time.monotonic()
            if isinstance(message, bytes):
                audio = parse_audio(message)
                if out.ttfa_s is None:
                    out.ttfa_s = now - began
                listener.arrive(now, audio.start_sample, audio.n_samples, since=began)
                continue
            msg = parse_server_text(message)
            if isinstance(msg, ErrorMessage):
                out.errors.append(msg.code.value)
            elif isinstance(msg, Done):
                out.status = msg.status
                break
        await producer
        out.underruns, out.stall_s, out.play_s = listener.underruns, listener.stall, listener.end()
        out.stalls, out.timeline = listener.stalls, listener.timeline
        out.audio_s = listener.samples / codec.sample_rate


async def run_load(url: str, args: argparse.Namespace) -> list[StreamOutcome]:
    outcomes = [StreamOutcome(i) for i in range(args.streams)]

    async def one(i: int) -> None:
        await asyncio.sleep(i * args.stagger_ms / 1000)
        try:
            await offer(url, i, args, outcomes[i])
        except Exception as exc:  # a dropped connection is an outcome, not a crash of the run
            outcomes[i].errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one(i) for i in range(args.streams)))
    return outcomes


def start_server(serve_args: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    cmd = [sys.executable, "-m", "streamdec.cli", "serve", "--port", "0", *shlex.split(serve_args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if "ws://" in line:
            return proc, "ws://" + line.split("ws://", 1)[1].split()[0], lines
    raise SystemExit(f"streamdec serve exited with {proc.wait()}:\n" + "\n".join(lines))


def summary(outcomes: list[StreamOutcome]) -> dict[str, Any]:
    admitted = [o for o in outcomes if o.admitted]
    refused = [o for o in outcomes if o.refusal is not None]
    ttfa = sorted(o.ttfa_s for o in admitted if o.ttfa_s is not None)
    answers = [o.answer_s for o in outcomes if o.answer_s is not None]
    return {
        "offered": len(outcomes),
        "admitted": len(admitted),
        "refused": len(refused),
        "refusal_codes": sorted({o.refusal for o in refused if o.refusal}),
        "dropped_or_failed": len([o for o in outcomes if not o.admitted and o.refusal is None]),
        "admitted_completed": len([o for o in admitted if o.status == "completed"]),
        "admitted_underruns": sum(o.underruns for o in admitted),
        "admitted_stall_s": round(sum(o.stall_s for o in admitted), 4),
        # past the first second: the start-up tiles (small, halo-heavy) are behind; what admission governs
        "admitted_underruns_after_1s": sum(1 for o in admitted for at, _ in o.stalls if at >= 1.0),
        "admitted_stall_after_1s_s": round(sum(s for o in admitted for at, s in o.stalls if at >= 1.0), 4),
        # a producer that sent late starves its listener whatever the server does
        "admitted_send_late_max_s": round(max((o.send_late_max_s for o in admitted), default=0.0), 4),
        "ttfa_p50_s": round(statistics.median(ttfa), 4) if ttfa else None,
        "ttfa_max_s": round(ttfa[-1], 4) if ttfa else None,
        "start_answer_max_s": round(max(answers), 4) if answers else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server's stream URL (default: start one)")
    parser.add_argument(
        "--serve-args", default="--codec tiny", help="flags for the server this script starts"
    )
    parser.add_argument("--streams", type=int, default=16, help="real-time streams offered at once")
    parser.add_argument("--seconds", type=float, default=6.0, help="audio per stream")
    parser.add_argument("--chunk", type=int, default=4, help="latent frames per message")
    parser.add_argument("--stagger-ms", type=float, default=20.0, help="between two streams' starts")
    parser.add_argument("--prebuffer-ms", type=float, default=100.0, help="listener's buffer before playing")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    proc, server_lines = None, list[str]()
    url = args.url
    if url is None:
        proc, url, server_lines = start_server(args.serve_args)
    try:
        outcomes = asyncio.run(run_load(url, args))
    finally:
        if proc is not None:
            proc.terminate()
            out, _ = proc.communicate(timeout=120)
            server_lines += out.splitlines()
    commit, dirty = git_commit(Path(__file__).resolve().parent.parent)
    result = {
        "command": "python scripts/load_server.py " + shlex.join(sys.argv[1:]),
        "git_commit": commit,
        "git_dirty": dirty,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            # other work sharing the CPUs, before and after the run
            "load_average_1_5_15_at_start": load_at_start,
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
        "server_output": server_lines,
        "summary": summary(outcomes),
        "streams": [asdict(o) for o in outcomes],
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
