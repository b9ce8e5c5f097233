"""Text in: the server's voice speaks a ``start``'s text into that stream's latent intake.

The voice's front half runs in a worker thread, sentence by sentence (:func:`streamdec.voice.text_latents`),
so the event loop keeps serving sockets. Its chunks go to ``feed``, which waits while the stream holds
``max_buffered_frames`` frames the decoder has not taken, so a long text is made no faster than it is
heard, and which raises once the stream has ended (cancelled, failed, connection gone): the voice then
stops after the sentence in progress.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import torch

from streamdec.errors import StreamdecError

if TYPE_CHECKING:
    from streamdec.voice import Voice

__all__ = ["speak"]


async def speak(
    voice: Voice, text: str, feed: Callable[[torch.Tensor], Awaitable[None]], chunk_frames: int
) -> BaseException | None:
    """Feed ``text``'s latent chunks ``[<= chunk_frames, latent_dim]`` to ``feed``.

    Returns the error that should end the stream: a :class:`~streamdec.errors.TextError` (wire code
    ``bad_text``) for text the voice cannot speak, raised before the first chunk, or another
    :class:`~streamdec.errors.StreamdecError` (e.g. ``espeak-ng`` missing on the server: ``internal``);
    None once every chunk was fed, or when the stream ended first.
    """
    from streamdec.voice import text_latents

    try:
        async for chunk in text_latents(voice, text, chunk_frames=chunk_frames):
            await feed(torch.from_numpy(chunk))
    except StreamdecError as exc:
        return exc
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return None  # the stream ended first; its done says how
    return None
