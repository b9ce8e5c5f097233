"""How the float16 split convolution is launched: pure arithmetic, importable without Triton.

:func:`plan` turns a layer's shape and a batch into the kernel's tile, step size, chunking and grid
(:mod:`streamdec.kernels._triton_conv_f16` runs it). Two of those choices are the layer's alone and fix
the arithmetic, so a row's output never depends on its batch or on the launch: the channels per step
(:func:`block_k`) and the chunking of the reduction (:func:`chunking`). The others only decide which
program computes what: the tile (:func:`default_tiles`) and whether the chunks run as separate programs
(:func:`plan`).

The rules come from per-layer sweeps of auk-24k on an H200 (``bench/results/h200/conv-layers-1x70.json``
at batch 1, ``bench/results/h200/conv-launches-16x70.json`` at batch 16), each close to the best launch measured per layer:
- a grid that large tiles would not fill once (batch 1): small tiles, chunks as separate programs;
- otherwise 128 x 128 tiles where they divide the output channels (one program per multiprocessor: the
  tile is worth the shared memory), else 64-channel tiles with as many pipeline stages as let two
  programs share a multiprocessor (a 192-channel layer would leave a third of a 128 tile idle);
- chunks as separate programs wherever that fills the last wave of programs noticeably better (the
  768-channel layers at batch 16: 288 tiles are 2.2 waves on 132 multiprocessors, 864 chunks 6.5);
- rows that whole tiles would pad (a stateful step's 20-960 samples per stream) are packed: a program
  covers ``row_n`` samples (4 to 64, the size that pads the row least) of each of ``block_n // row_n``
  rows, so the weight tile it loads serves a full tile of outputs and a row of 20 computes 20 samples, not
  32 of a one-row tile or 24 of 8-sample pieces. Packing is used where it still leaves a program for every
  multiprocessor (large batches); it changes no result bit. Packed large tiles whose last wave would run
  mostly empty give way to small ones, two to a multiprocessor (``bench/results/h200/step-convs.json``).
"""

from __future__ import annotations

from typing import NamedTuple

from streamdec.kernels.sizing import DOT_MIN_EXTENT, WARPGROUP_ROWS, pow2_block

__all__ = [
    "CHANNELS_N_MAX", "CHUNK_STEPS", "LARGE", "PACK_LONG_ROWS", "PACK_LONG_WASTE", "PACK_ROW_NS", "SMALL",
    "ChannelsLaunch", "Launch", "Tiles", "block_k", "channels_as_n", "chunking", "default_tiles",
    "pack_row_n", "packed_tiles", "plan", "plan_channels",
]  # fmt: skip

CHUNK_STEPS = 48  # the longest chunk, in steps; a layer with more steps is cut into equal chunks
SHARED_PER_PAIR = 112 * 1024  # shared memory one of two programs on a Hopper multiprocessor may take
SPLIT_GAIN = 0.1  # run chunks as programs when that fills the waves by this fraction more
PACK_LARGE_FILL = 0.8  # packed large tiles need their waves this full on average, else small tiles
_MIN_BLOCK_N = 32  # samples: the smallest output tile along time
# Samples of each packed row a program covers, largest first: the planner takes the one that pads a row
# least (:func:`pack_row_n`): rows of 20 in 4-sample pieces, 240 in 16-sample ones. The input box
# ``[rows, row_n, 64 channels]`` has 128-byte rows, so its 128-byte swizzle is the 2-D operand's at any
# row_n and the reshape stays a view of shared memory (the sm_90a compile checks it:
# tests/unit/test_kernels_compile.py).
PACK_ROW_NS = (64, 32, 16, 8, 4)
# Rows at least a tile long are packed too where whole tiles would pad them by more than 1/PACK_LONG_WASTE:
# a 4-frame step's rows of 240, 480 and 960 samples fill 128-sample tiles to 94 %, 16-, 32- and 64-sample
# pieces fully. Rows padded less keep one row a program, whose taps re-read one row's samples.
PACK_LONG_ROWS = True
PACK_LONG_WASTE = 16
# Layers with at most this many output channels put them along the GEMM's N (:func:`plan_channels`): on an
# H200 that took auk-24k's 24-channel layers 1.5x and its 1-channel one 2.5x faster, and the 48-, 96- and
# 192-channel ones 5-30 % slower (bench/results/h200/step-convs-variants.json).
CHANNELS_N_MAX = 32
_CHANNELS_TILE = 64 * 32 * 4  # accumulator elements of a 4-warp program: 64 registers a thread a set


