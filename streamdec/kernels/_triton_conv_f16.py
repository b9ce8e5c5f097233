# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return"
"""Triton conv1d on the float16 tensor cores, float32-exact products (imported where Triton is).

Computes ``y[b, o, t] = bias[o] + sum_j sum_c w[o, c, j] * x[b, c, t + j * dil]`` as an implicit GEMM
(``M`` = output channels, ``N`` = output samples, the reduction over (tap, channel block) steps) from
operands split by :func:`split_f16` (below) and :func:`streamdec.kernels.split.pack_split_weight_f16`:
``x * 2**kx[b] ~ x_hi + x_lo`` and ``w * 2**kw[o] ~ w_hi + w_lo`` to 22 bits, every part float16. The power-of-two
scales (one per batch row, one per output channel) put each operand's largest magnitude in
``[2**13, 2**14)``, inside float16's range, and far enough above its subnormals that the tail keeps 11
bits wherever it matters: the split carries 22 of float32's 24 bits, like the TF32 split, in half the
bytes, and float16 products run at twice TF32's rate. Being powers of two and applied per row and per
output channel, the scales factor out of every sum exactly; the epilogue multiplies them back.

Each step multiplies three times, ``w_lo * x_hi + w_hi * x_lo + w_hi * x_hi``, into a fresh tensor-core
accumulator that an ordinary float32 add folds into the running sum (the tensor cores' accumulator
loses a little at every MMA step; see :mod:`streamdec.kernels._triton_conv`). Operands arrive by TMA
(tensor descriptors: no per-element address registers, no masks; zero fill past the ends) into
swizzled shared memory, where ``wgmma`` reads them; the input is channels-last, so a box may start at any
sample but always at an aligned channel.

The reduction is cut into ``chunks`` of whole steps, fixed per layer: each chunk sums its steps from
zero and the chunks are added in order. A small grid (batch 1) runs one chunk per program and a second
kernel adds them (split-K); a large grid runs all chunks in one program. Both add the same numbers in
the same order, so a row's output is bit-identical whatever batch it is computed in. The launch is
planned in :mod:`streamdec.kernels.f16_launch`. The epilogue unscales and adds the bias, then a residual
if given, as a float32 add of its own: the result equals ``residual + conv(x)`` computed apart. The
residual may lie in two parts (:func:`_residual_tile`), as a stateful step's delay line hands it over.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from streamdec.errors import ShapeError
from streamdec.kernels import sizing
from streamdec.kernels._triton_conv import launch_sms
from streamdec.kernels._triton_dependent import dependent_launch, wait_for_inputs
from streamdec.kernels.conv import check_residual_parts, joined_residual
from streamdec.kernels.f16_launch import Launch, Tiles, channels_as_n, plan, plan_channels
from streamdec.kernels.rows import live_count
from streamdec.kernels.split import F16_CHANNEL_QUANTUM

# A residual in two parts (see :func:`_residual_tile`): its strides and the first part's length, runtime values.
_RESIDUAL_SIZES = ["RES_ROW", "RES_CHAN", "RES_LEN", "TAIL_ROW", "TAIL_CHAN"]

# Triton compiles one binary per distinct constexpr set and per integer argument's "is 1 / divisible by 16"
# class: sizes that vary layer by layer stay runtime values (with KSIZE a constexpr and every integer
# specialised, auk-24k's 1 x 70 and 16 x 70 buckets needed 74 binaries, about a minute of cold start).
# Only CP stays specialised: it is always a multiple of F16_CHANNEL_QUANTUM, so it costs no extra binary.
_RUNTIME_SIZES = ["B", "COUT", "TIN", "TOUT", "DIL", "KSIZE", "CHUNK", "NCHUNK", *_RESIDUAL_SIZES]


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _conv1d_f16x3_kernel(
    x_hi_desc,  # [B * TIN, CP] (ROWS = 1) or [B, TIN, CP] float16: scaled input heads, channels-last, padded to CP
    x_lo_desc,  # same: tails
    w_hi_desc,  # [KSIZE * COUT, CP] float16: scaled weight heads, tap-major
    w_lo_desc,  # same: tails
    x_inv_ptr,  # [B] float32: 2**-kx
    w_inv_ptr,  # [COUT] float32: 2**-kw
    bias_ptr,  # [COUT] (read only when HAS_BIAS)
    res_ptr,  # [B, COUT, TOUT] added to y (read only when HAS_RES); with RES_PARTS its first part
    tail_ptr,  # with RES_PARTS: the residual's second part (below)
    out_ptr,  # SPLIT: [NCHUNK, B, COUT, TOUT] chunk sums; else y [B, COUT, TOUT]
    live_ptr,  # [1] int64 (read only when HAS_LIVE): rows at or past it are padding (streamdec.kernels.rows)
    B,
    CP,
    COUT,
    TIN,
    TOUT,
    DIL,
    CHUNK,  # steps per chunk
    NCHUNK,
    KSIZE,
    RES_ROW,  # with RES_PARTS: the first part's batch and channel strides, its length, the second's strides
    RES_CHAN,
    RES_LEN,
    TAIL_ROW,
    TAIL_CHAN,
    HAS_RES: tl.constexpr,  # a constexpr: as a runtime branch the epilogue would run out of registers
    RES_PARTS: tl.constexpr,  # the residual lies in two strided parts, not in y's layout
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,  # batch rows a program covers: BLOCK_N // ROWS samples of each (short rows packed)
    PRODUCTS: tl.constexpr,  # 3: the split products ("fp16x3"); 1: heads only ("fp16"), tails never read
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    wait_for_inputs(DEPENDENT)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_z = tl.program_id(2)
    if SPLIT:
        batch = pid_z // NCHUNK * ROWS
        first = pid_z % NCHUNK
        last = first + 1
    else:
        batch = pid_z * ROWS
        first = 0
        last = NCHUNK
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= tl.load(live_ptr):  # padding rows only (they come last): nothing to compute
            return
    ROW_N: tl.constexpr = BLOCK_N // ROWS
    m0 = pid_m * BLOCK_M
    n0 = pid_n * ROW_N
    k_blocks = CP // BLOCK_K
    steps = KSIZE * k_blocks
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for chunk in range(first, last):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(chunk * CHUNK, tl.minimum(steps, (chunk + 1) * CHUNK)):
            tap = step // k_blocks
            c0 = (step % k_blocks) * BLOCK_K
            # A box may run past its block: weight rows past COUT into the next tap, input samples past
            # TIN into the next batch row (or zero fill at the ends). Those only feed outputs the store
            # masks off (output t reads inputs t + tap * DIL < TIN of its own row).
            w_hi = w_hi_desc.load([tap * COUT + m0, c0])
            x_hi = _input_box(x_hi_desc, batch, TIN, n0 + tap * DIL, c0, BLOCK_N, BLOCK_K, ROWS)
            if PRODUCTS == 3:
                w_lo = w_lo_desc.load([tap * COUT + m0, c0])
                x_lo = _input_box(x_lo_desc, batch, TIN, n0 + tap * DIL, c0, BLOCK_N, BLOCK_K, ROWS)
                part = tl.dot(w_lo, x_hi)
                part = tl.dot(w_hi, x_lo, part)
                part = tl.dot(w_hi, x_hi, part)
                acc += part
            else:
                # One float16 product carries 11 bits of each operand: the accumulator's own loss per
                # MMA step is far below that, so the products accumulate in the tensor cores.
                acc = tl.dot(w_hi, x_hi, acc)
        total += acc
    offs_m = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    # 32-bit offsets from the tile's corner (a 64-bit scalar): 64-bit ones per element would keep twice the
    # registers live through the epilogue, and with a residual to read, spill.
    if ROWS == 1:  # one row: its scale is a scalar, and the columns are its samples (no row arithmetic)
        mask = (offs_m < COUT)[:, None] & (n0 + cols < TOUT)[None, :]
        local = tl.arange(0, BLOCK_M)[:, None] * TOUT + cols[None, :]
        x_inv = tl.load(x_inv_ptr + batch)
        later = 0  # each column's batch row after the tile's first
        offs_n = n0 + cols
    else:
        later = cols // ROW_N
        rows = batch + later  # each column's batch row
        offs_n = n0 + cols % ROW_N
        mask = (offs_m < COUT)[:, None] & ((offs_n < TOUT) & (rows < B))[None, :]
        local = (
            tl.arange(0, BLOCK_M)[:, None] * TOUT + ((cols // ROW_N) * (COUT * TOUT) + cols % ROW_N)[None, :]
        )
        x_inv = tl.load(x_inv_ptr + rows, mask=rows < B, other=1.0)[None, :]
    if SPLIT:
        corner = ((first.to(tl.int64) * B + batch) * COUT + m0) * TOUT + n0
        tl.store(out_ptr + corner + local, total, mask=mask)
    else:
        y = _unscale(total, x_inv, w_inv_ptr, bias_ptr, offs_m, COUT, HAS_BIAS)
        corner = (batch.to(tl.int64) * COUT + m0) * TOUT + n0
        if HAS_RES:
            if RES_PARTS:
                y += _residual_tile(
                    res_ptr, tail_ptr, batch, later, offs_m, offs_n, mask, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW,
                    TAIL_CHAN,
                )  # fmt: skip
            else:
                y += tl.load(res_ptr + corner + local, mask=mask, other=0.0)
        tl.store(out_ptr + corner + local, y, mask=mask)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _conv1d_f16x3_cn_kernel(
    x_hi_desc,  # [B * TIN, CP] float16: scaled input heads, channels-last (as the kernel above)
    x_lo_desc,
    w_hi_desc,  # [KSIZE * COUT, CP] float16: scaled weight heads, tap-major
    w_lo_desc,
    x_inv_ptr,
    w_inv_ptr,
    bias_ptr,
    res_ptr,
    tail_ptr,
    out_ptr,  # y [B, COUT, TOUT]
    live_ptr,  # as above
    B,
    CP,
    COUT,
    TIN,
    TOUT,
    DIL,
    CHUNK,
    NCHUNK,
    KSIZE,
    RES_ROW,
    RES_CHAN,
    RES_LEN,
    TAIL_ROW,
    TAIL_CHAN,
    HAS_RES: tl.constexpr,
    RES_PARTS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,  # samples a program (the GEMM's M)
    BLOCK_O: tl.constexpr,  # output channels a program (N)
    BLOCK_K: tl.constexpr,
    PRODUCTS: tl.constexpr,
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """The kernel above with the output channels along N (:func:`streamdec.kernels.f16_launch.plan_channels`):
    ``y^T[t, o] = sum x[t, c] w[o, c]`` for a ``BLOCK_T`` x ``BLOCK_O`` tile of one batch row. Each step
    multiplies the same parts in the same order into a fresh accumulator, and the steps and chunks are the
    layer's, so every launch of a layer gives the same bits; the chunks always run in one program."""
    wait_for_inputs(DEPENDENT)
    pid_t = tl.program_id(0)
    pid_o = tl.program_id(1)
    batch = tl.program_id(2)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= tl.load(live_ptr):
            return
    t0 = pid_t * BLOCK_T
    o0 = pid_o * BLOCK_O
    k_blocks = CP // BLOCK_K
    steps = KSIZE * k_blocks
    total = tl.zeros((BLOCK_T, BLOCK_O), dtype=tl.float32)
    for chunk in range(0, NCHUNK):
        acc = tl.zeros((BLOCK_T, BLOCK_O), dtype=tl.float32)
        for step in range(chunk * CHUNK, tl.minimum(steps, (chunk + 1) * CHUNK)):
            tap = step // k_blocks
            c0 = (step % k_blocks) * BLOCK_K
            # Boxes past their block (weight rows into the next tap, samples into the next batch row)
            # feed only outputs the store masks off, as above.
            x_hi = x_hi_desc.load([batch * TIN + t0 + tap * DIL, c0])
            w_hi = w_hi_desc.load([tap * COUT + o0, c0])
            if PRODUCTS == 3:
                x_lo = x_lo_desc.load([batch * TIN + t0 + tap * DIL, c0])
                w_lo = w_lo_desc.load([tap * COUT + o0, c0])
                part = tl.dot(x_hi, w_lo.T)
                part = tl.dot(x_lo, w_hi.T, part)
                part = tl.dot(x_hi, w_hi.T, part)
                acc += part
            else:
                acc = tl.dot(x_hi, w_hi.T, acc)
        total += acc
    rows_t = tl.arange(0, BLOCK_T)
    cols_o = tl.arange(0, BLOCK_O)
    offs_t = t0 + rows_t
    offs_o = o0 + cols_o
    o_ok = offs_o < COUT
    mask = (offs_t < TOUT)[:, None] & o_ok[None, :]
    local = cols_o[None, :] * TOUT + rows_t[:, None]  # 32-bit offsets from the tile's corner
    corner = (batch.to(tl.int64) * COUT + o0) * TOUT + t0
    y = total * tl.load(w_inv_ptr + offs_o, mask=o_ok, other=1.0)[None, :] * tl.load(x_inv_ptr + batch)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_o, mask=o_ok, other=0.0)[None, :]
    if HAS_RES:
        if RES_PARTS:
            first = (offs_t < RES_LEN)[:, None]
            head = tl.load(
                res_ptr + batch.to(tl.int64) * RES_ROW + offs_o[None, :] * RES_CHAN + offs_t[:, None],
                mask=mask & first,
                other=0.0,
            )
            tail = tl.load(
                tail_ptr
                + batch.to(tl.int64) * TAIL_ROW
                + offs_o[None, :] * TAIL_CHAN
                + (offs_t - RES_LEN)[:, None],
                mask=mask & ~first,
                other=0.0,
            )
            y += tl.where(first, head, tail)
        else:
            y += tl.load(res_ptr + corner + local, mask=mask, other=0.0)
    tl.store(out_ptr + corner + local, y, mask=mask)


