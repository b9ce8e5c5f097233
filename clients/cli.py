"""``streamdec stream IN --url URL OUT.wav``: send a latent file through a server and write the WAV.

Prints time to first audio, the real-time factor and underruns of a simulated listener that starts
playing ``--prebuffer-ms`` after the first audio (100 ms, what ``StreamDecoder`` assumes of a listener when
it decides to flush early): an underrun is an audio message arriving while the audio received before it
is shorter than the wall time elapsed since playback started.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch

from streamdec import settings
from streamdec.errors import ServerError
from streamdec.io import load_latents
from streamdec.protocol import LATENT_DTYPES, SAMPLE_FORMATS

from .client import ClientStream, connect
from .wav import write_wav

__all__ = ["Playback", "StreamResult", "configure_stream", "run_stream", "stream_file"]


def configure_stream(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec stream`` arguments to ``parser``."""
    parser.add_argument("input", type=Path, help="latents: .npy or .safetensors holding [T, D] or [1, T, D]")
    parser.add_argument("output", type=Path, help="WAV file to write")
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
    parser.add_argument("--format", choices=list(SAMPLE_FORMATS), default="pcm_s16le", help="audio format")
    parser.add_argument("--prebuffer-ms", type=float, default=100.0, help="the simulated listener starts "
                        "playing this long after the first audio (100, as StreamDecoder assumes)")  # fmt: skip


def run_stream(args: argparse.Namespace) -> int:
    """Run ``streamdec stream``; returns the process exit code."""
    if args.chunk < 1:
        print(f"--chunk must be >= 1, got {args.chunk}")
        return 2
    if args.prebuffer_ms < 0:
        print(f"--prebuffer-ms must be >= 0, got {args.prebuffer_ms}")
        return 2
    latents = load_latents(args.input)
    try:
        result = anyio.run(_main, args, latents)
    except ServerError as exc:
        print(f"server error {exc.code}: {exc}")
        return 1
    except OSError as exc:
        print(f"cannot connect to {args.url}: {exc}")
        return 1
    print(result.summary())
    return 0


async def _main(args: argparse.Namespace, latents: torch.Tensor) -> StreamResult:
    result = await stream_file(args.url, latents, chunk=args.chunk, realtime=args.realtime, token=args.token,
                               dtype=args.dtype, fmt=args.format, prebuffer=args.prebuffer_ms / 1000)  # fmt: skip
    write_wav(
        args.output, result.pcm, channels=result.channels, sample_rate=result.sample_rate, fmt=args.format
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
    pcm: bytes
    channels: int
    sample_rate: int
    frames: int
    sent_at: float
    first_audio_at: float
    done_at: float
    playback: Playback

    @property
    def audio_seconds(self) -> float:
        return self.playback.received / self.sample_rate

    def summary(self) -> str:
        wall = self.done_at - self.sent_at
        rtf = wall / self.audio_seconds if self.audio_seconds else float("nan")
        return (
            f"time to first audio {1000 * (self.first_audio_at - self.sent_at):.1f} ms\n"
            f"real-time factor {rtf:.3f} ({wall:.2f} s wall for {self.audio_seconds:.2f} s of audio; "
            f"below 1 is faster than real time)\n"
            f"underruns {self.playback.underruns} (worst deficit {1000 * self.playback.worst_deficit:.1f} ms, "
            f"listener prebuffer {1000 * self.playback.prebuffer:.0f} ms)"
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
) -> StreamResult:
    """Stream ``latents`` ``[T, D]`` in messages of ``chunk`` frames and collect the audio; the result's
    playback counts underruns for a listener that buffers ``prebuffer`` seconds before playing."""
    async with connect(url, token=token) as conn:
        codec = conn.codec
        stream = await conn.open_stream(dtype=dtype, format=fmt)
        playback = Playback(codec.sample_rate, prebuffer)
        pcm: list[bytes] = []
        sent_at = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                _send_all, stream, latents, chunk, codec.sample_rate / codec.hop_size if realtime else 0.0
            )
            async for frame in stream:
                playback.on_audio(time.monotonic(), frame.n_samples)
                pcm.append(frame.pcm)
        done_at = time.monotonic()
        first = playback.started_at if playback.started_at is not None else done_at
        return StreamResult(b"".join(pcm), codec.channels, codec.sample_rate, int(latents.shape[0]), sent_at,
                            first, done_at, playback)  # fmt: skip


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
