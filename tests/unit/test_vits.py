"""The vits family (Piper's HiFi-GAN generator) and the voice's text front end, without the voice files."""

from __future__ import annotations

import functools

import pytest
import torch

from streamdec.codecs import load_codec, save_codec
from streamdec.codecs.registry import build_codec, finalize
from streamdec.codecs.vits import PIPER_MEDIUM, VITS_TINY, VITSConfig
from streamdec.errors import (
    CodecError,
    EmptyTextError,
    TextTooLongError,
    UnknownPhonemeError,
    VoiceError,
)
from streamdec.voice import phonemes
from streamdec.voice.committed import COMMITTED_PHONEMES, DEMO_TEXT
from streamdec.voice.phonemes import MAX_SENTENCE_PHONEMES, MAX_TEXT_CHARS, phoneme_ids, phonemize

torch.set_num_threads(2)
ID_MAP = {"_": [0], "^": [1], "$": [2], " ": [3], ",": [8], ".": [10], "a": [14], "b": [15], "ˈ": [120]}


@functools.cache
def _tiny64() -> torch.nn.Module:
    return load_codec("vits-tiny", dtype=torch.float64)


def test_tiny_twin_has_the_medium_voices_geometry() -> None:
    """vits-tiny differs from Piper's medium voices in widths only: same hop, rate and exact context."""
    tiny = load_codec("vits-tiny")
    medium = finalize(build_codec("vits", "medium", PIPER_MEDIUM.to_dict()), "cpu", torch.float32)
    assert (tiny.hop_size, tiny.sample_rate) == (medium.hop_size, medium.sample_rate) == (256, 22050)
    assert tiny.context_frames() == medium.context_frames() == (11, 11)


@pytest.mark.parametrize("frames", [1, 5, 23])
def test_tiny_decodes_frames_times_hop_of_bounded_audio(frames: int) -> None:
    """decode gives [B, 1, T*256] inside tanh's range."""
    codec = load_codec("vits-tiny")
    audio = codec.decode(torch.randn(2, frames, codec.latent_dim, generator=torch.Generator().manual_seed(0)))
    assert audio.shape == (2, 1, frames * 256)
    assert bool(torch.isfinite(audio).all()) and float(audio.abs().max()) < 1.0


