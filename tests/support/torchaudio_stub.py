"""Lets the reference codecs import beside the CPU torch (no tests here; see ../shared/notes/env.md).

PyPI's torchaudio is a CUDA build whose ``_torchaudio.so`` does not load beside the CPU torch wheel, and
``dac`` (through descript-audiotools) imports torchaudio. Registering a stand-in for
``torchaudio._extension`` before the first import makes torchaudio skip its compiled extension; its
pure-Python parts then import, and so do ``dac`` and ``bigvgan``. Nothing here touches the network.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["install_torchaudio_stub"]


def _fail_if_no_align(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{fn.__name__} needs torchaudio's compiled extension, which the stub leaves out")

    return fail


def install_torchaudio_stub() -> None:
    """Register the stand-in ``torchaudio._extension`` (idempotent; harmless once torchaudio is imported)."""
    if "torchaudio._extension" in sys.modules:
        return
    ext = types.ModuleType("torchaudio._extension")
    ext._IS_TORCHAUDIO_EXT_AVAILABLE = False  # type: ignore[attr-defined]
    ext._IS_ALIGN_AVAILABLE = False  # type: ignore[attr-defined]
    ext._check_cuda_version = lambda: None  # type: ignore[attr-defined]
    ext.fail_if_no_align = _fail_if_no_align  # type: ignore[attr-defined]
    sys.modules["torchaudio._extension"] = ext


def import_references() -> tuple[Any, Any]:
    """``(dac.model.dac, bigvgan.bigvgan)`` imported behind the stub, with their import-time warnings muted."""
    install_torchaudio_stub()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import bigvgan.bigvgan as bigvgan_module
        import dac.model.dac as dac_module
    return dac_module, bigvgan_module