class Tiles(NamedTuple):
    """Launch shape: output tile (``block_m`` channels x ``block_n`` samples), warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


LARGE = Tiles(128, 128, 8, 3)  # 192 KiB of shared memory: one program per multiprocessor
SMALL = Tiles(64, 64, 4, 3)  # 96 KiB: two


class Launch(NamedTuple):
    """Everything :func:`plan` decides; ``grid`` is (sample tiles, channel tiles, row groups x programs per
    group). A program covers ``rows`` batch rows, ``block_n // rows`` samples of each."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    chunk_steps: int
    chunks: int
    split: bool
    grid: tuple[int, int, int]
    rows: int = 1


class ChannelsLaunch(NamedTuple):
    """The launch of a layer whose output channels are the GEMM's N (:func:`plan_channels`): a program
    computes ``block_t`` samples x ``block_o`` channels of one batch row; ``grid`` is (sample tiles,
    channel tiles, batch rows)."""

    block_t: int
    block_o: int
    block_k: int
    warps: int
    stages: int
    chunk_steps: int
    chunks: int
    grid: tuple[int, int, int]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_k(padded_channels: int) -> int:
    """Input channels per step for ``padded_channels`` input channels: a layer property, never a launch's."""
    return 64 if padded_channels % 64 == 0 else 32


def chunking(steps: int) -> tuple[int, int]:
    """``(steps per chunk, chunks)`` for a reduction of ``steps`` steps: as few equal chunks as keep each
    at most :data:`CHUNK_STEPS` (the last may be shorter)."""
    count = _cdiv(steps, CHUNK_STEPS)
    per = _cdiv(steps, count)
    return per, _cdiv(steps, per)


def _stage_bytes(block_m: int, block_n: int, bk: int) -> int:
    """Shared memory of one pipeline stage: float16 heads and tails of a weight and an input box."""
    return (block_m + block_n) * bk * 2 * 2


