# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return,misc,assignment"
"""Triton kernels for the fused alias-free activation (imported only where Triton and CUDA exist).

Math (one row ``x[0..T)`` of ``[B*C, T]``, taps ``f[0..12)``, clamp ``c(i) = min(max(i, 0), T-1)``):

* even phase ``up_e(m) = up[2m]   = 2 * sum_q f[2q+1] * x[c(m+2-q)]``, ``q = 0..5``
* odd phase  ``up_o(m) = up[2m+1] = 2 * sum_q f[2q]   * x[c(m+3-q)]``
  (the replicate pad 5 / transposed conv / crop 15 of the reference, in polyphase form);
* ``S(i) = snake(up[max(i, 0)])`` (the causal replicate pad 11 of the down filter);
* ``out[t] = sum_j f[11-2j] * S(2(t-j)) + sum_r f[2r] * S(2(t-6+r)+1)``, ``j, r = 0..5``.

Two kernels compute exactly this. ``halo`` (v4, the default): each lane owns 8 or 16 consecutive outputs,
evaluates only their own upsampled samples of ``S`` (2 + 2/31 SnakeBetas per output) and takes the 11
before its block from the lane to its left by warp shuffles. ``blocked`` (v3, kept for comparison): each
lane owns 8 outputs and evaluates all 26 samples of ``S`` they need (3.25 SnakeBetas per output). Both
give the same bits. They replaced two earlier versions (timings and history in ``docs/kernels.md``):
``direct`` (v1) missed the 1e-5 bound on one H200 draw, and ``staged`` (v2, a persistent grid parking
``S`` in global scratch between barriers) was 2.6x slower over auk-24k's activations on an H200.

``sin`` is evaluated as ``sin(r)`` with ``r = z - k*pi`` (``sin^2`` has period ``pi``) by an odd Taylor
polynomial to ``r^13`` on ``|r| <= pi/2``: error under 1e-9 before rounding. Under the Triton interpreter
every FMA rounds twice (numpy), so interpreted outputs differ from the GPU's in the last bits; the two
kernels' interpreted outputs are still equal to each other, sample for sample.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from streamdec.kernels import sizing
from streamdec.kernels._triton_dependent import dependent_launch, wait_for_inputs
from streamdec.kernels.conv import keep_tail
from streamdec.kernels.rows import live_count
from streamdec.kernels.sizing import pow2_block

_INV_PI: tl.constexpr = tl.constexpr(0.3183098861837907)
_PI_HI: tl.constexpr = tl.constexpr(3.1415927410125732)  # float32(pi)
_PI_LO: tl.constexpr = tl.constexpr(-8.742278000372475e-08)  # pi - float32(pi)
_S3: tl.constexpr = tl.constexpr(-1.0 / 6.0)
_S5: tl.constexpr = tl.constexpr(1.0 / 120.0)
_S7: tl.constexpr = tl.constexpr(-1.0 / 5040.0)
_S9: tl.constexpr = tl.constexpr(1.0 / 362880.0)
_S11: tl.constexpr = tl.constexpr(-1.0 / 39916800.0)
_S13: tl.constexpr = tl.constexpr(1.0 / 6227020800.0)


# The halo kernel floors by inline PTX instead of tl.floor: tl.floor comes from libdevice (its FTZ branch,
# decided by __nvvm_reflect), and LLVM's NVVMReflect pass crashed compiling that kernel in about half the
# runs (Triton 3.6, offline for sm_90a; a use-after-free in handleReflectFunction). The instruction is the
# one libdevice's branch emits (cvt.rmi.ftz.f32.f32), so the bits are the same; the interpreter, which
# runs no PTX, takes tl.floor.
_ASM_FLOOR: tl.constexpr = tl.constexpr(not triton.knobs.runtime.interpret)


@triton.jit
def _floor(v):
    if _ASM_FLOOR:
        return tl.inline_asm_elementwise(
            "cvt.rmi.ftz.f32.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.floor(v)


@triton.jit
def _snake(v, a, b, ASM_FLOOR: tl.constexpr = False):
    """``v + b * sin(a * v)**2`` with the period-pi reduction described in the module docstring."""
    z = a * v
    k = _floor(z * _INV_PI + 0.5) if ASM_FLOOR else tl.floor(z * _INV_PI + 0.5)
    r = z - k * _PI_HI
    r = r - k * _PI_LO
    r2 = r * r
    p = _S13
    p = p * r2 + _S11
    p = p * r2 + _S9
    p = p * r2 + _S7
    p = p * r2 + _S5
    p = p * r2 + _S3
    p = p * r2 + 1.0
    s = r * p
    return v + b * (s * s)


@triton.jit
def _sum6(c0, c1, c2, c3, c4, c5, x0, x1, x2, x3, x4, x5):
    # Called with doubled taps: 2 * sum(c * x) exactly, since scaling by 2 commutes with every rounding.
    return c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3 + c4 * x4 + c5 * x5


@triton.jit
def _load_at(base, head, i, last, H, HAS_HEAD: tl.constexpr):
    """Sample ``clamp(i, 0, last)`` of the row ``cat(head, x)`` (``x`` at ``base``, the head's row at
    ``head``; ``H`` head samples)."""
    j = tl.minimum(tl.maximum(i, 0), last)
    if HAS_HEAD:  # one load from whichever part holds the sample
        return tl.load(tl.where(j < H, head + j, base + (j - H)))
    return tl.load(base + j)


# v3 "blocked": every lane owns K = 8 consecutive outputs and computes the K + 5 even and K + 5 odd samples of
# S they need once (2 + 10/K SnakeBetas per output instead of 12 when each output computes its own); outputs leave through a join as
# one contiguous [BLOCK, 8] tile. Generated text (one line per value): shifts between named registers are
# free, where a vector shift is not.
@triton.jit(do_not_specialize=["C", "R", "H", "HEAD_BATCH", "START", "N"])
def _af_blocked_kernel(
    x_ptr, out_ptr, f_ptr, a_ptr, b_ptr, peak_ptr, T, C, R, head_ptr, H, HEAD_BATCH, START, N,
    BLOCK: tl.constexpr, K: tl.constexpr, ROW_LANES: tl.constexpr, WITH_PEAK: tl.constexpr,
    HAS_HEAD: tl.constexpr,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):  # fmt: skip
    # A row is cat(head, x) (H + T samples; H = 0 without a head) and the kernel writes its outputs
    # START .. START + N - 1 as a row of N: a stateful step's activation reads its kept history and new
    # samples in place and computes only the outputs it keeps. START is 0 or at least 5 (the host checks):
    # lanes are placed from START, and the left-edge fix-up below is only right for a lane at sample 0.
    # Lanes are (row, block of K outputs) pairs, ROW_LANES lanes to a row: a program covers BLOCK // ROW_LANES
    # rows, so rows shorter than a warp's K * 32 outputs (a stateful step's 20-60 samples) do not leave most
    # lanes masked. Every output is computed by the same arithmetic whatever the packing.
    # One row a program (ROW_LANES == BLOCK, every whole-clip row) keeps the row, its parameters and the
    # peak's atomic scalar: as per-lane vectors they cost a whole-clip decode 4 % for nothing.
    wait_for_inputs(DEPENDENT)
    lane = tl.arange(0, BLOCK)
    if ROW_LANES == BLOCK:
        row = tl.program_id(0)
        row_ok = row < R
    else:
        row_wanted = tl.program_id(0) * (BLOCK // ROW_LANES) + lane // ROW_LANES
        row_ok = row_wanted < R
        row = tl.minimum(row_wanted, R - 1)  # lanes past the last row redo its work and store nothing
    tb = START + tl.program_id(1) * (ROW_LANES * K) + (lane % ROW_LANES) * K  # first output of each lane
    c = row % C
    a = tl.load(a_ptr + c)
    b = tl.load(b_ptr + c)
    f0 = tl.load(f_ptr + 0)
    f1 = tl.load(f_ptr + 1)
    f2 = tl.load(f_ptr + 2)
    f3 = tl.load(f_ptr + 3)
    f4 = tl.load(f_ptr + 4)
    f5 = tl.load(f_ptr + 5)
    f6 = tl.load(f_ptr + 6)
    f7 = tl.load(f_ptr + 7)
    f8 = tl.load(f_ptr + 8)
    f9 = tl.load(f_ptr + 9)
    f10 = tl.load(f_ptr + 10)
    f11 = tl.load(f_ptr + 11)
    g0, g1, g2, g3, g4, g5 = 2.0 * f0, 2.0 * f1, 2.0 * f2, 2.0 * f3, 2.0 * f4, 2.0 * f5
    g6, g7, g8, g9, g10, g11 = 2.0 * f6, 2.0 * f7, 2.0 * f8, 2.0 * f9, 2.0 * f10, 2.0 * f11
    base = x_ptr + row.to(tl.int64) * T
    # The head's batch rows may lie HEAD_BATCH apart (a stateful call's states, gathered slot-major), each
    # batch row's channels contiguous.
    head = head_ptr + (row // C).to(tl.int64) * HEAD_BATCH + c * H
    last = H + T - 1
    # fmt: off
    # Clamped loads everywhere: an unclamped interior branch (as the staged kernel had) next to the join below
    # made Triton 3.6 segfault in make_ptx for some block sizes (seen on the H200 and reproduced offline).
    xm8 = _load_at(base, head, tb + -8, last, H, HAS_HEAD)
    xm7 = _load_at(base, head, tb + -7, last, H, HAS_HEAD)
    xm6 = _load_at(base, head, tb + -6, last, H, HAS_HEAD)
    xm5 = _load_at(base, head, tb + -5, last, H, HAS_HEAD)
    xm4 = _load_at(base, head, tb + -4, last, H, HAS_HEAD)
    xm3 = _load_at(base, head, tb + -3, last, H, HAS_HEAD)
    xm2 = _load_at(base, head, tb + -2, last, H, HAS_HEAD)
    xm1 = _load_at(base, head, tb + -1, last, H, HAS_HEAD)
    xp0 = _load_at(base, head, tb, last, H, HAS_HEAD)
    xp1 = _load_at(base, head, tb + 1, last, H, HAS_HEAD)
    xp2 = _load_at(base, head, tb + 2, last, H, HAS_HEAD)
    xp3 = _load_at(base, head, tb + 3, last, H, HAS_HEAD)
    xp4 = _load_at(base, head, tb + 4, last, H, HAS_HEAD)
    xp5 = _load_at(base, head, tb + 5, last, H, HAS_HEAD)
    xp6 = _load_at(base, head, tb + 6, last, H, HAS_HEAD)
    xp7 = _load_at(base, head, tb + 7, last, H, HAS_HEAD)
    xp8 = _load_at(base, head, tb + 8, last, H, HAS_HEAD)
    xp9 = _load_at(base, head, tb + 9, last, H, HAS_HEAD)
    # Even phase E[u] = S(2(tb+u)), u = -5..K-1: taps g1..g11 over x[tb+u+2 .. tb+u-3].
    em5 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xm3, xm4, xm5, xm6, xm7, xm8), a, b)
    em4 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xm2, xm3, xm4, xm5, xm6, xm7), a, b)
    em3 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xm1, xm2, xm3, xm4, xm5, xm6), a, b)
    em2 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp0, xm1, xm2, xm3, xm4, xm5), a, b)
    em1 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp1, xp0, xm1, xm2, xm3, xm4), a, b)
    e0 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp2, xp1, xp0, xm1, xm2, xm3), a, b)
    e1 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp3, xp2, xp1, xp0, xm1, xm2), a, b)
    e2 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp4, xp3, xp2, xp1, xp0, xm1), a, b)
    e3 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp5, xp4, xp3, xp2, xp1, xp0), a, b)
    e4 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp6, xp5, xp4, xp3, xp2, xp1), a, b)
    e5 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp7, xp6, xp5, xp4, xp3, xp2), a, b)
    e6 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp8, xp7, xp6, xp5, xp4, xp3), a, b)
    e7 = _snake(_sum6(g1, g3, g5, g7, g9, g11, xp9, xp8, xp7, xp6, xp5, xp4), a, b)
    # Odd phase O[u] = S(2(tb+u)+1), u = -6..K-2: taps g0..g10 over x[tb+u+3 .. tb+u-2].
    om6 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xm3, xm4, xm5, xm6, xm7, xm8), a, b)
    om5 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xm2, xm3, xm4, xm5, xm6, xm7), a, b)
    om4 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xm1, xm2, xm3, xm4, xm5, xm6), a, b)
    om3 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp0, xm1, xm2, xm3, xm4, xm5), a, b)
    om2 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp1, xp0, xm1, xm2, xm3, xm4), a, b)
    om1 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp2, xp1, xp0, xm1, xm2, xm3), a, b)
    o0 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp3, xp2, xp1, xp0, xm1, xm2), a, b)
    o1 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp4, xp3, xp2, xp1, xp0, xm1), a, b)
    o2 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp5, xp4, xp3, xp2, xp1, xp0), a, b)
    o3 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp6, xp5, xp4, xp3, xp2, xp1), a, b)
    o4 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp7, xp6, xp5, xp4, xp3, xp2), a, b)
    o5 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp8, xp7, xp6, xp5, xp4, xp3), a, b)
    o6 = _snake(_sum6(g0, g2, g4, g6, g8, g10, xp9, xp8, xp7, xp6, xp5, xp4), a, b)
    # S at negative positions is S(0) = E[0] of the row's first lane (tb = 0).
    em5 = tl.where(tb + -5 < 0, e0, em5)
    em4 = tl.where(tb + -4 < 0, e0, em4)
    em3 = tl.where(tb + -3 < 0, e0, em3)
    em2 = tl.where(tb + -2 < 0, e0, em2)
    em1 = tl.where(tb + -1 < 0, e0, em1)
    om6 = tl.where(tb + -6 < 0, e0, om6)
    om5 = tl.where(tb + -5 < 0, e0, om5)
    om4 = tl.where(tb + -4 < 0, e0, om4)
    om3 = tl.where(tb + -3 < 0, e0, om3)
    om2 = tl.where(tb + -2 < 0, e0, om2)
    om1 = tl.where(tb + -1 < 0, e0, om1)
    # out[tb+k] = sum_j f[11-2j] E[k-j] + sum_r f[2r] O[k-6+r].
    y0 = (f11 * e0 + f9 * em1 + f7 * em2 + f5 * em3 + f3 * em4 + f1 * em5
          + f0 * om6 + f2 * om5 + f4 * om4 + f6 * om3 + f8 * om2 + f10 * om1)
    y1 = (f11 * e1 + f9 * e0 + f7 * em1 + f5 * em2 + f3 * em3 + f1 * em4
          + f0 * om5 + f2 * om4 + f4 * om3 + f6 * om2 + f8 * om1 + f10 * o0)
    y2 = (f11 * e2 + f9 * e1 + f7 * e0 + f5 * em1 + f3 * em2 + f1 * em3
          + f0 * om4 + f2 * om3 + f4 * om2 + f6 * om1 + f8 * o0 + f10 * o1)
    y3 = (f11 * e3 + f9 * e2 + f7 * e1 + f5 * e0 + f3 * em1 + f1 * em2
          + f0 * om3 + f2 * om2 + f4 * om1 + f6 * o0 + f8 * o1 + f10 * o2)
    y4 = (f11 * e4 + f9 * e3 + f7 * e2 + f5 * e1 + f3 * e0 + f1 * em1
          + f0 * om2 + f2 * om1 + f4 * o0 + f6 * o1 + f8 * o2 + f10 * o3)
    y5 = (f11 * e5 + f9 * e4 + f7 * e3 + f5 * e2 + f3 * e1 + f1 * e0
          + f0 * om1 + f2 * o0 + f4 * o1 + f6 * o2 + f8 * o3 + f10 * o4)
    y6 = (f11 * e6 + f9 * e5 + f7 * e4 + f5 * e3 + f3 * e2 + f1 * e1
          + f0 * o0 + f2 * o1 + f4 * o2 + f6 * o3 + f8 * o4 + f10 * o5)
    y7 = (f11 * e7 + f9 * e6 + f7 * e5 + f5 * e4 + f3 * e3 + f1 * e2
          + f0 * o1 + f2 * o2 + f4 * o3 + f6 * o4 + f8 * o5 + f10 * o6)
    # fmt: on
    # join adds a new minor axis, so the last join picks the lowest bit of k: pair outputs bit-reversed.
    y = tl.reshape(
        tl.join(tl.join(tl.join(y0, y4), tl.join(y2, y6)), tl.join(tl.join(y1, y5), tl.join(y3, y7))),
        [BLOCK, K],
    )
    t = tb[:, None] + tl.arange(0, K)[None, :]
    if ROW_LANES == BLOCK:
        keep = t < START + N
        tl.store(out_ptr + row.to(tl.int64) * N + (t - START), y, mask=keep)
    else:
        keep = (t < START + N) & row_ok[:, None]
        tl.store(out_ptr + (row.to(tl.int64) * N)[:, None] + (t - START), y, mask=keep)
    if WITH_PEAK:  # peak_ptr[batch] <- bits of max |y| over the batch row (see _row_amax_kernel)
        bits = tl.where(keep, tl.abs(y), 0.0).to(tl.int32, bitcast=True)
        if ROW_LANES == BLOCK:
            tl.atomic_max(peak_ptr + row // C, tl.max(tl.max(bits, axis=1), axis=0))
        else:
            tl.atomic_max(peak_ptr + row // C, tl.max(bits, axis=1), mask=row_ok)


# v4 "halo": every lane owns K (8 or 16) consecutive outputs and computes only their own K even and K odd
# samples of S (one SnakeBeta per upsampled sample); the 5 even and 6 odd samples before its block, which
# its outputs also read, it takes from the lane to its left by warp shuffles (tl.gather within a warp). The
# first lane of every segment (a warp, or a packed row's lanes) has no left neighbour: it is a halo lane
# whose outputs are not stored, so 32 lanes write 31 * K outputs (2 + 2/31 SnakeBetas per output). Values
# are tuples indexed by constexprs (unrolled: shifts between named registers are free). Every sample of S
# and every output is the blocked kernel's expression with its FMA contraction written out (_fma6,
# _output), so the bits are the blocked kernel's (compared in the compiled PTX by the unit tests).
@triton.jit
def _taps(f_ptr):
    return (
        tl.load(f_ptr + 0), tl.load(f_ptr + 1), tl.load(f_ptr + 2), tl.load(f_ptr + 3), tl.load(f_ptr + 4),
        tl.load(f_ptr + 5), tl.load(f_ptr + 6), tl.load(f_ptr + 7), tl.load(f_ptr + 8), tl.load(f_ptr + 9),
        tl.load(f_ptr + 10), tl.load(f_ptr + 11),
    )  # fmt: skip


@triton.jit
def _fma6(c0, c1, c2, c3, c4, c5, x0, x1, x2, x3, x4, x5):
    """``c0*x0 + ... + c5*x5`` contracted as the blocked kernel's compiled sums are: the first product
    rounded, then one FMA per term in order (explicit, so no compiler heuristic picks another pairing)."""
    acc = tl.fma(c1, x1, c0 * x0)
    acc = tl.fma(c2, x2, acc)
    acc = tl.fma(c3, x3, acc)
    acc = tl.fma(c4, x4, acc)
    return tl.fma(c5, x5, acc)


@triton.jit
def _even(g, xs, u: tl.constexpr, a, b):
    """E[u] = S(2(tb+u)): taps g1..g11 over x[tb+u+2 .. tb+u-3] (``xs[i] = x[tb+i-3]``)."""
    up = _fma6(
        g[1], g[3], g[5], g[7], g[9], g[11], xs[u + 5], xs[u + 4], xs[u + 3], xs[u + 2], xs[u + 1], xs[u]
    )
    return _snake(up, a, b, True)


@triton.jit
def _odd(g, xs, u: tl.constexpr, a, b):
    """O[u] = S(2(tb+u)+1): taps g0..g10 over x[tb+u+3 .. tb+u-2]."""
    up = _fma6(
        g[0], g[2], g[4], g[6], g[8], g[10], xs[u + 6], xs[u + 5], xs[u + 4], xs[u + 3], xs[u + 2], xs[u + 1]
    )
    return _snake(up, a, b, True)


@triton.jit
def _output(f, e, o, k: tl.constexpr):
    """``out[tb+k] = sum_j f[11-2j] E[k-j] + sum_r f[2r] O[k-6+r]`` (``e[i] = E[i-5]``, ``o[i] = O[i-6]``),
    contracted as the blocked kernel's compiled outputs are: at a block's first output (k % 8 == 0)
    LLVM paired ``f9 * E[-1]`` first (its operand is a select there), elsewhere ``f11 * E[k]``."""
    first = k % 8 == 0
    acc = tl.fma(f[11], e[k + 5], f[9] * e[k + 4]) if first else tl.fma(f[9], e[k + 4], f[11] * e[k + 5])
    acc = tl.fma(f[7], e[k + 3], acc)
    acc = tl.fma(f[5], e[k + 2], acc)
    acc = tl.fma(f[3], e[k + 1], acc)
    acc = tl.fma(f[1], e[k], acc)
    acc = tl.fma(f[0], o[k], acc)
    acc = tl.fma(f[2], o[k + 1], acc)
    acc = tl.fma(f[4], o[k + 2], acc)
    acc = tl.fma(f[6], o[k + 3], acc)
    acc = tl.fma(f[8], o[k + 4], acc)
    return tl.fma(f[10], o[k + 5], acc)


@triton.jit
def _halo_loads(base, head, tb, last, H, HAS_HEAD: tl.constexpr, K: tl.constexpr, EDGE: tl.constexpr):
    """``x[tb - 3 .. tb + K + 2]`` of each lane's row ``cat(head, x)``, clamped to the row, as a tuple.

    ``EDGE`` says what the program's loads can meet: 0 nothing (every sample lies in ``x``: one address a
    lane, constant offsets), 1 only the row's end (a min a load), 2 anything (clamps and the head)."""
    xs = ()
    if EDGE == 0:
        p = base + (tb - H)
        for d in tl.static_range(K + 6):
            xs = xs + (tl.load(p + (d - 3)),)  # noqa: RUF005 (no starred tuples in Triton)
    elif EDGE == 1:
        p = base + (tb - H)
        for d in tl.static_range(K + 6):
            xs = xs + (tl.load(p + tl.minimum(last - tb, d - 3)),)  # noqa: RUF005 (no starred tuples in Triton)
    else:
        for d in tl.static_range(K + 6):
            xs = xs + (_load_at(base, head, tb + (d - 3), last, H, HAS_HEAD),)  # noqa: RUF005 (no starred tuples in Triton)
    return xs