@triton.jit
def _input_box(desc, batch, TIN, start, c0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr):
    """One step's input operand, ``[BLOCK_K, BLOCK_N]`` K-major, from samples ``start ..`` and channels
    ``c0 ..``: one row's box of the flattened ``[B * TIN, CP]`` input, or (short rows packed) a
    ``[ROWS, BLOCK_N // ROWS, BLOCK_K]`` box of ``[B, TIN, CP]``, zero-filled past each row's end and past
    the batch (8 samples are one 128-byte swizzle atom, so the reshape moves nothing)."""
    # an if/else, not an early return: Triton's code generator would emit the statement after a
    # returning constexpr branch too, and a 2-D descriptor takes no 3-D offsets
    if ROWS == 1:
        box = desc.load([batch * TIN + start, c0]).T
    else:
        box = desc.load([batch, start, c0]).reshape(BLOCK_N, BLOCK_K).T
    return box


@triton.jit
def _residual_tile(
    res_ptr, tail_ptr, batch, later, offs_m, offs_n, mask, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN
):
    """The residual at channels ``offs_m`` and samples ``offs_n`` of rows ``batch + later`` (``later``: 0,
    or each column's row after ``batch``), where it lies in two parts: samples ``t < RES_LEN`` at
    ``res[b, o, t]``, the rest at ``tail[b, o, t - RES_LEN]``, each with its own batch and channel strides
    and contiguous samples (a delay line's kept history and the new samples it passes on, read where they
    are instead of concatenated). Each element is loaded from one part only and taken as it is, so the
    add that follows gives the bits of ``cat(res, tail)`` added as one tensor."""
    first = (offs_n < RES_LEN)[None, :]
    head = tl.load(
        res_ptr
        + batch.to(tl.int64) * RES_ROW
        + (later * RES_ROW + offs_n)[None, :]
        + offs_m[:, None] * RES_CHAN,
        mask=mask & first,
        other=0.0,
    )
    tail = tl.load(
        tail_ptr
        + batch.to(tl.int64) * TAIL_ROW
        + (later * TAIL_ROW + offs_n - RES_LEN)[None, :]
        + offs_m[:, None] * TAIL_CHAN,
        mask=mask & ~first,
        other=0.0,
    )
    return tl.where(first, head, tail)


