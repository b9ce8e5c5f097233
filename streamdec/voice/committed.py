"""Phonemes of the demo sentences, committed so that ``make demo`` and the tests that speak them need no
``espeak-ng`` program. They are what ``espeak-ng -q --ipa -v en-us`` (1.51) gave through
:func:`streamdec.voice.phonemes.phonemize`; a test checks that they still match where the program exists.
"""

from __future__ import annotations

__all__ = ["COMMITTED_PHONEMES", "DEMO_TEXT"]

DEMO_TEXT = "I would like a cup of coffee, please. What time is it? It is nine o'clock in the morning."

#: normalised text -> its sentences as (text, phonemes)
COMMITTED_PHONEMES: dict[str, list[tuple[str, str]]] = {
    DEMO_TEXT: [
        ("I would like a cup of coffee, please.", "aɪ wʊd lˈaɪk ɐ kˈʌp ʌv kˈɔfi, plˈiːz."),
        ("What time is it?", "wˌʌt tˈaɪm ɪz ɪt?"),
        ("It is nine o'clock in the morning.", "ɪɾ ɪz nˈaɪn əklˈɑːk ɪnðə mˈɔːɹnɪŋ."),
    ],
}
