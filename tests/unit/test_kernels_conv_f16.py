"""The float16 split (``"fp16x3"``) on the CPU: scales, splits, the op's reference path and layer routing.

The Triton kernel runs here only under the Triton interpreter (``TRITON_INTERPRET=1`` with Triton
installed; CI has neither, so those tests skip). The GPU checks are in ``tests/test_kernels_conv_f16_cuda.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from streamdec.codecs import load_codec
from streamdec.codecs.layers import CausalConvTranspose1d, PaddedConv1d, all_convs_on_triton_split, routing
from streamdec.errors import DTypeError, ShapeError
from streamdec.kernels import f16_launch
from streamdec.kernels.conv import conv1d_split_f16, split_conv1d_f16
from streamdec.kernels.rows import live_rows
from streamdec.kernels.split import (
    F16_CHANNEL_QUANTUM,
    pack_split_weight_f16,
    pow2_scale,
    split_input_f16,
)
from support.conv_cases import (
    UnwrittenIsNan,
    assert_padding_rows_skipped,
    conv_case,
    conv_shapes,
    count_calls,
    needs_interpreter,
    relative_error,
)
from support.split_routing import assert_tiny_decodes_through, route_cpu_through_split

finite_magnitudes = st.floats(min_value=2.0**-126, max_value=2.0**127, allow_nan=False, width=32)


@settings(deadline=None)
@given(st.lists(finite_magnitudes, min_size=1, max_size=20))
def test_scale_puts_the_peak_in_the_top_binade(values: list[float]) -> None:
    amax = torch.tensor(values, dtype=torch.float32)
    scale, inverse = pow2_scale(amax)
    scaled = (amax.double() * scale.double()).tolist()
    exponents = [math.frexp(s)[1] - 1 for s in scale.tolist()]
    for v, s, e in zip(values, scaled, exponents, strict=True):
        if v >= 2.0**-112:  # below that the clamp at 2**126 keeps the scale normal
            assert 2.0**13 <= s < 2.0**14, (v, s)
        assert math.frexp(2.0**e)[0] == 0.5 and -126 <= e <= 126  # a power of two, normal
    torch.testing.assert_close(scale * inverse, torch.ones_like(scale), atol=0, rtol=0)


def test_zero_and_tiny_peaks_stay_finite() -> None:
    scale, inverse = pow2_scale(torch.tensor([0.0, 1e-45, 1e-40], dtype=torch.float32))
    assert torch.isfinite(scale).all() and (inverse > 0).all()


row_cases = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 4),
        "channels": st.integers(1, 70),
        "samples": st.integers(1, 60),
        "log_scales": st.lists(st.floats(-30, 30), min_size=4, max_size=4),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=60, deadline=None)
@given(row_cases)
def test_input_split_keeps_22_bits_per_row(p: dict[str, object]) -> None:
    """Every row reassembles to within 2**-22 of its own peak, whatever the other rows' magnitudes;
    the parts are channels-last with zero channel padding."""
    batch, channels, samples = int(p["batch"]), int(p["channels"]), int(p["samples"])  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(int(p["seed"]))  # type: ignore[call-overload]
    magnitude = torch.tensor([10.0**s for s in p["log_scales"]][:batch])  # type: ignore[attr-defined]
    x = (torch.randn(batch, channels, samples, generator=gen) * magnitude[:, None, None]).float()
    hi, lo, inverse = split_input_f16(x)
    padded = channels + (-channels % F16_CHANNEL_QUANTUM)
    assert hi.shape == lo.shape == (batch, samples, padded) and hi.dtype == lo.dtype == torch.float16
    assert not hi[..., channels:].any() and not lo[..., channels:].any()
    again = (hi.double() + lo.double()).transpose(1, 2)[:, :channels] * inverse.double()[:, None, None]
    peak = x.double().abs().amax(dim=(1, 2))
    error = (again - x.double()).abs().amax(dim=(1, 2))
    assert bool((error <= 2.0**-22 * peak).all()), (error / peak).tolist()
    for b in range(batch):  # a row's parts do not depend on the rest of the batch
        alone = split_input_f16(x[b : b + 1])
        assert torch.equal(alone[0][0], hi[b]) and torch.equal(alone[1][0], lo[b])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 3, 7]), st.integers(0, 2**16))
def test_weight_pack_keeps_22_bits_per_output_channel(cout: int, cin: int, ksize: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(cout, cin, ksize, generator=gen) * torch.logspace(-8, 8, cout)[:, None, None]
    packed, inverse = pack_split_weight_f16(w)
    assert packed.shape == (2, ksize, cout, cin + (-cin % F16_CHANNEL_QUANTUM))
    again = (packed[0].double() + packed[1].double()).permute(1, 2, 0)[:, :cin] * inverse.double()[
        :, None, None
    ]
    peak = w.double().abs().amax(dim=(1, 2))
    assert bool(((again - w.double()).abs().amax(dim=(1, 2)) <= 2.0**-22 * peak).all())


pads = st.tuples(st.integers(0, 12), st.integers(0, 12))


@settings(max_examples=40, deadline=None)
@given(conv_shapes, pads)
def test_op_reference_path_is_the_convolution(p: dict[str, int], pad: tuple[int, int]) -> None:
    """The op pads as it convolves: the result is the convolution of the zero-padded input."""
    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    out = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad)
    assert out.shape == (p["batch"], p["cout"], p["tout"] + sum(pad)) and out.dtype == torch.float32
    assert relative_error(out, F.pad(x, pad), w, bias, p["dilation"]) <= 2e-6


@settings(max_examples=20, deadline=None)
@given(conv_shapes, pads)
def test_op_adds_a_residual_as_a_separate_add_would(p: dict[str, int], pad: tuple[int, int]) -> None:
    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    alone = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad)
    residual = torch.randn(alone.shape, generator=torch.Generator().manual_seed(p["seed"]))
    fused = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, residual)
    assert torch.equal(fused, residual + alone)


def _by_phase(plain: torch.Tensor, phases: int) -> torch.Tensor:
    """The interleave written out by indexing: channel ``p * C + c`` of ``plain`` to ``[:, c, p::s]``."""
    batch, channels, length = plain.shape
    per_phase = channels // phases
    out = torch.empty(batch, per_phase, length * phases, dtype=plain.dtype)
    for p in range(phases):
        out[:, :, p::phases] = plain[:, p * per_phase : (p + 1) * per_phase]
    return out


phase_counts = st.sampled_from([1, 2, 3, 5])


@settings(max_examples=30, deadline=None)
@given(conv_shapes, pads, phase_counts)
def test_op_interleaves_phase_groups(p: dict[str, int], pad: tuple[int, int], phases: int) -> None:
    """``phases`` = s: output channel ``p * (Cout/s) + c`` is sample ``t * s + p`` of channel ``c``, and a
    residual of that shape is added after, as a separate add."""
    p = {**p, "cout": max(1, p["cout"] // phases) * phases}
    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    plain = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad)
    phased = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, phases=phases)
    assert torch.equal(phased, _by_phase(plain, phases))
    residual = torch.randn(phased.shape, generator=torch.Generator().manual_seed(p["seed"]))
    fused = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, residual, phases=phases)
    assert torch.equal(fused, residual + phased)


def test_fake_implementation_gives_the_shape() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 20, 100)
        packed = torch.empty(2, 5, 16, 32, dtype=torch.float16)
        out = torch.ops.streamdec.conv1d_split_f16(x, packed[0], packed[1], torch.empty(16), None, 3)
        padded = torch.ops.streamdec.conv1d_split_f16(
            x, packed[0], packed[1], torch.empty(16), None, 3, 12, 1
        )
        phased = torch.ops.streamdec.conv1d_split_f16(
            x, packed[0], packed[1], torch.empty(16), None, 3, 12, 1, phases=4
        )
    assert out.shape == (2, 16, 100 - 4 * 3) and out.dtype == torch.float32
    assert padded.shape == (2, 16, 100 + 13 - 4 * 3)
    assert phased.shape == (2, 4, (100 + 13 - 4 * 3) * 4)


def test_bad_inputs_are_typed_errors() -> None:
    x, w, _ = conv_case(
        {"batch": 1, "cin": 4, "cout": 6, "ksize": 3, "dilation": 1, "tout": 10, "bias": 0, "seed": 0}
    )
    packed, inverse = pack_split_weight_f16(w)
    with pytest.raises(ShapeError, match="channels"):
        split_conv1d_f16(torch.cat([x] * 9, dim=1), packed, inverse, None, 1)  # 36 channels pad to 64
    with pytest.raises(ShapeError, match="samples"):
        split_conv1d_f16(x[..., :2], packed, inverse, None, 1)
    with pytest.raises(ShapeError, match="padded by"):
        split_conv1d_f16(x, packed, inverse, None, 1, (-1, 0))
    with pytest.raises(ShapeError, match="peaks"):
        split_conv1d_f16(x, packed, inverse, None, 1, peak=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(DTypeError, match="peak"):
        split_conv1d_f16(x, packed, inverse, None, 1, peak=torch.zeros(1))
    with pytest.raises(ShapeError, match="residual"):
        split_conv1d_f16(x, packed, inverse, None, 1, (0, 0), torch.zeros(1, 6, 11))
    with pytest.raises(DTypeError, match="residual"):
        split_conv1d_f16(x, packed, inverse, None, 1, (0, 0), torch.zeros(1, 6, 10, dtype=torch.float64))
    for head, tail in (
        (torch.zeros(1, 6, 4), torch.zeros(1, 6, 7)),  # 4 + 7 samples for an output of 10
        (torch.zeros(1, 6, 4), None),  # a head alone must cover the output
        (torch.zeros(1, 6, 11), None),
        (torch.zeros(1, 5, 4), torch.zeros(1, 5, 6)),
    ):
        with pytest.raises(ShapeError, match="a residual of"):
            split_conv1d_f16(x, packed, inverse, None, 1, (0, 0), tail, residual_head=head)
    assert split_conv1d_f16(x[..., :1], packed, inverse, None, 1, (1, 1)).shape == (1, 6, 1)
    with pytest.raises(ShapeError, match="one shape"):
        conv1d_split_f16(x, packed[0], packed[1][:, 1:], inverse, None, 1)
    with pytest.raises(ShapeError, match="scales"):
        split_conv1d_f16(x, packed, inverse[:3], None, 1)
    with pytest.raises(DTypeError, match="float32 x"):
        split_conv1d_f16(x.double(), packed, inverse, None, 1)
    with pytest.raises(DTypeError, match="w_lo"):
        conv1d_split_f16(x, packed[0], packed[1].float(), inverse, None, 1)
    with pytest.raises(ShapeError, match="phase groups"):
        split_conv1d_f16(x, packed, inverse, None, 1, phases=4)  # 6 outputs
    with pytest.raises(ShapeError, match="phase groups"):
        split_conv1d_f16(x, packed, inverse, None, 1, phases=0)
    with pytest.raises(ShapeError, match="residual"):  # the residual has the interleaved shape
        split_conv1d_f16(x, packed, inverse, None, 1, (0, 0), torch.zeros(1, 6, 8), phases=2)


def test_fp16x3_layers_route_through_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the float16 kernel available, fp16x3 conv layers (transposed ones as polyphase convs) call its
    op and nothing else; the decode matches plain float32."""
    codec = load_codec("tiny")
    z = torch.randn(1, 24, codec.latent_dim, generator=torch.Generator().manual_seed(1))
    plain = codec.decode(z)
    route_cpu_through_split(monkeypatch, f16=True)
    codec.precision = "fp16x3"
    convs = [m for m in codec.modules() if isinstance(m, PaddedConv1d | CausalConvTranspose1d)]
    assert all(m.packed_f16 is not None and m.packed_split is None and m.split_weight is None for m in convs)
    assert all_convs_on_triton_split(codec)
    calls = count_calls(monkeypatch, "conv1d_split_f16")
    routed = codec.decode(z)
    assert len(calls) == len(convs)
    torch.testing.assert_close(routed, plain, atol=1e-5, rtol=0)
    codec.precision = "fp32"
    assert all(m.packed_f16 is None and m.f16_inverse is None for m in convs)


