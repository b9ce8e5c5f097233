"""Launch sizing the Triton kernels share: pure integer arithmetic, importable without Triton."""

from __future__ import annotations

from streamdec import settings

__all__ = ["DOT_MIN_EXTENT", "INTERPRETER_SMS", "PACK_SHORT_ROWS", "WARPGROUP_ROWS", "pow2_block"]

# Whether the float16 convolution and the fused activation pack several short rows into one program
# (``STREAMDEC_PACK_SHORT_ROWS``). Read once at import: captured graphs trace the launches.
PACK_SHORT_ROWS = settings.PACK_SHORT_ROWS.value()

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
