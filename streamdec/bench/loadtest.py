"""``streamdec loadtest``: how many real-time streams one server process carries, measured from outside.

It starts ``streamdec serve`` as a subprocess (or targets ``--url``), then for each stream count ``N``
spawns client processes (:mod:`.loadclient`, ``--streams-per-process`` streams each) that open their
connections, wait for a common start time and pace latents like a TTS model. Every stream's audio is
checked (sample count, contiguity, done status) and one sampled stream is compared sample by sample with
the offline decode of the same latents. Per run it records what the listeners saw (:mod:`.loadstats`)
and what the server spent: CPU seconds of its process per stream-second (``/proc/<pid>/stat``), bytes and
messages per second, and event-loop lag (from ``/metrics``).

A run *passes* when every stream's audio is right, p99 time to first audio after the first tile became
decodable is within ``--ttfa-limit-ms`` and no listener underran. The sweep grows ``N`` while runs
pass, bisects once one fails, and decides a count only after ``--confirm`` runs agree (so one noisy run
never ends it); the result is the largest ``N`` that holds below the smallest that fails.

Example (the CPU figure in bench/results/cpu/)::

    streamdec loadtest --engine simulated --out bench/results/cpu/serve-capacity-simulated.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from streamdec import settings
from streamdec.affinity import available_cpus, check_cpus, format_cpus, parse_cpus, pin, thread_cpus
from streamdec.errors import ConfigError

from .loadclient import ClientPlan, ClientReport, StreamPlan, client_main, stream_latents
from .loaddecoder import DecoderOptions, DecoderRun, decoder_main
from .loadstats import (
    Limits,
    StreamRecord,
    SweepPlan,
    decided,
    distribution,
    first_window_chunk,
    gc_pause_max_ms,
    generator_problem,
    largest_holding,
    loop_lag_ms,
    next_streams,
    parse_prometheus,
    proc_cpu_seconds,
    summarize_point,
    summarize_stream,
    tier_calls,
    verdict,
)

__all__ = ["LoadSettings", "configure_loadtest", "run_loadtest"]

_LAG = "streamdec_event_loop_lag_seconds"


@dataclass(frozen=True)
class LoadSettings:
    """How streams are paced and checked; see ``streamdec loadtest --help`` for each field."""

    chunk_frames: int = 4
    period_ms: float = 80.0
    speedup: float = 1.0
    seconds: float = 8.0
    spread_s: float = 2.0
    prebuffer_ms: float = 100.0
    streams_per_connection: int = 1
    streams_per_process: int = 200
    processes: int | None = None
    min_emit: int = 4
    #: None: the server's own default (16-frame steps in stateful mode, 64-frame tiles in halo mode)
    max_emit: int | None = None
    fmt: str = "pcm_s16le"
    seed: int = 0
    drain_s: float = 30.0
    reference_tolerance: float = 2.0  # int16 steps (pcm_s16le) or 1e-4 units (pcm_f32le)


@dataclass(frozen=True)
class CodecGeometry:
    """What the server's ``/healthz`` says about its codec."""

    name: str
    latent_dim: int
    hop_size: int
    sample_rate: int
    channels: int
    left: int
    right: int

    @classmethod
    def from_json(cls, codec: dict[str, Any]) -> CodecGeometry:
        left, right = codec["context"]
        return cls(
            codec["name"],
            codec["latent_dim"],
            codec["hop_size"],
            codec["sample_rate"],
            codec["channels"],
            left,
            right,
        )


# -- the server under test -------------------------------------------------------------------------
class ServerProcess:
    """``streamdec serve`` in a subprocess on a free port; its output is kept for error messages."""

    _SERVING = re.compile(r"serving codec .* at ws://[^\s]+?:(\d+)/")

    def __init__(
        self, serve_args: list[str], start_timeout: float, env: dict[str, str] | None = None
    ) -> None:
        self.argv = [sys.executable, "-m", "streamdec.cli", "serve", *serve_args]
        self.env = settings.child_environment(env)
        self.start_timeout = start_timeout
        self.lines: deque[str] = deque(maxlen=60)
        self.port: int | None = None
        self._ready = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=self.env,
        )
        threading.Thread(target=self._pump, name="loadtest-server-output", daemon=True).start()
        if not self._ready.wait(self.start_timeout) or self.port is None:
            self.__exit__()
            raise RuntimeError(
                f"server did not start within {self.start_timeout:g} s:\n" + "\n".join(self.lines)
            )
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            match = self._SERVING.search(line)
            if match:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # it exited: stop waiting

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass
class Probe:
    """The server's counters at one moment."""

    at: float
    cpu_s: float | None
    metrics: dict[str, float] = field(default_factory=dict)