def test_fused_activations_hand_their_peaks_to_the_convs_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """In fp16x3 with the fused activation on, every conv of an AMP unit takes its input's row peaks from
    the activation before it (so its split skips that pass) and the second adds the residual; same audio."""
    codec = load_codec("tiny")
    z = torch.randn(2, 24, codec.latent_dim, generator=torch.Generator().manual_seed(4))
    plain = codec.decode(z)
    route_cpu_through_split(monkeypatch, f16=True)
    monkeypatch.setattr(routing, "fused_supported", lambda t: t.dtype == torch.float32)
    codec.precision = "fp16x3"
    seen: list[tuple[bool, bool]] = []
    real = torch.ops.streamdec.conv1d_split_f16

    def recorded(*args: object) -> torch.Tensor:
        seen.append((args[8] is not None, args[9] is not None))  # (residual, peak)
        out: torch.Tensor = real(*args)
        return out

    monkeypatch.setattr(torch.ops.streamdec, "conv1d_split_f16", recorded)
    routed = codec.decode(z)
    units = sum(len(m.convs1) for m in codec.modules() if type(m).__name__ == "AMPBlock")
    assert units > 0 and seen.count((False, True)) == units and seen.count((True, True)) == units
    torch.testing.assert_close(routed, plain, atol=1e-5, rtol=0)


