"""The sans-I/O session: windows carry the right latents, padding, and bounded memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from streamdec.errors import ConfigError, NonFiniteError, ShapeError
from streamdec.planning import StreamPlanner
from streamdec.session import StreamSession, all_finite

D = 4


def _session(
    left: int = 5, right: int = 2, min_emit: int = 1, max_emit: int = 4, **options: Any
) -> StreamSession:
    planner = StreamPlanner(left, right, min_emit=min_emit, max_emit=max_emit)
    return StreamSession(planner, latent_dim=D, hop_size=3, pad_latent=torch.full((D,), -7.0), **options)


def _ramp(start: int, n: int) -> torch.Tensor:
    """Latents whose value is their frame index: a window's content shows where it was cut from."""
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].expand(n, D).clone()


def test_window_holds_real_latents_then_padding() -> None:
    """At the stream start a window is padded with pad_latent, only beyond emit_end + right."""
    session = _session()
    session.feed(_ramp(0, 3))
    job = session.next_job()
    assert job is not None
    w = job.window
    assert (w.window_start, w.emit_start, w.emit_end) == (0, 0, 1)
    assert torch.equal(job.latents[:3, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert (job.latents[3:] == -7.0).all() and w.window_frames > 3


def test_window_extends_left_into_real_latents() -> None:
    """Later windows reach back into earlier latents to fill their size; no padding."""
    session = _session()
    session.feed(_ramp(0, 40))
    jobs = []
    while (job := session.next_job()) is not None:
        jobs.append(job)
    for job in jobs[1:]:
        w = job.window
        assert torch.equal(job.latents[:, 0], torch.arange(w.window_start, w.window_end, dtype=torch.float32))


def test_memory_stays_bounded_over_a_long_stream() -> None:
    """Only the latents a future window can reach are kept, however long the stream runs."""
    session = _session(max_emit=4)
    peak = 0
    for i in range(2000):
        session.feed(_ramp(i, 1))
        while (job := session.next_job()) is not None:
            session.complete(job, torch.zeros(1, job.window.emit_frames * 3))
        peak = max(peak, int(session.snapshot()["buffered"]))
    assert peak <= session.planner.history_frames + session.planner.right + 4 + 1


def test_complete_checks_length_and_order() -> None:
    """A wrong audio length or an out-of-order completion is refused."""
    session = _session()
    session.feed(_ramp(0, 30))
    first, second = session.next_job(), session.next_job()
    assert first is not None and second is not None
    with pytest.raises(ShapeError, match="expected"):
        session.complete(first, torch.zeros(1, 5))
    with pytest.raises(ConfigError, match="out of order"):
        session.complete(second, torch.zeros(1, second.window.emit_frames * 3))
    tile = session.complete(first, torch.zeros(1, first.window.emit_frames * 3))
    assert (tile.start_frame, tile.start_sample) == (0, 0)


def test_pad_latent_shape_checked() -> None:
    """A pad latent of the wrong size is a configuration error."""
    with pytest.raises(ConfigError, match="pad_latent"):
        StreamSession(
            StreamPlanner(1, 1, min_emit=1, max_emit=1), latent_dim=D, hop_size=3, pad_latent=torch.zeros(3)
        )


@pytest.mark.parametrize("kind", ["tensor", "array"])
def test_a_fed_chunk_is_copied_not_kept(kind: str) -> None:
    """Changing a chunk after feeding it changes nothing: the session buffers its own copy."""
    session = _session(min_emit=4)
    chunk = _ramp(0, 3)
    source = chunk if kind == "tensor" else chunk.numpy()
    session.feed(source)
    source[:] = 99.0
    session.feed(_ramp(3, 5))
    job = session.next_job()
    assert job is not None
    assert torch.equal(job.latents[:3, 0], torch.tensor([0.0, 1.0, 2.0]))
    job.latents.fill_(-1.0)  # and a job's latents are its own too
    again = session.next_job()
    assert again is None or not (again.latents == -1.0).any()


@pytest.mark.parametrize(
    "chunk",
    [torch.ones(2, D, dtype=torch.float64), torch.ones(1, 2, D, dtype=torch.bfloat16),
     torch.ones(2, D, requires_grad=True), torch.ones(D, 2).t()],
    ids=["float64", "bfloat16-batched", "requires-grad", "transposed"],
)  # fmt: skip
def test_any_float_tensor_is_taken_as_float32_values(chunk: torch.Tensor) -> None:
    """Float tensors of any dtype, layout or autograd state are buffered as their float32 values."""
    session = _session()
    assert session.feed(chunk) == 2
    assert session.snapshot()["buffered"] == 2


def test_non_finite_latents_are_refused_unless_allowed_or_checked_already() -> None:
    """feed scans for NaN and Inf by default; allow_non_finite or latents_checked skips that scan."""
    chunk = torch.zeros(3, D)
    chunk[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="frame 1 of 3"):
        _session().feed(chunk)
    for options in ({"allow_non_finite": True}, {"latents_checked": True}):
        session = _session(**options)
        assert session.feed(chunk) == 3, options
        assert session.snapshot()["buffered"] == 3


@pytest.mark.parametrize(
    ("values", "finite"),
    [([1.0, -2.0], True), ([], True), ([1.0, float("nan")], False), ([float("inf"), 1.0], False),
     ([float("inf"), float("-inf")], False), ([3e38, 3e38, -3e38], True)],
)  # fmt: skip
def test_all_finite_says_whether_every_element_is_even_when_the_sum_is_undefined(
    values: list[float], finite: bool
) -> None:
    # +Inf and -Inf sum to NaN, which numpy reports as an invalid value: the answer is still False, and
    # no warning escapes (this suite runs with warnings as errors)
    assert all_finite(np.array(values, dtype=np.float32)) is finite
