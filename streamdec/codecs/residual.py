"""A stack of residual units, ``x = unit(x) + x`` in order: BigVGAN's AMP blocks and VITS's resblocks.

A subclass says what its units are (:meth:`ResidualUnits.units`, each a list of layers applied in order);
the forward pass, the receptive-field geometry and the streaming layout follow from them alone.
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from streamdec.codecs.geometry import Interval, residual
from streamdec.codecs.layers import PaddedConv1d
from streamdec.codecs.stateful import Node, Residual, Seq, layout_of

__all__ = ["ResidualUnits"]


class ResidualUnits(nn.Module):
    """Residual units over one channel count; subclasses implement :meth:`units`."""

    def units(self) -> list[list[nn.Module]]:
        """The residual branches, in order, each a list of layers (a convolution among them)."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:  # [B, C, T] -> [B, C, T]
        for unit in self.units():
            xt = x
            for layer in unit:
                xt = cast(Tensor, layer(xt))
            x = xt + x
        return x

    def input_interval(self, lo: int, hi: int) -> Interval:
        for unit in reversed(self.units()):
            lo, hi = residual(unit, lo, hi)  # type: ignore[arg-type]
        return lo, hi

    def stream_layout(self) -> Node:
        conv = next(m for m in self.units()[0] if isinstance(m, PaddedConv1d))
        channels = conv.in_channels
        return Seq([Residual(Seq([layout_of(m) for m in unit]), channels) for unit in self.units()])