def test_auto_precision_prefers_fp16x3_where_every_conv_takes_a_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codec = load_codec("tiny")
    route_cpu_through_split(monkeypatch, f16=True)
    assert codec.use_auto_precision() == "fp16x3" and codec.precision == "fp16x3"
    monkeypatch.setattr(routing, "f16_conv_supported", lambda t: False)  # a GPU without TMA
    assert codec.use_auto_precision() == "tf32x3"  # every layer on the TF32 kernel
    assert all(m.packed_split is not None for m in codec.modules() if isinstance(m, PaddedConv1d))


@needs_interpreter
@settings(max_examples=25, deadline=None)
@given(conv_shapes, st.booleans(), st.booleans())
def test_triton_kernel_under_the_interpreter(p: dict[str, int], split: bool, channels_n: bool) -> None:
    """Either orientation (output channels along the GEMM's M or its N) is the convolution to 22 bits."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    args = (hi, lo, x_inv, packed[0], packed[1], inverse, bias, p["dilation"])
    out = tc.conv1d_f16x3(*args, split=split, channels_n=channels_n)
    assert relative_error(out, x, w, bias, p["dilation"]) <= 2e-6


@needs_interpreter
@settings(max_examples=10, deadline=None)
@given(conv_shapes, st.booleans(), st.booleans())
def test_triton_epilogue_adds_the_residual_bit_for_bit(
    p: dict[str, int], split: bool, channels_n: bool
) -> None:
    """Residual in the epilogue (one program or the chunk-sum kernel, either orientation) == the kernel's
    output + residual."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    args = (*split_input_f16(x), packed[0], packed[1], inverse, bias, p["dilation"])
    alone = tc.conv1d_f16x3(*args, split=split, channels_n=channels_n)
    residual = torch.randn(alone.shape, generator=torch.Generator().manual_seed(p["seed"]))
    with_residual = tc.conv1d_f16x3(*args, split=split, residual=residual, channels_n=channels_n)
    assert torch.equal(with_residual, residual + alone)


