"""Suite-wide configuration: the test kinds by folder, and GPU tests skipped where there is no CUDA device.

``tests/unit`` (pure, fast), ``tests/integration`` (servers, clients, CLI subprocesses), ``tests/gpu``
(marked ``cuda``), ``tests/ref`` (marked ``ref``); shared helpers live in ``tests/support``.
"""

from __future__ import annotations

import os
from pathlib import Path

# Inductor compiles in-process: with its worker pool, pytest on an H200 reported every test and then hung
# at interpreter exit. Set before torch reads its config.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest
import torch

import streamdec

_MARK_BY_FOLDER = {"gpu": "cuda", "ref": "ref"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        folder = Path(str(item.path)).relative_to(here).parts[0]
        if folder in _MARK_BY_FOLDER:
            item.add_marker(_MARK_BY_FOLDER[folder])
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def codec() -> streamdec.Codec:
    """The "tiny" codec on the CPU, once per module: what the server and engine tests decode with unless a
    module asks for another (by defining its own ``codec``)."""
    return streamdec.load_codec("tiny", device="cpu")


@pytest.fixture(scope="module")
def fast_codec() -> streamdec.Codec:
    """dac-tiny on the CPU, about ten times faster than "tiny": for tests whose streams must decode ahead
    of real time."""
    return streamdec.load_codec("dac-tiny", device="cpu")
