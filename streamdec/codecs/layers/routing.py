"""Which path a layer call takes: the kernels' dispatch rules, gathered where the layers read them.

The layers call these through this module (``routing.takes_split(x)``), never through their own copies,
so one attribute here decides for every layer (tests replace one to route CPU tensors through a kernel's
path, as a CUDA float32 input would take it).

* :func:`takes_split`: a split-precision layer splits this input (CUDA float32).
* :func:`fused_supported`: the fused alias-free activation may run this input.
* :func:`triton_conv_supported`: a split conv may run on the TF32 Triton kernel.
* :func:`f16_conv_supported`: it may run on the float16 one (a GPU with TMA).
"""

from __future__ import annotations

from streamdec.kernels.alias_free import fused_supported
from streamdec.kernels.conv import f16_conv_supported, triton_conv_supported
from streamdec.kernels.split import takes_split

__all__ = ["f16_conv_supported", "fused_supported", "takes_split", "triton_conv_supported"]
