"""Every user mistake the `streamdec` command can meet ends in exit code 2 and one line on stderr that
says what is wrong and what to do, without a traceback; `--debug` shows the traceback.

Each case runs the installed command in a subprocess, as a user would, against a real `streamdec serve`
on a free port where a server is needed.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from streamdec.affinity import available_cpus, format_cpus

BIN = Path(sys.executable).with_name("streamdec")
TOKEN = "let-me-in"


def _run(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _assert_one_line_mistake(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, no traceback, a single stderr line naming the command and holding every needle."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamdec "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a good latent file, one of the wrong width and one holding a NaN."""
    folder = tmp_path_factory.mktemp("latents")
    rng = np.random.default_rng(0)
    np.save(folder / "good.npy", rng.standard_normal((30, 64)).astype(np.float32))
    np.save(folder / "narrow.npy", rng.standard_normal((30, 32)).astype(np.float32))
    nan = rng.standard_normal((30, 64)).astype(np.float32)
    nan[17, 5] = np.nan
    np.save(folder / "nan.npy", nan)
    return folder


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `streamdec serve` (tiny codec, token required) on a free port; yields its stream URL."""
    cwd = tmp_path_factory.mktemp("server")
    # A known capacity: these tests are about the client's messages, and tiny may be slower than real
    # time on this machine (the warm-up probe would then refuse every stream).
    cmd = [str(BIN), "serve", "--codec", "tiny", "--port", "0", "--token", TOKEN, "--max-emit", "16",
           "--max-streams-total", "4"]  # fmt: skip
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            found = re.search(r"ws://\S+/v1/stream", line)
            if found:
                url = found.group(0)
                break
        assert url is not None, f"server exited with {proc.wait()} before printing its URL"
        try:
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=60)


# -- no server needed ----------------------------------------------------------------------------------


def test_missing_latent_file(files: Path) -> None:
    """A latent file that does not exist is named."""
    result = _run("decode", "nowhere.npy", "out.wav", cwd=files)
    _assert_one_line_mistake(result, "streamdec decode:", "nowhere.npy", "no such file", "check the path")


def test_decode_names_the_file_and_its_shape(files: Path) -> None:
    """Latents of the wrong width: the message names the file, its shape and the codec's width."""
    result = _run("decode", "narrow.npy", "out.wav", "--codec", "tiny", cwd=files)
    _assert_one_line_mistake(result, "narrow.npy", "(30, 32)", "[frames, 64]", "--codec")


def test_decode_refuses_non_finite_latents_naming_the_frame(files: Path) -> None:
    """A NaN in the file is refused before decoding, with the frame that holds it."""
    result = _run("decode", "nan.npy", "out.wav", cwd=files)
    _assert_one_line_mistake(result, "nan.npy", "NaN", "frame 17")


@pytest.mark.parametrize("name", ["out.mp3", "out.flac", "out"])
def test_output_that_is_not_wav_is_refused(files: Path, name: str) -> None:
    """An output name promising another format is refused before any work, suggesting the .wav name."""
    result = _run("decode", "good.npy", name, cwd=files)
    _assert_one_line_mistake(result, "WAV only", "out.wav")
    assert not (files / name).exists()


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_cuda_device_on_a_cpu_build(files: Path) -> None:
    """`--device cuda` on a CPU torch says so and what to do."""
    result = _run("info", "--device", "cuda", cwd=files)
    _assert_one_line_mistake(result, "--device cuda", "CPU build", "--device cpu")


def test_debug_shows_the_traceback(files: Path) -> None:
    """`--debug` (before or after the command) prints the traceback as well as the line; still exit 2."""
    for args in (
        ("--debug", "decode", "nowhere.npy", "out.wav"),
        ("decode", "nowhere.npy", "out.wav", "--debug"),
    ):
        result = _run(*args, cwd=files)
        assert result.returncode == 2
        assert "Traceback" in result.stderr and "FileNotFoundError" in result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith("streamdec decode: nowhere.npy")


