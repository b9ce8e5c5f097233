"""``streamdec stream IN --url URL OUT.wav``: send a latent file through a server and write the WAV.

Prints time to first audio, the real-time factor and underruns of a simulated listener that starts
playing ``--prebuffer-ms`` after the first audio (100 ms, what ``StreamDecoder`` assumes of a listener when
it decides to flush early): an underrun is an audio message arriving while the audio received before it
is shorter than the wall time elapsed since playback started.

A URL, token or file the server cannot take ends in one line saying what to change
(:class:`~streamdec.cli_errors.UsageError`); an ``error`` the server sends surfaces with its code.
"""

from __future__ import annotations

import argparse
import errno
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import torch
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from streamdec import settings
from streamdec.cli import check_latent_shape, load_latent_file
from streamdec.cli_errors import UsageError, check_output_path, leaves
from streamdec.errors import ServerError
from streamdec.protocol import AUDIO_FORMATS, LATENT_DTYPES, OPUS_FORMAT, STREAM_PATH

from .client import ClientStream, connect
from .wav import write_wav

__all__ = [
    "Playback",
    "StreamResult",
    "check_url",
    "configure_stream",
    "connection_hint",
    "run_stream",
    "stream_file",
]


def configure_stream(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec stream`` arguments to ``parser``."""
    parser.add_argument("input", type=Path, help="latents: .npy or .safetensors holding [T, D] or [1, T, D]")
    parser.add_argument("output", type=Path, help="WAV file to write (.wav)")
    parser.add_argument("--url", required=True, help="server stream URL, e.g. ws://127.0.0.1:8765/v1/stream")
    parser.add_argument("--token", default=settings.TOKEN.value(), help="bearer token "
                        "(default: $STREAMDEC_TOKEN)")  # fmt: skip
    parser.add_argument("--chunk", type=int, default=10, metavar="N", help="latent frames per message (10)")
    parser.add_argument(
        "--realtime", action="store_true", help="send at the pace the frames would be produced"
    )
    parser.add_argument(
        "--dtype", choices=list(LATENT_DTYPES), default="float32", help="latent dtype on the wire"
    )
    parser.add_argument("--format", choices=list(AUDIO_FORMATS), default="pcm_s16le",
                        help="audio format on the wire; opus is decoded here and written as 32-bit float WAV")  # fmt: skip
    parser.add_argument("--prebuffer-ms", type=float, default=100.0, help="the simulated listener starts "
                        "playing this long after the first audio (100, as StreamDecoder assumes)")  # fmt: skip


def run_stream(args: argparse.Namespace) -> int:
    """Run ``streamdec stream``; returns the process exit code."""
    if args.chunk < 1:
        raise UsageError(f"--chunk {args.chunk}: a message carries at least 1 frame")
    if args.prebuffer_ms < 0:
        raise UsageError(f"--prebuffer-ms {args.prebuffer_ms:g}: must be >= 0")
    check_output_path(args.output)
    check_url(args.url)
    latents = load_latent_file(args.input)
    try:
        result = anyio.run(_main, args, latents)
    except Exception as exc:
        hint = connection_hint(exc, args.url, args.token)
        if hint is None:
            raise
        raise UsageError(hint) from exc
    print(result.summary(realtime=args.realtime))
    return 0


def check_url(url: str) -> None:
    """Refuse a --url that is not ws:// or wss:// with a host, saying what one looks like."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise UsageError(f"--url {url!r} is not a websocket URL; use ws://HOST:PORT{STREAM_PATH} "
                         "(wss:// behind TLS), as `streamdec serve` prints it")  # fmt: skip


def connection_hint(exc: BaseException, url: str, token: str | None) -> str | None:
    """One line for a connection that failed because of the URL, the token or the server's state."""
    for leaf in leaves(exc):
        if isinstance(leaf, InvalidStatus):
            return _status_hint(leaf.response.status_code, url, token)
        if isinstance(leaf, InvalidURI):
            return f"--url {url!r} is not a websocket URL; use ws://HOST:PORT{STREAM_PATH}"
        if isinstance(leaf, InvalidHandshake):
            return f"{url} did not answer as a streamdec server ({leaf}); check the host and port"
        if isinstance(leaf, socket.gaierror):
            return f"{url}: unknown host ({leaf.strerror}); check the host name in --url"
        if isinstance(leaf, (ConnectionRefusedError, TimeoutError)) or (
            isinstance(leaf, OSError) and leaf.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
        ):
            return f"cannot connect to {url} ({leaf}); is `streamdec serve` running there?"
        if isinstance(leaf, ConnectionClosed):
            return f"{url} closed the connection ({leaf}); the server's log says why"
    return None


def _status_hint(status: int, url: str, token: str | None) -> str:
    path = urlsplit(url).path or "/"
    if status == 404:
        return f"{url}: the server has no endpoint at {path} (HTTP 404); the stream endpoint is {STREAM_PATH}"
    if status == 401 and not token:
        return f"{url} requires a token (HTTP 401); pass --token TOKEN or set STREAMDEC_TOKEN"
    if status == 401:
        return f"{url} refused the token (HTTP 401); check --token or STREAMDEC_TOKEN"
    if status == 503:
        return f"{url} is not ready (HTTP 503: warming up or shutting down); retry when /healthz answers 200"
    return f"{url} refused the connection with HTTP {status}"


