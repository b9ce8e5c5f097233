"""The split-TF32 conv op on the CPU: its reference path, fake shapes, errors and layer routing.

The Triton kernel itself runs here only under the Triton interpreter (``TRITON_INTERPRET=1`` with Triton
installed; CI has neither, so it skips): that checks its indexing, masking and per-step accumulation against float64,
not its speed or its tensor-core rounding. The GPU checks are in ``tests/test_kernels_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from streamdec.codecs import load_codec
from streamdec.codecs.layers import CausalConvTranspose1d, PaddedConv1d, polyphase_weight
from streamdec.errors import DTypeError, ShapeError
from streamdec.kernels.conv import conv1d_split_tf32, split_conv1d
from streamdec.kernels.split import pack_split_weight, split_tf32
from support.conv_cases import conv_case, conv_shapes, count_calls, needs_interpreter, relative_error
from support.split_routing import assert_tiny_decodes_through, route_cpu_through_split


@settings(max_examples=40, deadline=None)
@given(conv_shapes)
def test_op_reference_path_is_the_convolution(p: dict[str, int]) -> None:
    x, w, bias = conv_case(p)
    packed = pack_split_weight(w)
    out = split_conv1d(x, packed, bias, p["dilation"])
    want = F.conv1d(x, w, bias, dilation=p["dilation"])
    assert out.shape == want.shape == (p["batch"], p["cout"], p["tout"])
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)


def test_fake_implementation_gives_the_shape() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 8, 100)
        packed = torch.empty(2, 5, 16, 8)
        out = torch.ops.streamdec.conv1d_split_tf32(x, x, packed[0], packed[1], None, 3)
    assert out.shape == (2, 16, 100 - 4 * 3)


def test_bad_inputs_are_typed_errors() -> None:
    x, w, _ = conv_case(
        {"batch": 1, "cin": 4, "cout": 6, "ksize": 3, "dilation": 1, "tout": 10, "bias": 0, "seed": 0}
    )
    packed = pack_split_weight(w)
    with pytest.raises(ShapeError, match="channels"):
        split_conv1d(x[:, :3], packed, None, 1)
    with pytest.raises(ShapeError, match="cannot hold"):
        split_conv1d(x[..., :2], packed, None, 1)
    with pytest.raises(ShapeError, match="one shape"):
        conv1d_split_tf32(x, x[..., 1:], packed[0], packed[1], None, 1)
    with pytest.raises(DTypeError, match="float32 x"):
        split_conv1d(x.double(), packed, None, 1)
    with pytest.raises(DTypeError, match="float32 w_lo"):
        conv1d_split_tf32(x, x, packed[0], packed[1].double(), None, 1)


def test_tf32x3_layers_route_through_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the kernel on, tf32x3 conv layers (transposed ones as polyphase convs) call the op; same decode."""
    codec = load_codec("tiny")
    z = torch.randn(1, 24, codec.latent_dim, generator=torch.Generator().manual_seed(1))
    plain = codec.decode(z)
    route_cpu_through_split(monkeypatch)
    codec.precision = "tf32x3"
    convs = [m for m in codec.modules() if isinstance(m, PaddedConv1d | CausalConvTranspose1d)]
    assert all(m.packed_split is not None and m.split_weight is None for m in convs)
    calls = count_calls(monkeypatch, "conv1d_split_tf32")
    routed = codec.decode(z)
    assert len(calls) == len(convs)  # every conv layer once: tiny decodes each layer once per call
    torch.testing.assert_close(routed, plain, atol=1e-5, rtol=0)


@settings(max_examples=40, deadline=None)
@given(
    cin=st.integers(1, 9),
    cout=st.integers(1, 9),
    stride=st.integers(1, 6),
    taps=st.integers(1, 3),
    length=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_transposed_conv_is_one_conv_per_phase(
    cin: int, cout: int, stride: int, taps: int, length: int, seed: int
) -> None:
    """The polyphase form equals the causal transposed convolution (its first T*stride outputs)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cin, length, generator=gen, dtype=torch.float64)
    w = torch.randn(cin, cout, taps * stride, generator=gen, dtype=torch.float64)
    want = F.conv_transpose1d(x, w, stride=stride)[..., : length * stride]
    phases = F.conv1d(F.pad(x, (taps - 1, 0)), polyphase_weight(w, stride))  # [2, stride*cout, T]
    got = phases.view(2, stride, cout, length).permute(0, 2, 3, 1).reshape(2, cout, length * stride)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@needs_interpreter
@settings(max_examples=25, deadline=None)
@given(conv_shapes)
def test_triton_kernel_under_the_interpreter(p: dict[str, int]) -> None:
    from streamdec.kernels import _triton_conv as tc

    x, w, bias = conv_case(p)
    packed = pack_split_weight(w)
    out = tc.conv1d_split(*split_tf32(x), packed[0], packed[1], bias, p["dilation"])
    assert relative_error(out, x, w, bias, p["dilation"]) <= 2e-6


@needs_interpreter
def test_whole_decode_through_the_interpreted_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny codec in tf32x3 with every conv (transposed ones as phases) on the Triton kernel."""
    from streamdec.kernels import _triton_conv as tc

    assert_tiny_decodes_through(monkeypatch, "tf32x3", "conv1d_split_tf32", tc.conv1d_split)
