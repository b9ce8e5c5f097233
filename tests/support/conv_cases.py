"""Helpers for the split-convolution tests (no tests here): random layer shapes, and the error measure.

tests/test_kernels_conv.py (the TF32 split) and tests/test_kernels_conv_f16.py (the float16 split) draw
the same layers and judge them the same way.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

# The Triton kernels run on the CPU only under the interpreter; CI has neither, so those tests skip there.
needs_interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton and TRITON_INTERPRET=1 (the GPU runs are in the *_cuda.py tests)",
)

conv_shapes = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 3),
        "cin": st.integers(1, 40),
        "cout": st.integers(1, 70),
        "ksize": st.sampled_from([1, 3, 7, 11]),
        "dilation": st.sampled_from([1, 3, 5]),
        "tout": st.integers(1, 150),
        "bias": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)


def conv_case(p: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(x, w, bias)`` for one :data:`conv_shapes` draw: ``x`` already padded for ``tout`` outputs."""
    gen = torch.Generator().manual_seed(p["seed"])
    tin = p["tout"] + (p["ksize"] - 1) * p["dilation"]
    x = torch.randn(p["batch"], p["cin"], tin, generator=gen)
    w = torch.randn(p["cout"], p["cin"], p["ksize"], generator=gen) / (p["cin"] * p["ksize"]) ** 0.5
    bias = torch.randn(p["cout"], generator=gen) if p["bias"] else None
    return x, w, bias


def relative_error(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> float:
    """Largest error of ``out`` against the float64 convolution, per output relative to
    ``sum |x| |w| + |bias|``: what float32 round-off is relative to."""
    exact = F.conv1d(x.double(), w.double(), None if bias is None else bias.double(), dilation=dilation)
    scale = F.conv1d(x.double().abs(), w.double().abs(), dilation=dilation)
    scale = scale + (0.0 if bias is None else bias.double().abs()[:, None])
    assert out.shape == exact.shape
    return float(((out.double() - exact).abs() / scale.clamp_min(1e-30)).max())


def count_calls(monkeypatch: pytest.MonkeyPatch, op: str) -> list[int]:
    """Wrap ``torch.ops.streamdec.<op>`` for the test: the returned list grows by one per call."""
    calls: list[int] = []
    real = getattr(torch.ops.streamdec, op)

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        out: torch.Tensor = real(*args)
        return out

    monkeypatch.setattr(torch.ops.streamdec, op, counted)
    return calls


class UnwrittenIsNan:
    """``torch`` for a kernel module's own allocations, except that ``empty`` and ``empty_like`` memory is
    NaN (floats) or -1 (integers): what a kernel skips stays recognisable. Patch a module's ``torch``
    with it (``monkeypatch.setattr(module, "torch", UnwrittenIsNan())``)."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def _marked(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan") if t.dtype.is_floating_point else -1)

    def empty(self, *args: object, **kwargs: object) -> torch.Tensor:
        return self._marked(torch.empty(*args, **kwargs))  # type: ignore[call-overload]

    def empty_like(self, *args: object, **kwargs: object) -> torch.Tensor:
        return self._marked(torch.empty_like(*args, **kwargs))  # type: ignore[call-overload]


def assert_padding_rows_skipped(ours: torch.Tensor, full: torch.Tensor, live: int) -> None:
    """Rows ``< live`` hold ``full``'s bits; each later row is unwritten (NaN or -1 throughout) or, where a
    program that holds a real row also holds it (packed short rows), ``full``'s row too."""
    assert torch.equal(ours[:live], full[:live])
    for row in range(live, ours.shape[0]):
        mine = ours[row]
        unwritten = mine.isnan().all() if mine.dtype.is_floating_point else (mine == -1).all()
        assert bool(unwritten) or torch.equal(mine, full[row]), row
