"""Routing the CPU through the split-convolution paths a CUDA float32 input takes (no tests here), for the
tests of the TF32 and the float16 split kernels alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from streamdec.codecs import load_codec
from streamdec.codecs.layers import routing
from streamdec.codecs.precision import Precision


def _is_float32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32


def route_cpu_through_split(monkeypatch: pytest.MonkeyPatch, *, f16: bool = False) -> None:
    """Make the CPU take the tf32x3 Triton-conv path (``f16``: the fp16x3 one), as a CUDA float32 input
    would with the kernels on (and, for ``f16``, a GPU with TMA)."""
    names = ["triton_conv_supported", "takes_split", *(["f16_conv_supported"] if f16 else [])]
    for name in names:
        monkeypatch.setattr(routing, name, _is_float32)


def assert_tiny_decodes_through(
    monkeypatch: pytest.MonkeyPatch, precision: Precision, op: str, impl: Callable[..., torch.Tensor]
) -> None:
    """The tiny codec in ``precision``, the CPU routed as a CUDA input would be and
    ``torch.ops.streamdec.<op>`` replaced by ``impl``, decodes as it does in plain float32."""
    codec = load_codec("tiny")
    z = torch.randn(1, 6, codec.latent_dim, generator=torch.Generator().manual_seed(2))
    plain = codec.decode(z)
    route_cpu_through_split(monkeypatch, f16=precision == "fp16x3")
    monkeypatch.setattr(torch.ops.streamdec, op, impl)
    codec.precision = precision
    torch.testing.assert_close(codec.decode(z), plain, atol=1e-5, rtol=0)