def test_port_in_use(files: Path) -> None:
    """`serve` on a port something else holds names the address and suggests another port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _run("serve", "--codec", "tiny", "--port", str(port), cwd=files)
    _assert_one_line_mistake(result, f"127.0.0.1:{port}", "in use", "--port 0")


def test_serve_refuses_cpus_it_may_not_use_before_loading_anything(files: Path) -> None:
    """`serve --cpus` naming a CPU this process may not run on fails at once, naming the ones it may."""
    result = _run("serve", "--codec", "tiny", "--port", "0", "--cpus", "100000", cwd=files, timeout=60)
    _assert_one_line_mistake(result, "CPUs 100000", "may run on")


def test_serve_refuses_an_edge_lane_where_there_are_no_primes_or_flushes(files: Path) -> None:
    """`serve --edge-lane on` in halo mode: halo windows have no primes or flushes to run beside them."""
    result = _run("serve", "--codec", "tiny", "--port", "0", "--mode", "halo", "--edge-lane", "on", cwd=files,
                  timeout=120)  # fmt: skip
    _assert_one_line_mistake(result, "--edge-lane on", "--mode stateful")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux")
def test_loadtest_refuses_server_cpus_that_leave_none_for_its_clients(files: Path) -> None:
    """`loadtest --server-cpus` naming every CPU it may use fails before starting anything."""
    every = format_cpus(available_cpus())
    result = _run("loadtest", "--engine", "simulated", "--server-cpus", every, "--streams", "2",
                  "--out", str(files / "never.json"), cwd=files, timeout=60)  # fmt: skip
    _assert_one_line_mistake(result, "--server-cpus", "no CPU is left")
    assert not (files / "never.json").exists()


def test_bad_url_scheme(files: Path) -> None:
    """An http:// URL is refused before connecting, with the URL form to use."""
    result = _run("stream", "good.npy", "out.wav", "--url", "http://127.0.0.1:8765/v1/stream", cwd=files)
    _assert_one_line_mistake(result, "not a websocket URL", "ws://HOST:PORT/v1/stream")


def test_nothing_listening(files: Path) -> None:
    """A URL where no server listens says so."""
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _run("stream", "good.npy", "out.wav", "--url", f"ws://127.0.0.1:{port}/v1/stream", cwd=files)
    _assert_one_line_mistake(result, "cannot connect", "streamdec serve")


def test_help_lists_every_command_and_preset(files: Path) -> None:
    """`streamdec --help` names every command; `--codec` help names every registered preset."""
    from streamdec.codecs.registry import PRESETS

    top = _run("--help", cwd=files)
    assert top.returncode == 0
    for command in ("info", "decode", "convert", "serve", "stream", "bench"):
        assert re.search(rf"^\s+{command}\s", top.stdout, flags=re.M), (command, top.stdout)
    info = _run("info", "--help", cwd=files)
    flat = " ".join(info.stdout.split())
    for preset in PRESETS:
        assert preset in flat, preset


def test_version_and_module_entry_point(files: Path) -> None:
    """`streamdec --version` and `python -m streamdec --version` print the package version."""
    import streamdec

    for cmd in ([str(BIN), "--version"], [sys.executable, "-m", "streamdec", "--version"]):
        result = subprocess.run(cmd, cwd=files, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"streamdec {streamdec.__version__}"


# -- against a running server ----------------------------------------------------------------------------


def test_missing_token(files: Path, server_url: str) -> None:
    """A server that wants a token: the client says to pass --token."""
    result = _run("stream", "good.npy", "out.wav", "--url", server_url, cwd=files)
    _assert_one_line_mistake(result, "requires a token", "--token", "STREAMDEC_TOKEN")


def test_wrong_token(files: Path, server_url: str) -> None:
    """A wrong token is told apart from a missing one."""
    result = _run("stream", "good.npy", "out.wav", "--url", server_url, "--token", "nope", cwd=files)
    _assert_one_line_mistake(result, "refused the token")


def test_path_not_found(files: Path, server_url: str) -> None:
    """A URL with the wrong path names the stream endpoint."""
    url = server_url.replace("/v1/stream", "/v2/stream")
    result = _run("stream", "good.npy", "out.wav", "--url", url, "--token", TOKEN, cwd=files)
    _assert_one_line_mistake(result, "404", "/v2/stream", "/v1/stream")


def test_stream_of_the_wrong_latent_size(files: Path, server_url: str) -> None:
    """Latents the server's codec does not take are refused before sending, naming the file and shape."""
    result = _run("stream", "narrow.npy", "out.wav", "--url", server_url, "--token", TOKEN, cwd=files)
    _assert_one_line_mistake(result, "narrow.npy", "(30, 32)", "[frames, 64]")


def test_stream_with_nan_surfaces_the_servers_code(files: Path, server_url: str) -> None:
    """A NaN reaches the server, whose first error (non_finite) is what the user sees, not an echo."""
    result = _run("stream", "nan.npy", "out.wav", "--url", server_url, "--token", TOKEN, cwd=files)
    line = _assert_one_line_mistake(result, "non_finite", "NaN")
    assert "unknown_stream" not in line


def test_stream_works_with_the_token(files: Path, server_url: str) -> None:
    """The same server streams a good file, and the figures say what they mean."""
    result = _run("stream", "good.npy", "ok.wav", "--url", server_url, "--token", TOKEN, cwd=files)
    assert result.returncode == 0, result.stderr
    assert "time to first audio" in result.stdout and "underruns" in result.stdout
    assert (files / "ok.wav").exists()
