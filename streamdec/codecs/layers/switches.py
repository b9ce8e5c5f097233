"""Switches over a whole model: rebuild derived caches, turn the split precisions on or off, ask where
the convolutions run."""

from __future__ import annotations

from torch import nn

from streamdec.codecs.layers import routing
from streamdec.codecs.layers.activation import AliasFreeActivation, SnakeBeta
from streamdec.codecs.layers.conv import SplitConv
from streamdec.errors import ConfigError

__all__ = ["all_convs_on_triton_split", "any_conv_may_take_triton", "refresh_caches", "set_split_convs"]


def refresh_caches(module: nn.Module) -> None:
    """Rebuild every derived buffer (activation caches, tf32x3 split weights) after loading or a dtype change."""
    for sub in module.modules():
        if isinstance(sub, (AliasFreeActivation, SnakeBeta)):
            sub.refresh_cache()
        elif isinstance(sub, SplitConv):
            sub.refresh_split()


def all_convs_on_triton_split(module: nn.Module, *, f16: bool = False) -> bool:
    """Whether every convolution of ``module`` runs through a Triton split kernel (``f16``: the float16
    one): true only after ``set_split_convs(module, True)`` on CUDA float32 weights with the kernels on,
    and only where each layer has an ordinary-convolution form (:meth:`SplitConv.triton_weight`)."""
    convs = [sub for sub in module.modules() if isinstance(sub, SplitConv)]
    if f16:
        return bool(convs) and all(sub.packed_f16 is not None for sub in convs)
    return bool(convs) and all(sub.packed_split is not None or sub.packed_f16 is not None for sub in convs)


def any_conv_may_take_triton(module: nn.Module) -> bool:
    """Whether any convolution of ``module`` could run through a Triton split kernel where it is now (its
    weight's device and dtype, the kernels on): when none could, no split precision beats ``"fp32"``,
    and finding that out by splitting every weight is not needed."""
    return any(
        routing.triton_conv_supported(sub.weight) for sub in module.modules() if isinstance(sub, SplitConv)
    )


def set_split_convs(module: nn.Module, enabled: bool, *, f16: bool = False, products: int = 3) -> None:
    """Switch every convolution in ``module`` to the split path (``f16``: the float16 kernel where a
    layer can take it, ``"fp16x3"``, or with ``products=1`` ``"fp16"``; else ``"tf32x3"``), or back to
    plain.

    Raises :class:`ConfigError` (and changes nothing) when enabling finds a convolution module that is
    not a :class:`SplitConv`: under the TF32 flag that split precision sets, it would silently run in TF32.
    """
    if enabled:
        convs = [(name or "<root>", sub) for name, sub in module.named_modules()
                 if isinstance(sub, nn.modules.conv._ConvNd)]  # fmt: skip
        foreign = [f"{name} ({type(sub).__name__})" for name, sub in convs if not isinstance(sub, SplitConv)]
        if foreign:
            raise ConfigError(
                f"precision 'tf32x3' needs streamdec's conv layers, but these are other convolutions: "
                f"{', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}; use 'fp32' (exact) or 'tf32'"
            )
        grouped = [f"{name} (groups={sub.groups})" for name, sub in convs if sub.groups != 1]
        if grouped:  # stacking [x_hi, x_hi, x_lo] along channels would cross group boundaries
            raise ConfigError(
                f"precision 'tf32x3' supports groups=1 convolutions only; grouped: {', '.join(grouped[:5])}; "
                f"use 'fp32' (exact) or 'tf32'"
            )
    for sub in module.modules():
        if isinstance(sub, SplitConv):
            sub.set_split(enabled, f16=f16, products=products)
        elif isinstance(sub, AliasFreeActivation):
            sub.split_filters = enabled
