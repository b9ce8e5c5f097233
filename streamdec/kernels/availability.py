"""Whether Triton is installed: the one place :mod:`streamdec.kernels` asks.

Asked without importing Triton (a slow import, and absent on CPU machines): the Triton kernel modules
(``_triton_*``) are imported only inside the ops' CUDA implementations, so this package imports anywhere.
"""

from __future__ import annotations

import importlib.util

__all__ = ["HAS_TRITON"]

HAS_TRITON = importlib.util.find_spec("triton") is not None
