"""Wire protocol v1 (minor version 1), sans-I/O: bytes and text in, validated messages out, and back.

Nothing here touches a socket or an event loop. The server feeds each received WebSocket message to
:class:`ServerState` and sends what it returns; the client library uses the same typed messages, the
encoders and the parsers at the bottom. Every control message, in either direction, is a frozen dataclass
with ``to_json()``; :func:`encode_text` makes its text frame, :func:`parse_client_text` and
:func:`parse_server_text` parse one back, so neither side writes JSON or a version number by hand. ``PROTOCOL.md`` at the repository root is the normative description; this module implements it.

Binary messages (all integers little-endian)::

    latent, client -> server   "<4sIII"  b"SDLT" stream seq n_frames            + n_frames*latent_dim values
    audio,  server -> client   "<4sIIQI" b"SDAU" stream seq start_sample n_samples + n_samples*channels values

Text messages are JSON objects with a ``type``. The one mapping from :mod:`streamdec.errors` classes to
wire error codes and close codes lives here (:func:`error_code_for`, :data:`CLOSE_CODES`).
"""

from __future__ import annotations

import enum
import json
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from streamdec.errors import (
    ConfigError,
    DTypeError,
    InputError,
    NonFiniteError,
    NonFiniteOutputError,
    ProtocolError,
    ServerError,
    ShapeError,
    StreamEndedError,
    TextError,
    TooManyStreamsError,
)
from streamdec.io import pcm16
from streamdec.session import all_finite, first_non_finite_row

__all__ = [
    "AUDIO_FORMATS",
    "AUDIO_HEADER",
    "AUDIO_MAGIC",
    "CLOSE_CODES",
    "LATENT_DTYPES",
    "LATENT_HEADER",
    "LATENT_MAGIC",
    "MAX_STREAM_ID",
    "OPUS_FORMAT",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "SAMPLE_FORMATS",
    "STREAM_ENDING_CODES",
    "STREAM_PATH",
    "AudioMessage",
    "Cancel",
    "ClientControl",
    "CloseCode",
    "CodecInfo",
    "Done",
    "DoneStatus",
    "End",
    "ErrorCode",
    "ErrorMessage",
    "LatentMessage",
    "Limits",
    "OpusInfo",
    "Ready",
    "ServerControl",
    "ServerState",
    "Start",
    "Started",
    "decode_audio_samples",
    "encode_audio",
    "encode_latents",
    "encode_text",
    "error_code_for",
    "error_message",
    "parse_audio",
    "parse_client_text",
    "parse_server_text",
]

PROTOCOL_VERSION = 1
#: Minor versions only add fields and codes that a v1.0 peer ignores. 1: a ``start`` may carry ``text``
#: (``ready.voice`` says whether the server speaks it), codes ``no_voice`` and ``bad_text``. 2: ``ready.opus``
#: (the wire rate and bit rate of ``format: "opus"``, or null where the server cannot send it).
PROTOCOL_MINOR = 2
STREAM_PATH = "/v1/stream"
LATENT_MAGIC = b"SDLT"
AUDIO_MAGIC = b"SDAU"
LATENT_HEADER = struct.Struct("<4sIII")  # magic, stream, seq, n_frames
AUDIO_HEADER = struct.Struct("<4sIIQI")  # magic, stream, seq, start_sample, n_samples
# bound once: every message of every stream packs or unpacks one
_LATENT_HEADER_SIZE = LATENT_HEADER.size
_unpack_latent_header = LATENT_HEADER.unpack_from
_pack_audio_header = AUDIO_HEADER.pack
MAX_STREAM_ID = 2**32 - 1

