"""``streamdec loadtest`` end to end: a real server subprocess, client processes, the JSON it writes."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamdec.affinity import parse_cpus
from streamdec.bench import loadtest
from streamdec.bench.loadstats import parse_prometheus
from support.server_support import running_server, tiny_codec

pytestmark = pytest.mark.timeout(300)


def _loadtest(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "load.json"
    # Limits far above anything a shared CPU shows: this checks the fields, not the speed.
    argv = [
        sys.executable, "-m", "streamdec.cli", "loadtest", "--engine", "simulated", "--simulated-cost-ms", "1,0.01",
        "--seconds", "1.5", "--spread", "0.2", "--prebuffer-ms", "5000", "--ttfa-limit-ms", "60000",
        "--streams-per-process", "2", "--confirm", "1", "--out", str(out), *extra,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert out.exists(), done.stdout + done.stderr
    return done, json.loads(out.read_text())


def test_loadtest_smoke_writes_every_figure(tmp_path: Path) -> None:
    """Three streams in two client processes against a simulated-engine server: every field is there."""
    done, result = _loadtest(tmp_path, "--streams", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loadtest: largest stream count that holds: 3" in done.stdout
    env = result["environment"]
    assert env["git_commit"] and env["torch"] and env["device"] == "cpu"
    assert "loadtest" in result["command"] and "--engine simulated" in result["server"]["command"]
    assert result["server"]["codec"]["name"] == "tiny"
    assert result["server"]["event_loop"] in ("asyncio", "uvloop")
    assert result["result"] == {
        "largest_streams": 3,
        "smallest_failing": None,
        "runs_by_streams": {"3": [True]},
    }
    (run,) = result["runs"]
    assert run["streams"] == 3 and run["sample_problems"] == 0 and run["holds"]
    assert run["clients"]["processes"] == 2 and not run["clients"]["errors"]
    assert run["reference"]["ok"] and run["reference"]["max_diff"] == 0
    assert run["ttfa_ms"]["n"] == 3 and run["ttfa_decodable_ms"]["p99"] <= run["ttfa_ms"]["p99"]
    assert run["underruns"] == 0 and run["audio_messages"] >= 3
    server = run["server"]
    assert server["cpu_s"] > 0 and server["cpu_s_per_stream_s"] > 0
    assert server["bytes_in_per_s"] > 0 and server["bytes_out_per_s"] > 0
    assert server["loop_lag_ms"]["p99"] is not None and server["loop_lag_ms"]["max"] is not None
    # the modelled device took 1 ms a call at least: busy a little, never more than the wall time
    assert 0 < server["engine_busy"] < 1 and server["engine_mean_batch"] >= 1
    assert set(server["engine_calls_by_tier"]) == {"simulated"}  # every call of the run, none eager
    assert run["messages_per_s"]["latents_in"] > 0 and run["messages_per_s"]["audio_out"] > 0
    assert run["clients"]["send_late_ms"]["n"] > 0 and run["clients"]["pull_late_ms"]["n"] == 0


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs on Linux"
)
def test_server_cpus_pin_the_server_once_warm_and_keep_the_clients_off_them(tmp_path: Path) -> None:
    """--server-cpus: the server it starts runs every thread on that CPU (serve --cpus), its clients on the
    others, and the JSON says where each ran."""
    cpus = sorted(os.sched_getaffinity(0))
    done, result = _loadtest(tmp_path, "--streams", "2", "--server-cpus", str(cpus[0]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--cpus {cpus[0]}" in result["server"]["command"]
    assert f"streamdec: running on CPUs {cpus[0]}" in result["server"]["output"]
    assert result["server"]["cpus"] == str(cpus[0])  # every thread of the server, as the run found them
    assert parse_cpus(result["client_cpus"]) == set(cpus[1:])
    (run,) = result["runs"]
    assert run["holds"] and run["sample_problems"] == 0


def test_decoder_target_runs_the_same_streams_into_one_streamdecoder(tmp_path: Path) -> None:
    """--target decoder: the same streams, checks and figures, in a decoder process of its own."""
    done, result = _loadtest(tmp_path, "--target", "decoder", "--streams", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["server"]["target"] == "decoder" and result["server"]["options"]["slots"] == 3
    (run,) = result["runs"]
    assert run["holds"] and run["sample_problems"] == 0 and run["reference"]["ok"]
    server = run["server"]
    assert server["cpu_s"] > 0 and server["loop_lag_ms"]["p99"] is not None
    assert server["gc_full_collections"] is not None and server["gc_pause_max_ms"] is not None
    assert 0 < server["engine_busy"] < 1 and server["engine_mean_batch"] >= 1
    assert server["engine_calls_by_tier"]["simulated"] >= 1
    # a schedule in the decoder's own loop is never a late load generator; its loop's lag is reported
    assert run["clients"]["send_late_ms"]["n"] == 0 and run["clients"]["pull_late_ms"]["n"] > 0


async def test_a_late_loop_counts_against_the_decoder_target_not_its_schedule() -> None:
    """The in-process target's chunks count as sent when due: a loop that takes them late delays the
    stream's first audio as measured (as a websocket server's late read does), and shows as pull lateness."""
    import asyncio
    import time

    import torch

    from streamdec.bench.loadclient import ClientReport, StreamPlan, stream_latents
    from streamdec.bench.loaddecoder import DecoderOptions, DecoderRun, _build, _one
    from streamdec.bench.loadstats import StreamRecord

    decoder = await _build(DecoderOptions("tiny", "cpu", "simulated", "0,0", "auto", 4, 64, None, slots=2))
    try:
        plan = StreamPlan(index=0, seed=1, frames=16, offset_s=0.0, decodable_chunk=1)
        run = DecoderRun(
            (plan,), chunk_frames=4, period_s=0.02, latent_dim=decoder.codec.latent_dim, sampled=-1
        )
        record, report = StreamRecord(0, 16), ClientReport()
        latents = torch.from_numpy(stream_latents(plan.seed, plan.frames, run.latent_dim))
        t0 = time.monotonic() + 0.05
        asyncio.get_running_loop().call_later(0.06, time.sleep, 0.2)  # the loop stalls across chunks 0-1
        await _one(decoder, plan, latents, run, t0, record, report)
    finally:
        await decoder.aclose()
        gc.unfreeze()
    assert record.status == "completed" and record.arrivals and record.decodable_sent is not None
    assert record.first_sent == pytest.approx(t0) and record.decodable_sent == pytest.approx(t0 + 0.02)
    assert max(report.pull_late_ms) >= 150 and not report.send_late_ms
    assert record.arrivals[0][0] - record.decodable_sent >= 0.15  # first audio after the stall, as measured


async def test_the_decoder_targets_run_figures_leave_out_making_its_latents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making every stream's latents blocks the decoder target's loop before its run starts (0.2 s here,
    as 512 streams' did on a GPU host). The run's figures start after that, from the metrics sent with
    its start: the largest loop lag between them is the run's, not the set-up's."""
    import asyncio
    import multiprocessing
    import time

    from streamdec.bench import loaddecoder
    from streamdec.bench.loadclient import StreamPlan
    from streamdec.bench.loadstats import loop_lag_ms

    made = loaddecoder.stream_latents

    def slow(seed: int, frames: int, latent_dim: int) -> Any:
        time.sleep(0.2)
        return made(seed, frames, latent_dim)

    monkeypatch.setattr(loaddecoder, "stream_latents", slow)
    ours, theirs = multiprocessing.Pipe()
    options = loaddecoder.DecoderOptions("tiny", "cpu", "simulated", "0,0", "auto", 4, 64, None, slots=2)
    target = asyncio.ensure_future(loaddecoder._serve_runs(options, theirs))
    loop = asyncio.get_running_loop()

    async def receive() -> Any:
        return await loop.run_in_executor(None, ours.recv)

    try:
        kind, geometry = await receive()
        assert kind == "ready"
        plan = StreamPlan(index=0, seed=1, frames=16, offset_s=0.0, decodable_chunk=1)
        ours.send(("run", loaddecoder.DecoderRun((plan,), 4, 0.02, geometry["latent_dim"], sampled=-1)))
        kind, (_t0, before) = await receive()
        assert kind == "started"
        kind, report = await receive()
        assert kind == "report" and report.records[0].status == "completed"
        ours.send(("metrics",))
        _kind, after = await receive()
        ours.send(("stop",))
        await target
    finally:
        gc.unfreeze()
    lag = loop_lag_ms(parse_prometheus(before), parse_prometheus(after), "streamdec_event_loop_lag_seconds")
    assert lag["max"] is not None and lag["max"] < 150


