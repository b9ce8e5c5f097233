"""Checkpoint I/O: round trips, weight-norm folding, and errors that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamdec.codecs import Codec, load_codec, save_codec
from streamdec.codecs.checkpoint import fold_weight_norm
from streamdec.errors import CheckpointError, CodecError

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def tiny() -> Codec:
    return load_codec("tiny")


@pytest.fixture
def saved(tiny: Codec, tmp_path: Path) -> Path:
    path = tmp_path / "tiny.safetensors"
    save_codec(tiny, path)
    return path


def _rewrite(src: Path, dst: Path, tensors: dict[str, torch.Tensor] | None = None, **meta: str) -> Path:
    """Copy a checkpoint with replaced tensors and metadata entries (an empty value deletes one)."""
    from safetensors import safe_open

    with safe_open(str(src), framework="pt") as f:
        metadata = dict(f.metadata())
    metadata.update(meta)
    metadata = {k: v for k, v in metadata.items() if v}
    save_file(load_file(str(src)) if tensors is None else tensors, str(dst), metadata=metadata)
    return dst


def _latents(frames: int = 6) -> torch.Tensor:
    return torch.randn(1, frames, 64, generator=torch.Generator().manual_seed(5))


def test_round_trip_decodes_bit_identically(tiny: Codec, saved: Path) -> None:
    """load_codec(save_codec(c)) keeps name, config, context and decodes bit-identically."""
    loaded = load_codec(saved)
    assert loaded.name == "tiny" and loaded.config_dict() == tiny.config_dict()
    assert loaded.context_frames() == tiny.context_frames()
    assert torch.equal(loaded.decode(_latents()), tiny.decode(_latents()))


def test_round_trip_float64(tmp_path: Path) -> None:
    """A float64 codec saved and loaded as float64 decodes bit-identically."""
    codec = load_codec("tiny", dtype=torch.float64)
    save_codec(codec, tmp_path / "t64.safetensors")
    loaded = load_codec(str(tmp_path / "t64.safetensors"), dtype=torch.float64)
    assert torch.equal(loaded.decode(_latents()), codec.decode(_latents()))


def _weight_norm_pair(weight: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, v) such that torch's weight norm with dim=0 gives back ``weight`` (v deliberately rescaled)."""
    scale = torch.rand(weight.shape[0], *([1] * (weight.dim() - 1)), generator=gen) + 0.5
    v = weight * scale
    g = weight.flatten(1).norm(dim=1).view(-1, *([1] * (weight.dim() - 1)))
    return g, v


@pytest.mark.parametrize("style", ["old", "parametrizations"])
def test_weight_norm_files_are_folded(tiny: Codec, saved: Path, tmp_path: Path, style: str) -> None:
    """A file storing (g, v) pairs loads to the same weights, transposed convs included."""
    gen = torch.Generator().manual_seed(0)
    tensors = load_file(str(saved))
    for key in [k for k in tensors if k.endswith(".weight")]:
        g, v = _weight_norm_pair(tensors.pop(key), gen)
        prefix = key[: -len("weight")]
        names = (
            ("weight_g", "weight_v")
            if style == "old"
            else ("parametrizations.weight.original0", "parametrizations.weight.original1")
        )
        tensors[prefix + names[0]], tensors[prefix + names[1]] = g, v
    assert "stages.0.up.weight" not in tensors  # the transposed conv is stored as (g, v) too
    loaded = load_codec(_rewrite(saved, tmp_path / "wn.safetensors", tensors))
    expected, got = tiny.state_dict(), loaded.state_dict()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_fold_matches_torch_weight_norm() -> None:
    """Folding agrees with torch's own weight norm (dim 0) for a ConvTranspose1d-shaped weight."""
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(8, 4, 10, generator=gen)
    g = torch.rand(8, 1, 1, generator=gen) + 0.1
    folded = fold_weight_norm({"up.weight_g": g, "up.weight_v": v})
    assert set(folded) == {"up.weight"}
    torch.testing.assert_close(folded["up.weight"], torch._weight_norm(v, g, 0))


def test_weight_g_without_v_is_an_error() -> None:
    """A lone weight_g names its missing partner."""
    with pytest.raises(CheckpointError, match=r"conv\.weight_v"):
        fold_weight_norm({"conv.weight_g": torch.ones(2, 1, 1)})


def test_missing_and_unexpected_keys_are_named(saved: Path, tmp_path: Path) -> None:
    """Missing and unexpected tensors are listed by name."""
    tensors = load_file(str(saved))
    tensors.pop("conv_pre.bias")
    tensors["extra.thing"] = torch.zeros(3)
    with pytest.raises(
        CheckpointError, match=r"missing keys \[conv_pre\.bias\].*unexpected keys \[extra\.thing\]"
    ):
        load_codec(_rewrite(saved, tmp_path / "bad.safetensors", tensors))


def test_shape_mismatch_is_named(saved: Path, tmp_path: Path) -> None:
    """A mis-shaped tensor is named with both shapes."""
    tensors = load_file(str(saved))
    tensors["conv_post.weight"] = torch.zeros(1, 3, 7)
    with pytest.raises(
        CheckpointError,
        match=r"shape mismatches \[conv_post\.weight: file \(1, 3, 7\) vs codec \(1, 2, 7\)\]",
    ):
        load_codec(_rewrite(saved, tmp_path / "bad.safetensors", tensors))


@pytest.mark.parametrize(
    ("meta", "pattern"),
    [
        ({"streamdec.family": ""}, r"lacks metadata \['streamdec.family'\]"),
        ({"streamdec.family": "dac9"}, r"unknown codec family 'dac9'.*auk"),
        ({"streamdec.config": "{not json"}, r"malformed streamdec.config"),
        ({"streamdec.config": json.dumps({"channels": [8, 4]})}, r"cannot be built.*one more width"),
        ({"streamdec.config": json.dumps({"colour": 3})}, r"unknown keys \['colour'\]"),
    ],
    ids=["no-family", "unknown-family", "bad-json", "bad-geometry", "unknown-key"],
)
def test_bad_metadata_is_a_checkpoint_error(
    saved: Path, tmp_path: Path, meta: dict[str, str], pattern: str
) -> None:
    """Metadata that cannot describe a codec raises CheckpointError explaining why."""
    with pytest.raises(CheckpointError, match=pattern):
        load_codec(_rewrite(saved, tmp_path / "bad.safetensors", **meta))


def test_garbage_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    """A file that is not safetensors raises CheckpointError, chained to the parser's error."""
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="cannot read") as info:
        load_codec(path)
    assert info.value.__cause__ is not None


def test_missing_file_is_a_codec_error(tmp_path: Path) -> None:
    """A path that does not exist is reported like an unknown preset."""
    with pytest.raises(CodecError, match="neither a preset nor an existing file"):
        load_codec(tmp_path / "absent.safetensors")