@needs_interpreter
@settings(max_examples=20, deadline=None)
@given(conv_shapes, st.booleans(), st.booleans(), st.booleans(), st.floats(0.0, 1.0), st.integers(0, 5))
def test_triton_epilogue_reads_a_residual_in_two_parts(
    p: dict[str, int], split: bool, pack: bool, channels_n: bool, share: float, spare: int
) -> None:
    """A residual given as a head (rows and channels apart, as a delay line's kept history lies in a
    stream's state) and the samples after it gives the bits of the concatenated residual, on one program
    per row, packed rows, the chunk-sum kernel and the channels-along-N kernel alike."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    args = (*split_input_f16(x), packed[0], packed[1], inverse, bias, p["dilation"])
    launch = {"split": split, "pack": pack, "tiles": f16_launch.SMALL, "channels_n": channels_n}
    batch, cout, tout = p["batch"], p["cout"], p["tout"]
    gen = torch.Generator().manual_seed(p["seed"])
    kept = round(share * tout)
    # the head: a view into wider rows and channels, like a layer's part of a gathered state
    store = torch.randn(batch, cout + spare, kept + spare, generator=gen)
    head = store[:, spare:, spare:]
    residual = torch.randn(batch, cout, tout, generator=gen)
    tail = residual[..., kept:] if kept < tout else None
    residual[..., :kept] = head
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(f16_launch, "CHUNK_STEPS", 2)  # chunks, so that split=True runs the chunk-sum kernel
        whole = tc.conv1d_f16x3(*args, **launch, residual=residual)
        assert torch.equal(tc.conv1d_f16x3(*args, **launch, residual=tail, residual_head=head), whole)


@needs_interpreter
@settings(max_examples=10, deadline=None)
@given(conv_shapes, phase_counts, st.booleans(), st.booleans())
def test_triton_interleave_of_phases_is_bit_for_bit(
    p: dict[str, int], phases: int, split: bool, with_residual: bool
) -> None:
    """The phases interleaved by the Triton pass are the plain output's channels, moved, not recomputed
    (after either launch); a residual is added to the interleaved result."""
    from streamdec.kernels import _triton_conv_f16 as tc

    p = {**p, "cout": max(1, p["cout"] // phases) * phases}
    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    args = (*split_input_f16(x), packed[0], packed[1], inverse, bias, p["dilation"])
    expected = _by_phase(tc.conv1d_f16x3(*args, split=split), phases)
    residual = torch.randn(expected.shape, generator=torch.Generator().manual_seed(p["seed"]))
    if with_residual:
        expected = residual + expected
    out = tc.conv1d_f16x3(*args, split=split, residual=residual if with_residual else None, phases=phases)
    assert torch.equal(out, expected)


@needs_interpreter
def test_split_k_adds_the_same_numbers_in_the_same_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """One chunk per program plus the chunk-sum kernel equals all chunks in one program, bit for bit."""
    from streamdec.kernels import _triton_conv_f16 as tc

    monkeypatch.setattr(f16_launch, "CHUNK_STEPS", 4)  # 15 steps: chunks of 4, 4, 4, 3
    x, w, bias = conv_case(
        {"batch": 2, "cin": 96, "cout": 70, "ksize": 5, "dilation": 1, "tout": 33, "bias": 1, "seed": 3}
    )
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    args = (hi, lo, x_inv, packed[0], packed[1], inverse, bias, 1)
    assert f16_launch.chunking(15) == (4, 4)
    assert torch.equal(
        tc.conv1d_f16x3(*args, tiles=f16_launch.SMALL, split=True, channels_n=False),
        tc.conv1d_f16x3(*args, tiles=f16_launch.SMALL, split=False, channels_n=False),
    )


@needs_interpreter
@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(f16_launch.PACK_ROW_NS),
    st.integers(1, 70),
    st.sampled_from([f16_launch.SMALL, f16_launch.LARGE]),
    st.booleans(),
    st.integers(0, 2**16),
)
@example(4, 20, f16_launch.LARGE, False, 1)  # a 4-frame step's rows of 20 at 768 channels: 32 rows a program
@example(16, 240, f16_launch.LARGE, True, 2)  # rows of 240 in 16-sample pieces, split-K on
def test_packed_pieces_of_every_size_address_every_row(
    row_n: int, tout: int, tile: f16_launch.Tiles, split: bool, seed: int
) -> None:
    """Rows packed in pieces of any size the planner takes (3-D input boxes of ``row_n`` samples a row,
    as many rows as fill the tile, the last program holding rows past the batch) give every row its own
    convolution to 22 bits, as one row a program does. The interpreter's matrix products round by their
    own blocking, so the bits of packed against one-row programs are the GPU's test
    (``tests/gpu/test_kernels_conv_f16_cuda.py``)."""
    from streamdec.kernels import _triton_conv_f16 as tc

    rows = tile.block_n // row_n
    p = {
        "batch": rows + 1,
        "cin": 40,
        "cout": 24,
        "ksize": 3,
        "dilation": 2,
        "tout": tout,
        "bias": 1,
        "seed": seed,
    }
    x, w, bias = conv_case(p)
    x = x * torch.logspace(-3, 3, rows + 1)[:, None, None]  # rows of very different peaks
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    args = (hi, lo, x_inv, packed[0], packed[1], inverse, bias, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(f16_launch, "PACK_ROW_NS", (row_n,))
        patch.setattr(f16_launch, "CHUNK_STEPS", 2)  # chunks, so that split=True runs the chunk-sum kernel
        launch = f16_launch.plan(
            batch=rows + 1, padded_channels=hi.shape[2], cout=24, tout=tout, ksize=3, sms=1, tiles=tile
        )
        ours = tc.conv1d_f16x3(*args, tiles=tile, split=split, channels_n=False)
    assert launch.rows in (1, rows)
    for b in range(rows + 1):
        assert relative_error(ours[b : b + 1], x[b : b + 1], w, bias, 2) <= 2e-6


def _row_case(samples: int) -> dict[str, object]:
    return {
        "batch": 2,
        "channels": 40,
        "samples": samples,
        "log_scales": [3.0, -7.0, 0.0, 0.0],
        "seed": samples,
    }


@needs_interpreter
@settings(max_examples=20, deadline=None)
@given(row_cases, pads)
@example(_row_case(45), (2, 1))  # rows of 48: 16-sample tiles
@example(_row_case(96), (0, 0))  # 32-sample tiles
@example(_row_case(120), (5, 3))  # 64-sample tiles
def test_triton_split_is_the_reference_split_bit_for_bit(p: dict[str, object], pad: tuple[int, int]) -> None:
    """The op's two-kernel split (row peaks by integer atomic max, then one pass that also writes the
    zero padding) equals split_input_f16 of the padded input."""
    from streamdec.kernels import _triton_conv_f16 as tc

    batch, channels, samples = int(p["batch"]), int(p["channels"]), int(p["samples"])  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(int(p["seed"]))  # type: ignore[call-overload]
    magnitude = torch.tensor([10.0**s for s in p["log_scales"]][:batch])  # type: ignore[attr-defined]
    x = (torch.randn(batch, channels, samples, generator=gen) * magnitude[:, None, None]).float()
    for ours, reference in zip(tc.split_f16(x, *pad), split_input_f16(F.pad(x, pad)), strict=True):
        assert torch.equal(ours, reference)


@needs_interpreter
def test_split_takes_handed_over_peaks_and_the_activation_kernel_gives_them() -> None:
    """The fused activation's peaks (taken by its kernel as it writes) are the split's own, and the split
    from them has the same bits."""
    from streamdec.kernels import _triton_alias_free as ka
    from streamdec.kernels import _triton_conv_f16 as tc

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, 7, 300, generator=gen) * torch.tensor([1e-4, 1.0, 1e4])[:, None, None]
    filt = torch.randn(12, generator=gen) / 12
    a, b = torch.rand(7, generator=gen) + 0.5, torch.rand(7, generator=gen) + 0.5
    out = torch.empty(21, 300)
    peak = torch.zeros(3, dtype=torch.int32)
    ka.launch_blocked(x.reshape(21, 300), filt, a, b, out, peak)
    y = out.view(3, 7, 300)
    assert torch.equal(peak.view(torch.float32), y.abs().amax(dim=(1, 2)))
    for ours, own in zip(tc.split_f16(y, 6, 0, peak), tc.split_f16(y, 6, 0), strict=True):
        assert torch.equal(ours, own)


@needs_interpreter
@settings(max_examples=15, deadline=None)
@given(conv_shapes, st.sampled_from([(64, 16, 4, 2), (64, 32, 4, 3), (128, 64, 4, 2), (256, 128, 8, 2)]))
def test_channels_along_n_give_one_row_the_same_bits_at_any_batch_and_tile(
    p: dict[str, int], tile: tuple[int, int, int, int]
) -> None:
    """With the output channels along N, a row's output does not depend on the sample tile, the channel
    tile or the batch it is computed in (the steps and chunks are the layer's)."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    weights = (packed[0], packed[1], inverse, bias, p["dilation"])
    planned = tc.conv1d_f16x3(hi, lo, x_inv, *weights, channels_n=True)
    tiled = tc.conv1d_f16x3(hi, lo, x_inv, *weights, channels_n=True, tiles=f16_launch.Tiles(*tile))
    alone = tc.conv1d_f16x3(hi[-1:], lo[-1:], x_inv[-1:], *weights, channels_n=True)
    assert torch.equal(tiled, planned) and torch.equal(alone[0], planned[-1])


@needs_interpreter
def test_whole_decode_through_the_interpreted_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny codec in fp16x3 with every conv (transposed ones as phases) on the interpreted kernels."""
    from streamdec.kernels import _triton_conv_f16 as tc

    def interpreted(
        x: torch.Tensor, w_hi: torch.Tensor, w_lo: torch.Tensor, w_inv: torch.Tensor,
        bias: torch.Tensor | None, dilation: int, pad_left: int = 0, pad_right: int = 0,
        residual: torch.Tensor | None = None, peak: torch.Tensor | None = None, phases: int = 1,
        head: torch.Tensor | None = None, products: int = 3, residual_head: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        parts = tc.split_f16(x, pad_left, pad_right, peak, head, tails=products == 3)
        return tc.conv1d_f16x3(
            *parts, w_hi, w_lo, w_inv, bias, dilation, residual=residual, phases=phases, products=products,
            residual_head=residual_head,
        )  # fmt: skip

    assert_tiny_decodes_through(monkeypatch, "fp16x3", "conv1d_split_f16", interpreted)


@settings(max_examples=25, deadline=None)
@given(conv_shapes, pads, st.integers(0, 30))
def test_op_convolves_a_head_before_the_input(p: dict[str, int], pad: tuple[int, int], kept: int) -> None:
    """``head`` comes before ``x`` in time: the op convolves ``cat(head, x)``; a head that does not match
    ``x``'s batch, channels or dtype is a typed error."""
    x, w, bias = conv_case(p)
    head = torch.randn(p["batch"], p["cin"], kept, generator=torch.Generator().manual_seed(p["seed"]))
    packed, inverse = pack_split_weight_f16(w)
    out = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, head=head)
    assert torch.equal(
        out, split_conv1d_f16(torch.cat([head, x], -1), packed, inverse, bias, p["dilation"], pad)
    )
    with pytest.raises(ShapeError):
        split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, head=torch.cat([head, head]))


