"""Window planning: the fixed vectors of plan_tiles and the invariants of the stream planner."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.errors import ConfigError
from streamdec.planning import StreamPlanner, Window, default_window_sizes, emission_sizes, plan_tiles

# a codec's exact context (left, right) in frames, for the properties that draw one
CONTEXTS = {"left": st.integers(0, 60), "right": st.integers(0, 12)}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((1000, 512, 53, 9), [(0, 512, 0, 503), (450, 512, 503, 953), (488, 512, 953, 1000)]),
        ((600, 512, 53, 9, (128, 256, 512)), [(0, 512, 0, 503), (344, 256, 503, 600)]),
        ((512, 512, 53, 9), [(0, 512, 0, 512)]),
        ((7, 512, 53, 9), [(0, 7, 0, 7)]),
        ((0, 512, 53, 9), []),
    ],
    ids=["three-tiles", "shrunk-last", "exactly-one-tile", "short-clip", "empty"],
)
def test_plan_tiles_vectors(args: tuple, expected: list) -> None:
    """plan_tiles returns the windows the issue specifies."""
    assert plan_tiles(*args) == expected


def test_plan_tiles_last_window_shrinks_to_smallest_size() -> None:
    """The pinned last window takes the smallest size holding its frames plus left context."""
    assert plan_tiles(1000, 512, 53, 9, (128, 256, 512))[-1] == (872, 128, 953, 1000)


@pytest.mark.parametrize("tile", [62, 10, 0], ids=["equal", "smaller", "zero"])
def test_plan_tiles_rejects_tile_without_room(tile: int) -> None:
    """A tile no wider than left + right cannot emit anything: ConfigError with the numbers."""
    with pytest.raises(ConfigError, match="at least 63"):
        plan_tiles(1000, tile, 53, 9)


def _check_exact(windows: list[tuple[int, int, int, int]], frames: int, left: int, right: int) -> None:
    assert windows[0][2] == 0 and windows[-1][3] == frames
    for (ws, wf, es, ee), nxt in zip(windows, [*windows[1:], None], strict=True):
        assert 0 <= ws <= es < ee <= ws + wf <= frames
        assert es - ws >= left or ws == 0
        assert ws + wf - ee >= right or ws + wf == frames
        if nxt is not None:
            assert nxt[2] == ee


@settings(max_examples=300, deadline=None)
@given(
    frames=st.integers(1, 3000),
    **CONTEXTS,
    extra=st.integers(1, 600),
    sizes=st.lists(st.integers(1, 700), max_size=4),
)
def test_plan_tiles_every_frame_once_with_context(
    frames: int, left: int, right: int, extra: int, sizes: list[int]
) -> None:
    """For every geometry, windows cover each frame once, in order, each with its full context."""
    tile = left + right + extra
    _check_exact(plan_tiles(frames, tile, left, right, sizes), frames, left, right)


def test_emission_sizes_double_up_to_max() -> None:
    """The emission schedule starts at min_emit and doubles up to max_emit."""
    assert emission_sizes(4, 64) == (4, 8, 16, 32, 64)
    assert emission_sizes(3, 20) == (3, 6, 12, 20)
    assert default_window_sizes(52, 7, 8, 8) == (67,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_emit": 0, "max_emit": 4}, "min_emit"),
        ({"min_emit": 8, "max_emit": 4}, "min_emit"),
        ({"min_emit": 4, "max_emit": 64, "window_sizes": (70, 100)}, "at least 124"),
    ],
    ids=["zero-min", "min-above-max", "sizes-too-small"],
)
def test_stream_planner_rejects_bad_policy(kwargs: dict, match: str) -> None:
    """A policy that cannot work fails at construction with the numbers in the message."""
    with pytest.raises(ConfigError, match=match):
        StreamPlanner(53, 7, **kwargs)


def _run_planner(
    planner: StreamPlanner, arrivals: list[int], flushes: list[bool] | None = None
) -> tuple[list[tuple[Window, int, bool]], int]:
    """Feed arrival sizes (flushing after some), then end; returns (window, received, ended) and the total."""
    out, received = [], 0
    for i, n in enumerate(arrivals):
        received += n
        flush = bool(flushes and flushes[i % len(flushes)])
        while (w := planner.next_window(received, False, flush=flush)) is not None:
            out.append((w, received, False))
    while (w := planner.next_window(received, True)) is not None:
        out.append((w, received, True))
    assert planner.finished(received, True)
    return out, received


@settings(max_examples=400, deadline=None)
@given(
    **CONTEXTS,
    min_emit=st.integers(1, 16),
    grow=st.integers(0, 5),
    arrivals=st.lists(st.integers(0, 150), max_size=40),
    flushes=st.lists(st.booleans(), max_size=5),
)
def test_stream_planner_exactness_rule(
    left: int, right: int, min_emit: int, grow: int, arrivals: list[int], flushes: list[bool]
) -> None:
    """For every arrival pattern and flush: each frame emitted once, in order, with full context."""
    max_emit = min_emit << grow
    planner = StreamPlanner(left, right, min_emit=min_emit, max_emit=max_emit)
    planned, total = _run_planner(planner, arrivals, flushes)
    emitted = 0
    for w, received, ended in planned:
        assert w.emit_start == emitted and 0 < w.emit_frames <= max_emit
        emitted = w.emit_end
        # Left context is real latents, or the clip start.
        assert w.window_start >= 0 and (w.emit_offset >= left or w.window_start == 0)
        # Right context arrived before the window was planned, or the window ends at the true end.
        assert w.emit_end + right <= received or (ended and w.window_end == total)
        # Padding (frames not yet received) only beyond emit_end + right; never past the end of a clip.
        if w.window_end > received:
            assert not ended and w.window_start == 0
        assert w.window_frames in planner.window_sizes or (ended and w.window_end == total)
    assert emitted == total


@settings(max_examples=100, deadline=None)
@given(arrivals=st.lists(st.integers(1, 5), min_size=1, max_size=60))
def test_stream_planner_first_emission_is_small(arrivals: list[int]) -> None:
    """The first window is due as soon as min_emit frames have their right context."""
    planner = StreamPlanner(20, 3, min_emit=2, max_emit=32)
    received = 0
    for n in arrivals:
        received += n
        w = planner.next_window(received, False)
        if received >= 2 + 3:
            assert w is not None and w.emit_start == 0 and w.emit_frames == received - 3
            break
        assert w is None


def test_stream_planner_emissions_grow() -> None:
    """With frames arriving one at a time, emission sizes follow the doubling schedule."""
    planner = StreamPlanner(10, 2, min_emit=2, max_emit=16)
    sizes = []
    for received in range(1, 201):
        if (w := planner.next_window(received, False)) is not None:
            sizes.append(w.emit_frames)
    assert sizes[:6] == [2, 4, 8, 16, 16, 16]


def test_flush_emits_ready_frames_below_the_target() -> None:
    """flush=True emits what is ready now; without it the planner waits for the emission target."""
    planner = StreamPlanner(10, 2, min_emit=4, max_emit=16)
    assert planner.next_window(3, False) is None  # 1 frame ready, target 4
    w = planner.next_window(3, False, flush=True)
    assert w is not None and (w.emit_start, w.emit_end) == (0, 1)
    assert planner.next_window(3, False, flush=True) is None  # nothing ready: flush cannot help
