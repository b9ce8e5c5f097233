"""Where windows are planned: pure integer frame arithmetic, no torch, no I/O.

A decoder with receptive field ``(left, right)`` latent frames produces the exact whole-clip output for
frame ``f`` from any window that holds latents ``[f - left, f + right]`` (or reaches the clip's own edge).
So a window decodes more frames than it emits; the extra frames are its *halo*::

      window_start                                        window_start + window_frames
      |<-- left -->|<------- emitted frames ------->|<-- right -->|
                   emit_start                       emit_end

Two planners live here:

* :func:`plan_tiles` cuts a whole clip of known length into fixed-size windows (offline decode).
* :class:`StreamPlanner` plans windows over a stream whose length is unknown until it ends: it emits a
  frame once its right context has arrived, starts with small emissions (early first audio) and grows them
  toward ``max_emit`` (less halo recompute). Every window length is one of a fixed set of *window sizes*
  (the GPU engine captures one graph per size). To reach a size a window may extend leftwards into real
  latents, or, only beyond ``emit_end + right``, be padded on the right (the session pads with the codec's
  ``pad_latent``). It never pads past the true end of a clip: the final window is pinned to the clip end.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .errors import ConfigError

__all__ = ["StreamPlanner", "Window", "default_window_sizes", "emission_sizes", "plan_tiles"]


class Window(NamedTuple):
    """One decode window, in latent frames of the clip."""

    window_start: int
    window_frames: int
    emit_start: int
    emit_end: int

    @property
    def window_end(self) -> int:
        return self.window_start + self.window_frames

    @property
    def emit_frames(self) -> int:
        return self.emit_end - self.emit_start

    @property
    def emit_offset(self) -> int:
        """First emitted frame, counted from the window's start."""
        return self.emit_start - self.window_start


def _check_context(left: int, right: int) -> None:
    if left < 0 or right < 0:
        raise ConfigError(f"context must be >= 0 frames on both sides, got left={left}, right={right}")


def _normalise_sizes(sizes: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted(set(int(s) for s in sizes)))
    if out and out[0] < 1:
        raise ConfigError(f"window sizes must be >= 1 frame, got {out}")
    return out


def _smallest_fitting(sizes: Sequence[int], need: int) -> int | None:
    """Smallest size >= need in the sorted ``sizes``, or None."""
    i = bisect.bisect_left(sizes, need)
    return sizes[i] if i < len(sizes) else None


def plan_tiles(
    frames: int, tile: int, left: int, right: int, sizes: Iterable[int] = ()
) -> list[tuple[int, int, int, int]]:
    """Cut a clip of ``frames`` latent frames into windows ``(window_start, window_frames, emit_start, emit_end)``.

    A clip of at most ``tile`` frames is one window of its own length. Otherwise windows are ``tile`` wide;
    each emits only frames at least ``left`` after its start and ``right`` before its end, unless that edge
    is the clip's own edge. The last window is pinned to the clip's end and shrinks to the smallest of
    ``sizes`` that holds its emitted frames plus ``left``.

    >>> plan_tiles(600, 512, 53, 9, (128, 256, 512))
    [(0, 512, 0, 503), (344, 256, 503, 600)]
    """
    _check_context(left, right)
    if frames < 0:
        raise ConfigError(f"frames must be >= 0, got {frames}")
    if tile <= left + right:
        raise ConfigError(
            f"tile of {tile} frames leaves nothing to emit with context left={left} + right={right}: "
            f"use a tile of at least {left + right + 1} frames"
        )
    if frames == 0:
        return []
    if frames <= tile:
        return [(0, frames, 0, frames)]
    small = [s for s in _normalise_sizes(sizes) if s <= tile]
    windows = []
    emit_start, window_start = 0, 0
    while True:
        if window_start + tile >= frames:
            need = frames - emit_start + min(left, emit_start)
            size = _smallest_fitting(small, need) or tile
            windows.append((frames - size, size, emit_start, frames))
            return windows
        emit_end = window_start + tile - right
        windows.append((window_start, tile, emit_start, emit_end))
        emit_start, window_start = emit_end, emit_end - left


