"""CPU tests of the fused-kernel package: the polyphase oracle, the custom op's plumbing, dispatch rules,
and the Triton kernels under the interpreter (``TRITON_INTERPRET=1`` with Triton installed) and compiled
offline for sm_90.

The Triton kernels' GPU runs are in ``tests/gpu/test_kernels_cuda.py``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import streamdec.kernels.alias_free as af
from streamdec.codecs import load_codec
from streamdec.codecs.layers import AliasFreeActivation
from streamdec.errors import DTypeError, ShapeError
from streamdec.kernels import fused_supported, polyphase_reference, set_fused
from streamdec.kernels.rows import live_rows
from support.activations import random_activation
from support.conv_cases import UnwrittenIsNan, assert_padding_rows_skipped, needs_interpreter


def _op_args(act: AliasFreeActivation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return act.filter, act.act.alpha_exp, act.act.beta_inv


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 6),
    length=st.integers(1, 80),
    scale=st.floats(0.1, 8.0),
    seed=st.integers(0, 2**16),
)
def test_polyphase_oracle_equals_reference_layer(
    batch: int, channels: int, length: int, scale: float, seed: int
) -> None:
    """The kernels' polyphase index arithmetic (run here in PyTorch) equals the layer, edges included."""
    act = random_activation(channels, seed)
    x = torch.randn(batch, channels, length, generator=torch.Generator().manual_seed(seed + 1)) * scale
    with torch.no_grad():
        want = act(x)
    got = polyphase_reference(x, *_op_args(act))
    assert (got - want).abs().max().item() <= 1e-5


def test_custom_op_on_cpu_equals_layer() -> None:
    act = random_activation(5, 3)
    x = torch.randn(2, 5, 37)
    out = torch.ops.streamdec.alias_free_activation(x, *_op_args(act))
    assert out.shape == x.shape and out.is_contiguous()
    assert (out - act(x)).abs().max().item() <= 1e-5


def test_peak_op_gives_the_activation_and_its_row_peaks() -> None:
    """The variant for a float16 split conv: same output, plus each batch row's max |y| as float32 bits."""
    act = random_activation(5, 4)
    x = torch.randn(3, 5, 41) * torch.tensor([1e-3, 1.0, 1e3])[:, None, None]
    out, peak = torch.ops.streamdec.alias_free_activation_peak(x, *_op_args(act))
    assert torch.equal(out, torch.ops.streamdec.alias_free_activation(x, *_op_args(act)))
    assert peak.dtype == torch.int32 and torch.equal(peak.view(torch.float32), out.abs().amax(dim=(1, 2)))
    # opcheck: schema, fake implementation (what torch.compile traces) and registrations agree
    torch.library.opcheck(torch.ops.streamdec.alias_free_activation_peak.default, (x, *_op_args(act)))


def test_custom_op_opcheck_cpu() -> None:
    """Schema, fake (meta) implementation and dispatcher registrations agree (torch.library.opcheck)."""
    act = random_activation(4, 5)
    torch.library.opcheck(
        torch.ops.streamdec.alias_free_activation.default, (torch.randn(3, 4, 29), *_op_args(act))
    )


def test_fake_impl_traces_cuda_shapes_without_a_gpu() -> None:
    """Under fake tensors (what torch.compile traces with) a CUDA input maps to a CUDA output of its shape."""
    with FakeTensorMode():
        x = torch.empty(2, 3, 50, device="cuda")
        filt, a, b = (
            torch.empty(1, 1, 12, device="cuda"),
            torch.empty(3, device="cuda"),
            torch.empty(3, device="cuda"),
        )
        out = torch.ops.streamdec.alias_free_activation(x, filt, a, b)
        assert out.shape == (2, 3, 50) and out.device.type == "cuda" and out.dtype == torch.float32


def test_compile_traces_the_op() -> None:
    """torch.compile (aot_eager backend: tracing only) keeps the op as one node and matches eager."""
    act = random_activation(3, 11)
    filt, a, b = _op_args(act)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.streamdec.alias_free_activation(x, filt, a, b) * 2.0

    x = torch.randn(2, 3, 40)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), fn(x))


@pytest.mark.parametrize(
    ("shape", "error"),
    [((2, 3), ShapeError), ((1, 3, 0), ShapeError), ((1, 4, 8), ShapeError)],
)
def test_op_rejects_bad_shapes(shape: tuple[int, ...], error: type[Exception]) -> None:
    act = random_activation(3, 1)
    with pytest.raises(error):
        torch.ops.streamdec.alias_free_activation(torch.randn(shape), *_op_args(act))


