"""GPU kernels for the decoders, each with a reference fallback (see ``docs/kernels.md``).

``alias_free_activation`` is the ``torch.ops.streamdec.alias_free_activation`` custom op (a fused
2x upsample, SnakeBeta and 2x decimation); ``fused_supported(x)`` says whether a layer may call it;
``set_fused(module, enabled)`` switches it per module tree (the codec-level flag).
"""

from __future__ import annotations

from torch import nn

from streamdec.kernels.alias_free import (
    ENV_DISABLE,
    alias_free_activation,
    fused_supported,
    polyphase_reference,
)

__all__ = ["ENV_DISABLE", "alias_free_activation", "fused_supported", "polyphase_reference", "set_fused"]


def set_fused(module: nn.Module, enabled: bool) -> int:
    """Set ``use_fused`` on every submodule that has it; returns how many were set.

    Takes effect at the next eager call or compile; graphs already captured keep what they captured.
    """
    count = 0
    for sub in module.modules():
        if hasattr(sub, "use_fused"):
            setattr(sub, "use_fused", enabled)  # noqa: B010 - any module type may carry the flag
            count += 1
    return count