@triton.jit
def _from_left(v, src, WARPS: tl.constexpr):
    """Each lane's ``v`` from lane ``src`` of its warp (a gather along a warp's 32 lanes: shuffles)."""
    return tl.reshape(tl.gather(tl.reshape(v, [WARPS, 32]), src, 1), [WARPS * 32])


@triton.jit
def _join8(y0, y1, y2, y3, y4, y5, y6, y7):
    # join adds a new minor axis, so the last join picks the lowest bit of k: pair outputs bit-reversed.
    return tl.join(tl.join(tl.join(y0, y4), tl.join(y2, y6)), tl.join(tl.join(y1, y5), tl.join(y3, y7)))


@triton.jit
def _join_block(ys, K: tl.constexpr):
    """``[lanes, K]`` from a tuple of K per-lane outputs (K = 8 or 16)."""
    if K == 8:
        y = _join8(ys[0], ys[1], ys[2], ys[3], ys[4], ys[5], ys[6], ys[7])
    else:
        y = tl.join(
            _join8(ys[0], ys[2], ys[4], ys[6], ys[8], ys[10], ys[12], ys[14]),
            _join8(ys[1], ys[3], ys[5], ys[7], ys[9], ys[11], ys[13], ys[15]),
        )
    return tl.reshape(y, [ys[0].shape[0], K])


