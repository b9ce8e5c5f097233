"""Model zoo (DAC, Oobleck, BigVGAN v2): presets, shapes, layer geometry and exact latent context.

Exactness follows tests/test_context.py: *tightness* with non-negative weights and identity Snakes (a linear
network without cancellation, whose impulse response is non-zero exactly on the support) and *soundness*
with random weights (a bump never reaches beyond the context). Both run on small "twins" whose geometry is
identical to the published configurations, which is asserted too, so the figures in docs/zoo.md are proven
for the full-size models without decoding them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from streamdec.codecs import PRESETS, Codec, load_codec
from streamdec.codecs.bigvgan import BIGVGAN_44K, BIGVGAN_TINY, AMPBlock, BigVGANConfig
from streamdec.codecs.dac import DAC_TINY, DACConfig
from streamdec.codecs.dac import ResidualUnit as DACResidual
from streamdec.codecs.layers import (
    AliasFreeActivation,
    PaddedConvTranspose1d,
    Snake,
    SnakeBeta,
    refresh_caches,
    routing,
)
from streamdec.codecs.oobleck import OOBLECK_TINY
from streamdec.codecs.registry import build_codec, family_class, finalize
from support.probes import flat_convs, flat_filters, random_weights, reads

torch.set_num_threads(2)

# The published figures, proven below. Keys: the presets sharing one geometry.
EXACT_CONTEXT: dict[tuple[str, ...], tuple[int, int]] = {
    ("dac-44k",): (10, 10),
    ("dac-24k", "dac-16k"): (10, 10),
    ("oobleck-44k",): (10, 10),
    ("bigvgan-24k", "bigvgan-22k", "bigvgan-44k-256x"): (38, 38),
    ("bigvgan-44k",): (21, 21),
}

# A small twin per geometry: (family, config) with the full models' strides, kernels and dilations.
TWINS: dict[str, tuple[str, Mapping[str, Any]]] = {
    "dac-44k": ("dac", DAC_TINY.to_dict()),
    "dac-24k": (
        "dac",
        DACConfig(latent_dim=16, decoder_dim=32, decoder_rates=(8, 5, 4, 2), sample_rate=24000).to_dict(),
    ),
    "oobleck-44k": ("oobleck", OOBLECK_TINY.to_dict()),
    "bigvgan-24k": ("bigvgan", BIGVGAN_TINY.to_dict()),
    "bigvgan-44k": (
        "bigvgan",
        BigVGANConfig(**{**BIGVGAN_44K.to_dict(), "num_mels": 8, "upsample_initial_channel": 64}).to_dict(),
    ),
}


def _twin(name: str, dtype: torch.dtype = torch.float64) -> Codec:
    family, config = TWINS[name]
    codec = build_codec(family, f"{name}-twin", config)
    codec.init_random(0)
    return finalize(codec, "cpu", dtype)


@functools.cache
def _meta_context(preset: str) -> tuple[int, int]:
    """A full preset's context from its layers alone (built on the meta device: no weights, instant)."""
    spec = PRESETS[preset]
    with torch.device("meta"):
        codec = family_class(spec.family).from_config(preset, spec.config)
    return codec.context_frames()


def _twin_params() -> list[Any]:
    return [pytest.param(n, id=n) for n in TWINS]


# -- presets ----------------------------------------------------------------------------------------
PUBLISHED = {  # preset: (latent_dim, hop, sample_rate, channels, parameters in millions, tolerance)
    "dac-44k": (1024, 512, 44100, 1, 54.1),
    "dac-24k": (1024, 320, 24000, 1, 52.3),
    "dac-16k": (1024, 320, 16000, 1, 52.3),
    "oobleck-44k": (64, 2048, 44100, 2, 78.1),
    "bigvgan-24k": (100, 256, 24000, 1, 112.4),
    "bigvgan-22k": (80, 256, 22050, 1, 112.2),
    "bigvgan-44k-256x": (128, 256, 44100, 1, 112.7),
    "bigvgan-44k": (128, 512, 44100, 1, 122.2),
}


@pytest.mark.parametrize("preset", list(PUBLISHED), ids=list(PUBLISHED))
def test_full_preset_geometry_and_size(preset: str) -> None:
    """Each full preset has its published latent rate, audio format and parameter count (meta build)."""
    spec = PRESETS[preset]
    with torch.device("meta"):
        codec = family_class(spec.family).from_config(preset, spec.config)
    latent_dim, hop, rate, channels, millions = PUBLISHED[preset]
    assert (codec.latent_dim, codec.hop_size, codec.sample_rate, codec.channels) == (
        latent_dim,
        hop,
        rate,
        channels,
    )
    assert abs(sum(p.numel() for p in codec.parameters()) / 1e6 - millions) < 0.05


