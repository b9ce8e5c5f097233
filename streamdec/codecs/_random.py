"""Seeded random weights shared by the model-zoo families (DAC, Oobleck, BigVGAN)."""

from __future__ import annotations

import math

import torch
from torch import nn

from streamdec.codecs.layers import Snake, SnakeBeta

__all__ = ["fill_normal", "init_conv", "init_snake"]


@torch.no_grad()
def fill_normal(t: torch.Tensor, gen: torch.Generator, std: float, mean: float | None = None) -> None:
    """``t.copy_(torch.randn(t.shape, generator=gen) * std [+ mean])``, the same draws and roundings, made
    in ``t`` itself where it is a contiguous float32 CPU tensor: a preset's 100M weights then cost one
    pass each for the draws, the scale and the shift, with no temporaries to allocate and copy (a second
    of a server's start-up)."""
    if t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous():
        t.normal_(0.0, 1.0, generator=gen)  # what torch.randn draws into its fresh tensor
        t.mul_(std)
        if mean is not None:
            t.add_(mean)
        return
    draws = torch.randn(t.shape, generator=gen) * std
    t.copy_(draws if mean is None else draws + mean)


@torch.no_grad()
def init_conv(m: nn.Module, gain: float, gen: torch.Generator, bias_std: float = 0.02) -> None:
    """N(0, gain^2 / fan_in) weights and N(0, bias_std^2) biases for a Conv1d or ConvTranspose1d.

    A transposed conv's fan-in counts the taps that reach one output: ``in_channels * kernel / stride``.
    """
    if not isinstance(m, nn.Conv1d | nn.ConvTranspose1d):
        raise TypeError(f"init_conv needs a Conv1d or ConvTranspose1d, got {type(m).__name__}")
    w = m.weight
    if isinstance(m, nn.ConvTranspose1d):
        fan_in = w.shape[0] * max(1, w.shape[2] // m.stride[0])
    else:
        fan_in = w.shape[1] * w.shape[2]
    fill_normal(w, gen, gain / math.sqrt(fan_in))
    if m.bias is not None:
        fill_normal(m.bias, gen, bias_std)


@torch.no_grad()
def init_snake(module: SnakeBeta, gen: torch.Generator) -> None:
    """Log-scales ``alpha ~ N(0, 0.3^2)`` and (SnakeBeta only) ``beta ~ N(1, 0.3^2)``; a linear-scale module
    stores ``exp`` of those draws."""
    alpha = torch.randn(module.alpha.shape, generator=gen) * 0.3
    module.alpha.copy_(alpha if module.log_scale else alpha.exp())
    if not isinstance(module, Snake):
        beta = torch.randn(module.beta.shape, generator=gen) * 0.3 + 1.0
        module.beta.copy_(beta if module.log_scale else beta.exp())
