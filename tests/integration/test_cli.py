"""The installed `streamdec` command, run as users run it: from another directory, in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

BIN = Path(sys.executable).with_name("streamdec")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], cwd=cwd, capture_output=True, text=True, timeout=240)


def test_info_prints_geometry_and_context(tmp_path: Path) -> None:
    """`streamdec info` prints the codec's geometry and exact context from any directory."""
    result = _run("info", "--codec", "tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "hop_size: 480" in result.stdout
    assert "context: left=52 right=7" in result.stdout


def test_info_prints_the_state_a_stateful_stream_keeps(tmp_path: Path) -> None:
    """`streamdec info` states one stream's device state, the same at every precision, and 512 streams' worth."""
    from streamdec.codecs.registry import build_preset
    from streamdec.codecs.stateful import StatefulNet

    per_stream = StatefulNet(build_preset("tiny")).state_bytes()
    result = _run("info", "--codec", "tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(row for row in result.stdout.splitlines() if "stream state:" in row)
    assert f"{per_stream / 1e3:.1f} kB a stream in float32 at every precision (fp32, tf32x3, fp16x3" in line
    assert f"{512 * per_stream / 2**30:.2f} GiB for 512 streams" in line
    half = _run("info", "--codec", "tiny", "--dtype", "float16", cwd=tmp_path)
    assert f"{per_stream / 2e3:.1f} kB a stream in float16;" in half.stdout, half.stderr


def test_decode_writes_wav_of_exact_length(tmp_path: Path) -> None:
    """`streamdec decode` turns a .npy latent file into a WAV of frames * hop samples."""
    np.save(tmp_path / "clip.npy", np.random.default_rng(0).standard_normal((90, 64)).astype(np.float32))
    result = _run("decode", "clip.npy", "clip.wav", "--codec", "tiny", "--max-emit", "32", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with wave.open(str(tmp_path / "clip.wav")) as wav:
        assert (wav.getnframes(), wav.getframerate(), wav.getnchannels()) == (90 * 480, 24000, 1)


@pytest.mark.parametrize("name", ["server", "clients"])
def test_no_generic_top_level_modules_installed(tmp_path: Path, name: str) -> None:
    """`server` and `clients` install under the streamdec namespace only."""
    code = f"import importlib.util as u; print(u.find_spec({name!r}) is None, u.find_spec('streamdec.{name}') is not None)"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.stdout.split() == ["True", "True"], result.stderr


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    """A latent file of the wrong shape exits 2 naming the file, its shape and the codec's width."""
    np.save(tmp_path / "bad.npy", np.zeros((10, 3), np.float32))
    result = _run("decode", "bad.npy", "bad.wav", "--codec", "tiny", cwd=tmp_path)
    assert result.returncode == 2
    assert "bad.npy holds latents of shape (10, 3)" in result.stderr and "[frames, 64]" in result.stderr


def test_unknown_arguments_are_refused(tmp_path: Path) -> None:
    """A subcommand given an argument it does not take exits 2 naming it."""
    result = _run("info", "--codec", "tiny", "--bogus", cwd=tmp_path)
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr
