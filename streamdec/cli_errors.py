"""What the ``streamdec`` command says when a user's request cannot be done.

Every mistake a user can make at the command line (a missing file, a busy port, a bad URL, a shape the
codec does not take) ends in one line on stderr that says what is wrong and what to do, and exit code
2; ``--debug`` adds the traceback. Anything not recognised here is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from .errors import ServerError, StreamdecError

__all__ = ["UsageError", "check_output_path", "describe", "leaves"]

if sys.version_info >= (3, 11):
    _Group = BaseExceptionGroup  # noqa: F821 - a builtin from 3.11 on
else:  # pragma: no cover - anyio depends on the backport before 3.11
    from exceptiongroup import BaseExceptionGroup as _Group

#: output formats by file extension; only WAV is written today
OUTPUT_FORMATS = (".wav",)


class UsageError(StreamdecError):
    """A command-line request that cannot be done as given; the message says what to do instead."""


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Refuse an output name whose extension promises a format streamdec does not write."""
    out = Path(path)
    if out.suffix.lower() not in OUTPUT_FORMATS:
        raise UsageError(
            f"{out}: streamdec writes WAV only ({out.suffix or 'no extension'} was asked for); "
            f"name the output {out.with_suffix('.wav').name} and convert it afterwards (e.g. with ffmpeg)"
        )
    return out


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, in order; ``exc`` itself if it is not one."""
    if isinstance(exc, _Group):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def describe(exc: BaseException) -> str | None:
    """One line for a user's mistake, or None for an exception that is a bug (keep its traceback)."""
    found = [d for d in map(_describe_one, leaves(exc)) if d is not None]
    return found[0] if found else None


def _describe_one(exc: BaseException) -> str | None:
    if isinstance(exc, ServerError):
        where = f" (stream {exc.stream})" if exc.stream is not None else ""
        return f"the server refused the request{where}: {exc.code}: {exc}"
    if isinstance(exc, UsageError):
        return str(exc)
    if isinstance(exc, StreamdecError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        return _describe_os_error(exc)
    return None


def _describe_os_error(exc: OSError) -> str | None:
    name = exc.filename
    if isinstance(exc, FileNotFoundError) and name is not None:
        return f"{name}: no such file or directory; check the path"
    if isinstance(exc, IsADirectoryError) and name is not None:
        return f"{name} is a directory; give a file"
    if isinstance(exc, PermissionError) and name is not None:
        return f"{name}: permission denied; pick a path you can read or write"
    if exc.errno == errno.EADDRINUSE:
        return (
            "the address is already in use (another server?); pick another --port, or --port 0 for a free one"
        )
    return None
