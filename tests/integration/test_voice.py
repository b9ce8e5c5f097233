"""The trained voice end to end: ONNX parity, seeded text in, streaming equals whole clip, intelligibility."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import streamdec
from streamdec.codecs.vits import voice_files
from streamdec.errors import UnknownPhonemeError
from streamdec.voice import DEMO_TEXT, VoiceSettings, text_latents
from streamdec.voice.cli import say
from support.voice import codec, needs_espeak, reference_decode, voice

torch.set_num_threads(2)
WER_BOUND = 0.35


@functools.cache
def _demo_latents() -> np.ndarray:
    return np.concatenate([z for _, z in voice().speak(DEMO_TEXT)])


@functools.cache
def _demo_whole() -> np.ndarray:
    return codec().decode(torch.from_numpy(_demo_latents())[None])[0, 0].numpy()


@functools.cache
def _demo_streamed() -> np.ndarray:
    return asyncio.run(say(codec(), voice(), DEMO_TEXT))[0].numpy()


def test_named_voice_and_onnx_path_load_the_same_decoder() -> None:
    """load_codec('piper-joe') and load_codec(PATH.onnx) read the same generator from the file."""
    by_path = streamdec.load_codec(voice_files("piper-joe")[0])
    assert by_path.config == codec().config and by_path.family == "vits"
    assert sum(p.numel() for p in codec().parameters()) == 1_662_976
    for (name, a), (_, b) in zip(codec().state_dict().items(), by_path.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_converted_voice_decoder_decodes_the_same(tmp_path: Path) -> None:
    """`streamdec convert VOICE.onnx OUT.safetensors` keeps the decoder: a GPU host needs no onnx package."""
    out = tmp_path / "piper-joe.safetensors"
    streamdec.save_codec(streamdec.load_codec(voice_files("piper-joe")[0]), out)
    latents = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 12, 192)).astype(np.float32))
    torch.testing.assert_close(
        streamdec.load_codec(out).decode(latents), codec().decode(latents), atol=0, rtol=0
    )


def test_decoder_matches_onnxruntime_on_random_latents() -> None:
    """Random latents: streamdec's generator equals the file's decoder in onnxruntime within 1e-5."""
    latents = np.random.default_rng(0).standard_normal((40, 192)).astype(np.float32)
    ours = codec().decode(torch.from_numpy(latents)[None]).numpy().reshape(-1)
    np.testing.assert_allclose(ours, reference_decode(latents), atol=1e-5, rtol=0)


def test_decoder_matches_onnxruntime_on_a_sentences_latents() -> None:
    """A spoken sentence's latents: the same within 1e-5."""
    (_, ids), *_ = voice().prepare(DEMO_TEXT)
    latents = voice().latents(ids)
    ours = codec().decode(torch.from_numpy(latents)[None]).numpy().reshape(-1)
    np.testing.assert_allclose(ours, reference_decode(latents), atol=1e-5, rtol=0)


def test_same_text_and_seed_give_the_same_latents() -> None:
    """Seeded noise: repeatable per seed, different across seeds."""
    (_, ids), *_ = voice().prepare(DEMO_TEXT)
    first, again = voice().latents(ids), voice().latents(ids)
    other = voice().latents(ids, settings=VoiceSettings(0.667, 1.0, 0.8, seed=1))
    np.testing.assert_array_equal(first, again)
    assert first.shape[1] == 192 and not np.array_equal(first[: len(other)], other[: len(first)])


def test_text_latents_refuses_bad_text_before_any_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A phoneme unknown to the voice in the last sentence fails the stream before its first chunk."""
    without = {k: v for k, v in voice().id_map.items() if k != "ɪ"}
    monkeypatch.setattr(voice(), "id_map", without)

    async def first_chunk() -> None:
        async for _ in text_latents(voice(), DEMO_TEXT):
            pytest.fail("a chunk came before the error")

    with pytest.raises(UnknownPhonemeError, match="U\\+026A"):
        asyncio.run(first_chunk())


def test_streamed_speech_equals_whole_clip_decode() -> None:
    """say (text -> chunks of 8 -> StreamDecoder) equals one decode of the concatenated latents."""
    streamed, whole = _demo_streamed(), _demo_whole()
    assert streamed.shape == whole.shape == (_demo_latents().shape[0] * 256,)
    np.testing.assert_allclose(streamed, whole, atol=1e-5, rtol=0)


def test_streamed_demo_is_intelligible() -> None:
    """pocketsphinx hears the same words in both decodes, within the word error rate bound."""
    pytest.importorskip("pocketsphinx", reason="needs pip install 'streamdec[speech-test]'")
    from streamdec.voice.transcribe import transcribe, word_error_rate

    heard = transcribe(_demo_streamed(), 22050)
    assert heard == transcribe(_demo_whole(), 22050)
    assert word_error_rate(DEMO_TEXT, heard) <= WER_BOUND, heard


def _wav_seconds(path: Path) -> float:
    with wave.open(str(path)) as f:
        assert (f.getframerate(), f.getnchannels()) == (22050, 1)
        return f.getnframes() / f.getframerate()


@needs_espeak
def test_say_command_writes_speech(tmp_path: Path) -> None:
    """`streamdec say TEXT OUT.wav` prints each sentence and writes a 22,050 Hz WAV."""
    out = tmp_path / "said.wav"
    done = subprocess.run(
        [sys.executable, "-m", "streamdec.cli", "say", "What time is it?", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "saying: What time is it?" in done.stdout
    assert 0.5 < _wav_seconds(out) < 5.0


@pytest.mark.parametrize(
    ("text", "error"),
    [("  ...  ", "EmptyTextError"), ("x" * 2001, "TextTooLongError")],
    ids=["empty", "too-long"],
)
def test_say_command_refuses_bad_text(tmp_path: Path, text: str, error: str) -> None:
    """Bad text exits 2 with the typed error's name and writes nothing."""
    out = tmp_path / "never.wav"
    done = subprocess.run(
        [sys.executable, "-m", "streamdec.cli", "say", text, str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and error in done.stderr
    assert not out.exists()
