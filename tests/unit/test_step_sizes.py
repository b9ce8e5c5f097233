"""How many pending frames a stateful step takes: a chunk's worth, or the largest step once that many wait."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamdec.session import StatefulSession, StepPolicy

D, HOP, RIGHT = 8, 4, 3


def _primed(chunk: int, min_step: int = 4, max_step: int = 16) -> StatefulSession:
    """A session fed and primed with ``chunk``-frame chunks, every frame handed to a call."""
    policy = StepPolicy.default(right_frames=RIGHT, min_prime=RIGHT + 1, min_step=min_step, max_step=max_step)
    session = StatefulSession(policy, latent_dim=D, hop_size=HOP, pad_latent=torch.zeros(D))
    while not session.primed:
        session.feed(np.zeros((chunk, D), np.float32))
        job = session.next_job()
        if job is not None:
            assert job.kind == "prime"
    while (job := session.next_job()) is not None:  # what the prime left behind
        assert job.kind == "step"
    return session


def _steps_for(session: StatefulSession, chunks: int, chunk: int) -> list[int]:
    """Feed ``chunks`` chunks at once (a stream that fell behind), then the steps it cuts."""
    for _ in range(chunks):
        session.feed(np.zeros((chunk, D), np.float32))
    steps = []
    while (job := session.next_job()) is not None:
        assert job.kind == "step"
        steps.append(job.emit_frames)
    return steps


@pytest.mark.parametrize(
    ("chunk", "behind", "steps"),
    [
        (4, 1, [4]),
        (4, 2, [4, 4]),  # one chunk behind: the size every real-time stream steps with, not one 8
        (4, 3, [4, 4, 4]),
        (4, 4, [16]),  # a largest step's worth: one call
        (4, 5, [16, 4]),
        (8, 1, [8]),
        (8, 2, [16]),
        (2, 2, [4]),  # chunks below the smallest step: the smallest step
        (16, 1, [16]),
    ],
)
def test_a_stream_behind_steps_by_chunk_until_a_largest_step_waits(
    chunk: int, behind: int, steps: list[int]
) -> None:
    assert _steps_for(_primed(chunk), behind, chunk) == steps


@given(chunk=st.integers(1, 20), behind=st.integers(1, 12))
def test_steps_take_every_frame_once_in_order_and_at_most_the_largest(chunk: int, behind: int) -> None:
    """Whatever the chunk size and backlog: the steps cover the fed frames exactly, each a step size, none
    larger than the largest, and what is left is less than the smallest step worth a call."""
    session = _primed(chunk)
    before = session.fed
    steps = _steps_for(session, behind, chunk)
    assert all(s in session.policy.step_sizes and s <= 16 for s in steps)
    assert before + sum(steps) == session.fed
    assert session.received - session.fed < session.policy.min_step


def test_a_flush_takes_the_frames_below_the_smallest_step() -> None:
    """The listener about to run dry: the pending frames go out although fewer than min_step."""
    session = _primed(4)
    session.feed(np.zeros((2, D), np.float32))
    assert session.next_job() is None
    job = session.next_job(flush=True)
    assert job is not None and job.emit_frames == 2