@settings(max_examples=20, deadline=None)
@given(p=conv_shapes, pad=st.tuples(st.integers(0, 4), st.integers(0, 4)), log_scale=st.floats(-20, 20))
def test_single_product_convolves_the_float16_heads(
    p: dict[str, int], pad: tuple[int, int], log_scale: float
) -> None:
    """products=1 (the "fp16" precision) is the convolution of the scaled operands' float16 heads: it
    equals a float64 convolution of exactly those heads to float32 round-off, lands within the heads'
    11-bit rounding of the true convolution, and differs from the three-product result (the tails are
    really dropped)."""
    x, w, bias = conv_case(p)
    x = x * 2.0**log_scale
    packed, inverse = pack_split_weight_f16(w)
    single = split_conv1d_f16(x, packed, inverse, bias, p["dilation"], pad, products=1)
    padded = F.pad(x, pad)
    heads, _, x_inverse = split_input_f16(padded)
    x_heads = heads.float().transpose(1, 2)[:, : x.shape[1]] * x_inverse[:, None, None]
    w_heads = (packed[0].float() * inverse[None, :, None]).permute(1, 2, 0)[:, : x.shape[1]]
    assert relative_error(single, x_heads, w_heads.contiguous(), bias, p["dilation"]) <= 2e-6
    assert relative_error(single, padded, w, bias, p["dilation"]) <= 2e-3
    no_bias = (x, packed, inverse, None, p["dilation"], pad)  # a bias may round the difference away
    assert not torch.equal(split_conv1d_f16(*no_bias, products=1), split_conv1d_f16(*no_bias))