def default_tiles(batch: int, cout: int, tout: int, sms: int, bk: int = 64) -> Tiles:
    """The tile for a ``batch`` x ``cout`` x ``tout`` output, ``bk`` channels a step, on a GPU with ``sms``
    multiprocessors (the rules are in the module docstring)."""
    if batch * _cdiv(cout, LARGE.block_m) * _cdiv(tout, LARGE.block_n) < sms:
        return SMALL
    if cout % LARGE.block_m == 0:
        return LARGE
    stages = max(2, min(4, SHARED_PER_PAIR // _stage_bytes(64, 128, bk)))
    return Tiles(64, 128, 4, stages)


def _wave_fill(programs: int, slots: int) -> float:
    """The fraction of ``slots``-wide waves that ``programs`` programs keep busy."""
    return programs / (_cdiv(programs, slots) * slots)


def pack_row_n(tout: int, block_n: int) -> int:
    """Samples of each row that a packed program of ``block_n`` columns covers, for rows of ``tout``: the
    size in :data:`PACK_ROW_NS` under ``block_n`` (a program takes two rows at least) that pads a row
    least, the largest of equals (fewer rows a program: less row arithmetic in the epilogue)."""
    sizes = [n for n in PACK_ROW_NS if n < block_n] or [min(PACK_ROW_NS)]
    return min(sizes, key=lambda n: (_cdiv(tout, n) * n, -n))


def _pads_less_packed(tout: int, block_n: int, row_n: int) -> bool:
    """Whether pieces of ``row_n`` samples pad rows of ``tout`` less than one-row programs of tiles up to
    ``block_n`` samples do, by enough to pack (:data:`PACK_LONG_ROWS`)."""
    alone = pow2_block(tout, _MIN_BLOCK_N, block_n)
    padded = _cdiv(tout, alone) * alone
    if tout >= block_n and not (PACK_LONG_ROWS and (padded - tout) * PACK_LONG_WASTE > tout):
        return False
    return _cdiv(tout, row_n) * row_n < padded


def _pieces(tile: Tiles, batch: int, tout: int) -> tuple[int, int] | None:
    """``(row_n, rows)``: the samples of each row and the rows a packed program of ``tile`` covers, for
    ``batch`` rows of ``tout``; None where pieces would pad the rows no less than one-row programs."""
    row_n = pack_row_n(tout, tile.block_n)
    if not _pads_less_packed(tout, tile.block_n, row_n):
        return None
    return row_n, min(tile.block_n // row_n, pow2_block(batch, 1, tile.block_n))


def packed_tiles(batch: int, cout: int, tout: int, sms: int, bk: int = 64) -> Tiles | None:
    """The tile for packing rows (module docstring), or None where packing does not pay: rows it would
    pad no less, a single row, or a grid too small to give every multiprocessor a program."""
    if batch < 2:
        return None
    for tile in (default_tiles(batch, cout, tout, sms, bk), SMALL):
        pieces = _pieces(tile, batch, tout)
        if pieces is None:
            continue
        row_n, rows = pieces
        programs = _cdiv(batch, rows) * _cdiv(tout, row_n) * _cdiv(cout, tile.block_m)
        if programs < sms:
            continue
        if tile == LARGE and _wave_fill(programs, sms) < PACK_LARGE_FILL:
            continue  # one program a multiprocessor and a mostly empty last wave: small tiles fill it
        return tile
    return None


def plan(
    *,
    batch: int,
    padded_channels: int,
    cout: int,
    tout: int,
    ksize: int,
    sms: int,
    tiles: Tiles | None = None,
    split: bool | None = None,
    pack: bool = True,
) -> Launch:
    """The launch of one call (``batch``, ``tout`` >= 1). ``tiles`` and ``split`` override the defaults;
    the chunks run as separate programs by default when one program per tile would not fill the GPU.
    ``pack`` allows packing short rows (with ``tiles`` given, only into that tile)."""
    bk = block_k(padded_channels)
    per, chunks = chunking(ksize * (padded_channels // bk))
    packed = (tiles if batch > 1 else None) if tiles else packed_tiles(batch, cout, tout, sms, bk)
    # a given tile packs only where that pads less, as packed_tiles's own choice does
    pieces = _pieces(packed, batch, tout) if pack and packed is not None else None
    rows = 0
    if pieces is not None:
        row_n = pieces[0]
        block_n = max(pieces[1] * row_n, DOT_MIN_EXTENT)
        rows = block_n // row_n
    if rows < 2:
        packed, rows = None, 0
    t = packed or tiles or default_tiles(batch, cout, tout, sms, bk)
    block_m = pow2_block(cout, WARPGROUP_ROWS, t.block_m)
    if not rows:
        rows, block_n = 1, pow2_block(tout, _MIN_BLOCK_N, t.block_n)
        row_n = block_n
    warps = min(t.warps if t.block_m > WARPGROUP_ROWS else 4, 4 * (block_m // WARPGROUP_ROWS))  # 4 per group
    tiles_n, tiles_m, groups = _cdiv(tout, row_n), _cdiv(cout, block_m), _cdiv(batch, rows)
    if split is None:
        programs = tiles_n * tiles_m * groups
        slots = sms * max(1, SHARED_PER_PAIR * 2 // (_stage_bytes(block_m, block_n, bk) * t.stages))
        split = (
            programs < sms or _wave_fill(programs * chunks, slots) > _wave_fill(programs, slots) + SPLIT_GAIN
        )
    split = split and chunks > 1
    grid = (tiles_n, tiles_m, groups * (chunks if split else 1))
    return Launch(block_m, block_n, bk, warps, t.stages, per, chunks, split, grid, rows)


def channels_as_n(cout: int) -> bool:
    """Whether a layer of ``cout`` output channels runs with them along the GEMM's N. A layer property,
    never a batch's; the two orientations give the same bits anyway (the same products in the same steps;
    the H200's tensor cores sum an instruction's products alike either way round, tested on the GPU)."""
    return cout <= CHANNELS_N_MAX


def plan_channels(
    *, batch: int, padded_channels: int, cout: int, tout: int, ksize: int, tiles: Tiles | None = None
) -> ChannelsLaunch:
    """The launch of a layer with few output channels, laid out the other way round: the output channels
    (rounded up to a power of two from 16 to 128) are the tile's N and the samples its M, so that 24
    channels fill 32 columns instead of a quarter of a 64-row tile, and the input is read once for all
    of a row's channels. The same steps and chunks as :func:`plan` (the arithmetic is the layer's);
    ``tiles`` overrides the tile (``block_m``: samples, ``block_n``: channels), warps and stages."""
    bk = block_k(padded_channels)
    per, chunks = chunking(ksize * (padded_channels // bk))
    if tiles is not None:
        block_t, block_o, warps, stages = tiles
    else:
        block_o = pow2_block(cout, 16, 128)  # wider, and 64 samples a program would take 128 registers a set
        block_t = max(WARPGROUP_ROWS, min(256, _CHANNELS_TILE // block_o))
        warps = 4
        stages = max(2, min(6, SHARED_PER_PAIR // _stage_bytes(block_t, block_o, bk)))
    grid = (_cdiv(tout, block_t), _cdiv(cout, block_o), batch)
    return ChannelsLaunch(block_t, block_o, bk, warps, stages, per, chunks, grid)
