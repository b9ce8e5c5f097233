"""Which exceptions the command line treats as a user's mistake, and the line it prints for each."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from streamdec.cli_errors import UsageError, check_output_path, describe
from streamdec.errors import ServerError, ShapeError


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        (FileNotFoundError(errno.ENOENT, "No such file", "clip.npy"), "clip.npy: no such file"),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x.wav"), "permission denied"),
        (OSError(errno.EADDRINUSE, "address already in use"), "--port 0"),
        (ShapeError("latents must be [T, 64]"), "ShapeError: latents must be [T, 64]"),
        (ServerError("non_finite", "NaN in chunk", stream=3), "(stream 3): non_finite: NaN in chunk"),
        (UsageError("do this instead"), "do this instead"),
    ],
    ids=["missing-file", "permission", "port-in-use", "input-error", "server-error", "usage"],
)
def test_user_mistakes_get_one_line(exc: BaseException, needle: str) -> None:
    """Each mistake maps to one line holding what is wrong."""
    line = describe(exc)
    assert line is not None and needle in line and "\n" not in line


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("x"), OSError(errno.EIO, "io")], ids=str)
def test_bugs_keep_their_traceback(exc: BaseException) -> None:
    """An exception that is not a user's mistake is not described (the CLI re-raises it)."""
    assert describe(exc) is None


def test_the_first_mistake_inside_an_exception_group_is_described() -> None:
    """Task groups wrap errors; the line comes from the mistake inside, whatever else was raised."""
    group = ExceptionGroup("tasks", [RuntimeError("cancelled sibling"), UsageError("the real cause")])  # noqa: F821
    assert describe(group) == "the real cause"


@pytest.mark.parametrize("name", ["out.wav", "OUT.WAV", "dir/clip.wav"])
def test_wav_output_is_accepted(name: str) -> None:
    assert check_output_path(name) == Path(name)


@pytest.mark.parametrize("name", ["out.mp3", "out.ogg", "out"])
def test_other_outputs_are_refused_with_the_wav_name(name: str) -> None:
    with pytest.raises(UsageError, match=r"WAV only.*out\.wav"):
        check_output_path(name)