#: latent dtype name -> torch dtype; every one is 2 or 4 bytes, little-endian on the wire
LATENT_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
#: the latent dtypes numpy has, as wire (little-endian) numpy dtypes
_NUMPY_LATENT_DTYPES: Mapping[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
#: latent dtype name -> bytes per value
_LATENT_ITEMSIZE: Mapping[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
#: sample format name -> bytes per sample
SAMPLE_FORMATS: Mapping[str, int] = {"pcm_s16le": 2, "pcm_f32le": 4}
#: compressed audio: an Ogg Opus stream (RFC 7845) cut into the stream's audio messages; opt-in
OPUS_FORMAT = "opus"
#: every ``format`` a ``start`` may ask for (``None``: no fixed sample width)
AUDIO_FORMATS: Mapping[str, int | None] = {**SAMPLE_FORMATS, OPUS_FORMAT: None}
DEFAULT_DTYPE = "float32"
DEFAULT_FORMAT = "pcm_s16le"


class ErrorCode(str, enum.Enum):
    """The ``code`` of a server ``error`` message."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_STREAM = "unknown_stream"
    DUPLICATE_STREAM = "duplicate_stream"
    TOO_MANY_STREAMS = "too_many_streams"
    BAD_PAYLOAD = "bad_payload"
    OUT_OF_ORDER = "out_of_order"
    NON_FINITE = "non_finite"
    TOO_LARGE = "too_large"
    NON_FINITE_OUTPUT = "non_finite_output"
    BACKLOG_FULL = "backlog_full"
    OVER_CAPACITY = "over_capacity"
    OVERLOADED = "overloaded"
    SHUTTING_DOWN = "shutting_down"
    IDLE_TIMEOUT = "idle_timeout"
    TOO_MANY_ERRORS = "too_many_errors"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN_ORIGIN = "forbidden_origin"
    NO_VOICE = "no_voice"  # a start carrying text on a server without a voice
    BAD_TEXT = "bad_text"  # text the voice cannot speak: empty, too long, unknown phonemes
    INTERNAL = "internal"


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses."""

    NORMAL = 1000  # also an idle connection closed after ``idle_timeout`` (after an ``idle_timeout`` error)
    GOING_AWAY = 1001  # server shutdown, after in-flight streams finished (or the grace period ran out)
    POLICY_VIOLATION = 1008  # the connection spent its error budget (after a ``too_many_errors`` error)
    MESSAGE_TOO_BIG = 1009  # a message over ``max_message_bytes``; sent by the websocket layer itself
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # overloaded: too many connections, or a listener stalled past the bound


#: codes whose error ends the named stream: the server follows the error with ``done`` status ``error``.
#: Every other code reports a message that could not be attributed to a running stream and ends nothing.
STREAM_ENDING_CODES = frozenset(
    {
        ErrorCode.BAD_PAYLOAD,
        ErrorCode.OUT_OF_ORDER,
        ErrorCode.NON_FINITE,
        ErrorCode.TOO_LARGE,
        ErrorCode.NON_FINITE_OUTPUT,
        ErrorCode.BACKLOG_FULL,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.BAD_TEXT,
        ErrorCode.INTERNAL,
    }
)

#: codes that, raised for the connection as a whole (``stream`` null), close it with this close code
CLOSE_CODES: Mapping[ErrorCode, CloseCode] = {
    ErrorCode.OVERLOADED: CloseCode.TRY_AGAIN_LATER,
    ErrorCode.IDLE_TIMEOUT: CloseCode.NORMAL,
    ErrorCode.TOO_MANY_ERRORS: CloseCode.POLICY_VIOLATION,
    ErrorCode.INTERNAL: CloseCode.INTERNAL_ERROR,
}

# The one mapping from the exception tree to wire codes; most specific class first.
_ERROR_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (NonFiniteOutputError, ErrorCode.NON_FINITE_OUTPUT),
    (NonFiniteError, ErrorCode.NON_FINITE),
    (ShapeError, ErrorCode.BAD_PAYLOAD),
    (DTypeError, ErrorCode.BAD_PAYLOAD),
    (StreamEndedError, ErrorCode.UNKNOWN_STREAM),
    (TextError, ErrorCode.BAD_TEXT),
    (InputError, ErrorCode.BAD_PAYLOAD),
    (TooManyStreamsError, ErrorCode.TOO_MANY_STREAMS),  # every stateful slot taken: refused, not queued
)


def error_code_for(exc: BaseException) -> ErrorCode:
    """The wire code for ``exc``: a ProtocolError's own code, input errors by kind, anything else internal."""
    if isinstance(exc, ProtocolError):
        return ErrorCode(exc.code)
    for cls, code in _ERROR_CODES:
        if isinstance(exc, cls):
            return code
    return ErrorCode.INTERNAL


def _fail(code: ErrorCode, message: str, stream: int | None = None) -> ProtocolError:
    return ProtocolError(code.value, message, stream=stream)


# --------------------------------------------------------------------------------------------------
# Static descriptions sent in ``ready``


@dataclass(frozen=True)
class CodecInfo:
    """What a client needs to know about the codec behind the server."""

    name: str
    latent_dim: int
    hop_size: int
    sample_rate: int
    channels: int
    context: tuple[int, int]  # (left, right) latent frames of receptive field

    @classmethod
    def from_codec(cls, codec: Any) -> CodecInfo:
        """Read the description off a loaded codec (``streamdec.load_codec``)."""
        left, right = codec.context_frames()
        return cls(
            name=str(codec.name),
            latent_dim=int(codec.latent_dim),
            hop_size=int(codec.hop_size),
            sample_rate=int(codec.sample_rate),
            channels=int(codec.channels),
            context=(int(left), int(right)),
        )

    @classmethod
    def from_json(cls, obj: Any) -> CodecInfo:
        """Parse ``ready.codec``; raises ProtocolError ``bad_message`` on a missing or mistyped field."""
        fields = _object(obj, "ready.codec")
        context = fields.get("context")
        if not (isinstance(context, list) and len(context) == 2 and all(_is_count(v) for v in context)):
            raise _fail(
                ErrorCode.BAD_MESSAGE, f"ready.codec.context must be [left, right], got {context!r:.80}"
            )
        return cls(
            name=_field(fields, "name", str, "ready.codec"),
            latent_dim=_count(fields, "latent_dim", "ready.codec"),
            hop_size=_count(fields, "hop_size", "ready.codec"),
            sample_rate=_count(fields, "sample_rate", "ready.codec"),
            channels=_count(fields, "channels", "ready.codec"),
            context=(int(context[0]), int(context[1])),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "latent_dim": self.latent_dim,
            "hop_size": self.hop_size,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "context": list(self.context),
        }


@dataclass(frozen=True)
class Limits:
    """Per-connection limits, advertised in ``ready`` and enforced by :class:`ServerState`.

    ``max_message_bytes`` bounds every received message (the websocket layer closes with 1009 above it);
    it must leave room for a full float32 latent message of ``max_frames_per_message`` frames.
    ``max_buffered_frames`` bounds the latent frames a stream may have received but not yet handed to the
    decoder: a producer faster than decoding waits for audio before sending more (the reference client
    does), and a message that would pass the bound ends the stream with ``backlog_full``.
    """

    max_streams: int = 8
    max_frames_per_message: int = 512
    max_message_bytes: int = 0  # 0: the smallest size that fits a full float32 message, at least 64 KiB
    max_buffered_frames: int = 4096

    def resolved(self, latent_dim: int) -> Limits:
        """These limits with ``max_message_bytes`` filled in for ``latent_dim``; raises ConfigError if unusable."""
        if self.max_streams < 1 or self.max_frames_per_message < 1:
            raise ConfigError(
                f"max_streams={self.max_streams} and max_frames_per_message={self.max_frames_per_message} "
                "must both be >= 1"
            )
        if self.max_buffered_frames < 2 * self.max_frames_per_message:
            raise ConfigError(
                f"max_buffered_frames={self.max_buffered_frames} must be at least twice "
                f"max_frames_per_message={self.max_frames_per_message}, so that a paced producer always has "
                "a message in flight; raise it or lower max_frames_per_message"
            )
        needed = LATENT_HEADER.size + self.max_frames_per_message * latent_dim * 4
        size = self.max_message_bytes or max(needed, 64 * 1024)
        if size < needed:
            raise ConfigError(
                f"max_message_bytes={size} cannot hold a float32 message of max_frames_per_message="
                f"{self.max_frames_per_message} frames x latent_dim={latent_dim} ({needed} bytes); "
                "raise max_message_bytes or lower max_frames_per_message"
            )
        return Limits(self.max_streams, self.max_frames_per_message, size, self.max_buffered_frames)

    @classmethod
    def from_json(cls, obj: Any) -> Limits:
        """Parse ``ready.limits``; a field an older server does not send keeps its default."""
        fields = _object(obj, "ready.limits")
        known = {k: _count(fields, k, "ready.limits") for k in _LIMIT_KEYS if k in fields}
        return cls(**known)

    def to_json(self) -> dict[str, int]:
        return {key: int(getattr(self, key)) for key in _LIMIT_KEYS}


_LIMIT_KEYS = ("max_streams", "max_frames_per_message", "max_message_bytes", "max_buffered_frames")


@dataclass(frozen=True)
class OpusInfo:
    """``ready.opus`` (minor version 2): what ``format: "opus"`` sends on this server.

    ``sample_rate`` is the wire rate, the rate the Ogg Opus stream was encoded at (a codec at a rate Opus
    does not take is resampled to it); ``bitrate`` is the encoder's constant bit rate in bits per second.
    """

    sample_rate: int
    bitrate: int

    @classmethod
    def from_json(cls, obj: Any) -> OpusInfo:
        fields = _object(obj, "ready.opus")
        return cls(_count(fields, "sample_rate", "ready.opus"), _count(fields, "bitrate", "ready.opus"))

    def to_json(self) -> dict[str, int]:
        return {"sample_rate": self.sample_rate, "bitrate": self.bitrate}


# --------------------------------------------------------------------------------------------------
# Client -> server messages


@dataclass(frozen=True)
class Start:
    """``start``: open ``stream`` with latents in ``dtype`` and audio in ``format``.

    With ``text`` (minor version 1) the server's voice speaks it: the server makes the stream's latents,
    the client sends none (nor ``end``) and reads the audio.
    """

    stream: int
    dtype: str = DEFAULT_DTYPE
    format: str = DEFAULT_FORMAT
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        obj = {"type": "start", "stream": self.stream, "dtype": self.dtype, "format": self.format}
        return obj if self.text is None else {**obj, "text": self.text}


@dataclass(frozen=True)
class End:
    """``end``: no more latents for ``stream``."""

    stream: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "end", "stream": self.stream}


