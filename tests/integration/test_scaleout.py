"""Two real replicas behind a real HAProxy (deploy/haproxy.cfg itself): spread, refusal and retry, drain
on SIGTERM without loss, SIGKILL seen by its clients at once while the other replica's streams go on."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from streamdec.clients import RetryPolicy, open_stream_retrying, retryable
from streamdec.errors import ServerError
from support.server_support import clip, http, offline, serve_command

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"
SLOTS = 2  # streams each replica admits (--max-streams-total)
FRAMES = 40  # a few dozen frames per clip: the tiny codec is slow on a shared CPU
#: Generous: a replica or the balancer's health check may take seconds to notice a freed slot here.
RETRY = RetryPolicy(attempts=40, base=0.1, cap=1.0)

pytestmark = [
    pytest.mark.scaleout,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy; .ci/run does)"
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    async def wait_serving(self) -> None:
        """Until the line with the URL appears (printed after warm-up)."""
        with anyio.fail_after(240):
            while "ws://" not in (text := self.log.read_text()):
                assert self.proc.poll() is None, f"{self.name} exited: {text}"
                await anyio.sleep(0.1)
        self.port = int(text.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

    async def open_streams(self) -> int:
        import json

        reply = await http(self.port, "/healthz")
        return int(json.loads(reply.body)["open_streams"])


@dataclass
class Cluster:
    replicas: list[Replica]
    balancer: subprocess.Popen[bytes]
    port: int
    stats_port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    async def statuses(self) -> dict[str, str]:
        """The balancer's view of each replica: UP, DOWN, ... (from the stats CSV)."""
        text = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{self.stats_port}/stats;csv")
        header, *rows = text.splitlines()
        cols = header.lstrip("# ").split(",")
        out = {}
        for row in rows:
            cells = dict(zip(cols, row.split(","), strict=False))
            if cells.get("pxname") == "replicas" and cells.get("svname", "").startswith("replica"):
                out[cells["svname"]] = cells["status"].split()[0]
        return out

    async def wait_status(self, replica: str, status: str) -> None:
        with anyio.fail_after(60):
            while (await self.statuses()).get(replica) != status:
                await anyio.sleep(0.1)