def test_single_product_is_chosen_by_precision_only_and_never_by_auto() -> None:
    """``precision = "fp16"`` switches every conv layer to one product; "fp16x3" back to three; auto
    never picks it."""
    from streamdec.codecs.layers import SplitConv
    from streamdec.codecs.precision import AUTO_PREFERENCE, check_precision

    codec = load_codec("tiny")
    codec.precision = "fp16"
    convs = [m for m in codec.modules() if isinstance(m, SplitConv)]
    assert convs and all(m.f16_products == 1 and m.split_enabled for m in convs)
    codec.precision = "fp16x3"
    assert all(m.f16_products == 3 for m in convs)
    assert check_precision("fp16") == "fp16" and "fp16" not in AUTO_PREFERENCE
    assert codec.use_auto_precision() == "fp32"  # the CPU: no kernel to run either
    with pytest.raises(ShapeError, match="products"):
        x, w, _ = conv_case(
            {"batch": 1, "cin": 4, "cout": 6, "ksize": 3, "dilation": 1, "tout": 10, "bias": 0, "seed": 0}
        )
        split_conv1d_f16(x, *pack_split_weight_f16(w), None, 1, products=2)


def _rows_apart(
    scale: torch.Tensor, channels: int, length: int, gap: int, gen: torch.Generator
) -> torch.Tensor:
    """``[batch, channels, length]`` (row ``b`` scaled by ``scale[b]``) whose batch rows lie
    ``channels * length + gap`` apart, each row's samples contiguous (a layer's view of a stateful call's
    states, gathered slot-major)."""
    flat = torch.randn(scale.shape[0], channels * length + gap, generator=gen) * scale[:, None]
    rows = flat[:, : channels * length].view(scale.shape[0], channels, length)
    assert length == 0 or scale.shape[0] == 1 or rows.stride(0) == channels * length + gap
    return rows


