"""Wire protocol v1, sans-I/O: every message and every error code, byte for byte."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.errors import (
    DTypeError,
    EngineError,
    InputError,
    NonFiniteError,
    ProtocolError,
    ShapeError,
    StreamEndedError,
)
from streamdec.protocol import (
    AUDIO_HEADER,
    CLOSE_CODES,
    LATENT_HEADER,
    CloseCode,
    Done,
    End,
    ErrorCode,
    Limits,
    ServerState,
    Start,
    decode_audio_samples,
    encode_audio,
    encode_latents,
    encode_text,
    error_code_for,
    error_message,
    parse_audio,
    parse_client_text,
)
from support.protocol_cases import CODEC, DIM

LIMITS = Limits(max_streams=2, max_frames_per_message=8).resolved(DIM)


def state() -> ServerState:
    return ServerState(CODEC, LIMITS)


def start(s: ServerState, stream: int = 1, **extra: str) -> None:
    s.receive_text(json.dumps({"type": "start", "stream": stream, **extra}))


def raises_code(code: ErrorCode, stream: int | None = None) -> pytest.RaisesExc[ProtocolError]:
    return pytest.raises(ProtocolError, check=lambda e: e.code == code.value and e.stream == stream)


def test_header_layouts_are_the_documented_structs() -> None:
    """The headers are exactly "<4sIII" (16 bytes) and "<4sIIQI" (24 bytes)."""
    assert (LATENT_HEADER.format, LATENT_HEADER.size) == ("<4sIII", 16)
    assert (AUDIO_HEADER.format, AUDIO_HEADER.size) == ("<4sIIQI", 24)


def test_latent_message_bytes_match_the_spec_example() -> None:
    """The PROTOCOL.md example: stream 7, seq 0, two frames of float16 [1, -2, 0.5, 0] / [0, ...]."""
    latents = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 0.25, -1.0, 2.0]])
    data = encode_latents(7, 0, latents, "float16")
    assert data.hex(" ") == (
        "53 44 4c 54 07 00 00 00 00 00 00 00 02 00 00 00 00 3c 00 c0 00 38 00 00 00 00 00 34 00 bc 00 40"
    )


def test_audio_message_bytes_match_the_spec_example() -> None:
    """The PROTOCOL.md example: stream 7, seq 0, start 0, 2 stereo samples in pcm_s16le."""
    samples = torch.tensor([[0.5, -1.5], [0.0, 1.0]])  # [channels, n]
    data = encode_audio(7, 0, 0, samples, "pcm_s16le")
    assert data.hex(" ") == (
        "53 44 41 55 07 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00 40 00 00 01 80 ff 7f"
    )


def test_f32_audio_message_bytes_match_the_spec_example() -> None:
    """The PROTOCOL.md example: stream 3, seq 5, start 2400, mono pcm_f32le [0.5, -0.25]."""
    data = encode_audio(3, 5, 2400, torch.tensor([[0.5, -0.25]]), "pcm_f32le")
    assert data.hex(" ") == (
        "53 44 41 55 03 00 00 00 05 00 00 00 60 09 00 00 00 00 00 00 02 00 00 00 00 00 00 3f 00 00 80 be"
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_latents_round_trip_in_every_dtype(dtype: str) -> None:
    """A latent message decodes back to the sent values, in the stream's dtype."""
    s = state()
    start(s, 3, dtype=dtype)
    latents = torch.randn(5, DIM)
    msg = s.receive_binary(encode_latents(3, 0, latents, dtype))
    assert (msg.stream, msg.seq, msg.latents.shape) == (3, 0, (5, DIM))
    received = torch.as_tensor(msg.latents)  # numpy where numpy has the dtype, else a tensor
    assert isinstance(msg.latents, torch.Tensor) == (dtype == "bfloat16")
    assert torch.equal(received, latents.to(received.dtype))


def test_s16_is_clipped_rounded_times_32767() -> None:
    """pcm_s16le = round_half_even(clamp(x, -1, 1) * 32767)."""
    x = torch.tensor([[-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0]])  # x*32767 exact in float32
    msg = parse_audio(encode_audio(0, 0, 0, x, "pcm_s16le"))
    assert np.frombuffer(msg.pcm, "<i2").tolist() == [-32767, -32767, -16384, 0, 8192, 16384, 32767, 32767]


@pytest.mark.parametrize("fmt", ["pcm_f32le", "pcm_s16le"])
def test_audio_round_trips_interleaved(fmt: str) -> None:
    """Audio parses back to [channels, n] with the right header fields."""
    samples = torch.rand(2, 10) - 0.5
    msg = parse_audio(encode_audio(4, 9, 1234, samples, fmt))
    assert (msg.stream, msg.seq, msg.start_sample, msg.n_samples) == (4, 9, 1234, 10)
    out = decode_audio_samples(msg, fmt, channels=2)
    tol = 0.0 if fmt == "pcm_f32le" else 0.5 / 32767 + 1e-7
    np.testing.assert_allclose(out, samples.numpy(), atol=tol, rtol=0)


