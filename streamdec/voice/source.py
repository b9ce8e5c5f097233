"""Text as a latent stream: the async iterator a decoder (or a server) reads a voice's latents from.

The front half runs in a worker thread, one sentence at a time, so an event loop that serves sockets is
never blocked by it; each sentence's latents are handed on in chunks of ``chunk_frames``, the way a TTS
model emits frames. Text is checked whole (empty, too long, unknown phonemes) before the first chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np

from streamdec.voice.frontend import Voice, VoiceSettings
from streamdec.voice.phonemes import Sentence

__all__ = ["text_latents"]

DEFAULT_CHUNK_FRAMES = 8  # about 93 ms of a 22,050 Hz voice per chunk


async def text_latents(
    voice: Voice,
    text: str,
    *,
    settings: VoiceSettings | None = None,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    on_sentence: Callable[[Sentence], None] | None = None,
) -> AsyncIterator[np.ndarray]:
    """Latent chunks ``[<= chunk_frames, latent_dim]`` of ``text``, sentence by sentence.

    ``on_sentence`` is told each sentence as its synthesis starts (e.g. to print what is being said).
    Raises :class:`~streamdec.errors.TextError` subclasses before the first chunk for text that cannot
    be spoken.
    """
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames={chunk_frames}; it must be >= 1")
    prepared = await asyncio.to_thread(voice.prepare, text)
    for index, (sentence, ids) in enumerate(prepared):
        if on_sentence is not None:
            on_sentence(sentence)
        latents = await asyncio.to_thread(voice.latents, ids, settings=settings, index=index)
        for start in range(0, latents.shape[0], chunk_frames):
            yield latents[start : start + chunk_frames]
