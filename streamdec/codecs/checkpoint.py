"""Checkpoint I/O: safetensors files whose metadata says how to rebuild the codec.

Metadata (all strings, as safetensors requires)::

    streamdec.format   "1"
    streamdec.family   registered family name, e.g. "auk"
    streamdec.name     codec name reported by ``codec.name``
    streamdec.config   the family's architecture config as JSON

Tensors are the codec's persistent ``state_dict``. Files that store weight norm the old way
(``X.weight_g``/``X.weight_v``, as ``torch.nn.utils.weight_norm`` writes them) or the new way
(``X.parametrizations.weight.original0``/``original1``) are folded to ``X.weight`` on load:
``weight = g * v / ||v||``, the norm over every dimension except the one ``g`` keeps (dim 0 by
default for Conv1d *and* ConvTranspose1d, i.e. the input-channel axis of the latter).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from streamdec.codecs.base import Codec
from streamdec.codecs.registry import build_codec
from streamdec.errors import CheckpointError, CodecError

__all__ = ["FORMAT_VERSION", "fold_weight_norm", "read_checkpoint", "save_codec"]

FORMAT_VERSION = "1"
_OLD_WN = ("weight_g", "weight_v")
_NEW_WN = ("parametrizations.weight.original0", "parametrizations.weight.original1")
_MAX_LISTED = 12


def save_codec(codec: Codec, path: str | os.PathLike[str]) -> None:
    """Write ``codec`` to ``path`` (safetensors) so that ``load_codec(path)`` rebuilds it exactly."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in codec.state_dict().items()}
    metadata = {
        "streamdec.format": FORMAT_VERSION,
        "streamdec.family": codec.family,
        "streamdec.name": codec.name,
        "streamdec.config": json.dumps(codec.config_dict(), sort_keys=True),
    }
    save_file(tensors, os.fspath(path), metadata=metadata)


def _norm_dim(g: Tensor, v: Tensor) -> int | None:
    """The dimension weight norm kept, read off ``g``'s shape (``None``: norm over everything)."""
    if g.numel() == 1:
        return None
    kept = [d for d in range(v.dim()) if g.shape[d] == v.shape[d] and g.shape[d] != 1]
    return kept[0] if len(kept) == 1 else 0


def _fold(g: Tensor, v: Tensor) -> Tensor:
    if g.dim() != v.dim():
        raise CheckpointError(f"weight norm g {tuple(g.shape)} and v {tuple(v.shape)} differ in rank")
    dim = _norm_dim(g, v)
    v64 = v.to(torch.float64)
    if dim is None:
        norm = v64.norm()
    else:
        reduce = [d for d in range(v.dim()) if d != dim]
        norm = v64.pow(2).sum(dim=reduce, keepdim=True).sqrt()
    folded: Tensor = (g.to(torch.float64) * v64 / norm).to(v.dtype)
    return folded


def fold_weight_norm(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace every weight-norm ``(g, v)`` pair by the plain ``weight`` it stands for."""
    out = dict(tensors)
    for g_suffix, v_suffix in (_OLD_WN, _NEW_WN):
        for key in [k for k in tensors if k.endswith(g_suffix)]:
            prefix = key[: -len(g_suffix)]
            v_key = prefix + v_suffix
            if v_key not in tensors:
                raise CheckpointError(f"checkpoint has {key} but not its partner {v_key}; re-export the file")
            out[prefix + "weight"] = _fold(out.pop(key), out.pop(v_key))
    return out


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f" (+{len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else "")


def _check_keys(path: str, expected: dict[str, Tensor], found: dict[str, Tensor]) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = sorted(
        f"{k}: file {tuple(found[k].shape)} vs codec {tuple(expected[k].shape)}"
        for k in set(expected) & set(found)
        if found[k].shape != expected[k].shape
    )
    problems = []
    if missing:
        problems.append(f"missing keys [{_listing(missing)}]")
    if unexpected:
        problems.append(f"unexpected keys [{_listing(unexpected)}]")
    if mismatched:
        problems.append(f"shape mismatches [{_listing(mismatched)}]")
    if problems:
        raise CheckpointError(
            f"checkpoint {path} does not match its declared architecture: {'; '.join(problems)}; "
            f"write the file with streamdec.save_codec from a codec of the same config"
        )


def _read(path: str) -> tuple[dict[str, str], dict[str, Tensor]]:
    try:
        with safe_open(path, framework="pt") as f:
            metadata: dict[str, str] = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as a safetensors file: {exc}") from exc
    return metadata, tensors


def _config(path: str, metadata: dict[str, str]) -> tuple[str, str, dict[str, Any]]:
    needed = ["streamdec.family", "streamdec.config"]
    absent = [k for k in needed if k not in metadata]
    if absent:
        raise CheckpointError(
            f"checkpoint {path} lacks metadata {absent} (found {sorted(metadata)}); "
            f"write it with streamdec.save_codec"
        )
    try:
        config = json.loads(metadata["streamdec.config"])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint {path} has malformed streamdec.config JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {path}: streamdec.config must be a JSON object, got {config!r}")
    family = metadata["streamdec.family"]
    name = metadata.get("streamdec.name", os.path.splitext(os.path.basename(path))[0])
    return family, name, config


def read_checkpoint(path: str | os.PathLike[str]) -> Codec:
    """Rebuild a codec on the CPU, in the file's dtype, from a ``save_codec`` file (caches not yet built)."""
    path = os.fspath(path)
    metadata, tensors = _read(path)
    family, name, config = _config(path, metadata)
    try:
        codec = build_codec(family, name, config)
    except CodecError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(
            f"checkpoint {path} declares an architecture that cannot be built: {exc}"
        ) from exc
    tensors = fold_weight_norm(tensors)
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) == 1:  # keep a float64 file float64 until the caller picks a dtype
        codec = codec.to(dtype=dtypes.pop())
    expected = codec.state_dict()
    _check_keys(path, expected, tensors)
    with torch.no_grad():
        for key, value in expected.items():
            value.copy_(tensors[key])
    return codec