@dataclass(frozen=True)
class Cancel:
    """``cancel``: stop ``stream`` now."""

    stream: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "cancel", "stream": self.stream}


ClientControl = Start | End | Cancel


@dataclass(frozen=True, eq=False)
class LatentMessage:
    """One validated latent message; ``latents`` is ``[n_frames, latent_dim]`` in the stream's dtype, in
    memory of its own: a numpy array (float32, float16), or a tensor where numpy lacks the dtype
    (bfloat16). Sessions buffer numpy, so the usual dtypes reach them without a conversion."""

    stream: int
    seq: int
    latents: np.ndarray | torch.Tensor


# --------------------------------------------------------------------------------------------------
# Payload conversion


def _from_le_bytes(payload: bytes | bytearray | memoryview, dtype: torch.dtype) -> torch.Tensor:
    # bytearray: torch.frombuffer warns on read-only buffers, and the copy gives the tensor its own memory.
    buf = bytearray(payload)
    if sys.byteorder == "big":  # pragma: no cover - no big-endian CI
        itemsize = torch.empty((), dtype=dtype).element_size()
        np.frombuffer(buf, dtype=f"u{itemsize}").byteswap(inplace=True)
    return torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)


def _latents_from_payload(
    payload: memoryview, dtype: str, n_frames: int, dim: int
) -> np.ndarray | torch.Tensor:
    """``[n_frames, dim]`` in ``dtype``, in memory of its own; numpy where numpy has the dtype: a handful
    of numpy calls cost a few microseconds, each torch call on a tiny tensor about as much."""
    np_dtype = _NUMPY_LATENT_DTYPES.get(dtype)
    if np_dtype is None:  # bfloat16
        return _from_le_bytes(payload, LATENT_DTYPES[dtype]).view(n_frames, dim)
    array = np.frombuffer(bytearray(payload), dtype=np_dtype).reshape(n_frames, dim)  # writable, owned
    if not array.dtype.isnative:  # pragma: no cover - no big-endian CI
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _to_le_bytes(array: np.ndarray) -> bytes:
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _float_samples(samples: torch.Tensor | np.ndarray) -> np.ndarray:
    """``samples`` as a float32 numpy array, without a copy when it already is one on the CPU."""
    if isinstance(samples, np.ndarray):
        return samples if samples.dtype == np.float32 else samples.astype(np.float32)
    if samples.dtype != torch.float32 or samples.device.type != "cpu" or samples.requires_grad:
        samples = samples.detach().to("cpu", torch.float32)
    return samples.numpy()