def test_op_rejects_non_float32() -> None:
    act = random_activation(3, 1)
    filt, a, b = _op_args(act)
    with pytest.raises(DTypeError):
        torch.ops.streamdec.alias_free_activation(torch.randn(1, 3, 8, dtype=torch.float64), filt, a, b)
    with pytest.raises(ShapeError):
        torch.ops.streamdec.alias_free_activation(torch.randn(1, 3, 8), filt[..., :11], a, b)


def test_dispatch_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only float32 rank-3 CUDA inputs qualify, and the environment switch or a missing Triton vetoes."""
    assert not fused_supported(torch.randn(1, 2, 8))  # CPU
    with FakeTensorMode():
        cuda32 = torch.empty(1, 2, 8, device="cuda")
        monkeypatch.setattr(af, "HAS_TRITON", True)
        assert fused_supported(cuda32)
        assert not fused_supported(torch.empty(1, 2, 8, device="cuda", dtype=torch.float64))
        assert not fused_supported(torch.empty(1, 2, 8, device="cuda", dtype=torch.bfloat16))
        assert not fused_supported(torch.empty(2, 8, device="cuda"))
        monkeypatch.setattr(af, "ENV_DISABLED", True)
        assert not fused_supported(cuda32)
        monkeypatch.setattr(af, "ENV_DISABLED", False)
        monkeypatch.setattr(af, "HAS_TRITON", False)
        assert not fused_supported(cuda32)


def test_set_fused_reaches_every_activation() -> None:
    codec = load_codec("tiny", device="cpu")
    n_act = sum(isinstance(m, AliasFreeActivation) for m in codec.modules())
    assert set_fused(codec, False) == n_act > 0
    assert all(not m.use_fused for m in codec.modules() if isinstance(m, AliasFreeActivation))
    assert set_fused(codec, True) == n_act


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_cpu_layer_never_calls_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the reference path runs unchanged, whatever the flags say."""
    monkeypatch.setattr(af, "HAS_TRITON", True)
    codec = load_codec("tiny", device="cpu")
    set_fused(codec, True)
    z = torch.randn(1, 6, codec.latent_dim)
    with _OpRecorder() as rec:
        audio = codec.decode(z)
    assert audio.shape == (1, codec.channels, 6 * codec.hop_size)
    assert not any("alias_free" in name for name in rec.names)
    assert any("conv_transpose1d" in name or "convolution" in name for name in rec.names)


@settings(max_examples=30, deadline=None)
@given(
    kept=st.integers(0, 12), length=st.integers(1, 40), start=st.integers(0, 30), seed=st.integers(0, 2**16)
)
def test_window_op_is_the_activation_of_history_and_input_cropped(
    kept: int, length: int, start: int, seed: int
) -> None:
    """``alias_free_activation_window`` = the activation of ``cat(head, x)``, outputs ``start ..``; the
    layer's ``window`` gives the same where the op does not run; a bad window is a typed error."""
    act = random_activation(3, seed)
    gen = torch.Generator().manual_seed(seed)
    head, x = torch.randn(2, 3, kept, generator=gen), torch.randn(2, 3, length, generator=gen)
    whole = act(torch.cat([head, x], -1))
    count = kept + length - start
    if count < 1 or 0 < start < 5:
        with pytest.raises(ShapeError):
            torch.ops.streamdec.alias_free_activation_window(
                head, x, *_op_args(act), start, max(count, 1), None, None
            )
        return
    out = torch.ops.streamdec.alias_free_activation_window(head, x, *_op_args(act), start, count, None, None)
    assert out.shape == (2, 3, count)
    assert (out - whole[..., start:]).abs().max().item() <= 1e-5
    assert torch.equal(act.window(head, x, start, count), whole[..., start:])


def test_window_op_opcheck_cpu() -> None:
    act = random_activation(4, 6)
    head, x = torch.randn(2, 4, 10), torch.randn(2, 4, 20)
    torch.library.opcheck(
        torch.ops.streamdec.alias_free_activation_window.default, (head, x, *_op_args(act), 8, 21, None, None)
    )
    # with a state to keep (a mutated argument): the op writes each row's last inputs to its slot
    pool, slots = torch.zeros(3, 4, 10), torch.tensor([2, 0])
    torch.library.opcheck(
        torch.ops.streamdec.alias_free_activation_window.default,
        (head, x, *_op_args(act), 8, 21, pool, slots),
    )
    torch.ops.streamdec.alias_free_activation_window(head, x, *_op_args(act), 8, 21, pool, slots)
    assert torch.equal(pool[[2, 0]], x[..., -10:]) and not pool[1].any()


