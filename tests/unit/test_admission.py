"""Admission by capacity and the per-client guards, as pure rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdec.errors import ConfigError
from streamdec.server.admission import AdmissionController, Load, realtime_streams
from streamdec.server.guards import ErrorBudget, origin_allowed, token_offered


@pytest.mark.parametrize(
    ("audio", "wall", "safety", "streams"),
    [(10.0, 1.0, 0.5, 5), (10.0, 1.0, 1.0, 10), (1.0, 4.0, 0.5, 0), (2.9, 1.0, 0.5, 1), (2.9, 1.0, 1.0, 2)],
    ids=["10x-half", "10x-full", "slower-than-real-time-none", "below-two-one", "floored"],
)
def test_realtime_streams_is_throughput_times_safety(
    audio: float, wall: float, safety: float, streams: int
) -> None:
    """Audio seconds decoded per wall second, times the safety factor, floored: 0 below one stream."""
    assert realtime_streams(audio, wall, safety) == streams


@pytest.mark.parametrize(("audio", "wall", "safety"), [(0, 1, 0.5), (1, 0, 0.5), (1, 1, 0), (1, 1, 1.5)])
def test_realtime_streams_refuses_meaningless_figures(audio: float, wall: float, safety: float) -> None:
    """Zero durations or a safety factor outside (0, 1] are configuration errors."""
    with pytest.raises(ConfigError):
        realtime_streams(audio, wall, safety)


@pytest.mark.parametrize(
    ("measured", "override", "hard", "capacity", "source"),
    [
        (6, None, None, 6, "measured"),
        (6, 2, None, 2, "max_streams_total"),
        (2, 10, None, 10, "max_streams_total"),
        (6, 10, 4, 4, "max_streams_total"),
        (None, None, 3, 3, "unbounded"),
        (None, None, None, None, "unbounded"),
    ],
    ids=["measured", "override-lower", "override-higher", "decoder-bound-wins", "decoder-only", "nothing"],
)
def test_capacity_is_override_or_measured_never_past_the_decoder(
    measured: int | None, override: int | None, hard: int | None, capacity: int | None, source: str
) -> None:
    """--max-streams-total replaces the measurement; StreamDecoder.max_streams is never exceeded."""
    ctl = AdmissionController(measured=measured, override=override, hard_limit=hard)
    assert (ctl.capacity, ctl.source) == (capacity, source)


@given(st.integers(1, 64), st.integers(0, 100))
def test_admits_exactly_up_to_capacity(capacity: int, open_streams: int) -> None:
    """For every capacity and load: admitted iff fewer streams are open than the capacity."""
    ctl = AdmissionController(override=capacity, retry_after_ms=750)
    refusal = ctl.check(Load(open_streams))
    assert (refusal is None) == (open_streams < capacity)
    if refusal is not None:
        assert refusal.retry_after_ms == 750 and str(capacity) in refusal.reason


@given(st.integers(0, 100), st.integers(0, 1000), st.none() | st.integers(1, 64))
def test_a_measured_capacity_of_zero_refuses_every_stream(
    open_streams: int, queued: int, hard: int | None
) -> None:
    """An engine that cannot serve one real-time stream admits none, whatever the load, and says what
    the operator can do; --max-streams-total still overrides (best effort)."""
    ctl = AdmissionController(measured=0, hard_limit=hard, retry_after_ms=500)
    assert (ctl.capacity, ctl.source) == (0, "measured")
    refusal = ctl.check(Load(open_streams, queued))
    assert refusal is not None and refusal.retry_after_ms == 500
    assert "cannot serve one real-time stream" in refusal.reason and "--max-streams-total" in refusal.reason
    assert ctl.full(Load(open_streams, queued))
    forced = AdmissionController(measured=0, override=1)
    assert forced.check(Load(0)) is None and forced.check(Load(1)) is not None


def test_an_engine_that_is_behind_admits_nobody_new() -> None:
    """More windows queued than two per open stream: refused even below capacity."""
    ctl = AdmissionController(override=10)
    assert ctl.check(Load(open_streams=3, queued_windows=6)) is None
    refusal = ctl.check(Load(open_streams=3, queued_windows=7))
    assert refusal is not None and "behind" in refusal.reason


def test_error_budget_is_a_leaky_bucket() -> None:
    """budget errors at once pass, one more does not; after a pause at the refill rate, it recovers."""
    budget = ErrorBudget(3, refill=1.0)
    assert [budget.spend(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.spend(10.0)  # ten seconds later the bucket drained


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        (None, "127.0.0.1:8765", (), True),
        ("http://127.0.0.1:8765", "127.0.0.1:8765", (), True),
        ("https://tts.example.com", "tts.example.com", (), True),
        ("http://evil.example", "127.0.0.1:8765", (), False),
        ("http://127.0.0.1:9999", "127.0.0.1:8765", (), False),
        ("https://app.example.com", "127.0.0.1:8765", ("https://app.example.com",), True),
        ("HTTPS://APP.example.com", "127.0.0.1:8765", ("https://app.example.com/",), True),
        ("null", "127.0.0.1:8765", (), False),
        ("null", "127.0.0.1:8765", ("null",), True),
    ],
    ids=[
        "no-origin",
        "own-page",
        "own-page-https",
        "elsewhere",
        "other-port",
        "listed",
        "listed-case",
        "opaque",
        "opaque-listed",
    ],
)
def test_origin_allow_list(origin: str | None, host: str, allowed: tuple[str, ...], ok: bool) -> None:
    """No Origin, the server's own page and listed origins may connect; any other page may not."""
    assert origin_allowed(origin, host, allowed) is ok


@pytest.mark.parametrize(
    ("auth", "query", "ok"),
    [
        ("Bearer s3cret", "", True),
        ("bearer s3cret", "", True),
        ("BEARER  s3cret ", "", True),
        ("Basic s3cret", "", False),
        ("Bearer wrong", "", False),
        (None, "token=s3cret", True),
        (None, "token=wrong", False),
        (None, "", False),
    ],
    ids=["bearer", "lowercase-scheme", "uppercase-scheme", "basic", "wrong", "query", "query-wrong", "none"],
)
def test_token_offered(auth: str | None, query: str, ok: bool) -> None:
    """The Bearer scheme is case-insensitive (RFC 7235); the query parameter works for browsers."""
    assert token_offered("s3cret", auth, query) is ok
