"""Helpers for the alias-free activation tests (no tests here): a layer with random, seeded parameters.

tests/unit/test_kernels.py (CPU: the oracle and the op's plumbing) and tests/gpu/test_kernels_cuda.py
(the Triton kernels) build their layers the same way.
"""

from __future__ import annotations

import torch

from streamdec.codecs.layers import AliasFreeActivation


def random_activation(channels: int, seed: int, device: str = "cpu") -> AliasFreeActivation:
    """An activation with seeded snake parameters (alpha near 0, beta near 1) on ``device``, caches built."""
    gen = torch.Generator().manual_seed(seed)
    act = AliasFreeActivation(channels)
    with torch.no_grad():
        act.act.alpha.copy_(torch.randn(channels, generator=gen) * 0.3)
        act.act.beta.copy_(torch.randn(channels, generator=gen) * 0.3 + 1.0)
    act = act.to(device)
    act.refresh_cache()
    return act
