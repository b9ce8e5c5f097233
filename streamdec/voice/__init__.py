"""Text in: a Piper voice's front half makes the latents its decoder (codec family ``vits``) turns into audio.

``Voice.load("piper-joe")`` (the ``voice`` extra) gives phonemes (the ``espeak-ng`` program), phoneme ids
and seeded latents per sentence; :func:`text_latents` streams them as chunks for
:class:`~streamdec.StreamDecoder`; ``streamdec say`` speaks text into a WAV file.
"""

from __future__ import annotations

from streamdec.voice.committed import DEMO_TEXT
from streamdec.voice.frontend import Voice, VoiceSettings
from streamdec.voice.phonemes import Sentence, phonemize
from streamdec.voice.source import text_latents

__all__ = ["DEMO_TEXT", "Sentence", "Voice", "VoiceSettings", "phonemize", "text_latents"]
