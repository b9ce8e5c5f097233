"""Text to phoneme ids, the way Piper voices were trained: espeak-ng IPA, clause punctuation, pads.

Text is cut into clauses at punctuation followed by a space (``"Hello, world. Bye!"`` gives ``Hello`` +
``,``, ``world`` + ``.``, ``Bye`` + ``!``); each clause goes to the ``espeak-ng`` *program*
(``espeak-ng -q --ipa -v VOICE``, text on stdin: nothing is linked and no option can be injected), its
punctuation is appended, and ``. ! ?`` end a sentence. One sentence is one pass of the voice's front half.
Phoneme strings are NFD-decomposed (``ç`` is ``c`` + U+0327) and mapped through the voice's
``phoneme_id_map``: ``^ _ p1 _ p2 _ ... pn _ $`` (BOS, a pad after every phoneme, EOS).

Where the program is missing, text whose phonemes are committed in :mod:`streamdec.voice.committed` (the
demo sentences) still works; other text raises :class:`~streamdec.errors.VoiceError` naming the Debian
package to install.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from streamdec.errors import EmptyTextError, TextTooLongError, UnknownPhonemeError, VoiceError
from streamdec.voice.committed import COMMITTED_PHONEMES

__all__ = [
    "MAX_SENTENCE_PHONEMES",
    "MAX_TEXT_CHARS",
    "Sentence",
    "espeak_available",
    "normalise_text",
    "phoneme_ids",
    "phonemize",
]

MAX_TEXT_CHARS = 2000  # one request's text; longer input is refused, not truncated
MAX_SENTENCE_PHONEMES = 400  # one pass of the front half (about 30 s of speech at most)
ESPEAK = "espeak-ng"
_INSTALL = "apt-get install espeak-ng (Debian/Ubuntu), or brew install espeak-ng"
_SENTENCE_END = ".!?"
# a clause: text up to punctuation that a space or the end follows (so 5.50 and e.g. "a,b" stay whole)
_CLAUSE = re.compile(r"(.*?)([.!?,;:]+)(?=\s|$)|(.+?)$", re.DOTALL)
_LANGUAGE_FLAG = re.compile(r"\([a-z-]+\)")  # espeak-ng marks a switch of language as "(fr)"


@dataclass(frozen=True)
class Sentence:
    """One sentence: the text it came from and its phoneme string (punctuation included)."""

    text: str
    phonemes: str


def normalise_text(text: str) -> str:
    """Whitespace collapsed and stripped: the key of :data:`COMMITTED_PHONEMES`."""
    return " ".join(text.split())


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def _check_text(text: str) -> str:
    clean = normalise_text(text)
    if len(clean) > MAX_TEXT_CHARS:
        raise TextTooLongError(
            f"text has {len(clean)} characters; the limit is {MAX_TEXT_CHARS} per request: "
            f"send it in several requests (e.g. a paragraph each)"
        )
    if not any(ch.isalnum() for ch in clean):
        raise EmptyTextError(
            f"text {text[:40]!r} has nothing to say (no letters or digits); pass words to speak"
        )
    return clean


def _espeak(clause: str, voice: str) -> str:
    try:
        done = subprocess.run(
            [ESPEAK, "-q", "--ipa", "-v", voice],
            input=clause,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except FileNotFoundError as exc:
        raise VoiceError(
            f"phonemes for new text need the {ESPEAK} program, which is not installed: {_INSTALL}"
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise VoiceError(
            f"{ESPEAK} -v {voice} failed ({exc.returncode}): {exc.stderr.strip()[:200]}"
        ) from exc
    lines = [_LANGUAGE_FLAG.sub("", line).strip() for line in done.stdout.splitlines()]
    return " ".join(line for line in lines if line)


def _clauses(text: str) -> list[tuple[str, str]]:
    """``(clause text, punctuation)`` pairs; the punctuation is one character or empty."""
    out = []
    for match in _CLAUSE.finditer(text):
        body = (match.group(1) if match.group(3) is None else match.group(3)).strip()
        marks = match.group(2) or ""
        if body or marks:
            out.append((body, marks[-1:] if marks else ""))
    return out


def phonemize(text: str, voice: str = "en-us") -> list[Sentence]:
    """Sentences of ``text`` with their phoneme strings (module docstring).

    Raises :class:`EmptyTextError` for text without letters or digits, :class:`TextTooLongError` above
    :data:`MAX_TEXT_CHARS` and :class:`VoiceError` where ``espeak-ng`` is missing and the text is not one
    whose phonemes are committed.
    """
    clean = _check_text(text)
    committed = COMMITTED_PHONEMES.get(clean)
    if committed is not None and not espeak_available():
        return [Sentence(t, p) for t, p in committed]
    if not espeak_available():
        raise VoiceError(
            f"phonemes for new text need the {ESPEAK} program, which is not installed: {_INSTALL}; "
            f"without it only the demo sentences can be spoken"
        )
    sentences: list[Sentence] = []
    words: list[str] = []
    phones: list[str] = []
    for body, mark in _clauses(clean):
        said = _espeak(body, voice) if any(ch.isalnum() for ch in body) else ""
        if said or phones:
            phones.append(said + mark)
        words.append(body + mark)
        if mark in _SENTENCE_END and phones:
            sentences.append(Sentence(" ".join(words), " ".join(phones)))
            words, phones = [], []
    if phones:
        sentences.append(Sentence(" ".join(words), " ".join(phones)))
    if not sentences:
        raise EmptyTextError(f"text {text[:40]!r} gave no phonemes; pass words to speak")
    return sentences


def phoneme_ids(phonemes: str, id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """``^ _ p1 _ ... pn _ $`` as ids; raises :class:`UnknownPhonemeError` or :class:`TextTooLongError`."""
    chars = list(unicodedata.normalize("NFD", phonemes))
    if len(chars) > MAX_SENTENCE_PHONEMES:
        raise TextTooLongError(
            f"a sentence has {len(chars)} phonemes; one pass takes at most {MAX_SENTENCE_PHONEMES}: "
            f"split it with a full stop ({phonemes[:40]!r}...)"
        )
    unknown = sorted({c for c in chars if c not in id_map})
    if unknown:
        listed = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown)
        raise UnknownPhonemeError(
            f"phonemes {listed} in {phonemes[:60]!r} are not in the voice's phoneme_id_map "
            f"({len(id_map)} symbols); rephrase the text or use a voice of its language"
        )
    pad = list(id_map["_"])
    ids = [*id_map["^"], *pad]
    for c in chars:
        ids += [*id_map[c], *pad]
    return [*ids, *id_map["$"]]