def _frame_change(offset: int) -> float:
    """Largest change of output frame 20 when latent frame 20+offset is bumped (float64)."""
    codec = _tiny64()
    base = torch.randn(
        1, 41, codec.latent_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    bumped = base.clone()
    bumped[0, 20 + offset] += 1.0
    frame = slice(20 * 256, 21 * 256)
    return float((codec.decode(bumped)[..., frame] - codec.decode(base)[..., frame]).abs().max())


@pytest.mark.parametrize("offset", [-11, 11])
def test_context_edge_frames_reach_the_output(offset: int) -> None:
    """The exact context is tight: the outermost latent frames on each side change the output frame."""
    assert _frame_change(offset) > 1e-12


@pytest.mark.parametrize("offset", [-12, 12])
def test_frames_beyond_the_context_do_not(offset: int) -> None:
    """The exact context is sound: one frame further out changes nothing."""
    assert _frame_change(offset) == 0.0


def test_save_and_load_round_trip(tmp_path: pytest.TempPathFactory) -> None:
    """save_codec then load_codec rebuilds the same vits decoder."""
    codec = load_codec("vits-tiny")
    path = tmp_path / "tiny.safetensors"  # type: ignore[operator]
    save_codec(codec, path)
    again = load_codec(path)
    z = torch.randn(1, 6, codec.latent_dim, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(again.decode(z), codec.decode(z), atol=0, rtol=0)


@pytest.mark.parametrize(
    "change",
    [
        {"upsample_kernel_sizes": (16, 16)},
        {"resblock": "3"},
        {"resblock_kernel_sizes": (3, 4, 7)},
        {"upsample_kernel_sizes": (16, 15, 8)},
        {"upsample_initial_channel": 36},
    ],
    ids=["counts", "resblock", "even-kernel", "odd-kernel-minus-rate", "width"],
)
def test_config_refuses_what_it_cannot_build(change: dict[str, object]) -> None:
    """Bad geometry is a CodecError naming the field, not a shape error at decode time."""
    with pytest.raises(CodecError, match="VITS"):
        VITSConfig(**{**VITS_TINY.to_dict(), **change})  # type: ignore[arg-type]


def test_unknown_voice_name_lists_the_voices() -> None:
    """load_codec of an unknown name lists presets and voices."""
    with pytest.raises(CodecError, match="piper-joe"):
        load_codec("piper-nobody")


# -- text front end ------------------------------------------------------------------------------------
def test_ids_are_bos_pad_interspersed_eos() -> None:
    """Piper's layout: ^ _ p1 _ p2 _ ... pn _ $."""
    assert phoneme_ids("ˈab.", ID_MAP) == [1, 0, 120, 0, 14, 0, 15, 0, 10, 0, 2]


def test_unknown_phoneme_is_named_with_its_code_point() -> None:
    """A phoneme outside the voice's map is refused, with the character and U+ code."""
    with pytest.raises(UnknownPhonemeError, match="U\\+0292"):
        phoneme_ids("aʒb", ID_MAP)


def test_over_long_sentence_is_refused() -> None:
    """A sentence above MAX_SENTENCE_PHONEMES is refused with the limit and the fix."""
    with pytest.raises(TextTooLongError, match=f"{MAX_SENTENCE_PHONEMES}.*full stop"):
        phoneme_ids("a" * (MAX_SENTENCE_PHONEMES + 1), ID_MAP)


def test_over_long_text_is_refused_before_any_phonemes() -> None:
    """Text above MAX_TEXT_CHARS is refused (no espeak-ng needed to find out)."""
    with pytest.raises(TextTooLongError, match=str(MAX_TEXT_CHARS)):
        phonemize("word " * MAX_TEXT_CHARS)


@pytest.mark.parametrize(
    "text", ["", "   ", "... ?!", "\n\t"], ids=["empty", "blank", "punctuation", "whitespace"]
)
def test_empty_text_is_refused(text: str) -> None:
    """Text with no letters or digits is an EmptyTextError."""
    with pytest.raises(EmptyTextError):
        phonemize(text)


def test_clauses_split_at_punctuation_before_a_space() -> None:
    """Commas and full stops end clauses; a decimal point does not."""
    assert phonemes._clauses("Hello, world. It costs 5.50 now") == [
        ("Hello", ","),
        ("world", "."),
        ("It costs 5.50 now", ""),
    ]


def test_committed_phonemes_need_no_espeak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the program, the demo text still phonemizes (from the committed strings)."""
    monkeypatch.setattr(phonemes, "espeak_available", lambda: False)
    said = phonemize(f"  {DEMO_TEXT} ")
    assert [(s.text, s.phonemes) for s in said] == COMMITTED_PHONEMES[DEMO_TEXT]


def test_other_text_without_espeak_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the program, other text is a VoiceError that says what to install."""
    monkeypatch.setattr(phonemes, "espeak_available", lambda: False)
    with pytest.raises(VoiceError, match="apt-get install espeak-ng"):
        phonemize("Something else entirely.")


@pytest.mark.skipif(
    not phonemes.espeak_available(), reason="espeak-ng is not installed (apt-get install espeak-ng)"
)
def test_committed_phonemes_match_espeak() -> None:
    """The committed demo phonemes are what espeak-ng gives today."""
    said = phonemize(DEMO_TEXT)
    assert [(s.text, s.phonemes) for s in said] == COMMITTED_PHONEMES[DEMO_TEXT]


@pytest.mark.skipif(
    not phonemes.espeak_available(), reason="espeak-ng is not installed (apt-get install espeak-ng)"
)
def test_sentences_end_at_full_stops_and_keep_clause_punctuation() -> None:
    """Two sentences; the comma stays inside the first one's phonemes."""
    said = phonemize("Hello, world. How are you?")
    assert [s.text for s in said] == ["Hello, world.", "How are you?"]
    assert said[0].phonemes.count(",") == 1 and said[0].phonemes.endswith(".")
    assert said[1].phonemes.endswith("?")
