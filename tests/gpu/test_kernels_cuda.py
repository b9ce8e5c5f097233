"""GPU tests of the fused alias-free activation (Triton): kernels vs the reference path, whole decodes.

Reference: the layer's own PyTorch path (``use_fused=False``). TF32 is irrelevant here (no matmuls in the
activation); whole-codec comparisons run both decodes with the same convolution settings.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

import streamdec.kernels.alias_free as af
from streamdec.codecs import load_codec
from streamdec.codecs.layers import AliasFreeActivation
from streamdec.engine.graphs import static_forward
from streamdec.kernels import set_fused, sizing
from support.activations import random_activation
from support.cuda_checks import snr_db

pytestmark = pytest.mark.cuda


def _reference(act: AliasFreeActivation, x: torch.Tensor) -> torch.Tensor:
    act.use_fused = False
    try:
        with torch.no_grad():
            return act(x)
    finally:
        act.use_fused = True


def _shapes() -> list[tuple[int, int, int]]:
    rng = random.Random(2026)
    edge = [1, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 119, 120, 121, 127, 128, 129, 1015, 1016, 1017, 1024, 1025]
    shapes = [(1, 1, t) for t in edge] + [(2, 3, t) for t in edge[::3]]
    shapes += [
        (rng.randint(1, 8), rng.choice([1, 3, 24, 48, 96, 192]), rng.randint(1, 5000)) for _ in range(40)
    ]
    shapes += [(16, 24, 33600), (16, 768, 350), (3, 1536, 71)]
    return shapes


@pytest.mark.parametrize("variant", ["halo", "halo8", "halo16", "blocked"])
def test_kernel_equals_reference_poisoned_output(variant: str) -> None:
    """Many batches, channel counts and lengths; the output buffer starts as NaN and must be overwritten.

    The kernel and the reference sum the same taps in different orders, each rounding in float32, so they
    may differ by a few ulps of the output: within 1e-5, or 4 ulps where that is more. Inputs scaled by
    9.5 give outputs up to about 44, where an ulp is 3.8e-6 and 1e-5 only 2.6 of them. Seeded, so a
    failure can be reproduced."""
    from streamdec.kernels import _triton_alias_free as tk

    gen = torch.Generator(device="cuda").manual_seed(2026)
    worst = 0.0
    for i, (batch, channels, length) in enumerate(_shapes()):
        act = random_activation(channels, i, "cuda")
        x = torch.randn(batch, channels, length, device="cuda", generator=gen) * (0.5 + 3.0 * (i % 4))
        want = _reference(act, x)
        flat = x.view(batch * channels, length)
        out = torch.full_like(flat, float("nan"))
        tk.launch_blocked(
            flat, act.filter.view(af.TAPS), act.act.alpha_exp, act.act.beta_inv, out, variant=variant
        )
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), (batch, channels, length)
        diff = (out.view_as(x) - want).abs()
        size = want.abs()
        ulp = torch.nextafter(size, torch.full_like(size, float("inf"))) - size
        over = diff - torch.clamp(4 * ulp, min=1e-5)
        at = int(over.argmax())
        assert over.flatten()[at] <= 0, (
            batch,
            channels,
            length,
            diff.flatten()[at].item(),
            want.flatten()[at].item(),
        )
        worst = max(worst, diff.max().item())
    print(f"worst max abs error {worst:.3g}")


@pytest.mark.filterwarnings("ignore")  # opcheck's own internals may warn on some torch versions
def test_peak_variant_gives_the_same_output_and_its_row_peaks() -> None:
    """The op a float16 split conv follows: the activation's bits, plus each batch row's max |y| bits."""
    act = random_activation(96, 7, "cuda")
    x = torch.randn(16, 96, 4203, device="cuda") * torch.logspace(-3, 3, 16, device="cuda")[:, None, None]
    args = (act.filter, act.act.alpha_exp, act.act.beta_inv)
    with torch.inference_mode():
        alone = torch.ops.streamdec.alias_free_activation(x, *args)
        out, peak = torch.ops.streamdec.alias_free_activation_peak(x, *args)
    assert torch.equal(out, alone)
    assert torch.equal(peak.view(torch.float32), alone.abs().amax(dim=(1, 2)))


def test_op_and_layer_use_the_kernel() -> None:
    act = random_activation(48, 1, "cuda")
    x = torch.randn(4, 48, 777, device="cuda")
    with torch.no_grad():
        fused = act(x)
    assert (fused - _reference(act, x)).abs().max().item() <= 1e-5
    torch.library.opcheck(
        torch.ops.streamdec.alias_free_activation.default,
        (x, act.filter, act.act.alpha_exp, act.act.beta_inv),
    )


def test_env_switch_and_bf16_keep_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """STREAMDEC_NO_FUSED (read at import) and bf16 inputs take the reference path: the op is never called."""
    act = random_activation(8, 2, "cuda")
    x = torch.randn(2, 8, 300, device="cuda")
    from streamdec.kernels import _triton_alias_free as tk

    def refuse(*args: object) -> None:
        raise AssertionError("the fused kernel was launched")

    monkeypatch.setattr(tk, "launch_blocked", refuse)
    monkeypatch.setattr(af, "ENV_DISABLED", True)
    with torch.no_grad():
        assert (act(x) - _reference(act, x)).abs().max().item() <= 1e-6
    monkeypatch.setattr(af, "ENV_DISABLED", False)
    act = act.to(torch.bfloat16)
    act.refresh_cache()
    xb = x.to(torch.bfloat16)
    assert not af.fused_supported(xb)
    with torch.no_grad():
        assert act(xb).dtype == torch.bfloat16


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """Full-fp32 convolutions: with TF32 on, a 1e-7 change can flip a TF32 rounding and grow to ~1e-3."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_whole_auk_decode_with_and_without_kernel(no_tf32: None) -> None:
    """auk-24k, random weights and latents, fp32 convolutions: within 1e-4 max abs, at least 70 dB SNR."""
    codec = load_codec("auk-24k", device="cuda", dtype=torch.float32)
    z = torch.randn(2, 70, codec.latent_dim, generator=torch.Generator().manual_seed(9))
    set_fused(codec, False)
    ref = codec.decode(z)
    set_fused(codec, True)
    out = codec.decode(z)
    err, snr = (out - ref).abs().max().item(), snr_db(ref, out)
    print(f"auk-24k: max abs {err:.3g}, SNR {snr:.1f} dB")
    assert err <= 1e-4 and snr >= 70.0