class ServerFigures:
    """Reads ``/metrics`` and the server process's CPU time."""

    def __init__(self, http_base: str, pid: int | None) -> None:
        self.http_base, self.pid = http_base, pid
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy

    def get(self, path: str) -> str:
        with self._opener.open(self.http_base + path, timeout=30) as response:
            return str(response.read().decode())

    def probe(self) -> Probe:
        cpu = None
        if self.pid is not None:
            with open(f"/proc/{self.pid}/stat") as f:
                cpu = proc_cpu_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
        return Probe(time.monotonic(), cpu, parse_prometheus(self.get("/metrics")))


def server_delta(before: Probe, after: Probe, stream_s: float) -> dict[str, Any]:
    """Host-path figures of the server between two probes."""
    wall = after.at - before.at
    m0, m1 = before.metrics, after.metrics

    def delta(name: str) -> float | None:
        return m1[name] - m0.get(name, 0.0) if name in m1 else None

    def per_s(name: str) -> float | None:
        change = delta(name)
        return None if change is None else round(change / wall, 1)

    cpu = None if after.cpu_s is None or before.cpu_s is None else after.cpu_s - before.cpu_s
    device_s, calls = delta("streamdec_window_decode_seconds_sum"), delta("streamdec_engine_calls_total")
    requests = delta("streamdec_window_decode_seconds_count")
    return {
        "wall_s": round(wall, 3),
        "cpu_s": None if cpu is None else round(cpu, 3),
        "cpu_cores": None if cpu is None else round(cpu / wall, 3),
        "cpu_s_per_stream_s": None if cpu is None or not stream_s else round(cpu / stream_s, 5),
        "bytes_in_per_s": per_s("streamdec_received_bytes_total"),
        "bytes_out_per_s": per_s("streamdec_sent_bytes_total"),
        "loop_lag_ms": loop_lag_ms(m0, m1, _LAG),
        # full collections in between and the longest pause of any generation (stalls of every stream)
        "gc_full_collections": delta('streamdec_gc_collections_total{generation="2"}'),
        "gc_pause_max_ms": gc_pause_max_ms(m1),
        # the engine's device time over the run's wall time, and windows or stateful calls per device call
        "engine_busy": None if device_s is None else round(device_s / wall, 3),
        "engine_mean_batch": None if not calls or requests is None else round(requests / calls, 1),
        # device calls in the run by tier: an eager one (a shape no warm-up captured) holds the device
        # thread, and the interpreter lock, far longer than a replay
        "engine_calls_by_tier": tier_calls(m0, m1),
    }


# -- one run ---------------------------------------------------------------------------------------
def stream_plans(n: int, s: LoadSettings, geo: CodecGeometry) -> list[StreamPlan]:
    """The ``n`` streams of a run: equal lengths, starts spread evenly over ``spread_s``."""
    frame_rate = geo.sample_rate / geo.hop_size
    frames = max(s.chunk_frames, round(s.seconds * frame_rate / s.chunk_frames) * s.chunk_frames)
    # The first window emits min_emit frames whatever the largest tile is, so min_emit stands in for it.
    largest = s.min_emit if s.max_emit is None else s.max_emit
    decodable = first_window_chunk(geo.left, geo.right, s.min_emit, largest, frames, s.chunk_frames)
    return [StreamPlan(i, s.seed + i, frames, s.spread_s * i / n, decodable) for i in range(n)]


def _client_plans(
    url: str, plans: list[StreamPlan], s: LoadSettings, geo: CodecGeometry, token: str | None
) -> list[ClientPlan]:
    processes = s.processes or math.ceil(len(plans) / s.streams_per_process)
    period = s.period_ms / 1000.0 / s.speedup
    return [
        ClientPlan(
            url,
            tuple(plans[p::processes]),
            s.streams_per_connection,
            s.chunk_frames,
            period,
            geo.latent_dim,
            s.fmt,
            sampled=0,
            token=token,
            drain_s=s.drain_s,
        )
        for p in range(min(processes, len(plans)))
    ]


