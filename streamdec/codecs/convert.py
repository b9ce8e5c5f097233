"""``streamdec convert SRC DST.safetensors``: a reference checkpoint to streamdec's own format.

SRC is a DAC ``.pth``, a Stable Audio Open ``model.safetensors`` (``model_config.json`` beside it is used
when present), a BigVGAN ``bigvgan_generator.pt`` (``config.json`` beside it, or ``--config``) or the
directory holding the latter, or anything else :func:`streamdec.codecs.load_codec` accepts. DST is written
with :func:`streamdec.codecs.save_codec`: weight norm folded, names and config in its metadata, so that
``load_codec(DST)`` rebuilds the same decoder without the reference's files or packages.
"""

from __future__ import annotations

import argparse
import os

import torch

from streamdec.codecs.base import Codec
from streamdec.codecs.checkpoint import save_codec
from streamdec.codecs.formats import is_foreign, read_foreign
from streamdec.codecs.loading import load_codec
from streamdec.errors import CodecError

__all__ = ["configure_convert", "convert", "run_convert"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def configure_convert(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "src",
        help="DAC .pth, Stable Audio Open model.safetensors, BigVGAN .pt or directory, Piper voice .onnx",
    )
    parser.add_argument("dst", help="output file, .safetensors")
    parser.add_argument("--name", default=None, help="codec name stored in the file (default: from SRC)")
    parser.add_argument("--sample-rate", type=int, default=None, help="DAC: override the file's sample rate")
    parser.add_argument("--config", default=None, help="BigVGAN: config.json when not beside the weights")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(_DTYPES), help="dtype of the stored tensors"
    )
    parser.add_argument("--force", action="store_true", help="overwrite DST if it exists")


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    name: str | None = None,
    sample_rate: int | None = None,
    config: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Codec:
    """Read ``src``, write ``dst`` with :func:`save_codec`, and return the codec that was written."""
    if not os.fspath(dst).endswith(".safetensors"):
        raise CodecError(f"destination {os.fspath(dst)!r} must end in .safetensors (streamdec's format)")
    if os.path.exists(src) and is_foreign(src):
        codec = read_foreign(src, name=name, sample_rate=sample_rate, config=config)
    else:
        if sample_rate is not None or config is not None:
            raise CodecError(
                f"{os.fspath(src)!r} is not a DAC or BigVGAN checkpoint: drop --sample-rate/--config"
            )
        codec = load_codec(src)
        if name is not None:
            codec.name = name
    codec = codec.to(dtype=dtype)
    save_codec(codec, dst)
    return codec


def run_convert(args: argparse.Namespace) -> int:
    if os.path.exists(args.dst) and not args.force:
        raise CodecError(f"{args.dst} exists; pass --force to overwrite it")
    codec = convert(args.src, args.dst, name=args.name, sample_rate=args.sample_rate, config=args.config,
                    dtype=_DTYPES[args.dtype])  # fmt: skip
    left, right = codec.context_frames()
    params = sum(p.numel() for p in codec.parameters())
    print(
        f"wrote {args.dst}: {codec.family} {codec.name!r}, {params:,} parameters, latent_dim {codec.latent_dim}, "
        f"hop {codec.hop_size}, {codec.sample_rate} Hz, {codec.channels} channel(s), context left={left} "
        f"right={right} frames"
    )
    return 0