def test_audio_with_its_sample_count_given_is_the_same_message() -> None:
    """A caller that read the sample count already passes it: the same bytes, the same numbering."""
    samples = torch.rand(2, 10) - 0.5
    assert encode_audio(4, 9, 1234, samples, "pcm_s16le", n_samples=10) == encode_audio(
        4, 9, 1234, samples, "pcm_s16le"
    )
    s = state()
    start(s, 1)
    first = parse_audio(s.audio(1, samples, n_samples=10))
    second = parse_audio(s.audio(1, samples))
    assert [(a.seq, a.start_sample, a.n_samples) for a in (first, second)] == [(0, 0, 10), (1, 10, 10)]


@pytest.mark.parametrize("fmt", ["pcm_s16le", "pcm_f32le"])
def test_audio_in_parts_joins_to_the_same_messages(fmt: str) -> None:
    """audio_parts (header, payload) joins to the bytes audio() gives, and numbers the stream alike."""
    samples = torch.rand(2, 10) - 0.5
    whole, parts = state(), state()
    for s in (whole, parts):
        start(s, 1, format=fmt)
    for _ in range(3):
        header, payload = parts.audio_parts(1, samples, None, 10)
        assert header + payload == whole.audio(1, samples)
    assert parts.done(1, "completed") == whole.done(1, "completed")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_receive_latents_is_receive_binary_without_the_message(dtype: str) -> None:
    """receive_latents returns the stream and the same latents as receive_binary, counting alike."""
    with_message, without = state(), state()
    for s in (with_message, without):
        start(s, 2, dtype=dtype)
    for seq in range(3):
        data = encode_latents(2, seq, torch.randn(seq + 1, DIM), dtype)
        msg = with_message.receive_binary(data)
        stream, latents = without.receive_latents(data)
        assert (stream, type(latents), latents.dtype) == (msg.stream, type(msg.latents), msg.latents.dtype)
        assert torch.equal(torch.as_tensor(latents), torch.as_tensor(msg.latents))
    assert without.done(2, "completed") == with_message.done(2, "completed")


def test_receive_latents_may_view_immutable_bytes_but_copies_a_bytearray() -> None:
    """view=True: latents of a bytes message may be a read-only view of it; a bytearray's are a copy."""
    s = state()
    start(s, 1)
    data = encode_latents(1, 0, torch.ones(2, DIM))
    _, viewed = s.receive_latents(data, view=True)
    assert np.array_equal(viewed, np.ones((2, DIM), np.float32))
    mutable = bytearray(encode_latents(1, 1, torch.ones(2, DIM)))
    _, copied = s.receive_latents(mutable, view=True)
    mutable[LATENT_HEADER.size :] = bytes(len(mutable) - LATENT_HEADER.size)
    assert np.array_equal(copied, np.ones((2, DIM), np.float32)) and copied.flags.writeable


def test_state_numbers_audio_and_reports_done() -> None:
    """Audio seq counts 0, 1, …; start_sample accumulates; done reports frames in and samples out."""
    s = state()
    start(s, 1)
    s.receive_binary(encode_latents(1, 0, torch.zeros(3, DIM)))
    a0 = parse_audio(s.audio(1, torch.zeros(2, 6)))
    a1 = parse_audio(s.audio(1, torch.zeros(2, 3)))
    assert [(a.seq, a.start_sample) for a in (a0, a1)] == [(0, 0), (1, 6)]
    assert s.done(1, "completed") == Done(1, "completed", frames=3, samples=9)
    assert s.open_streams == 0
    start(s, 1)  # the id may be reused after done


def test_ready_advertises_codec_and_limits() -> None:
    """ready carries protocol 1.2, the codec description, the limits, the voice and Opus (none here)."""
    ready = json.loads(encode_text(state().ready()))
    assert ready == {
        "type": "ready",
        "protocol": 1,
        "minor": 2,
        "voice": None,
        "opus": None,
        "codec": {
            "name": "toy",
            "latent_dim": 4,
            "hop_size": 3,
            "sample_rate": 24000,
            "channels": 2,
            "context": [5, 2],
        },
        "limits": {
            "max_streams": 2,
            "max_frames_per_message": 8,
            "max_message_bytes": 64 * 1024,
            "max_buffered_frames": 4096,
        },
    }


def test_start_defaults_are_float32_and_s16() -> None:
    """A start without dtype/format means float32 latents and pcm_s16le audio."""
    assert parse_client_text('{"type":"start","stream":0}') == Start(0, "float32", "pcm_s16le")
    assert parse_client_text('{"type":"end","stream":5,"extra":true}') == End(5)