def encode_latents(
    stream: int, seq: int, latents: torch.Tensor | np.ndarray, dtype: str = DEFAULT_DTYPE
) -> bytes:
    """A latent message carrying ``latents`` (``[n_frames, latent_dim]``) converted to ``dtype``."""
    tensor = torch.as_tensor(latents).detach().to("cpu", LATENT_DTYPES[dtype]).contiguous()
    if tensor.dim() != 2:
        raise ShapeError(f"latents must be [n_frames, latent_dim], got shape {tuple(tensor.shape)}")
    raw = tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32).numpy()
    return LATENT_HEADER.pack(LATENT_MAGIC, stream, seq, tensor.shape[0]) + _to_le_bytes(raw)


def encode_audio(
    stream: int,
    seq: int,
    start_sample: int,
    samples: torch.Tensor | np.ndarray,
    fmt: str,
    s16: Callable[[], bytes] | None = None,
    n_samples: int | None = None,
) -> bytes:
    """An audio message: ``samples`` is float ``[channels, n]`` (a tensor or an array); interleaved on the
    wire in ``fmt``. ``s16``, if given, returns what :func:`~streamdec.io.pcm16` would make of ``samples``
    (a decoder's tile converts a whole device call at once: :meth:`~streamdec.session.Tile.pcm16`);
    ``n_samples``, if given, is ``n`` (a caller that read it already saves reading a tensor's shape)."""
    n = int(samples.shape[1]) if n_samples is None else n_samples
    header = AUDIO_HEADER.pack(AUDIO_MAGIC, stream, seq, start_sample, n)
    if fmt == "pcm_s16le":
        return header + (s16() if s16 is not None else pcm16(_float_samples(samples)))
    return header + _to_le_bytes(_float_samples(samples).T)


# --------------------------------------------------------------------------------------------------
# Server -> client control messages

DoneStatus = Literal["completed", "cancelled", "error"]
DONE_STATUSES: tuple[DoneStatus, ...] = ("completed", "cancelled", "error")


@dataclass(frozen=True)
class Ready:
    """``ready``, first on every connection: the protocol version, the codec and the limits.

    ``voice`` names the voice that speaks a start's ``text`` (None: this server takes latents only);
    ``minor`` is 0 for a server older than text in, which sends neither field. ``opus`` (minor 2) says
    what ``format: "opus"`` sends, or None where this server cannot send it (or predates the field).
    """

    codec: CodecInfo
    limits: Limits
    protocol: int = PROTOCOL_VERSION
    minor: int = PROTOCOL_MINOR
    voice: str | None = None
    opus: OpusInfo | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "ready",
            "protocol": self.protocol,
            "minor": self.minor,
            "codec": self.codec.to_json(),
            "limits": self.limits.to_json(),
            "voice": self.voice,
            "opus": None if self.opus is None else self.opus.to_json(),
        }


@dataclass(frozen=True)
class Started:
    """``started``: the server accepted ``start`` for ``stream``."""

    stream: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "started", "stream": self.stream}


@dataclass(frozen=True)
class Done:
    """``done``, the last message of a started stream. ``frames`` counts the latent frames the server
    accepted (rejected messages are not counted); ``samples`` the samples per channel it sent."""

    stream: int
    status: DoneStatus
    frames: int
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "done",
            "stream": self.stream,
            "status": self.status,
            "frames": self.frames,
            "samples": self.samples,
        }


@dataclass(frozen=True)
class ErrorMessage:
    """``error``: ``stream`` is the stream it concerns or None; ``retry_after_ms`` (``over_capacity``,
    ``overloaded``) is how long to wait before trying again."""

    code: ErrorCode
    message: str
    stream: int | None = None
    retry_after_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "type": "error",
            "stream": self.stream,
            "code": ErrorCode(self.code).value,
            "message": self.message,
        }
        if self.retry_after_ms is not None:
            obj["retry_after_ms"] = self.retry_after_ms
        return obj

    def to_exception(self) -> ServerError:
        """The client library's exception for this message."""
        return ServerError(
            ErrorCode(self.code).value, self.message, stream=self.stream, retry_after_ms=self.retry_after_ms
        )


ServerControl = Ready | Started | Done | ErrorMessage
ControlMessage = Start | End | Cancel | Ready | Started | Done | ErrorMessage