def _drive(
    clients: list[ClientPlan],
    figures: ServerFigures,
    connect_timeout: float,
    cpus: frozenset[int] | None = None,
) -> tuple[list[ClientReport], Probe, Probe, float]:
    """Spawn the client processes (on ``cpus``, if given), start them together, collect their reports and
    the server probes."""
    ctx = mp.get_context("spawn")  # no inherited event loop, threads or torch state
    pipes: list[Connection] = []
    procs = []
    for plan in clients:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=client_main, args=(plan, child), daemon=True)
        proc.start()
        child.close()
        if cpus is not None:
            assert proc.pid is not None
            pin(cpus, proc.pid)  # before it starts a thread: those it starts inherit the CPUs
        pipes.append(parent)
        procs.append(proc)
    early: dict[int, ClientReport] = {}
    try:
        for i, pipe in enumerate(pipes):
            if not pipe.poll(connect_timeout):
                raise RuntimeError(f"client process {i} did not connect within {connect_timeout:g} s")
            kind, payload = pipe.recv()
            if kind == "report":  # it failed before connecting
                early[i] = payload
        before = figures.probe()
        t0 = time.monotonic() + 0.3
        for i, pipe in enumerate(pipes):
            if i not in early:
                pipe.send(t0)
        reports = dict(early)
        waiting = {pipe: i for i, pipe in enumerate(pipes) if i not in early}
        while waiting:
            for ready in wait(list(waiting)):
                assert isinstance(ready, Connection)
                kind, payload = ready.recv()
                reports[waiting.pop(ready)] = payload
        after = figures.probe()
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return [reports[i] for i in range(len(pipes))], before, after, t0


class WebsocketTarget:
    """Client processes against a server's stream URL."""

    name = "websocket"

    def __init__(
        self, url: str, figures: ServerFigures, token: str | None, cpus: frozenset[int] | None = None
    ) -> None:
        self.url, self.figures, self.token = url, figures, token
        self.cpus = cpus  # where the client processes run (None: anywhere)

    def execute(
        self, plans: list[StreamPlan], s: LoadSettings, geo: CodecGeometry
    ) -> tuple[list[ClientReport], Probe, Probe, float, int]:
        clients = _client_plans(self.url, plans, s, geo, self.token)
        reports, before, after, t0 = _drive(
            clients, self.figures, connect_timeout=120 + len(plans) / 10, cpus=self.cpus
        )
        return reports, before, after, t0, len(clients)


class DecoderTarget:
    """The same streams fed to one ``StreamDecoder`` in a process of its own (:mod:`.loaddecoder`)."""

    name = "decoder"

    def __init__(self, options: DecoderOptions, start_timeout: float) -> None:
        ctx = mp.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=decoder_main, args=(options, child), daemon=True)
        self.proc.start()
        child.close()
        if not self.pipe.poll(start_timeout):
            self.close()
            raise RuntimeError(f"the decoder process did not warm up within {start_timeout:g} s")
        kind, payload = self.pipe.recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"the decoder process failed: {payload}")
        self.codec: dict[str, Any] = payload

    def _cpu_seconds(self) -> float:
        assert self.proc.pid is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return proc_cpu_seconds(f.read(), os.sysconf("SC_CLK_TCK"))

    def _probe(self) -> Probe:
        self.pipe.send(("metrics",))
        _kind, text = self.pipe.recv()
        return Probe(time.monotonic(), self._cpu_seconds(), parse_prometheus(text))

    def execute(
        self, plans: list[StreamPlan], s: LoadSettings, geo: CodecGeometry
    ) -> tuple[list[ClientReport], Probe, Probe, float, int]:
        period = s.period_ms / 1000.0 / s.speedup
        self.pipe.send(("run", DecoderRun(tuple(plans), s.chunk_frames, period, geo.latent_dim, sampled=0)))
        # the run's figures start when its streams' latents are made (its metrics come with t0)
        _kind, (t0, text) = self.pipe.recv()
        before = Probe(time.monotonic(), self._cpu_seconds(), parse_prometheus(text))
        kind, report = self.pipe.recv()
        if kind != "report":
            raise RuntimeError(f"the decoder process failed: {report}")
        return [report], before, self._probe(), t0, 1

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.pipe.send(("stop",))
            self.proc.join(timeout=30)
            if self.proc.is_alive():
                self.proc.kill()