async def _main(args: argparse.Namespace, latents: torch.Tensor) -> StreamResult:
    result = await stream_file(args.url, latents, chunk=args.chunk, realtime=args.realtime, token=args.token,
                               dtype=args.dtype, fmt=args.format, prebuffer=args.prebuffer_ms / 1000,
                               source=str(args.input))  # fmt: skip
    wav_format = "pcm_f32le" if args.format == OPUS_FORMAT else args.format  # Opus: the decoded floats
    write_wav(
        args.output, result.pcm, channels=result.channels, sample_rate=result.sample_rate, fmt=wav_format
    )
    print(
        f"wrote {args.output} ({result.audio_seconds:.2f} s, {result.channels} ch, {result.sample_rate} Hz)"
    )
    return result


@dataclass
class Playback:
    """A listener that starts playing ``prebuffer`` seconds after the first audio, then continuously."""

    sample_rate: int
    prebuffer: float = 0.0
    started_at: float | None = None  # when the first audio arrived
    received: int = 0  # samples per channel received so far
    underruns: int = 0
    worst_deficit: float = 0.0  # seconds: most audio the listener was short of
    _starved: bool = False

    def on_audio(self, now: float, n_samples: int) -> None:
        if self.started_at is None:
            self.started_at = now
        played = max(0.0, now - self.started_at - self.prebuffer)  # what the listener has played by now
        deficit = played - self.received / self.sample_rate
        if deficit > 0 and not self._starved:
            self.underruns += 1  # one underrun per starved stretch, however many messages it spans
        self._starved = deficit > 0
        self.worst_deficit = max(self.worst_deficit, deficit)
        self.received += n_samples


@dataclass
class StreamResult:
    pcm: bytes  # in the wire's PCM format; for opus, the decoded float32 samples
    channels: int
    sample_rate: int
    frames: int
    sent_at: float
    first_audio_at: float
    done_at: float
    playback: Playback
    wire_bytes: int = 0  # audio payload bytes received

    @property
    def audio_seconds(self) -> float:
        return self.playback.received / self.sample_rate

    def summary(self, *, realtime: bool = False) -> str:
        """What the run measured, each figure with what it means."""
        wall = self.done_at - self.sent_at
        rtf = wall / self.audio_seconds if self.audio_seconds else float("nan")
        pace = (
            "latents were sent at the pace a real-time model makes them, so the first window also waited "
            "for its frames (first tile plus the codec's right context) to arrive"
            if realtime
            else "latents were sent as fast as the connection took them"
        )
        return (
            f"time to first audio {1000 * (self.first_audio_at - self.sent_at):.1f} ms: from sending the first "
            f"latents to receiving the first audio; {pace}\n"
            f"real-time factor {rtf:.3f}: {wall:.2f} s wall for {self.audio_seconds:.2f} s of audio"
            + (
                " (with --realtime the sender sets the pace: near 1 means the server kept up)"
                if realtime
                else " (below 1 is faster than real time)"
            )
            + f"\naudio on the wire {self.wire_bytes / max(self.audio_seconds, 1e-9) / 1000:.1f} kB/s "
            f"({self.wire_bytes} bytes of payload)"
            + f"\nunderruns {self.playback.underruns}: times a listener that starts playing "
            f"{1000 * self.playback.prebuffer:.0f} ms after the first audio would have run dry (0 is the goal; "
            f"worst shortfall {1000 * self.playback.worst_deficit:.1f} ms)"
        )


async def stream_file(
    url: str,
    latents: torch.Tensor,
    *,
    chunk: int = 10,
    realtime: bool = False,
    token: str | None = None,
    dtype: str = "float32",
    fmt: str = "pcm_s16le",
    prebuffer: float = 0.1,
    source: str = "latents",
) -> StreamResult:
    """Stream ``latents`` ``[T, D]`` in messages of ``chunk`` frames and collect the audio; the result's
    playback counts underruns for a listener that buffers ``prebuffer`` seconds before playing.

    Latents that do not fit the server's codec raise before anything is sent (``source`` names them); an
    error the server sends raises as :class:`~streamdec.errors.ServerError` with its code.
    """
    async with connect(url, token=token) as conn:
        codec = conn.codec
        check_latent_shape(latents, source, codec.latent_dim, codec.name,
                           "stream latents of that codec, or point --url at a server that runs yours")  # fmt: skip
        stream = await conn.open_stream(dtype=dtype, format=fmt)
        playback = Playback(codec.sample_rate, prebuffer)
        pcm: list[bytes] = []
        wire_bytes = 0
        sent_at = time.monotonic()
        failure: ServerError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                _send_all, stream, latents, chunk, codec.sample_rate / codec.hop_size if realtime else 0.0
            )
            try:
                async for frame in stream:
                    playback.on_audio(time.monotonic(), frame.n_samples)
                    wire_bytes += len(frame.pcm)
                    pcm.append(frame.samples.T.astype("<f4").tobytes() if fmt == OPUS_FORMAT else frame.pcm)
            except ServerError as exc:  # raised out here, not wrapped in the task group's ExceptionGroup
                failure = exc
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        done_at = time.monotonic()
        first = playback.started_at if playback.started_at is not None else done_at
        return StreamResult(b"".join(pcm), codec.channels, codec.sample_rate, int(latents.shape[0]), sent_at,
                            first, done_at, playback, wire_bytes)  # fmt: skip


async def _send_all(stream: ClientStream, latents: torch.Tensor, chunk: int, frame_rate: float) -> None:
    """Send in chunks; with a frame rate, a chunk leaves when its last frame would have been produced.

    Pacing follows an absolute schedule from the start, so sleep overshoot never accumulates.
    """
    start, total = time.monotonic(), int(latents.shape[0])
    for begin in range(0, total, chunk):
        if frame_rate:
            ready_at = start + min(begin + chunk, total) / frame_rate
            await anyio.sleep(max(0.0, ready_at - time.monotonic()))
        await stream.send(latents[begin : begin + chunk])
    await stream.end()
