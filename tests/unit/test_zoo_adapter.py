"""Bring-your-own-decoder: measured context, its margin, and streaming through a wrapped module."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import streamdec
from streamdec.codecs.adapter import ModuleCodec, measure_context, with_margin
from streamdec.errors import CodecError, ShapeError

torch.set_num_threads(2)
HOP = 16


class ToyDecoder(nn.Module):
    """Frame-rate conv k5 (2 frames each side), repeat to samples, sample-rate conv k3: context (3, 3)."""

    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.frame_conv = nn.Conv1d(dim, 3, 5, padding=2)
        self.sample_conv = nn.Conv1d(3, 1, 3, padding=1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))

    def forward(self, x: Tensor) -> Tensor:  # [B, dim, T] -> [B, 1, T*HOP]
        return self.sample_conv(torch.tanh(self.frame_conv(x)).repeat_interleave(HOP, dim=-1))


class RunningSum(nn.Module):
    """Every output depends on every earlier frame: no finite context."""

    def forward(self, x: Tensor) -> Tensor:
        return x.sum(dim=1, keepdim=True).cumsum(-1).repeat_interleave(HOP, dim=-1)


def test_measures_a_known_context_exactly() -> None:
    """The toy decoder's context is (3, 3): k5 at the frame rate plus one sample of k3 past each frame."""
    toy = ToyDecoder().double()
    assert measure_context(toy, 4, HOP) == (3, 3)


def test_margin_is_added_on_both_sides() -> None:
    """Without an explicit context the codec uses the measured one plus max(2, 25 %) per side."""
    codec = ModuleCodec(ToyDecoder(), latent_dim=4, hop_size=HOP, sample_rate=16000)
    assert codec.measured == (3, 3)
    assert codec.context_frames() == with_margin((3, 3)) == (5, 5)
    assert with_margin((52, 7)) == (65, 9)


# Measured (threshold 1e-13 of the peak, 2 trials) vs exact: equal where no alias-free filter sits on the
# path; BigVGAN and AuK have outer paths through many 2e-3 filter tails, far below float64 round-off.
MEASURED = {"dac-tiny": (10, 10), "oobleck-tiny": (10, 10), "bigvgan-tiny": (25, 25), "tiny": (42, 4)}


@pytest.mark.parametrize("preset", ["dac-tiny", "oobleck-tiny", "bigvgan-tiny"])
def test_measured_context_is_a_lower_bound(preset: str) -> None:
    """On the zoo's tiny decoders the measurement never exceeds the exact context (and is stable)."""
    codec = streamdec.load_codec(preset, dtype=torch.float64)
    measured = measure_context(codec.synthesize, codec.latent_dim, codec.hop_size, trials=2)
    exact = codec.context_frames()
    assert measured == MEASURED[preset]
    assert measured[0] <= exact[0] and measured[1] <= exact[1]


@pytest.mark.parametrize("preset", ["bigvgan-tiny", "tiny"])
def test_measured_context_streams_within_tolerance_even_without_margin(preset: str) -> None:
    """Where measured < exact, windows sized by the measurement alone still match offline within 1e-5."""
    inner = streamdec.load_codec(preset)
    codec = ModuleCodec(inner, decode=lambda m, x: m.synthesize(x), latent_dim=inner.latent_dim,
                        hop_size=inner.hop_size, sample_rate=inner.sample_rate, margin=lambda n: 0)  # fmt: skip
    assert codec.context_frames() == MEASURED[preset] != inner.context_frames()
    latents = torch.randn(1, 24, inner.latent_dim, generator=torch.Generator().manual_seed(2))
    latents = inner.denormalize(latents)  # the wrapper does not normalise: feed it raw latents

    async def run() -> Tensor:
        async with streamdec.StreamDecoder(codec, min_emit=4, max_emit=8) as dec:
            return await dec.decode(latents[0])

    torch.testing.assert_close(
        asyncio.run(run()), inner.synthesize(latents.transpose(1, 2))[0], atol=1e-5, rtol=0
    )


def test_unbounded_influence_is_an_error() -> None:
    """A decoder whose influence reaches past the largest probe clip raises CodecError with the fix."""
    with pytest.raises(CodecError, match=r"context=\(left, right\)"):
        measure_context(RunningSum(), 2, HOP, max_frames=64, trials=1)


def test_wrong_output_length_is_a_shape_error() -> None:
    """A module that does not return T*hop samples is refused with the shapes in the message."""

    def short(x: Tensor) -> Tensor:
        return F.pad(x[:, :1], (0, 0)).repeat_interleave(HOP - 1, dim=-1)

    with pytest.raises(ShapeError, match=r"frames x hop_size"):
        measure_context(short, 2, HOP)
    codec = ModuleCodec(nn.Identity(), latent_dim=2, hop_size=HOP, sample_rate=8000, context=(0, 0))
    with pytest.raises(ShapeError, match=r"expected \(1, 1, 48\)"):
        codec.decode(torch.zeros(1, 3, 2))


def test_wrapped_module_streams_exactly() -> None:
    """A ModuleCodec streams through StreamDecoder and equals its own whole-clip decode."""
    codec = ModuleCodec(ToyDecoder(), latent_dim=4, hop_size=HOP, sample_rate=16000, name="toy")
    latents = torch.randn(40, 4, generator=torch.Generator().manual_seed(1))
    reference = codec.decode(latents[None])[0]

    async def run() -> Tensor:
        async with streamdec.StreamDecoder(codec, min_emit=2, max_emit=8) as dec:
            chunks = [latents[i : i + 3] for i in range(0, 40, 3)]
            return torch.cat([t.samples async for t in dec.decode_tiles(chunks)], dim=-1)

    torch.testing.assert_close(asyncio.run(run()), reference, atol=1e-5, rtol=0)


def test_adapter_cannot_be_rebuilt_from_config() -> None:
    """from_config and init_random explain that a wrapped module keeps its own weights."""
    with pytest.raises(CodecError, match="wrap the module again"):
        ModuleCodec.from_config("x", {})
    codec = ModuleCodec(ToyDecoder(), latent_dim=4, hop_size=HOP, sample_rate=16000, context=(3, 3))
    assert codec.measured is None and codec.context_frames() == (3, 3)
    with pytest.raises(CodecError, match="own weights"):
        codec.init_random(0)


def test_info_says_a_wrapped_module_keeps_no_stream_state() -> None:
    """A bring-your-own decoder streams in halo windows only: `streamdec info` says so instead of a size."""
    from streamdec.cli import _stream_state

    codec = ModuleCodec(ToyDecoder(), latent_dim=4, hop_size=HOP, sample_rate=16000)
    assert _stream_state(codec) == "none: this decoder streams in halo windows only"
