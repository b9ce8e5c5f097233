"""CPU tests of the fused-kernel package: the polyphase oracle, the custom op's plumbing, dispatch rules.

The Triton kernels themselves run in ``tests/gpu/test_kernels_cuda.py`` (GPU only).
"""

from __future__ import annotations

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
from support.activations import random_activation


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
            torch.ops.streamdec.alias_free_activation_window(head, x, *_op_args(act), start, max(count, 1))
        return
    out = torch.ops.streamdec.alias_free_activation_window(head, x, *_op_args(act), start, count)
    assert out.shape == (2, 3, count)
    assert (out - whole[..., start:]).abs().max().item() <= 1e-5
    assert torch.equal(act.window(head, x, start, count), whole[..., start:])


def test_window_op_opcheck_cpu() -> None:
    act = random_activation(4, 6)
    head, x = torch.randn(2, 4, 10), torch.randn(2, 4, 20)
    torch.library.opcheck(
        torch.ops.streamdec.alias_free_activation_window.default, (head, x, *_op_args(act), 8, 21)
    )


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
    window = torch.ops.streamdec.alias_free_activation_window(head, x, *_op_args(act), start, count)
    for history in (before, None):
        out, peak = torch.ops.streamdec.alias_free_activation_window_peak(
            head, x, *_op_args(act), start, count, history
        )
        assert torch.equal(out, window)
        rows = torch.cat([window, before], -1) if history is not None else window
        assert torch.equal(peak.view(torch.float32), rows.abs().amax(dim=(1, 2)))
    with pytest.raises(ShapeError):
        torch.ops.streamdec.alias_free_activation_window_peak(
            head, x, *_op_args(act), start, count, torch.cat([before, before])
        )


def test_window_peak_op_opcheck_cpu() -> None:
    act = random_activation(4, 6)
    head, x, before = torch.randn(2, 4, 10), torch.randn(2, 4, 20), torch.randn(2, 4, 6)
    for history in (before, None):
        torch.library.opcheck(
            torch.ops.streamdec.alias_free_activation_window_peak.default,
            (head, x, *_op_args(act), 8, 21, history),
        )


def test_layer_window_with_peak_hands_over_nothing_where_the_op_does_not_run() -> None:
    """On the CPU the layer's window_with_peak is its window, with no peaks (the split takes its own)."""
    act = random_activation(3, 1)
    head, x = torch.randn(2, 3, 10), torch.randn(2, 3, 12)
    out, peak = act.window_with_peak(head, x, 8, 14, torch.randn(2, 3, 4))
    assert peak is None
    assert torch.equal(out, act.window(head, x, 8, 14))
