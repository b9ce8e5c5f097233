"""Whether Triton is installed, and whether an op may skip the dispatcher: the one place
:mod:`streamdec.kernels` asks.

Asked without importing Triton (a slow import, and absent on CPU machines): the Triton kernel modules
(``_triton_*``) are imported only inside the ops' CUDA implementations, so this package imports anywhere.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch

__all__ = ["HAS_TRITON", "direct_cuda_call", "launch_device"]

HAS_TRITON = importlib.util.find_spec("triton") is not None


def direct_cuda_call(x: torch.Tensor) -> bool:
    """Whether an op on ``x`` may call its CUDA implementation directly instead of through the dispatcher.

    A custom op's dispatch runs Python layers around its kernel: about 5 us a call, and 25 us for one that
    mutates an argument (a stateful layer's kept state), against under a microsecond for the direct call.
    A stateful step makes hundreds of such calls, and warm-up makes every step bucket's calls twice (the
    eager run, then the recording), so those layers were seconds of a server's start-up. The direct call is
    what the dispatcher would run (the same function, the same bits). Only for a plain CUDA tensor in eager
    code: ``torch.compile`` must see the op itself (Inductor treats it as opaque), and a tensor subclass or
    an active dispatch mode (fake tensors, tracing) needs the dispatcher's handling."""
    return (
        type(x) is torch.Tensor
        and x.is_cuda
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
    )


def launch_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """What an op's CUDA implementation launches its Triton kernels in: ``device`` made the current one
    (Triton launches on the current device). Off CUDA nothing: the Triton interpreter runs those same
    launches on CPU tensors (``scripts/count_launches.py``, the interpreted-kernel tests), and
    ``torch.cuda.device`` refuses a CPU device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
