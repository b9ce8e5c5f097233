"""Readers for the checkpoint files users of the zoo families actually hold (local paths only).

==================  ==========================================================================================
DAC                 ``weights.pth`` from descript-audio-codec: ``torch.save({"state_dict": ...,
                    "metadata": {"kwargs": {...}}})``. Keys ``decoder.model.*`` with old-style weight norm
                    (``weight_g``/``weight_v``) and Snake ``alpha`` shaped ``[1, C, 1]``. The architecture is
                    read off the tensor shapes; ``metadata.kwargs.sample_rate`` gives the rate.
Stable Audio Open   ``model.safetensors`` (the whole model or the VAE alone): keys under
                    ``pretransform.model.decoder.`` (or ``decoder.`` for an autoencoder file). The
                    architecture comes from ``model_config.json`` beside it when present
                    (``model.pretransform.config.decoder.config``, ``pretransform.scale``), else from the
                    tensor shapes with Stable Audio Open 1.0's ``final_tanh = false``.
BigVGAN             ``bigvgan_generator.pt`` (``torch.save({"generator": state_dict})``) with ``config.json``
                    beside it, or the directory holding both. Its filter buffers must equal streamdec's
                    Kaiser-sinc filter and are dropped.
==================  ==========================================================================================

Every ``.pt``/``.pth`` file is read with ``torch.load(weights_only=True)``: nothing in a checkpoint runs
code. A file whose tensors do not fit the architecture raises :class:`CheckpointError` naming the missing
and unexpected keys and the mismatched shapes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from streamdec.codecs.base import Codec
from streamdec.codecs.bigvgan import BigVGANConfig
from streamdec.codecs.checkpoint import fold_weight_norm
from streamdec.codecs.dac import DACCodebooks, DACConfig
from streamdec.codecs.layers import FILTER_TAPS, kaiser_sinc_filter
from streamdec.codecs.registry import build_codec
from streamdec.codecs.vits import read_piper_onnx
from streamdec.errors import CheckpointError, CodecError

__all__ = [
    "is_foreign",
    "load_into",
    "read_bigvgan",
    "read_dac",
    "read_dac_codebooks",
    "read_foreign",
    "read_stable_audio",
]

SAO_PREFIXES = ("pretransform.model.decoder.", "decoder.")
_MAX_LISTED = 12


# -- shared ------------------------------------------------------------------------------------------
def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


def load_into(codec: Codec, tensors: Mapping[str, Tensor], source: str, kind: str) -> Codec:
    """Copy ``tensors`` into ``codec`` (normalisation buffers may be absent); errors list every problem."""
    expected = codec.state_dict()
    optional = {"global_mean", "global_log_std"}
    missing = sorted(set(expected) - set(tensors) - optional)
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = sorted(
        f"{k}: file {tuple(tensors[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(tensors)
        if tensors[k].shape != expected[k].shape
    )
    problems = [
        f"{label} [{_listing(items)}]"
        for label, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        )
        if items
    ]
    if problems:
        raise CheckpointError(
            f"{source} does not match the {kind} architecture it describes: {'; '.join(problems)}; "
            f"is it an unmodified {kind} checkpoint?"
        )
    with torch.no_grad():
        codec.global_mean.zero_()  # reference checkpoints carry no normalisation: the identity
        codec.global_log_std.fill_(1.0)
        for key, value in tensors.items():
            expected[key].copy_(value)
    return codec


def _torch_load(path: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and weights-only errors have no common base class
        raise CheckpointError(
            f"cannot read {path} as a weights-only torch checkpoint ({type(exc).__name__}: {exc}); "
            f"streamdec never unpickles code: re-save the state dict with plain tensors"
        ) from exc


def _build(family: str, name: str, config: dict[str, Any], source: str) -> Codec:
    try:
        return build_codec(family, name, config)
    except CodecError as exc:
        raise CheckpointError(
            f"{source} describes a {family} architecture streamdec cannot build: {exc}"
        ) from exc


def _weight(tensors: Mapping[str, Tensor], key: str, source: str) -> Tensor:
    if key not in tensors:
        raise CheckpointError(f"{source} has no tensor {key!r} (from which the architecture is read)")
    return tensors[key]


def _blocks(tensors: Mapping[str, Tensor], pattern: str) -> list[int]:
    found = {int(m.group(1)) for k in tensors if (m := re.fullmatch(pattern, k))}
    return sorted(found)


# -- DAC -----------------------------------------------------------------------------------------------
def read_dac(
    path: str | os.PathLike[str], *, name: str | None = None, sample_rate: int | None = None
) -> Codec:
    """A DAC decoder from a descript-audio-codec ``.pth`` file (see the module docstring)."""
    path = os.fspath(path)
    return _dac_from_data(path, _torch_load(path), name=name, sample_rate=sample_rate)


def _dac_from_data(path: str, data: Any, *, name: str | None = None, sample_rate: int | None = None) -> Codec:
    if not (isinstance(data, dict) and isinstance(data.get("state_dict"), dict)):
        raise CheckpointError(
            f"{path} is not a DAC checkpoint: expected a dict with 'state_dict' and 'metadata'"
        )
    kwargs = dict(data.get("metadata", {}).get("kwargs", {}) or {})
    state = {k[len("decoder.") :]: v for k, v in data["state_dict"].items() if k.startswith("decoder.")}
    if not state:
        raise CheckpointError(f"{path} holds no 'decoder.' tensors; is it a DAC codec checkpoint?")
    state = fold_weight_norm(state)
    state = {k: v.reshape(-1) if k.endswith(".alpha") else v for k, v in state.items()}
    first = _weight(state, "model.0.weight", path)
    blocks = _blocks(state, r"model\.(\d+)\.block\.1\.weight")
    rates = tuple(int(state[f"model.{i}.block.1.weight"].shape[2]) // 2 for i in blocks)
    rate = sample_rate if sample_rate is not None else kwargs.get("sample_rate")
    if rate is None:
        raise CheckpointError(f"{path} has no metadata.kwargs.sample_rate; pass the sample rate explicitly")
    config = DACConfig(latent_dim=int(first.shape[1]), decoder_dim=int(first.shape[0]),
                       decoder_rates=rates, sample_rate=int(rate))  # fmt: skip
    _check_declared(path, kwargs, {"decoder_dim": config.decoder_dim, "decoder_rates": list(rates)})
    codec = _build("dac", name or Path(path).stem, config.to_dict(), path)
    return load_into(codec, state, path, "DAC decoder")


def read_dac_codebooks(path: str | os.PathLike[str]) -> DACCodebooks:
    """The residual codebooks of a DAC ``.pth`` (``quantizer.quantizers.N.codebook`` and ``out_proj``)."""
    path = os.fspath(path)
    data = _torch_load(path)
    state = data.get("state_dict") if isinstance(data, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a DAC checkpoint: expected a dict with 'state_dict'")
    prefix = "quantizer.quantizers."
    q = fold_weight_norm({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    indices = _blocks(q, r"(\d+)\.codebook\.weight")
    if not indices or indices != list(range(len(indices))):
        raise CheckpointError(f"{path} holds no contiguous quantizer.quantizers.N.codebook.weight tensors")
    tables = []
    with torch.no_grad():
        for i in indices:
            book = q[f"{i}.codebook.weight"].double()  # [size, dim]
            weight = _weight(q, f"{i}.out_proj.weight", path).double()  # [latent, dim, 1]
            bias = _weight(q, f"{i}.out_proj.bias", path).double()
            tables.append((book @ weight[..., 0].T + bias).float())
    if len({t.shape for t in tables}) != 1:
        raise CheckpointError(
            f"{path}: codebooks differ in shape ({sorted({tuple(t.shape) for t in tables})})"
        )
    return DACCodebooks(torch.stack(tables))


def _check_declared(path: str, declared: Mapping[str, Any], found: Mapping[str, Any]) -> None:
    """Metadata that disagrees with the tensors means a hand-edited file: refuse it."""
    for key, value in found.items():
        said = declared.get(key)
        if said is not None and (list(said) if isinstance(value, list) else said) != value:
            raise CheckpointError(
                f"{path}: metadata says {key}={said!r} but the tensors say {value!r}; the file is inconsistent"
            )


# -- Stable Audio Open (Oobleck) ----------------------------------------------------------------------------
def _sao_tensors(path: str) -> dict[str, Tensor]:
    try:
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            for prefix in SAO_PREFIXES:
                chosen = [k for k in keys if k.startswith(prefix)]
                if chosen:
                    return {k[len(prefix) :]: f.get_tensor(k) for k in chosen}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as a safetensors file: {exc}") from exc
    raise CheckpointError(
        f"{path} has no tensors under {' or '.join(SAO_PREFIXES)}; is it a Stable Audio Open model.safetensors?"
    )


def _sao_json(path: str) -> dict[str, Any] | None:
    beside = Path(path).with_name("model_config.json")
    if not beside.is_file():
        return None
    try:
        data = json.loads(beside.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {beside}: {exc}") from exc
    return data if isinstance(data, dict) else None


# OobleckDecoder's own defaults: a config that leaves a key out means these, not Stable Audio Open's values.
_OOBLECK_DEFAULTS: dict[str, Any] = {"out_channels": 2, "channels": 128, "latent_dim": 32, "c_mults": [1, 2, 4, 8],
                                     "strides": [2, 4, 8, 8], "use_snake": False, "final_tanh": True}  # fmt: skip


def _oobleck_from_json(source: str, model_config: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
    """Decoder config and pretransform scale from a diffusion model's or an autoencoder's model_config.json."""
    model = model_config.get("model", {})
    pre = model.get("pretransform") or {}
    ae = pre.get("config", {}) if pre else model  # an autoencoder config holds encoder/decoder directly
    decoder = ae.get("decoder", {})
    if decoder.get("type", "oobleck") != "oobleck":
        raise CheckpointError(f"{source}: decoder type {decoder.get('type')!r} is not 'oobleck'")
    cfg = {**_OOBLECK_DEFAULTS, **decoder.get("config", {})}
    unsupported = {k: cfg[k] for k in ("antialias_activation", "use_nearest_upsample") if cfg.get(k)}
    if not cfg["use_snake"] or unsupported:
        raise CheckpointError(
            f"{source}: streamdec implements the Oobleck decoder with use_snake=true and transposed-conv "
            f"upsampling only; this one has use_snake={cfg['use_snake']} {unsupported}"
        )
    out = {k: cfg[k] for k in ("latent_dim", "channels", "c_mults", "strides", "out_channels", "final_tanh")}
    out["sample_rate"] = int(model_config.get("sample_rate", 44100))
    return out, float(pre.get("scale", 1.0))


def _oobleck_from_shapes(source: str, state: Mapping[str, Tensor]) -> dict[str, Any]:
    blocks = _blocks(state, r"layers\.(\d+)\.layers\.1\.weight")
    if not blocks:
        raise CheckpointError(f"{source}: found no Oobleck decoder blocks (layers.N.layers.1.weight)")
    post = _weight(state, f"layers.{blocks[-1] + 2}.weight", source)
    channels = int(post.shape[1])
    ups = [state[f"layers.{i}.layers.1.weight"] for i in blocks]  # ConvTranspose1d [cin, cout, 2s]
    return {
        "latent_dim": int(_weight(state, "layers.0.weight", source).shape[1]),
        "channels": channels,
        "c_mults": [int(w.shape[0]) // channels for w in reversed(ups)],
        "strides": [int(w.shape[2]) // 2 for w in reversed(ups)],
        "out_channels": int(post.shape[0]),
        "final_tanh": False,
        "sample_rate": 44100,
    }


def read_stable_audio(path: str | os.PathLike[str], *, name: str | None = None) -> Codec:
    """The Oobleck decoder of a Stable Audio Open ``model.safetensors`` (see the module docstring)."""
    path = os.fspath(path)
    state = fold_weight_norm(_sao_tensors(path))
    model_config = _sao_json(path)
    scale = 1.0
    if model_config is not None:
        config, scale = _oobleck_from_json(path, model_config)
    else:
        config = _oobleck_from_shapes(path, state)
    codec = _build("oobleck", name or Path(path).parent.name or "oobleck", config, path)
    load_into(codec, state, path, "Oobleck decoder")
    # AutoencoderPretransform.decode multiplies latents by `scale`: denormalize does the same.
    codec.global_mean.zero_()
    codec.global_log_std.fill_(scale * scale)
    return codec


# -- BigVGAN ---------------------------------------------------------------------------------------------------
def _bigvgan_paths(path: str, config: str | None) -> tuple[str, str]:
    if os.path.isdir(path):
        path = os.path.join(path, "bigvgan_generator.pt")
    config = config or os.path.join(os.path.dirname(path), "config.json")
    for p in (path, config):
        if not os.path.isfile(p):
            raise CheckpointError(f"BigVGAN needs {os.path.basename(p)}: {p} does not exist")
    return path, config


def _check_filters(path: str, state: dict[str, Tensor]) -> dict[str, Tensor]:
    ours = kaiser_sinc_filter().float()
    for key in [k for k in state if k.endswith(".filter")]:
        taps = state.pop(key).reshape(-1).float()
        if taps.numel() != FILTER_TAPS or not torch.allclose(taps, ours, atol=1e-6, rtol=0):
            raise CheckpointError(
                f"{path}: {key} is not the 12-tap Kaiser-sinc filter (cutoff 0.25, half-width 0.3) "
                f"streamdec implements; got {taps.numel()} taps"
            )
    return state


def read_bigvgan(path: str | os.PathLike[str], *, config: str | os.PathLike[str] | None = None,
                 name: str | None = None) -> Codec:  # fmt: skip
    """A BigVGAN generator from ``bigvgan_generator.pt`` + ``config.json`` (or their directory)."""
    weights, config_path = _bigvgan_paths(os.fspath(path), None if config is None else os.fspath(config))
    return _bigvgan_from_data(weights, _torch_load(weights), config_path, name)


def _bigvgan_from_data(weights: str, data: Any, config_path: str, name: str | None) -> Codec:
    try:
        hparams = json.loads(Path(config_path).read_text())
        cfg = BigVGANConfig.from_dict(hparams, ignore_unknown=True)
    except (OSError, json.JSONDecodeError, CodecError) as exc:
        raise CheckpointError(f"cannot use {config_path} as a BigVGAN config: {exc}") from exc
    if not (isinstance(data, dict) and isinstance(data.get("generator"), dict)):
        raise CheckpointError(
            f"{weights} is not a BigVGAN generator checkpoint: expected a dict with 'generator'"
        )
    state = _check_filters(weights, fold_weight_norm(dict(data["generator"])))
    default_name = Path(weights).parent.name or "bigvgan"
    codec = _build("bigvgan", name or default_name, cfg.to_dict(), weights)
    return load_into(codec, state, weights, "BigVGAN generator")


# -- dispatch ------------------------------------------------------------------------------------------------
def _safetensors_kind(path: str) -> str:
    try:
        with safe_open(path, framework="pt") as f:
            if "streamdec.family" in (f.metadata() or {}):
                return "streamdec"
            keys = list(f.keys())
    except (SafetensorError, OSError, ValueError):
        return "streamdec"  # let the native reader report the error
    return "stable-audio" if any(k.startswith(SAO_PREFIXES) for k in keys) else "streamdec"


def is_foreign(path: str | os.PathLike[str]) -> bool:
    """True for a file or directory one of the readers here handles (not a ``save_codec`` file)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return True
    if p.endswith(".safetensors"):
        return _safetensors_kind(p) != "streamdec"
    return os.path.isfile(p) and p.endswith((".pt", ".pth", ".ckpt", ".bin", ".onnx"))


