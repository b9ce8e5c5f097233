"""A rough ear: pocketsphinx (BSD, bundled English model) transcribes speech, to check it is intelligible.

pocketsphinx scores even a voice's own offline audio at a word error rate of about 0.1-0.45, so use it
relatively (streamed against whole-clip) or with a generous bound. Needs the ``speech-test`` extra.
"""

from __future__ import annotations

import importlib
import re
from fractions import Fraction
from typing import Any

import numpy as np

from streamdec.errors import VoiceError

__all__ = ["transcribe", "word_error_rate", "words"]

_RATE = 16000  # the bundled model's sample rate


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise VoiceError(f"transcribing needs {name}: pip install 'streamdec[speech-test]'") from exc


def transcribe(audio: np.ndarray, sample_rate: int) -> str:
    """Mono float audio in [-1, 1] (any rate) -> the words pocketsphinx hears, lower case."""
    signal, pocketsphinx = _module("scipy.signal"), _module("pocketsphinx")
    ratio = Fraction(_RATE, sample_rate)
    resampled = signal.resample_poly(
        np.asarray(audio, dtype=np.float64).reshape(-1), ratio.numerator, ratio.denominator
    )
    pcm = (np.clip(resampled, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
    decoder = pocketsphinx.Decoder(samprate=_RATE)
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr.lower() if hypothesis is not None else ""


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped (apostrophes kept: ``o'clock``)."""
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's word count."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1] / max(len(ref), 1)
