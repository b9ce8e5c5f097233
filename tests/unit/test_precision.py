"""The tf32x3 precision on the CPU: the split's algebra, an emulated TF32 tensor core, and the plumbing.

TF32 exists only on CUDA, so here a "tensor core" is emulated: operands rounded to TF32 (10-bit mantissa),
products and sums in float64. That is enough to show what the split buys (float32-level error where
plain TF32 loses three decimal digits); the real cuDNN kernels are checked in test_precision_cuda.py.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import Tensor, nn

from streamdec.codecs import ModuleCodec, load_codec
from streamdec.codecs.layers import PaddedConv1d, SplitConv, routing
from streamdec.codecs.layers import conv as conv_layers
from streamdec.codecs.precision import PRECISIONS
from streamdec.errors import ConfigError
from streamdec.kernels.split import split_input, split_tf32, split_weight

FAMILY_PRESETS = ["tiny", "dac-tiny", "oobleck-tiny", "bigvgan-tiny"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(
            width=32, min_value=-(2.0**126), max_value=2.0**126, allow_nan=False, allow_subnormal=False
        ),
        min_size=1,
        max_size=64,
    )
)
def test_split_is_exact_and_the_head_fits_tf32(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    hi, lo = split_tf32(x)
    assert torch.equal(hi + lo, x)  # nothing lost: the tail is exactly what the head dropped
    assert torch.all(hi.view(torch.int32) & 0x1FFF == 0)  # 10 mantissa bits: TF32 holds it exactly
    assert torch.all(lo.abs() <= x.abs() * 2.0**-11)  # rounded to nearest: at most half a TF32 ulp


def test_split_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32"):
        split_tf32(torch.ones(3, dtype=torch.float64))


def _tf32(t: Tensor) -> Tensor:
    return split_tf32(t)[0]


def _tensor_core_conv(x: Tensor, w: Tensor, *, transposed: bool = False, stride: int = 1) -> Tensor:
    """An idealised TF32 tensor core: operands rounded to TF32, exact products, float64 sums."""
    conv = F.conv_transpose1d if transposed else F.conv1d
    return conv(_tf32(x).double(), _tf32(w).double(), stride=stride)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transpose"])
def test_three_tf32_products_carry_float32_error(transposed: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 96, 80, generator=gen) * torch.logspace(-3, 3, 80)  # six decades of magnitude
    w = torch.randn(96, 48, 7, generator=gen) if transposed else torch.randn(48, 96, 7, generator=gen)
    conv = F.conv_transpose1d if transposed else F.conv1d
    exact = conv(x.double(), w.double(), stride=2)
    scale = conv(x.double().abs(), w.double().abs(), stride=2)  # sum |x||w| per output: the error scale

    split = _tensor_core_conv(split_input(x), split_weight(w, 0 if transposed else 1), transposed=transposed,
                              stride=2)  # fmt: skip
    plain = _tensor_core_conv(x, w, transposed=transposed, stride=2)

    split_err = float(((split - exact).abs() / scale).max())
    plain_err = float(((plain - exact).abs() / scale).max())
    assert split_err <= 3 * 2.0**-22  # the dropped lo*lo term and the tails' TF32 rounding, at most
    assert plain_err > 2.0**-16  # what the split removes: plain TF32 rounds each operand by up to 2**-11
    assert plain_err > 100 * split_err


def test_precision_setting_caches_split_weights_outside_the_checkpoint() -> None:
    codec = load_codec("tiny")
    keys = set(codec.state_dict())
    convs = [m for m in codec.modules() if isinstance(m, SplitConv)]
    assert convs and codec.precision == "fp32"
    assert all(m.split_weight is None for m in convs)

    codec.precision = "tf32x3"
    assert set(codec.state_dict()) == keys  # the cache is never saved
    for m in convs:
        assert m.split_weight is not None
        assert torch.equal(m.split_weight, split_weight(m.weight, m.weight_in_dim))

    codec.precision = "tf32"
    assert all(m.split_weight is None for m in convs)  # plain TF32 frees the cache


def test_refresh_rebuilds_the_split_after_a_weight_change() -> None:
    codec = load_codec("tiny")
    codec.precision = "tf32x3"
    conv = next(m for m in codec.modules() if isinstance(m, SplitConv))
    with torch.no_grad():
        conv.weight.mul_(3.0)
    codec.refresh_cache()
    assert conv.split_weight is not None
    assert torch.equal(conv.split_weight, split_weight(conv.weight, conv.weight_in_dim))


def test_split_follows_dtype_changes() -> None:
    """A half-precision codec keeps no split (TF32 is a float32 matter); back in float32 it splits again."""
    codec = load_codec("tiny")
    codec.precision = "tf32x3"
    convs = [m for m in codec.modules() if isinstance(m, SplitConv)]
    codec.half()
    codec.refresh_cache()
    assert all(m.split_weight is None for m in convs)
    codec.float()
    codec.refresh_cache()
    assert all(m.split_weight is not None and m.split_weight.dtype == torch.float32 for m in convs)


def test_grouped_convolutions_refuse_tf32x3_and_change_nothing() -> None:
    codec = load_codec("tiny")
    grouped = PaddedConv1d(4, 4, 3, pad_left=2, pad_right=0)
    grouped.groups = 2  # as a grouped layer would carry it
    codec.add_module("extra", grouped)
    with pytest.raises(ConfigError, match=r"extra \(groups=2\)"):
        codec.precision = "tf32x3"
    assert codec.precision == "fp32"
    assert all(m.split_weight is None for m in codec.modules() if isinstance(m, SplitConv))


def test_bad_precision_is_a_config_error() -> None:
    codec = load_codec("tiny")
    with pytest.raises(ConfigError, match="'fp32', 'tf32x3', 'fp16x3', 'fp16', 'tf32'"):
        codec.precision = "bf16"  # type: ignore[assignment]
    assert codec.precision == "fp32"
    assert PRECISIONS == ("fp32", "tf32x3", "fp16x3", "fp16", "tf32")


def test_foreign_convolutions_refuse_tf32x3_and_keep_fp32() -> None:
    module = nn.Sequential(nn.Conv1d(8, 1, 3, padding=1))
    codec = ModuleCodec(module, latent_dim=8, hop_size=1, sample_rate=8000, context=(1, 1))
    with pytest.raises(ConfigError, match=r"0 \(Conv1d\)"):
        codec.precision = "tf32x3"
    assert codec.precision == "fp32"
    codec.precision = "tf32"  # plain TF32 needs no layer support
    assert codec.precision == "tf32"


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_cpu_decode_ignores_the_split(name: str) -> None:
    codec = load_codec(name)
    z = torch.randn(1, 24, codec.latent_dim, generator=torch.Generator().manual_seed(3))
    before = codec.decode(z)
    codec.precision = "tf32x3"
    assert torch.equal(codec.decode(z), before)  # TF32 exists only on CUDA: the CPU computes fp32


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_split_path_computes_the_same_decode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every family's split plumbing (stacking, padding, strides, crops) run in fp32 on the CPU."""
    codec = load_codec(name, dtype=torch.float64)
    z = torch.randn(1, 24, codec.latent_dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    exact = codec.decode(z).double()
    codec = codec.float()
    codec.refresh_cache()
    plain = codec.decode(z.float()).double()
    codec.precision = "tf32x3"
    calls: list[int] = []
    monkeypatch.setattr(routing, "takes_split", lambda x: calls.append(1) or x.dtype == torch.float32)
    split = codec.decode(z.float()).double()
    assert len(calls) > 0
    peak = float(exact.abs().max())
    plain_err, split_err = float((plain - exact).abs().max()), float((split - exact).abs().max())
    # same arithmetic, more terms: within a small multiple of plain fp32's own round-off
    assert split_err <= 4 * plain_err + 1e-7 * peak, (split_err, plain_err, peak)
    assert not np.isnan(split_err)


def test_auto_precision_is_fp32_off_the_triton_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU no convolution takes the Triton split, so auto picks fp32 without splitting a weight to
    find that out, and leaves no split cache."""
    codec = load_codec("tiny")

    def no_split(*args: object, **kwargs: object) -> None:
        raise AssertionError("auto precision split a weight on the CPU")

    monkeypatch.setattr(conv_layers, "split_weight", no_split)
    monkeypatch.setattr(conv_layers, "pack_split_weight", no_split)
    assert codec.use_auto_precision() == "fp32"
    assert codec.precision == "fp32"
    assert all(
        m.split_weight is None and m.packed_split is None for m in codec.modules() if isinstance(m, SplitConv)
    )


@pytest.mark.parametrize(
    ("name", "expected"), [("tiny", "tf32x3"), ("dac-tiny", "fp32"), ("bigvgan-tiny", "fp32")]
)
def test_auto_precision_takes_tf32x3_only_when_every_conv_is_on_triton(
    name: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernel's rule granting float32 (as CUDA would), AuK-style models have a conv form for every
    layer; DAC's and BigVGAN's padded transposed convs do not, and a mixed model would land at 83 dB."""
    monkeypatch.setattr(routing, "triton_conv_supported", lambda t: t.dtype == torch.float32)
    codec = load_codec(name)
    assert codec.use_auto_precision() == expected
    assert codec.precision == expected


def test_auto_precision_falls_back_when_tf32x3_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "triton_conv_supported", lambda t: t.dtype == torch.float32)
    module = nn.Sequential(nn.Conv1d(8, 1, 3, padding=1))
    codec = ModuleCodec(module, latent_dim=8, hop_size=1, sample_rate=8000, context=(1, 1))
    assert codec.use_auto_precision() == "fp32"
    assert codec.precision == "fp32"
