"""Files users hand the CLI: latent files in, WAV files out."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

from .errors import InputError

__all__ = ["load_latents", "pcm16", "s16_values", "save_latents", "write_wav"]

#: the ufunc np.clip ends in, without np.clip's Python wrappers (numpy 2 moved numpy.core to numpy._core)
_clip: np.ufunc = (getattr(np, "_core", None) or np.core).umath.clip
_MINUS_ONE, _ONE, _S16_SCALE = np.float32(-1.0), np.float32(1.0), np.float32(32767.0)


def load_latents(path: str | Path) -> torch.Tensor:
    """Read ``[T, D]`` latents from ``.npy`` or ``.safetensors`` (key ``latents``, or its only tensor)."""
    path = Path(path)
    if path.suffix == ".npy":
        array = np.load(path, allow_pickle=False)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    elif path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if "latents" in tensors:
            tensor = tensors["latents"]
        elif len(tensors) == 1:
            (tensor,) = tensors.values()
        else:
            raise InputError(f"{path} holds {sorted(tensors)}: name the latent tensor 'latents'")
    else:
        raise InputError(f"{path}: unknown latent file type {path.suffix!r}; use .npy or .safetensors")
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]
    return tensor


def save_latents(path: str | Path, latents: torch.Tensor) -> None:
    """Write ``[T, D]`` latents as ``.npy`` or ``.safetensors`` (key ``latents``)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({"latents": latents.contiguous()}, str(path))
    else:
        np.save(path, latents.float().numpy())


def s16_values(samples: np.ndarray) -> np.ndarray:
    """Float audio of any shape -> int16 (little-endian) of the same shape:
    ``round_half_even(clip(x, -1, 1) * 32767)`` in float32. :func:`pcm16` lays it out for the wire; an
    engine call's whole output block goes through it at once (:class:`~streamdec.engine.output.CallOutput`).
    """
    # The clip ufunc itself (np.clip's Python wrappers cost as much as the clip on a tile), then the
    # scaling and rounding in place in its fresh array: one temporary instead of three.
    scaled: np.ndarray = _clip(samples.astype(np.float32, copy=False), _MINUS_ONE, _ONE)
    np.multiply(scaled, _S16_SCALE, out=scaled)
    np.rint(scaled, out=scaled)
    return scaled.astype("<i2")


def pcm16(samples: torch.Tensor | np.ndarray) -> bytes:
    """``[C, N]`` float audio -> interleaved little-endian s16 (:func:`s16_values`). In numpy: a server
    encodes audio messages with it, and a handful of numpy calls cost less than one torch call on a small
    tensor."""
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().to("cpu", torch.float32).numpy()
    return s16_values(samples).T.tobytes()


def write_wav(path: str | Path, samples: torch.Tensor, sample_rate: int) -> None:
    """Write ``[C, N]`` float audio as a 16-bit PCM WAV file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(int(samples.shape[0]))
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm16(samples))
