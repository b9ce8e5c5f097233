"""`make demo`: stream a latent clip through a codec as a TTS model would produce it, then through a server.

1. Library: latents arrive at real-time pace (50 frames/s, in chunks of 1-4 frames) and go through
   ``StreamDecoder.decode_tiles`` after a warm-up; prints the streaming figures, what good values are,
   and writes ``OUT``.
2. Server: starts ``streamdec serve`` on a free port with the same codec, streams the same latents with
   ``streamdec stream --realtime`` and writes ``OUT`` with ``-server`` before the suffix.

The ``tiny`` codec holds random weights, so what you hear is a buzz, not speech: the demo shows the
streaming machinery (timing, exactness, the wire), not a voice. :func:`demo_source` is where a trained
voice plugs in.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import torch

import streamdec
from streamdec.clients.cli import Playback
from streamdec.io import save_latents, write_wav

MIN_EMIT, MAX_EMIT = 2, 32  # first tile, largest tile (frames)
PREBUFFER_S = 0.1  # the listener starts playing this long after its first audio


@dataclass
class Source:
    """What the demo streams: a codec, the latents a model would hand it, and what they will sound like."""

    codec: streamdec.Codec
    latents: torch.Tensor  # [frames, latent_dim]
    sounds_like: str


def demo_source(codec_name: str, seconds: float) -> Source:
    """The demo's codec and latents.

    A trained voice plugs in here: return its codec and the latents of a spoken sentence, and the rest
    of the demo (streaming, server, figures) runs unchanged.
    """
    codec = streamdec.load_codec(codec_name)
    frames = round(seconds * codec.sample_rate / codec.hop_size)
    latents = torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(0))
    return Source(codec, latents, "a buzz: the preset's weights are random and so are the latents")


async def paced(latents: torch.Tensor, frame_rate: float, seed: int) -> AsyncIterator[torch.Tensor]:
    """Yield latents in chunks of 1-4 frames, each when a real-time producer would have it."""
    generator = torch.Generator().manual_seed(seed)
    began, at = time.monotonic(), 0
    while at < latents.shape[0]:
        n = int(torch.randint(1, 5, (1,), generator=generator))
        at_end = min(at + n, int(latents.shape[0]))
        delay = began + at_end / frame_rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield latents[at:at_end]
        at = at_end


async def library_demo(source: Source, out: Path) -> None:
    codec, latents = source.codec, source.latents
    frame_rate = codec.sample_rate / codec.hop_size
    async with streamdec.StreamDecoder(codec, min_emit=MIN_EMIT, max_emit=MAX_EMIT) as dec:
        report = await dec.warmup()
        mode = getattr(dec, "mode", "halo")  # halo windows, or per-stream layer state where supported
        print(f"warm-up: {report.seconds:.2f} s ({mode} decode mode; not counted below)")
        decoded_before = dec.stats.engine.decode_seconds
        playback = Playback(codec.sample_rate, PREBUFFER_S)
        began = time.monotonic()
        first, pieces = None, []
        async for tile in dec.decode_tiles(paced(latents, frame_rate, seed=1)):
            now = time.monotonic()
            first = first if first is not None else now - began
            playback.on_audio(now, int(tile.samples.shape[-1]))
            pieces.append(tile.samples)
        busy = dec.stats.engine.decode_seconds - decoded_before
        right = dec.right
    audio = torch.cat(pieces, dim=-1)
    seconds = audio.shape[-1] / codec.sample_rate
    write_wav(out, audio, codec.sample_rate)
    # The first window needs MIN_EMIT frames plus the right context: their arrival is the floor.
    floor = (MIN_EMIT + right) / frame_rate
    first = first or 0.0
    print(f"library: {seconds:.2f} s of audio streamed through StreamDecoder.decode_tiles, wrote {out}")
    print(
        f"  time to first audio  {1000 * first:.0f} ms after the first latent; the first window's "
        f"{MIN_EMIT} + {right} frames arrive at {1000 * floor:.0f} ms, so decoding added "
        f"{1000 * max(first - floor, 0.0):.0f} ms (good: about one window's decode, under 100 ms on a small CPU and about 10 ms on a GPU)"
    )
    print(
        f"  decode real-time factor {busy / seconds:.3f}: decode time / audio time after warm-up "
        "(good: below 1, or the decoder falls behind a live stream; the lower, the more streams fit)"
    )
    print(
        f"  underruns {playback.underruns}: times a listener starting {1000 * PREBUFFER_S:.0f} ms after "
        "its first audio would have run dry (good: 0)"
    )


def server_demo(codec_name: str, latents: torch.Tensor, out: Path) -> None:
    latent_file = out.with_suffix(".npy")
    save_latents(latent_file, latents)
    server_out = out.with_name(out.stem + "-server" + out.suffix)
    serve = [
        sys.executable,
        "-m",
        "streamdec",
        "serve",
        "--codec",
        codec_name,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as server:
        try:
            url = _wait_for_url(server)
            print(
                f"server: streamdec serve is listening at {url}; streaming the same latents with streamdec stream"
            )
            stream = [
                sys.executable,
                "-m",
                "streamdec",
                "stream",
                str(latent_file),
                str(server_out),
                "--url",
                url,
            ]
            subprocess.run([*stream, "--realtime", "--chunk", "2"], check=True)
        finally:
            server.terminate()
            server.wait(timeout=30)


def _wait_for_url(server: subprocess.Popen[str]) -> str:
    assert server.stdout is not None
    for line in server.stdout:
        match = re.search(r"ws://\S+/v1/stream", line)
        if match:
            return match.group(0)
    raise RuntimeError(f"server exited with {server.wait()} before printing its URL")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/demo.wav"))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--codec", default="tiny", help="preset or checkpoint (default tiny, random weights)")
    parser.add_argument("--no-server", action="store_true", help="skip the websocket part")
    args = parser.parse_args()
    source = demo_source(args.codec, args.seconds)
    print(
        f"streamdec demo: codec {source.codec.name!r}, {args.seconds:g} s of latents arriving at "
        f"{source.codec.sample_rate / source.codec.hop_size:g} frames/s in chunks of 1-4 frames. "
        f"It will sound like {source.sounds_like}."
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(library_demo(source, args.out))
    if not args.no_server:
        server_demo(args.codec, source.latents, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
