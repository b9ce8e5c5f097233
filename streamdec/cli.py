"""The ``streamdec`` command: ``info``, ``decode``, ``serve``, ``stream``.

Each subcommand is a ``configure_*`` (arguments) and ``run_*`` (work) pair; the server and client ones
live beside their code and are imported only when used.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import torch

from .errors import StreamdecError

__all__ = ["main"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def add_codec_arguments(parser: argparse.ArgumentParser, *, default: str = "tiny") -> None:
    """``--codec``, ``--device``, ``--dtype``: shared by every command that loads a codec."""
    parser.add_argument("--codec", default=default, help="preset name (tiny, auk-24k) or checkpoint path")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))


def load_codec_from_args(args: argparse.Namespace) -> Any:
    from .codecs import load_codec

    return load_codec(args.codec, device=args.device, dtype=_DTYPES[args.dtype])


class Progress:
    """A one-line progress bar on a stream (stderr), redrawn at most ten times a second."""

    def __init__(self, total: int, unit: str, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.total, self.unit, self.stream, self.width = max(total, 1), unit, stream, width
        self.done = 0
        self._drawn = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._drawn >= 0.1 or self.done >= self.total:
            self._drawn = now
            filled = self.width * self.done // self.total
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {self.unit}")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()


# -- info ------------------------------------------------------------------------------------------
def configure_info(parser: argparse.ArgumentParser) -> None:
    add_codec_arguments(parser)


def run_info(args: argparse.Namespace) -> int:
    from .planning import default_window_sizes

    codec = load_codec_from_args(args)
    left, right = codec.context_frames()
    params = sum(p.numel() for p in codec.parameters())
    rows = [
        ("codec", codec.name),
        ("parameters", f"{params:,}"),
        ("latent_dim", codec.latent_dim),
        ("hop_size", codec.hop_size),
        ("sample_rate", codec.sample_rate),
        ("frame_rate", f"{codec.sample_rate / codec.hop_size:g} Hz"),
        ("channels", codec.channels),
        ("context", f"left={left} right={right} frames (halo {left + right})"),
        ("window sizes", default_window_sizes(left, right, 4, 64)),
    ]
    for key, value in rows:
        print(f"{key:>13}: {value}")
    return 0


# -- decode ----------------------------------------------------------------------------------------
def configure_decode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="latent file: .npy or .safetensors, [T, D] normalized latents")
    parser.add_argument("output", help="WAV file to write")
    add_codec_arguments(parser)
    parser.add_argument("--max-emit", type=int, default=64, help="frames emitted per window")


def run_decode(args: argparse.Namespace) -> int:
    from .io import load_latents, write_wav
    from .streaming import StreamDecoder

    codec = load_codec_from_args(args)
    latents = load_latents(args.input)

    async def decode() -> torch.Tensor:
        progress = Progress(int(latents.shape[0]), "frames")
        pieces = []
        async with StreamDecoder(codec, min_emit=args.max_emit, max_emit=args.max_emit) as dec:
            async for tile in dec.decode_tiles(_chunked(latents, args.max_emit)):
                pieces.append(tile.samples)
                progress.update(tile.frames)
        return torch.cat(pieces, dim=-1) if pieces else torch.zeros(codec.channels, 0)

    began = time.perf_counter()
    audio = asyncio.run(decode())
    elapsed = time.perf_counter() - began
    write_wav(args.output, audio, codec.sample_rate)
    seconds = audio.shape[-1] / codec.sample_rate
    print(
        f"wrote {args.output}: {seconds:.2f} s of audio in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.3f})"
    )
    return 0


def _chunked(latents: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    for start in range(0, int(latents.shape[0]), size):
        yield latents[start : start + size]


# -- dispatch --------------------------------------------------------------------------------------
_Command = tuple[str, str, str]  # (module, configure function, run function)

_COMMANDS: dict[str, tuple[str, _Command]] = {
    "info": ("print a codec's geometry and exact context", ("streamdec.cli", "configure_info", "run_info")),
    "decode": ("decode a latent file to WAV", ("streamdec.cli", "configure_decode", "run_decode")),
    "serve": (
        "run the websocket server",
        ("streamdec.server.cli", "configure_serve", "run_serve"),
    ),
    "stream": (
        "stream a latent file through a server and write the WAV",
        ("streamdec.clients.cli", "configure_stream", "run_stream"),
    ),
    "bench": (
        "benchmark tile sizes, tiers, baselines and concurrency",
        ("streamdec.bench.cli", "configure_bench", "run_bench"),
    ),
    "loadtest": (
        "measure how many real-time streams one server process carries (client processes, a sweep)",
        ("streamdec.bench.loadtest", "configure_loadtest", "run_loadtest"),
    ),
    "convert": (
        "convert a checkpoint (DAC, Stable Audio Open, BigVGAN) to streamdec's safetensors",
        ("streamdec.codecs.convert", "configure_convert", "run_convert"),
    ),
}


def _resolve(command: _Command) -> tuple[Callable[..., None], Callable[..., int]]:
    module_name, configure, run = command
    module = importlib.import_module(module_name)
    return getattr(module, configure), getattr(module, run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamdec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, command) in _COMMANDS.items():
        configure, run = _resolve(command)
        child = sub.add_parser(name, help=help_text, description=help_text)
        configure(child)
        child.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except StreamdecError as exc:
        print(f"streamdec {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
