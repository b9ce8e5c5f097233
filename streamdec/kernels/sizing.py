"""Launch sizing the Triton kernels share: pure integer arithmetic, importable without Triton."""

from __future__ import annotations

from streamdec import settings

__all__ = [
    "ACTIVATION_LANE_OUTPUTS",
    "ACTIVATION_MIN_LANES",
    "DEPENDENT_LAUNCH",
    "DOT_MIN_EXTENT",
    "INTERPRETER_SMS",
    "PACK_SHORT_ROWS",
    "SPECIALIZED_CONV",
    "WARPGROUP_ROWS",
    "activation_packs_rows",
    "pow2_block",
    "split_block_t",
]

# Whether the float16 convolution and the fused activation pack several short rows into one program
# (``STREAMDEC_PACK_SHORT_ROWS``). Read once at import: captured graphs trace the launches.
PACK_SHORT_ROWS = settings.PACK_SHORT_ROWS.value()
# Whether ``fp16x3`` convolutions of 128-channel tiles run the warp-specialized Gluon kernel on Hopper GPUs
# (``STREAMDEC_SPECIALIZED_CONV``); read once at import, as above.
SPECIALIZED_CONV = settings.SPECIALIZED_CONV.value()
# Whether the Triton kernels launch as programmatic dependents of the launch before them
# (``STREAMDEC_DEPENDENT_LAUNCH``; :mod:`streamdec.kernels._triton_dependent`); read once at import, as above.
DEPENDENT_LAUNCH = settings.DEPENDENT_LAUNCH.value()

# The fused activation: outputs per lane, and the fewest lanes a one-row program has (a warp); rows that
# need fewer are packed several to a program.
ACTIVATION_LANE_OUTPUTS = 8
ACTIVATION_MIN_LANES = 32

# tl.dot needs every block extent to be at least 16.
DOT_MIN_EXTENT = 16
# wgmma works on 64 output rows per warpgroup (4 warps).
WARPGROUP_ROWS = 64
# Under the Triton interpreter (on the CPU) launches are planned as for an H200's 132 multiprocessors, so
# that interpreted tests take the same launch rules the GPU does.
INTERPRETER_SMS = 132


def pow2_block(extent: int, lo: int, hi: int) -> int:
    """The power of two that covers ``extent``, clamped to ``[lo, hi]``."""
    return max(lo, min(hi, 1 << max(extent - 1, 0).bit_length()))


# The input split's tile along time: the largest of these whose padding wastes at most 1/SPLIT_WASTE of a
# row, else the smallest. A stateful step's rows are 22-86 samples in its wide layers, where 64-sample tiles
# left 17 % of the split's lanes idle at 256 x 4 (3 % for a whole clip); each element is split on its own,
# so the tile changes no bit.
SPLIT_BLOCKS_T = (64, 32, 16)
SPLIT_WASTE = 16
SPLIT_ELEMENTS_PER_WARP = 32 * 16  # the 64-sample tile's four warps hold 16 elements a lane: so does each


def split_block_t(length: int) -> int:
    """Samples along time of one input-split program for rows of ``length`` samples."""
    for block in SPLIT_BLOCKS_T:
        if -length % block * SPLIT_WASTE <= length:
            return block
    return SPLIT_BLOCKS_T[-1]


def activation_packs_rows(length: int) -> bool:
    """Whether the fused activation packs rows of ``length`` outputs several to a program."""
    return PACK_SHORT_ROWS and -(-length // ACTIVATION_LANE_OUTPUTS) < ACTIVATION_MIN_LANES