@settings(max_examples=20, deadline=None)
@given(
    kept=st.integers(0, 12),
    before_len=st.integers(0, 9),
    length=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_window_peak_op_gives_the_window_and_the_peaks_of_history_and_window(
    kept: int, before_len: int, length: int, seed: int
) -> None:
    """``alias_free_activation_window_peak`` = the window op's bits, and per batch row the float32 bits of
    the largest magnitude in ``cat(before, window)`` (the next conv's split input); a history of another
    batch is a typed error."""
    act = random_activation(3, seed)
    gen = torch.Generator().manual_seed(seed)
    head, x = torch.randn(2, 3, kept, generator=gen), torch.randn(2, 3, length, generator=gen)
    before = torch.randn(2, 3, before_len, generator=gen) * torch.tensor([1e3, 1e-3])[:, None, None]
    start = 8 if kept + length > 8 else 0
    count = kept + length - start
    window = torch.ops.streamdec.alias_free_activation_window(
        head, x, *_op_args(act), start, count, None, None
    )
    for history in (before, None):
        out, peak = torch.ops.streamdec.alias_free_activation_window_peak(
            head, x, *_op_args(act), start, count, history, None, None
        )
        assert torch.equal(out, window)
        rows = torch.cat([window, before], -1) if history is not None else window
        assert torch.equal(peak.view(torch.float32), rows.abs().amax(dim=(1, 2)))
    with pytest.raises(ShapeError):
        torch.ops.streamdec.alias_free_activation_window_peak(
            head, x, *_op_args(act), start, count, torch.cat([before, before]), None, None
        )


def test_window_peak_op_opcheck_cpu() -> None:
    act = random_activation(4, 6)
    head, x, before = torch.randn(2, 4, 10), torch.randn(2, 4, 20), torch.randn(2, 4, 6)
    for history in (before, None):
        torch.library.opcheck(
            torch.ops.streamdec.alias_free_activation_window_peak.default,
            (head, x, *_op_args(act), 8, 21, history, None, None),
        )


def test_layer_window_with_peak_hands_over_nothing_where_the_op_does_not_run() -> None:
    """On the CPU the layer's window_with_peak is its window, with no peaks (the split takes its own)."""
    act = random_activation(3, 1)
    head, x = torch.randn(2, 3, 10), torch.randn(2, 3, 12)
    out, peak = act.window_with_peak(head, x, 8, 14, torch.randn(2, 3, 4))
    assert peak is None
    assert torch.equal(out, act.window(head, x, 8, 14))


# -- the Triton kernels, under the interpreter and compiled offline -------------------------------------


def _launch(
    variant: str,
    act: AliasFreeActivation,
    x: torch.Tensor,
    head: torch.Tensor | None,
    start: int,
    before: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output (NaN-poisoned first) and its batch rows' peak bits (``before``'s folded in),
    ``x`` ``[B, C, T]``."""
    from streamdec.kernels import _triton_alias_free as tk

    batch, channels, length = x.shape
    count = (0 if head is None else head.shape[-1]) + length - start
    out = torch.full((batch * channels, count), float("nan"))
    peak = torch.zeros(batch, dtype=torch.int32)
    args = (
        x.reshape(batch * channels, length),
        act.filter.view(af.TAPS),
        act.act.alpha_exp,
        act.act.beta_inv,
    )
    tk.launch_blocked(*args, out, peak, head, start, variant=variant, before=before)
    return out.view(batch, channels, count), peak


@needs_interpreter
@pytest.mark.timeout(900)  # about two minutes of interpreted kernels on two shared cores
@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 12),
    length=st.one_of(st.integers(1, 300), st.integers(900, 1200)),
    kept=st.sampled_from([0, 10]),
    start=st.sampled_from([0, 6, 8, 9, 13]),
    pack=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_halo_kernels_give_the_blocked_kernels_bits(
    batch: int, channels: int, length: int, kept: int, start: int, pack: bool, seed: int
) -> None:  # fmt: skip
    """Interpreted, every halo variant (8 or 16 outputs a lane, packed rows or not, every load path) writes
    the blocked kernel's outputs and peaks bit for bit, within 1e-5 of the oracle."""
    from streamdec.kernels import sizing

    start = start if kept or start == 0 else 0
    act = random_activation(channels, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, length, generator=gen) * 3
    head = torch.randn(batch, channels, kept, generator=gen) * 3 if kept else None
    whole = x if head is None else torch.cat([head, x], -1)
    want = polyphase_reference(whole, *_op_args(act))[..., start:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sizing, "PACK_SHORT_ROWS", pack)
        blocked = _launch("blocked", act, x, head, start)
        halos = {variant: _launch(variant, act, x, head, start) for variant in ("halo", "halo8", "halo16")}
    assert (blocked[0] - want).abs().max().item() <= 1e-5
    for variant, (out, peak) in halos.items():
        assert torch.equal(out, blocked[0]), variant
        assert torch.equal(peak, blocked[1]) and torch.equal(
            peak.view(torch.float32), out.abs().amax(dim=(1, 2))
        )


@needs_interpreter
@settings(max_examples=12, deadline=None)
@given(
    length=st.one_of(st.integers(1, 120), st.integers(900, 1000)),
    kept=st.sampled_from([0, 10]),
    pack=st.booleans(),
    live=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_halo_kernel_and_row_peaks_skip_padding_rows(
    length: int, kept: int, pack: bool, live: int, seed: int
) -> None:
    """Inside ``live_rows`` the halo kernel (a history's peak folded in) and the row-peak pass leave the
    batch rows past the count unwritten, and write the real rows' outputs and peaks bit for bit as
    without it."""
    from streamdec.kernels import _triton_alias_free as tk
    from streamdec.kernels import sizing

    act = random_activation(5, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, length, generator=gen) * 3
    head = torch.randn(4, 5, kept, generator=gen) * 3 if kept else None
    start = 8 if kept else 0
    before = torch.randn(4, 5, 6, generator=gen) * 10
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sizing, "PACK_SHORT_ROWS", pack)
        patch.setattr(tk, "torch", UnwrittenIsNan())
        full = _launch("halo", act, x, head, start, before)
        full_peaks = tk.row_peaks(x)
        with live_rows(torch.tensor([live])):
            ours = _launch("halo", act, x, head, start, before)
            peaks = tk.row_peaks(x)
    assert torch.equal(full[1], torch.maximum(tk.row_peaks(before), tk.row_peaks(full[0])))
    assert_padding_rows_skipped(ours[0], full[0], live)
    assert torch.equal(ours[1][:live], full[1][:live]) and not ours[1][live:].any()  # zeroed, never raised
    assert_padding_rows_skipped(peaks, full_peaks, live)


@needs_interpreter
@pytest.mark.timeout(900)
@settings(max_examples=10, deadline=None)
@given(
    length=st.sampled_from([4, 20, 40, 300]),
    kept=st.sampled_from([0, 10]),
    pack=st.booleans(),
    variant=st.sampled_from(["halo", "blocked"]),
    live=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_halo_kernel_writes_each_rows_kept_inputs_to_its_slot(
    length: int, kept: int, pack: bool, variant: str, live: int, seed: int
) -> None:
    """With ``keep`` the window kernel also copies each row's last ``L`` inputs of ``cat(head, x)`` to its
    slot of a pool (packed rows or whole ones; the blocked variant by a pass of its own), as
    ``index_copy_`` of the new state would, without changing an output bit; other slots and other
    layers' columns stay as they were, and rows past the live count write nothing."""
    from streamdec.kernels import _triton_alias_free as tk
    from streamdec.kernels import sizing

    act = random_activation(5, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, length, generator=gen) * 3
    head = torch.randn(3, 5, kept, generator=gen) * 3 if kept else None
    start = 8 if kept else 0
    keep_len = min(10, kept + length)
    flat = torch.randn(5, 2 + 5 * keep_len + 3, generator=gen)
    pool = flat[:, 2 : 2 + 5 * keep_len].view(5, 5, keep_len)
    slots = torch.tensor([4, 0, 2])
    want = flat.clone()
    whole = x if head is None else torch.cat([head, x], -1)
    want[:, 2 : 2 + 5 * keep_len].view(5, 5, keep_len)[slots[:live]] = whole[:live, :, -keep_len:]
    batch, channels = 3, 5
    count = kept + length - start
    args = (
        x.reshape(batch * channels, length),
        act.filter.view(af.TAPS),
        act.act.alpha_exp,
        act.act.beta_inv,
    )
    with pytest.MonkeyPatch.context() as patch, live_rows(torch.tensor([live])):
        patch.setattr(sizing, "PACK_SHORT_ROWS", pack)
        outs = []
        for keep in ((pool, slots), None):
            out = torch.full((batch * channels, count), float("nan"))
            tk.launch_blocked(*args, out, None, head, start, variant=variant, keep=keep)
            outs.append(out.view(batch, channels, count))
    if variant == "blocked":  # no padding rows skipped there: its copy is a torch pass over every row
        want[:, 2 : 2 + 5 * keep_len].view(5, 5, keep_len)[slots] = whole[:, :, -keep_len:]
    assert torch.equal(flat, want)
    assert torch.equal(outs[0][:live], outs[1][:live])


@needs_interpreter
@pytest.mark.parametrize("variant", ["halo8", "halo16"])
def test_halo_kernel_window_from_sample_5(variant: str) -> None:
    """A window starting at 5 (its first output reads S(-1) = S(0)) is right; the blocked kernel, which
    took S(10) there, refuses it."""
    act = random_activation(3, 5)
    x, head = torch.randn(2, 3, 300) * 3, torch.randn(2, 3, 10) * 3
    want = polyphase_reference(torch.cat([head, x], -1), *_op_args(act))[..., 5:]
    out, _ = _launch(variant, act, x, head, 5)
    assert (out - want).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="starting at 5"):
        _launch("blocked", act, x, head, 5)


@pytest.mark.parametrize(
    ("batch", "channels", "count", "k", "packed"),
    [(256, 768, 20, 8, True), (256, 384, 80, 16, True), (256, 192, 240, 16, True), (256, 24, 1920, 16, False),
     (16, 768, 350, 16, False), (16, 24, 33600, 16, False)],
    ids=["step-20", "step-80", "step-240", "step-1920", "decode-350", "decode-33600"],
)  # fmt: skip
def test_halo_plan_for_auk_24k_rows(batch: int, channels: int, count: int, k: int, packed: bool) -> None:
    """Each row gets enough lanes (31 a warp, or its segment less the halo lane) and no whole warp more."""
    tk = pytest.importorskip("streamdec.kernels._triton_alias_free")
    plan = tk.halo_plan(batch, channels, count)
    assert (plan.k, plan.packed) == (k, packed)
    if packed:
        rows_per_program = plan.warps * (32 // plan.seg)
        assert (plan.seg - 1) * k >= count > (plan.seg - 2) * k
        assert plan.grid == (-(-channels // rows_per_program), batch)
    else:
        assert plan.grid[:2] == (channels, batch) and plan.grid[2] == -(-count // (31 * k * plan.warps))


def _ptx_sums(ptx: str) -> Counter[str]:
    """The float expressions a kernel stores, one canonical string each, counted.

    Leaves are loads: ``f<k>`` for the taps (``f_ptr`` plus a constant), ``x`` for any other; moves and
    shuffles are looked through (a shuffled value is the same expression, computed by another lane), a
    select is its second operand (the value away from a row's start, in both kernels' fix-ups), and the two
    factors of a product commute. Two kernels with equal counts round the same products into the same
    FMAs in the same order for every output."""
    defs: dict[str, list[tuple[str, list[str]]]] = {}
    roots: list[str] = []
    for line in ptx.splitlines():
        line = line.strip()
        if m := re.match(r"ld\.param\.\w+\s+(%\w+),\s*\[(\w+)\]", line):
            defs.setdefault(m[1], []).append(("param", [m[2]]))
        elif m := re.match(
            r"(?:@!?%p\d+\s+)?ld\.global\.\S+\s+\{\s*(%\w+)\s*\},\s*\[\s*(%\w+)\s*\+\s*(-?\d+)", line
        ):
            defs.setdefault(m[1], []).append(("ld", [m[2], m[3]]))
        elif m := re.match(r"(?:@!?%p\d+\s+)?st\.(?:shared|global)\S*\s+\[[^\]]*\],\s*\{?([^};]*)\}?;", line):
            roots += [r.strip() for r in m[1].split(",")]
        elif m := re.match(r"([a-z][\w.]*)\s+(%\w+),\s*(.*);", line):
            defs.setdefault(m[2], []).append((m[1], [a.strip() for a in m[3].split(",")]))

    def tap(reg: str) -> int | None:
        op, args = defs[reg][0] if len(defs.get(reg, [])) == 1 else ("", [])
        if op == "param":
            return 0 if args[0].endswith("_param_2") else None  # f_ptr is the third parameter
        if op.startswith("add.s64") and re.fullmatch(r"\d+", args[1]) and (base := tap(args[0])) is not None:
            return base + int(args[1])
        return None

    @functools.cache
    def canon(v: str) -> str:
        if not v.startswith("%"):
            return v
        forms = {one(op, args) for op, args in defs.get(v, [("undefined", [])])}
        return forms.pop() if len(forms) == 1 else "phi{" + "|".join(sorted(forms)) + "}"

    def one(op: str, args: list[str]) -> str:
        if op == "ld":
            offset = tap(args[0])
            return "x" if offset is None else f"f{(offset + int(args[1])) // 4}"
        if op.startswith(("shfl", "mov")):
            return canon(args[0])
        if op.startswith("selp"):
            return canon(args[1])
        parts = [canon(a) for a in args]
        if op.startswith(("fma", "mul")) and op.endswith("f32"):
            parts[:2] = sorted(parts[:2])
        return f"{op}({','.join(parts)})"

    return Counter(hashlib.sha1(canon(r).encode()).hexdigest() for r in roots if "fma" in canon(r))


def _compile_for_sm90(kernel: Any, constants: dict[str, Any], warps: int, tmp_path: Path) -> str:
    """``kernel`` compiled for sm_90a offline (nothing cached): its PTX, checked by ptxas for spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = {"x_ptr", "out_ptr", "f_ptr", "a_ptr", "b_ptr", "head_ptr", "keep_ptr"}
    parameters = inspect.signature(kernel.fn).parameters
    names = list(parameters)
    defaults = {  # constexprs left out take their defaults (as a launch would), never a runtime value
        n: p.default for n, p in parameters.items() if p.default is not inspect.Parameter.empty
    }
    constants = {**defaults, **constants}
    signature = {
        n: "constexpr"
        if n in constants
        else "*i32"
        if n == "peak_ptr"
        else "*i64"
        if n in ("live_ptr", "slots_ptr")
        else "*fp32"
        if n in pointers
        else "i32"
        for n in names
    }
    constexprs = {(names.index(n),): v for n, v in constants.items()}
    source = ASTSource(kernel, signature, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = compiled.asm["ptx"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if ptxas.exists():
        (tmp_path / "k.ptx").write_text(ptx)
        report = subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
        assert " 0 bytes spill stores" in report, report
    return ptx


@pytest.mark.timeout(900)
def test_halo_kernel_compiles_to_the_blocked_kernels_arithmetic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled for sm_90a without a GPU, without spills, the halo kernel (16 outputs a lane, a head and
    peaks; 8 packed; skipping padding rows or not, keeping a state or not) stores the blocked kernel's expressions: its 8 outputs' two contraction patterns (a
    block's first output pairs its products differently), 2 or 1 to 14 or 7 in a lane of 16 or 8."""
    triton = pytest.importorskip("triton")
    if triton.knobs.runtime.interpret:  # the kernels were then built for the interpreter (tl.floor)
        pytest.skip("compiles for sm_90 only without TRITON_INTERPRET=1")
    from streamdec.kernels import _triton_alias_free as tk

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile, never load a cached binary
    v3 = {"BLOCK": 128, "K": 8, "ROW_LANES": 128, "WITH_PEAK": True, "HAS_HEAD": True}
    blocked = _ptx_sums(_compile_for_sm90(tk._af_blocked_kernel, v3, 4, tmp_path))
    assert sorted(blocked.values()) == [1, 7]
    for k, warps, seg, packed in ((16, 1, 32, False), (8, 4, 4, True)):
        constants = {
            "K": k,
            "WARPS": warps,
            "SEG": seg,
            "PACKED": packed,
            "WITH_PEAK": True,
            "HAS_HEAD": True,
        }
        halo = _ptx_sums(_compile_for_sm90(tk._af_halo_kernel, constants, warps, tmp_path))
        assert halo == Counter({h: n * k // 8 for h, n in blocked.items()}), (k, packed)
        # Skipping padding rows (streamdec.kernels.rows) adds an early exit, not arithmetic.
        live = {**constants, "HAS_LIVE": True}
        assert _ptx_sums(_compile_for_sm90(tk._af_halo_kernel, live, warps, tmp_path)) == halo
        # Writing the kept inputs to a slot (a stateful step's new state) copies, and computes nothing new.
        keep = {**live, "KEEP": True, "KEEP_ROWS": 32 if packed else 2, "KEEP_BLOCK": 16}
        assert _ptx_sums(_compile_for_sm90(tk._af_halo_kernel, keep, warps, tmp_path)) == halo
