"""The ``streamdec`` command: ``info``, ``decode``, ``convert``, ``serve``, ``stream``, ``bench``.

Each subcommand is a ``configure_*`` (arguments) and ``run_*`` (work) pair; the server, client and bench
ones live beside their code and are imported only when used. A user's mistake ends in one line on stderr
and exit code 2 (:mod:`streamdec.cli_errors`); ``--debug`` shows the traceback as well.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from ._version import __version__
from .cli_errors import UsageError, check_output_path, describe
from .errors import StreamdecError

if TYPE_CHECKING:
    from .codecs.base import Codec

__all__ = ["add_codec_arguments", "check_device", "check_latent_shape", "load_latent_file", "main"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _preset_names() -> str:
    from .codecs.registry import PRESETS

    return ", ".join(sorted(PRESETS))


def add_codec_arguments(parser: argparse.ArgumentParser, *, default: str = "tiny") -> None:
    """``--codec``, ``--device``, ``--dtype``: shared by every command that loads a codec."""
    parser.add_argument(
        "--codec",
        default=default,
        help=f"a preset ({_preset_names()}; random weights) or a checkpoint path (default {default})",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))


def check_device(device: str) -> torch.device:
    """``device`` as a torch device, or a UsageError saying why this torch cannot use it."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type != "cuda":
        return dev
    if torch.version.cuda is None:
        raise UsageError(
            f"--device {device}: this torch ({torch.__version__}) is a CPU build; install a CUDA build of "
            "torch first (see the README's install section), or use --device cpu"
        )
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: torch {torch.__version__} sees no CUDA GPU; check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES, or use --device cpu"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise UsageError(
            f"--device {device}: this machine has {count} CUDA device(s), cuda:0 .. cuda:{count - 1}"
        )
    return dev


def load_codec_from_args(args: argparse.Namespace) -> Any:
    from .codecs import load_codec

    check_device(args.device)
    return load_codec(args.codec, device=args.device, dtype=_DTYPES[args.dtype])


def load_latent_file(path: str | Path) -> torch.Tensor:
    """Read a latent file for a command; a file that is not latents is a UsageError naming it."""
    from .io import load_latents

    try:
        latents = load_latents(path)
    except (OSError, StreamdecError):
        raise
    except Exception as exc:  # numpy's and safetensors' own parse errors
        raise UsageError(
            f"{path}: cannot read latents from it ({type(exc).__name__}: {exc}); write [frames, latent_dim] "
            "float latents with numpy.save or safetensors"
        ) from exc
    if not latents.is_floating_point():
        raise UsageError(f"{path} holds {latents.dtype} values; latents must be floating point")
    return latents


def check_latent_shape(
    latents: torch.Tensor,
    path: str | Path,
    latent_dim: int,
    codec_name: str,
    fix: str = "pick the codec these latents belong to with --codec",
) -> None:
    """The file's latents must be ``[frames, latent_dim]`` for this codec; say which file and shape if not."""
    if latents.dim() != 2 or latents.shape[1] != latent_dim:
        raise UsageError(
            f"{path} holds latents of shape {tuple(latents.shape)}, but codec {codec_name!r} takes "
            f"[frames, {latent_dim}]; {fix}"
        )


def _check_finite(latents: torch.Tensor, path: str | Path) -> None:
    bad = ~torch.isfinite(latents)
    if bool(bad.any()):
        first = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0])
        raise UsageError(
            f"{path} holds {int(bad.sum())} NaN or infinite values (the first in frame {first}); "
            "latents must be finite: check the model that produced them"
        )


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
        ("stream state", _stream_state(codec)),
    ]
    for key, value in rows:
        print(f"{key:>13}: {value}")
    return 0


def _stream_state(codec: Codec) -> str:
    """What one stateful stream keeps on the device, and what a server's slots for 512 take."""
    from .codecs.precision import PRECISIONS
    from .codecs.stateful import StatefulNet, supports_stateful

    if not supports_stateful(codec):
        return "none: this decoder streams in halo windows only"
    dtype = next(codec.parameters()).dtype
    per_stream = StatefulNet(codec).state_bytes(dtype)
    size = f"{per_stream / 1e6:.2f} MB" if per_stream >= 1e6 else f"{per_stream / 1e3:.1f} kB"
    # State is kept in the codec's dtype: the split precisions change how a float32 conv multiplies, not
    # what a layer stores.
    name = str(dtype).removeprefix("torch.")
    held = f"{name} at every precision ({', '.join(PRECISIONS)})" if dtype == torch.float32 else name
    return f"{size} a stream in {held}; {512 * per_stream / 2**30:.2f} GiB for 512 streams"


# -- decode ----------------------------------------------------------------------------------------
def configure_decode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="latent file: .npy or .safetensors, [T, D] normalized latents")
    parser.add_argument("output", help="WAV file to write (.wav)")
    add_codec_arguments(parser)
    parser.add_argument("--max-emit", type=int, default=64, help="frames emitted per window")


def run_decode(args: argparse.Namespace) -> int:
    from .io import write_wav
    from .streaming import StreamDecoder

    output = check_output_path(args.output)
    latents = load_latent_file(args.input)
    codec = load_codec_from_args(args)
    check_latent_shape(latents, args.input, codec.latent_dim, codec.name)
    _check_finite(latents, args.input)

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
    write_wav(output, audio, codec.sample_rate)
    seconds = audio.shape[-1] / codec.sample_rate
    print(
        f"wrote {output}: {seconds:.2f} s of audio from {args.input} {tuple(latents.shape)} in {elapsed:.2f} s "
        f"(real-time factor {elapsed / max(seconds, 1e-9):.3f}, below 1 is faster than real time)"
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
    "say": ("speak text with a voice into a WAV file", ("streamdec.voice.cli", "configure_say", "run_say")),
    "convert": (
        "convert a checkpoint (DAC, Stable Audio Open, BigVGAN) to streamdec's safetensors",
        ("streamdec.codecs.convert", "configure_convert", "run_convert"),
    ),
}


def _resolve(command: _Command) -> tuple[Callable[..., None], Callable[..., int]]:
    module_name, configure, run = command
    module = importlib.import_module(module_name)
    return getattr(module, configure), getattr(module, run)


def _debug_parent() -> argparse.ArgumentParser:
    # SUPPRESS: a subcommand without --debug must not reset one given before the subcommand.
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, print the traceback too")  # fmt: skip
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamdec",
        description="Decode a TTS codec's latent frames into audio while they arrive.",
        epilog="`streamdec COMMAND --help` describes a command. Mistakes exit with code 2 and one line on "
        "stderr; --debug adds the traceback.",
    )
    parser.add_argument("--version", action="version", version=f"streamdec {__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    debug = _debug_parent()
    for name, (help_text, command) in _COMMANDS.items():
        configure, run = _resolve(command)
        child = sub.add_parser(name, help=help_text, description=help_text, parents=[debug])
        configure(child)
        child.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise  # not a user's mistake: a bug, with its traceback
        if args.debug:
            traceback.print_exc()
        print(f"streamdec {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
