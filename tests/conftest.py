"""Suite-wide configuration: GPU tests skip where there is no CUDA device."""

from __future__ import annotations

import os

# Inductor compiles in-process: with its worker pool, pytest on an H200 reported every test and then hung
# at interpreter exit (bench/results/2026-11-30-h200-session3.md). Set before torch reads its config.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
