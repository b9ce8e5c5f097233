# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return,attr-defined"
"""The float16 split convolution in Gluon, warp-specialized: the Triton kernel's arithmetic, its steps
never waiting on their own loads or on each other's products.

In Triton's ``tl.dot`` kernel every warp of a program does everything in turn: it waits for a step's
boxes, issues one product, waits for it, issues the next (three waits a step), adds, and then all warps
meet at a barrier to issue the next TMA copies. With one 128 x 128 program a multiprocessor, the tensor
cores idle through each of those waits (Nsight Compute: over half of the warps' samples at the waits
after each product and at the copies' barriers, docs/kernels.md). Here the work is split by role
(``gl.warp_specialize``):

- one **producer** warp issues each step's four TMA copies into the next free stage as soon as the
  consumers have released it, ``STAGES`` steps ahead, and never touches the tensor cores;
- one **consumer** warpgroup per 64 output channels of the tile (two at 128 x 128, sharing each stage's
  input box) waits for its stage, issues the step's three products as one chain into a fresh accumulator
  (``w_lo x_hi``, ``w_hi x_lo``, ``w_hi x_hi``, as the Triton kernel orders them), waits once, releases
  the stage and adds the step to its chunk's sum in plain float32. While one consumer adds or waits, the
  other's products keep the tensor cores busy; no consumer waits for the other.

The arithmetic is unchanged: the same products in the same order into a fresh accumulator every step,
the same float32 adds in step order, chunks summed in order from zero, the same epilogue. So every output
is bit for bit what the Triton kernel gives, across batches, tiles and packing (tested on the GPU). The
register file is shared out by ``setmaxnreg``: the producer keeps few, each consumer about 232, which
holds a step's products, its chunk's sum and the sum of the chunks before without spilling.

Packed short rows read a 3-D box ``[ROWS, 8, BLOCK_K]`` of the ``[B, TIN, CP]`` input whose shared
memory is the 2-D ``[BLOCK_N, BLOCK_K]`` operand already (8 samples of 64 float16 channels are one
swizzle atom). The launch, the chunk-sum kernel for split-K and every argument are the Triton
kernel's (:func:`streamdec.kernels._triton_conv_f16.conv1d_f16x3` picks the kernel).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["gluon_descriptor", "launch_gluon_conv"]

_RUNTIME_SIZES = [
    "B", "COUT", "TIN", "TOUT", "DIL", "KSIZE", "CHUNK", "NCHUNK", "RES_ROW", "RES_CHAN", "RES_LEN", "TAIL_ROW",
    "TAIL_CHAN",
]  # fmt: skip

# Output channels a consumer warpgroup computes (wgmma's M for four warps).
GROUP_ROWS = gl.constexpr(64)
# Registers a thread of each role keeps (``setmaxnreg``, multiples of 8). The producer issues copies only;
# a consumer holds three 64 x 128 float32 sets (a step's products, its chunk's sum, the chunks' total).
PRODUCER_REGISTERS = gl.constexpr(40)
CONSUMER_REGISTERS = gl.constexpr(232)


@gluon.constexpr_function
def _mma_layout(block_m, block_n, num_warps):
    """wgmma's accumulator layout for a ``block_m`` x ``block_n`` tile: warps stacked along the channels
    (16 rows an instruction, 4 warps a group), the widest instruction along the samples."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    n = min(block_n // warps[1], 256)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 16])


@gluon.constexpr_function
def _staged(stages, block):
    """The shape of ``stages`` buffers of one ``block`` each."""
    return [stages, *block]


@gluon.jit
def _load_step(
    x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc, stages, bar, step, k_blocks, batch, TIN, COUT, DIL, m0, n0,
    BLOCK_K: gl.constexpr, ROWS: gl.constexpr,
):  # fmt: skip
    """Start the TMA copies of ``step``'s four operands into one stage; ``bar`` counts their bytes."""
    w_hi_s, w_lo_s, x_hi_s, x_lo_s = stages
    tap = step // k_blocks
    c0 = (step % k_blocks) * BLOCK_K
    mbarrier.expect(bar, 2 * (w_hi_desc.block_type.nbytes + x_hi_desc.block_type.nbytes))
    coord = [batch * TIN + n0 + tap * DIL, c0] if ROWS == 1 else [batch, n0 + tap * DIL, c0]
    tma.async_copy_global_to_shared(w_hi_desc, [tap * COUT + m0, c0], bar, w_hi_s)
    tma.async_copy_global_to_shared(x_hi_desc, coord, bar, x_hi_s)
    tma.async_copy_global_to_shared(w_lo_desc, [tap * COUT + m0, c0], bar, w_lo_s)
    tma.async_copy_global_to_shared(x_lo_desc, coord, bar, x_lo_s)


