# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return"
"""Triton conv1d: split-TF32 products with float32 accumulation in short chunks (imported where Triton is).

Computes ``y[b, o, t] = bias[o] + sum_j sum_c w[o, c, j] * x[b, c, t + j * dil]`` for an already padded,
contiguous ``x`` (stride 1, groups 1) as an implicit GEMM: ``M`` = output channels, ``N`` = output
samples, the reduction runs over (tap, input-channel block) steps.

Each step multiplies on the TF32 tensor cores three times, ``w_lo * x_hi + w_hi * x_lo + w_hi * x_hi``
(the split of :mod:`streamdec.codecs.precision`; ``x`` is split in registers, ``w`` arrives split), into a
partial accumulator that restarts every ``CHUNK`` steps and is then added to the running sum by an
ordinary float32 add. Why the chunks: on an H200 the tensor cores' accumulator loses a little at each MMA
step, so one accumulator carried over a whole 7,000-term reduction ends about 2e-5 off (83 dB for a whole
AuK decode through cuDNN or cuBLAS); restarting it bounds that loss by the chunk's length, and the
float32 adds between chunks round to nearest (the promotion DeepSeek-V3 applies to FP8 GEMMs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Reduction steps (tap x BLOCK_K input channels) per partial accumulator; with BLOCK_K = 32 that is 64
# products per output per chunk and term.
CHUNK = 2


@triton.jit
def _round_tf32(v):
    """``v`` rounded to TF32 (10 mantissa bits, nearest, ties away from zero), as float32 bits."""
    bits = v.to(tl.int32, bitcast=True)
    return ((bits + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _conv1d_split_kernel(
    x_ptr,  # [B, CIN, TIN] float32, contiguous
    w_hi_ptr,  # [KSIZE, COUT, CIN] float32: TF32 heads of the weight
    w_lo_ptr,  # [KSIZE, COUT, CIN] float32: tails
    bias_ptr,  # [COUT] (read only when HAS_BIAS)
    y_ptr,  # [B, COUT, TOUT] float32, contiguous
    CIN,
    COUT,
    TIN,
    TOUT,
    DIL,
    KSIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid_n = tl.program_id(0)  # output samples: the largest extent, on the grid axis without a small limit
    pid_m = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = offs_m < COUT
    n_ok = offs_n < TOUT
    x_row = x_ptr + batch * CIN * TIN
    k_blocks = tl.cdiv(CIN, BLOCK_K)
    steps = KSIZE * k_blocks
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, steps, CHUNK):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in tl.static_range(CHUNK):
            step = first + i
            live = step < steps  # the last chunk may run past the reduction: those loads are masked off
            tap = step // k_blocks
            chan = (step % k_blocks) * BLOCK_K + rk
            k_ok = (chan < CIN) & live
            w_off = (tap * COUT + offs_m[:, None]) * CIN + chan[None, :]
            w_mask = m_ok[:, None] & k_ok[None, :]
            w_hi = tl.load(w_hi_ptr + w_off, mask=w_mask, other=0.0)
            w_lo = tl.load(w_lo_ptr + w_off, mask=w_mask, other=0.0)
            # offs_n < TOUT = TIN - (KSIZE-1)*DIL keeps t + tap*DIL inside the row
            x_off = chan[:, None] * TIN + (offs_n + tap * DIL)[None, :]
            x = tl.load(x_row + x_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            x_hi = _round_tf32(x)
            x_lo = x - x_hi
            # small terms first: they reach the accumulator while it is still small
            part = tl.dot(w_lo, x_hi, part, input_precision="tf32")
            part = tl.dot(w_hi, x_lo, part, input_precision="tf32")
            part = tl.dot(w_hi, x_hi, part, input_precision="tf32")
        acc += part
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    y_off = batch * COUT * TOUT + offs_m[:, None] * TOUT + offs_n[None, :]
    tl.store(y_ptr + y_off, acc, mask=m_ok[:, None] & n_ok[None, :])


class Tiles(NamedTuple):
    """Launch shape: output tile (``block_m`` channels x ``block_n`` samples), reduction step, chunk, warps."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 32
    chunk: int = CHUNK
    warps: int = 4
    stages: int = 3


def _block(extent: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(extent)))


def conv1d_split(
    x: torch.Tensor,
    w_hi: torch.Tensor,
    w_lo: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """``x`` [B, CIN, TIN], packed ``w_hi``/``w_lo`` [KSIZE, COUT, CIN] -> ``y`` [B, COUT, TOUT].

    ``tiles`` overrides the launch shape (``scripts/probe_conv_precision.py --sweep`` times candidates);
    by default 64 x 128 output tiles with 32-channel steps on 4 warps, shrunk to the layer's extents.
    """
    batch, cin, tin = x.shape
    ksize, cout, _ = w_hi.shape
    tout = tin - (ksize - 1) * dilation
    y = torch.empty(batch, cout, tout, device=x.device, dtype=torch.float32)
    if tout <= 0 or batch == 0:
        return y
    t = tiles or Tiles()
    # tl.dot needs every block extent >= 16
    block_m, block_n, block_k = (
        _block(cout, 16, t.block_m),
        _block(tout, 16, t.block_n),
        _block(cin, 16, t.block_k),
    )
    grid = (triton.cdiv(tout, block_n), triton.cdiv(cout, block_m), batch)
    _conv1d_split_kernel[grid](
        x.contiguous(),
        w_hi,
        w_lo,
        bias if bias is not None else w_hi,  # never read without HAS_BIAS
        y,
        cin,
        cout,
        tin,
        tout,
        dilation,
        KSIZE=ksize,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        CHUNK=t.chunk,
        num_warps=t.warps,
        num_stages=t.stages,
    )
    return y
