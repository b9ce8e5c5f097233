"""Cross-stream batch packing for the GPU engine: pure bookkeeping, no torch, no CUDA, no I/O.

Every stream's ready work lands in one :class:`Scheduler`. A replay decodes one *bucket*, a
``(batch, frames, kind)`` shape for which a graph exists, so work can share a replay only when it has the
same length and kind: a halo ``window``, or a stateful ``prime``, ``step`` or ``flush`` of slotted streams. :meth:`Scheduler.pop_batch` picks what to replay next:

1. the frames group holding the most urgent window (earliest ``deadline``; ties go to the oldest);
2. how many of that group's windows to take, and into which batch bucket, by covering the whole group
   with the cheapest sequence of buckets (a small dynamic programme over a per-bucket cost); the first
   replay of that cover takes the group's most urgent windows, most urgent first;
3. rows of the bucket left over are padding (the engine fills them with ``pad_latent``).

Only the first replay of the cover is popped: by the time the device is ready for another, more windows
may have arrived and the cover is planned again.

Cost model: ``cost(key)`` is any positive number proportional to replay time. The engine feeds
measured replay times from warm-up; without them :func:`linear_cost` assumes a fixed launch overhead of a
few rows plus a per-row term, which is how a decoder behaves once it fills the GPU. Smallest-fitting
greedy (as a budget-bucketed encoder graph manager packs) is the special case ``cost(b) = b``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from ..errors import ConfigError

__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "BucketKey",
    "CostFn",
    "CoverTable",
    "Scheduler",
    "Ticket",
    "linear_cost",
    "normalise_buckets",
    "plan_cover",
]

DEFAULT_BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
#: cover tables (one per kind and frames) kept per scheduler before they start afresh: each holds an
#: entry per count up to ``max_cover_windows``, and halo windows come in as many lengths as the planner makes
_COVER_TABLE_LIMIT = 64

T = TypeVar("T")


class BucketKey(NamedTuple):
    """The shape of one graph: ``batch`` rows of ``frames`` latent frames of one ``kind`` of work."""

    batch: int
    frames: int
    kind: str = "window"  # "window" (halo) or a stateful "prime", "step" or "flush"

    @property
    def label(self) -> str:
        """``"kind BATCHxFRAMES"``: how warm-up reports and result files name the bucket."""
        return f"{self.kind} {self.batch}x{self.frames}"

    @classmethod
    def from_label(cls, label: str) -> BucketKey:
        """The bucket a :attr:`label` names (``ValueError`` for anything else)."""
        kind, shape = label.split()
        batch, frames = shape.split("x")
        return cls(int(batch), int(frames), kind)


CostFn = Callable[[BucketKey], float]  # relative replay time of one bucket


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

    def cost(key: BucketKey) -> float:
        return float(key.frames) * (key.batch + overhead_rows)

    return cost


def plan_cover(count: int, buckets: Sequence[int], cost: Callable[[int], float]) -> list[int]:
    """The cheapest multiset of ``buckets`` whose sizes sum to at least ``count``, largest first.

    ``buckets`` is sorted ascending. Ties prefer fewer padded rows, then fewer replays.
    ``plan_cover(17, (1, 2, 4, 8, 16, 32), lambda b: b + 4) == [16, 1]``.
    """
    return CoverTable(buckets, [cost(b) for b in buckets]).cover(count)


class CoverTable:
    """:func:`plan_cover` for one set of buckets and costs, at every count, each count planned once.

    The dynamic programme's entry for ``n`` windows depends only on the entries below ``n``, so one table,
    extended as larger counts come, answers every count: a cover is then a walk of a few entries, where
    planning each count afresh costs ``O(count x buckets)`` Python steps (15 ms for 1,000 windows and ten
    buckets on a 2-core host), paid again for every count a growing queue passes through.
    """

    __slots__ = ("_best", "_buckets", "_costs")

    def __init__(self, buckets: Sequence[int], costs: Sequence[float]) -> None:
        self._buckets = tuple(buckets)
        self._costs = tuple(costs)
        # best[n] = (total cost, padded rows, replays, bucket taken last) to cover n windows
        self._best: list[tuple[float, int, int, int]] = [(0.0, 0, 0, 0)]

    def cover(self, count: int) -> list[int]:
        """The cover of ``count`` windows (``[]`` for none), largest bucket first."""
        best = self._best
        if count >= len(best):
            self._extend(count)
        cover, n = [], count
        while n > 0:
            b = best[n][3]
            cover.append(b)
            n = max(0, n - b)
        cover.sort(reverse=True)
        return cover

    def _extend(self, count: int) -> None:
        best, pairs = self._best, tuple(zip(self._buckets, self._costs, strict=True))
        for n in range(len(best), count + 1):
            chosen = (math.inf, 0, 0, 0)
            for b, cost in pairs:
                c, pad, replays, _ = best[max(0, n - b)]
                candidate = (c + cost, pad + max(0, b - n), replays + 1, b)
                if candidate[:3] < chosen[:3]:
                    chosen = candidate
            best.append(chosen)


@dataclass(eq=False)
class Ticket(Generic[T]):
    """One queued piece of work: its payload, group and urgency. ``cancel()`` withdraws it."""

    payload: T
    group: tuple[str, int]  # (kind, frames): what may share a replay
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
        kind_limits: dict[str, int] | None = None,
        frame_budget: int | None = None,
    ) -> None:
        self.batch_buckets = normalise_buckets(batch_buckets)
        # Largest batch per kind of work (e.g. stateful primes and flushes, rare and short-lived, are
        # captured at small batches only); a kind not listed takes every bucket.
        self.kind_limits = dict(kind_limits or {})
        # Stateful calls: at most this many rows x frames per replay (graph memory grows with both).
        self.frame_budget = frame_budget
        self.cost: CostFn = cost if cost is not None else linear_cost()
        # Planning looks at most this many windows of one group (bounds the dynamic programme).
        self.max_cover_windows = max_cover_windows or 4 * self.batch_buckets[-1]
        self._groups: dict[tuple[str, int], list[tuple[float, int, Ticket[T]]]] = {}
        self._live: dict[tuple[str, int], int] = {}  # (kind, frames) -> live tickets in that group
        self._seq = itertools.count()
        self.pending = 0
        # (kind, frames) -> the cover of every count, planned once: a cover is planned under the engine's
        # lock before every replay and in every hold.
        self._covers: dict[tuple[str, int], CoverTable] = {}

    def push(self, payload: T, frames: int, deadline: float, kind: str = "window") -> Ticket[T]:
        """Queue work of ``frames`` latent frames due at ``deadline`` (smaller is more urgent)."""
        if frames < (0 if kind == "flush" else 1):
            raise ConfigError(f"a {kind} needs at least 1 frame, got {frames}")
        group = (kind, frames)
        ticket = Ticket(payload, group, float(deadline), next(self._seq))
        heapq.heappush(self._groups.setdefault(group, []), (ticket.deadline, ticket.seq, ticket))
        self._live[group] = self._live.get(group, 0) + 1
        self.pending += 1
        return ticket

    def cancel(self, ticket: Ticket[T]) -> bool:
        """Withdraw a queued ticket; False if it was already popped or cancelled."""
        if ticket.cancelled or ticket.seq < 0:
            return False
        ticket.cancelled = True
        self._live[ticket.group] -= 1
        self.pending -= 1
        self._prune(ticket.group)
        return True

    def pop_batch(self) -> tuple[BucketKey, list[T]] | None:
        """The next bucket and its payloads (most urgent first), or None when nothing is queued."""
        group = self._most_urgent_group()
        if group is None:
            return None
        kind, frames = group
        batch = self._cover(kind, frames, min(self._live[group], self.max_cover_windows))[0]
        taken: list[T] = []
        heap = self._groups[group]
        while heap and len(taken) < batch:
            _, _, ticket = heapq.heappop(heap)
            if ticket.cancelled:
                continue
            ticket.seq = -1  # popped: a later cancel() is a no-op
            taken.append(ticket.payload)
        self._live[group] -= len(taken)
        self.pending -= len(taken)
        self._prune(group)
        return BucketKey(batch, frames, kind), taken

    def forget_plans(self) -> None:
        """Drop planned covers: call after ``cost`` changed (e.g. warm-up measured replays)."""
        self._covers.clear()

    def _cover(self, kind: str, frames: int, count: int) -> list[int]:
        table = self._covers.get((kind, frames))
        if table is None:
            if len(self._covers) >= _COVER_TABLE_LIMIT:
                self._covers.clear()
            buckets = self.buckets_for(kind, frames)
            table = CoverTable(buckets, [self.cost(BucketKey(b, frames, kind)) for b in buckets])
            self._covers[(kind, frames)] = table
        return table.cover(count)

    def buckets_for(self, kind: str, frames: int) -> tuple[int, ...]:
        """The batch buckets work of ``kind`` and ``frames`` may use."""
        limit = self.kind_limits.get(kind, self.batch_buckets[-1])
        if kind != "window" and self.frame_budget is not None:
            limit = min(limit, self.frame_budget // max(frames, 1))
        return tuple(b for b in self.batch_buckets if b <= limit) or self.batch_buckets[:1]

    def hold(
        self,
        now: float,
        replay_s: Callable[[BucketKey], float | None],
        lead: float,
        device_free_at: float = -math.inf,
        leads: Mapping[str, float] | None = None,
    ) -> float | None:
        """Seconds to wait before popping so that more work joins the next batch, or None: pop now.

        Earliest deadline first over every queued group: each group runs as the replays of its cover,
        after the groups due before it, once the device has finished what it holds (``device_free_at``).
        The latest start at which every group still ends ``lead`` seconds before its earliest deadline
        is ::

            start = min over groups g of (deadline(g) - lead - replay time of the groups up to g)

        Until then waiting costs no listener anything, and every arrival makes the next replay fuller
        (real-time streams push a step per chunk period); an arrival also adds replay time, so the start
        moves earlier as the queue grows. The most urgent group goes at once when it fills its largest
        bucket. Where a replay time is unknown (``replay_s`` gives None: nothing measured) nothing is held.
        ``leads`` gives a kind of work a lead of its own in place of ``lead`` (a prime's deadline is its
        stream's first audio, not a listener running dry).
        """
        heads = self._heads()
        if not heads:
            return None
        _, _, first = heads[0]
        if self._live[first] >= self.buckets_for(*first)[-1]:
            return None
        start = math.inf
        queued = 0.0
        for deadline, _, group in heads:
            kind, frames = group
            for batch in self._cover(kind, frames, min(self._live[group], self.max_cover_windows)):
                seconds = replay_s(BucketKey(batch, frames, kind))
                if seconds is None:
                    return None
                queued += seconds
            own = lead if leads is None else leads.get(kind, lead)
            start = min(start, deadline - own - queued)
        return None if start <= max(now, device_free_at) else start - now

    def drain(self) -> list[T]:
        """Remove and return every live payload (engine shutdown)."""
        out = [t.payload for heap in self._groups.values() for _, _, t in sorted(heap) if not t.cancelled]
        self._groups.clear()
        self._live.clear()
        self.pending = 0
        return out

    def _heads(self) -> list[tuple[float, int, tuple[str, int]]]:
        """``(deadline, seq, group)`` of each group's most urgent live ticket, most urgent first."""
        heads = []
        for group, heap in self._groups.items():
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
            if heap:
                heads.append((heap[0][0], heap[0][1], group))
        heads.sort()
        return heads

    def next_deadline(self) -> float | None:
        """The deadline of the most urgent live ticket, or None when nothing is queued."""
        heads = self._heads()
        return heads[0][0] if heads else None

    def _most_urgent_group(self) -> tuple[str, int] | None:
        heads = self._heads()
        return heads[0][2] if heads else None

    def _prune(self, group: tuple[str, int]) -> None:
        # Drop a group whose every ticket is gone, so no memory grows with the number of lengths seen.
        if self._live.get(group, 0) == 0:
            self._groups.pop(group, None)
            self._live.pop(group, None)
