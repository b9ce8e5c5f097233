"""The front half of a Piper voice in onnxruntime: phoneme ids to the latents its decoder takes.

A Piper ``.onnx`` file maps phoneme ids to audio in one graph. streamdec cuts it where the decoder
begins: the tensor ``z * mask`` (``/Mul_7_output_0``, ``[1, 192, T]`` at ``sample_rate / 256`` frames per
second) is the latent stream that :class:`~streamdec.codecs.vits.VITSGenerator` decodes.

Noise is seeded. The graph draws two ``RandomNormalLike`` tensors (the duration predictor's
``[1, 2, ids]`` and the prior's ``[1, 192, T]``), whose generators onnxruntime seeds once per session, so
the same text would sound different on each run. Both become inputs instead, drawn with numpy from
``(seed, sentence index)``; since ``T`` is known only after the durations, the front half runs as two
sessions cut at the prior's noise::

    ids, scales, dp noise --[encoder, durations]--> m_p, logs_p, mask --+
                                                   prior noise [1,192,T] +--[flow]--> z * mask

The noise is drawn frame-major, so frame ``t`` gets the same values whatever ``T`` is.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamdec.codecs.vits import voice_files
from streamdec.errors import VoiceError
from streamdec.voice.phonemes import Sentence, phoneme_ids, phonemize

__all__ = ["LATENT", "Voice", "VoiceSettings"]

LATENT = "/Mul_7_output_0"  # z * mask: the decoder's input
_PRIOR_NOISE = "/RandomNormalLike_output_0"
_DURATION_NOISE = "/dp/RandomNormalLike_output_0"
_PRIOR_MEAN = "/Transpose_3_output_0"  # m_p [1, 192, T]: the prior noise has its shape
_INSTALL = "pip install 'streamdec[voice]'"


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise VoiceError(f"the voice front end needs {name}: {_INSTALL}") from exc


@dataclass(frozen=True)
class VoiceSettings:
    """Piper's inference scales (defaults from the voice's ``.onnx.json``) and the noise seed."""

    noise_scale: float
    length_scale: float
    noise_w: float
    seed: int = 0


def _split(model: Any, onnx: Any) -> tuple[Any, Any, list[str]]:
    """The front half as two models cut at the prior noise, and the tensors that cross the cut."""
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    tainted, flow_nodes = {_PRIOR_NOISE}, []
    for node in graph.node:  # ONNX nodes are topologically sorted: one pass finds every descendant
        if node.op_type != "RandomNormalLike" and any(i in tainted for i in node.input):
            tainted.update(node.output)
            flow_nodes.append(node)
    if LATENT not in tainted:
        raise VoiceError(
            f"the voice graph has no tensor {LATENT} downstream of {_PRIOR_NOISE}; is it a Piper voice?"
        )
    produced = {o for n in flow_nodes for o in n.output}
    cut = sorted(
        {i for n in flow_nodes for i in n.input if i and i not in produced and i not in initializers}
        - {_PRIOR_NOISE}
    )
    extractor = onnx.utils.Extractor(model)
    encoder = extractor.extract_model(
        ["input", "input_lengths", "scales", _DURATION_NOISE], [*cut, _PRIOR_MEAN]
    )
    flow = extractor.extract_model([*cut, _PRIOR_NOISE], [LATENT])
    return encoder, flow, cut


def _latent_dim(encoder: Any) -> int:
    """Channels of the prior's mean ``[1, C, T]``: the latent dimension the voice's decoder takes."""
    shape = next(o.shape for o in encoder.get_outputs() if o.name == _PRIOR_MEAN)  # also in the cut: twice
    if not isinstance(shape[1], int):
        raise VoiceError(f"the voice graph's {_PRIOR_MEAN} has no fixed channel count: {shape}")
    return shape[1]


class Voice:
    """A Piper voice's front half: text or phoneme ids in, latents ``[T, latent_dim]`` out, per sentence.

    ``Voice.load("piper-joe")`` finds an installed voice; ``Voice(model, config)`` takes the two files.
    Building the sessions takes a few seconds; calls are then thread-safe (onnxruntime sessions are).
    """

    def __init__(
        self, model: str | Path, config: str | Path, *, threads: int = 0, name: str | None = None
    ) -> None:
        onnx, ort = _import("onnx"), _import("onnxruntime")
        self.name = name or Path(model).stem
        self.config: Mapping[str, Any] = json.loads(Path(config).read_text())
        self.id_map: Mapping[str, Sequence[int]] = self.config["phoneme_id_map"]
        self.espeak_voice: str = self.config.get("espeak", {}).get("voice", "en-us")
        self.sample_rate: int = int(self.config["audio"]["sample_rate"])
        scales = self.config.get("inference", {})
        self.defaults = VoiceSettings(
            float(scales.get("noise_scale", 0.667)),
            float(scales.get("length_scale", 1.0)),
            float(scales.get("noise_w", 0.8)),
        )
        encoder, flow, self._cut = _split(onnx.load(str(model)), onnx)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        providers = ["CPUExecutionProvider"]
        self._encoder = ort.InferenceSession(encoder.SerializeToString(), options, providers=providers)
        self._flow = ort.InferenceSession(flow.SerializeToString(), options, providers=providers)
        self.latent_dim = _latent_dim(self._encoder)

    @classmethod
    def load(cls, name: str = "piper-joe", *, threads: int = 0) -> Voice:
        """A named voice (``piper-joe``) or a Piper ``.onnx`` file with its ``.onnx.json`` beside it."""
        if name.endswith(".onnx"):
            model, config = Path(name), Path(name + ".json")
        else:
            model, config = voice_files(name)
        return cls(model, config, threads=threads, name=name)

    def sentences(self, text: str) -> list[Sentence]:
        """The sentences of ``text`` with their phonemes (:func:`streamdec.voice.phonemes.phonemize`)."""
        return phonemize(text, self.espeak_voice)

    def ids(self, phonemes: str) -> list[int]:
        return phoneme_ids(phonemes, self.id_map)

    def latents(
        self, ids: Sequence[int], *, settings: VoiceSettings | None = None, index: int = 0
    ) -> np.ndarray:
        """Phoneme ids of one sentence -> float32 latents ``[T, latent_dim]`` (noise from ``(seed, index)``)."""
        s = settings or self.defaults
        rng = np.random.default_rng([s.seed, index])
        n = len(ids)
        feeds = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([n], dtype=np.int64),
            "scales": np.asarray([s.noise_scale, s.length_scale, s.noise_w], dtype=np.float32),
            _DURATION_NOISE: rng.standard_normal((n, 2), dtype=np.float32).T[None].copy(),
        }
        *crossing, prior_mean = self._encoder.run(None, feeds)
        frames = int(prior_mean.shape[-1])
        noise = rng.standard_normal((frames, prior_mean.shape[1]), dtype=np.float32).T[None].copy()
        (z,) = self._flow.run(None, {**dict(zip(self._cut, crossing, strict=True)), _PRIOR_NOISE: noise})
        return np.ascontiguousarray(z[0].T)

    def prepare(self, text: str) -> list[tuple[Sentence, list[int]]]:
        """Every sentence of ``text`` with its phoneme ids, all checked, so bad text fails before any audio."""
        return [(s, self.ids(s.phonemes)) for s in self.sentences(text)]

    def speak(
        self, text: str, *, settings: VoiceSettings | None = None
    ) -> Iterator[tuple[Sentence, np.ndarray]]:
        """Each sentence of ``text`` with its latents ``[T, latent_dim]``, as the front half produces them."""
        for index, (sentence, ids) in enumerate(self.prepare(text)):
            yield sentence, self.latents(ids, settings=settings, index=index)