@pytest.mark.parametrize("preset", ["dac-tiny", "oobleck-tiny", "bigvgan-tiny"])
@pytest.mark.parametrize("frames", [1, 5])
def test_tiny_presets_decode_finite_audio_of_frames_times_hop(preset: str, frames: int) -> None:
    """A tiny preset decodes T frames to [B, channels, T*hop] float32, finite, not silent, deterministic."""
    codec = load_codec(preset)
    z = torch.randn(2, frames, codec.latent_dim, generator=torch.Generator().manual_seed(0))
    audio = codec.decode(z)
    assert audio.shape == (2, codec.channels, frames * codec.hop_size) and audio.dtype == torch.float32
    assert torch.isfinite(audio).all() and audio.std() > 1e-3
    assert torch.equal(audio, load_codec(preset).decode(z))


def test_dac_odd_strides_pad_the_reference_length_with_zeros() -> None:
    """DAC's odd strides lose 8 samples per clip (T*hop - 8); synthesize appends exactly that many zeros."""
    codec = _twin("dac-24k", torch.float32)
    x = torch.randn(1, 16, 3)
    with torch.inference_mode():
        raw = codec.model(x)  # type: ignore[operator]
        out = codec.synthesize(x)
    assert raw.shape[-1] == 3 * 320 - 8 and out.shape[-1] == 3 * 320
    assert torch.equal(out[..., : raw.shape[-1]], raw) and torch.all(out[..., raw.shape[-1] :] == 0)


# -- layer geometry ----------------------------------------------------------------------------------
def _random_(module: nn.Module, seed: int = 0) -> nn.Module:
    return random_weights(module, seed, positive_alpha=True)  # keep linear Snake away from 0


def _support_(module: nn.Module) -> nn.Module:
    """Non-negative conv weights, no biases, identity Snakes, all-positive filters: a linear support probe."""
    module = module.double()
    with torch.no_grad():
        flat_convs(module)
        refresh_caches(module)
        for m in module.modules():
            if isinstance(m, SnakeBeta):  # Snake included: frequency 0 makes sin(0 * x) = 0, the identity
                m.alpha_exp.zero_()
                m.beta_inv.zero_()
        flat_filters(module)
    return module


LAYERS: dict[str, tuple[Callable[[], nn.Module], int]] = {  # name: (factory, upsampling factor)
    "snake": (lambda: Snake(2), 1),
    "snakebeta-linear": (lambda: SnakeBeta(2, log_scale=False), 1),
    "conv-transpose-r8-p4": (lambda: PaddedConvTranspose1d(2, 2, 16, 8, 4), 8),
    "conv-transpose-r5-p3-odd": (lambda: PaddedConvTranspose1d(2, 2, 10, 5, 3), 5),
    "conv-transpose-r4-k8-p2": (lambda: PaddedConvTranspose1d(2, 2, 8, 4, 2), 4),
    "alias-free-centred": (lambda: AliasFreeActivation(2, causal=False), 1),
    "alias-free-centred-snake": (lambda: AliasFreeActivation(2, causal=False, act=Snake(2)), 1),
    "dac-residual-d3": (lambda: DACResidual(2, 3), 1),
    "bigvgan-amp1-k7": (lambda: AMPBlock(2, 7, (1, 3, 5), BIGVGAN_TINY), 1),
    "bigvgan-amp2-k3": (lambda: AMPBlock(2, 3, (1, 3), BigVGANConfig(resblock="2")), 1),
}
LENGTH = 160


PRIMITIVES = [n for n in LAYERS if not n.startswith(("dac-", "bigvgan-"))]  # composites: support only


