"""`make demo`: stream a generated latent clip through the tiny codec, then through a real server.

1. Library: latents arrive at real-time pace (50 frames/s, in chunks of 1-4 frames, as a TTS model would
   produce them) and go through ``StreamDecoder.decode_tiles``; prints time to first audio and the
   real-time factor, and writes ``OUT``.
2. Server: starts ``streamdec serve`` on a free port with the same codec, streams the same latents with
   ``streamdec stream`` and writes ``OUT`` with ``-server`` before the suffix.
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
from pathlib import Path

import torch

import streamdec
from streamdec.io import save_latents, write_wav


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


async def library_demo(codec: streamdec.Codec, latents: torch.Tensor, out: Path) -> None:
    frame_rate = codec.sample_rate / codec.hop_size
    async with streamdec.StreamDecoder(codec, min_emit=2, max_emit=32) as dec:
        report = await dec.warmup()
        print(f"warm-up: {report.seconds:.2f} s for window sizes {dec.window_sizes}")
        began = time.monotonic()
        first, pieces = None, []
        async for tile in dec.decode_tiles(paced(latents, frame_rate, seed=1)):
            first = first if first is not None else time.monotonic() - began
            pieces.append(tile.samples)
        wall = time.monotonic() - began
        busy = dec.stats.engine.decode_seconds
    audio = torch.cat(pieces, dim=-1)
    seconds = audio.shape[-1] / codec.sample_rate
    write_wav(out, audio, codec.sample_rate)
    # The first window needs min_emit frames plus the right context: that arrival time is the floor.
    floor = (2 + dec.right) / frame_rate
    print(
        f"library: {seconds:.2f} s of audio; first audio after {1000 * (first or 0):.0f} ms "
        f"(arrival of the first window's frames: {1000 * floor:.0f} ms); decode RTF {busy / seconds:.3f} "
        f"(decode time / audio time); wall {wall:.2f} s; wrote {out}"
    )


def server_demo(latents: torch.Tensor, out: Path) -> None:
    latent_file = out.with_suffix(".npy")
    save_latents(latent_file, latents)
    server_out = out.with_name(out.stem + "-server" + out.suffix)
    cmd = [
        sys.executable,
        "-m",
        "streamdec.cli",
        "serve",
        "--codec",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as server:
        try:
            url = _wait_for_url(server)
            print(f"server: {url}")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "streamdec.cli",
                    "stream",
                    str(latent_file),
                    "--url",
                    url,
                    str(server_out),
                    "--realtime",
                    "--chunk",
                    "2",
                ],
                check=True,
            )
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
    parser.add_argument("--no-server", action="store_true", help="skip the websocket part")
    args = parser.parse_args()
    codec = streamdec.load_codec("tiny")
    frames = round(args.seconds * codec.sample_rate / codec.hop_size)
    latents = torch.randn(frames, codec.latent_dim, generator=torch.Generator().manual_seed(0))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(library_demo(codec, latents, args.out))
    if not args.no_server:
        server_demo(latents, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
