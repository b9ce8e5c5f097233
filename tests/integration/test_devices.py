"""Several devices in one server (``--devices``): streams placed by free slots, reported per device.
Two CPU decoders stand in for two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest

import streamdec
from streamdec.clients import connect
from streamdec.server import ServerConfig, StreamServer
from streamdec.server.devices import DecoderGroup
from support.server_support import clip, http, offline, serve_command

pytestmark = pytest.mark.timeout(180)
SLOTS = 2


@pytest.fixture
async def server(codec: Any) -> AsyncIterator[StreamServer]:
    decoders = [streamdec.StreamDecoder(codec, max_streams=SLOTS, max_emit=16) for _ in range(2)]
    async with DecoderGroup(decoders, ["fake:0", "fake:1"]) as group:
        config = ServerConfig(host="127.0.0.1", port=0, probe_capacity=False, grace=5.0)
        async with StreamServer(group, config) as srv:
            await srv.warmup()
            yield srv


async def _devices(port: int) -> list[int]:
    body = json.loads((await http(port, "/healthz")).body)
    return [d["open_streams"] for d in body["devices"]]


async def test_streams_go_to_the_device_with_most_free_slots(server: StreamServer, codec: Any) -> None:
    """Three streams on two 2-slot devices land 1, 2, 1 ... i.e. [2, 1]; /healthz and /metrics say so; the
    audio is the offline decode's."""
    latents = [clip(24, seed) for seed in range(3)]
    expected = [[1, 0], [1, 1], [2, 1]]
    async with connect(server.url) as conn:
        streams = []
        for k, lat in enumerate(latents):
            stream = await conn.open_stream()
            await stream.send(lat[:8])
            streams.append(stream)
            with anyio.fail_after(60):
                while await _devices(server.port) != expected[k]:
                    await anyio.sleep(0.02)
        health = json.loads((await http(server.port, "/healthz")).body)
        assert health["devices"][0] == {"device": "fake:0", "open_streams": 2, "capacity": 2, "load": 1.0}
        metrics = (await http(server.port, "/metrics")).body.decode()
        assert 'streamdec_device_open_streams{device="fake:1"} 1' in metrics
        assert 'streamdec_device_capacity_streams{device="fake:0"} 2' in metrics
        outs: list[np.ndarray] = []
        for stream, lat in zip(streams, latents, strict=True):
            await stream.send(lat[8:])
            await stream.end()
            outs.append(np.concatenate([f.samples async for f in stream], axis=1))
    for out, lat in zip(outs, latents, strict=True):
        np.testing.assert_allclose(out, offline(codec, lat), atol=1e-4, rtol=0)
    assert await _devices(server.port) == [0, 0]


async def test_one_device_reports_no_device_list(codec: Any) -> None:
    """Without a group the health body is as before: no ``devices`` key."""
    async with streamdec.StreamDecoder(codec, max_streams=SLOTS, max_emit=16) as decoder:
        config = ServerConfig(host="127.0.0.1", port=0, probe_capacity=False, grace=5.0)
        async with StreamServer(decoder, config) as srv:
            await srv.warmup()
            assert "devices" not in json.loads((await http(srv.port, "/healthz")).body)
            assert "streamdec_device_" not in (await http(srv.port, "/metrics")).body.decode()


def test_serve_refuses_devices_this_host_lacks() -> None:
    """`streamdec serve --devices all` with no CUDA device exits non-zero and says what to use instead."""
    cmd = serve_command("tiny", "--devices", "all")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=150, env={**env, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert done.returncode != 0
    assert "--devices all: no CUDA device here" in done.stderr + done.stdout
