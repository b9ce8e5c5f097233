"""Which event loop ``streamdec serve`` runs on: uvloop where it is installed (the ``fast`` extra), else
asyncio's own.

Every message of every stream passes through the loop's socket transport and its callback queue twice
(its latents in, its audio out); uvloop does both in C where asyncio does them in Python, which lowers the
server's CPU per stream-second (docs/serving-capacity.md). The server's own code is the same on either.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Literal

from streamdec.errors import ConfigError

__all__ = ["EVENT_LOOPS", "EventLoop", "backend_options", "running_loop_name"]

EventLoop = Literal["auto", "asyncio", "uvloop"]
#: ``--event-loop`` choices; auto: uvloop when it can be imported, else asyncio
EVENT_LOOPS: tuple[EventLoop, ...] = ("auto", "asyncio", "uvloop")


def backend_options(choice: EventLoop) -> dict[str, Any]:
    """``anyio.run``'s backend options for ``choice``; ConfigError when uvloop is asked for and missing."""
    if choice not in EVENT_LOOPS:
        raise ConfigError(f"event loop {choice!r}: pick one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return {}
    if importlib.util.find_spec("uvloop") is not None:
        return {"use_uvloop": True}
    if choice == "uvloop":
        raise ConfigError(
            "--event-loop uvloop: uvloop is not installed; pip install 'streamdec[fast]' (or use "
            "--event-loop asyncio)"
        )
    return {}


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop this coroutine runs on."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
