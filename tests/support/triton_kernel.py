"""A Triton kernel of the tests' own, for tests of Triton plumbing (the parallel precompile) that must not
depend on the product kernels' signatures. Import only where Triton is installed."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, N, FACTOR: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """``out = x * FACTOR`` over ``N`` float32 elements."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)
