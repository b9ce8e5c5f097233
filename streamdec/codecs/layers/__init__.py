"""Shared decoder layers, each knowing its own receptive-field geometry (``input_interval``).

* :mod:`~streamdec.codecs.layers.conv`: padded and transposed convolutions with the split-precision paths.
* :mod:`~streamdec.codecs.layers.activation`: Snake, SnakeBeta and the alias-free activation (filter design).
* :mod:`~streamdec.codecs.layers.containers`: ``GeoSequential`` and ``Pointwise``.
* :mod:`~streamdec.codecs.layers.switches`: model-wide ``refresh_caches`` and ``set_split_convs``.
* :mod:`~streamdec.codecs.layers.routing`: which kernel a call takes.

Derived, non-persistent buffers (the filter, ``exp(alpha)``, ``1/(exp(beta)+1e-9)``, split weights) are
rebuilt by :func:`refresh_caches`, which every loader calls after weights are in place and after any dtype
change.
"""

from __future__ import annotations

from streamdec.codecs.layers import routing
from streamdec.codecs.layers.activation import (
    FILTER_CUTOFF,
    FILTER_HALF_WIDTH,
    FILTER_TAPS,
    AliasFreeActivation,
    Snake,
    SnakeBeta,
    kaiser_sinc_filter,
)
from streamdec.codecs.layers.containers import GeoSequential, Pointwise
from streamdec.codecs.layers.conv import (
    CausalConvTranspose1d,
    PaddedConv1d,
    PaddedConvTranspose1d,
    SplitConv,
    polyphase_weight,
)
from streamdec.codecs.layers.switches import (
    all_convs_on_triton_split,
    any_conv_may_take_triton,
    refresh_caches,
    set_split_convs,
)

__all__ = [
    "FILTER_CUTOFF",
    "FILTER_HALF_WIDTH",
    "FILTER_TAPS",
    "AliasFreeActivation",
    "CausalConvTranspose1d",
    "GeoSequential",
    "PaddedConv1d",
    "PaddedConvTranspose1d",
    "Pointwise",
    "Snake",
    "SnakeBeta",
    "SplitConv",
    "all_convs_on_triton_split",
    "any_conv_may_take_triton",
    "kaiser_sinc_filter",
    "polyphase_weight",
    "refresh_caches",
    "routing",
    "set_split_convs",
]