def read_foreign(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    sample_rate: int | None = None,
    config: str | os.PathLike[str] | None = None,
) -> Codec:
    """Read a DAC, Stable Audio Open or BigVGAN checkpoint, recognised by file type and content.

    ``name`` names the codec (default: from the path); ``sample_rate`` overrides a DAC file's metadata;
    ``config`` is a BigVGAN ``config.json`` elsewhere than beside the weights.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        if os.path.isfile(os.path.join(p, "bigvgan_generator.pt")):
            return read_bigvgan(p, config=config, name=name)
        if os.path.isfile(os.path.join(p, "model.safetensors")):
            return read_stable_audio(os.path.join(p, "model.safetensors"), name=name)
        raise CheckpointError(f"{p} holds neither bigvgan_generator.pt nor model.safetensors")
    if p.endswith(".safetensors"):
        return read_stable_audio(p, name=name)
    if p.endswith(".onnx"):
        return read_piper_onnx(p, name=name)
    data = _torch_load(p)
    if isinstance(data, dict) and "generator" in data:
        weights, config_path = _bigvgan_paths(p, None if config is None else os.fspath(config))
        return _bigvgan_from_data(weights, data, config_path, name)
    if isinstance(data, dict) and "state_dict" in data:
        return _dac_from_data(p, data, name=name, sample_rate=sample_rate)
    found = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
    raise CheckpointError(
        f"{p} is neither a DAC checkpoint ('state_dict' + 'metadata') nor a BigVGAN generator ('generator'); "
        f"found {found}"
    )