def run_point(
    n: int,
    s: LoadSettings,
    geo: CodecGeometry,
    target: WebsocketTarget | DecoderTarget,
    limits: Limits,
    reference: Reference | None,
) -> dict[str, Any]:
    """One run at ``n`` streams: its per-stream distributions, server figures, checks and verdict."""
    plans = stream_plans(n, s, geo)
    reports, before, after, t0, processes = target.execute(plans, s, geo)
    records = [r for report in reports for r in report.records]
    missing = n - len(records)
    summaries = [
        summarize_stream(r, hop=geo.hop_size, rate=geo.sample_rate, prebuffer_s=s.prebuffer_ms / 1000)
        for r in records
    ]
    point: dict[str, Any] = {"streams_requested": n, **summarize_point(summaries)}
    if missing:
        point["sample_problems"] += missing
        point["sample_problem_examples"].append(f"{missing} stream(s) never reported (client process failed)")
    wall = after.at - t0
    point["server"] = server_delta(before, after, point["audio_s"])
    point["messages_per_s"] = {
        "latents_in": round(sum(r.latent_messages for r in reports) / wall, 1),
        "audio_out": round(point["audio_messages"] / wall, 1),
    }
    audio_s = point["audio_s"]
    point["clients"] = {
        "processes": processes,
        "cpu_s_per_stream_s": round(sum(r.cpu_s for r in reports) / audio_s, 5) if audio_s else None,
        "send_late_ms": distribution([x for r in reports for x in r.send_late_ms]),
        "pull_late_ms": distribution([x for r in reports for x in r.pull_late_ms]),
        "errors": [r.error for r in reports if r.error][:5],
    }
    point["worst_stream"] = _worst_stream(records, summaries)
    sampled = next((r for r in records if r.pcm is not None), None)
    if reference is not None and sampled is not None and sampled.status == "completed":
        point["reference"] = reference.compare(sampled, s)
    point["reasons"] = verdict(point, limits)
    point["holds"] = not point["reasons"]
    point["void"] = generator_problem(point, limits)
    return point


