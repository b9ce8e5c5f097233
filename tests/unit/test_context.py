"""Exact latent context: layer intervals match the real tensor ops, and frame context is exact both ways."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
from torch import Tensor, nn

from streamdec.codecs import Codec, load_codec
from streamdec.codecs.auk import AMPBlock
from streamdec.codecs.geometry import conv_interval, conv_transpose_interval, hull, through
from streamdec.codecs.layers import AliasFreeActivation, CausalConvTranspose1d, PaddedConv1d, refresh_caches
from support.probes import flat_convs, flat_filters, random_weights, reads

torch.set_num_threads(2)
M = TypeVar("M", bound=nn.Module)


def _support_model(codec: M) -> M:
    """The codec with non-negative weights and identity SnakeBeta: linear, no cancellation possible.

    Output sample ``o`` of its impulse response is then non-zero iff some path of non-zero taps joins
    the impulse to ``o``, which is the support that interval propagation claims to compute.
    """
    with torch.no_grad():
        flat_convs(codec)
        for m in codec.modules():
            if isinstance(m, AliasFreeActivation):
                m.act.beta.fill_(1e4)  # 1 / (exp(1e4) + eps) == 0: SnakeBeta becomes the identity
        refresh_caches(codec)
        flat_filters(codec)  # same 12-tap support, all taps positive
    return codec


def _layer_cases() -> dict[str, Callable[[], nn.Module]]:
    return {
        "causal-conv-k3-d1": lambda: PaddedConv1d.causal(2, 2, 3),
        "causal-conv-k7-d5": lambda: PaddedConv1d.causal(2, 2, 7, dilation=5),
        "centred-conv-k7": lambda: PaddedConv1d.centred(2, 2, 7),
        "conv-transpose-r5": lambda: CausalConvTranspose1d(2, 2, 10, 5),
        "conv-transpose-r2": lambda: CausalConvTranspose1d(2, 2, 4, 2),
        "alias-free-act": lambda: AliasFreeActivation(2),
        "amp-block-k3": lambda: AMPBlock(2, 3, (1, 3, 5)),
    }


def _upsampling(module: nn.Module) -> int:
    return module.stride[0] if isinstance(module, CausalConvTranspose1d) else 1


def _check_interior(module: nn.Module, read: dict[int, set[int]], length: int) -> None:
    out_len = length * _upsampling(module)
    for o in range(out_len // 2 - 10, out_len // 2 + 10):
        lo, hi = module.input_interval(o, o)  # type: ignore[operator]
        assert (min(read[o]), max(read[o])) == (lo, hi), f"output {o}"


LENGTH = 200  # the AMP block reads 72 samples back: keep the tested outputs well inside


@pytest.mark.parametrize("make", list(_layer_cases().values()), ids=list(_layer_cases()))
def test_layer_interval_is_exact_with_support_weights(make: Callable[[], nn.Module]) -> None:
    """input_interval is exactly the hull of the inputs that reach an output (non-negative weights)."""
    module = _support_model(make().double())
    x = torch.zeros(1, 2, LENGTH, dtype=torch.float64)
    _check_interior(module, reads(module, x), LENGTH)


@pytest.mark.parametrize("make", list(_layer_cases().values())[:-1], ids=list(_layer_cases())[:-1])
def test_primitive_layer_interval_is_exact_with_random_weights(make: Callable[[], nn.Module]) -> None:
    """For one primitive layer even random weights and the real filter reach the interval's ends."""
    module = random_weights(make())
    x = torch.randn(1, 2, LENGTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    _check_interior(module, reads(module, x), LENGTH)


def test_interval_helpers_compose_ranges() -> None:
    """A range's interval is the hull of its members' intervals, and chains compose backwards."""
    conv = PaddedConv1d.causal(1, 1, 5, dilation=2)
    up = CausalConvTranspose1d(1, 1, 6, 3)
    assert conv_interval(4, 9, kernel=5, dilation=2, pad_left=8) == conv.input_interval(4, 9) == (-4, 9)
    assert up.input_interval(6, 8) == conv_transpose_interval(6, 8, kernel=6, stride=3) == (1, 2)
    assert hull(up.input_interval(o, o) for o in range(3, 12)) == up.input_interval(3, 11)
    assert through([up, conv], 10, 10) == up.input_interval(*conv.input_interval(10, 10))


def _frames_moved(codec: Codec, base: Tensor, bumped: Tensor) -> Tensor:
    """Per output frame, the largest absolute change of the pre-clamp signal ([T]); one batched decode."""
    with torch.inference_mode():
        a, b = codec.synthesize(torch.cat([base, bumped]), clamp=False)  # type: ignore[call-arg]
    return (a - b).abs().reshape(base.shape[-1], codec.hop_size).amax(dim=1)


def _clip(codec: Codec) -> tuple[int, int, int]:
    """``(left, right, frames)``: the shortest clip in which frame ``right + 1`` can be tested both ways."""
    left, right = codec.context_frames()
    frames = left + right + 3  # room for one silent frame beyond each extreme
    return left, right, frames


# auk-24k in float64 takes about 25 s per 62-frame decode on 2 idle cores (several times that when
# the machine is busy), hence `slow` and a timeout above the suite's 300 s.
PRESET_PARAMS = [
    pytest.param("tiny", id="tiny"),
    pytest.param("auk-24k", id="auk-24k", marks=[pytest.mark.slow, pytest.mark.timeout(900)]),
]


@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_context_is_exact_support_of_the_decoder(preset: str) -> None:
    """Latent frame f reaches output frames f-right .. f+left and no others (float64, support model)."""
    codec = _support_model(load_codec(preset, dtype=torch.float64))
    left, right, frames = _clip(codec)
    f = right + 1
    impulse = torch.zeros(1, codec.latent_dim, frames, dtype=torch.float64)
    impulse[0, :, f] = 1.0
    with torch.inference_mode():  # zero input gives zero output (no biases), so one decode suffices
        response = codec.synthesize(impulse, clamp=False)  # type: ignore[call-arg]
    moved = response.abs().reshape(frames, codec.hop_size).amax(dim=1)
    changed = (moved > 0).nonzero().flatten().tolist()
    assert changed == list(range(f - right, f + left + 1))
    assert moved[f - right - 1] == 0 and moved[f + left + 1] == 0


@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_random_weights_never_reach_beyond_the_context(preset: str) -> None:
    """With the preset's random weights, a big latent bump changes nothing outside f-right .. f+left."""
    codec = load_codec(preset, dtype=torch.float64)
    left, right, frames = _clip(codec)
    f = right + 1
    gen = torch.Generator().manual_seed(7)
    base = codec.denormalize(torch.randn(1, frames, codec.latent_dim, generator=gen, dtype=torch.float64))
    base = base.transpose(1, 2).contiguous()
    bumped = base.clone()
    bumped[0, :, f] += 4.0
    moved = _frames_moved(codec, base, bumped)
    outside = torch.cat([moved[: f - right], moved[f + left + 1 :]])
    assert torch.all(outside == 0)
    # Nearby frames react strongly; the outermost ones only through taps whose products underflow
    # float64 (see docs in streamdec/codecs/geometry.py), which the support-model test covers.
    assert torch.all(moved[f - 1 : f + 4] > 1e-3)


def test_both_presets_share_the_geometry() -> None:
    """Context depends on layer geometry only, so tiny and auk-24k agree, and it is causal-heavy."""
    tiny = load_codec("tiny").context_frames()
    assert tiny == load_codec("auk-24k").context_frames()
    left, right = tiny
    assert left > right > 0