def _get(url: str) -> str:
    """GET with urllib (HAProxy's stats page is chunked), no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as reply:
        return str(reply.read().decode())


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    environ.pop("STREAMDEC_TOKEN", None)
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=environ)


def _replica(tmp_path: Path, name: str) -> Replica:
    log = tmp_path / f"{name}.log"
    cmd = serve_command("tiny", "--max-streams-total", str(SLOTS), "--grace", "240", "--idle-timeout", "240")
    return Replica(name, _spawn(cmd, log), log)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """replica1 and replica2 (``streamdec serve --codec tiny``) behind HAProxy, both UP."""
    replicas = [_replica(tmp_path, "replica1"), _replica(tmp_path, "replica2")]
    balancer = None
    try:
        for replica in replicas:
            await replica.wait_serving()
        port, stats_port = _free_port(), _free_port()
        env = {
            "STREAMDEC_LB_BIND": f"127.0.0.1:{port}",
            "STREAMDEC_LB_STATS": f"127.0.0.1:{stats_port}",
            **{f"STREAMDEC_REPLICA_{i + 1}": f"127.0.0.1:{r.port}" for i, r in enumerate(replicas)},
        }
        assert HAPROXY is not None
        balancer = _spawn([HAPROXY, "-db", "-f", str(CONFIG)], tmp_path / "haproxy.log", env)
        result = Cluster(replicas, balancer, port, stats_port)
        with anyio.fail_after(60):
            while True:
                assert balancer.poll() is None, (tmp_path / "haproxy.log").read_text()
                try:
                    if set((await result.statuses()).values()) == {"UP"}:
                        break
                except OSError:
                    pass  # not listening yet
                await anyio.sleep(0.1)
        yield result
    finally:
        for proc in [r.proc for r in replicas] + ([balancer] if balancer else []):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@dataclass
class Listener:
    """One stream through the balancer: the first half of its clip sent at once, the rest on ``release``."""

    latents: torch.Tensor
    opened: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)
    chunks: list[np.ndarray] = field(default_factory=list)
    status: str | None = None
    error: ServerError | None = None
    error_at: float = 0.0

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks, axis=1)

    async def run(self, url: str) -> None:
        half = len(self.latents) // 2
        async with open_stream_retrying(url, retry=RETRY) as (_, stream):
            self.opened.set()

            async def send() -> None:
                await stream.send(self.latents[:half])
                await self.release.wait()
                await stream.send(self.latents[half:])
                await stream.end()

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                try:
                    async for frame in stream:
                        self.chunks.append(frame.samples)
                except ServerError as exc:
                    self.error, self.error_at = exc, time.monotonic()
                    tg.cancel_scope.cancel()
                    return
            self.status = stream.done["status"] if stream.done else None


async def _open(tg: Any, cluster: Cluster, seed: int) -> Listener:
    listener = Listener(clip(FRAMES, seed))
    tg.start_soon(listener.run, cluster.url)
    with anyio.fail_after(120):
        await listener.opened.wait()
    return listener


async def _loads(cluster: Cluster) -> list[int]:
    return [await r.open_streams() for r in cluster.replicas]


def _assert_exact(codec: Any, listener: Listener) -> None:
    assert listener.error is None and listener.status == "completed"
    np.testing.assert_allclose(listener.audio, offline(codec, listener.latents), atol=1e-4, rtol=0)


async def test_streams_spread_a_full_cluster_refuses_and_the_retry_gets_in(
    cluster: Cluster, codec: Any
) -> None:
    """leastconn puts two streams on each replica; a fifth is refused, and its retry gets the slot freed."""
    async with anyio.create_task_group() as tg:
        held = [await _open(tg, cluster, seed) for seed in range(2 * SLOTS)]
        assert await _loads(cluster) == [SLOTS, SLOTS]
        with pytest.raises(Exception) as refused:
            async with open_stream_retrying(cluster.url, retry=RetryPolicy(attempts=1)):
                pass
        exc = refused.value
        assert retryable(exc), exc
        assert getattr(exc, "code", None) == "over_capacity" or getattr(exc, "response", None) is not None
        late = Listener(clip(FRAMES, 99))
        tg.start_soon(late.run, cluster.url)
        held[0].release.set()  # the first stream ends: its slot frees
        with anyio.fail_after(180):
            await late.opened.wait()
        for listener in [*held, late]:
            listener.release.set()
    for listener in [*held, late]:
        _assert_exact(codec, listener)


async def test_sigterm_drains_a_replica_without_loss(cluster: Cluster, codec: Any) -> None:
    """SIGTERM mid-stream: the replica leaves rotation, its stream ends with exact audio, new ones go on."""
    first, second = cluster.replicas
    async with anyio.create_task_group() as tg:
        a = await _open(tg, cluster, 1)
        b = await _open(tg, cluster, 2)
        assert await _loads(cluster) == [1, 1]
        first.proc.send_signal(signal.SIGTERM)
        await cluster.wait_status(first.name, "DOWN")
        c = await _open(tg, cluster, 3)
        assert await second.open_streams() == 2  # the new stream went to the replica still in rotation
        for listener in (a, b, c):
            listener.release.set()
    for listener in (a, b, c):
        _assert_exact(codec, listener)
    assert await anyio.to_thread.run_sync(first.proc.wait, 120) == 0
    out = first.log.read_text()
    assert "grace period over" not in out and "Traceback" not in out


async def test_sigkill_fails_its_streams_at_once_and_spares_the_other(cluster: Cluster, codec: Any) -> None:
    """SIGKILL: the killed replica's client gets an error within a second; the other stream is exact."""
    first, _ = cluster.replicas
    async with anyio.create_task_group() as tg:
        a = await _open(tg, cluster, 1)
        on_first = await first.open_streams() == 1
        b = await _open(tg, cluster, 2)
        assert await _loads(cluster) == [1, 1]
        victim, survivor = (a, b) if on_first else (b, a)
        with anyio.fail_after(120):  # the victim has audio flowing: it is mid-stream when killed
            while not victim.chunks:
                await anyio.sleep(0.05)
        first.proc.kill()
        killed_at = time.monotonic()
        with anyio.fail_after(30):
            while victim.error is None and victim.status is None:
                await anyio.sleep(0.01)
        survivor.release.set()
    assert victim.error is not None, f"the killed replica's stream ended {victim.status!r}"
    seen = victim.error_at - killed_at
    print(f"the killed replica's client saw {victim.error.code!r} {seen * 1000:.0f} ms after SIGKILL")
    assert seen < 1.0, f"error {seen:.3f} s after the kill"
    _assert_exact(codec, survivor)