@triton.jit
def _unscale(total, x_inv, w_inv_ptr, bias_ptr, offs_m, COUT, HAS_BIAS: tl.constexpr):
    """The scales back out (exact: powers of two), then the bias. A residual, if any, is added after,
    rounded as ``residual + conv(x)`` would be: a separate float32 add. ``x_inv`` is the input's scale:
    a scalar (one row for the whole tile) or ``[1, BLOCK_N]``, each column's row (short rows packed)."""
    m_ok = offs_m < COUT
    y = total * tl.load(w_inv_ptr + offs_m, mask=m_ok, other=1.0)[:, None] * x_inv
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    return y


@triton.jit(do_not_specialize=["PLANE", "COUT", "TOUT", "NCHUNK", *_RESIDUAL_SIZES])
def _chunk_sum_kernel(
    part_ptr,  # [NCHUNK, B, COUT, TOUT] float32
    x_inv_ptr,
    w_inv_ptr,
    bias_ptr,
    res_ptr,
    tail_ptr,
    y_ptr,  # [B, COUT, TOUT]
    live_ptr,  # [1] int64 (read only when HAS_LIVE): rows at or past it are padding
    PLANE,  # B * COUT * TOUT: one chunk's sums
    COUT,
    TOUT,
    NCHUNK,
    RES_ROW,
    RES_CHAN,
    RES_LEN,
    TAIL_ROW,
    TAIL_CHAN,
    HAS_RES: tl.constexpr,
    RES_PARTS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """Add the chunk sums in chunk order, from zero, as the one-program path does; then unscale."""
    wait_for_inputs(DEPENDENT)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    batch = tl.program_id(2)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= tl.load(live_ptr):
            return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < COUT)[:, None] & (offs_n < TOUT)[None, :]
    offs = (batch.to(tl.int64) * COUT + offs_m[:, None]) * TOUT + offs_n[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    parts = part_ptr + offs
    for _ in range(0, NCHUNK):
        total += tl.load(parts, mask=mask, other=0.0)
        parts += PLANE  # 64-bit pointer steps: no index overflow
    y = _unscale(total, tl.load(x_inv_ptr + batch), w_inv_ptr, bias_ptr, offs_m, COUT, HAS_BIAS)
    if HAS_RES:
        if RES_PARTS:
            y += _residual_tile(
                res_ptr,
                tail_ptr,
                batch,
                0,
                offs_m,
                offs_n,
                mask,
                RES_ROW,
                RES_CHAN,
                RES_LEN,
                TAIL_ROW,
                TAIL_CHAN,
            )
        else:
            y += tl.load(res_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit(do_not_specialize=["PER_PHASE", "T", "PHASES"])
def _interleave_kernel(
    src_ptr,  # [B, PHASES * PER_PHASE, T]: phase p's channels are rows p * PER_PHASE ...
    dst_ptr,  # [B, PER_PHASE, T * PHASES]
    live_ptr,  # [1] int64 (read only when HAS_LIVE): rows at or past it are padding
    PER_PHASE,
    T,
    PHASES,
    BLOCK_C: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """``dst[b, c, t * PHASES + p] = src[b, p * PER_PHASE + c, t]``, tiled over the output so that the
    stores run contiguously; the loads gather from ``PHASES`` rows, each in short contiguous runs. (Written
    by the conv's epilogue instead, at a runtime stride, the interleave made every launch of the conv
    kernel slower, not only the launches that interleave: ``docs/kernels.md``.)"""
    wait_for_inputs(DEPENDENT)
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    batch = tl.program_id(2)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= tl.load(live_ptr):
            return
    length = T * PHASES
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_out = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    phase = offs_out % PHASES
    mask = (offs_c < PER_PHASE)[:, None] & (offs_out < length)[None, :]
    base = batch.to(tl.int64) * PER_PHASE * length  # both tensors hold PER_PHASE * length per batch row
    src = (phase[None, :] * PER_PHASE + offs_c[:, None]) * T + (offs_out // PHASES)[None, :]
    values = tl.load(src_ptr + base + src, mask=mask)
    tl.store(dst_ptr + base + offs_c[:, None] * length + offs_out[None, :], values, mask=mask)


@triton.jit
def _pow2_from_amax(bits):
    """:func:`streamdec.kernels.split.pow2_scale` from a peak's float32 bits: ``(2**k, 2**-k)``."""
    biased = (bits >> 23) & 0xFF
    k = tl.minimum(tl.maximum(140 - biased, -126), 126)  # peak * 2**k in [2**13, 2**14)
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - k) << 23).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit(do_not_specialize=["ROW", "STRIDE"])
def _row_amax_kernel(
    x_ptr,
    amax_ptr,
    live_ptr,
    ROW,
    STRIDE,
    BLOCK: tl.constexpr,
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """``amax_ptr[b]`` (int32, zeroed) <- the float32 bits of ``max |x[b]|`` over the ``ROW`` contiguous
    samples of batch row ``b`` (rows ``STRIDE`` apart): non-negative floats order as their bits, so an
    integer atomic max is exact and independent of the programs' order."""
    wait_for_inputs(DEPENDENT)
    row = tl.program_id(1)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if row >= tl.load(live_ptr):
            return
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row.to(tl.int64) * STRIDE + offs, mask=offs < ROW, other=0.0)
    tl.atomic_max(amax_ptr + row, tl.max(tl.abs(values).to(tl.int32, bitcast=True), axis=0))


@triton.jit(do_not_specialize=["C", "H", "HEAD_BATCH", "T", "PAD_LEFT", "T_OUT", "KEEP_ROW", "KEEP_LEN"])
def _split_kernel(
    head_ptr,  # [B, C, H] float32: the input's first H samples (a stream's kept history); batch rows
    # HEAD_BATCH apart, each one's C * H samples contiguous
    x_ptr,  # [B, C, T] float32, contiguous: the rest
    amax_ptr,  # [B] int32: bits of each row's peak
    hi_ptr,  # [B, T_OUT, CP] float16, channels-last: T_OUT = PAD_LEFT + H + T + right padding
    lo_ptr,
    inv_ptr,  # [B] float32: 2**-k
    live_ptr,  # [1] int64 (read only when HAS_LIVE): rows at or past it are padding
    keep_ptr,  # with KEEP: [slots, C, KEEP_LEN] float32, slots KEEP_ROW apart (a stateful layer's pool)
    slots_ptr,  # with KEEP: [B] int64, the pool row of each batch row
    C,
    H,
    HEAD_BATCH,
    T,
    CP,
    PAD_LEFT,
    T_OUT,
    KEEP_ROW,
    KEEP_LEN,
    BLOCK_C: tl.constexpr,
    BLOCK_T: tl.constexpr,
    WRITE_LO: tl.constexpr,  # False for the single-product precision, which reads heads only
    HAS_LIVE: tl.constexpr = False,
    KEEP: tl.constexpr = False,  # also write each row's last KEEP_LEN samples of cat(head, x) to its slot
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """:func:`streamdec.kernels.split.split_input_f16` of the zero-padded ``cat(head, x)``, bit for bit, in
    one pass: the padding is written here (zeros split to zeros) and the two parts are read where they
    are, never copied into one padded float32 buffer. With ``KEEP`` it also stores the samples a stateful
    layer keeps for its next step, as it holds them (no pass of their own)."""
    wait_for_inputs(DEPENDENT)
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    row = tl.program_id(2)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if row >= tl.load(live_ptr):
            return
    scale, inverse = _pow2_from_amax(tl.load(amax_ptr + row))
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_out = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_t = offs_out - PAD_LEFT
    c_ok = (offs_c < C)[:, None]
    in_head = ((offs_t >= 0) & (offs_t < H))[None, :]
    in_x = ((offs_t >= H) & (offs_t < H + T))[None, :]
    x = tl.load(
        x_ptr + (row.to(tl.int64) * C + offs_c[:, None]) * T + (offs_t - H)[None, :],
        mask=c_ok & in_x,
        other=0.0,  # the padding samples and channels
    )
    kept = tl.load(
        head_ptr + row.to(tl.int64) * HEAD_BATCH + offs_c[:, None] * H + offs_t[None, :],
        mask=c_ok & in_head,
        other=0.0,
    )
    x = tl.where(in_head, kept, x)
    if KEEP:  # the kept samples are positions H + T - KEEP_LEN .. H + T - 1 of cat(head, x)
        p = offs_t - (H + T - KEEP_LEN)
        slot = tl.load(slots_ptr + row)
        tl.store(
            keep_ptr + slot * KEEP_ROW + offs_c[:, None] * KEEP_LEN + p[None, :],
            x,
            mask=c_ok & ((p >= 0) & (p < KEEP_LEN))[None, :],
        )
    scaled = (x * scale).to(tl.int32, bitcast=True)
    hi = ((scaled + 4096) & -8192).to(tl.float32, bitcast=True)  # split_tf32's rounding: 10 mantissa bits
    lo = scaled.to(tl.float32, bitcast=True) - hi
    out = (row.to(tl.int64) * T_OUT + offs_out[None, :]) * CP + offs_c[:, None]
    mask = (offs_c < CP)[:, None] & (offs_out < T_OUT)[None, :]
    tl.store(hi_ptr + out, hi.to(tl.float16), mask=mask)
    if WRITE_LO:
        tl.store(lo_ptr + out, lo.to(tl.float16), mask=mask)
    if (pid_t == 0) & (pid_c == 0):
        tl.store(inv_ptr + row, inverse)


def split_f16(
    x: torch.Tensor,
    pad_left: int = 0,
    pad_right: int = 0,
    peak: torch.Tensor | None = None,
    head: torch.Tensor | None = None,
    tails: bool = True,
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[B, C, T]`` float32 -> ``(hi, lo, inverse)`` exactly as
    :func:`streamdec.kernels.split.split_input_f16` of ``F.pad(cat(head, x), (pad_left, pad_right))``
    (``head``, ``[B, C, H]``, may be None), in two kernels (a row-peak pass, then the split) rather than the
    handful of elementwise ones, nothing for ``torch.compile`` to generate per layer, and no padded or
    concatenated copy. ``peak`` (int32 ``[B]``, the float32 bits of each row's largest ``|x|``, as the
    fused activation hands them over) skips the first; it must cover ``head`` too. ``tails=False`` writes
    no tails and returns ``hi`` in ``lo``'s place (the single-product precision never reads it). ``head``'s
    batch rows may lie apart (a stateful call's states, gathered slot-major): it is read in place if each
    row's samples are contiguous. ``keep`` = ``(pool, slots)`` (``[S, C, L]`` float32, each slot's
    ``C * L`` samples contiguous; ``[B]`` int64) also writes each row's last ``L`` samples of
    ``cat(head, x)`` to ``pool[slots[b]]``, as ``pool.index_copy_(0, slots, ...)`` would (a stateful
    layer's new state; padding rows skipped with the rest of their work)."""
    batch, channels, samples = x.shape
    x = x.contiguous()
    if head is None or head.shape[-1] == 0:
        head = x[..., :0]
    elif head.stride(2) != 1 or head.stride(1) != head.shape[2]:
        head = head.contiguous()
    kept = head.shape[-1]
    padded = channels + (-channels % F16_CHANNEL_QUANTUM)
    length = pad_left + kept + samples + pad_right
    amax = peak if peak is not None else torch.zeros(batch, dtype=torch.int32, device=x.device)
    hi = torch.empty(batch, length, padded, dtype=torch.float16, device=x.device)
    lo = torch.empty_like(hi) if tails else hi  # without tails nothing reads ``lo``: no buffer for it
    inverse = torch.empty(batch, dtype=torch.float32, device=x.device)
    if batch == 0 or length == 0:
        return hi, lo, inverse
    live = live_count()
    live_arg = amax if live is None else live  # never read without HAS_LIVE
    if peak is None:  # a row of padding only has peak 0, as the zeroed amax says
        for part in (head, x):
            row = channels * part.shape[-1]
            if row > 0:
                _row_amax_kernel[(triton.cdiv(row, 4096), batch)](
                    part, amax, live_arg, row, part.stride(0), BLOCK=4096, HAS_LIVE=live is not None,
                    num_warps=8, **dependent_launch(x.device),
                )  # fmt: skip
    pool, slots = keep if keep is not None else (x, amax)  # never read without KEEP
    block_t = sizing.split_block_t(length)
    grid = (triton.cdiv(length, block_t), padded // F16_CHANNEL_QUANTUM, batch)
    _split_kernel[grid](
        head if kept else x, x, amax, hi, lo, inverse, live_arg, pool, slots, channels, kept,
        head.stride(0) if kept else 0, samples, padded, pad_left, length, pool.stride(0) if keep else 0,
        pool.shape[-1] if keep else 0,
        BLOCK_C=F16_CHANNEL_QUANTUM, BLOCK_T=block_t, WRITE_LO=tails, HAS_LIVE=live is not None,
        KEEP=keep is not None, num_warps=block_t * F16_CHANNEL_QUANTUM // sizing.SPLIT_ELEMENTS_PER_WARP,
        **dependent_launch(x.device),
    )  # fmt: skip
    return hi, lo, inverse


def conv1d_f16x3(
    x_hi: torch.Tensor,
    x_lo: torch.Tensor,
    x_inv: torch.Tensor,
    w_hi: torch.Tensor,
    w_lo: torch.Tensor,
    w_inv: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    tiles: Tiles | None = None,
    split: bool | None = None,
    residual: torch.Tensor | None = None,
    phases: int = 1,
    pack: bool | None = None,
    products: int = 3,
    residual_head: torch.Tensor | None = None,
    specialized: bool | None = None,
    channels_n: bool | None = None,
) -> torch.Tensor:
    """Split channels-last ``x_hi``/``x_lo`` [B, TIN, CP], packed ``w_hi``/``w_lo`` [KSIZE, COUT, CP]
    -> ``y`` [B, COUT, TOUT = TIN - (KSIZE-1)*dilation] float32, plus ``residual`` (of ``y``'s shape) if
    given. With ``phases`` = s > 1 the output channels are s phase groups of ``COUT // s``, interleaved in
    time (a transposed convolution run as s ordinary ones): ``y`` is [B, COUT // s, TOUT * s], channel
    ``p * (COUT // s) + c`` at ``y[:, c, p::s]``, and ``residual`` has that shape.

    ``residual_head`` ([B, COUT, H], H <= TOUT), if given, comes before ``residual`` in time: the residual
    added is ``cat(residual_head, residual)`` (``residual`` [B, COUT, TOUT - H], None where H = TOUT),
    which the epilogue reads where each part lies (rows and channels at any stride, samples contiguous):
    a delay line's kept history and the new samples it passes on, never concatenated.

    ``tiles``, ``split`` and ``pack`` (short rows packed, default
    :data:`streamdec.kernels.sizing.PACK_SHORT_ROWS`) override the launch
    (``scripts/bench_conv_kernels.py`` times candidates); by default :func:`streamdec.kernels.f16_launch.plan`
    decides. None changes a single bit of the result.

    ``products=1`` multiplies the heads only (the opt-in ``"fp16"`` precision: ``x_lo`` and ``w_lo``
    are never read, the products accumulate in the tensor cores).

    ``specialized`` runs three products through the warp-specialized Gluon kernel
    (:mod:`streamdec.kernels._gluon_conv_f16`): the same bits. By default it takes the launches of
    128-channel tiles on Hopper GPUs (with :data:`streamdec.kernels.sizing.SPECIALIZED_CONV` on), where it
    is faster; the Triton kernel takes the rest.

    ``channels_n`` (default :func:`streamdec.kernels.f16_launch.channels_as_n`, by the output channels)
    runs the layer with its output channels along the GEMM's N (:func:`_conv_channels_n`); ``tiles`` then
    means samples x channels, and ``split``, ``pack`` and ``specialized`` do not apply.
    """
    if products not in (1, 3):
        raise ShapeError(f"conv1d_f16x3 takes products=3 (split) or 1 (heads only), got {products}")
    batch, tin, cp = x_hi.shape
    ksize, cout, _ = w_hi.shape
    tout = tin - (ksize - 1) * dilation
    if residual_head is not None:
        check_residual_parts(
            residual_head, residual, (batch, cout // phases, max(tout, 0) * phases), "conv1d_f16x3"
        )
        if phases > 1:  # added after the interleave, as one tensor
            residual, residual_head = joined_residual(residual_head, residual), None
    if phases > 1:
        if cout % phases or cout * max(tout, 0) >= 2**31:
            raise ShapeError(
                f"{cout} output channels x {tout} samples in {phases} phases: need whole phase groups "
                "and under 2**31 elements per batch row (the interleave's 32-bit offsets)"
            )
        plain = conv1d_f16x3(
            x_hi, x_lo, x_inv, w_hi, w_lo, w_inv, bias, dilation, tiles, split, pack=pack, products=products,
            specialized=specialized, channels_n=channels_n,
        )  # fmt: skip
        out = interleave(plain, phases)
        return out if residual is None else residual + out
    y = torch.empty(batch, cout, tout, device=x_hi.device, dtype=torch.float32)
    if tout <= 0 or batch == 0:
        return y
    if channels_n is None:
        channels_n = channels_as_n(cout)
    if channels_n:
        return _conv_channels_n(
            x_hi, x_lo, x_inv, w_hi, w_lo, w_inv, bias, dilation, y, tiles, products, residual, residual_head
        )
    sms = launch_sms(x_hi.device)
    launch = plan(
        batch=batch, padded_channels=cp, cout=cout, tout=tout, ksize=ksize, sms=sms, tiles=tiles, split=split,
        pack=pack if pack is not None else sizing.PACK_SHORT_ROWS,
    )  # fmt: skip
    if residual_head is not None and not _parts_addressable(residual_head, residual, cout, launch.rows):
        residual, residual_head = joined_residual(residual_head, residual), None
    bias_arg = bias if bias is not None else x_inv  # never read without HAS_BIAS
    res_arg, tail_arg, res_sizes = _residual_args(residual_head, residual, y)
    out = (
        torch.empty(launch.chunks, batch, cout, tout, device=y.device, dtype=torch.float32)
        if launch.split
        else y
    )
    pointers = (x_inv, w_inv, bias_arg, res_arg, tail_arg, out)
    sizes = (batch, cp, cout, tin, tout, dilation, launch.chunk_steps, launch.chunks, ksize, *res_sizes)
    live = live_count()
    live_arg = x_inv if live is None else live  # never read without HAS_LIVE
    flags = {
        "HAS_RES": residual is not None or residual_head is not None, "RES_PARTS": residual_head is not None,
        "HAS_BIAS": bias is not None, "SPLIT": launch.split, "BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k, "ROWS": launch.rows,
    }  # fmt: skip
    if specialized is None:
        specialized = sizing.SPECIALIZED_CONV and launch.block_m == 128 and _specializes(y.device)
    if products == 3 and specialized:
        from streamdec.kernels._gluon_conv_f16 import gluon_descriptor, launch_gluon_conv

        descs = _operand_descriptors(x_hi, x_lo, w_hi, w_lo, launch, gluon_descriptor)
        launch_gluon_conv(
            launch.grid, descs, (*pointers, live_arg), sizes, stages=launch.stages, chunks=launch.chunks,
            HAS_LIVE=live is not None, **flags, **dependent_launch(y.device),
        )  # fmt: skip
    else:
        descs = _operand_descriptors(x_hi, x_lo, w_hi, w_lo, launch, TensorDescriptor)
        _conv1d_f16x3_kernel[launch.grid](
            *descs, *pointers, live_arg, *sizes, **flags, PRODUCTS=products, HAS_LIVE=live is not None,
            num_warps=launch.warps, num_stages=launch.stages, **dependent_launch(y.device),
        )  # fmt: skip
    if launch.split:
        _chunk_sum_kernel[(triton.cdiv(tout, 128), triton.cdiv(cout, 32), batch)](
            out, x_inv, w_inv, bias_arg, res_arg, tail_arg, y, live_arg, batch * cout * tout, cout, tout,
            launch.chunks, *res_sizes, HAS_RES=residual is not None or residual_head is not None,
            RES_PARTS=residual_head is not None, HAS_BIAS=bias is not None, BLOCK_M=32, BLOCK_N=128,
            HAS_LIVE=live is not None, num_warps=4, **dependent_launch(y.device),
        )  # fmt: skip
    return y


@functools.cache
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def _specializes(device: torch.device) -> bool:
    """Whether the warp-specialized kernel runs on ``device``: a Hopper GPU (its wgmma and register
    sharing are sm_90's) with Triton's Gluon dialect importable."""
    if device.type != "cuda" or triton.knobs.runtime.interpret:
        return False
    if not _hopper(device.index if device.index is not None else torch.cuda.current_device()):
        return False
    return importlib.util.find_spec("triton.experimental.gluon") is not None


def _conv_channels_n(
    x_hi: torch.Tensor,
    x_lo: torch.Tensor,
    x_inv: torch.Tensor,
    w_hi: torch.Tensor,
    w_lo: torch.Tensor,
    w_inv: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    y: torch.Tensor,
    tiles: Tiles | None,
    products: int,
    residual: torch.Tensor | None,
    residual_head: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`conv1d_f16x3` of a layer whose output channels are the GEMM's N, into ``y``."""
    batch, tin, cp = x_hi.shape
    ksize, cout, _ = w_hi.shape
    tout = y.shape[2]
    launch = plan_channels(batch=batch, padded_channels=cp, cout=cout, tout=tout, ksize=ksize, tiles=tiles)
    if residual_head is not None and not _parts_addressable(residual_head, residual, cout, 1):
        residual, residual_head = joined_residual(residual_head, residual), None
    x_box, w_box = [launch.block_t, launch.block_k], [launch.block_o, launch.block_k]
    xh, xl = (TensorDescriptor(x, [batch * tin, cp], [cp, 1], x_box) for x in (x_hi, x_lo))
    wh, wl = (TensorDescriptor(w, [ksize * cout, cp], [cp, 1], w_box) for w in (w_hi, w_lo))
    bias_arg = bias if bias is not None else x_inv  # never read without HAS_BIAS
    res_arg, tail_arg, res_sizes = _residual_args(residual_head, residual, y)
    live = live_count()
    _conv1d_f16x3_cn_kernel[launch.grid](
        xh, xl, wh, wl, x_inv, w_inv, bias_arg, res_arg, tail_arg, y, x_inv if live is None else live,
        batch, cp, cout, tin, tout, dilation, launch.chunk_steps, launch.chunks, ksize, *res_sizes,
        HAS_RES=residual is not None or residual_head is not None, RES_PARTS=residual_head is not None,
        HAS_BIAS=bias is not None, BLOCK_T=launch.block_t, BLOCK_O=launch.block_o, BLOCK_K=launch.block_k,
        PRODUCTS=products, HAS_LIVE=live is not None, num_warps=launch.warps, num_stages=launch.stages,
        **dependent_launch(y.device),
    )  # fmt: skip
    return y


def _operand_descriptors(
    x_hi: torch.Tensor, x_lo: torch.Tensor, w_hi: torch.Tensor, w_lo: torch.Tensor, launch: Launch, make: Any
) -> tuple[Any, Any, Any, Any]:
    """TMA descriptors of the four operands for ``launch``, made by ``make(tensor, shape, strides, box)``:
    ``(x_hi, x_lo, w_hi, w_lo)``."""
    batch, tin, cp = x_hi.shape
    ksize, cout, _ = w_hi.shape
    w_box = [launch.block_m, launch.block_k]
    if launch.rows > 1:  # short rows packed: 3-D boxes, each row zero-filled past its own end
        x_box = [launch.rows, launch.block_n // launch.rows, launch.block_k]
        xh, xl = (make(x, [batch, tin, cp], [tin * cp, cp, 1], x_box) for x in (x_hi, x_lo))
    else:
        x_box = [launch.block_n, launch.block_k]
        xh, xl = (make(x, [batch * tin, cp], [cp, 1], x_box) for x in (x_hi, x_lo))
    wh, wl = (make(w, [ksize * cout, cp], [cp, 1], w_box) for w in (w_hi, w_lo))
    return xh, xl, wh, wl


def _parts_addressable(head: torch.Tensor, tail: torch.Tensor | None, cout: int, rows: int) -> bool:
    """Whether the epilogue can read a residual in two parts: contiguous samples, and every offset from a
    tile's first row (``rows`` rows a program) within 32 bits."""
    for part in (head, tail):
        if part is None or part.numel() == 0:
            continue
        if part.shape[2] > 1 and part.stride(2) != 1:
            return False
        if rows * part.stride(0) + cout * part.stride(1) + part.shape[2] >= 2**31:
            return False
    return True


def _residual_args(
    head: torch.Tensor | None, residual: torch.Tensor | None, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int, int, int]]:
    """The kernels' residual arguments: (first part or the whole residual, second part, the parts' sizes).
    Pointers that are never read point at ``y``."""
    if head is None:
        return (residual.contiguous() if residual is not None else y), y, (0, 0, 0, 0, 0)
    tail = residual if residual is not None and residual.numel() else y  # never read: all in the head
    return head, tail, (head.stride(0), head.stride(1), head.shape[2], tail.stride(0), tail.stride(1))


def interleave(y: torch.Tensor, phases: int) -> torch.Tensor:
    """``[B, s * C, T]`` -> ``[B, C, T * s]``, channel ``p * C + c`` to ``[:, c, p::s]`` (s = ``phases``),
    in one pass that writes contiguously."""
    batch, channels, length = y.shape
    out = torch.empty(batch, channels // phases, length * phases, dtype=y.dtype, device=y.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(length * phases, 256), triton.cdiv(channels // phases, 16), batch)
    live = live_count()
    _interleave_kernel[grid](
        y, out, y if live is None else live, channels // phases, length, phases, BLOCK_C=16, BLOCK_T=256,
        HAS_LIVE=live is not None, num_warps=4, **dependent_launch(y.device),
    )  # fmt: skip
    return out
