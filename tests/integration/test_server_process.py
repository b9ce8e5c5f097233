"""The server as a process: a second signal stops at once; running out of file descriptors is quiet."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import anyio
import pytest

from support.server_support import http, raw, ready, serve_command, start

pytestmark = pytest.mark.timeout(180)


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STREAMDEC_TOKEN", None)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


async def _port_of(proc: subprocess.Popen[str], lines: list[str]) -> int:
    """Reads the output until the line with the URL; keeps every line read in ``lines``."""

    def read() -> int:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "ws://" in line:
                return int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        raise AssertionError(f"exited with {proc.wait()} before printing its URL: {''.join(lines)}")

    return await anyio.to_thread.run_sync(read)


def _finish(proc: subprocess.Popen[str], lines: list[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    out, _ = proc.communicate()
    return "".join(lines) + out


async def test_a_second_sigterm_stops_at_once() -> None:
    """SIGTERM starts the grace period (healthz 503); a second SIGTERM exits without waiting for it."""
    # a known capacity (--max-streams-total): what dac-tiny measures follows this machine's load
    cmd = serve_command("dac-tiny", "--grace", "300", "--max-streams-total", "2")
    proc, lines = _spawn(cmd), []
    try:
        port = await _port_of(proc, lines)
        async with raw(f"ws://127.0.0.1:{port}/v1/stream") as ws:
            await ready(ws)
            await start(ws, 1)  # a stream that never ends: the grace period would run its 300 s
            assert json.loads(await ws.recv())["type"] == "started"
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                while (reply := await http(port, "/healthz")).status != 503:
                    await anyio.sleep(0.05)
            assert json.loads(reply.body)["status"] == "shutting_down"
            proc.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(proc.wait, 60) == 0
    finally:
        out = _finish(proc, lines)
    assert "again: stopping now" in out and "Traceback" not in out


_FD_LIMITED_SERVER = textwrap.dedent(
    """
    import os, resource, anyio, streamdec
    from streamdec.server import ServerConfig, StreamServer

    async def main():
        codec = streamdec.load_codec("dac-tiny", device="cpu")
        async with streamdec.StreamDecoder(codec, max_emit=16) as dec:
            config = ServerConfig(port=0, probe_capacity=False, open_timeout=2.0)
            async with StreamServer(dec, config) as server:
                await server.warmup()
                spare = len(os.listdir("/proc/self/fd")) + 6  # a few connections, then EMFILE
                resource.setrlimit(resource.RLIMIT_NOFILE, (spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
                print(f"serving {server.url}", flush=True)
                await server.run_until_signalled()

    anyio.run(main)
    """
)


async def test_running_out_of_file_descriptors_logs_one_line_and_recovers() -> None:
    """At the fd limit accept() fails (EMFILE): no traceback flood, and connections work once fds free up."""
    proc, lines = _spawn([sys.executable, "-c", _FD_LIMITED_SERVER]), []
    socks: list[socket.socket] = []
    try:
        port = await _port_of(proc, lines)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]  # silent: half-open
        await anyio.sleep(3.5)  # asyncio retries accept() every second: several failures
        for sock in socks:
            sock.close()
        with anyio.fail_after(60):  # the half-open ones time out (open_timeout 2 s), fds come back
            while True:
                try:
                    async with raw(f"ws://127.0.0.1:{port}/v1/stream") as ws:
                        await ready(ws)
                    break
                except OSError:
                    await anyio.sleep(0.5)
        metrics = (await http(port, "/metrics")).body.decode()
        failures = int(
            next(x for x in metrics.splitlines() if x.startswith("streamdec_accept_errors_total")).split()[1]
        )
        assert failures >= 2
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(proc.wait, 60) == 0
    finally:
        for sock in socks:
            sock.close()
        out = _finish(proc, lines)
    assert "Traceback" not in out, out[-3000:]
    assert out.count("accept() failed") <= 1, out[-3000:]
