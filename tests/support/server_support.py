"""Helpers for the server and client tests (no tests here): a real server on port 0, raw clients."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import torch
from websockets.asyncio.client import ClientConnection, connect

import streamdec
from streamdec.engine import Engine, EngineStats, WarmupReport, WindowRequest, create_engine
from streamdec.protocol import decode_audio_samples, encode_latents, parse_audio
from streamdec.server import ServerConfig, StreamServer

POISON = 1.0e4  # a latent value FailingEngine refuses to decode


def serve_command(codec: str, *extra: str) -> list[str]:
    """The argv of ``streamdec serve --codec CODEC --port 0 EXTRA`` in a subprocess of this interpreter."""
    return [sys.executable, "-m", "streamdec.cli", "serve", "--codec", codec, "--port", "0", *extra]


def tiny_codec() -> Any:
    return streamdec.load_codec("tiny", device="cpu")


async def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; a TimeoutError after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


class FailingEngine(Engine):
    """The real engine, except that a window holding a POISON value fails like a device fault."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.device = inner.device

    async def start(self) -> None:
        await self.inner.start()

    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        return await self.inner.warmup(window_sizes)

    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        if bool((request.latents == POISON).any()):
            raise RuntimeError("simulated device fault")
        return await self.inner.decode_window(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def stats(self) -> EngineStats:
        return self.inner.stats


class RecordingEngine(FailingEngine):
    """The real engine, recording the decoder's stream id of every window it is asked to decode."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.calls: list[int] = []

    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        self.calls.append(request.stream_id)
        return await self.inner.decode_window(request)


@contextlib.asynccontextmanager
async def running_server(
    codec: Any,
    *,
    failing: bool = False,
    engine: Engine | None = None,
    warm: bool = True,
    decoder: dict[str, Any] | None = None,
    voice: Any = None,
    **config: Any,
) -> AsyncIterator[StreamServer]:
    """A StreamServer on 127.0.0.1, port 0, over a fresh StreamDecoder (closed on exit); ``voice`` speaks
    a start's text."""
    if failing:
        engine = FailingEngine(create_engine(codec))
    options = {"max_emit": 16, **(decoder or {})}  # few window sizes: warm-up stays short on a CPU
    async with streamdec.StreamDecoder(codec, engine=engine, **options) as dec:
        config.setdefault("grace", 5.0)
        config.setdefault("probe_capacity", False)  # admission unbounded unless a test asks for it
        server = StreamServer(dec, ServerConfig(host="127.0.0.1", port=0, **config), voice=voice)
        async with server:
            if warm:
                await server.warmup()
            yield server


def raw(url: str, **kwargs: Any) -> Any:
    """A plain websockets client with the settings the protocol asks for."""
    kwargs.setdefault("max_size", 2**24)
    return connect(url, proxy=None, compression=None, open_timeout=10, **kwargs)


async def ready(ws: ClientConnection) -> dict[str, Any]:
    msg = json.loads(await ws.recv())
    assert msg["type"] == "ready"
    return msg


async def start(ws: ClientConnection, stream: int, **extra: str) -> None:
    await ws.send(json.dumps({"type": "start", "stream": stream, **extra}))


async def next_json(ws: ClientConnection) -> dict[str, Any]:
    """The next text message (skipping none: a binary message here is a test failure)."""
    msg = await ws.recv()
    assert isinstance(msg, str), f"expected a control message, got {len(msg)} binary bytes"
    return dict(json.loads(msg))


@dataclass
class Received:
    """What one stream received: audio (float32 [channels, n]), arrival times, errors, done."""

    chunks: list[np.ndarray] = field(default_factory=list)
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)  # (time, start_sample, n_samples)
    errors: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False
    done: dict[str, Any] | None = None
    next_seq: int = 0

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks, axis=1) if self.chunks else np.zeros((1, 0), np.float32)


async def collect(
    ws: ClientConnection, formats: dict[int, str], channels: int = 1, *, until_done: set[int] | None = None
) -> tuple[dict[int, Received], list[dict[str, Any]]]:
    """Read until every stream in ``until_done`` (default: all of ``formats``) is done.

    Checks on the way that audio seq counts 0, 1, … and start_sample is gap-free. Returns what each
    stream received and the errors that named no known stream.
    """
    want = set(formats) if until_done is None else set(until_done)
    streams = {s: Received() for s in formats}
    other: list[dict[str, Any]] = []
    while want:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            audio = parse_audio(msg)
            rec = streams[audio.stream]
            assert audio.seq == rec.next_seq and audio.start_sample == rec.audio.shape[1]
            rec.next_seq += 1
            rec.chunks.append(decode_audio_samples(audio, formats[audio.stream], channels))
            rec.arrivals.append((time.monotonic(), audio.start_sample, audio.n_samples))
            continue
        obj = json.loads(msg)
        rec_or_none = streams.get(obj.get("stream"))
        if rec_or_none is None:
            other.append(obj)
        elif obj["type"] == "started":
            rec_or_none.started = True
        elif obj["type"] == "error":
            rec_or_none.errors.append(obj)
        elif obj["type"] == "done":
            rec_or_none.done = obj
            want.discard(obj["stream"])
    return streams, other


async def send_latents(ws: ClientConnection, stream: int, latents: torch.Tensor, chunk: int, dtype: str = "float32",
                       first_seq: int = 0) -> int:  # fmt: skip
    """Send ``latents`` in messages of ``chunk`` frames; returns the next seq."""
    seq = first_seq
    for begin in range(0, int(latents.shape[0]), chunk):
        await ws.send(encode_latents(stream, seq, latents[begin : begin + chunk], dtype))
        seq += 1
    return seq


def clip(frames: int, seed: int, dim: int = 64) -> torch.Tensor:
    """Seeded N(0, 1) latents ``[frames, dim]`` (64: the "tiny" codec's latent_dim)."""
    return torch.randn(frames, dim, generator=torch.Generator().manual_seed(seed))


def offline(codec: Any, latents: torch.Tensor) -> np.ndarray:
    """The reference: the codec's own decode of the whole clip, float32 [channels, T * hop]."""
    with torch.no_grad():
        return np.asarray(codec.decode(latents.float()[None])[0].numpy(), dtype=np.float32)


@dataclass
class HttpReply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


async def http(port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> HttpReply:
    """One plain HTTP/1.1 request to 127.0.0.1:port; reads until the server closes (it sends close)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            while True:
                data += await sock.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in header_lines if ": " in line)
    return HttpReply(int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, body)
