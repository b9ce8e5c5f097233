"""`make demo`: a trained voice speaks its demo sentences, streamed, through the library and a real server.

1. Library: the piper-joe voice's front half makes latents sentence by sentence (in a worker thread, the
   way a TTS model emits them) and ``StreamDecoder.decode_tiles`` turns them into audio while later
   sentences are still being made; prints the streaming figures and writes ``OUT``.
2. Server: starts ``streamdec serve --voice piper-joe`` on a free port and runs
   ``streamdec say TEXT OUT-server.wav --url ...`` (text in over the websocket, audio back), then checks
   that the two files hold the same audio.
3. Prints what pocketsphinx hears in ``OUT`` and its word error rate (the ``speech-test`` extra).

Needs the ``voice`` extra (``make demo`` installs it). Where the ``espeak-ng`` program is missing, the
demo sentences' committed phonemes are used, so nothing from apt is needed; other text (``--text``) needs it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import torch

import streamdec
from streamdec.clients.cli import Playback
from streamdec.errors import VoiceError
from streamdec.io import write_wav
from streamdec.voice import DEMO_TEXT, Sentence, Voice, text_latents
from streamdec.voice.phonemes import espeak_available

VOICE = "piper-joe"
MIN_EMIT, MAX_EMIT = 4, 32  # first tile, largest tile (frames)
PREBUFFER_S = 0.1  # the listener starts playing this long after its first audio


def told(sentence: Sentence) -> None:
    print(f"  saying: {sentence.text}", flush=True)


async def library_demo(codec: streamdec.Codec, voice: Voice, text: str, out: Path) -> torch.Tensor:
    """Speak ``text`` through StreamDecoder, print the figures, write ``out``; returns the audio."""
    async with streamdec.StreamDecoder(codec, min_emit=MIN_EMIT, max_emit=MAX_EMIT) as dec:
        report = await dec.warmup()
        print(f"library: warm-up {report.seconds:.2f} s ({dec.mode} decode mode; not counted below)")
        decoded_before = dec.stats.engine.decode_seconds
        playback = Playback(codec.sample_rate, PREBUFFER_S)
        began = time.monotonic()
        first, pieces = None, []
        async for tile in dec.decode_tiles(text_latents(voice, text, on_sentence=told)):
            now = time.monotonic()
            first = first if first is not None else now - began
            playback.on_audio(now, int(tile.samples.shape[-1]))
            pieces.append(tile.samples)
        busy = dec.stats.engine.decode_seconds - decoded_before
    audio = torch.cat(pieces, dim=-1)
    seconds = audio.shape[-1] / codec.sample_rate
    write_wav(out, audio, codec.sample_rate)
    print(f"library: {seconds:.2f} s of speech streamed through StreamDecoder.decode_tiles, wrote {out}")
    print(f"  first audio {1000 * (first or 0.0):.0f} ms after the text (the first sentence's phonemes and "
          "front half included)")  # fmt: skip
    print(f"  decode real-time factor {busy / seconds:.3f} (decode time / audio time; below 1 keeps up)")
    print(f"  underruns {playback.underruns}: times a listener starting {1000 * PREBUFFER_S:.0f} ms after "
          "its first audio would have run dry")  # fmt: skip
    return audio


def server_demo(text: str, out: Path) -> Path:
    """``streamdec serve --voice`` on a free port, ``streamdec say --url`` into ``OUT-server.wav``."""
    server_out = out.with_name(out.stem + "-server" + out.suffix)
    serve = [sys.executable, "-m", "streamdec", "serve", "--voice", VOICE, "--host", "127.0.0.1",
             "--port", "0", "--max-streams-total", "2"]  # fmt: skip  # a known capacity: no probe at start
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as server:
        try:
            url = _wait_for_url(server)
            print(f"server: streamdec serve --voice {VOICE} is listening at {url}; sending it the text")
            say = [sys.executable, "-m", "streamdec", "say", text, str(server_out), "--url", url]
            subprocess.run(say, check=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return server_out


def _wait_for_url(server: subprocess.Popen[str]) -> str:
    assert server.stdout is not None
    for line in server.stdout:
        print(f"  {line.rstrip()}")  # what the server says at start (mode, capacity, its voice, its URL)
        match = re.search(r"ws://\S+/v1/stream", line)
        if match:
            return match.group(0)
    raise RuntimeError(f"server exited with {server.wait()} before printing its URL")


def _pcm(path: Path) -> np.ndarray:
    with wave.open(str(path)) as f:
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").astype(np.int32)


def compare(library: Path, server: Path) -> bool:
    """The two WAVs agree: the same length, every sample within one 16-bit step (float rounding)."""
    a, b = _pcm(library), _pcm(server)
    same = a.shape == b.shape and int(np.abs(a - b).max(initial=0)) <= 1
    verdict = "the same audio as" if same else "NOT the same audio as"
    print(f"server: wrote {server}: {verdict} the library's {library} (every sample within one 16-bit step)")
    return same


def hear(audio: torch.Tensor, rate: int, text: str) -> None:
    """Print what pocketsphinx hears and the word error rate; say how to get it where it is missing."""
    try:
        from streamdec.voice.transcribe import transcribe, word_error_rate

        heard = transcribe(audio[0].numpy(), rate)
    except VoiceError as exc:
        print(f"transcript: skipped ({exc})")
        return
    wer = word_error_rate(text, heard)
    print(f"said:  {text}\nheard: {heard}\n  (pocketsphinx, a rough ear; word error rate {wer:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/demo.wav"))
    parser.add_argument("--text", default=DEMO_TEXT, help="what to say (other text needs espeak-ng)")
    parser.add_argument("--no-server", action="store_true", help="skip the websocket part")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))  # a small machine: leave room for the voice
    if not espeak_available():
        print("espeak-ng is not installed: the demo sentences' committed phonemes are used")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    voice, codec = Voice.load(VOICE), streamdec.load_codec(VOICE)
    print(f"streamdec demo: voice {VOICE} (Piper en_US-joe-medium), {voice.latent_dim}-dim latents at "
          f"{codec.sample_rate / codec.hop_size:.2f} frames/s, loaded in {time.monotonic() - began:.1f} s")  # fmt: skip
    audio = asyncio.run(library_demo(codec, voice, args.text, args.out))
    same = True
    if not args.no_server:
        same = compare(args.out, server_demo(args.text, args.out))
    hear(audio, codec.sample_rate, args.text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