def _peak_bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(t.shape[0], -1)
    peak = flat.abs().amax(1) if flat.shape[1] else torch.zeros(t.shape[0])
    return peak.view(torch.int32)


@needs_interpreter
@settings(max_examples=12, deadline=None)
@given(row_cases, pads, st.integers(1, 12), st.booleans())
def test_triton_split_reads_a_head_whose_rows_lie_apart(
    p: dict[str, object], pad: tuple[int, int], kept: int, handed: bool
) -> None:
    """The split of ``cat(head, x)`` reads a head whose batch rows lie apart in place, with its own peak
    passes or handed-over peaks, and equals split_input_f16 of the padded concatenation bit for bit."""
    from streamdec.kernels import _triton_conv_f16 as tc

    batch, channels, samples = int(p["batch"]), int(p["channels"]), int(p["samples"])  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(int(p["seed"]))  # type: ignore[call-overload]
    magnitude = torch.tensor([10.0**s for s in p["log_scales"]][:batch])  # type: ignore[attr-defined]
    head = _rows_apart(magnitude, channels, kept, 5, gen)
    x = torch.randn(batch, channels, samples, generator=gen)
    whole = torch.cat([head, x], -1)
    peak = _peak_bits(whole) if handed else None
    ours = tc.split_f16(x, *pad, peak, head)
    for part, reference in zip(ours, split_input_f16(F.pad(whole, pad)), strict=True):
        assert torch.equal(part, reference)


