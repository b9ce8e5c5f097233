"""Fixtures the GPU tests share: auk-24k on the device, once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from streamdec.codecs import Codec, load_codec


@pytest.fixture(scope="module")
def auk() -> Iterator[Codec]:
    """auk-24k (random weights) on CUDA in float32; its memory goes back to the device after the module."""
    codec = load_codec("auk-24k", device="cuda", dtype=torch.float32)
    yield codec
    del codec
    torch.cuda.empty_cache()
