"""Layers that compose others or wrap a function, with the geometry of what they hold."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from streamdec.codecs.geometry import Interval, through

__all__ = ["GeoSequential", "Pointwise"]


class Pointwise(nn.Module):
    """An elementwise function (``tanh``, ``clamp``) as a layer with identity geometry."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def input_interval(self, lo: int, hi: int) -> Interval:
        return lo, hi


class GeoSequential(nn.Sequential):
    """``nn.Sequential`` whose geometry is its children's, composed (every child must be geometric).

    Families mirror a reference implementation's ``nn.Sequential`` with it, so that state-dict keys
    (``model.1.block.2...``) match the reference checkpoints one for one.
    """

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through(list(self), lo, hi)  # type: ignore[arg-type]
