"""GPU tests of the float16 split convolution (``"fp16x3"``, ``streamdec.kernels._triton_conv_f16``).

Needs a GPU with TMA (compute capability 9.0). The accuracy thresholds are the design's claim, the same
as the TF32 split's: 22-bit operands and float32-exact products, a fresh tensor-core accumulator every
step, so each layer lands within 3x cuDNN float32's error against float64 and a whole decode at 100 dB
or more. Each test prints its figures.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamdec.kernels import f16_launch
from streamdec.kernels.conv import f16_conv_supported, split_conv1d_f16
from streamdec.kernels.split import pack_split_weight_f16, split_input_f16
from support.cuda_checks import (
    AUK_LAYERS,
    NEEDS_TMA,
    captured_replay,
    layer_case,
    rel_error,
    whole_auk_against_float64,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(600),
    NEEDS_TMA,
]


@pytest.mark.parametrize(("channels", "ksize", "dilation", "tout"), AUK_LAYERS)
def test_layer_accuracy_against_float64(channels: int, ksize: int, dilation: int, tout: int) -> None:
    x, w = layer_case(2, channels, ksize, dilation, tout)
    exact = F.conv1d(x.double(), w.double(), dilation=dilation)
    packed, inverse = pack_split_weight_f16(w)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        with torch.inference_mode():
            fp32 = F.conv1d(x, w, dilation=dilation)
            ours = split_conv1d_f16(x, packed, inverse, None, dilation)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    errors = {"fp32": rel_error(fp32, exact), "fp16x3": rel_error(ours, exact)}
    print(
        f"C={channels} k={ksize} d={dilation} T={tout}: "
        + ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
    )
    assert errors["fp16x3"] <= 3 * errors["fp32"]


def test_rows_of_any_magnitude_keep_their_accuracy() -> None:
    """One power-of-two scale per row: a row at 1e-20 next to one at 1e20 is as accurate as alone."""
    x, w = layer_case(3, 256, 7, 3, 500)
    x = x * torch.tensor([1e-20, 1.0, 1e20], device="cuda")[:, None, None]
    packed, inverse = pack_split_weight_f16(w)
    with torch.inference_mode():
        out = split_conv1d_f16(x, packed, inverse, None, 3)
    exact = F.conv1d(x.double(), w.double(), dilation=3)
    errors = [rel_error(out[b], exact[b]) for b in range(3)]
    print("per-row relative error at 1e-20, 1, 1e20:", [f"{e:.2e}" for e in errors])
    assert max(errors) <= 2e-6 and torch.isfinite(out).all()


@pytest.mark.parametrize("products", [3, 1])
@pytest.mark.parametrize(("channels", "ksize", "dilation", "tout"), AUK_LAYERS[:3])
def test_every_launch_gives_the_same_bits(
    channels: int, ksize: int, dilation: int, tout: int, products: int
) -> None:
    """Tiles, split-K on or off, batch 1 or 16: a row's result is bit-identical (the chunked reduction
    is fixed per layer), with three products ("fp16x3") or one ("fp16")."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w = layer_case(16, channels, ksize, dilation, tout)
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    args = (packed[0], packed[1], inverse, None, dilation)
    with torch.inference_mode():
        reference = tc.conv1d_f16x3(hi, lo, x_inv, *args, products=products)
        alone = tc.conv1d_f16x3(hi[3:4], lo[3:4], x_inv[3:4], *args, products=products)
        assert torch.equal(alone[0], reference[3])
        others = (
            f16_launch.Tiles(128, 64, 8, 2),
            f16_launch.Tiles(64, 128, 4, 2),
            f16_launch.Tiles(64, 128, 4, 4),
        )
        for tiles in (f16_launch.LARGE, f16_launch.SMALL, *others):
            for split in (False, True):
                out = tc.conv1d_f16x3(
                    hi[3:4], lo[3:4], x_inv[3:4], *args, tiles=tiles, split=split, products=products
                )
                assert torch.equal(out[0], reference[3]), (tiles, split)


