"""The client's bounded retry: full-jitter backoff, the server's retry_after_ms, what is retried."""

from __future__ import annotations

import random
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response

from streamdec.clients import RetryPolicy, open_stream_retrying, retryable
from streamdec.errors import ConfigError, ServerError


@given(
    attempt=st.integers(0, 30),
    retry_after_ms=st.none() | st.integers(0, 10_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_delay_is_full_jitter_capped_and_never_below_retry_after(
    attempt: int, retry_after_ms: int | None, seed: int
) -> None:
    """A wait lies in [0, min(cap, base * 2**k)], raised to the server's retry_after_ms when it is larger."""
    policy = RetryPolicy(attempts=5, base=0.1, cap=2.0)
    wait = policy.delay(attempt, retry_after_ms, random.Random(seed))
    floor = (retry_after_ms or 0) / 1000
    assert floor <= wait <= max(floor, min(2.0, 0.1 * 2**attempt))


def test_jitter_spreads_waits() -> None:
    """Clients refused together do not come back together: waits of one step differ."""
    policy, rng = RetryPolicy(base=1.0, cap=1.0), random.Random(7)
    waits = {round(policy.delay(0, None, rng), 6) for _ in range(50)}
    assert len(waits) == 50


def _status(code: int) -> InvalidStatus:
    return InvalidStatus(Response(code, "x", Headers()))


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ServerError("over_capacity", "full", retry_after_ms=100), True),
        (ServerError("overloaded", "too many connections"), True),
        (ServerError("shutting_down", "draining"), True),
        (ServerError("unauthorized", "token"), False),
        (ServerError("bad_message", "oops"), False),
        (ConnectionRefusedError(), True),
        (ConnectionResetError(), True),
        (_status(503), True),
        (_status(502), True),
        (_status(401), False),
        (_status(404), False),
        (ValueError("bad dtype"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_what_is_retried(exc: BaseException, expected: bool) -> None:
    """Capacity, shutdown and transport failures are retried; the client's own mistakes are not."""
    assert retryable(exc) is expected


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 0}, {"base": 0.0}, {"base": 1.0, "cap": 0.5}], ids=["attempts", "base", "cap"]
)
def test_bad_policy_is_refused(kwargs: dict[str, float]) -> None:
    """A policy that could not retry sensibly is a ConfigError."""
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_retries_are_bounded_then_the_last_error_is_raised() -> None:
    """Nothing listens: `attempts` connection tries, `attempts - 1` backoff waits, then the refusal."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    policy = RetryPolicy(attempts=4, base=0.5, cap=1.0)
    url = f"ws://127.0.0.1:{_closed_port()}/v1/stream"
    with pytest.raises(OSError):
        async with open_stream_retrying(url, retry=policy, sleep=sleep, rng=random.Random(1)):
            pass
    assert len(waits) == 3
    assert all(0 <= w <= min(1.0, 0.5 * 2**k) for k, w in enumerate(waits))