# sizes and offsets that take a new value per layer or step: one binary for all of them
_HALO_RUNTIME_INTS = ["C", "H", "HEAD_BATCH", "START", "N", "KEEP_ROW", "KEEP_LEN",
                      "BEFORE_BATCH", "BEFORE_LEN"]  # fmt: skip


@triton.jit(do_not_specialize=_HALO_RUNTIME_INTS)
def _af_halo_kernel(
    x_ptr, out_ptr, f_ptr, a_ptr, b_ptr, peak_ptr, T, C, head_ptr, H, HEAD_BATCH, START, N, live_ptr,
    keep_ptr, slots_ptr, KEEP_ROW, KEEP_LEN, before_ptr, BEFORE_BATCH, BEFORE_LEN,
    K: tl.constexpr, WARPS: tl.constexpr, SEG: tl.constexpr, PACKED: tl.constexpr, WITH_PEAK: tl.constexpr,
    HAS_HEAD: tl.constexpr, HAS_LIVE: tl.constexpr = False, KEEP: tl.constexpr = False,
    KEEP_ROWS: tl.constexpr = 1, KEEP_BLOCK: tl.constexpr = 16,
    HAS_BEFORE: tl.constexpr = False, BEFORE_BLOCK: tl.constexpr = 16, BEFORE_STEPS: tl.constexpr = 1,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):  # fmt: skip
    # A row is cat(head, x) (H + T samples; H = 0 without a head); the kernel writes its outputs START ..
    # START + N - 1 as a row of N. Programs are per batch row (program_id(1)), so nothing divides by C.
    # Whole rows (PACKED False): a program is one channel's (program_id(0)) span of WARPS * 31 * K outputs
    # (program_id(2)), each warp a segment, its lane 0 the halo lane. Packed short rows: a segment is one
    # row's SEG lanes (a halo lane, then SEG - 1 lanes of K outputs), 32 // SEG rows to a warp, and a
    # program holds WARPS * (32 // SEG) consecutive channels of one batch row.
    wait_for_inputs(DEPENDENT)
    lane = tl.arange(0, WARPS * 32)
    ln = lane % 32  # lane in its warp
    j = ln % SEG  # place in the segment; 0: the halo lane
    batch = tl.program_id(1)
    # live_ptr: [1] int64, batch rows at or past it are padding (streamdec.kernels.rows)
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= tl.load(live_ptr):
            return
    if PACKED:
        RPW: tl.constexpr = 32 // SEG
        c_wanted = tl.program_id(0) * (WARPS * RPW) + (lane // 32) * RPW + ln // SEG
        row_ok = (c_wanted < C) & (ln < RPW * SEG)
        c = tl.minimum(c_wanted, C - 1)  # lanes past the last row redo its work and store nothing
        tb = START + (j - 1) * K  # first output of each lane
        s0 = START  # first output of the program's first real lanes
    else:
        c = tl.program_id(0)
        s0 = START + tl.program_id(2) * (WARPS * 31 * K)
        tb = s0 + (lane // 32) * (31 * K) + (j - 1) * K
    row = batch * C + c
    a = tl.load(a_ptr + c)
    b = tl.load(b_ptr + c)
    f = _taps(f_ptr)
    # Called with doubled taps: 2 * sum(c * x) exactly (as in the blocked kernel).
    g = (2.0 * f[0], 2.0 * f[1], 2.0 * f[2], 2.0 * f[3], 2.0 * f[4], 2.0 * f[5], 2.0 * f[6], 2.0 * f[7],
         2.0 * f[8], 2.0 * f[9], 2.0 * f[10], 2.0 * f[11])  # fmt: skip
    base = x_ptr + row.to(tl.int64) * T
    head = head_ptr + batch.to(tl.int64) * HEAD_BATCH + c * H
    last = H + T - 1
    if PACKED:
        xs = _halo_loads(base, head, tb, last, H, HAS_HEAD, K, 2)
    else:  # the program's loads reach x[s0 - K - 3 .. s0 + WARPS * 31 * K + 2]
        inside = s0 - K - 3 >= H
        if inside & (s0 + WARPS * 31 * K + 2 <= last):
            xs = _halo_loads(base, head, tb, last, H, HAS_HEAD, K, 0)
        elif inside:
            xs = _halo_loads(base, head, tb, last, H, HAS_HEAD, K, 1)
        else:
            xs = _halo_loads(base, head, tb, last, H, HAS_HEAD, K, 2)
    # Even phase E[u] = S(2(tb+u)), taps g1..g11 over x[tb+u+2 .. tb+u-3]; odd phase O[u] = S(2(tb+u)+1),
    # taps g0..g10 over x[tb+u+3 .. tb+u-2]; xs[i] = x[tb+i-3].
    es = ()
    for u in tl.static_range(K):
        es = es + (_even(g, xs, u, a, b),)  # noqa: RUF005 (no starred tuples in Triton)
    os = ()
    for u in tl.static_range(K):
        os = os + (_odd(g, xs, u, a, b),)  # noqa: RUF005
    # The samples before the block, from the lane to the left: E[-5..-1], O[-6..-1].
    src = tl.reshape(tl.maximum(ln - 1, 0), [WARPS, 32])
    ev = ()
    for i in tl.static_range(5):
        ev = ev + (_from_left(es[K - 5 + i], src, WARPS),)  # noqa: RUF005 (no starred tuples in Triton)
    od = ()
    for i in tl.static_range(6):
        od = od + (_from_left(os[K - 6 + i], src, WARPS),)  # noqa: RUF005 (no starred tuples in Triton)
    # S at negative positions is S(0). Only a lane at sample 0 (all 11 samples before it) or at sample 5
    # (O[-6] = S(-1)) has any; S(0) is its E[0], or E[-5] from the lane to its left. Halo lanes may match
    # too, harmlessly: nothing of theirs is stored.
    at0 = tb == 0
    s00 = tl.where(at0, es[0], ev[0])
    ev = (s00, tl.where(at0, s00, ev[1]), tl.where(at0, s00, ev[2]), tl.where(at0, s00, ev[3]),
          tl.where(at0, s00, ev[4]))  # fmt: skip
    od = (tl.where(at0 | (tb == 5), s00, od[0]), tl.where(at0, s00, od[1]), tl.where(at0, s00, od[2]),
          tl.where(at0, s00, od[3]), tl.where(at0, s00, od[4]), tl.where(at0, s00, od[5]))  # fmt: skip
    e = ev + es  # e[i] = S(2(tb+i-5))
    o = od + os  # o[i] = S(2(tb+i-6)+1)
    ys = ()
    for k in tl.static_range(K):
        ys = ys + (_output(f, e, o, k),)  # noqa: RUF005 (no starred tuples in Triton)
    y = _join_block(ys, K)
    t = tb[:, None] + tl.arange(0, K)[None, :]
    if PACKED:
        keep = (t < START + N) & ((j >= 1) & row_ok)[:, None]
        tl.store(out_ptr + (row.to(tl.int64) * N)[:, None] + (t - START), y, mask=keep)
    else:
        keep = (t < START + N) & (j >= 1)[:, None]
        tl.store(out_ptr + row.to(tl.int64) * N + (t - START), y, mask=keep)
    if WITH_PEAK:  # peak_ptr[batch] <- bits of max |y| over the batch row; one atomic a program
        bits = tl.where(keep, tl.abs(y), 0.0).to(tl.int32, bitcast=True)
        best = tl.max(tl.max(bits, axis=1), axis=0)
        if HAS_BEFORE:  # the same channels of the history the next convolution reads before this window
            if PACKED:
                per_program: tl.constexpr = WARPS * (32 // SEG)
                c_first, c_count = tl.program_id(0) * per_program, per_program
            else:  # one program of each row
                c_first, c_count = c, tl.where(tl.program_id(2) == 0, 1, 0)
            best = tl.maximum(
                best,
                _history_peak(before_ptr, batch, c_first, c_count, C, BEFORE_BATCH, BEFORE_LEN, BEFORE_BLOCK,
                              BEFORE_STEPS),
            )  # fmt: skip
        tl.atomic_max(peak_ptr + batch, best)
    if KEEP:  # a stateful layer's new state: the last KEEP_LEN inputs of each row, to the row's slot
        if PACKED:
            per: tl.constexpr = WARPS * (32 // SEG)  # the program's rows (channels)
            _keep_last(x_ptr, head_ptr, keep_ptr, slots_ptr, batch, tl.program_id(0) * per, per, C, T, H,
                       HEAD_BATCH, KEEP_ROW, KEEP_LEN, KEEP_ROWS, KEEP_BLOCK)  # fmt: skip
        elif tl.program_id(2) == 0:  # one program of each row
            _keep_last(x_ptr, head_ptr, keep_ptr, slots_ptr, batch, c, 1, C, T, H, HEAD_BATCH, KEEP_ROW,
                       KEEP_LEN, KEEP_ROWS, KEEP_BLOCK)  # fmt: skip


@triton.jit
def _keep_last(
    x_ptr, head_ptr, keep_ptr, slots_ptr, batch, c0, count, C, T, H, HEAD_BATCH, KEEP_ROW, KEEP_LEN,
    KEEP_ROWS: tl.constexpr, KEEP_BLOCK: tl.constexpr,
):  # fmt: skip
    """Copy samples ``H + T - KEEP_LEN ..`` of rows ``cat(head, x)`` of channels ``c0 .. c0 + count - 1``
    of one batch row to ``keep[slots[batch]]`` (``[C, KEEP_LEN]``, contiguous): what
    ``keep.index_copy_(0, slots, ...)`` of the new state would write."""
    cr = c0 + tl.arange(0, KEEP_ROWS)
    q = tl.arange(0, KEEP_BLOCK)
    ok = ((cr < C) & (tl.arange(0, KEEP_ROWS) < count))[:, None] & (q < KEEP_LEN)[None, :]
    pos = H + T - KEEP_LEN + q  # in cat(head, x)
    from_x = (pos >= H)[None, :]
    new = tl.load(x_ptr + (batch * C + cr).to(tl.int64)[:, None] * T + (pos - H)[None, :], mask=ok & from_x)
    old = tl.load(
        head_ptr + batch.to(tl.int64) * HEAD_BATCH + cr[:, None] * H + pos[None, :], mask=ok & ~from_x
    )
    slot = tl.load(slots_ptr + batch)
    tl.store(
        keep_ptr + slot * KEEP_ROW + cr[:, None] * KEEP_LEN + q[None, :], tl.where(from_x, new, old), mask=ok
    )


@triton.jit
def _history_peak(
    before_ptr, batch, c0, count, C, BEFORE_BATCH, BEFORE_LEN, BLOCK: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """The float32 bits of ``max |before[batch, c]|`` over channels ``c0 .. c0 + count - 1`` below ``C``
    (``before`` ``[B, C, BEFORE_LEN]``, batch rows ``BEFORE_BATCH`` apart, each one's ``C * BEFORE_LEN``
    samples contiguous, so the channels are one contiguous run): ``STEPS`` tiles of ``BLOCK``; 0 for none."""
    first = c0 * BEFORE_LEN
    end = tl.minimum(c0 + count, C) * BEFORE_LEN
    base = before_ptr + batch.to(tl.int64) * BEFORE_BATCH
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for step in tl.static_range(STEPS):
        offs = first + step * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(base + offs, mask=offs < end, other=0.0)
        best = tl.maximum(best, tl.abs(values).to(tl.int32, bitcast=True))
    return tl.max(best, axis=0)


BLOCKED_K = sizing.ACTIVATION_LANE_OUTPUTS  # outputs per lane
_MIN_LANES, _MAX_LANES = sizing.ACTIVATION_MIN_LANES, 128  # one to four warps per program


def lane_plan(length: int) -> tuple[int, int]:
    """``(lanes per row, lanes per program)`` for rows of ``length`` samples: one row per program of up to
    four warps, or, for rows shorter than a warp covers, as many whole rows as four warps hold."""
    need = triton.cdiv(length, BLOCKED_K)
    if sizing.activation_packs_rows(length):
        return pow2_block(need, 1, _MIN_LANES), _MAX_LANES
    lanes = pow2_block(need, _MIN_LANES, _MAX_LANES)
    return lanes, lanes


VARIANTS = ("halo", "halo8", "halo16", "blocked")
DEFAULT_VARIANT = "halo"
_PACKED_SEGMENT = 16  # rows that need at most this many lanes (with their halo lane) are packed
_WHOLE_WARPS = 1  # warps of a whole-row program: each program picks its own load path (see halo_plan)
# Issued instructions of a 16-output lane over an 8-output one (offline sm_90 SASS: 1173 against 638 on
# the interior path, 1617 against 861 packed with a head): what halo_plan weighs lanes by.
_LANE_COST = {8: 1.0, 16: 1.85}


class HaloPlan(NamedTuple):
    """One launch of the halo kernel: ``k`` outputs a lane, ``seg`` lanes to a segment (a warp, or one
    packed row), ``warps`` per program, and the grid."""

    k: int
    packed: bool
    seg: int
    warps: int
    grid: tuple[int, ...]


def halo_plan(batch: int, channels: int, count: int, k: int | None = None) -> HaloPlan:
    """The halo kernel's launch for ``batch x channels`` rows of ``count`` outputs, ``k`` outputs a lane
    (8 or 16; None: whichever issues fewer instructions by :data:`_LANE_COST`).

    A row that needs at most 16 lanes (its blocks of ``k`` and a halo lane) is packed, ``32 // seg`` rows
    to a warp and four warps (or as few as its channels fill) to a program. Longer rows run in programs of
    one warp: a program decides by itself whether its loads can meet a row edge or the head, so only a
    row's first and last programs pay for clamps."""
    if k is None:
        return min((halo_plan(batch, channels, count, k) for k in (16, 8)), key=_lanes_cost)
    seg = triton.cdiv(count, k) + 1
    if sizing.PACK_SHORT_ROWS and seg <= _PACKED_SEGMENT:
        per_warp = 32 // seg
        warps = pow2_block(triton.cdiv(channels, per_warp), 1, 4)
        return HaloPlan(k, True, seg, warps, (triton.cdiv(channels, warps * per_warp), batch))
    span = _WHOLE_WARPS * 31 * k
    return HaloPlan(k, False, 32, _WHOLE_WARPS, (channels, batch, triton.cdiv(count, span)))


def _lanes_cost(plan: HaloPlan) -> float:
    lanes = plan.warps * 32
    for extent in plan.grid:
        lanes *= extent
    return lanes * _LANE_COST[plan.k]


def launch_blocked(
    x: torch.Tensor,
    filt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    peak: torch.Tensor | None = None,
    head: torch.Tensor | None = None,
    start: int = 0,
    variant: str = DEFAULT_VARIANT,
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
    before: torch.Tensor | None = None,
) -> None:
    """``x``: contiguous ``[R, T]`` float32 with ``R = B*C``; ``filt`` ``[12]``; ``a``, ``b`` ``[C]``;
    ``out``: contiguous ``[R, N]``, outputs ``start .. start + N - 1`` of the activation of each row
    ``cat(head, x)`` (``head`` may be None: ``[R, H]`` contiguous, or ``[B, C, H]`` whose batch rows may
    lie apart, each one's channels contiguous; ``start`` is 0 or at least 5).

    With ``peak`` (int32 ``[rows // C]``, zeroed, or holding peaks to fold in) it also raises each batch
    row's entry to the float32 bits of its largest ``|out|``, by integer atomic max: what a float16 split
    convolution of ``out`` needs first. ``variant`` picks the kernel (:data:`VARIANTS`): ``halo`` (the
    default: 8 or 16 outputs a lane, by :func:`halo_plan`), ``halo8`` and ``halo16`` (either always) give
    the bits of ``blocked``, the kernel before them, kept for comparison.

    ``keep`` = ``(pool, slots)`` (``[S, C, L]`` float32, each slot's ``C * L`` samples contiguous; ``[B]``
    int64) also copies each row's last ``L`` inputs of ``cat(head, x)`` to ``pool[slots[b]]``: a
    stateful layer's new state, written by the programs that read the row (after its outputs, so the
    outputs' code is unchanged); the ``blocked`` variant copies them in a pass of its own.

    ``before`` (``[B, C, L]``, the history a float16 split convolution reads before ``out``; with
    ``peak``) is folded into the peaks by the programs that write the same channels, so a step's peaks
    take no pass of their own; the ``blocked`` variant takes one (:func:`row_peaks`)."""
    rows, length = x.shape
    count = out.shape[1]
    if 0 < start < 5:
        raise ValueError(f"an output window starting at {start}: start at 0 or at least 5")
    if variant == "blocked" and start == 5:  # its fix-up takes O[-6] = S(-1) for S(10)
        raise ValueError("the blocked kernel gives wrong outputs for a window starting at 5; use halo")
    if variant not in VARIANTS:
        raise ValueError(f"alias-free kernel variant {variant!r}: one of {', '.join(VARIANTS)}")
    kept, head_batch = 0, 0
    if head is not None:
        head = _rows_of(head, a.shape[0])
        kept, head_batch = head.shape[-1], head.stride(0)
    channels = a.shape[0]
    if before is not None and peak is None:
        raise ValueError("a history's peak folds into the window's peaks: pass peak with before")
    if before is not None and not before.shape[-1]:
        before = None
    if variant == "blocked":
        if before is not None and peak is not None:
            torch.maximum(peak, row_peaks(before), out=peak)
        _launch_v3(x, filt, a, b, out, peak, head, kept, head_batch, start)
        if keep is not None:
            keep_tail(keep, head, x.view(-1, channels, length))
        return
    plan = halo_plan(rows // channels, channels, count, {"halo": None, "halo8": 8, "halo16": 16}[variant])
    live = live_count()
    pool, slots = keep if keep is not None else (x, x)  # never read without KEEP
    per_program = plan.warps * (32 // plan.seg) if plan.packed else 1
    keep_rows = pow2_block(per_program, 2, 128)
    if before is not None:
        before = _rows_of(before, channels)
        span = per_program * before.shape[-1]  # the history samples one program reads
        before_block = pow2_block(span, 16, _HISTORY_BLOCK)
        before_args = (before, before.stride(0), before.shape[-1])
    else:
        span, before_block, before_args = 0, 16, (x, 0, 0)
    _af_halo_kernel[plan.grid](
        x, out, filt, a, b, out if peak is None else peak, length, channels, x if head is None else head,
        kept, head_batch, start, count, a if live is None else live, pool, slots,
        pool.stride(0) if keep else 0, pool.shape[-1] if keep else 0, *before_args, K=plan.k, WARPS=plan.warps,
        SEG=plan.seg, PACKED=plan.packed, WITH_PEAK=peak is not None, HAS_HEAD=head is not None,
        HAS_LIVE=live is not None, KEEP=keep is not None, KEEP_ROWS=keep_rows,
        KEEP_BLOCK=pow2_block(pool.shape[-1], 2, 1 << 20) if keep else 16, HAS_BEFORE=before is not None,
        BEFORE_BLOCK=before_block, BEFORE_STEPS=max(1, triton.cdiv(span, before_block)), num_warps=plan.warps,
        **dependent_launch(x.device),
    )  # fmt: skip


def _launch_v3(
    x: torch.Tensor, filt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
    peak: torch.Tensor | None, head: torch.Tensor | None, kept: int, head_batch: int, start: int,
) -> None:  # fmt: skip
    """The blocked kernel: one lane per 8 outputs, one warp per 32 lanes."""
    rows, length = x.shape
    count = out.shape[1]
    row_lanes, lanes = lane_plan(count)
    grid = (triton.cdiv(rows, lanes // row_lanes), triton.cdiv(count, row_lanes * BLOCKED_K))
    _af_blocked_kernel[grid](
        x, out, filt, a, b, out if peak is None else peak, length, a.shape[0], rows,
        x if head is None else head, kept, head_batch, start, count,
        BLOCK=lanes, K=BLOCKED_K, ROW_LANES=row_lanes, WITH_PEAK=peak is not None, HAS_HEAD=head is not None,
        num_warps=lanes // 32, **dependent_launch(x.device),
    )  # fmt: skip


def _rows_of(head: torch.Tensor, channels: int) -> torch.Tensor:
    """``head`` as ``[B, C, H]`` with each batch row's ``C * H`` samples contiguous (a copy only if not)."""
    if head.dim() == 2:
        head = head.view(-1, channels, head.shape[-1])
    if head.stride(2) != 1 or head.stride(1) != head.shape[2]:
        head = head.contiguous()
    return head


@triton.jit(do_not_specialize=["ROW", "STRIDE"])
def _row_peak_kernel(
    x_ptr,
    peak_ptr,
    live_ptr,
    ROW,
    STRIDE,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    HAS_LIVE: tl.constexpr = False,
    DEPENDENT: tl.constexpr = False,  # a programmatic dependent launch (_triton_dependent)
):
    """``peak_ptr[b]`` <- the float32 bits of ``max |x[b]|`` over the ``ROW <= STEPS * BLOCK`` contiguous
    samples of batch row ``b`` (``STRIDE`` apart): one program per row, so the result is stored, not
    raised atomically, and needs no zeroed buffer. (A static trip count: a loop to a runtime bound does
    not run under the Triton interpreter.)"""
    wait_for_inputs(DEPENDENT)
    row = tl.program_id(0)
    if HAS_LIVE:  # noqa: SIM102 (as in the halo kernel)
        if row >= tl.load(live_ptr):
            return
    base = x_ptr + row.to(tl.int64) * STRIDE
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for step in tl.static_range(STEPS):
        offs = step * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(base + offs, mask=offs < ROW, other=0.0)
        best = tl.maximum(best, tl.abs(values).to(tl.int32, bitcast=True))
    tl.store(peak_ptr + row, tl.max(best, axis=0))


_PEAK_BLOCK = 2048
_HISTORY_BLOCK = 512  # a halo program's tile of the history it folds into its peak


def row_peaks(x: torch.Tensor) -> torch.Tensor:
    """int32 ``[B]``: the float32 bits of each batch row's largest ``|x|`` of ``x`` ``[B, C, H]`` (each
    batch row's samples contiguous; rows may lie apart), in one launch."""
    x = _rows_of(x, x.shape[1])
    batch, channels, length = x.shape
    peak = torch.empty(batch, dtype=torch.int32, device=x.device)
    if batch and channels * length:
        row = channels * length
        steps = pow2_block(triton.cdiv(row, _PEAK_BLOCK), 1, 1 << 30)  # few trip counts: few compiles
        live = live_count()
        _row_peak_kernel[(batch,)](
            x, peak, peak if live is None else live, row, x.stride(0), BLOCK=_PEAK_BLOCK, STEPS=steps,
            HAS_LIVE=live is not None, num_warps=4, **dependent_launch(x.device),
        )  # fmt: skip
    elif batch:
        peak.zero_()
    return peak
