"""``streamdec say TEXT OUT.wav [--url ws://...]``: speak text with a voice, streamed.

Library path (no ``--url``): the voice's front half makes latents sentence by sentence (in a worker
thread) and ``StreamDecoder`` turns them into audio while later sentences are still being made, as it
would for any TTS model; prints each sentence as its synthesis starts. With ``--url`` the text goes to a
server started with ``streamdec serve --voice NAME`` (a ``start`` carrying ``text``), which does the same
and streams the audio back. Both write the WAV and say how long it is.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import torch

from streamdec import settings
from streamdec.cli_errors import UsageError, check_output_path
from streamdec.codecs import Codec, load_codec
from streamdec.io import write_wav
from streamdec.streaming import StreamDecoder
from streamdec.voice.frontend import Voice, VoiceSettings
from streamdec.voice.phonemes import Sentence
from streamdec.voice.source import DEFAULT_CHUNK_FRAMES, text_latents

__all__ = ["configure_say", "run_say", "say", "say_remote"]

#: flags of the library path; a server speaks with its voice's defaults and seed 0
_LIBRARY_ONLY = {"seed": 0, "noise_scale": None, "length_scale": None, "noise_w": None, "voice": "piper-joe"}


def configure_say(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec say`` arguments to ``parser``."""
    parser.add_argument("text", help="what to say (English for piper-joe)")
    parser.add_argument("output", type=Path, help="WAV file to write")
    parser.add_argument("--voice", default="piper-joe", help="installed voice (piper-joe, the `voice` extra)")
    parser.add_argument(
        "--seed", type=int, default=0, help="noise seed: the same text and seed give the same audio"
    )
    parser.add_argument("--noise-scale", type=float, default=None, help="prior noise (default: the voice's)")
    parser.add_argument(
        "--length-scale", type=float, default=None, help="slower above 1 (default: the voice's)"
    )
    parser.add_argument("--noise-w", type=float, default=None, help="duration noise (default: the voice's)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_FRAMES, help="latent frames per chunk (8)")
    parser.add_argument("--url", default=None, help="speak through a server started with `streamdec serve "
                        "--voice piper-joe`, at its stream URL, e.g. ws://127.0.0.1:8765/v1/stream")  # fmt: skip
    parser.add_argument("--token", default=settings.TOKEN.value(),
                        help="bearer token for --url (default: $STREAMDEC_TOKEN)")  # fmt: skip


def settings_from_args(voice: Voice, args: argparse.Namespace) -> VoiceSettings:
    """The voice's default scales, overridden by the flags given, with ``--seed``."""
    d = voice.defaults
    return VoiceSettings(
        d.noise_scale if args.noise_scale is None else args.noise_scale,
        d.length_scale if args.length_scale is None else args.length_scale,
        d.noise_w if args.noise_w is None else args.noise_w,
        seed=args.seed,
    )


async def say(
    codec: Codec,
    voice: Voice,
    text: str,
    *,
    settings: VoiceSettings | None = None,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    on_sentence: Callable[[Sentence], None] | None = None,
) -> torch.Tensor:
    """``text`` spoken through ``StreamDecoder``: float32 audio ``[channels, samples]``."""
    pieces = []
    async with StreamDecoder(codec, min_emit=4, max_emit=32) as dec:
        chunks = text_latents(
            voice, text, settings=settings, chunk_frames=chunk_frames, on_sentence=on_sentence
        )
        async for tile in dec.decode_tiles(chunks):
            pieces.append(tile.samples)
    return torch.cat(pieces, dim=-1) if pieces else torch.zeros(codec.channels, 0)


async def say_remote(url: str, text: str, *, token: str | None = None) -> tuple[torch.Tensor, int]:
    """``text`` spoken by the server at ``url``: float32 audio ``[channels, samples]`` and its sample rate."""
    from streamdec.clients.client import connect

    pieces = []
    async with connect(url, token=token) as conn:
        stream = await conn.open_stream(text=text, format="pcm_f32le")
        async for frame in stream:
            pieces.append(torch.from_numpy(frame.samples))
        codec = conn.codec
    audio = torch.cat(pieces, dim=-1) if pieces else torch.zeros(codec.channels, 0)
    return audio, codec.sample_rate


def _run_remote(args: argparse.Namespace) -> int:
    from streamdec.clients.cli import check_url, connection_hint

    tuned = [
        f"--{k.replace('_', '-')}" for k, default in _LIBRARY_ONLY.items() if getattr(args, k) != default
    ]
    if tuned:
        raise UsageError(
            f"{', '.join(tuned)}: the library path's settings; through --url the server's voice speaks "
            "with its own. Drop them, or drop --url"
        )
    check_url(args.url)
    began = time.perf_counter()
    try:
        audio, rate = asyncio.run(say_remote(args.url, args.text, token=args.token))
    except Exception as exc:
        hint = connection_hint(exc, args.url, args.token)
        if hint is None:
            raise
        raise UsageError(hint) from exc
    write_wav(args.output, audio, rate)
    elapsed = time.perf_counter() - began
    print(f"wrote {args.output}: {audio.shape[-1] / rate:.2f} s of speech from {args.url} in {elapsed:.2f} s")
    return 0


def run_say(args: argparse.Namespace) -> int:
    """Run ``streamdec say``; returns the process exit code."""
    check_output_path(args.output)
    if args.url is not None:
        return _run_remote(args)
    voice = Voice.load(args.voice)
    codec = load_codec(args.voice)
    settings = settings_from_args(voice, args)

    def told(sentence: Sentence) -> None:
        print(f"saying: {sentence.text}", flush=True)

    began = time.perf_counter()
    audio = asyncio.run(
        say(codec, voice, args.text, settings=settings, chunk_frames=args.chunk, on_sentence=told)
    )
    elapsed = time.perf_counter() - began
    write_wav(args.output, audio, codec.sample_rate)
    seconds = audio.shape[-1] / codec.sample_rate
    print(f"wrote {args.output}: {seconds:.2f} s of speech at {codec.sample_rate} Hz in {elapsed:.2f} s")
    return 0