_BAD_TEXT = [
    ("not-json", "{", ErrorCode.BAD_JSON, None),
    ("array", "[1]", ErrorCode.BAD_JSON, None),
    ("no-type", '{"stream":1}', ErrorCode.BAD_MESSAGE, None),
    ("bad-type", '{"type":"play","stream":1}', ErrorCode.BAD_MESSAGE, None),
    ("no-stream", '{"type":"start"}', ErrorCode.BAD_MESSAGE, None),
    ("bool-stream", '{"type":"start","stream":true}', ErrorCode.BAD_MESSAGE, None),
    ("negative-stream", '{"type":"start","stream":-1}', ErrorCode.BAD_MESSAGE, None),
    ("huge-stream", '{"type":"start","stream":4294967296}', ErrorCode.BAD_MESSAGE, None),
    ("bad-dtype", '{"type":"start","stream":1,"dtype":"int8"}', ErrorCode.BAD_MESSAGE, 1),
    ("bad-format", '{"type":"start","stream":1,"format":"mp3"}', ErrorCode.BAD_MESSAGE, 1),
    ("end-unknown", '{"type":"end","stream":9}', ErrorCode.UNKNOWN_STREAM, 9),
    ("cancel-unknown", '{"type":"cancel","stream":9}', ErrorCode.UNKNOWN_STREAM, 9),
]


@pytest.mark.parametrize(
    ("text", "code", "stream"), [c[1:] for c in _BAD_TEXT], ids=[c[0] for c in _BAD_TEXT]
)
def test_bad_text_gets_its_code(text: str, code: ErrorCode, stream: int | None) -> None:
    """Each malformed control message raises the documented code, naming the stream when it can."""
    with raises_code(code, stream):
        state().receive_text(text)


def test_duplicate_and_too_many_streams() -> None:
    """Starting an open id is duplicate_stream; a start past max_streams is too_many_streams."""
    s = state()
    start(s, 1)
    with raises_code(ErrorCode.DUPLICATE_STREAM, 1):
        start(s, 1)
    start(s, 2)
    with raises_code(ErrorCode.TOO_MANY_STREAMS, 3):
        start(s, 3)
    assert s.stream_ids() == [1, 2]


def test_start_while_shutting_down_is_overloaded() -> None:
    """Once the server stops taking streams, a start gets overloaded."""
    s = state()
    s.accepting_streams = False
    with raises_code(ErrorCode.OVERLOADED, 1):
        start(s, 1)


def _latent(stream: int, seq: int, n_frames: int, payload: bytes) -> bytes:
    return struct.pack("<4sIII", b"SDLT", stream, seq, n_frames) + payload


_BAD_BINARY = [
    ("short", b"SDLT\x01\x00", ErrorCode.BAD_MESSAGE, None),
    ("magic", _latent(1, 0, 1, b"\0" * 16).replace(b"SDLT", b"SDAU"), ErrorCode.BAD_MESSAGE, None),
    ("unknown-stream", _latent(8, 0, 1, b"\0" * 16), ErrorCode.UNKNOWN_STREAM, 8),
    ("out-of-order", _latent(1, 1, 1, b"\0" * 16), ErrorCode.OUT_OF_ORDER, 1),
    ("too-many-frames", _latent(1, 0, 9, b"\0" * 16 * 9), ErrorCode.TOO_LARGE, 1),
    ("short-payload", _latent(1, 0, 2, b"\0" * 17), ErrorCode.BAD_PAYLOAD, 1),
    ("long-payload", _latent(1, 0, 1, b"\0" * 20), ErrorCode.BAD_PAYLOAD, 1),
]


@pytest.mark.parametrize(
    ("data", "code", "stream"), [c[1:] for c in _BAD_BINARY], ids=[c[0] for c in _BAD_BINARY]
)
def test_bad_binary_gets_its_code(data: bytes, code: ErrorCode, stream: int | None) -> None:
    """Each malformed latent message raises the documented code, naming the stream when it can."""
    s = state()
    start(s, 1)
    with raises_code(code, stream):
        s.receive_binary(data)


def test_stream_ending_error_closes_input() -> None:
    """After a stream-ending error the stream takes no more input (unknown_stream), until done."""
    s = state()
    start(s, 1)
    with raises_code(ErrorCode.OUT_OF_ORDER, 1):
        s.receive_binary(_latent(1, 5, 0, b""))
    with raises_code(ErrorCode.UNKNOWN_STREAM, 1):
        s.receive_binary(_latent(1, 0, 0, b""))
    assert s.done(1, "error").status == "error"


