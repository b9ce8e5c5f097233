"""The one exception tree of streamdec.

::

    StreamdecError
    ├── ConfigError            a policy, bucket set or geometry that cannot work (planning, engine, server)
    ├── CodecError             a codec that cannot be built or loaded
    │   ├── CheckpointError    a checkpoint file with missing, unexpected or mis-shaped tensors
    │   └── VoiceError         a voice's front end that cannot run (package or espeak-ng missing)
    ├── InputError             latents a caller handed in that cannot be decoded
    │   ├── ShapeError         wrong rank or latent_dim
    │   ├── DTypeError         not a floating-point array
    │   ├── NonFiniteError     NaN or Inf in a chunk (rejected unless allowed)
    │   ├── StreamEndedError   a chunk fed after the stream ended
    │   └── TextError          text a voice cannot speak (EmptyTextError, UnknownPhonemeError, TextTooLongError)
    ├── NonFiniteOutputError   finite latents the codec decoded into NaN or Inf audio (nothing is sent)
    ├── ConcurrentIterationError  two tasks iterating one ``decode_tiles`` stream
    ├── EngineError            the decode engine failed or was used after it closed
    │   ├── EngineClosedError  submit after ``aclose()``
    │   ├── CaptureFrozenError a new graph capture was needed after ``freeze()``
    │   └── TooManyStreamsError every stateful stream slot is taken (``max_streams``)
    └── ProtocolError          a wire message that breaks protocol v1; carries the wire ``code``
        └── ServerError        an ``error`` message a server sent to a client (client library)

Every message names the value, the limit and the fix. Lower-level errors are re-raised with ``from``.
The mapping from these classes to wire error codes lives in :mod:`streamdec.protocol` only.
"""

from __future__ import annotations

__all__ = [
    "CaptureFrozenError",
    "CheckpointError",
    "CodecError",
    "ConcurrentIterationError",
    "ConfigError",
    "DTypeError",
    "EmptyTextError",
    "EngineClosedError",
    "EngineError",
    "InputError",
    "NonFiniteError",
    "NonFiniteOutputError",
    "ProtocolError",
    "ServerError",
    "ShapeError",
    "StreamEndedError",
    "StreamdecError",
    "TextError",
    "TextTooLongError",
    "TooManyStreamsError",
    "UnknownPhonemeError",
    "VoiceError",
]


class StreamdecError(Exception):
    """Base of every error streamdec raises on purpose."""


class ConfigError(StreamdecError, ValueError):
    """A configuration (emission policy, buckets, limits, geometry) that cannot work."""


class CodecError(StreamdecError):
    """A codec that cannot be built or loaded."""


class CheckpointError(CodecError):
    """A checkpoint whose tensors do not match the codec: names the missing/unexpected keys and shapes."""


class VoiceError(CodecError):
    """A voice whose text front end cannot run: its package, onnxruntime or the espeak-ng program is missing."""


class InputError(StreamdecError, ValueError):
    """Latents handed in by a caller that cannot be decoded."""


class ShapeError(InputError):
    """Latents of the wrong rank or latent dimension."""


class DTypeError(InputError, TypeError):
    """Latents that are not floating point."""


class NonFiniteError(InputError):
    """Latents holding NaN or Inf."""


class StreamEndedError(InputError):
    """A chunk fed to a stream after it ended."""


class NonFiniteOutputError(StreamdecError, ValueError):
    """Decoded audio holding NaN or Inf although the latents were finite (e.g. values near the float32 limit
    that overflow inside the codec). The input is at fault, not the engine, but no single chunk is: the
    message names the window's frames; rescale the latents to the codec's range."""


class TextError(InputError):
    """Text a voice cannot speak."""


class EmptyTextError(TextError):
    """Text with nothing to say (empty, blank or punctuation only)."""


class UnknownPhonemeError(TextError):
    """A phoneme the voice's ``phoneme_id_map`` has no id for."""


class TextTooLongError(TextError):
    """Text longer than the request limit, or a sentence with more phonemes than one pass takes."""


class EngineError(StreamdecError, RuntimeError):
    """The decode engine failed."""


class EngineClosedError(EngineError):
    """A window submitted to an engine that has been closed."""


class CaptureFrozenError(EngineError):
    """A new CUDA graph capture was needed after the engine was frozen."""


class ConcurrentIterationError(StreamdecError, RuntimeError):
    """A second task iterating a stream that another task is already iterating."""


class TooManyStreamsError(EngineError):
    """A new stream found every stateful slot taken: it is refused, never queued."""


class ProtocolError(StreamdecError):
    """A wire message that breaks the protocol; ``code`` is the wire error code."""

    def __init__(self, code: str, message: str, *, stream: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.stream = stream


class ServerError(ProtocolError):
    """An ``error`` message the server sent; ``code``, ``stream`` and ``retry_after_ms`` are the message's
    own (``retry_after_ms``: how long the server asks to wait before retrying, or None)."""

    def __init__(
        self, code: str, message: str, *, stream: int | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(code, message, stream=stream)
        self.retry_after_ms = retry_after_ms
