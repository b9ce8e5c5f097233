"""``load_codec``: a codec by preset name or from a checkpoint file."""

from __future__ import annotations

import os

import torch

from streamdec.codecs.base import Codec
from streamdec.codecs.checkpoint import read_checkpoint
from streamdec.codecs.formats import is_foreign, read_foreign
from streamdec.codecs.registry import PRESETS, build_preset, finalize
from streamdec.codecs.vits import PIPER_VOICES, read_piper_onnx, voice_files
from streamdec.errors import CodecError

__all__ = ["load_codec"]


def load_codec(
    spec: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Codec:
    """A codec by preset name (``"tiny"``, ``"auk-24k"``, ``"dac-44k"``, ...), an installed voice
    (``"piper-joe"``: the trained decoder of a Piper voice package) or from a checkpoint file.

    Files: a ``save_codec`` safetensors file, or a reference checkpoint read by
    :mod:`streamdec.codecs.formats` (DAC ``.pth``, Stable Audio Open ``model.safetensors``, BigVGAN
    ``bigvgan_generator.pt`` with ``config.json`` beside it, or its directory, a Piper voice ``.onnx``),
    recognised by content.

    Raises :class:`~streamdec.errors.CodecError` for an unknown name and
    :class:`~streamdec.errors.CheckpointError` for a file that does not match its declared architecture.
    """
    if isinstance(spec, str) and spec in PRESETS:
        return finalize(build_preset(spec), device, dtype)
    if isinstance(spec, str) and spec in PIPER_VOICES:
        return finalize(read_piper_onnx(voice_files(spec)[0], name=spec), device, dtype)
    if os.path.exists(spec) and is_foreign(spec):
        return finalize(read_foreign(spec), device, dtype)
    if os.path.isfile(spec):
        return finalize(read_checkpoint(spec), device, dtype)
    raise CodecError(
        f"codec {os.fspath(spec)!r} is neither a preset nor an existing file; presets: {sorted(PRESETS)}, "
        f"voices: {sorted(PIPER_VOICES)}, "
        f"or pass the path of a checkpoint (save_codec, DAC .pth, Stable Audio Open model.safetensors, BigVGAN, Piper .onnx)"
    )
