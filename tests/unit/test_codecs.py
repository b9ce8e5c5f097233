"""Codec surface: presets, shapes, dtypes, normalisation, random-weight statistics, input errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import streamdec.codecs as codecs
from streamdec.codecs import PRESETS, Codec, load_codec
from streamdec.codecs.layers import kaiser_sinc_filter
from streamdec.errors import CodecError, DTypeError, ShapeError

torch.set_num_threads(2)


@functools.cache
def _preset(name: str) -> Codec:
    """One shared instance per preset (building auk-24k takes a couple of seconds); tests don't mutate it."""
    return load_codec(name)


@pytest.fixture
def tiny() -> Codec:
    return _preset("tiny")


@pytest.fixture
def big() -> Codec:
    return _preset("auk-24k")


def _latents(frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, frames, 64, generator=torch.Generator().manual_seed(seed))


def test_public_surface() -> None:
    """The package exports the contract's names and both presets."""
    assert {"Codec", "load_codec", "save_codec", "PRESETS"} <= set(codecs.__all__)
    assert {"tiny", "auk-24k"} <= set(PRESETS)


@pytest.mark.parametrize("name", ["tiny", "auk-24k"])
def test_preset_geometry(name: str) -> None:
    """Both presets are 64-dim latents at 50 Hz into 24 kHz mono."""
    codec = _preset(name)
    assert (codec.name, codec.latent_dim, codec.hop_size, codec.sample_rate, codec.channels) == (
        name,
        64,
        480,
        24000,
        1,
    )
    assert isinstance(codec, Codec) and not codec.training


def test_unknown_name_lists_presets() -> None:
    """An unknown name raises CodecError naming it and every preset."""
    with pytest.raises(CodecError, match=r"'nope'.*auk-24k.*tiny"):
        load_codec("nope")


def test_full_preset_parameter_count(big: Codec) -> None:
    """auk-24k has the upstream decoder's size, about 114.5 M parameters."""
    count = sum(p.numel() for p in big.parameters())
    assert abs(count - 114.5e6) / 114.5e6 < 0.005


def test_presets_are_deterministic() -> None:
    """Two loads of a preset hold identical weights (seeded generator)."""
    a, b = load_codec("tiny").state_dict(), load_codec("tiny").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("frames", [1, 2, 3, 17])
def test_decode_length_is_frames_times_hop(tiny: Codec, frames: int) -> None:
    """T latent frames decode to exactly T * hop samples per channel, float32."""
    audio = tiny.decode(_latents(frames, batch=2))
    assert audio.shape == (2, 1, frames * 480) and audio.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_any_float_input_dtype(tiny: Codec, dtype: torch.dtype) -> None:
    """Latents of any float dtype are accepted and the result is float32."""
    assert tiny.decode(_latents(3).to(dtype)).dtype == torch.float32


def test_numpy_input_matches_tensor(tiny: Codec) -> None:
    """A numpy array decodes like the same tensor."""
    z = _latents(4)
    assert torch.equal(tiny.decode(z.numpy()), tiny.decode(z))


def test_float64_codec_returns_float32() -> None:
    """A float64 codec still returns float32 audio, close to the float32 codec's."""
    z = _latents(5)
    a64 = load_codec("tiny", dtype=torch.float64).decode(z)
    assert a64.dtype == torch.float32
    torch.testing.assert_close(a64, load_codec("tiny").decode(z), atol=1e-4, rtol=0)


def test_decode_runs_in_inference_mode(tiny: Codec) -> None:
    """decode returns an inference tensor (no autograd graph kept)."""
    assert tiny.decode(_latents(1)).is_inference()


@pytest.mark.parametrize("name", ["tiny", "auk-24k"])
def test_pad_latent_denormalizes_to_zero(name: str) -> None:
    """pad_latent is the normalised latent of raw zero, and normalisation is non-trivial."""
    codec = _preset(name)
    torch.testing.assert_close(codec.denormalize(codec.pad_latent), torch.zeros(64), atol=1e-6, rtol=0)
    assert codec.global_mean.abs().min() > 0 and not torch.allclose(codec.global_log_std, torch.ones(64))


@pytest.mark.parametrize("name", ["tiny", "auk-24k"])
def test_random_weights_sound_like_audio(name: str) -> None:
    """N(0,1) latents give std 0.05-0.5 and under 1 % of pre-clamp samples beyond +-1."""
    codec = _preset(name)
    z = codec.denormalize(_latents(16, batch=2, seed=3)).transpose(1, 2)
    with torch.inference_mode():
        raw = codec.synthesize(z, clamp=False)  # type: ignore[call-arg]
    assert 0.05 < float(raw.std()) < 0.5
    assert float((raw.abs() > 1).float().mean()) < 0.01


@pytest.mark.parametrize(
    ("latents", "error", "pattern"),
    [
        (torch.zeros(8, 64), ShapeError, r"rank 2.*latents\[None\]"),
        (torch.zeros(1, 8, 64, 1), ShapeError, r"rank 4"),
        (torch.zeros(1, 8, 32), ShapeError, r"latent_dim 32.*needs 64"),
        (torch.zeros(1, 0, 64), ShapeError, r"at least 1 .*frame"),
        (torch.zeros(1, 8, 64, dtype=torch.int64), DTypeError, r"torch.int64.*\.float\(\)"),
        (np.zeros((1, 8, 64), dtype=np.int32), DTypeError, r"torch.int32"),
        ([[0.0] * 64], DTypeError, r"type list"),
    ],
    ids=["rank2", "rank4", "latent-dim", "no-frames", "int64", "numpy-int", "list"],
)
def test_bad_input_raises_typed_error(
    tiny: Codec, latents: object, error: type[Exception], pattern: str
) -> None:
    """Wrong rank, latent_dim or dtype raise ShapeError/DTypeError with value and fix."""
    with pytest.raises(error, match=pattern):
        tiny.decode(latents)  # type: ignore[arg-type]


def test_kaiser_filter_facts() -> None:
    """The alias-free filter is 12 symmetric taps summing to 1, with its zero-crossing sign pattern."""
    filt = kaiser_sinc_filter()
    assert filt.shape == (12,) and filt.dtype == torch.float64
    torch.testing.assert_close(filt.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(filt, filt.flip(0))
    assert (filt[4:8] > 0).all() and (filt[2:4] < 0).all() and (filt[:2] > 0).all()


def test_clamp_bounds_decoded_audio(tiny: Codec) -> None:
    """Huge latents still decode into [-1, 1]."""
    audio = tiny.decode(_latents(4) * 100)
    assert float(audio.abs().max()) <= 1.0
