"""--event-loop: auto takes uvloop only where it is installed, asyncio never does, and asking for a
missing uvloop is refused with how to get it; the server names the loop it runs on."""

from __future__ import annotations

import importlib.util

import anyio
import pytest

from streamdec.errors import ConfigError
from streamdec.server import eventloop
from streamdec.server.eventloop import backend_options, running_loop_name

_HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        eventloop.importlib.util, "find_spec", lambda name: None if name == "uvloop" else real(name)
    )


def test_asyncio_is_asyncios_own_loop() -> None:
    assert backend_options("asyncio") == {}


def test_auto_takes_uvloop_where_it_is_installed() -> None:
    assert backend_options("auto") == ({"use_uvloop": True} if _HAS_UVLOOP else {})


def test_auto_without_uvloop_is_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    assert backend_options("auto") == {}


def test_asking_for_a_missing_uvloop_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    with pytest.raises(ConfigError, match=r"streamdec\[fast\]"):
        backend_options("uvloop")


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ConfigError, match="auto, asyncio, uvloop"):
        backend_options("trio")  # type: ignore[arg-type]


def test_the_running_loop_is_named() -> None:
    async def name() -> str:
        return running_loop_name()

    assert anyio.run(name) == "asyncio"
    if _HAS_UVLOOP:
        assert anyio.run(name, backend_options={"use_uvloop": True}) == "uvloop"
