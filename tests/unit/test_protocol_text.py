"""Protocol 1.1's text in, sans-I/O: the text start, no_voice, bad_text, and ready naming the voice."""

from __future__ import annotations

import json

import pytest
import torch

from streamdec.errors import EmptyTextError, ProtocolError, TextTooLongError, UnknownPhonemeError
from streamdec.protocol import (
    STREAM_ENDING_CODES,
    CodecInfo,
    ErrorCode,
    Limits,
    Ready,
    ServerState,
    Start,
    encode_latents,
    encode_text,
    error_code_for,
    parse_client_text,
    parse_server_text,
)

CODEC = CodecInfo("vits-tiny", 16, 256, 22050, 1, (11, 11))


def _state(voice: str | None = "piper-joe") -> ServerState:
    return ServerState(CODEC, Limits().resolved(CODEC.latent_dim), voice=voice)


def _code(caught: pytest.ExceptionInfo[ProtocolError]) -> tuple[str, int | None]:
    return caught.value.code, caught.value.stream


def test_start_may_carry_text_and_round_trips() -> None:
    """A start's text is parsed and written back; a start without it has none and writes none."""
    msg = parse_client_text(json.dumps({"type": "start", "stream": 3, "text": "Hello."}))
    assert msg == Start(3, text="Hello.")
    assert parse_client_text(encode_text(msg)) == msg
    assert "text" not in json.loads(encode_text(Start(3)))


@pytest.mark.parametrize("text", [5, ["a"], {"b": 1}, True], ids=["number", "list", "object", "bool"])
def test_text_that_is_not_a_string_is_bad_message(text: object) -> None:
    """Non-string text is refused as bad_message for that stream."""
    with pytest.raises(ProtocolError) as caught:
        parse_client_text(json.dumps({"type": "start", "stream": 1, "text": text}))
    assert _code(caught) == ("bad_message", 1)


def test_text_start_without_a_voice_is_no_voice_and_opens_nothing() -> None:
    """no_voice names the stream and the fix; the id stays free for a latent stream."""
    state = _state(voice=None)
    with pytest.raises(ProtocolError, match="--voice piper-joe") as caught:
        state.receive_text('{"type":"start","stream":0,"text":"Hi."}')
    assert _code(caught) == ("no_voice", 0) and state.open_streams == 0
    assert ErrorCode.NO_VOICE not in STREAM_ENDING_CODES  # refused, never started: no done follows
    state.receive_text('{"type":"start","stream":0}')


@pytest.mark.parametrize("control", ["latents", "end"])
def test_a_text_stream_takes_no_input(control: str) -> None:
    """The server makes a text stream's latents: a client's latents or end are unknown_stream."""
    state = _state()
    state.receive_text('{"type":"start","stream":0,"text":"Hi."}')
    with pytest.raises(ProtocolError) as caught:
        if control == "latents":
            state.receive_binary(encode_latents(0, 0, torch.zeros(2, CODEC.latent_dim)))
        else:
            state.receive_text('{"type":"end","stream":0}')
    assert _code(caught) == ("unknown_stream", 0)


def test_frames_the_voice_makes_are_counted_in_done() -> None:
    """produced() frames count in done like a client's latents, and consumed() balances them."""
    state = _state()
    state.receive_text('{"type":"start","stream":0,"text":"Hi."}')
    state.produced(0, 8)
    state.consumed(0, 8)
    state.audio(0, torch.zeros(1, 8 * 256))
    assert state.done(0, "completed").to_json()["frames"] == 8


@pytest.mark.parametrize("error", [EmptyTextError, TextTooLongError, UnknownPhonemeError])
def test_text_errors_are_bad_text_and_end_the_stream(error: type[Exception]) -> None:
    """Every TextError is bad_text on the wire, a stream-ending code."""
    assert error_code_for(error("x")) is ErrorCode.BAD_TEXT
    assert ErrorCode.BAD_TEXT in STREAM_ENDING_CODES


def test_ready_names_the_voice_and_the_minor_version() -> None:
    """ready carries the minor version and the voice; a 1.0 ready (neither field) parses as minor 0, no voice."""
    ready = _state().ready()
    assert parse_server_text(encode_text(ready)) == ready and ready.voice == "piper-joe" and ready.minor == 2
    old = {k: v for k, v in ready.to_json().items() if k not in ("minor", "voice", "opus")}
    parsed = parse_server_text(json.dumps(old))
    assert isinstance(parsed, Ready) and (parsed.minor, parsed.voice) == (0, None)


@pytest.mark.parametrize(("key", "value"), [("minor", -1), ("minor", "1"), ("voice", 3)])
def test_a_malformed_minor_or_voice_is_bad_message(key: str, value: object) -> None:
    """ready.minor must be a count and ready.voice a string or null."""
    obj = {**_state().ready().to_json(), key: value}
    with pytest.raises(ProtocolError, match=f"ready.{key}") as caught:
        parse_server_text(json.dumps(obj))
    assert caught.value.code == "bad_message"