@pytest.mark.parametrize(
    ("name", "weights"),
    [(n, "support") for n in LAYERS] + [(n, "random") for n in PRIMITIVES],
    ids=[f"{n}-support" for n in LAYERS] + [f"{n}-random" for n in PRIMITIVES],
)
def test_layer_interval_is_exact(name: str, weights: str) -> None:
    """input_interval is exactly the hull of the inputs that reach an interior output."""
    make, up = LAYERS[name]
    module = _support_(make()) if weights == "support" else _random_(make())
    x = torch.randn(1, 2, LENGTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if weights == "support":
        x = x.abs()
    read = reads(module, x)
    for o in range(LENGTH * up // 2 - 12, LENGTH * up // 2 + 12):
        assert (min(read[o]), max(read[o])) == module.input_interval(o, o), f"output {o}"  # type: ignore[operator]


def test_centred_alias_free_reads_five_each_side() -> None:
    """BigVGAN's centred down filter makes an activation read t-5 .. t+5 (the causal one t-8 .. t+2)."""
    assert AliasFreeActivation(1, causal=False).input_interval(50, 50) == (45, 55)
    assert AliasFreeActivation(1).input_interval(50, 50) == (42, 52)


# -- exact context -------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", list(EXACT_CONTEXT), ids=["+".join(g) for g in EXACT_CONTEXT])
def test_published_figures_and_twin_geometry(group: tuple[str, ...]) -> None:
    """Each full preset's context is the published figure, and its twin shares it."""
    for preset in group:
        assert _meta_context(preset) == EXACT_CONTEXT[group], preset
    family, config = TWINS[group[0]]
    with torch.device("meta"):
        twin = family_class(family).from_config("twin", config)
    assert twin.context_frames() == EXACT_CONTEXT[group]


MARGIN = 3  # silent frames kept between the response and the clip edges (replicate padding stays idle)


def _clip(codec: Codec) -> tuple[int, int, int, int]:
    left, right = codec.context_frames()
    frames = left + right + 1 + 2 * (MARGIN + 1)
    return left, right, frames, right + 1 + MARGIN


def _synth(codec: Codec, x: Tensor) -> Tensor:
    with torch.inference_mode():
        if codec.family == "bigvgan":
            return codec.synthesize(x, clamp=False)  # type: ignore[call-arg]
        return codec.synthesize(x)


@pytest.mark.parametrize("twin", _twin_params())
def test_context_is_exact_support(twin: str) -> None:
    """Latent frame f reaches output frames f-right .. f+left and no others (float64, support model)."""
    codec = _support_(_twin(twin))
    left, right, frames, f = _clip(codec)  # type: ignore[arg-type]
    impulse = torch.zeros(1, codec.latent_dim, frames, dtype=torch.float64)
    impulse[0, :, f] = 1.0
    moved = _synth(codec, impulse).abs().reshape(codec.channels, frames, codec.hop_size).amax(dim=(0, 2))
    assert (moved > 0).nonzero().flatten().tolist() == list(range(f - right, f + left + 1))


@pytest.mark.parametrize("twin", _twin_params())
def test_random_weights_never_reach_beyond_the_context(twin: str) -> None:
    """With random weights a big latent bump changes nothing outside f-right .. f+left (float64)."""
    codec = _twin(twin)
    left, right, frames, f = _clip(codec)
    base = torch.randn(
        1, codec.latent_dim, frames, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    bumped = base.clone()
    bumped[0, :, f] += 4.0
    a, b = _synth(codec, torch.cat([base, bumped])).unbind(0)
    moved = (a - b).abs().reshape(codec.channels, frames, codec.hop_size).amax(dim=(0, 2))
    assert torch.all(moved[: f - right] == 0) and torch.all(moved[f + left + 1 :] == 0)
    assert torch.all(moved[f - 1 : f + 2] > 1e-6)


# -- the fused kernel for centred activations ----------------------------------------------------------
@pytest.mark.parametrize("length", [16, 17, 40, 131])
@pytest.mark.parametrize("snake", ["snakebeta", "snake"])
def test_centred_activation_through_the_causal_op_equals_reference(length: int, snake: str) -> None:
    """Shifted causal op + reference tail equals the centred reference path (op's CPU implementation)."""
    pytest.importorskip("streamdec.kernels.alias_free")
    act = AliasFreeActivation(3, causal=False, act=Snake(3) if snake == "snake" else None)
    _random_(act)
    act = act.float()
    refresh_caches(act)
    x = torch.randn(2, 3, length, generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        got, want = act._centred_from_causal(x), act.reference(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_centred_activation_dispatches_to_the_op_when_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel applies, a centred activation uses it (long inputs), else the reference path."""
    pytest.importorskip("streamdec.kernels.alias_free")
    calls: list[int] = []
    act = AliasFreeActivation(2, causal=False)
    _random_(act)
    act = act.float()
    refresh_caches(act)
    monkeypatch.setattr(routing, "fused_supported", lambda x: True)
    monkeypatch.setattr(
        AliasFreeActivation, "_fused", lambda self, x: calls.append(x.shape[-1]) or self.reference(x)
    )
    with torch.inference_mode():
        act(torch.randn(1, 2, 15))
        act(torch.randn(1, 2, 64))
    assert calls == [64]  # 15 samples are too few for the shifted form: reference path