def _state_pool(
    slots: int, channels: int, length: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool ``[slots, width]`` and one stateful layer's view ``[slots, channels, length]`` of it, other
    layers' columns on either side (as :class:`~streamdec.engine.slots.StatePool` lays them out)."""
    flat = torch.randn(slots, 3 + channels * length + 4, generator=gen)
    return flat, flat[:, 3 : 3 + channels * length].view(slots, channels, length)


@needs_interpreter
@settings(max_examples=12, deadline=None)
@given(row_cases, st.integers(0, 12), st.integers(1, 40), st.integers(0, 4))
def test_triton_split_writes_the_kept_state_to_each_rows_slot(
    p: dict[str, object], kept: int, keep_len: int, live: int
) -> None:
    """With ``keep`` the split also writes each row's last ``L`` samples of ``cat(head, x)`` to its slot
    of a pool (steps shorter and longer than the state, with and without a head), exactly what
    ``index_copy_`` of the new state writes; its float16 parts keep their bits; nothing else in the
    pool changes, and rows past the live count write nothing."""
    from streamdec.kernels import _triton_conv_f16 as tc

    batch, channels, samples = int(p["batch"]), int(p["channels"]), int(p["samples"])  # type: ignore[call-overload]
    keep_len = min(keep_len, kept + samples)
    gen = torch.Generator().manual_seed(int(p["seed"]))  # type: ignore[call-overload]
    head = _rows_apart(torch.ones(batch), channels, kept, 5, gen) if kept else None
    x = torch.randn(batch, channels, samples, generator=gen)
    flat, pool = _state_pool(batch + 2, channels, keep_len, gen)
    slots = torch.randperm(batch + 2, generator=gen)[:batch]
    want = flat.clone()
    view = want[:, 3 : 3 + channels * keep_len].view(batch + 2, channels, keep_len)
    whole = x if head is None else torch.cat([head, x], -1)
    live = min(live, batch)
    view[slots[:live]] = whole[:live, :, whole.shape[-1] - keep_len :]
    with live_rows(torch.tensor([live])):
        ours = tc.split_f16(x, 0, 0, None, head, keep=(pool, slots))
        plain = tc.split_f16(x, 0, 0, None, head)
    assert torch.equal(flat, want)
    for mine, theirs in zip(ours, plain, strict=True):
        assert torch.equal(mine[:live], theirs[:live])


def test_op_keeps_the_state_on_the_cpu_and_refuses_a_bad_pool() -> None:
    """The keeping op's reference path writes the kept samples as the kernel does (its mutation declared,
    as opcheck checks); a pool of the wrong shape, layout or dtype is a typed error."""
    gen = torch.Generator().manual_seed(3)
    x, head = torch.randn(2, 5, 3, generator=gen), torch.randn(2, 5, 6, generator=gen)
    packed, inverse = pack_split_weight_f16(torch.randn(4, 5, 3, generator=gen))
    pool, slots = torch.zeros(4, 5, 6), torch.tensor([3, 1])
    out = split_conv1d_f16(x, packed, inverse, None, 1, head=head, keep=(pool, slots))
    assert torch.equal(out, split_conv1d_f16(x, packed, inverse, None, 1, head=head))
    assert torch.equal(pool[[3, 1]], torch.cat([head, x], -1)[..., -6:])
    assert not pool[[0, 2]].any()
    bad = [
        ((torch.zeros(4, 4, 6), slots), ShapeError),  # channels
        ((torch.zeros(4, 5, 10), slots), ShapeError),  # longer than head and x
        ((torch.zeros(4, 6, 5).transpose(1, 2), slots), ShapeError),  # slot rows not contiguous
        ((pool, torch.tensor([1])), ShapeError),  # a slot per row
        ((pool.double(), slots), DTypeError),
        ((pool, slots.int()), DTypeError),
    ]
    for keep, error in bad:
        with pytest.raises(error):
            split_conv1d_f16(x, packed, inverse, None, 1, head=head, keep=keep)
    torch.library.opcheck(  # the state it writes is declared as mutated
        torch.ops.streamdec.conv1d_split_f16_keep.default,
        (pool, slots, x, packed[0], packed[1], inverse, None, 1, 0, 0, None, None, 1, head),
    )


@needs_interpreter
@pytest.mark.parametrize(
    ("kept", "before_len", "samples"),
    [(10, 0, 20), (10, 6, 20), (0, 30, 20), (10, 6, 300), (0, 40, 300)],
    ids=["no-history", "history", "no-head", "whole-rows", "whole-rows-no-head"],
)
@pytest.mark.parametrize("variant", ["halo", "blocked"])
def test_window_kernel_reads_rows_apart_and_folds_in_a_history_peak(
    kept: int, before_len: int, samples: int, variant: str
) -> None:
    """The window kernel reads a head whose batch rows lie apart as it reads a contiguous one (same bits),
    and raises a zeroed peak to the peak of ``cat(history, window)`` for a history whose batch rows lie
    apart, packed short rows and whole long ones alike (the halo kernel's programs read the history's
    channels they write; the blocked kernel takes a pass of its own)."""
    from streamdec.kernels import _triton_alias_free as ka

    gen = torch.Generator().manual_seed(4)
    batch, channels, start = 3, 37, 8 if kept else 0  # 37: the last packed program's rows run past C
    scale = torch.tensor([1e-4, 1.0, 1e4])
    head = _rows_apart(scale, channels, kept, 3, gen)
    before = _rows_apart(scale.flip(0), channels, before_len, 2, gen)
    x = torch.randn(batch, channels, samples, generator=gen) * scale[:, None, None]
    filt = torch.randn(12, generator=gen) / 12
    a, b = torch.rand(channels, generator=gen) + 0.5, torch.rand(channels, generator=gen) + 0.5
    count = kept + samples - start - 2
    assert torch.equal(ka.row_peaks(before), _peak_bits(before))
    outs, peak = [], torch.zeros(batch, dtype=torch.int32)
    for h, p, hist in ((head, peak, before), (head.contiguous().view(batch * channels, kept), None, None)):
        out = torch.empty(batch * channels, count)
        ka.launch_blocked(
            x.reshape(batch * channels, samples), filt, a, b, out, p, h if kept else None, start,
            variant=variant, before=hist,
        )  # fmt: skip
        outs.append(out.view(batch, channels, count))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(
        peak, _peak_bits(torch.cat([before.reshape(batch, -1), outs[0].reshape(batch, -1)], 1))
    )
    with pytest.raises(ValueError, match="pass peak"):
        ka.launch_blocked(x.reshape(batch * channels, samples), filt, a, b, outs[1], before=before)


@needs_interpreter
@settings(max_examples=16, deadline=None)
@given(conv_shapes, st.booleans(), st.booleans(), st.booleans(), st.integers(0, 5), phase_counts)
def test_padding_rows_are_skipped_and_real_rows_keep_their_bits(
    p: dict[str, int], split: bool, channels_n: bool, small: bool, live: int, phases: int
) -> None:
    """Inside ``live_rows``, the split, the convolution (either orientation, split-K or not, packed rows
    or not, phases interleaved or not) do no work for the rows past the count, and the real rows' outputs
    are the bits of a launch without it."""
    from streamdec.kernels import _triton_conv_f16 as tc

    p = {**p, "batch": 5, "cout": max(1, p["cout"] // phases) * phases}
    x, w, bias = conv_case(p)
    packed, inverse = pack_split_weight_f16(w)
    launch = {"split": split, "channels_n": channels_n, "tiles": f16_launch.SMALL if small else None}
    count = torch.tensor([live])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tc, "torch", UnwrittenIsNan())
        parts = tc.split_f16(x)
        with live_rows(count):
            ours = tc.split_f16(x)
        for mine, full in zip(ours, parts, strict=True):
            assert_padding_rows_skipped(mine, full, live)
        args = (*parts, packed[0], packed[1], inverse, bias, p["dilation"])
        full = tc.conv1d_f16x3(*args, **launch, phases=phases)
        with live_rows(count):
            mine = tc.conv1d_f16x3(*args, **launch, phases=phases)
    assert_padding_rows_skipped(mine, full, live)
