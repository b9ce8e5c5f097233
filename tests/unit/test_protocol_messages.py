"""Typed control messages in both directions, flow-control bounds and what ``done.frames`` counts."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamdec.errors import ConfigError, NonFiniteOutputError, ProtocolError, ServerError
from streamdec.protocol import (
    MAX_STREAM_ID,
    Cancel,
    CodecInfo,
    Done,
    End,
    ErrorCode,
    ErrorMessage,
    Limits,
    Ready,
    ServerState,
    Start,
    Started,
    encode_latents,
    encode_text,
    error_code_for,
    parse_client_text,
    parse_server_text,
)
from support.protocol_cases import CODEC, DIM

stream_ids = st.integers(0, MAX_STREAM_ID)
counts = st.integers(0, 2**40)
codecs = st.builds(
    CodecInfo,
    name=st.text(max_size=20),
    latent_dim=st.integers(1, 4096),
    hop_size=st.integers(1, 4096),
    sample_rate=st.integers(1, 192000),
    channels=st.integers(1, 8),
    context=st.tuples(st.integers(0, 500), st.integers(0, 500)),
)
limits = st.builds(
    Limits,
    max_streams=st.integers(1, 64),
    max_frames_per_message=st.integers(1, 1024),
    max_message_bytes=st.integers(1, 2**30),
    max_buffered_frames=st.integers(2048, 2**20),
)
server_messages = st.one_of(
    st.builds(Ready, codecs, limits),
    st.builds(Started, stream_ids),
    st.builds(Done, stream_ids, st.sampled_from(["completed", "cancelled", "error"]), counts, counts),
    st.builds(
        ErrorMessage,
        st.sampled_from(list(ErrorCode)),
        st.text(max_size=50),
        st.none() | stream_ids,
        st.none() | st.integers(0, 10**6),
    ),
)
client_messages = st.one_of(
    st.builds(
        Start,
        stream_ids,
        st.sampled_from(["float32", "float16", "bfloat16"]),
        st.sampled_from(["pcm_s16le", "pcm_f32le"]),
    ),
    st.builds(End, stream_ids),
    st.builds(Cancel, stream_ids),
)


@given(server_messages)
def test_every_server_message_round_trips(msg: object) -> None:
    """encode_text then parse_server_text gives back the same typed message."""
    assert parse_server_text(encode_text(msg)) == msg  # type: ignore[arg-type]


@given(client_messages)
def test_every_client_message_round_trips(msg: Start | End | Cancel) -> None:
    """encode_text then parse_client_text gives back the same typed message."""
    assert parse_client_text(encode_text(msg)) == msg


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "hello"},
        {"type": "ready", "protocol": 2, "codec": {}, "limits": {}},
        {"type": "ready", "protocol": True, "codec": {}, "limits": {}},
        {"type": "ready", "protocol": 1, "codec": {"name": "x"}, "limits": {}},
        {"type": "started", "stream": -1},
        {"type": "done", "stream": 1, "status": "finished", "frames": 0, "samples": 0},
        {"type": "done", "stream": 1, "status": "completed", "frames": 1.5, "samples": 0},
        {"type": "error", "stream": 1, "code": 7, "message": "x"},
    ],
    ids=[
        "unknown-type",
        "protocol-2",
        "protocol-bool",
        "codec-missing",
        "bad-stream",
        "bad-status",
        "float-frames",
        "code-not-str",
    ],
)
def test_malformed_server_messages_are_bad_message(obj: dict[str, object]) -> None:
    """A server message with a wrong field raises bad_message, naming the field."""
    with pytest.raises(ProtocolError, check=lambda e: e.code == "bad_message"):
        parse_server_text(json.dumps(obj))


def test_ready_from_an_older_server_keeps_limit_defaults() -> None:
    """A ready without max_buffered_frames (an older server) parses with the default."""
    ready = Ready(CODEC, Limits(max_message_bytes=65536)).to_json()
    del ready["limits"]["max_buffered_frames"]
    parsed = parse_server_text(json.dumps(ready))
    assert isinstance(parsed, Ready) and parsed.limits.max_buffered_frames == Limits().max_buffered_frames


def test_error_with_retry_hint_becomes_a_server_error_with_it() -> None:
    """over_capacity carries retry_after_ms to the client's ServerError."""
    text = encode_text(ErrorMessage(ErrorCode.OVER_CAPACITY, "full", 3, retry_after_ms=1500))
    assert json.loads(text)["retry_after_ms"] == 1500
    msg = parse_server_text(text)
    assert isinstance(msg, ErrorMessage)
    exc = msg.to_exception()
    assert isinstance(exc, ServerError)
    assert (exc.code, exc.stream, exc.retry_after_ms) == ("over_capacity", 3, 1500)


