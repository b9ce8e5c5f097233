"""Cross-stream batch packing for the GPU engine: pure bookkeeping, no torch, no CUDA, no I/O.

Every stream's ready windows land in one :class:`Scheduler`. A replay decodes one *bucket*, a
``(batch, frames)`` shape for which a graph exists, so windows can share a replay only when they have the
same length. :meth:`Scheduler.pop_batch` picks what to replay next:

1. the frames group holding the most urgent window (earliest ``deadline``; ties go to the oldest);
2. how many of that group's windows to take, and into which batch bucket, by covering the whole group
   with the cheapest sequence of buckets (a small dynamic programme over a per-bucket cost); the first
   replay of that cover takes the group's most urgent windows, most urgent first;
3. rows of the bucket left over are padding (the engine fills them with ``pad_latent``).

Only the first replay of the cover is popped: by the time the device is ready for another, more windows
may have arrived and the cover is planned again.

Cost model: ``cost(batch, frames)`` is any positive number proportional to replay time. The engine feeds
measured replay times from warm-up; without them :func:`linear_cost` assumes a fixed launch overhead of a
few rows plus a per-row term, which is how a decoder behaves once it fills the GPU. Smallest-fitting
greedy (as a budget-bucketed encoder graph manager packs) is the special case ``cost(b) = b``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from ..errors import ConfigError

__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "BucketKey",
    "CostFn",
    "Scheduler",
    "Ticket",
    "linear_cost",
    "normalise_buckets",
    "plan_cover",
]

DEFAULT_BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

T = TypeVar("T")
CostFn = Callable[[int, int], float]  # (batch, frames) -> relative replay time


class BucketKey(NamedTuple):
    """The shape of one graph: ``batch`` rows of ``frames`` latent frames."""

    batch: int
    frames: int


def normalise_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
    """Sorted, deduplicated batch buckets; refuses an empty set or a bucket below 1."""
    out = tuple(sorted({int(b) for b in buckets}))
    if not out or out[0] < 1:
        raise ConfigError(
            f"batch buckets must be a non-empty set of sizes >= 1, got {out}; e.g. (1, 2, 4, 8)"
        )
    return out


def linear_cost(overhead_rows: float = 4.0) -> CostFn:
    """``frames * (batch + overhead_rows)``: a launch costs as much as ``overhead_rows`` extra rows."""
    if overhead_rows < 0:
        raise ConfigError(f"overhead_rows must be >= 0, got {overhead_rows}")

    def cost(batch: int, frames: int) -> float:
        return float(frames) * (batch + overhead_rows)

    return cost


def plan_cover(count: int, buckets: Sequence[int], cost: Callable[[int], float]) -> list[int]:
    """The cheapest multiset of ``buckets`` whose sizes sum to at least ``count``, largest first.

    ``buckets`` is sorted ascending. Ties prefer fewer padded rows, then fewer replays.
    ``plan_cover(17, (1, 2, 4, 8, 16, 32), lambda b: b + 4) == [16, 1]``.
    """
    if count <= 0:
        return []
    # best[n] = (total cost, padded rows, replays, bucket taken last) to cover n windows.
    inf = (float("inf"), 0, 0, 0)
    best: list[tuple[float, int, int, int]] = [(0.0, 0, 0, 0)] + [inf] * count
    for n in range(1, count + 1):
        for b in buckets:
            rest = max(0, n - b)
            c, pad, replays, _ = best[rest]
            candidate = (c + cost(b), pad + max(0, b - n), replays + 1, b)
            if candidate[:3] < best[n][:3]:
                best[n] = candidate
    cover, n = [], count
    while n > 0:
        b = best[n][3]
        cover.append(b)
        n = max(0, n - b)
    return sorted(cover, reverse=True)


@dataclass(eq=False)
class Ticket(Generic[T]):
    """One queued window: its payload, length and urgency. ``cancel()`` withdraws it."""

    payload: T
    frames: int
    deadline: float
    seq: int
    cancelled: bool = field(default=False, init=False)


class Scheduler(Generic[T]):
    """Queues windows of all streams and pops the next bucket to replay (see the module docstring).

    Not thread-safe: the engine holds its lock around every call. Cancelled tickets are dropped lazily
    (a heap cannot remove from the middle), but :attr:`pending` counts only live ones.
    """

    def __init__(
        self,
        batch_buckets: Iterable[int] = DEFAULT_BATCH_BUCKETS,
        *,
        cost: CostFn | None = None,
        max_cover_windows: int | None = None,
    ) -> None:
        self.batch_buckets = normalise_buckets(batch_buckets)
        self.cost: CostFn = cost if cost is not None else linear_cost()
        # Planning looks at most this many windows of one group (bounds the dynamic programme).
        self.max_cover_windows = max_cover_windows or 4 * self.batch_buckets[-1]
        self._groups: dict[int, list[tuple[float, int, Ticket[T]]]] = {}
        self._live: dict[int, int] = {}  # frames -> live tickets in that group
        self._seq = itertools.count()
        self.pending = 0

    def push(self, payload: T, frames: int, deadline: float) -> Ticket[T]:
        """Queue one window of ``frames`` latent frames due at ``deadline`` (smaller is more urgent)."""
        if frames < 1:
            raise ConfigError(f"a window needs at least 1 frame, got {frames}")
        ticket = Ticket(payload, frames, float(deadline), next(self._seq))
        heapq.heappush(self._groups.setdefault(frames, []), (ticket.deadline, ticket.seq, ticket))
        self._live[frames] = self._live.get(frames, 0) + 1
        self.pending += 1
        return ticket

    def cancel(self, ticket: Ticket[T]) -> bool:
        """Withdraw a queued ticket; False if it was already popped or cancelled."""
        if ticket.cancelled or ticket.seq < 0:
            return False
        ticket.cancelled = True
        self._live[ticket.frames] -= 1
        self.pending -= 1
        self._prune(ticket.frames)
        return True

    def pop_batch(self) -> tuple[BucketKey, list[T]] | None:
        """The next bucket and its payloads (most urgent first), or None when nothing is queued."""
        frames = self._most_urgent_group()
        if frames is None:
            return None
        live = self._live[frames]
        cover = plan_cover(
            min(live, self.max_cover_windows), self.batch_buckets, lambda b: self.cost(b, frames)
        )
        batch = cover[0]
        taken: list[T] = []
        heap = self._groups[frames]
        while heap and len(taken) < batch:
            _, _, ticket = heapq.heappop(heap)
            if ticket.cancelled:
                continue
            ticket.seq = -1  # popped: a later cancel() is a no-op
            taken.append(ticket.payload)
        self._live[frames] -= len(taken)
        self.pending -= len(taken)
        self._prune(frames)
        return BucketKey(batch, frames), taken

    def drain(self) -> list[T]:
        """Remove and return every live payload (engine shutdown)."""
        out = [t.payload for heap in self._groups.values() for _, _, t in sorted(heap) if not t.cancelled]
        self._groups.clear()
        self._live.clear()
        self.pending = 0
        return out

    def _most_urgent_group(self) -> int | None:
        best: tuple[float, int] | None = None
        frames_best = None
        for frames, heap in self._groups.items():
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
            if heap and (best is None or heap[0][:2] < best):
                best, frames_best = heap[0][:2], frames
        return frames_best

    def _prune(self, frames: int) -> None:
        # Drop a group whose every ticket is gone, so no memory grows with the number of lengths seen.
        if self._live.get(frames, 0) == 0:
            self._groups.pop(frames, None)
            self._live.pop(frames, None)
