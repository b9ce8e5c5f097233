"""How the float16 split convolution is launched: pure arithmetic, importable without Triton.

:func:`plan` turns a layer's shape and a batch into the kernel's tile, step size, chunking and grid
(:mod:`streamdec.kernels._triton_conv_f16` runs it). Two of those choices are the layer's alone and fix
the arithmetic, so a row's output never depends on its batch or on the launch: the channels per step
(:func:`block_k`) and the chunking of the reduction (:func:`chunking`). The others only decide which
program computes what: the tile (:func:`default_tiles`) and whether the chunks run as separate programs.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CHUNK_STEPS", "LARGE", "SMALL", "Launch", "Tiles", "block_k", "chunking", "default_tiles", "plan"]

CHUNK_STEPS = 48  # the longest chunk, in steps; a layer with more steps is cut into equal chunks


class Tiles(NamedTuple):
    """Launch shape: output tile (``block_m`` channels x ``block_n`` samples), warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


# From a per-layer sweep over auk-24k at 1 x 70 on an H200 (bench/results/2026-11-30-h200-s4-conv-kernels-1x70.json):
# small tiles (two programs per multiprocessor fit in shared memory) wherever large ones would not fill
# the GPU once; the chunks then go to separate programs too.
LARGE = Tiles(128, 128, 8, 3)
SMALL = Tiles(64, 64, 4, 3)


class Launch(NamedTuple):
    """Everything :func:`plan` decides; ``grid`` is (sample tiles, channel tiles, batch x programs per row)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    chunk_steps: int
    chunks: int
    split: bool
    grid: tuple[int, int, int]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block(extent: int, lo: int, hi: int) -> int:
    """The power of two that covers ``extent``, clamped to ``[lo, hi]``."""
    return max(lo, min(hi, 1 << max(extent - 1, 0).bit_length()))


def block_k(padded_channels: int) -> int:
    """Input channels per step for ``padded_channels`` input channels: a layer property, never a launch's."""
    return 64 if padded_channels % 64 == 0 else 32


def chunking(steps: int) -> tuple[int, int]:
    """``(steps per chunk, chunks)`` for a reduction of ``steps`` steps: as few equal chunks as keep each
    at most :data:`CHUNK_STEPS` (the last may be shorter)."""
    count = _cdiv(steps, CHUNK_STEPS)
    per = _cdiv(steps, count)
    return per, _cdiv(steps, per)


def default_tiles(batch: int, cout: int, tout: int, sms: int) -> Tiles:
    """The tile for a ``batch`` x ``cout`` x ``tout`` output on a GPU with ``sms`` multiprocessors."""
    programs = batch * _cdiv(cout, LARGE.block_m) * _cdiv(tout, LARGE.block_n)
    return LARGE if programs >= sms else SMALL


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
) -> Launch:
    """The launch of one call (``batch``, ``tout`` >= 1). ``tiles`` and ``split`` override the defaults;
    the chunks run as separate programs by default when one program per tile would not fill the GPU."""
    bk = block_k(padded_channels)
    per, chunks = chunking(ksize * (padded_channels // bk))
    t = tiles or default_tiles(batch, cout, tout, sms)
    block_m, block_n = _block(cout, 64, t.block_m), _block(tout, 32, t.block_n)
    warps = min(t.warps if t.block_m > 64 else 4, 4 * (block_m // 64))  # one warpgroup per 64 rows
    tiles_n, tiles_m = _cdiv(tout, block_n), _cdiv(cout, block_m)
    if split is None:
        split = tiles_n * tiles_m * batch < sms
    split = split and chunks > 1
    grid = (tiles_n, tiles_m, batch * (chunks if split else 1))
    return Launch(block_m, block_n, bk, warps, t.stages, per, chunks, split, grid)
