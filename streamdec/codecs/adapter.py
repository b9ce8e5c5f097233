"""Bring your own decoder: any ``nn.Module`` with a decode function, a hop size and a latent dim.

The streaming engine needs one fact about a decoder, its latent context ``(left, right)``. Families in this
package derive it exactly from their layers; a foreign module cannot, so :func:`measure_context` measures it
by perturbation and :class:`ModuleCodec` adds a safety margin:

1. In float64, decode ``trials`` random clips twice, the second time with latent frame ``f`` (mid-clip)
   bumped by a random vector, and record which output frames changed at all (relative change above
   ``1e-13``, i.e. above round-off). Output frames ``f - right .. f + left`` changed: that is the measured
   context. If the change reaches within two frames of an edge the clip doubles and the trial repeats.
2. Perturbation finds a *lower* bound of the exact support: outer paths through many small filter-tail
   taps change the output by less than float64 round-off (see :mod:`streamdec.codecs.geometry`). Measured
   on this package's decoders (tests/test_zoo_adapter.py): DAC and Oobleck ``(10, 10)``, equal to the exact
   figures; BigVGAN v2 (256x) ``(25, 25)`` against an exact ``(38, 38)``; AuK ``(42, 4)`` against ``(52, 7)``.
   What lies beyond the measurement is below ``1e-13`` of the output's peak, so windows sized by it match
   the whole-clip decode within float32 round-off (tested: within 1e-5 with no margin at all), though not
   bit for bit.
3. A few random trials can still miss a path that is rarely active (a gate, a ReLU that is mostly off), so
   :data:`DEFAULT_MARGIN` adds ``max(2, ceil(25 %))`` frames to each measured side; each margin frame costs
   one more frame of recompute per window.

Pass ``context=(left, right)`` when you know the figures, to skip measuring and the margin.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from streamdec.codecs.base import Codec
from streamdec.codecs.geometry import Interval
from streamdec.errors import CodecError, ShapeError

__all__ = ["DEFAULT_MARGIN", "ModuleCodec", "measure_context", "with_margin"]

DecodeFn = Callable[[Tensor], Tensor]  # [B, latent_dim, T] -> [B, channels, T * hop]
_RELATIVE_NOISE = 1e-13
_EDGE_FRAMES = 2


def DEFAULT_MARGIN(frames: int) -> int:
    """Frames added to a measured context side: ``max(2, ceil(frames / 4))``."""
    return max(2, math.ceil(frames / 4))


def with_margin(measured: tuple[int, int], margin: Callable[[int], int] = DEFAULT_MARGIN) -> tuple[int, int]:
    """``measured`` widened by ``margin`` on each side."""
    return measured[0] + margin(measured[0]), measured[1] + margin(measured[1])


def _frames_changed(decode: DecodeFn, base: Tensor, bumped: Tensor, hop: int) -> Tensor:
    """Bool ``[T]``: output frames where the bumped clip differs from the base one beyond round-off."""
    frames = base.shape[-1]
    with torch.inference_mode():
        out = decode(torch.cat([base, bumped]))
    if out.dim() != 3 or out.shape[0] != 2 or out.shape[-1] != frames * hop:
        raise ShapeError(
            f"decode of [2, {base.shape[1]}, {frames}] latents returned {tuple(out.shape)}; it must return "
            f"[2, channels, {frames * hop}] (frames x hop_size samples)"
        )
    diff = (out[0] - out[1]).abs().reshape(out.shape[1], frames, hop).amax(dim=(0, 2))
    scale = out.abs().max().clamp_min(1e-300)
    changed: Tensor = diff > _RELATIVE_NOISE * scale
    return changed


def measure_context(
    decode: DecodeFn,
    latent_dim: int,
    hop_size: int,
    *,
    trials: int = 3,
    seed: int = 0,
    start_frames: int = 32,
    max_frames: int = 4096,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> tuple[int, int]:
    """Measured ``(left, right)`` context of ``decode`` (module docstring, step 1): a lower bound."""
    frames = start_frames
    gen = torch.Generator().manual_seed(seed)
    while frames <= max_frames:
        f = frames // 2
        lo, hi = f, f
        for _ in range(trials):
            base = torch.randn(1, latent_dim, frames, generator=gen, dtype=torch.float64)
            bumped = base.clone()
            bumped[0, :, f] += torch.randn(latent_dim, generator=gen, dtype=torch.float64)
            moved = _frames_changed(decode, base.to(device, dtype), bumped.to(device, dtype), hop_size)
            idx = moved.nonzero().flatten().tolist()
            if idx:
                lo, hi = min(lo, idx[0]), max(hi, idx[-1])
        if lo >= _EDGE_FRAMES and hi < frames - _EDGE_FRAMES:
            return hi - f, f - lo  # output frame g reads latent frames g - left .. g + right
        frames *= 2
    raise CodecError(
        f"the decoder's influence reaches past a {max_frames}-frame probe clip; pass context=(left, right) "
        f"explicitly, or raise max_frames"
    )


class ModuleCodec(Codec):
    """A :class:`Codec` around any module: ``decode(x [B, latent_dim, T]) -> [B, channels, T*hop]``.

    ``decode`` defaults to ``module`` itself. ``context=None`` measures the context on a float64 copy of
    the module (:func:`measure_context`) and widens it by ``margin`` (:func:`with_margin`). The codec
    cannot be saved with ``save_codec``: keep the module's own checkpoint.
    """

    family: ClassVar[str] = "module"

    def __init__(
        self,
        module: nn.Module,
        *,
        latent_dim: int,
        hop_size: int,
        sample_rate: int,
        channels: int = 1,
        decode: Callable[[nn.Module, Tensor], Tensor] | None = None,
        context: tuple[int, int] | None = None,
        margin: Callable[[int], int] = DEFAULT_MARGIN,
        name: str = "module",
        measure_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name=name, latent_dim=latent_dim, hop_size=hop_size, sample_rate=sample_rate,
                         channels=channels)  # fmt: skip
        self.module = module
        self._decode_fn = decode if decode is not None else (lambda m, x: m(x))
        #: the context as measured, before the margin; None when the caller gave ``context``
        self.measured: tuple[int, int] | None = None
        if context is None:
            self.measured = self._measure(dict(measure_options or {}))
            context = with_margin(self.measured, margin)
        if min(context) < 0:
            raise CodecError(f"context {context} must be two non-negative frame counts")
        self._context = (int(context[0]), int(context[1]))
        self.eval()  # decoding is inference: dropout or batch-norm updates would break exactness

    def _measure(self, options: dict[str, Any]) -> tuple[int, int]:
        probe = copy.deepcopy(self.module).to(device="cpu", dtype=options.pop("dtype", torch.float64)).eval()
        dtype = next(probe.parameters(), torch.empty(0, dtype=torch.float64)).dtype
        return measure_context(lambda x: self._decode_fn(probe, x), self.latent_dim, self.hop_size,
                               dtype=dtype, **options)  # fmt: skip

    def synthesize(self, x: Tensor) -> Tensor:
        """``decode(module, x)``, checked to be ``[B, channels, T*hop]``."""
        out = self._decode_fn(self.module, x)
        want = (x.shape[0], self.channels, x.shape[-1] * self.hop_size)
        if tuple(out.shape) != want:
            raise ShapeError(
                f"the wrapped decoder returned {tuple(out.shape)} for {tuple(x.shape)}; expected {want}"
            )
        return out

    def input_interval(self, lo: int, hi: int) -> Interval:
        """Whole frames: samples ``lo..hi`` read latent frames ``lo//hop - left .. hi//hop + right``."""
        left, right = self.context_frames()
        return lo // self.hop_size - left, hi // self.hop_size + right

    def context_frames(self) -> tuple[int, int]:
        assert self._context is not None
        return self._context

    def config_dict(self) -> dict[str, Any]:
        return {"latent_dim": self.latent_dim, "hop_size": self.hop_size, "sample_rate": self.sample_rate,
                "channels": self.channels, "context": list(self.context_frames())}  # fmt: skip

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Codec:
        raise CodecError("a ModuleCodec cannot be rebuilt from a config: wrap the module again")

    def init_random(self, seed: int) -> None:
        raise CodecError("a ModuleCodec has its module's own weights; it has no random initialisation")