@gluon.jit
def _operand(x_s, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, ROWS: gl.constexpr):
    """A stage's input box as wgmma's ``[BLOCK_K, BLOCK_N]`` operand (a view: nothing moves)."""
    if ROWS == 1:
        box = x_s
    else:
        box = x_s._reinterpret(
            gl.float16,
            [BLOCK_N, BLOCK_K],
            gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float16),
        )
    return box.permute((1, 0))


@gluon.jit
def _tile(batch, first, m0, n0, B, COUT, TOUT, layout: gl.constexpr, BLOCK_M: gl.constexpr,
          BLOCK_N: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """The tile's output addressing in the accumulator's layout: channels, each column's sample and its
    row after ``batch``, the mask, 32-bit offsets from the tile's corner and the corner (as the Triton
    kernel: 64-bit offsets per element would keep twice the registers live)."""
    ROW_N: gl.constexpr = BLOCK_N // ROWS
    rows_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    offs_m = m0 + rows_m
    if ROWS == 1:
        later = cols * 0
        offs_n = n0 + cols
        mask = (offs_m < COUT)[:, None] & (offs_n < TOUT)[None, :]
        local = rows_m[:, None] * TOUT + cols[None, :]
    else:
        later = cols // ROW_N
        offs_n = n0 + cols % ROW_N
        mask = (offs_m < COUT)[:, None] & ((offs_n < TOUT) & (batch + later < B))[None, :]
        local = rows_m[:, None] * TOUT + (later * (COUT * TOUT) + cols % ROW_N)[None, :]
    if SPLIT:
        corner = ((first.to(gl.int64) * B + batch) * COUT + m0) * TOUT + n0
    else:
        corner = (batch.to(gl.int64) * COUT + m0) * TOUT + n0
    return offs_m, offs_n, later, mask, local, corner


@gluon.jit
def _wait_for_inputs(DEPENDENT: gl.constexpr):
    """:func:`streamdec.kernels._triton_dependent.wait_for_inputs` in Gluon: a programmatic dependent
    launch's first statement waits for the kernel before, then lets the next one be placed."""
    if DEPENDENT:
        gl.inline_asm_elementwise(
            "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )
        gl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )


@gluon.jit
def _produce(descs, bufs, geometry, BLOCK_K: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp: each step's four boxes into the next free stage, as soon as the consumers have
    released it (``empty``), announced on ``ready`` by their bytes."""
    x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc = descs
    w_hi_s, w_lo_s, x_hi_s, x_lo_s, ready, empty = bufs
    s_begin, count, k_blocks, batch, TIN, COUT, DIL, m0, n0 = geometry
    for g in range(count):
        stage = g % STAGES
        # a fresh mbarrier counts as having completed the phase before its first, so the first pass through
        # the stages does not wait
        mbarrier.wait(empty.index(stage), ((g // STAGES) & 1) ^ 1)
        _load_step(
            x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc,
            (w_hi_s.index(stage), w_lo_s.index(stage), x_hi_s.index(stage), x_lo_s.index(stage)),
            ready.index(stage), s_begin + g, k_blocks, batch, TIN, COUT, DIL, m0, n0, BLOCK_K, ROWS,
        )  # fmt: skip


@gluon.jit
def _consume(bufs, work, GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
             ROWS: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, HAS_RES: gl.constexpr,
             RES_PARTS: gl.constexpr, HAS_BIAS: gl.constexpr, CHUNKED: gl.constexpr):  # fmt: skip
    """A consumer warpgroup: output channels ``GROUP * 64 ..`` of the tile. Each step waits for its stage,
    issues the three products into a fresh accumulator as one chain (no wait between them), waits for
    them, releases the stage and adds the step to its chunk's sum; then the epilogue."""
    w_hi_s, w_lo_s, x_hi_s, x_lo_s, ready, empty = bufs
    (count, CHUNK, chunks, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0, n0, B, COUT,
     TOUT, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN) = work  # fmt: skip
    layout: gl.constexpr = _mma_layout(GROUP_ROWS, BLOCK_N, 4)
    # The products' registers are only ever written by wgmma (a first product that ignores their value):
    # ptxas serializes every wgmma whose accumulator a plain instruction writes.
    part = gl.zeros((GROUP_ROWS, BLOCK_N), dtype=gl.float32, layout=layout)
    total = gl.zeros((GROUP_ROWS, BLOCK_N), dtype=gl.float32, layout=layout)
    g = 0
    for _ in range(chunks):
        acc = gl.zeros((GROUP_ROWS, BLOCK_N), dtype=gl.float32, layout=layout)
        end = gl.minimum(g + CHUNK, count)
        while g < end:
            stage = g % STAGES
            mbarrier.wait(ready.index(stage), (g // STAGES) & 1)
            if BLOCK_M == GROUP_ROWS:
                w_hi = w_hi_s.index(stage)
                w_lo = w_lo_s.index(stage)
            else:  # 64 rows of the stage's weight box (a whole number of swizzle atoms: a view)
                w_hi = w_hi_s.index(stage).slice(GROUP * GROUP_ROWS, GROUP_ROWS, dim=0)
                w_lo = w_lo_s.index(stage).slice(GROUP * GROUP_ROWS, GROUP_ROWS, dim=0)
            x_hi = _operand(x_hi_s.index(stage), BLOCK_N, BLOCK_K, ROWS)
            x_lo = _operand(x_lo_s.index(stage), BLOCK_N, BLOCK_K, ROWS)
            chain = warpgroup_mma(w_lo, x_hi, part, use_acc=False, is_async=True)
            chain = warpgroup_mma(w_hi, x_lo, chain, is_async=True)
            chain = warpgroup_mma(w_hi, x_hi, chain, is_async=True)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(chain,))
            mbarrier.arrive(empty.index(stage), count=1)  # the products have read the stage
            acc = acc + part
            g += 1
        if CHUNKED:  # noqa: SIM108 (a constexpr: one chunk keeps no third register set)
            total = total + acc  # the chunks in order from zero, as the Triton kernel adds them
        else:
            total = acc
    _epilogue(
        total, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0 + GROUP * GROUP_ROWS,
        n0, B, COUT, TOUT, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN, layout, GROUP_ROWS, BLOCK_N, ROWS, SPLIT,
        HAS_RES, RES_PARTS, HAS_BIAS,
    )  # fmt: skip


@gluon.jit(do_not_specialize=_RUNTIME_SIZES)
def _conv1d_f16x3_gluon_kernel(
    x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr,
    live_ptr, B, CP, COUT, TIN, TOUT, DIL, CHUNK, NCHUNK, KSIZE, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN,
    HAS_RES: gl.constexpr, RES_PARTS: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, ROWS: gl.constexpr,
    STAGES: gl.constexpr, CHUNKED: gl.constexpr, HAS_LIVE: gl.constexpr = False, DEPENDENT: gl.constexpr = False,
):  # fmt: skip
    # Arguments as :func:`streamdec.kernels._triton_conv_f16._conv1d_f16x3_kernel`'s (three products only);
    # CHUNKED: a program runs several chunks (the launch's chunks > 1, not split).
    _wait_for_inputs(DEPENDENT)
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_z = gl.program_id(2)
    if SPLIT:
        batch = pid_z // NCHUNK * ROWS
        first = pid_z % NCHUNK
        chunks = 1
    else:
        batch = pid_z * ROWS
        first = pid_z * 0
        chunks = NCHUNK
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= gl.load(live_ptr):  # padding rows only (they come last): nothing to compute
            return
    m0 = pid_m * BLOCK_M
    n0 = pid_n * (BLOCK_N // ROWS)
    k_blocks = CP // BLOCK_K
    s_begin = first * CHUNK
    count = gl.minimum(KSIZE * k_blocks, (first + chunks) * CHUNK) - s_begin  # this program's steps

    w_hi_s = gl.allocate_shared_memory(
        gl.float16, _staged(STAGES, w_hi_desc.block_type.shape), w_hi_desc.layout
    )
    w_lo_s = gl.allocate_shared_memory(
        gl.float16, _staged(STAGES, w_lo_desc.block_type.shape), w_lo_desc.layout
    )
    x_hi_s = gl.allocate_shared_memory(
        gl.float16, _staged(STAGES, x_hi_desc.block_type.shape), x_hi_desc.layout
    )
    x_lo_s = gl.allocate_shared_memory(
        gl.float16, _staged(STAGES, x_lo_desc.block_type.shape), x_lo_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=BLOCK_M // GROUP_ROWS)  # one arrival from each consumer

    bufs = (w_hi_s, w_lo_s, x_hi_s, x_lo_s, ready, empty)
    work = (count, CHUNK, chunks, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0, n0,
            B, COUT, TOUT, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN)  # fmt: skip
    descs = (x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc)
    geometry = (s_begin, count, k_blocks, batch, TIN, COUT, DIL, m0, n0)
    if BLOCK_M == GROUP_ROWS:
        gl.warp_specialize([
            (_consume, (bufs, work, 0, BLOCK_M, BLOCK_N, BLOCK_K, ROWS, STAGES, SPLIT, HAS_RES, RES_PARTS, HAS_BIAS,
                        CHUNKED)),
            (_produce, (descs, bufs, geometry, BLOCK_K, ROWS, STAGES)),
        ], [1], [PRODUCER_REGISTERS])  # fmt: skip
    else:
        gl.warp_specialize([
            (_consume, (bufs, work, 0, BLOCK_M, BLOCK_N, BLOCK_K, ROWS, STAGES, SPLIT, HAS_RES, RES_PARTS, HAS_BIAS,
                        CHUNKED)),
            (_consume, (bufs, work, 1, BLOCK_M, BLOCK_N, BLOCK_K, ROWS, STAGES, SPLIT, HAS_RES, RES_PARTS, HAS_BIAS,
                        CHUNKED)),
            (_produce, (descs, bufs, geometry, BLOCK_K, ROWS, STAGES)),
        ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])  # fmt: skip


@gluon.jit
def _epilogue(
    total, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0, n0, B, COUT, TOUT,
    RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN, layout: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr, HAS_RES: gl.constexpr, RES_PARTS: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):  # fmt: skip
    """Rows ``m0 ..`` of the tile (``BLOCK_M`` of them, in ``layout``): unscale, add the bias and the
    residual, and store; with ``SPLIT``, store the raw chunk sum."""
    offs_m, offs_n, later, mask, local, corner = _tile(
        batch, first, m0, n0, B, COUT, TOUT, layout, BLOCK_M, BLOCK_N, ROWS, SPLIT
    )
    ptrs = out_ptr + corner + local
    if SPLIT:
        gl.store(ptrs, total, mask=mask)
    else:
        m_ok = offs_m < COUT
        if ROWS == 1:
            x_inv = gl.load(x_inv_ptr + batch)
        else:
            rows = batch + later
            x_inv = gl.load(x_inv_ptr + rows, mask=rows < B, other=1.0)[None, :]
        y = total * gl.load(w_inv_ptr + offs_m, mask=m_ok, other=1.0)[:, None] * x_inv
        if HAS_BIAS:
            y += gl.load(bias_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
        if HAS_RES:
            if RES_PARTS:
                in_head = (offs_n < RES_LEN)[None, :]
                head = gl.load(
                    res_ptr + batch.to(gl.int64) * RES_ROW + (later * RES_ROW + offs_n)[None, :]
                    + offs_m[:, None] * RES_CHAN,
                    mask=mask & in_head, other=0.0,
                )  # fmt: skip
                tail = gl.load(
                    tail_ptr + batch.to(gl.int64) * TAIL_ROW + (later * TAIL_ROW + offs_n - RES_LEN)[None, :]
                    + offs_m[:, None] * TAIL_CHAN,
                    mask=mask & ~in_head, other=0.0,
                )  # fmt: skip
                y += gl.where(in_head, head, tail)
            else:
                y += gl.load(res_ptr + corner + local, mask=mask, other=0.0)
        gl.store(ptrs, y, mask=mask)


def _layout(block: list[int]) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, gl.float16)


def gluon_descriptor(tensor, shape: list[int], strides: list[int], block: list[int]) -> TensorDescriptor:
    """A host TMA descriptor of a float16 operand for this kernel (128-byte swizzle, zero fill)."""
    return TensorDescriptor(tensor, shape, strides, block, _layout(block))


def launch_gluon_conv(grid, descs, pointers, sizes, *, stages: int, chunks: int, **constexprs) -> None:
    """Launch the kernel: ``descs`` the four operand descriptors, ``pointers`` the seven tensors (the live
    row count last), ``sizes`` the fourteen integers, ``constexprs`` the flags, in the Triton kernel's
    order; ``BLOCK_M`` 64 or 128 (one consumer warpgroup per 64 output channels)."""
    block_m = constexprs["BLOCK_M"]
    if block_m not in (64, 128):
        raise ValueError(f"the warp-specialized convolution takes 64- or 128-channel tiles, not {block_m}")
    # The register limit at launch is what setmaxnreg then shares out among the warpgroups: 128 x 128, two
    # consumers and the producer's group in one program a multiprocessor (2 x 232 + 40 <= 3 x 168); 64-row
    # tiles, one consumer and the producer's group in each of the two programs a multiprocessor that the
    # planner's stages assume (216 + 40 <= 2 x 128).
    _conv1d_f16x3_gluon_kernel[grid](
        *descs, *pointers, *sizes, STAGES=stages, CHUNKED=chunks > 1 and not constexprs["SPLIT"], num_warps=4,
        maxnreg=168 if block_m == 128 else 128, **constexprs,
    )  # fmt: skip