def emission_sizes(min_emit: int, max_emit: int) -> tuple[int, ...]:
    """The emission schedule: ``min_emit``, doubling, capped at ``max_emit``."""
    if min_emit < 1 or max_emit < min_emit:
        raise ConfigError(f"need 1 <= min_emit <= max_emit, got min_emit={min_emit}, max_emit={max_emit}")
    out = []
    size = min_emit
    while size < max_emit:
        out.append(size)
        size *= 2
    out.append(max_emit)
    return tuple(out)


def default_window_sizes(left: int, right: int, min_emit: int, max_emit: int) -> tuple[int, ...]:
    """One window size per emission size: ``left + emit + right``."""
    _check_context(left, right)
    return tuple(left + right + e for e in emission_sizes(min_emit, max_emit))


class StreamPlanner:
    """Plans the windows of one stream as its latents arrive.

    Pure state machine: call :meth:`next_window` with how many frames have arrived and whether the stream
    has ended; it returns the next window to decode, or None until one is due. Windows come out in emission
    order and cover every frame exactly once.

    Emission ``k`` waits for ``min(max_emit, min_emit * 2**k)`` frames whose right context has arrived
    (never waits once the stream has ended) and emits up to ``max_emit`` of them.
    """

    def __init__(
        self,
        left: int,
        right: int,
        *,
        min_emit: int,
        max_emit: int,
        window_sizes: Iterable[int] | None = None,
    ) -> None:
        _check_context(left, right)
        self.left, self.right = left, right
        self.min_emit, self.max_emit = min_emit, max_emit
        self._targets = emission_sizes(min_emit, max_emit)
        if window_sizes is None:
            window_sizes = default_window_sizes(left, right, min_emit, max_emit)
        self.window_sizes = _normalise_sizes(window_sizes)
        largest_need = left + max_emit + right
        if not self.window_sizes or self.window_sizes[-1] < largest_need:
            raise ConfigError(
                f"window sizes {self.window_sizes} cannot hold max_emit={max_emit} frames with context "
                f"left={left} + right={right}: include a size of at least {largest_need} frames"
            )
        self.emitted = 0  # frames already handed out in windows
        self.emissions = 0

    @property
    def history_frames(self) -> int:
        """How far before the next emitted frame a window may reach: latents older than this can go."""
        return self.window_sizes[-1]

    def next_window(self, received: int, ended: bool, *, flush: bool = False) -> Window | None:
        """The next window to decode, given ``received`` frames so far; None if none is due yet.

        ``flush`` emits every ready frame now, below the emission target: the caller's listener is about
        to run out of audio, and waiting for a larger emission would stall playback.
        """
        if received < self.emitted:
            raise ConfigError(f"received={received} went backwards below emitted={self.emitted}")
        count = self._due(received, ended, flush)
        if count == 0:
            return None
        emit_start = self.emitted
        emit_end = emit_start + count
        window = self._fit(emit_start, emit_end, received, ended)
        self.emitted = emit_end
        self.emissions += 1
        return window

    def finished(self, received: int, ended: bool) -> bool:
        """True once the stream has ended and every frame is in a window."""
        return ended and self.emitted == received

    def ready(self, received: int, ended: bool) -> int:
        """Frames that could be emitted now: their right context has arrived (or the stream ended)."""
        return received - self.emitted - (0 if ended else self.right)

    def _due(self, received: int, ended: bool, flush: bool) -> int:
        ready = self.ready(received, ended)
        if ready <= 0:
            return 0
        target = self._targets[min(self.emissions, len(self._targets) - 1)]
        return min(ready, self.max_emit) if ended or flush or ready >= target else 0

    def _fit(self, emit_start: int, emit_end: int, received: int, ended: bool) -> Window:
        # Pinned: the window touches the clip's true end, where nothing may be padded.
        pinned = ended and emit_end + self.right >= received
        window_end = received if pinned else emit_end + self.right
        need = window_end - max(0, emit_start - self.left)
        size = _smallest_fitting(self.window_sizes, need)
        assert size is not None  # guaranteed by the check in __init__
        if window_end - size >= 0:
            # Extend leftwards into real latents (all of them arrived earlier).
            return Window(window_end - size, size, emit_start, emit_end)
        if pinned:
            # A clip shorter than the size: one window of its own length, both edges true.
            return Window(0, window_end, emit_start, emit_end)
        # At the clip start: grow rightwards; frames past `received` are padding, all beyond emit_end + right.
        return Window(0, size, emit_start, emit_end)