@pytest.mark.parametrize("engine", ["auto", "simulated"])
async def test_the_decoder_target_has_a_slot_for_every_stream_of_the_sweep(engine: str) -> None:
    """Built as serve builds it for --max-streams-total N: N stateful slots, not the decoder's default
    (64), which refused every stream past it."""
    from streamdec.bench.loaddecoder import DecoderOptions, _build

    decoder = await _build(DecoderOptions("tiny", "cpu", engine, "0,0", "auto", 4, 64, None, slots=70))
    try:
        assert decoder.max_streams == 70
    finally:
        await decoder.aclose()
        gc.unfreeze()  # _build froze the heap, as serve does after warm-up: not for the rest of the suite


def test_loadtest_opens_more_connections_than_one_client_address_may(tmp_path: Path) -> None:
    """Every client process connects from 127.0.0.1 at once: the server the load test starts must not
    take them for one abusive peer (per-address limit 16, handshake cap 32 by default)."""
    done, result = _loadtest(tmp_path, "--streams", "40", "--streams-per-process", "40", "--no-reference")
    assert result["runs"], done.stdout + done.stderr
    for run in result["runs"]:  # a run the generator was late for is repeated: each must be complete
        assert not run["clients"]["errors"], run["clients"]["errors"]
        assert run["streams"] == 40 and run["sample_problems"] == 0, done.stdout + done.stderr


