"""The flush policy of the sans-I/O session: when ready frames go out, as a pure function of the clock."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamdec.errors import ConfigError
from streamdec.planning import StreamPlanner
from streamdec.session import (
    FLUSH_MARGIN_S,
    MIN_PULL_WAIT_S,
    FlushPolicy,
    StatefulSession,
    StepPolicy,
    StreamSession,
)

D = 4
HOP, RATE = 100, 1000  # one frame is 0.1 s of audio

seconds = st.floats(0.0, 1e4, allow_nan=False)
durations = st.floats(0.0, 10.0, allow_nan=False)


def _halo(policy: FlushPolicy | None = None) -> StreamSession:
    planner = StreamPlanner(3, 2, min_emit=4, max_emit=8)
    return StreamSession(
        planner, latent_dim=D, hop_size=HOP, pad_latent=torch.zeros(D), flush_policy=policy, sample_rate=RATE
    )


def _stateful() -> StatefulSession:
    policy = StepPolicy.default(right_frames=2, min_prime=3, min_step=4, max_step=8)
    return StatefulSession(policy, latent_dim=D, hop_size=HOP, pad_latent=torch.zeros(D), sample_rate=RATE)


@given(now=seconds, deadline=seconds, decode=st.none() | durations)
def test_the_wait_never_runs_past_the_flush_time_nor_below_the_floor(
    now: float, deadline: float, decode: float | None
) -> None:
    """For all clocks, deadlines and decode times: flush at deadline - decode - margin, never sooner than the floor."""
    policy = FlushPolicy()
    wait = policy.wait(now, deadline, decode)
    flush_at = deadline - (decode or 0.0) - FLUSH_MARGIN_S
    assert wait >= MIN_PULL_WAIT_S
    assert now + wait <= max(flush_at, now + MIN_PULL_WAIT_S) + 1e-9


@given(now=seconds, deadline=seconds, a=durations, b=durations, later=durations)
def test_a_slower_decode_or_a_later_clock_never_waits_longer(
    now: float, deadline: float, a: float, b: float, later: float
) -> None:
    """For all inputs: the wait is monotone, shorter for a larger decode estimate and for a later clock."""
    policy = FlushPolicy()
    fast, slow = sorted((a, b))
    assert policy.wait(now, deadline, slow) <= policy.wait(now, deadline, fast)
    assert policy.wait(now + later, deadline, fast) <= policy.wait(now, deadline, fast)


@given(samples=st.lists(durations, min_size=1, max_size=30), weight=st.floats(0.01, 1.0))
def test_the_decode_estimate_stays_within_the_samples(samples: list[float], weight: float) -> None:
    """For all sample sequences: the moving average lies between the smallest and largest sample."""
    policy = FlushPolicy(smoothing=weight)
    estimate = None
    for sample in samples:
        estimate = policy.smoothed(estimate, sample)
    assert estimate is not None
    assert min(samples) - 1e-9 <= estimate <= max(samples) + 1e-9
    assert policy.smoothed(None, samples[0]) == samples[0]


@given(first=seconds, played=durations, now=seconds, prebuffer=st.floats(0.0, 2.0))
def test_the_deadline_is_first_audio_plus_prebuffer_plus_audio_sent(
    first: float, played: float, now: float, prebuffer: float
) -> None:
    policy = FlushPolicy(prebuffer_s=prebuffer)
    # before the first tile the listener already waits: the first call is due shortly
    assert policy.deadline(None, played, now) == now + policy.first_call_s
    assert policy.deadline(first, played, now) == first + prebuffer + played


@pytest.mark.parametrize("make", [_halo, _stateful], ids=["halo", "stateful"])
def test_nothing_is_flushed_before_the_first_tile_or_with_nothing_ready(make: object) -> None:
    session = make()  # type: ignore[operator]
    assert session.flush_wait(5.0) is None  # nothing received
    session.feed(torch.zeros(9, D))
    assert session.flush_wait(5.0) is None  # frames ready, but no listener yet: the schedule rules


def test_a_session_flushes_ahead_of_its_listener_running_dry() -> None:
    """After a tile of 4 frames (0.4 s) at t=10 with a 0.1 s prebuffer, a 0.05 s decode: flush by t=10.41."""
    session = _halo()
    session.feed(torch.zeros(6, D))  # 4 emitted + 2 right context
    job = session.next_job()
    assert job is not None and job.window.emit_frames == 4
    session.complete(job, torch.zeros(1, 4 * HOP))
    session.first_audio(10.0)
    session.decoded(0.05)
    session.feed(torch.zeros(1, D))  # one more frame is ready: below the emission target of 4
    assert session.deadline(10.2) == pytest.approx(10.5)
    assert session.flush_wait(10.2) == pytest.approx(10.5 - 0.05 - FLUSH_MARGIN_S - 10.2)
    assert session.flush_wait(10.49) == MIN_PULL_WAIT_S
    flushed = session.next_job(flush=True)
    assert flushed is not None and flushed.window.emit_frames == 1


def test_deadlines_need_the_sample_rate() -> None:
    planner = StreamPlanner(3, 2, min_emit=4, max_emit=8)
    session = StreamSession(planner, latent_dim=D, hop_size=HOP, pad_latent=torch.zeros(D))
    with pytest.raises(ConfigError, match="sample_rate"):
        session.deadline(0.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("prebuffer_s", -0.1), ("margin_s", float("nan")), ("min_wait_s", float("inf")), ("smoothing", 0.0)],
)
def test_a_bad_policy_is_a_config_error_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        FlushPolicy(**{field: value})
