# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-any-return,attr-defined"
"""The float16 split convolution in Gluon: the same arithmetic as :mod:`._triton_conv_f16`, pipelined.

Triton's ``tl.dot`` kernel waits for every step's products before it adds them to the running sum
(``wgmma.wait_group 0`` after each step): the tensor cores idle while the step's float32 add, the
next step's barrier wait and its issue run. Here the wait is explicit, so each step's three products
are issued *before* the previous step's are waited for and added (``warpgroup_mma_wait(3)``): the
tensor cores always have a step in flight. The arithmetic is unchanged: each step's products go into a
fresh accumulator in the same order (``w_lo x_hi``, ``w_hi x_lo``, ``w_hi x_hi``), each step's part is
added to its chunk's sum in step order in plain float32, and the chunks are added in order from zero. So
every output is bit for bit what the Triton kernel gives, across batches, tiles and packing.

Two accumulators in flight and the chunk's sum already fill 192 registers a thread at 128 x 128 on
8 warps; the sum of the chunks before (a fourth) would spill, so a program that runs several chunks
keeps that sum in its output tile instead: written raw at the end of its first chunk, read back, added
to and written at the end of each later one (``_flush``), read a last time by the epilogue. The same adds
in the same order as keeping it in registers.

Operands arrive by TMA, ``STAGES`` steps ahead, into 128-byte-swizzled shared memory, one mbarrier per
stage; a stage is refilled once the products that read it are known to be complete (the wait above).
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
def _products(stages, spare, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, ROWS: gl.constexpr):
    """Issue one step's three products into a fresh accumulator (``spare``'s registers; its value is not
    read), in the Triton kernel's order; returns the accumulator in flight."""
    w_hi_s, w_lo_s, x_hi_s, x_lo_s = stages
    x_hi = _operand(x_hi_s, BLOCK_N, BLOCK_K, ROWS)
    x_lo = _operand(x_lo_s, BLOCK_N, BLOCK_K, ROWS)
    part = warpgroup_mma(w_lo_s, x_hi, spare, use_acc=False, is_async=True)
    part = warpgroup_mma(w_hi_s, x_lo, part, is_async=True)
    part = warpgroup_mma(w_hi_s, x_hi, part, is_async=True)
    return part


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
def _flush(acc, flushed, out_ptr, batch, first, m0, n0, B, COUT, TOUT, layout: gl.constexpr,
           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """A chunk that is not the program's last ended: its sum joins those of the chunks before it, kept in
    the output tile (module docstring). Returns how many chunks the tile holds now."""
    _, _, _, mask, local, corner = _tile(
        batch, first, m0, n0, B, COUT, TOUT, layout, BLOCK_M, BLOCK_N, ROWS, SPLIT
    )
    ptrs = out_ptr + corner + local
    if flushed == 0:
        gl.store(ptrs, acc, mask=mask)
    else:
        gl.store(ptrs, gl.load(ptrs, mask=mask, other=0.0) + acc, mask=mask)
    return flushed + 1


@gluon.jit
def _issue(bufs, bars, g, spare, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, ROWS: gl.constexpr,
           STAGES: gl.constexpr):  # fmt: skip
    """Wait for step ``g``'s operands, then issue its products into ``spare``'s registers."""
    w_hi_s, w_lo_s, x_hi_s, x_lo_s = bufs
    stage = g % STAGES
    mbarrier.wait(bars.index(stage), (g // STAGES) & 1)
    return _products(
        (w_hi_s.index(stage), w_lo_s.index(stage), x_hi_s.index(stage), x_lo_s.index(stage)), spare, BLOCK_N,
        BLOCK_K, ROWS,
    )  # fmt: skip


@gluon.jit
def _refill(
    descs, bufs, bars, done, geometry, BLOCK_K: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr
):
    """Step ``done``'s products are complete, so its stage is free: load the step ``STAGES`` later into it."""
    x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc = descs
    w_hi_s, w_lo_s, x_hi_s, x_lo_s = bufs
    s_begin, count, k_blocks, batch, TIN, COUT, DIL, m0, n0 = geometry
    step = done + STAGES
    if step < count:
        free = done % STAGES
        _load_step(
            x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc,
            (w_hi_s.index(free), w_lo_s.index(free), x_hi_s.index(free), x_lo_s.index(free)), bars.index(free),
            s_begin + step, k_blocks, batch, TIN, COUT, DIL, m0, n0, BLOCK_K, ROWS,
        )  # fmt: skip


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


@gluon.jit(do_not_specialize=_RUNTIME_SIZES)
def _conv1d_f16x3_gluon_kernel(
    x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr,
    live_ptr, B, CP, COUT, TIN, TOUT, DIL, CHUNK, NCHUNK, KSIZE, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN,
    HAS_RES: gl.constexpr, RES_PARTS: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, ROWS: gl.constexpr,
    STAGES: gl.constexpr, HAS_LIVE: gl.constexpr = False, DEPENDENT: gl.constexpr = False,
):  # fmt: skip
    # Arguments as :func:`streamdec.kernels._triton_conv_f16._conv1d_f16x3_kernel`'s (three products only).
    _wait_for_inputs(DEPENDENT)
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_z = gl.program_id(2)
    if SPLIT:
        batch = pid_z // NCHUNK * ROWS
        first = pid_z % NCHUNK
        last = first + 1
    else:
        batch = pid_z * ROWS
        first = pid_z * 0
        last = NCHUNK
    if HAS_LIVE:  # noqa: SIM102 (a constexpr: without it no load at all)
        if batch >= gl.load(live_ptr):  # padding rows only (they come last): nothing to compute
            return
    m0 = pid_m * BLOCK_M
    n0 = pid_n * (BLOCK_N // ROWS)
    k_blocks = CP // BLOCK_K
    s_begin = first * CHUNK
    count = gl.minimum(KSIZE * k_blocks, last * CHUNK) - s_begin  # this program's steps

    layout: gl.constexpr = _mma_layout(BLOCK_M, BLOCK_N, gl.num_warps())
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
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    for s in gl.static_range(STAGES):  # every stage is free at the start
        if s < count:
            _load_step(
                x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc,
                (w_hi_s.index(s), w_lo_s.index(s), x_hi_s.index(s), x_lo_s.index(s)), bars.index(s), s_begin + s,
                k_blocks, batch, TIN, COUT, DIL, m0, n0, BLOCK_K, ROWS,
            )  # fmt: skip

    descs = (x_hi_desc, x_lo_desc, w_hi_desc, w_lo_desc)
    bufs = (w_hi_s, w_lo_s, x_hi_s, x_lo_s)
    geometry = (s_begin, count, k_blocks, batch, TIN, COUT, DIL, m0, n0)
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    # Two register sets take turns holding a step's products in flight, X for one step and Y for the next.
    # Unrolled by two, each keeps its role across the loop's back edge: a loop that swapped them would copy
    # 64 registers a thread each way, and ptxas serializes every wgmma whose accumulator registers a
    # non-wgmma instruction writes.
    spare_x = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    spare_y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    flushed = 0
    g = 0  # this program's steps issued so far
    for chunk in range(first, last):
        end = gl.minimum(g + CHUNK, count)
        cur_x = _issue(bufs, bars, g, spare_x, BLOCK_N, BLOCK_K, ROWS, STAGES)
        g += 1
        for _ in range((end - g) // 2):
            cur_y = _issue(bufs, bars, g, spare_y, BLOCK_N, BLOCK_K, ROWS, STAGES)
            spare_x = warpgroup_mma_wait(num_outstanding=3, deps=(cur_x,))  # step g - 1 is complete
            acc = acc + spare_x
            _refill(descs, bufs, bars, g - 1, geometry, BLOCK_K, ROWS, STAGES)
            g += 1
            cur_x = _issue(bufs, bars, g, spare_x, BLOCK_N, BLOCK_K, ROWS, STAGES)
            spare_y = warpgroup_mma_wait(num_outstanding=3, deps=(cur_y,))
            acc = acc + spare_y
            _refill(descs, bufs, bars, g - 1, geometry, BLOCK_K, ROWS, STAGES)
            g += 1
        if g < end:  # an even number of steps in the chunk: one more
            cur_y = _issue(bufs, bars, g, spare_y, BLOCK_N, BLOCK_K, ROWS, STAGES)
            spare_x = warpgroup_mma_wait(num_outstanding=3, deps=(cur_x,))
            acc = acc + spare_x
            _refill(descs, bufs, bars, g - 1, geometry, BLOCK_K, ROWS, STAGES)
            g += 1
            spare_y = warpgroup_mma_wait(num_outstanding=0, deps=(cur_y,))
            acc = acc + spare_y
        else:
            spare_x = warpgroup_mma_wait(num_outstanding=0, deps=(cur_x,))
            acc = acc + spare_x
        _refill(descs, bufs, bars, g - 1, geometry, BLOCK_K, ROWS, STAGES)
        if chunk + 1 < last:  # not the program's last chunk: its sum joins the tile's
            # the spare sets' values are never read: made anew, they are not live through the flush
            spare_x = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            spare_y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            flushed = _flush(acc, flushed, out_ptr, batch, first, m0, n0, B, COUT, TOUT, layout, BLOCK_M, BLOCK_N,
                             ROWS, SPLIT)  # fmt: skip
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))

    # The epilogue reads the sums back from shared memory a slab of rows at a time, in a layout whose
    # threads run along the samples: from the accumulator's own registers, its 64-bit addresses spilled.
    slab: gl.constexpr = _EPILOGUE_SLAB
    epi: gl.constexpr = _epilogue_layout(BLOCK_N, gl.num_warps())
    sums = gl.allocate_shared_memory(
        gl.float32, [BLOCK_M, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    )
    sums.store(acc)
    gl.thread_barrier()
    for r in gl.static_range(BLOCK_M // slab):
        part = sums.slice(r * slab, slab, dim=0).load(epi)
        _epilogue(
            part, flushed, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0 + r * slab,
            n0, B, COUT, TOUT, RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN, epi, slab, BLOCK_N, ROWS, SPLIT,
            HAS_RES, RES_PARTS, HAS_BIAS,
        )  # fmt: skip


_EPILOGUE_SLAB = gl.constexpr(16)  # rows of the output tile the epilogue handles at a time


@gluon.constexpr_function
def _epilogue_layout(block_n, num_warps):
    """Threads along the samples, four consecutive ones each (one 16-byte store), warps down the rows."""
    lanes = min(32, block_n // 4)
    return gl.BlockedLayout([1, 4], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.jit
def _epilogue(
    total, flushed, x_inv_ptr, w_inv_ptr, bias_ptr, res_ptr, tail_ptr, out_ptr, batch, first, m0, n0, B, COUT, TOUT,
    RES_ROW, RES_CHAN, RES_LEN, TAIL_ROW, TAIL_CHAN, layout: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr, HAS_RES: gl.constexpr, RES_PARTS: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):  # fmt: skip
    """Rows ``m0 ..`` of the tile (``BLOCK_M`` of them, in ``layout``): add the chunks kept in the tile, then
    unscale, add the bias and the residual, and store; with ``SPLIT``, store the raw chunk sums."""
    offs_m, offs_n, later, mask, local, corner = _tile(
        batch, first, m0, n0, B, COUT, TOUT, layout, BLOCK_M, BLOCK_N, ROWS, SPLIT
    )
    ptrs = out_ptr + corner + local
    if flushed > 0:  # the chunks before, kept in the tile, then this one: in order, as from zero
        total = gl.load(ptrs, mask=mask, other=0.0) + total
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


def launch_gluon_conv(grid, descs, pointers, sizes, *, stages: int, warps: int, **constexprs) -> None:
    """Launch the kernel: ``descs`` the four operand descriptors, ``pointers`` the seven tensors (the live
    row count last), ``sizes`` the fourteen integers, in the Triton kernel's order."""
    _conv1d_f16x3_gluon_kernel[grid](*descs, *pointers, *sizes, STAGES=stages, num_warps=warps, **constexprs)
