"""Helpers for the exact-context tests (no tests here): weight settings that probe a layer's support.

tests/test_context.py (AuK) and tests/test_zoo.py (DAC, Oobleck, BigVGAN) check ``input_interval`` two ways:
*tightness* on a linear "support model" (non-negative conv weights, no biases, flat filters, identity
Snakes), whose response is non-zero exactly where some path of taps reaches, and *soundness* with random
weights. Each file neutralises its own Snakes; the rest is here.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor, nn

from streamdec.codecs.layers import AliasFreeActivation, refresh_caches

M = TypeVar("M", bound=nn.Module)


def random_weights(module: nn.Module, seed: int = 0, *, positive_alpha: bool = False) -> nn.Module:
    """Float64 copy of ``module`` with every parameter drawn N(0, 0.5^2) (biases too), caches rebuilt.

    ``positive_alpha``: parameters named ``*alpha`` become ``|draw| + 0.5`` instead, which keeps a linear
    Snake's frequency away from 0 (where it would be the identity).
    """
    gen = torch.Generator().manual_seed(seed)
    module = module.double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            value = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5
            p.copy_(value.abs() + 0.5 if positive_alpha and name.endswith("alpha") else value)
    refresh_caches(module)
    return module


def flat_convs(module: M) -> M:
    """Every conv's weights set to ``1 / (taps per output channel)`` and its bias to zero, in place."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Conv1d | nn.ConvTranspose1d):
                m.weight.fill_(1.0 / m.weight[0].numel())
                if m.bias is not None:
                    m.bias.zero_()
    return module


def flat_filters(module: M) -> M:
    """Every alias-free activation's filter set to equal positive taps (same support), in place.

    Call after ``refresh_caches``, which rebuilds the filters.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, AliasFreeActivation):
                m.filter.fill_(1.0 / m.filter.numel())
    return module


def reads(module: nn.Module, x: Tensor) -> dict[int, set[int]]:
    """For each output index, the input indices whose +1 bump moves it at all (``x`` is ``[1, C, T]``)."""
    out: dict[int, set[int]] = {}
    with torch.no_grad():
        base = module(x)
        for i in range(x.shape[-1]):
            bumped = x.clone()
            bumped[0, :, i] += 1.0
            moved = (module(bumped) - base).abs().amax(dim=1)[0]
            for o in (moved > 0).nonzero().flatten().tolist():
                out.setdefault(o, set()).add(i)
    return out