def encode_text(msg: ControlMessage) -> str:
    """The text frame of a control message, in either direction (compact JSON, no NaN)."""
    return _dumps(msg.to_json())


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def error_message(
    code: ErrorCode | str, message: str, stream: int | None = None, *, retry_after_ms: int | None = None
) -> str:
    """An ``error`` message's text frame."""
    return encode_text(ErrorMessage(ErrorCode(code), message, stream, retry_after_ms))


# --------------------------------------------------------------------------------------------------
# Field validation shared by both parsers


def _object(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise _fail(ErrorCode.BAD_MESSAGE, f"{where} must be a JSON object, got {type(obj).__name__}")
    return obj


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if type(value) is not kind:
        raise _fail(ErrorCode.BAD_MESSAGE, f"{where}.{key} must be a {kind.__name__}, got {value!r:.80}")
    return value


def _count(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or not _is_count(value):
        raise _fail(ErrorCode.BAD_MESSAGE, f"{where}.{key} must be an integer >= 0, got {value!r:.80}")
    return value


# --------------------------------------------------------------------------------------------------
# Parsing client messages


def _parse_stream_id(obj: Mapping[str, Any]) -> int:
    stream = obj.get("stream")
    if type(stream) is not int or not 0 <= stream <= MAX_STREAM_ID:
        raise _fail(
            ErrorCode.BAD_MESSAGE, f"'stream' must be an integer in [0, {MAX_STREAM_ID}], got {stream!r}"
        )
    return stream


def _parse_choice(
    obj: Mapping[str, Any], key: str, choices: Mapping[str, Any], default: str, stream: int
) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise _fail(ErrorCode.BAD_MESSAGE, f"{key!r} must be one of {sorted(choices)}, got {value!r}", stream)
    return value


def parse_client_text(text: str | bytes) -> ClientControl:
    """Parse one text message from a client; raises ProtocolError ``bad_json`` or ``bad_message``.

    Unknown keys are ignored so that later minor versions can add fields.
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _fail(ErrorCode.BAD_JSON, f"text message is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise _fail(ErrorCode.BAD_JSON, f"a text message must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind not in ("start", "end", "cancel"):
        raise _fail(ErrorCode.BAD_MESSAGE, f"'type' must be 'start', 'end' or 'cancel', got {kind!r}")
    stream = _parse_stream_id(obj)
    if kind == "end":
        return End(stream)
    if kind == "cancel":
        return Cancel(stream)
    dtype = _parse_choice(obj, "dtype", LATENT_DTYPES, DEFAULT_DTYPE, stream)
    fmt = _parse_choice(obj, "format", AUDIO_FORMATS, DEFAULT_FORMAT, stream)
    spoken = obj.get("text")
    if spoken is not None and not isinstance(spoken, str):
        raise _fail(ErrorCode.BAD_MESSAGE, f"'text' must be a string, got {type(spoken).__name__}", stream)
    return Start(stream, dtype, fmt, spoken)


# --------------------------------------------------------------------------------------------------
# Per-connection state


@dataclass
class _StreamState:
    start: Start
    accepting: bool = True  # False after end, cancel or an error: no more input for this stream
    next_seq: int = 0  # expected seq of the next latent message
    frames_in: int = 0  # latent frames accepted
    buffered: int = 0  # frames accepted and not yet taken by the decoder (see ServerState.consumed)
    audio_seq: int = 0  # seq of the next audio message
    samples_out: int = 0  # samples per channel sent
    # What every latent message of the stream is checked against, looked up once at its start: a
    # frame's payload bytes (0: no latent message is expected), and the numpy dtype of its values (None
    # where numpy lacks it: bfloat16)
    frame_bytes: int = 0
    np_dtype: np.dtype[Any] | None = None


@dataclass
class ServerState:
    """One connection's protocol state: which streams are open, what each expects next.

    Feed every received message to :meth:`receive_text` / :meth:`receive_binary`; they return the
    validated message or raise :class:`~streamdec.errors.ProtocolError` with the wire code and the stream
    it concerns. A stream stays in the table from its ``start`` until :meth:`done` builds its ``done``
    message; it accepts input only until ``end``, ``cancel`` or a stream-ending error.
    """

    codec: CodecInfo
    limits: Limits
    accepting_streams: bool = True  # False once the server shuts down: new starts get ``overloaded``
    voice: str | None = None  # the voice that speaks a start's text; None: a text start gets no_voice
    opus: OpusInfo | None = None  # what format "opus" sends; None: this server cannot send it
    _streams: dict[int, _StreamState] = field(default_factory=dict)

    # -- inbound -----------------------------------------------------------------------------------

    def receive_text(self, text: str | bytes) -> ClientControl:
        """Validate a control message and apply it to the stream table."""
        msg = parse_client_text(text)
        if isinstance(msg, Start):
            self._open(msg)
        elif isinstance(msg, Cancel) and msg.stream in self._streams:
            self._streams[msg.stream].accepting = False  # cancel also stops a stream that already ended
        else:
            self._input_of(msg.stream).accepting = False
        return msg

    def receive_binary(self, data: bytes | bytearray | memoryview) -> LatentMessage:
        """Validate a latent message; errors that end the stream close its input before raising."""
        stream, latents = self.receive_latents(data)
        return LatentMessage(stream, self._streams[stream].next_seq - 1, latents)

    def receive_latents(
        self, data: bytes | bytearray | memoryview, *, view: bool = False
    ) -> tuple[int, np.ndarray | torch.Tensor]:
        """:meth:`receive_binary` as ``(stream, latents)``, without the message object: what a server
        runs for every latent message. The usual message (float32 or float16, every count within its
        limit) passes one test of all of them; any other takes the checks that name what is wrong.

        ``view=True``: latents of an immutable ``bytes`` message may be a read-only view of it instead of
        a copy (a caller that keeps them copies them, as a session does when it buffers a chunk)."""
        if len(data) < _LATENT_HEADER_SIZE:
            raise _fail(
                ErrorCode.BAD_MESSAGE,
                f"binary message of {len(data)} bytes is shorter than the "
                f"{_LATENT_HEADER_SIZE}-byte latent header",
            )
        magic, stream, seq, n_frames = _unpack_latent_header(data)
        state = self._streams.get(stream)
        limits = self.limits
        np_dtype = None if state is None else state.np_dtype
        if (
            np_dtype is None  # no such stream, or a dtype numpy lacks
            or magic != LATENT_MAGIC
            or not state.accepting  # type: ignore[union-attr]
            or seq != state.next_seq  # type: ignore[union-attr]
            or n_frames > limits.max_frames_per_message
            or state.buffered + n_frames > limits.max_buffered_frames  # type: ignore[union-attr]
            or len(data) - _LATENT_HEADER_SIZE != n_frames * state.frame_bytes  # type: ignore[union-attr]
        ):
            return stream, self._receive_checked(data, magic, stream, seq, n_frames)
        assert state is not None
        latents = np.frombuffer(data, np_dtype, n_frames * self.codec.latent_dim, _LATENT_HEADER_SIZE)
        if not view or type(data) is not bytes:  # memory of its own, writable (a bytearray may change)
            latents = latents.copy()
        if not latents.dtype.isnative:  # pragma: no cover - no big-endian CI
            latents = latents.astype(latents.dtype.newbyteorder("="))
        latents = latents.reshape(n_frames, self.codec.latent_dim)
        if not all_finite(latents):
            state.accepting = False
            raise self._non_finite(state, seq, latents)
        state.next_seq = seq + 1
        state.frames_in += n_frames
        state.buffered += n_frames
        return stream, latents

    def _receive_checked(
        self, data: bytes | bytearray | memoryview, magic: bytes, stream: int, seq: int, n_frames: int
    ) -> np.ndarray | torch.Tensor:
        """A latent message that failed the one test of :meth:`receive_latents`: every check in turn,
        each raising with what it found (a bfloat16 stream's messages all come here and pass)."""
        if magic != LATENT_MAGIC:
            raise _fail(ErrorCode.BAD_MESSAGE, f"binary message magic {magic!r} is not {LATENT_MAGIC!r}")
        state = self._input_of(stream)
        try:
            latents = self._check_latents(state, seq, n_frames, memoryview(data)[_LATENT_HEADER_SIZE:])
        except ProtocolError:
            state.accepting = False
            raise
        state.next_seq += 1
        state.frames_in += n_frames
        state.buffered += n_frames
        return latents

    def produced(self, stream: int, n_frames: int) -> None:
        """The server's voice made ``n_frames`` latent frames of text stream ``stream`` (counted in done)."""
        if stream in self._streams:
            self._streams[stream].frames_in += n_frames
            self._streams[stream].buffered += n_frames

    def consumed(self, stream: int, n_frames: int) -> None:
        """The decoder took ``n_frames`` of ``stream``'s buffered frames: room for that many more."""
        if stream in self._streams:
            self._streams[stream].buffered -= n_frames

    def discard(self, stream: int) -> None:
        """Forget a stream whose ``start`` was refused after validation (e.g. by admission)."""
        self._streams.pop(stream, None)

    def _check_latents(
        self, state: _StreamState, seq: int, n_frames: int, payload: memoryview
    ) -> np.ndarray | torch.Tensor:
        stream, dim = state.start.stream, self.codec.latent_dim
        if seq != state.next_seq:
            raise _fail(
                ErrorCode.OUT_OF_ORDER, f"latent seq {seq} where {state.next_seq} was expected", stream
            )
        if n_frames > self.limits.max_frames_per_message:
            raise _fail(
                ErrorCode.TOO_LARGE,
                f"n_frames={n_frames} exceeds max_frames_per_message="
                f"{self.limits.max_frames_per_message}; send smaller chunks",
                stream,
            )
        if state.buffered + n_frames > self.limits.max_buffered_frames:
            raise _fail(
                ErrorCode.BACKLOG_FULL,
                f"{state.buffered} frames of stream {stream} wait for the decoder and {n_frames} more would "
                f"pass max_buffered_frames={self.limits.max_buffered_frames}; send no further ahead of the "
                "audio received than that",
                stream,
            )
        itemsize = _LATENT_ITEMSIZE[state.start.dtype]
        expected = n_frames * dim * itemsize
        if len(payload) != expected:
            raise _fail(
                ErrorCode.BAD_PAYLOAD,
                f"payload of {len(payload)} bytes, expected n_frames={n_frames} x "
                f"latent_dim={dim} x {itemsize} bytes ({state.start.dtype}) = {expected}",
                stream,
            )
        latents = _latents_from_payload(payload, state.start.dtype, n_frames, dim)
        if not all_finite(latents.float().numpy() if isinstance(latents, torch.Tensor) else latents):
            raise self._non_finite(state, seq, latents)
        return latents

    @staticmethod
    def _non_finite(state: _StreamState, seq: int, latents: np.ndarray | torch.Tensor) -> ProtocolError:
        """The error for a message whose latents hold NaN or Inf: which frame, counted in the stream."""
        values = latents.float().numpy() if isinstance(latents, torch.Tensor) else latents
        bad = first_non_finite_row(values)
        assert bad is not None
        return _fail(
            ErrorCode.NON_FINITE,
            f"latent frame {state.frames_in + bad} (message seq {seq}, row {bad}) holds NaN or Inf; "
            "send finite values",
            state.start.stream,
        )

    def _open(self, msg: Start) -> None:
        if msg.stream in self._streams:
            raise _fail(
                ErrorCode.DUPLICATE_STREAM,
                f"stream {msg.stream} is already open; wait for its 'done' or pick another id",
                msg.stream,
            )
        if not self.accepting_streams:
            raise _fail(
                ErrorCode.OVERLOADED, "the server is shutting down and takes no new streams", msg.stream
            )
        if len(self._streams) >= self.limits.max_streams:
            raise _fail(
                ErrorCode.TOO_MANY_STREAMS,
                f"{len(self._streams)} streams open, max_streams="
                f"{self.limits.max_streams}; wait for a 'done'",
                msg.stream,
            )
        if msg.text is not None and self.voice is None:
            raise _fail(
                ErrorCode.NO_VOICE,
                "this server has no voice, so a start cannot carry text: send latents, or start the server "
                "with `streamdec serve --voice piper-joe`",
                msg.stream,
            )
        # A text stream takes no input: its latents come from the server's voice.
        self._streams[msg.stream] = _StreamState(
            msg,
            accepting=msg.text is None,
            frame_bytes=self.codec.latent_dim * _LATENT_ITEMSIZE[msg.dtype],
            np_dtype=_NUMPY_LATENT_DTYPES.get(msg.dtype) if msg.text is None else None,
        )

    def _input_of(self, stream: int) -> _StreamState:
        state = self._streams.get(stream)
        if state is None or not state.accepting:
            why = "was never started" if state is None else "takes no more input (ended, cancelled or failed)"
            raise _fail(ErrorCode.UNKNOWN_STREAM, f"stream {stream} {why}", stream)
        return state

    # -- outbound ----------------------------------------------------------------------------------

    def ready(self) -> Ready:
        """The ``ready`` message sent first on every connection."""
        return Ready(self.codec, self.limits, voice=self.voice, opus=self.opus)

    def started(self, stream: int) -> Started:
        return Started(stream)

    def close_input(self, stream: int) -> None:
        """Take no more input for ``stream`` (after an error the decoder raised)."""
        if stream in self._streams:
            self._streams[stream].accepting = False

    def audio(
        self,
        stream: int,
        samples: torch.Tensor | np.ndarray,
        s16: Callable[[], bytes] | None = None,
        n_samples: int | None = None,
    ) -> bytes:
        """The next audio message of ``stream`` for float ``samples`` ``[channels, n]`` (a PCM format);
        ``s16`` and ``n_samples`` as :func:`encode_audio` takes them."""
        state = self._streams[stream]
        if n_samples is None:
            n_samples = int(samples.shape[1])
        data = encode_audio(
            stream, state.audio_seq, state.samples_out, samples, state.start.format, s16, n_samples
        )
        state.audio_seq += 1
        state.samples_out += n_samples
        return data

    def audio_parts(
        self,
        stream: int,
        samples: torch.Tensor | np.ndarray,
        s16: Callable[[], bytes] | None,
        n_samples: int,
    ) -> tuple[bytes, bytes]:
        """:meth:`audio` as its header and its payload, not yet joined: a server that frames the message
        itself writes the frame's header and both in one buffer, copying the payload once."""
        state = self._streams[stream]
        header = _pack_audio_header(AUDIO_MAGIC, stream, state.audio_seq, state.samples_out, n_samples)
        state.audio_seq += 1
        state.samples_out += n_samples
        if state.start.format == "pcm_s16le":
            return header, s16() if s16 is not None else pcm16(_float_samples(samples))
        return header, _to_le_bytes(_float_samples(samples).T)

    def encoded_audio(self, stream: int, n_samples: int, payload: bytes) -> bytes:
        """The next audio message of ``stream`` in a compressed format: ``payload`` is what the encoder
        produced after taking ``n_samples`` more samples per channel (it may hold fewer, or be empty)."""
        state = self._streams[stream]
        header = AUDIO_HEADER.pack(AUDIO_MAGIC, stream, state.audio_seq, state.samples_out, n_samples)
        state.audio_seq += 1
        state.samples_out += n_samples
        return header + payload

    def done(self, stream: int, status: DoneStatus) -> Done:
        """The ``done`` message of ``stream``; removes it from the table so its id may be reused."""
        state = self._streams.pop(stream)
        return Done(stream, status, state.frames_in, state.samples_out)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def stream_ids(self) -> list[int]:
        return list(self._streams)


# --------------------------------------------------------------------------------------------------
# Client side: parsing what the server sends


@dataclass(frozen=True, eq=False)
class AudioMessage:
    """One received audio message; ``pcm`` holds ``n_samples x channels`` interleaved samples."""

    stream: int
    seq: int
    start_sample: int
    n_samples: int
    pcm: bytes


def parse_audio(data: bytes | bytearray | memoryview) -> AudioMessage:
    """Parse an audio message; raises ProtocolError ``bad_message`` on a short or foreign message."""
    if len(data) < AUDIO_HEADER.size:
        raise _fail(ErrorCode.BAD_MESSAGE, f"audio message of {len(data)} bytes is shorter than its header")
    magic, stream, seq, start, n = AUDIO_HEADER.unpack_from(data)
    if magic != AUDIO_MAGIC:
        raise _fail(ErrorCode.BAD_MESSAGE, f"audio message magic {magic!r} is not {AUDIO_MAGIC!r}")
    return AudioMessage(stream, seq, start, n, bytes(memoryview(data)[AUDIO_HEADER.size :]))


def decode_audio_samples(msg: AudioMessage, fmt: str, channels: int) -> np.ndarray:
    """The samples of ``msg`` as float32 ``[channels, n_samples]`` (s16 scaled by 1/32767); PCM only."""
    if fmt not in SAMPLE_FORMATS:
        raise ConfigError(
            f"format {fmt!r} is not PCM: decode its payload with its codec (see PROTOCOL.md; the Python "
            "client's streams decode Opus themselves)"
        )
    width = SAMPLE_FORMATS[fmt]
    if len(msg.pcm) != msg.n_samples * channels * width:
        raise _fail(
            ErrorCode.BAD_MESSAGE,
            f"audio payload of {len(msg.pcm)} bytes, expected {msg.n_samples} x {channels} x {width}",
            msg.stream,
        )
    if fmt == "pcm_s16le":
        pcm = np.frombuffer(msg.pcm, dtype="<i2").astype(np.float32) / 32767.0
    else:
        pcm = np.frombuffer(msg.pcm, dtype="<f4").astype(np.float32)
    return pcm.reshape(msg.n_samples, channels).T.copy()


def parse_server_text(text: str | bytes) -> ServerControl:
    """Parse a server control message into its type; raises ProtocolError ``bad_json`` / ``bad_message``.

    Unknown keys are ignored (later minor versions may add fields); an unknown ``type`` is an error.
    """
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise _fail(ErrorCode.BAD_JSON, f"server sent invalid JSON: {exc}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise _fail(ErrorCode.BAD_MESSAGE, f"server message without a 'type': {obj!r:.200}")
    parser = _SERVER_PARSERS.get(obj["type"])
    if parser is None:
        raise _fail(ErrorCode.BAD_MESSAGE, f"unknown server message type {obj['type']!r:.80}")
    message: ServerControl = parser(obj)
    return message


def _parse_ready(obj: Mapping[str, Any]) -> Ready:
    protocol = obj.get("protocol")
    if protocol != PROTOCOL_VERSION or type(protocol) is not int:
        raise _fail(
            ErrorCode.BAD_MESSAGE,
            f"the server speaks protocol {protocol!r:.40}; this library speaks {PROTOCOL_VERSION}",
        )
    minor, voice = obj.get("minor", 0), obj.get("voice")
    if not _is_count(minor):
        raise _fail(ErrorCode.BAD_MESSAGE, f"ready.minor must be an integer >= 0, got {minor!r:.40}")
    if voice is not None and not isinstance(voice, str):
        raise _fail(ErrorCode.BAD_MESSAGE, f"ready.voice must be a string or null, got {voice!r:.40}")
    codec, limits = CodecInfo.from_json(obj.get("codec")), Limits.from_json(obj.get("limits"))
    opus = None if obj.get("opus") is None else OpusInfo.from_json(obj["opus"])
    return Ready(codec, limits, protocol, minor, voice, opus)


def _parse_started(obj: Mapping[str, Any]) -> Started:
    return Started(_parse_stream_id(obj))


def _parse_done(obj: Mapping[str, Any]) -> Done:
    status = obj.get("status")
    if status not in DONE_STATUSES:
        raise _fail(ErrorCode.BAD_MESSAGE, f"done.status must be one of {DONE_STATUSES}, got {status!r:.40}")
    return Done(_parse_stream_id(obj), status, _count(obj, "frames", "done"), _count(obj, "samples", "done"))


def _parse_error(obj: Mapping[str, Any]) -> ErrorMessage:
    stream = None if obj.get("stream") is None else _parse_stream_id(obj)
    code = obj.get("code")
    known = {c.value for c in ErrorCode}
    # An unknown code from a newer server stays a string the client can show; it is not a parse error.
    if not isinstance(code, str):
        raise _fail(ErrorCode.BAD_MESSAGE, f"error.code must be a string, got {code!r:.40}")
    retry = obj.get("retry_after_ms")
    return ErrorMessage(
        ErrorCode(code) if code in known else ErrorCode.INTERNAL,
        str(obj.get("message", "")) if code in known else f"[{code}] {obj.get('message', '')}",
        stream,
        retry if _is_count(retry) else None,
    )


_SERVER_PARSERS: Mapping[str, Any] = {
    "ready": _parse_ready,
    "started": _parse_started,
    "done": _parse_done,
    "error": _parse_error,
}