def test_single_product_matches_the_reference_op() -> None:
    """products=1 on the GPU is the CPU op's convolution of the float16 heads, to float32 round-off, and
    within the heads' rounding of float64; the split writes no tails for it."""
    x, w = layer_case(4, 256, 7, 3, 500)
    packed, inverse = pack_split_weight_f16(w)
    with torch.inference_mode():
        ours = split_conv1d_f16(x, packed, inverse, None, 3, (6, 0), products=1)
        reference = split_conv1d_f16(x.cpu(), packed.cpu(), inverse.cpu(), None, 3, (6, 0), products=1)
    exact = F.conv1d(F.pad(x, (6, 0)).double(), w.double(), dilation=3)
    errors = (rel_error(ours.cpu(), reference), rel_error(ours, exact))
    print(f"fp16 single product: {errors[0]:.2e} against the CPU op, {errors[1]:.2e} against float64")
    assert errors[0] <= 1e-5 and errors[1] <= 2e-3


def test_split_kernels_match_the_reference_split() -> None:
    """The op's Triton split equals split_input_f16 bit for bit (rows of very different peaks)."""
    from streamdec.kernels import _triton_conv_f16 as tc

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 200, 3001, generator=gen) * torch.tensor([1e-30, 1e-3, 1.0, 1e30])[:, None, None]
    x = x.cuda()
    for ours, reference in zip(tc.split_f16(x), split_input_f16(x), strict=True):
        assert torch.equal(ours, reference)
    for pads in ((10, 0), (3, 5), (0, 7)):  # the padding written by the split, as the layers ask for it
        for ours, reference in zip(tc.split_f16(x, *pads), split_input_f16(F.pad(x, pads)), strict=True):
            assert torch.equal(ours, reference), pads