def test_an_unknown_error_code_from_a_newer_server_is_kept_readable() -> None:
    """An error code this library does not know is not a parse failure; its name stays in the message."""
    msg = parse_server_text('{"type":"error","stream":null,"code":"brand_new","message":"m"}')
    assert isinstance(msg, ErrorMessage) and "brand_new" in msg.message


def test_non_finite_output_has_its_own_code() -> None:
    """The library's NonFiniteOutputError maps to the stream-ending wire code non_finite_output."""
    assert error_code_for(NonFiniteOutputError("nan audio")) is ErrorCode.NON_FINITE_OUTPUT


def _state(**limits: int) -> ServerState:
    s = ServerState(CODEC, Limits(**limits).resolved(DIM))
    s.receive_text(encode_text(Start(1)))
    return s


def test_buffered_frames_past_the_bound_end_the_stream_with_backlog_full() -> None:
    """A message that would pass max_buffered_frames is refused; frames the decoder took make room."""
    s = _state(max_frames_per_message=4, max_buffered_frames=8)
    s.receive_binary(encode_latents(1, 0, torch.zeros(4, DIM)))
    s.receive_binary(encode_latents(1, 1, torch.zeros(4, DIM)))
    s.consumed(1, 3)
    s.receive_binary(encode_latents(1, 2, torch.zeros(3, DIM)))
    with pytest.raises(ProtocolError, check=lambda e: e.code == "backlog_full" and e.stream == 1):
        s.receive_binary(encode_latents(1, 3, torch.zeros(1, DIM)))
    assert s.done(1, "error").frames == 11  # the refused message is not counted


def test_done_frames_do_not_count_non_finite_messages() -> None:
    """A message holding NaN is refused with non_finite and its frames are not counted in done."""
    s = _state()
    s.receive_binary(encode_latents(1, 0, torch.zeros(3, DIM)))
    bad = torch.zeros(5, DIM)
    bad[2, 1] = float("nan")
    with pytest.raises(ProtocolError, check=lambda e: e.code == "non_finite" and "frame 5" in str(e)):
        s.receive_binary(encode_latents(1, 1, bad))
    assert s.done(1, "error").frames == 3


def test_buffered_bound_must_leave_room_for_two_messages() -> None:
    """max_buffered_frames below twice max_frames_per_message is refused with both numbers."""
    with pytest.raises(ConfigError, match=r"max_buffered_frames=100.*max_frames_per_message=512"):
        Limits(max_buffered_frames=100).resolved(DIM)


def test_start_accepts_opus_and_pcm_decoding_refuses_it() -> None:
    """format "opus" is a valid start; decoding its payload as PCM is a typed error naming the format."""
    from streamdec.errors import ConfigError
    from streamdec.protocol import AudioMessage, Start, decode_audio_samples, parse_client_text

    assert parse_client_text('{"type":"start","stream":3,"format":"opus"}') == Start(3, "float32", "opus")
    with pytest.raises(ConfigError, match="'opus' is not PCM"):
        decode_audio_samples(AudioMessage(3, 0, 0, 0, b""), "opus", 1)


def test_ogg_page_checksum_matches_the_encoder() -> None:
    """The Ogg page checksum written here equals the one sphn's Ogg writer (an independent one) computed."""
    sphn = pytest.importorskip("sphn", reason="needs the `opus` extra")
    import struct

    import numpy as np

    from streamdec.audio.ogg import ogg_crc

    data = sphn.OpusStreamWriter(24000).append_pcm(np.zeros(480, np.float32))
    size = 27 + data[26] + sum(data[27 : 27 + data[26]])
    page = bytearray(data[:size])
    (stored,) = struct.unpack_from("<I", page, 22)
    struct.pack_into("<I", page, 22, 0)
    assert ogg_crc(bytes(page)) == stored


def test_opus_for_a_layout_opus_cannot_take_is_refused_with_the_fix() -> None:
    """Any rate goes (resampled to an Opus rate); two channels do not: the reason names them and PCM."""
    from streamdec.audio.libopus import libopus_available
    from streamdec.server.opus import check_opus

    if not libopus_available():
        pytest.skip("needs the system's libopus: apt-get install libopus0")
    assert check_opus(24000, 1) is None and check_opus(22050, 1) is None
    why = check_opus(24000, 2)
    assert why is not None and "2 channels" in why and "pcm_s16le" in why