def test_loadtest_reports_a_failing_limit_and_exits_nonzero(tmp_path: Path) -> None:
    """A first-audio limit no server meets fails the run with the reason, and nothing holds."""
    done, result = _loadtest(tmp_path, "--streams", "2", "--ttfa-limit-ms", "0.000001")
    assert done.returncode == 1
    (run,) = result["runs"]
    assert not run["holds"] and "p99 time to first audio" in run["reasons"][0]
    assert result["result"]["largest_streams"] is None and result["result"]["smallest_failing"] == 2


async def test_metrics_expose_event_loop_lag() -> None:
    """/metrics carries the lag gauges and histogram, and the histogram counts samples as time passes."""
    async with running_server(tiny_codec()) as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def scrape() -> dict[str, float]:
            with opener.open(url, timeout=10) as response:
                return parse_prometheus(response.read().decode())

        first = await anyio.to_thread.run_sync(scrape)
        await anyio.sleep(0.2)
        second = await anyio.to_thread.run_sync(scrape)
    name = "streamdec_event_loop_lag_seconds"
    assert f"{name}_last" in first and f"{name}_max" in first
    assert second[f"{name}_count"] > first[f"{name}_count"]
    assert second[f'{name}_bucket{{le="+Inf"}}'] == second[f"{name}_count"]


def test_serve_refuses_a_malformed_simulated_cost() -> None:
    """``serve --engine simulated`` with a cost that is not FIXED,PER_FRAME exits 2 naming the value."""
    argv = [sys.executable, "-m", "streamdec.cli", "serve", "--port", "0", "--engine", "simulated",
            "--simulated-cost-ms", "fast"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "ConfigError" in done.stderr and "'fast'" in done.stderr and "FIXED,PER_FRAME" in done.stderr


@pytest.mark.parametrize(("extra", "passed"), [([], None), (["--max-emit", "8"], "8")])
def test_the_server_keeps_its_own_largest_step_unless_one_is_given(
    extra: list[str], passed: str | None
) -> None:
    """A load test measures the server as it is started by default: it passes --max-emit only where its
    own command line gives one."""
    parser = argparse.ArgumentParser()
    loadtest.configure_loadtest(parser)
    args = parser.parse_args(["--streams", "4", *extra])
    serve = loadtest._serve_args(args, loadtest._settings(args))
    given = serve[serve.index("--max-emit") + 1] if "--max-emit" in serve else None
    assert given == passed
