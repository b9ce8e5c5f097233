"""Capacity measured at warm-up is what real-time streams get: listeners kept supplied, start-up included,
and an engine that cannot serve one stream says so. Real servers on loopback over a simulated device whose
calls take a set time, so the verdicts do not depend on how busy this machine is (a busier host only makes
the slow engines slower)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

import streamdec
from streamdec.engine.simulated import SimulatedCost, simulated_engine
from support.server_support import http, next_json, raw, ready, running_server, serve_command, start

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def codec() -> Any:
    """Geometry only (the simulated device never calls it): 50 frames/s, a 4-frame step is 80 ms."""
    return streamdec.load_codec("tiny", device="cpu")


def engine(codec: Any, call_ms: float, slots: int = 4) -> Any:
    return simulated_engine(codec, cost=SimulatedCost(call_ms, 0.0), max_streams=slots)


async def health(port: int) -> tuple[int, dict[str, Any]]:
    reply = await http(port, "/healthz")
    return reply.status, json.loads(reply.body)


async def test_an_engine_whose_calls_outlast_the_listeners_buffer_admits_nobody_and_says_so(
    codec: Any,
) -> None:
    """Each call takes 120 ms and batches streams: in bulk the engine decodes faster than real time, but a
    real-time stream's next tile then waits behind a call of up to 120 ms more than its first did, and
    a 100 ms prebuffer does not cover that with margin. Capacity is 0 (it used to be floored at 1, and
    that stream under-ran): a start gets over_capacity with the way out, /healthz is 503 "full" with
    capacity 0 and the probe's figures."""
    async with running_server(codec, engine=engine(codec, 120), probe_capacity=True) as server:
        report = server.capacity_report
        assert report is not None and report.realtime_factor > 1
        assert report.capacity == 0 and server.admission.capacity == 0
        assert [r.streams for r in report.runs] == [1] and not report.runs[0].passed(report.margin_s)
        status, body = await health(server.port)
        assert (status, body["status"], body["capacity"]) == (503, "full", 0)
        assert "-> 0 real-time streams" in body["capacity_probe"]
        async with raw(server.url) as ws:
            await ready(ws)
            await start(ws, 1)
            reply = await next_json(ws)
        assert (reply["code"], reply["stream"], reply["retry_after_ms"]) == ("over_capacity", 1, 1000)
        assert "cannot serve one real-time stream" in reply["message"]
        assert "--max-streams-total" in reply["message"]


async def test_an_override_serves_at_best_effort_where_the_probe_found_nothing(codec: Any) -> None:
    """--max-streams-total replaces the measurement (no probe runs): the operator's call."""
    async with running_server(
        codec, engine=engine(codec, 120), probe_capacity=True, max_streams_total=1
    ) as server:
        assert server.capacity_report is None and server.admission.capacity == 1
        async with raw(server.url) as ws:
            await ready(ws)
            await start(ws, 1)
            assert (await next_json(ws))["type"] == "started"


async def test_a_fast_engine_is_measured_through_paced_streams(codec: Any) -> None:
    """2 ms calls: every paced stream keeps its margin, so the capacity is the throughput bound (here the
    decoder's 2 slots), and /healthz reports the run."""
    async with running_server(codec, engine=engine(codec, 2, slots=2), probe_capacity=True) as server:
        report = server.capacity_report
        assert report is not None and report.capacity == 2
        assert report.runs[-1].streams == 2 and report.runs[-1].passed(report.margin_s)
        status, body = await health(server.port)
        assert (status, body["capacity"], body["capacity_source"]) == (200, 2, "measured")


def _serve_startup(*extra: str) -> str:
    """`streamdec serve --codec tiny --port 0 EXTRA` up to the line with its URL, then stopped."""
    cmd = serve_command("tiny", *extra)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STREAMDEC_TOKEN", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "ws://" in line:
                break
    finally:
        proc.kill()
        out, _ = proc.communicate()
    return "".join(lines) + out


def test_serve_prints_why_it_admits_nobody() -> None:
    """`streamdec serve` on an engine whose calls outlast the listener's buffer: the start-up lines say
    capacity 0 and that every start will be refused, with the override named."""
    text = _serve_startup("--engine", "simulated", "--simulated-cost-ms", "120")
    assert "capacity 0 real-time streams (measured)" in text and "capacity probe: " in text
    assert "every start is refused with over_capacity" in text and "--max-streams-total" in text


def test_serve_does_not_probe_the_host_path_alone() -> None:
    """--engine simulated at cost 0,0 models no device: `streamdec loadtest` sweeps its capacity, so no
    warm-up probe caps it; the decoder's slots bound it."""
    text = _serve_startup("--engine", "simulated", "--slots", "64")
    assert "capacity 64 real-time streams (unbounded)" in text and "capacity probe" not in text


async def test_the_hook_before_the_probe_runs_once_the_decoder_is_warm(codec: Any) -> None:
    """``streamdec serve`` freezes the heap between the decoder's warm-up and the probe, so the probe does
    not pay a full collection over what warm-up made: the hook runs after the one and before the other."""
    from streamdec.server.app import StreamServer
    from streamdec.server.config import ServerConfig

    order: list[str] = []
    async with streamdec.StreamDecoder(codec, engine=engine(codec, 5), max_emit=16) as dec:
        server = StreamServer(dec, ServerConfig(host="127.0.0.1", port=0, probe_capacity=True, grace=5.0))
        decoder_warmup, probe = dec.warmup, server.measure_capacity

        async def warm() -> Any:
            report = await decoder_warmup()
            order.append("decoder warm")
            return report

        async def measure() -> int:
            order.append("probe")
            return await probe()

        dec.warmup = warm  # type: ignore[method-assign]
        server.measure_capacity = measure  # type: ignore[method-assign]
        async with server:
            await server.warmup(before_probe=lambda: order.append("hook"))
    assert order == ["decoder warm", "hook", "probe"]
    assert server.admission.capacity > 0
