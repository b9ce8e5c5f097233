"""Helpers for the browser tests (no tests here): a `streamdec serve` process and a headless Chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


def browser_or_skip() -> Any:
    """Playwright's sync API, or a skip that says what is missing and how to get it."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(
            "playwright is not installed: pip install -e '.[browser-test]' (never `playwright install`)"
        )
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    return sync_playwright


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """A `streamdec serve --codec tiny` process on a known port (restartable on the same port)."""

    port: int
    token: str | None = None
    extra: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "streamdec", "serve", "--codec", "tiny", "--device", "cpu",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-streams-total", "4", "--grace", "1", *self.extra]  # fmt: skip
        if self.token:
            cmd += ["--token", self.token]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STREAMDEC_TOKEN", None)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "ws://" in line:
                return
        raise AssertionError(f"streamdec serve exited with {self.proc.wait()}: {''.join(self.lines)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.lines.append(out)
        self.proc = None

    def metric(self, name: str) -> float:
        """One sample of /metrics, named with its labels as the text shows them (``a{b="c"}``)."""
        url = f"{self.base}/metrics" + (f"?token={self.token}" if self.token else "")
        with urllib.request.urlopen(url, timeout=10) as reply:  # loopback; no proxy involved
            text = reply.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics:\n{text}")


@contextlib.contextmanager
def serving(*extra: str, token: str | None = None) -> Iterator[Served]:
    served = Served(free_port(), token, list(extra))
    served.start()
    try:
        yield served
    finally:
        served.stop()


@contextlib.contextmanager
def chromium(sync_playwright: Any) -> Iterator[Any]:
    """A headless Chromium (Debian's), launched with the flags that work offline and without a GPU."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Page:
    """A page of the browser and the script errors it raised (a test fails on any)."""

    page: Any
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def new_page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 900, "height": 640})
    page = Page(context.new_page())
    page.page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
