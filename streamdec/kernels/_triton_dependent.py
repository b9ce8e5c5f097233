# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Programmatic dependent launch for the Triton kernels (imported only where Triton is).

A captured step or decode is some 500 kernel launches, most of them short: between two of them the GPU
sits idle while the second grid is placed, about a millisecond of a 256 x 4 step. Launched as a
*programmatic dependent* (``launch_pdl``, Hopper and later), a kernel's programs may be placed on the
multiprocessors while the kernel before it is still running; each program first waits at
``griddepcontrol.wait`` until that kernel has finished and its writes are visible, and only then reads
anything. Nothing about what a kernel computes changes, only when its programs are placed, so every
output keeps its bits.

Two rules keep it safe, and :func:`wait_for_inputs` holds both, called as every such kernel's first
statement:

* every program waits before its first load, early-returning ones included: a kernel is complete only
  when all of its programs are, and only a waiting program makes the kernel after it wait in turn for
  everything before it (the ordering is transitive through the waits);
* a program lets its dependents be placed (``griddepcontrol.launch_dependents``) only after its own wait,
  so at most two grids are ever resident: the running one and the next, parked at its wait.

A kernel launched without the attribute (a PyTorch kernel, a copy, the Gluon convolution) waits for
everything before it as usual, and a dependent launched after it waits for it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from streamdec.kernels import sizing

__all__ = ["dependent_launch", "wait_for_inputs"]

_ON = {"DEPENDENT": True, "launch_pdl": True}
_OFF: dict[str, bool] = {}


@triton.jit
def wait_for_inputs(DEPENDENT: tl.constexpr):
    """A dependent launch's first statement: wait for the kernel before, then let the next be placed."""
    if DEPENDENT:
        gdc_wait()
        gdc_launch_dependents()


@functools.cache
def _has_dependent_launch(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def dependent_launch(device: torch.device) -> dict[str, bool]:
    """The launch keywords of a kernel that takes the ``DEPENDENT`` constexpr, for a launch on ``device``:
    ``DEPENDENT`` and Triton's ``launch_pdl`` on a CUDA GPU of compute capability 9.0 and up (with
    ``STREAMDEC_DEPENDENT_LAUNCH`` on), nothing elsewhere (the interpreter's CPU tensors included)."""
    if not sizing.DEPENDENT_LAUNCH or device.type != "cuda" or triton.knobs.runtime.interpret:
        return _OFF
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _ON if _has_dependent_launch(index) else _OFF