def test_end_closes_input_but_keeps_the_stream_open() -> None:
    """After end, latents are unknown_stream and the stream still counts until its done."""
    s = state()
    start(s, 1)
    s.receive_text('{"type":"end","stream":1}')
    with raises_code(ErrorCode.UNKNOWN_STREAM, 1):
        s.receive_binary(_latent(1, 0, 0, b""))
    with raises_code(ErrorCode.DUPLICATE_STREAM, 1):
        start(s, 1)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (NonFiniteError("nan"), ErrorCode.NON_FINITE),
        (ShapeError("shape"), ErrorCode.BAD_PAYLOAD),
        (DTypeError("dtype"), ErrorCode.BAD_PAYLOAD),
        (StreamEndedError("ended"), ErrorCode.UNKNOWN_STREAM),
        (InputError("other"), ErrorCode.BAD_PAYLOAD),
        (ProtocolError("too_large", "big"), ErrorCode.TOO_LARGE),
        (EngineError("boom"), ErrorCode.INTERNAL),
        (RuntimeError("bug"), ErrorCode.INTERNAL),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.value,
)
def test_error_classes_map_to_wire_codes(exc: BaseException, code: ErrorCode) -> None:
    """The one mapping from the exception tree to wire codes."""
    assert error_code_for(exc) is code


def test_connection_level_close_codes() -> None:
    """overloaded closes with 1013, idle_timeout 1000, too_many_errors 1008, internal 1011."""
    assert CLOSE_CODES == {
        ErrorCode.OVERLOADED: CloseCode.TRY_AGAIN_LATER,
        ErrorCode.IDLE_TIMEOUT: 1000,
        ErrorCode.TOO_MANY_ERRORS: 1008,
        ErrorCode.INTERNAL: 1011,
    }


def test_error_message_shape() -> None:
    """error messages carry type, stream (or null), code and message."""
    assert json.loads(error_message(ErrorCode.BAD_JSON, "x")) == {
        "type": "error",
        "stream": None,
        "code": "bad_json",
        "message": "x",
    }


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)), st.booleans())
def test_random_frames_raise_only_protocol_errors(data: bytes | str, prefix: bool) -> None:
    """Arbitrary bytes or text never raise anything but ProtocolError, and never open a stream."""
    s = state()
    start(s, 1)
    if prefix and isinstance(data, bytes):
        data = b"SDLT" + data
    try:
        if isinstance(data, bytes):
            s.receive_binary(data)
        else:
            s.receive_text(data)
    except ProtocolError as exc:
        assert exc.code in {c.value for c in ErrorCode}
    assert len(s.stream_ids()) <= LIMITS.max_streams


_SAMPLES = st.floats(-3.0, 3.0, width=32) | st.sampled_from(
    [-1.0, 1.0, 0.5 / 32767, 1.5 / 32767, -2.5 / 32767]
)


@settings(max_examples=60, deadline=None)
@given(channels=st.integers(1, 3), values=st.lists(_SAMPLES, min_size=0, max_size=24))
def test_s16_audio_equals_the_torch_conversion_byte_for_byte(channels: int, values: list[float]) -> None:
    """The numpy pcm_s16le payload (streamdec.io.pcm16) is byte for byte the torch conversion
    round_half_even(clamp(x, -1, 1) * 32767), interleaved: halves and clipping included."""
    n = len(values) // channels
    samples = torch.tensor(values[: n * channels], dtype=torch.float32).reshape(channels, n)
    data = encode_audio(1, 0, 0, samples, "pcm_s16le")
    expected = torch.round(samples.clamp(-1.0, 1.0) * 32767.0).to(torch.int16).t().contiguous()
    assert data[AUDIO_HEADER.size :] == expected.numpy().astype("<i2").tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("row", [0, 3])
def test_non_finite_latents_name_their_frame_in_every_dtype(dtype: str, row: int) -> None:
    """NaN or Inf in any dtype is refused as non_finite, naming the first bad frame of the stream."""
    s = state()
    start(s, 1, dtype=dtype)
    s.receive_binary(encode_latents(1, 0, torch.zeros(2, DIM), dtype))
    latents = torch.zeros(4, DIM)
    latents[row, 1] = float("inf")
    latents[3, 0] = float("nan")
    with raises_code(ErrorCode.NON_FINITE, 1) as caught:
        s.receive_binary(encode_latents(1, 1, latents, dtype))
    assert f"latent frame {2 + row} (message seq 1, row {row})" in str(caught.value)


def test_received_latents_own_writable_memory() -> None:
    """A latent message's array owns its memory: writable, and not a view of the received bytes."""
    s = state()
    start(s, 1)
    data = bytearray(encode_latents(1, 0, torch.ones(2, DIM)))
    latents = s.receive_binary(data).latents
    data[LATENT_HEADER.size :] = bytes(len(data) - LATENT_HEADER.size)
    latents += 1  # would fail on a read-only buffer
    assert torch.equal(torch.as_tensor(latents), torch.full((2, DIM), 2.0))
