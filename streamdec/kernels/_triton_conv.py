# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return"
"""Triton conv1d: split-TF32 products with float32 accumulation between steps (imported where Triton is).

Computes ``y[b, o, t] = bias[o] + sum_j sum_c w[o, c, j] * x[b, c, t + j * dil]`` for an already padded,
contiguous ``x`` (stride 1, groups 1) as an implicit GEMM: ``M`` = output channels, ``N`` = output
samples, the reduction runs over (tap, input-channel block) steps.

Both operands arrive split (:func:`streamdec.kernels.split.split_tf32`: ``x = x_hi + x_lo`` and
``w = w_hi + w_lo`` exactly, the heads TF32). Each step multiplies on the TF32 tensor cores three times,
``w_lo * x_hi + w_hi * x_lo + w_hi * x_hi``, into a fresh partial accumulator that is then added to the
running sum by an ordinary float32 add. Why: on an H200 the tensor cores' accumulator loses a little at
each MMA step, so one accumulator carried over a whole 7,000-term reduction ends about 2e-5 off (83 dB for
a whole AuK decode through cuDNN or cuBLAS); restarting it every step bounds that loss by one step's
``3 * BLOCK_K`` products, and the float32 adds between steps round to nearest (the promotion DeepSeek-V3
applies to FP8 GEMMs). Measured: 111 dB against float64 for that decode.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from streamdec.kernels.sizing import DOT_MIN_EXTENT, INTERPRETER_SMS, pow2_block


@triton.jit
def _conv1d_split_kernel(
    x_hi_ptr,  # [B, CIN, TIN] float32, contiguous: TF32 heads of the padded input
    x_lo_ptr,  # [B, CIN, TIN] float32, contiguous: tails
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
):
    pid_n = tl.program_id(0)  # output samples: the largest extent, on the grid axis without a small limit
    pid_m = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = offs_m < COUT
    n_ok = offs_n < TOUT
    row = batch * CIN * TIN
    k_blocks = tl.cdiv(CIN, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # One loop over (tap, channel block) steps, the shape Triton's pipeliner recognises: the operands go
    # from global memory to swizzled shared memory asynchronously, stages ahead, and the tensor cores read
    # them from there (splitting x here instead would route every tile through registers).
    for step in range(0, KSIZE * k_blocks):
        tap = step // k_blocks
        chan = (step % k_blocks) * BLOCK_K + rk
        k_ok = chan < CIN
        w_off = (tap * COUT + offs_m[:, None]) * CIN + chan[None, :]
        w_mask = m_ok[:, None] & k_ok[None, :]
        w_hi = tl.load(w_hi_ptr + w_off, mask=w_mask, other=0.0)
        w_lo = tl.load(w_lo_ptr + w_off, mask=w_mask, other=0.0)
        # offs_n < TOUT = TIN - (KSIZE-1)*DIL keeps t + tap*DIL inside the row
        x_off = row + chan[:, None] * TIN + (offs_n + tap * DIL)[None, :]
        x_mask = k_ok[:, None] & n_ok[None, :]
        x_hi = tl.load(x_hi_ptr + x_off, mask=x_mask, other=0.0)
        x_lo = tl.load(x_lo_ptr + x_off, mask=x_mask, other=0.0)
        # A fresh tensor-core accumulator per step, added to the float32 sum by an ordinary add: small
        # terms first, while the partial sum is still small.
        part = tl.dot(w_lo, x_hi, input_precision="tf32")
        part = tl.dot(w_hi, x_lo, part, input_precision="tf32")
        part = tl.dot(w_hi, x_hi, part, input_precision="tf32")
        acc += part
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    y_off = batch * COUT * TOUT + offs_m[:, None] * TOUT + offs_n[None, :]
    tl.store(y_ptr + y_off, acc, mask=m_ok[:, None] & n_ok[None, :])


class Tiles(NamedTuple):
    """Launch shape: output tile (``block_m`` channels x ``block_n`` samples), channels per step, warps,
    pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


# Chosen from a per-layer sweep over auk-24k at 1 x 70 and 16 x 70 on an H200
# (bench/results/h200/conv-tiles-tf32x3-*.json): large tiles when they still fill the GPU twice,
# otherwise smaller ones that fill it once (a 1 x 70 decode has too few outputs per layer for large tiles).
# All share one block_k: it sets the reduction's grouping, hence the rounding, so a row's output stays
# bit-identical whatever batch it is computed in (the plain-graph tier promises that); the tile's other
# extents only change which program computes an output.
LARGE = Tiles(128, 128, 32, 8, 3)
MEDIUM = Tiles(64, 64, 32, 4, 3)
SMALL = Tiles(64, 32, 32, 4, 3)


def default_tiles(batch: int, cout: int, tout: int, sms: int) -> Tiles:
    """The launch shape for a ``batch`` x ``cout`` x ``tout`` output on a GPU with ``sms`` multiprocessors."""

    def programs(t: Tiles) -> int:
        return batch * triton.cdiv(cout, t.block_m) * triton.cdiv(tout, t.block_n)

    if programs(LARGE) >= 2 * sms:
        return LARGE
    return MEDIUM if programs(MEDIUM) >= sms else SMALL


@functools.cache
def sm_count(device: int) -> int:
    """Multiprocessors of CUDA device ``device`` (what the launch rules fill)."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def launch_sms(device: torch.device) -> int:
    """Multiprocessors a launch on ``device`` is planned for (the interpreter's stand-in on the CPU)."""
    return sm_count(device.index or 0) if device.type == "cuda" else INTERPRETER_SMS


def conv1d_split(
    x_hi: torch.Tensor,
    x_lo: torch.Tensor,
    w_hi: torch.Tensor,
    w_lo: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """Split ``x_hi``/``x_lo`` [B, CIN, TIN], packed ``w_hi``/``w_lo`` [KSIZE, COUT, CIN] -> ``y`` [B, COUT, TOUT].

    ``tiles`` overrides the launch shape (``scripts/probe_conv_precision.py --sweep`` times candidates);
    by default :func:`default_tiles` picks it. Tiles larger than the layer shrink to its extents.
    """
    batch, cin, tin = x_hi.shape
    ksize, cout, _ = w_hi.shape
    tout = tin - (ksize - 1) * dilation
    y = torch.empty(batch, cout, tout, device=x_hi.device, dtype=torch.float32)
    if tout <= 0 or batch == 0:
        return y
    t = tiles or default_tiles(batch, cout, tout, launch_sms(x_hi.device))
    block_m, block_n, block_k = (
        pow2_block(cout, DOT_MIN_EXTENT, t.block_m),
        pow2_block(tout, DOT_MIN_EXTENT, t.block_n),
        pow2_block(cin, DOT_MIN_EXTENT, t.block_k),
    )
    grid = (triton.cdiv(tout, block_n), triton.cdiv(cout, block_m), batch)
    _conv1d_split_kernel[grid](
        x_hi.contiguous(),
        x_lo.contiguous(),
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
        num_warps=t.warps,
        num_stages=t.stages,
    )
    return y