@pytest.mark.parametrize("tiles", [f16_launch.LARGE, f16_launch.SMALL, f16_launch.Tiles(64, 128, 4, 2)])
@pytest.mark.parametrize("split", [False, True])
def test_residual_in_the_epilogue_is_a_separate_add(tiles: f16_launch.Tiles, split: bool) -> None:
    """The residual added in the kernel's epilogue (or the chunk-sum kernel's) rounds as ``r + conv``."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w = layer_case(4, 768, 11, 1, 350)
    packed, inverse = pack_split_weight_f16(w)
    args = (*tc.split_f16(x), packed[0], packed[1], inverse, None, 1)
    with torch.inference_mode():
        alone = tc.conv1d_f16x3(*args, tiles=tiles, split=split)
        residual = torch.randn_like(alone)
        fused = tc.conv1d_f16x3(*args, tiles=tiles, split=split, residual=residual)
    assert torch.equal(fused, residual + alone)


@pytest.mark.parametrize("tiles", [f16_launch.LARGE, f16_launch.SMALL, f16_launch.Tiles(64, 128, 4, 2)])
@pytest.mark.parametrize("split", [False, True])
def test_phases_are_interleaved(tiles: f16_launch.Tiles, split: bool) -> None:
    """A transposed conv's phases, interleaved in time after any launch, are the plain output's channels
    moved, bit for bit (auk-24k's third upsample: 384 -> 3 x 192)."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, _ = layer_case(4, 384, 2, 1, 350)
    w = torch.randn(576, 384, 2, device="cuda") / 28.0  # 576 = 3 phases x 192 outputs
    packed, inverse = pack_split_weight_f16(w)
    args = (*tc.split_f16(x), packed[0], packed[1], inverse, torch.randn(576, device="cuda"), 1)
    with torch.inference_mode():
        plain = tc.conv1d_f16x3(*args, tiles=tiles, split=split)
        phased = tc.conv1d_f16x3(*args, tiles=tiles, split=split, phases=3)
    assert phased.shape == (4, 192, 3 * plain.shape[-1])
    for p in range(3):
        assert torch.equal(phased[:, :, p::3], plain[:, p * 192 : (p + 1) * 192]), p


def test_padding_inside_the_op_is_padding_before_it() -> None:
    """The op's own zero padding gives the bits of the same op on a padded copy (one layer, batch 3)."""
    x, w = layer_case(3, 192, 7, 3, 400)
    packed, inverse = pack_split_weight_f16(w)
    with torch.inference_mode():
        for pads in ((18, 0), (9, 9)):
            inside = split_conv1d_f16(x, packed, inverse, None, 3, pads)
            before = split_conv1d_f16(F.pad(x, pads), packed, inverse, None, 3)
            assert torch.equal(inside, before), pads


def test_whole_auk_decode_reaches_float32_accuracy() -> None:
    """fp16x3 against float64: at least 100 dB and 1e-5 (fp32: 115 dB, tf32x3 with Triton: 120)."""
    codec, err, snr = whole_auk_against_float64("fp16x3")
    assert f16_conv_supported(codec.conv_pre.weight)
    assert all(m.packed_f16 is not None for m in codec.modules() if hasattr(m, "packed_f16"))
    assert snr >= 100.0 and err <= 1e-5


@pytest.mark.filterwarnings("ignore")  # Inductor/Triton internals may warn; not ours
def test_compiled_and_captured_conv_matches_eager() -> None:
    x = torch.randn(3, 48, 300, device="cuda")
    w = torch.randn(32, 48, 7, device="cuda") / 18
    bias = torch.randn(32, device="cuda")
    packed, inverse = pack_split_weight_f16(w)

    def conv(t: torch.Tensor) -> torch.Tensor:
        return split_conv1d_f16(t, packed, inverse, bias, 3) + 1.0

    out, again, eager = captured_replay(conv, x)
    assert torch.equal(out, again)  # the split is exact arithmetic: compiled or not, same bits
    assert not torch.equal(out, eager)  # and the replay read the new input


# A stateful step's rows: auk-24k at 4 frames a step (768 channels: 20 samples, in 4-sample pieces; 384:
# 80; 192: 240, in 16-sample pieces; 96: 480, in 32) and odd lengths, with as many rows as the engine's
# largest step bucket.
STEP_LAYERS = [
    (768, 3, 9, 20), (768, 7, 1, 20), (384, 7, 3, 80), (192, 7, 3, 240), (96, 11, 5, 480), (96, 11, 5, 37),
    (1536, 7, 1, 4),
]  # fmt: skip


@pytest.mark.parametrize(("channels", "ksize", "dilation", "tout"), STEP_LAYERS)
@pytest.mark.parametrize("split", [None, False, True])
def test_packed_short_rows_give_the_same_bits(
    channels: int, ksize: int, dilation: int, tout: int, split: bool | None
) -> None:
    """Short rows packed into one program (3-D input boxes, one row's samples per column group) give each
    row exactly the bits it gets alone, with and without a residual, and are as accurate."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w = layer_case(256, channels, ksize, dilation, tout)
    x = x * torch.logspace(-3, 3, 256, device="cuda")[:, None, None]  # rows of very different peaks
    packed, inverse = pack_split_weight_f16(w)
    hi, lo, x_inv = split_input_f16(x)
    bias = torch.randn(channels, device="cuda")
    args = (hi, lo, x_inv, packed[0], packed[1], inverse, bias, dilation)
    launch = f16_launch.plan(
        batch=256,
        padded_channels=hi.shape[2],
        cout=channels,
        tout=tout,
        ksize=ksize,
        sms=tc.launch_sms(x.device),
    )
    with torch.inference_mode():
        ours = tc.conv1d_f16x3(*args, split=split, pack=True)
        alone = tc.conv1d_f16x3(*args, split=split, pack=False)
        residual = torch.randn_like(ours)
        with_residual = tc.conv1d_f16x3(*args, split=split, pack=True, residual=residual)
        single = tc.conv1d_f16x3(hi[7:8], lo[7:8], x_inv[7:8], *args[3:], split=split)
    print(f"C={channels} T={tout} split={split}: {launch.rows} rows a program, grid {launch.grid}")
    assert torch.equal(ours, alone) and torch.equal(single[0], ours[7])
    assert torch.equal(with_residual, residual + alone)
    exact = F.conv1d(x.double(), w.double(), bias.double(), dilation=dilation)
    assert max(rel_error(ours[b], exact[b]) for b in (0, 128, 255)) <= 2e-6


def test_packed_tiles_are_what_the_step_buckets_get() -> None:
    """The launch planner packs auk-24k's 768-channel step rows on this GPU (else the test above would not
    exercise the packed kernel where it matters)."""
    from streamdec.kernels import _triton_conv_f16 as tc

    launch = f16_launch.plan(
        batch=256, padded_channels=768, cout=768, tout=20, ksize=3, sms=tc.launch_sms(torch.device("cuda"))
    )
    assert launch.rows > 1


@pytest.mark.parametrize(
    ("kept", "tout", "pads"), [(50, 20, (0, 0)), (2, 20, (0, 0)), (6, 80, (0, 3)), (30, 4, (0, 0))]
)
def test_a_head_is_read_in_place_as_if_concatenated(kept: int, tout: int, pads: tuple[int, int]) -> None:
    """``head`` before ``x`` (a stream's kept history and its new samples) gives the bits of the
    convolution of ``cat(head, x)``, at a batch that packs rows and at one that does not."""
    for batch in (256, 3):
        gen = torch.Generator().manual_seed(kept + tout)
        head = (torch.randn(batch, 768, kept, generator=gen) * 4).cuda()
        x = torch.randn(batch, 768, tout, generator=gen).cuda()
        w = (torch.randn(768, 768, 3, generator=gen) / 48).cuda()
        packed, inverse = pack_split_weight_f16(w)
        with torch.inference_mode():
            ours = split_conv1d_f16(x, packed, inverse, None, 1, pads, head=head)
            cat = split_conv1d_f16(torch.cat([head, x], -1), packed, inverse, None, 1, pads)
        assert torch.equal(ours, cat), batch


@pytest.mark.parametrize(("kept", "tout"), [(36, 20), (12, 20), (20, 20), (0, 20), (9, 300)])
@pytest.mark.parametrize("split", [False, True])
def test_a_residual_in_two_parts_is_read_where_it_lies(kept: int, tout: int, split: bool) -> None:
    """A residual given as a delay line gives it (the kept history, a view into a wider state row, then
    the new samples, a view of the step's input) adds the bits of the concatenated residual, on packed
    rows (256 rows of 20 samples), one row a program and the chunk-sum kernel alike. A history longer
    than the output gives all of it."""
    from streamdec.kernels import _triton_conv_f16 as tc

    batch = 256 if tout < 128 else 3
    x, w = layer_case(batch, 768, 11, 1, tout)
    packed, inverse = pack_split_weight_f16(w)
    args = (*tc.split_f16(x), packed[0], packed[1], inverse, None, 1)
    gen = torch.Generator(device="cuda").manual_seed(kept)
    state = torch.randn(batch, 2 * 768 * 40, device="cuda", generator=gen)  # other layers' columns around
    history = state[:, 768 * 40 : 768 * 40 + 768 * kept].view(batch, 768, kept)
    new = torch.randn(batch, 768, tout + 5, device="cuda", generator=gen)
    head = history[..., :tout]
    tail = new[..., : tout - kept] if kept < tout else None
    with torch.inference_mode():
        joined = torch.cat([head, tail], -1) if tail is not None else head.contiguous()
        whole = tc.conv1d_f16x3(*args, split=split, residual=joined)
        parts = tc.conv1d_f16x3(*args, split=split, residual=tail, residual_head=head)
    assert torch.equal(parts, whole)


# Launch families of the warp-specialized kernel: packed step rows (64 x 64 and 128 x 128 tiles), one row a
# program with several chunks, 64 x 128 tiles of a small layer, and one row.
SPECIALIZED_CASES = [
    (256, 768, 11, 1, 20),  # packed, 3 chunks, split or not as the planner says
    (512, 768, 11, 1, 20),
    (256, 384, 7, 3, 80),
    (16, 768, 11, 5, 350),  # one row a program, 3 chunks in one program
    (256, 96, 11, 1, 480),  # 64 x 128 tiles, 32 channels a step
    (1, 192, 7, 1, 4200),
    (3, 768, 3, 1, 5),
]


@pytest.mark.parametrize(("batch", "channels", "ksize", "dilation", "tout"), SPECIALIZED_CASES)
@pytest.mark.parametrize("split", [None, False, True])
def test_specialized_kernel_gives_the_triton_kernels_bits(
    batch: int, channels: int, ksize: int, dilation: int, tout: int, split: bool | None
) -> None:
    """The warp-specialized Gluon kernel (``specialized=True``, whatever the tile) gives the Triton kernel's
    bits at the same launch: with a bias, a residual, a residual in two parts, and split-K."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w = layer_case(batch, channels, ksize, dilation, tout)
    x = x * torch.logspace(-2, 2, batch, device="cuda")[:, None, None]
    packed, inverse = pack_split_weight_f16(w)
    args = (*tc.split_f16(x), packed[0], packed[1], inverse, torch.randn(channels, device="cuda"), dilation)
    residual = torch.randn(batch, channels, tout, device="cuda")
    kept = tout // 3
    with torch.inference_mode():
        for extra in (
            {},
            {"residual": residual},
            {"residual": residual[..., kept:], "residual_head": residual[..., :kept]},
        ):
            triton_out = tc.conv1d_f16x3(*args, split=split, specialized=False, **extra)
            gluon_out = tc.conv1d_f16x3(*args, split=split, specialized=True, **extra)
            assert torch.equal(gluon_out, triton_out), sorted(extra)


# auk-24k's small layers at a 4-frame step (256 rows) and in a whole clip (one row), and a 1-channel output
SMALL_LAYERS = [(256, 24, 11, 1, 1920), (256, 48, 7, 3, 960), (256, 96, 11, 5, 480), (1, 96, 3, 1, 8400)]


@pytest.mark.parametrize(("batch", "channels", "ksize", "dilation", "tout"), SMALL_LAYERS)
def test_channels_along_n_are_accurate_and_independent_of_batch_and_tile(
    batch: int, channels: int, ksize: int, dilation: int, tout: int
) -> None:
    """With the output channels along the GEMM's N, a small layer gives the other orientation's bits (the
    tensor cores sum an instruction's products alike either way round), whatever its batch or tile."""
    from streamdec.kernels import _triton_conv_f16 as tc

    x, w = layer_case(batch, channels, ksize, dilation, tout)
    packed, inverse = pack_split_weight_f16(w)
    bias = torch.randn(channels, device="cuda")
    hi, lo, x_inv = tc.split_f16(x)
    weights = (packed[0], packed[1], inverse, bias, dilation)
    with torch.inference_mode():
        along_n = tc.conv1d_f16x3(hi, lo, x_inv, *weights, channels_n=True)
        along_m = tc.conv1d_f16x3(hi, lo, x_inv, *weights, channels_n=False)
        tiled = tc.conv1d_f16x3(
            hi, lo, x_inv, *weights, channels_n=True, tiles=f16_launch.Tiles(64, 128, 4, 2)
        )
        alone = tc.conv1d_f16x3(hi[-1:], lo[-1:], x_inv[-1:], *weights, channels_n=True)
        single = tc.conv1d_f16x3(hi, lo, x_inv, *weights, channels_n=True, products=1)
    exact = F.conv1d(x.double(), w.double(), bias.double(), dilation=dilation)
    err_n, err_m = rel_error(along_n[-1], exact[-1]), rel_error(along_m[-1], exact[-1])
    print(
        f"C={channels} B={batch}: along N {err_n:.2e}, along M {err_m:.2e}, same bits {torch.equal(along_n, along_m)}"
    )
    assert err_n <= 2e-6
    assert torch.equal(along_n, along_m)
    assert torch.equal(tiled, along_n) and torch.equal(alone[0], along_n[-1])
    assert rel_error(single[-1], exact[-1]) <= 2e-3
