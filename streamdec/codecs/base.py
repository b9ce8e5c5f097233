"""The base class every decoder family shares: input validation, normalisation, exact context.

A family subclasses :class:`Codec`, sets ``family``, implements :meth:`Codec.synthesize` (denormalised
latents ``[B, latent_dim, T]`` to audio ``[B, channels, T * hop_size]``), :meth:`Codec.input_interval`
(the geometry of ``synthesize``: output sample indices to latent frame indices), ``config_dict`` /
``from_config`` (the JSON stored in checkpoints) and ``init_random`` (its seeded random weights). A family
built from streamdec's layers and one config dataclass subclasses :class:`ConfiguredCodec` instead, which
supplies ``config_dict``, ``from_config`` and ``refresh_cache``.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import torch
from torch import Tensor, nn

from streamdec.codecs.config import JSONConfig
from streamdec.codecs.geometry import Interval, frame_context
from streamdec.codecs.layers import (
    all_convs_on_triton_split,
    any_conv_may_take_triton,
    refresh_caches,
    set_split_convs,
)
from streamdec.codecs.precision import AUTO_PREFERENCE, Precision, check_precision
from streamdec.errors import ConfigError, DTypeError, ShapeError

__all__ = ["Codec", "ConfiguredCodec"]

_F = TypeVar("_F", bound="ConfiguredCodec")


class Codec(nn.Module, abc.ABC):
    """A latent-to-audio decoder with a known hop, rate and exact latent context.

    Contract of :meth:`decode`: ``latents`` is ``[B, T, latent_dim]`` of any floating dtype (a tensor or
    a numpy array), ``T >= 1``; the result is ``[B, channels, T * hop_size]`` float32 on the codec's
    device, computed under ``torch.inference_mode()``.

    Normalisation: latents arrive normalised; ``denormalize(z) = z * sqrt(global_log_std) + global_mean``
    (per latent channel). Families without normalisation keep ``global_mean = 0``,
    ``global_log_std = 1``.
    """

    family: ClassVar[str]
    global_mean: Tensor
    global_log_std: Tensor

    def __init__(self, *, name: str, latent_dim: int, hop_size: int, sample_rate: int, channels: int) -> None:
        super().__init__()
        self.name = name
        self.latent_dim = latent_dim
        self.hop_size = hop_size
        self.sample_rate = sample_rate
        self.channels = channels
        self.register_buffer("global_mean", torch.zeros(latent_dim))
        self.register_buffer("global_log_std", torch.ones(latent_dim))
        self._context: tuple[int, int] | None = None
        self._precision: Precision = "fp32"

    # -- what a family implements -------------------------------------------------------------------

    @abc.abstractmethod
    def synthesize(self, x: Tensor) -> Tensor:
        """Denormalised latents ``[B, latent_dim, T]`` -> audio ``[B, channels, T * hop_size]``."""

    @abc.abstractmethod
    def input_interval(self, lo: int, hi: int) -> Interval:
        """Latent frames (inclusive) that can influence output samples ``lo..hi`` of :meth:`synthesize`."""

    @abc.abstractmethod
    def config_dict(self) -> dict[str, Any]:
        """JSON-serialisable architecture description; ``from_config`` rebuilds the same shapes."""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Codec:
        """Build the architecture (weights uninitialised; may be on the meta device)."""

    @abc.abstractmethod
    def init_random(self, seed: int) -> None:
        """Fill every parameter and normalisation buffer from ``torch.Generator().manual_seed(seed)``."""

    def refresh_cache(self) -> None:
        """Rebuild derived, non-persistent buffers; loaders call this after weights or dtype change."""

    # -- shared behaviour -----------------------------------------------------------------------------

    def context_frames(self) -> tuple[int, int]:
        """``(left, right)``: output frame ``g`` depends exactly on latent frames ``g-left .. g+right``."""
        if self._context is None:
            self._context = frame_context(self, self.hop_size)
        return self._context

    @property
    def pad_latent(self) -> Tensor:
        """``[latent_dim]`` normalised latent that denormalises to raw zero."""
        return -self.global_mean / torch.sqrt(self.global_log_std)

    def denormalize(self, z: Tensor) -> Tensor:
        """``z * sqrt(global_log_std) + global_mean`` over the last (latent) dimension."""
        return z * torch.sqrt(self.global_log_std) + self.global_mean

    @property
    def precision(self) -> Precision:
        """How convolutions use a GPU's matrix units: ``"fp32"`` (default), ``"tf32x3"``, ``"fp16x3"``,
        ``"fp16"`` or ``"tf32"``.

        ``"tf32x3"`` runs split operands on TF32 tensor cores. Where Triton is installed it goes through
        this package's split convolution and is float32-accurate and faster than ``"fp32"``; without
        Triton, through cuDNN, it loses accuracy. Its split weights take twice the conv weights' memory
        (three times through cuDNN). ``"fp16x3"`` splits into float16 halves under power-of-two scales and
        runs this package's float16 kernel where the GPU has TMA (an H100 or H200; other layers and GPUs
        take the ``"tf32x3"`` path), faster again; its split weights take as much memory as the conv
        weights. ``"fp16"`` (opt-in, never chosen by ``auto``) multiplies the float16 heads only, once
        instead of three times: faster, at about 11 bits of each operand. ``"tf32"`` moves the output by
        about 1e-3 (:mod:`streamdec.codecs.precision`). Accuracy and speed of each mode:
        ``docs/precision.md`` and ``docs/performance.md``.
        Setting it takes effect at the next eager call or compile; captured graphs keep what they captured.
        """
        return self._precision

    @precision.setter
    def precision(self, value: Precision) -> None:
        checked = check_precision(value)
        split, f16 = checked in ("tf32x3", "fp16x3", "fp16"), checked in ("fp16x3", "fp16")
        set_split_convs(self, split, f16=f16, products=1 if checked == "fp16" else 3)
        self._precision = checked

    def use_auto_precision(self) -> Precision:
        """Set, and return, the fastest precision that keeps float32 accuracy here.

        ``"fp16x3"`` where every convolution then runs through the float16 split kernel (CUDA with TMA,
        float32 weights, Triton installed, no convolution the kernel cannot take); else ``"tf32x3"`` where
        every one runs through the TF32 split kernel; both are faster and more accurate than ``"fp32"``.
        ``"fp32"`` otherwise, including wherever some layer would fall back to the cuDNN split (less
        accurate; ``docs/precision.md``). ``streamdec serve --precision auto`` calls this.
        """
        if not any_conv_may_take_triton(self):  # a CPU, or no Triton: trying each split would split
            self.precision = "fp32"  # every weight twice (about a second for auk-24k) to land here
            return "fp32"
        for choice in AUTO_PREFERENCE:
            try:
                self.precision = choice
            except ConfigError:  # a convolution the split cannot take: nothing was changed
                break
            if all_convs_on_triton_split(self, f16=choice == "fp16x3"):
                return choice
        self.precision = "fp32"
        return "fp32"

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """Apply this codec's :attr:`precision` to cuDNN and cuBLAS, then restore.

        The flags are process-wide in PyTorch: every decode of this codec (eager calls, graph captures,
        compiles) runs inside this context so that all of them compute the same function.
        """
        if self.global_mean.device.type != "cuda":
            yield  # TF32 exists only on CUDA: leave the process-wide flags alone
            return
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        saved = cudnn.allow_tf32, matmul.allow_tf32
        # tf32x3 needs TF32 convolutions (its operands are split to be exact in TF32); matmuls stay fp32
        cudnn.allow_tf32 = self._precision != "fp32"
        matmul.allow_tf32 = self._precision == "tf32"
        try:
            yield
        finally:
            cudnn.allow_tf32, matmul.allow_tf32 = saved

    @torch.inference_mode()
    def decode(self, latents: Tensor | np.ndarray[Any, Any]) -> Tensor:
        """Normalised latents ``[B, T, latent_dim]`` -> float32 audio ``[B, channels, T * hop_size]``."""
        z = self._checked(latents)
        param = self.global_mean
        z = z.to(device=param.device, dtype=param.dtype)
        with self.numerics():
            audio = self.synthesize(self.denormalize(z).transpose(1, 2))
        return audio.float()

    def _checked(self, latents: Tensor | np.ndarray[Any, Any]) -> Tensor:
        z = torch.as_tensor(latents) if isinstance(latents, np.ndarray) else latents
        if not isinstance(z, Tensor):
            raise DTypeError(
                f"latents of type {type(latents).__name__} cannot be decoded; pass a floating torch tensor "
                f"or numpy array shaped [batch, frames, {self.latent_dim}]"
            )
        if not z.is_floating_point():
            raise DTypeError(
                f"latents have dtype {z.dtype}, but decode needs a floating dtype; convert with .float()"
            )
        if z.dim() != 3:
            raise ShapeError(
                f"latents have rank {z.dim()} (shape {tuple(z.shape)}), but decode needs rank 3 "
                f"[batch, frames, {self.latent_dim}]; add a batch axis with latents[None]"
            )
        if z.shape[-1] != self.latent_dim:
            raise ShapeError(
                f"latents have latent_dim {z.shape[-1]} (shape {tuple(z.shape)}), but codec {self.name!r} "
                f"needs {self.latent_dim}; pass [batch, frames, {self.latent_dim}]"
            )
        if z.shape[1] < 1 or z.shape[0] < 1:
            raise ShapeError(
                f"latents have shape {tuple(z.shape)}; decode needs at least 1 batch item and 1 frame"
            )
        return z


class ConfiguredCodec(Codec):
    """A family built from streamdec's layers whose whole architecture is one ``config_class`` instance.

    Subclasses set ``config_class``, take ``(name, config)`` in ``__init__`` and pass them on with the
    config's latent width, sample rate and audio channels (the hop is the config's ``hop_size``); the
    config is kept in ``self.config`` (annotated there with its own class). Then ``config_dict`` is
    ``config.to_dict()``, ``from_config`` is ``cls(name, config_class.from_dict(config))`` (unknown keys
    are an error) and ``refresh_cache`` rebuilds every cached layer
    (:func:`~streamdec.codecs.layers.refresh_caches`).
    """

    config_class: ClassVar[type[JSONConfig]]
    config: JSONConfig

    def __init__(
        self, name: str, config: JSONConfig, *, latent_dim: int, sample_rate: int, channels: int = 1
    ) -> None:
        super().__init__(
            name=name,
            latent_dim=latent_dim,
            hop_size=config.hop_size,
            sample_rate=sample_rate,
            channels=channels,
        )
        self.config = config

    def refresh_cache(self) -> None:
        refresh_caches(self)

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    @classmethod
    def from_config(cls: type[_F], name: str, config: Mapping[str, Any]) -> _F:
        build = cast(Callable[[str, JSONConfig], _F], cls)
        return build(name, cls.config_class.from_dict(config))