@pytest.mark.filterwarnings("ignore")  # Inductor/Triton internals may warn; not ours
def test_compiled_and_captured_activation_matches_eager() -> None:
    """torch.compile traces the op, a CUDA graph captures the compiled call, replays track new inputs."""
    act = random_activation(24, 4, "cuda")
    x = torch.randn(2, 24, 2000, device="cuda")
    compiled = torch.compile(lambda t: act(t) + 1.0, fullgraph=True)
    with torch.no_grad():
        compiled(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            compiled(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(x)
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            assert (out - (_reference(act, x) + 1.0)).abs().max().item() <= 1e-5


def test_plain_graph_of_tiny_codec_equals_eager_bitwise() -> None:
    codec = load_codec("tiny", device="cuda", dtype=torch.float32)
    forward = static_forward(codec)
    x = torch.randn(3, 40, codec.latent_dim, device="cuda")
    with torch.inference_mode():
        eager = forward(x)
        graph = torch.cuda.CUDAGraph()
        forward(x)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out = forward(x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("length", [7, 13, 30, 61, 250])
def test_packed_short_rows_give_the_same_bits(length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows shorter than a warp's outputs packed several to a program: every output and every batch row's
    peak equal the one-row-per-program launch's, bit for bit."""
    from streamdec.kernels import _triton_alias_free as tk

    act = random_activation(96, length, "cuda")
    x = torch.randn(33 * 96, length, device="cuda") * 3
    results = []
    for pack in (False, True):
        monkeypatch.setattr(sizing, "PACK_SHORT_ROWS", pack)
        out = torch.full_like(x, float("nan"))
        peak = torch.zeros(33, dtype=torch.int32, device="cuda")
        tk.launch_blocked(x, act.filter.view(af.TAPS), act.act.alpha_exp, act.act.beta_inv, out, peak)
        results.append((out, peak))
    (out0, peak0), (out1, peak1) = results
    assert torch.isfinite(out1).all() and torch.equal(out0, out1) and torch.equal(peak0, peak1)


@pytest.mark.parametrize(
    ("kept", "length", "start"), [(10, 20, 8), (10, 4, 0), (10, 80, 9), (10, 1280, 8), (0, 37, 0)]
)
def test_window_reads_history_in_place_and_keeps_only_its_outputs(kept: int, length: int, start: int) -> None:
    """The windowed op equals the whole activation of ``cat(head, x)``, cropped: bit for bit where the
    window keeps the whole row's 8-output lane blocks, and within the kernel's 1e-5 bound where it starts
    between them (each output is the same sum, but its place in a lane's block decides which products
    the compiler fuses into FMAs)."""
    act = random_activation(48, kept + length, "cuda")
    head = torch.randn(64, 48, kept, device="cuda") * 2
    x = torch.randn(64, 48, length, device="cuda") * 2
    count = kept + length - start - 1
    whole = torch.ops.streamdec.alias_free_activation(
        torch.cat([head, x], -1), act.filter, act.act.alpha_exp, act.act.beta_inv
    )
    window = torch.ops.streamdec.alias_free_activation_window(
        head, x, act.filter, act.act.alpha_exp, act.act.beta_inv, start, count, None, None
    )
    if start % 8 == 0:
        assert torch.equal(window, whole[..., start : start + count])
    else:
        assert (window - whole[..., start : start + count]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("before_len", [0, 6, 40])
def test_window_with_peak_gives_the_window_and_the_peaks_of_history_and_window(before_len: int) -> None:
    """``alias_free_activation_window_peak``: the window op's bits, and each batch row's peak over the
    next conv's history and the window, with heads whose batch rows lie apart (gathered slot-major)."""
    act = random_activation(48, 40, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = torch.randn(64, 48 * (10 + before_len) + 7, device="cuda", generator=gen)
    rows = rows * torch.logspace(-3, 3, 64, device="cuda")[:, None]
    head = rows[:, : 48 * 10].view(64, 48, 10)  # batch rows 48 * (10 + before_len) + 7 apart
    before = rows[:, 48 * 10 : 48 * (10 + before_len)].view(64, 48, before_len)
    x = torch.randn(64, 48, 20, device="cuda", generator=gen)
    args = (act.filter, act.act.alpha_exp, act.act.beta_inv, 8, 22)
    want = torch.ops.streamdec.alias_free_activation_window(head.contiguous(), x, *args, None, None)
    out, peak = torch.ops.streamdec.alias_free_activation_window_peak(head, x, *args, before, None, None)
    assert torch.equal(out, want)
    truth = torch.cat([before.reshape(64, -1), want.reshape(64, -1)], 1).abs().amax(1)
    assert torch.equal(peak.view(torch.float32), truth)


def _auk_rows() -> list[tuple[int, int, int, int, int]]:
    """``(batch, channels, x length, head length, start)``: auk-24k's activations in a 256 x 4 step (windows
    after 10 kept samples) and a 16 x 70 decode, and edges around them."""
    step = [(256, 768, 20), (256, 384, 80), (256, 192, 240), (256, 96, 480), (256, 48, 960), (256, 24, 1920)]
    whole = [(16, 768, 350), (16, 384, 1400), (16, 192, 4200), (16, 24, 33600)]
    edges = [(3, 5, t, 10, s) for t in (1, 2, 7, 30, 230, 231, 486, 487, 1000) for s in (5, 6, 8, 9)]
    return [(b, c, t, 10, 8) for b, c, t in step] + [(b, c, t, 0, 0) for b, c, t in whole] + edges


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize(("batch", "channels", "length", "kept", "start"), _auk_rows())
def test_halo_kernels_give_the_blocked_kernels_bits(
    batch: int, channels: int, length: int, kept: int, start: int, pack: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every halo variant writes the blocked kernel's outputs and row peaks bit for bit, with a head read
    in place (its batch rows apart, as a gathered state) or none, packed or not; where the blocked kernel
    refuses a window (from sample 5) they are within 1e-5 of the oracle."""
    from streamdec.kernels import _triton_alias_free as tk

    monkeypatch.setattr(sizing, "PACK_SHORT_ROWS", pack)
    act = random_activation(channels, length, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(length + start)
    x = torch.randn(batch, channels, length, device="cuda", generator=gen) * 3
    states = torch.randn(batch, channels * kept + 7, device="cuda", generator=gen) * 3
    head = states[:, : channels * kept].view(batch, channels, kept) if kept else None
    count = kept + length - start
    args = (x.view(batch * channels, length), act.filter.view(af.TAPS), act.act.alpha_exp, act.act.beta_inv)
    results = {}
    for variant in ("blocked", "halo", "halo8", "halo16"):
        if variant == "blocked" and start == 5:
            continue
        out = torch.full((batch * channels, count), float("nan"), device="cuda")
        peak = torch.zeros(batch, dtype=torch.int32, device="cuda")
        tk.launch_blocked(*args, out, peak, head, start, variant=variant)
        results[variant] = (out, peak)
    if start == 5:
        whole = torch.cat([head, x], -1) if head is not None else x
        want = af.polyphase_reference(whole, act.filter, act.act.alpha_exp, act.act.beta_inv)[..., start:]
        for out, _ in results.values():
            assert (out.view_as(want) - want).abs().max().item() <= 1e-5
        return
    ref_out, ref_peak = results["blocked"]
    assert torch.isfinite(ref_out).all()
    for variant, (out, peak) in results.items():
        assert torch.equal(out, ref_out), variant
        assert torch.equal(peak, ref_peak), variant