def _worst_stream(records: list[StreamRecord], summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The stream that stalled longest (else the slowest to first audio), with its timeline in ms from its
    first chunk: (audio received, first sample, samples) per message. It shows where a stall came from."""
    if not summaries:
        return None
    worst = max(summaries, key=lambda x: (x["stall_ms"], x["ttfa_ms"] or 0.0))
    record = next(r for r in records if r.index == worst["index"])
    t0 = record.first_sent or 0.0
    return {
        **{k: v for k, v in worst.items() if k != "gaps_ms"},
        "decodable_ms": None
        if record.decodable_sent is None
        else round((record.decodable_sent - t0) * 1000, 2),
        "arrivals": [[round((t - t0) * 1000, 2), start, n] for t, start, n in record.arrivals[:200]],
    }


# -- offline reference -----------------------------------------------------------------------------
class Reference:
    """The offline decode of a stream's latents, through ``StreamDecoder.decode`` (exact tiling)."""

    def __init__(
        self, codec_name: str, device: str, engine: str, geo: CodecGeometry, s: LoadSettings
    ) -> None:
        self.codec_name, self.device, self.engine, self.geo, self.s = codec_name, device, engine, geo, s
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def audio(self, seed: int, frames: int) -> np.ndarray:
        key = (seed, frames)
        if key not in self._cache:
            self._cache[key] = asyncio.run(self._decode(stream_latents(seed, frames, self.geo.latent_dim)))
        return self._cache[key]

    async def _decode(self, latents: np.ndarray) -> np.ndarray:
        import torch

        from streamdec import StreamDecoder, load_codec
        from streamdec.engine.simulated import simulated_engine

        codec = load_codec(self.codec_name, device=self.device)
        engine = simulated_engine(codec) if self.engine == "simulated" else None
        async with StreamDecoder(
            codec, engine=engine, min_emit=self.s.min_emit, max_emit=self.s.max_emit
        ) as dec:
            out = await dec.decode(torch.from_numpy(latents))
        return np.asarray(out.float().cpu().numpy())  # [channels, frames * hop]

    def compare(self, record: StreamRecord, s: LoadSettings) -> dict[str, Any]:
        expected = self.audio(s.seed + record.index, record.frames)
        got, want, unit = _in_units(record.pcm or b"", expected, s.fmt, self.geo.channels)
        tolerance = s.reference_tolerance
        if got.shape != want.shape:
            return {"stream": record.index, "ok": False, "why": f"shape {got.shape} vs offline {want.shape}"}
        diff = float(np.abs(got - want).max()) if got.size else 0.0
        return {
            "stream": record.index,
            "ok": diff <= tolerance,
            "max_diff": diff,
            "unit": unit,
            "tolerance": tolerance,
        }


def _in_units(
    pcm: bytes, expected: np.ndarray, fmt: str, channels: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """Wire audio and the offline float audio, both ``[channels, n]`` float64 in the unit of the check:
    int16 steps for ``pcm_s16le`` (the offline audio quantised as the server does), 1e-4 for floats."""
    if fmt == "pcm_s16le":
        got = np.frombuffer(pcm, "<i2").reshape(-1, channels).T.astype(np.float64)
        return got, np.round(np.clip(expected, -1.0, 1.0) * 32767).astype(np.float64), "int16 steps"
    got = np.frombuffer(pcm, "<f4").reshape(-1, channels).T.astype(np.float64)
    return got * 1e4, expected.astype(np.float64) * 1e4, "1e-4"


# -- the sweep -------------------------------------------------------------------------------------
def sweep(
    counts: tuple[int, ...] | None,
    plan: SweepPlan,
    run: Any,
    save: Any,
    max_runs: int,
) -> tuple[list[dict[str, Any]], dict[int, list[bool]]]:
    """Run points until the plan (or the explicit ``counts``, each until decided) is done."""
    runs: dict[int, list[bool]] = {}
    points: list[dict[str, Any]] = []
    queue = list(counts) if counts else None
    while len(points) < max_runs:
        if queue is not None:
            while queue and decided(runs.get(queue[0], []), plan.confirm) is not None:
                queue.pop(0)
            n = queue[0] if queue else None
        else:
            n = next_streams(runs, plan)
        if n is None:
            break
        point = run(n)
        point["repeat"] = len(runs.get(n, []))
        if point["void"] is None:
            runs.setdefault(n, []).append(bool(point["holds"]))
        points.append(point)
        save(points, runs)
        status = "holds" if point["holds"] else "fails: " + "; ".join(point["reasons"])
        status = status if point["void"] is None else point["void"]
        print(
            f"loadtest: {n} streams (run {point['repeat'] + 1}): p99 TTFA {point['ttfa_decodable_ms']['p99']} ms "
            f"after decodable, {point['underruns']} underruns, server {point['server']['cpu_cores']} cores, "
            f"loop lag p99 {point['server']['loop_lag_ms']['p99']} ms, engine busy "
            f"{point['server']['engine_busy']}, mean batch {point['server']['engine_mean_batch']}: {status}",
            flush=True,
        )
    return points, runs


# -- command line ----------------------------------------------------------------------------------
def configure_loadtest(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec loadtest`` arguments."""
    d, lim, sw = LoadSettings(), Limits(), SweepPlan()
    a = parser.add_argument
    a("--target", choices=["websocket", "decoder"], default="websocket",
      help="websocket: a server and client processes; decoder: the same streams into one StreamDecoder in a "
           "process of its own, loaded as serve would (the comparison point)")  # fmt: skip
    a(
        "--precision",
        default="auto",
        help="the codec's CUDA precision, as `streamdec serve --precision` (auto)",
    )
    a("--inductor-cache", default=os.path.expanduser("~/.cache/streamdec/inductor"),
      help="CUDA: torch.compile cache of the decoder target (serve's default)")  # fmt: skip
    a("--url", help="an already running server's stream URL (default: start `streamdec serve` here)")
    a("--server-pid", type=int, help="with --url: the server's pid, for its CPU time")
    a("--token", default=settings.TOKEN.value(), help="bearer token (default: $STREAMDEC_TOKEN)")
    a("--codec", default="tiny", help="codec the server loads (and the offline reference decodes with)")
    a("--device", default="cpu", help="the server's device: cpu, cuda or cuda:N")
    a("--engine", choices=["auto", "simulated"], default="auto",
      help="the server's engine; simulated: the measurement tool that models decode time (host path only)")  # fmt: skip
    a("--simulated-cost-ms", default="0,0", metavar="FIXED,PER_FRAME", help="with --engine simulated (0,0)")
    a("--server-arg", action="append", default=[], metavar="ARG",
      help="extra argument for `streamdec serve` (repeat it), e.g. --server-arg=--precision=fp16x3")  # fmt: skip
    a("--server-cpus", metavar="LIST",
      help="the CPUs the server (or the decoder target's process) runs on once warm, as `serve --cpus`, e.g. 0; "
           "the load test's client processes then keep off them (default: no pinning)")  # fmt: skip
    a("--server-threads", type=int,
      help="OMP_NUM_THREADS of the server process: torch's intra-op threads, which its event loop also uses "
           "for small tensor work (default: inherited)")  # fmt: skip
    a("--server-timeout", type=float, default=900.0, help="seconds the server may take to load and warm up")
    a(
        "--reference-device",
        default="cpu",
        help="device of the offline decode the sampled stream is compared with",
    )
    a("--reference-tolerance", type=float, default=LoadSettings().reference_tolerance,
      help="largest difference from the offline decode: int16 steps (pcm_s16le) or units of 1e-4 (pcm_f32le) (2)")  # fmt: skip
    a("--no-reference", action="store_true", help="skip the offline comparison of the sampled stream")
    a("--streams", help="explicit stream counts, e.g. 10,20 (default: sweep until the limits break)")
    a("--start", type=int, default=sw.start, help=f"sweep: first stream count ({sw.start})")
    a("--growth", type=float, default=sw.growth, help=f"sweep: factor while runs pass ({sw.growth:g})")
    a("--resolution", type=float, default=sw.resolution,
      help=f"sweep: stop bisecting when the bracket is this fraction of its lower end ({sw.resolution:g})")  # fmt: skip
    a("--max-streams", type=int, default=sw.max_streams, help=f"sweep: never above this ({sw.max_streams})")
    a("--confirm", type=int, default=sw.confirm,
      help=f"agreeing runs that decide a stream count, pass or fail ({sw.confirm})")  # fmt: skip
    a("--max-runs", type=int, default=40, help="stop after this many runs in all (40)")
    a("--ttfa-limit-ms", type=float, default=lim.ttfa_p99_ms,
      help=f"p99 time to first audio after the first tile became decodable ({lim.ttfa_p99_ms:g} ms)")  # fmt: skip
    a("--generator-late-ms", type=float, default=lim.generator_late_ms,
      help="a run whose clients sent a chunk later than this is void and repeated: the load generator, not the "
           f"server, fell behind ({lim.generator_late_ms:g})")  # fmt: skip
    a("--chunk-frames", type=int, default=d.chunk_frames, help=f"latent frames per chunk ({d.chunk_frames})")
    a(
        "--period-ms",
        type=float,
        default=d.period_ms,
        help=f"chunk period of a real-time producer ({d.period_ms:g})",
    )
    a("--speedup", type=float, default=d.speedup, help="producer speed over real time: period / speedup (1)")
    a("--seconds", type=float, default=d.seconds, help=f"audio per stream ({d.seconds:g} s)")
    a(
        "--spread",
        type=float,
        default=d.spread_s,
        help=f"stream starts spread evenly over this ({d.spread_s:g} s)",
    )
    a(
        "--prebuffer-ms",
        type=float,
        default=d.prebuffer_ms,
        help=f"modelled listener's prebuffer ({d.prebuffer_ms:g})",
    )
    a("--streams-per-connection", type=int, default=d.streams_per_connection)
    a("--streams-per-process", type=int, default=d.streams_per_process, help="streams per client process")
    a("--processes", type=int, help="client processes (default: streams / --streams-per-process)")
    a("--min-emit", type=int, default=d.min_emit, help="the server's first tile, in frames")
    a("--max-emit", type=int, default=d.max_emit,
      help="the server's largest tile or step, in frames (default: the server's own)")  # fmt: skip
    a("--format", default=d.fmt, choices=["pcm_s16le", "pcm_f32le"], help="audio format of every stream")
    a("--seed", type=int, default=d.seed)
    a("--out", default="loadtest.json", help="JSON result, rewritten after every run")
    a("--plot", action="store_true", help="also write the sweep's PNG next to the JSON (needs matplotlib)")


def _settings(args: argparse.Namespace) -> LoadSettings:
    s = LoadSettings(
        chunk_frames=args.chunk_frames,
        period_ms=args.period_ms,
        speedup=args.speedup,
        seconds=args.seconds,
        spread_s=args.spread,
        prebuffer_ms=args.prebuffer_ms,
        streams_per_connection=args.streams_per_connection,
        streams_per_process=args.streams_per_process,
        processes=args.processes,
        min_emit=args.min_emit,
        max_emit=args.max_emit,
        fmt=args.format,
        seed=args.seed,
        reference_tolerance=args.reference_tolerance,
    )

    for name in ("chunk_frames", "streams_per_connection", "streams_per_process"):
        if getattr(s, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(s, name)} must be >= 1")
    for name in ("period_ms", "speedup", "seconds"):
        if not getattr(s, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(s, name)} must be > 0")
    return s


#: The server's connection limits, lifted: every client process connects from 127.0.0.1 and opens its
#: connections at once, which the defaults (made for untrusted clients) would refuse as one abusive peer.
_UNLIMITED_CONNECTIONS = "100000"


def _most_streams(args: argparse.Namespace) -> int:
    """The most streams any run of this load test opens."""
    return max(int(v) for v in args.streams.split(",")) if args.streams else int(args.max_streams)


def _serve_args(args: argparse.Namespace, s: LoadSettings) -> list[str]:
    # Admission is told the sweep's largest count: the load test measures what holds, and a server that
    # refused streams by its own warm-up estimate would answer a different question.
    return [
        "--host", "127.0.0.1", "--port", "0", "--codec", args.codec, "--device", args.device,
        "--max-connections", _UNLIMITED_CONNECTIONS,
        "--max-connections-per-client", _UNLIMITED_CONNECTIONS, "--max-handshakes", _UNLIMITED_CONNECTIONS,
        "--max-streams-total", str(_most_streams(args)),
        "--max-streams", str(max(8, s.streams_per_connection)),
        "--min-emit", str(s.min_emit), *(() if s.max_emit is None else ("--max-emit", str(s.max_emit))),
        "--engine", args.engine, "--simulated-cost-ms", args.simulated_cost_ms, "--precision", args.precision,
        "--inductor-cache", args.inductor_cache, *(() if args.server_cpus is None else ("--cpus", args.server_cpus)),
        *args.server_arg,
    ]  # fmt: skip


def _raise_open_files() -> int:
    """Lift this process's open-file limit to its hard limit: the server and the clients it starts inherit
    it, and a thousand streams need a thousand sockets on each side. Returns the limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _open_target(
    args: argparse.Namespace, s: LoadSettings, result: dict[str, Any], closers: list[Any]
) -> tuple[WebsocketTarget | DecoderTarget, CodecGeometry]:
    """Start (or find) what is measured; records how in ``result['server']``; appends its closer."""
    import json

    engine = {
        "engine": args.engine,
        "simulated_cost_ms": args.simulated_cost_ms if args.engine == "simulated" else None,
    }
    server_cpus, client_cpus = _placement(args.server_cpus)
    result["client_cpus"] = None if client_cpus is None else format_cpus(client_cpus)
    if args.target == "decoder":
        options = DecoderOptions(
            args.codec, args.device, args.engine, args.simulated_cost_ms, args.precision, s.min_emit, s.max_emit,
            args.inductor_cache, _most_streams(args), None if server_cpus is None else tuple(sorted(server_cpus)),
        )  # fmt: skip
        decoder = DecoderTarget(options, args.server_timeout)
        closers.append(decoder.close)
        geo = CodecGeometry.from_json(decoder.codec)
        result["server"] = {
            "target": "decoder", "options": asdict(options), **engine, "codec": asdict(geo),
            "cpus": _process_cpus(decoder.proc.pid),
        }  # fmt: skip
        return decoder, geo
    if args.url is None:
        threads = {} if args.server_threads is None else {"OMP_NUM_THREADS": str(args.server_threads)}
        server = ServerProcess(_serve_args(args, s), args.server_timeout, threads).__enter__()
        closers.append(server.__exit__)
        url, pid = f"ws://127.0.0.1:{server.port}/v1/stream", server.pid
        result["server"] = {
            "target": "websocket",
            "command": shlex.join(server.argv),
            "pid": pid,
            "omp_num_threads": server.env.get("OMP_NUM_THREADS"),
            "output": list(server.lines),
        }
    else:
        url, pid = args.url, args.server_pid
        result["server"] = {"target": "websocket", "url": url, "pid": pid}
    figures = ServerFigures(re.sub(r"^ws", "http", url.split("/v1/")[0]), pid)
    health = json.loads(figures.get("/healthz"))
    geo = CodecGeometry.from_json(health["codec"])
    result["server"].update(
        engine, codec=asdict(geo), event_loop=health.get("event_loop"), cpus=_process_cpus(pid)
    )
    return WebsocketTarget(url, figures, args.token, client_cpus), geo


def _placement(server_cpus: str | None) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """The server's CPUs (``--server-cpus``) and the clients' (every other CPU this process may use), or
    None and None: no pinning."""
    if server_cpus is None:
        return None, None
    cpus = check_cpus(parse_cpus(server_cpus))
    rest = available_cpus() - cpus
    if not rest:
        raise ConfigError(
            f"--server-cpus {server_cpus}: no CPU is left for the load test's clients "
            f"(this process may use {format_cpus(available_cpus())})"
        )
    return cpus, rest


def _process_cpus(pid: int | None) -> str | None:
    """The CPUs any thread of process ``pid`` may run on now, as a CPU list (None where unknown): what the
    run measured, pinned or not."""
    masks = thread_cpus(pid) if pid is not None else {}
    return format_cpus(frozenset().union(*masks.values())) if masks else None


def run_loadtest(args: argparse.Namespace) -> int:
    """Run ``streamdec loadtest``; writes the JSON after every run, returns 0 when at least one count held."""
    import json

    import torch

    from .meta import environment, finish_environment

    s = _settings(args)
    limits = Limits(ttfa_p99_ms=args.ttfa_limit_ms, generator_late_ms=args.generator_late_ms)
    plan = SweepPlan(args.start, args.growth, args.resolution, args.max_streams, args.confirm)
    counts = tuple(int(v) for v in args.streams.split(",")) if args.streams else None
    device = torch.device(args.device if args.url is None or args.target == "decoder" else "cpu")
    result: dict[str, Any] = {
        "what": (
            "real-time streams one server process carries over websockets, clients in separate processes"
            if args.target == "websocket"
            else "real-time streams one StreamDecoder carries in its own process (no websocket path)"
        ),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "environment": environment(device),
        "settings": asdict(s),
        "limits": asdict(limits),
        "sweep": asdict(plan),
        "open_files_limit": _raise_open_files(),
    }
    out = Path(args.out)

    def save(points: list[dict[str, Any]], runs: dict[int, list[bool]]) -> None:
        largest, failing = largest_holding(runs, plan.confirm)
        result["runs"] = points
        result["result"] = {
            "largest_streams": largest,
            "smallest_failing": failing,
            "runs_by_streams": {str(n): r for n, r in sorted(runs.items())},
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")

    closers: list[Any] = []
    try:
        target, geo = _open_target(args, s, result, closers)
        reference = (
            None if args.no_reference else Reference(args.codec, args.reference_device, args.engine, geo, s)
        )

        def run(n: int) -> dict[str, Any]:
            return run_point(n, s, geo, target, limits, reference)

        _points, runs = sweep(counts, plan, run, save, args.max_runs)
        finish_environment(result["environment"])
        save(result["runs"], runs)
    finally:
        for close in closers:
            close()
    largest = result.get("result", {}).get("largest_streams")
    print(f"loadtest: largest stream count that holds: {largest}; results in {out}", flush=True)
    if args.plot and result.get("runs"):
        from .loadplot import plot_sweep

        print(f"loadtest: plot in {plot_sweep(result, out.with_suffix('.png'))}", flush=True)
    return 0 if largest else 1
