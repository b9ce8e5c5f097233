"""The server as a process: a second signal stops at once; running out of file descriptors is quiet."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from asyncio.constants import ACCEPT_RETRY_DELAY
from typing import Any

import anyio
import pytest

from support.server_support import http, raw, ready, running_server, serve_command, start

pytestmark = pytest.mark.timeout(180)


class _ServerProcess:
    """A server as a child process whose output a thread reads to its end: a server that logs into a
    pipe nobody reads blocks once the pipe is full."""

    def __init__(self, cmd: list[str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STREAMDEC_TOKEN", None)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self._ports: queue.Queue[int | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as out:
            for line in out:
                self.lines.append(line)
                if "ws://" in line:
                    self._ports.put(int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]))
        self._ports.put(None)

    async def port(self) -> int:
        """The port of the first URL the server prints."""
        port = await anyio.to_thread.run_sync(self._ports.get)
        assert port is not None, f"exited with {self.proc.wait()} before printing its URL: {self.output()}"
        return port

    def output(self) -> str:
        return "".join(self.lines)

    def finish(self) -> str:
        """Kills the server if it still runs; its whole output."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        return self.output()


async def test_a_second_sigterm_stops_at_once() -> None:
    """SIGTERM starts the grace period (healthz 503); a second SIGTERM exits without waiting for it."""
    # a known capacity (--max-streams-total): what dac-tiny measures follows this machine's load
    cmd = serve_command("dac-tiny", "--grace", "300", "--max-streams-total", "2")
    server = _ServerProcess(cmd)
    proc = server.proc
    try:
        port = await server.port()
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
        out = server.finish()
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
    server = _ServerProcess([sys.executable, "-c", _FD_LIMITED_SERVER])
    proc = server.proc
    socks: list[socket.socket] = []
    try:
        port = await server.port()
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
        out = server.finish()
    assert "Traceback" not in out, out[-3000:]
    assert out.count("accept() failed") <= 1, out[-3000:]


async def test_an_accept_retry_that_fires_after_shutdown_is_not_a_traceback(codec: Any) -> None:
    """EMFILE makes asyncio retry accept() a second later; a retry that fires after the listener closed
    meets a socket without a descriptor (ValueError). The server swallows exactly that one error until the
    retries are over, passes any other to the handler it replaced, and hands that handler back."""
    loop = asyncio.get_running_loop()
    reached: list[dict[str, Any]] = []

    def record(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        reached.append(context)

    loop.set_exception_handler(record)
    try:
        async with running_server(codec) as server:
            listener = server._server.sockets[0]
        closed = socket.socket()
        closed.close()
        # what asyncio schedules on EMFILE (BaseSelectorEventLoop._accept_connection)
        loop.call_soon(loop._start_serving, lambda: None, closed, None, None, 100)  # type: ignore[attr-defined]
        loop.call_soon(_raise, RuntimeError("someone else's error"))
        await anyio.sleep(0.1)
        assert [type(c.get("exception")) for c in reached] == [RuntimeError]
        assert listener.fileno() == -1
        await anyio.sleep(ACCEPT_RETRY_DELAY + 0.6)
        assert loop.get_exception_handler() is record
        loop.call_soon(loop._start_serving, lambda: None, closed, None, None, 100)  # type: ignore[attr-defined]
        await anyio.sleep(0.1)
        assert [type(c.get("exception")) for c in reached] == [RuntimeError, ValueError]
    finally:
        loop.set_exception_handler(None)


def _raise(error: Exception) -> None:
    raise error
