"""The engine: one scheduler for all streams, bucket CUDA graphs, a dedicated stream and thread.

One class serves every device: on a GPU it replays CUDA graphs on its own stream; on a CPU the same
queue, scheduler and completion run the eager tier. It decodes two kinds of work, both batched across
streams: halo *windows* (:class:`~.base.WindowRequest`) and *stateful calls* of slotted streams
(:class:`~.base.StepRequest`: prime, step, flush; their layer state lives in a device pool, see
:mod:`.slots`).

Data path of one window::

    submit()               loop thread: validate, append to the arrivals (a deque: no lock), and once per
                           loop turn wake the device thread if it sleeps
      -> device thread     move arrivals into the Scheduler; pop the next (batch, frames) bucket, most
                           urgent windows first; stack the latents into pinned host memory (pad rows:
                           pad_latent); on the engine stream: H2D copy into the graph's static input,
                           replay, D2H copy of the emitted columns into a fresh pinned buffer, record an event
      -> completer         event done: one block for the call, each window's part a view of it, posted to
                           its loop's mailbox, which hands each to its ``on_done`` (decode_request's: a future)

The loop never takes the lock the device thread works under to queue or withdraw work: a server submits
a call per chunk, and every time the device thread held the lock then, the loop blocked on it and the two
threads traded the GIL. Withdrawals go through a second deque the device thread applies to the Scheduler.

At most ``max_inflight`` replays are queued on the stream at once: while the GPU works, windows pile up in
the scheduler and the next replay takes them together, which is where cross-stream batching comes from.

Lanes (:mod:`.lanes`): on a GPU with stateful slots, a stream's primes and flushes have a scheduler,
a CUDA stream (of higher priority) and a completer of their own, so they replay beside a step instead of
behind it. A call waits on the device for the other lane's last call on any of its slots, and the
device's busy time counts the two lanes' overlap once.

Lifetimes: a graph's static input/output are overwritten by its next replay, but every replay on the
engine stream is ordered after the previous one's D2H copy, and users only ever see clones of the pinned
copy. Pinned staging buffers come from PyTorch's caching host allocator, which holds a block until the
copy that reads or writes it has completed on the stream.

With ``simulated=SimulatedCost(...)`` (a measurement tool, see :mod:`.simulated`) the same machinery runs
and only the device call differs: it sleeps the modelled cost and returns stand-in audio, never calling the
codec.

On a CPU codec the same machinery runs with the eager tier and no events. There the engine caps PyTorch's
intra-op threads at ``cpu_threads`` (default: cores - 1) while it runs: the pool is process-wide, and when
its threads fill every core each wake-up of the event loop preempts one of them while the others spin at
the next barrier (on a 2-core machine that made a 60 ms window take 0.3 to 12 s).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from ..codecs.stateful import StatefulNet
from ..errors import ConfigError, EngineClosedError, EngineError, ShapeError
from .base import (
    DeviceCall,
    Engine,
    EngineStats,
    OnDone,
    StepRequest,
    Submission,
    WarmupReport,
    WindowRequest,
)
from .completion import Completer, HostCompleter, Inflight, Mailbox, PollCompleter, ThreadCompleter, Waiter
from .graphs import CapturedGraph, GraphTiers, TierOptions, env_flag, static_forward
from .lanes import EDGE, MAIN, BusyUnion, DeviceClock, SlotFences, lane_of
from .output import DecodedAudio
from .scheduler import BucketKey, CostFn, Scheduler, Ticket, linear_cost
from .simdevice import SharedDevice
from .simulated import SimulatedCost, SimulatedTier, bucket_seconds
from .slots import SlotAllocator, StatePool

__all__ = [
    "DEFAULT_EDGE_BATCH_LIMIT",
    "DEFAULT_HOLD_LEAD_S",
    "DEFAULT_LAUNCH_INTERVAL_S",
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_PRIME_HOLD_LEAD_S",
    "DEFAULT_STEP_FRAME_BUDGET",
    "DEFAULT_WINDOW_BATCH_LIMIT",
    "DecodeEngine",
    "default_batch_buckets",
]

#: how long before its deadline a replay must end, however few rows it fills: the trip to the listener,
#: the event loop's lag, and the replay a late decision queues behind. On an H100 at 512 real-time
#: streams, six runs each way in turn: 50 ms held in six, 0.00180-0.00182 device s per audio s (mean batch
#: 93-96, p99 first audio 55-76 ms); 70 ms held in five (in the sixth every stream under-ran at once, in
#: one stall of the process), 0.00185-0.00188 (mean batch 77-89); 40 ms held in two of two
#: (bench/results/h100/stateful-512-step-lead-*.json). On an H200, with a scheduler whose cover planning
#: could stall a call for milliseconds, 40 ms let 320 streams under-run and 70 ms held them
#: (bench/results/h200/stateful-timeline-lead40.json, -lead70.json).
DEFAULT_HOLD_LEAD_S = 0.05
#: the same for stateful primes, whose deadline is their stream's first audio rather than a listener running
#: dry, and which the edge lane keeps from queueing behind a step. Against the steps' lead then, 70 ms, on an
#: H100 at 512 real-time streams, four runs each way alternating: primes 3.3-3.6 -> 4.6-4.7 a replay, device time
#: 0.00189-0.00190 -> 0.00184-0.00186 s per audio s, p99 first audio 43-55 -> 55-59 ms, every run held; a
#: 30 ms lead saved no more and took p99 first audio to 60-75 ms
#: (bench/results/h100/stateful-512-prime-lead-*.json)
DEFAULT_PRIME_HOLD_LEAD_S = 0.05
#: the shortest time between two launch rounds (see DecodeEngine's ``launch_interval``). Each device call
#: costs the host 60-90 us of Python on the device thread, under the interpreter lock the event loop needs,
#: and a hand-off back to the loop; launched as they came, 1,000 real-time streams on a zero-cost device
#: made 1,600 calls a second of 7 rows. Rounds 2 ms apart made them 16 rows for 1 ms of first audio
#: (docs/serving-capacity.md).
DEFAULT_LAUNCH_INTERVAL_S = 0.002
#: the share of recent wall time the device must spend on calls before queued work is held for fuller
#: replays: holding saves device time, which a device idle most of the time has to spare, and costs latency
HOLD_BUSY_FRACTION = 0.25
#: seconds over which that share is averaged (exponentially)
BUSY_AVERAGE_S = 1.0
#: stateful primes and flushes happen once per stream: small buckets keep graph count and memory down
DEFAULT_EDGE_BATCH_LIMIT = 16
#: replays queued on the engine's stream at once: one runs while the next is staged behind it
DEFAULT_MAX_INFLIGHT = 2
#: rows x frames of the largest stateful replay: 256 real-time streams of 4-frame chunks in one replay
DEFAULT_STEP_FRAME_BUDGET = 1024
#: the largest default batch of halo windows: a window graph's memory grows with its whole window, and
#: halo streams rarely fill more (at 32 real-time streams an H200 averaged 2.8 windows a replay)
DEFAULT_WINDOW_BATCH_LIMIT = 64
#: the largest default batch of stateful steps: on an H200 a 256 x 4 step of auk-24k costs 33.9 us a
#: frame, a 64 x 4 one 46.5, and 512 rows cost no less a frame than 256 (bench/results/h200/
#: stateful-384-448-512.json, profile-stateful-step-parts.txt)
DEFAULT_STEP_BATCH_LIMIT = 256


def default_batch_buckets(max_streams: int) -> tuple[int, ...]:
    """Powers of two from 1 up to what ``max_streams`` slots can fill, at least
    :data:`DEFAULT_WINDOW_BATCH_LIMIT` and at most :data:`DEFAULT_STEP_BATCH_LIMIT`: without slots, the
    halo windows' buckets alone."""
    top = DEFAULT_WINDOW_BATCH_LIMIT
    while top < min(max_streams, DEFAULT_STEP_BATCH_LIMIT):
        top *= 2
    return tuple(1 << i for i in range(top.bit_length()))


# device calls kept for recent_calls(): at a replay every few milliseconds, the last minute or more
_CALLS_KEPT = 20_000

log = logging.getLogger("streamdec.engine")
R = TypeVar("R")


class _Pending:
    """One submitted request, from :meth:`DecodeEngine.submit` to its result (the :class:`Submission`)."""

    __slots__ = (
        "_withdrawn",
        "cancelled",
        "frames",
        "future",
        "kind",
        "lane",
        "mailbox",
        "on_done",
        "request",
        "ticket",
    )

    def __init__(
        self,
        request: WindowRequest | StepRequest,
        on_done: OnDone,
        mailbox: Mailbox,
        frames: int,
        kind: str,
        lane: int,
        withdrawn: collections.deque[_Pending],
    ) -> None:
        self.request, self.on_done, self.mailbox = request, on_done, mailbox
        self.frames, self.kind, self.lane = frames, kind, lane
        # set by the device thread when it queues it, cleared when it leaves the queue: the ticket holds
        # this request, so while both point at each other only the cycle collector could free them
        self.ticket: Ticket[_Pending] | None = None
        self.cancelled = False
        # decode_request's future: cancelling the task that awaits it cancels it at once, before the task
        # runs again to cancel this submission, and the device thread must see that at once too
        self.future: asyncio.Future[DecodedAudio] | None = None
        self._withdrawn = withdrawn

    def withdrawn(self) -> bool:
        """Whether it must not be decoded (device thread)."""
        return self.cancelled or (self.future is not None and self.future.cancelled())

    def cancel(self) -> None:
        """Withdraw it (loop thread): skipped wherever the device thread finds it, and taken out of the
        Scheduler at the device thread's next pass, so queued counts stay true."""
        if not self.cancelled:
            self.cancelled = True
            self._withdrawn.append(self)


class _Lane:
    """One ordered lane of device work (:mod:`.lanes`): its queue, its CUDA stream and completer, and
    its calls in flight. The engine's lock guards ``inflight`` and ``free_at``."""

    def __init__(self, index: int, scheduler: Scheduler[_Pending]) -> None:
        self.index = index
        self.scheduler = scheduler
        self.stream: torch.cuda.Stream | None = None
        self.completer: Completer | None = None
        self.inflight = 0
        self.free_at = -math.inf  # when the replays launched on it so far should have finished


class DecodeEngine(Engine):
    """Serves every stream of one codec on one device (replayed CUDA graphs on a GPU, eager on a CPU).

    Options (keywords):

    * ``max_streams`` - stateful stream slots allocated at start (0: halo windows only). Each slot holds
      one stream's layer state on the device; a stream beyond them is refused, never queued.
    * ``cpu_threads`` - PyTorch intra-op threads while the engine runs (default: cores - 1 on a CPU, 1 on
      a GPU, where the host only copies and converts).
    * ``hold_lead`` - seconds a replay must end before its work's deadline (the trip to the listener and
      the event loop's lag). Queued work waits for more to share its replay until the latest start at
      which every queued group, run earliest deadline first after the replays in flight, still ends that
      early (:meth:`.Scheduler.hold`; replay times as measured at warm-up), or until the largest bucket is
      full (default 0.05; None: dispatch at once). Work is held only while the device spent at least
      ``HOLD_BUSY_FRACTION`` of the last second on calls: below that it has time to spare and waiting
      would only add latency. Work due now (whole-clip windows) goes at once.
    * ``launch_interval`` - seconds between the starts of two launch rounds (default 0.002; 0: launch as
      work arrives). Every request queued when a round starts goes out in it, as many replays as its
      groups and buckets need; what arrives meanwhile waits for the next round, at most this long. It
      bounds the device calls a second however many streams each event-loop turn brings, and so the
      host's per-call work (staging, hand-offs between the device thread and the loop), which a device
      that answers fast would otherwise multiply. An idle engine launches the first request at once.
    * ``edge_batch_limit`` - the largest batch bucket of stateful primes and flushes (default 16).
    * ``prime_hold_lead`` - ``hold_lead`` for stateful primes (default 0.05; consulted where
      ``hold_lead`` is not None). A stream's first call is due 80 ms after it is made
      (``StreamDecoder(first_call_due=...)``), so with a 50 ms lead a prime waits at most about 30 ms
      for others to share its replay. A prime's deadline is its stream's first audio, not a listener
      running dry, and on the edge lane it does not queue behind a step, which part of the steps' lead
      allows for: its lead is its own (``DEFAULT_PRIME_HOLD_LEAD_S`` says what it measured).
    * ``edge_lane`` - primes and flushes in a lane of their own (:mod:`.lanes`): on a GPU they replay on
      a second CUDA stream, at higher priority, beside the steps; on a host device they only queue apart.
      Default: on where the device is a GPU and the engine keeps slots. Needs ``max_streams``.
    * ``step_frame_budget`` - the most rows x frames one stateful replay holds (default 1024: 256 streams
      of 4 frames), which bounds graph memory.

    * ``batch_buckets`` - batch sizes graphs are captured for. Default (:func:`default_batch_buckets`):
      powers of two up to 64, or up to what the slots can fill (at most 256) for stateful steps, with halo
      windows kept to 64 (``DEFAULT_WINDOW_BATCH_LIMIT``). Buckets given here are every kind's, windows
      included, within ``edge_batch_limit`` and ``step_frame_budget``.
    * ``graphs`` - use CUDA graphs at all (``STREAMDEC_NO_GRAPHS=1`` forces False).
    * ``compile`` - ``torch.compile`` the bucket graphs (``STREAMDEC_NO_COMPILE=1`` forces False).
    * ``compile_dynamic`` - ``"batch"`` (default: the batch dimension is traced dynamic, so one compile
      serves a range of batch buckets of a window size; batch 1 and backend-chosen splits compile
      again), ``"none"`` (one compile per bucket) or ``"all"`` (window length dynamic too).
    * ``compile_mode`` - passed to ``torch.compile`` (e.g. ``"max-autotune-no-cudagraphs"``).
    * ``inductor_cache_dir`` - Inductor's cache; reuse it across starts to make a second warm-up fast.
    * ``max_graphs`` - ad-hoc plain graphs per generation before the whole generation is retired.
    * ``on_frozen_miss`` - after ``freeze()``, a shape with no graph raises ``CaptureFrozenError``
      (``"error"``, default) or decodes eagerly and is counted under tier ``eager-frozen`` (``"eager"``).
    * ``completion`` - ``"thread"`` (default) or ``"poll"``; see :mod:`.completion`.
    * ``max_inflight`` - replays queued on the stream at once (default 2).
    * ``cost`` - ``(batch, frames) -> relative time`` for the scheduler; warm-up replaces it by measured
      replay times for warmed buckets.
    * ``simulated`` - a :class:`~.simulated.SimulatedCost`: simulate the device (a measurement tool; the
      codec is never called, see :mod:`.simulated`); built by :func:`~.simulated.simulated_engine`.
    """

    def __init__(
        self,
        codec: Any,
        *,
        max_streams: int = 0,
        cpu_threads: int | None = None,
        hold_lead: float | None = DEFAULT_HOLD_LEAD_S,
        launch_interval: float = DEFAULT_LAUNCH_INTERVAL_S,
        edge_batch_limit: int = DEFAULT_EDGE_BATCH_LIMIT,
        edge_lane: bool | None = None,
        prime_hold_lead: float = DEFAULT_PRIME_HOLD_LEAD_S,
        step_frame_budget: int = DEFAULT_STEP_FRAME_BUDGET,
        batch_buckets: Iterable[int] | None = None,
        graphs: bool = True,
        compile: bool = True,
        compile_dynamic: Literal["none", "batch", "all"] = "batch",
        compile_mode: str | None = None,
        inductor_cache_dir: str | None = None,
        max_graphs: int = 16,
        on_frozen_miss: Literal["error", "eager"] = "error",
        completion: Literal["thread", "poll"] = "thread",
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        poll_interval: float = 1e-4,
        cost: CostFn | None = None,
        simulated: SimulatedCost | None = None,
    ) -> None:
        if completion not in ("thread", "poll"):
            raise ConfigError(f"completion must be 'thread' or 'poll', got {completion!r}")
        if max_inflight < 1:
            raise ConfigError(f"max_inflight must be >= 1, got {max_inflight}")
        if max_streams < 0:
            raise ConfigError(f"max_streams must be >= 0, got {max_streams}")
        if cpu_threads is not None and cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1, got {cpu_threads}")
        self.codec = codec
        self.max_streams = max_streams
        self.net = StatefulNet(codec) if max_streams else None
        # the fewest frames each kind of stateful call takes
        self._least_frames = {"prime": self.net.min_prime_frames, "step": 1, "flush": 0} if self.net else {}
        self._slots = SlotAllocator(max_streams) if max_streams else None
        if hold_lead is not None and hold_lead < 0:
            raise ConfigError(f"hold_lead must be >= 0 seconds or None, got {hold_lead}")
        self.hold_lead = hold_lead
        if not (math.isfinite(prime_hold_lead) and prime_hold_lead >= 0):
            raise ConfigError(
                f"prime_hold_lead must be a finite number of seconds >= 0, got {prime_hold_lead}"
            )
        self.prime_hold_lead = prime_hold_lead
        self._leads = {"prime": prime_hold_lead}  # the scheduler's lead for a kind of work of its own
        if not (math.isfinite(launch_interval) and launch_interval >= 0):
            raise ConfigError(
                f"launch_interval must be a finite number of seconds >= 0, got {launch_interval}"
            )
        self.launch_interval = launch_interval
        self._round_at = -math.inf  # when the latest launch round started
        self._round_left = 0  # requests of that round not launched yet
        self._saved_threads: int | None = None
        pad = codec.pad_latent.detach()
        self.device = torch.device("cpu") if simulated is not None else pad.device
        self.hop = int(codec.hop_size)
        self.channels = int(codec.channels)
        self.simulated = (
            None
            if simulated is None
            else SimulatedTier(
                simulated,
                self.hop,
                self.channels,
                slots=max_streams,
                right_frames=self.net.right_frames if self.net is not None else 0,
            )
        )
        if cpu_threads is None:
            # A GPU engine's host work is small copies and conversions on the event loop: PyTorch's
            # intra-op pool only adds wake-ups there (one 7,680-sample conversion took 8 ms on two threads
            # and 0.24 ms on one on a loaded host).
            # A simulated device leaves the host the same small work.
            host_only = self.device.type == "cuda" or self.simulated is not None
            cpu_threads = 1 if host_only else max(1, (os.cpu_count() or 1) - 1)
        self.cpu_threads = cpu_threads
        self.dtype = pad.dtype
        self.latent_dim = int(codec.latent_dim)
        self.options = TierOptions(
            graphs=graphs and not env_flag("STREAMDEC_NO_GRAPHS"),
            compile=compile and not env_flag("STREAMDEC_NO_COMPILE"),
            compile_dynamic=compile_dynamic,
            compile_mode=compile_mode,
            max_graphs=max_graphs,
            on_frozen_miss=on_frozen_miss,
            inductor_cache_dir=inductor_cache_dir,
            parallel_compile=env_flag("STREAMDEC_PARALLEL_COMPILE"),
        )
        self.completion = completion
        self.max_inflight = max_inflight
        self.poll_interval = poll_interval
        self._default_cost = cost if cost is not None else linear_cost()
        self._measured: dict[BucketKey, float] = {}
        self._busy = BusyMeter(BUSY_AVERAGE_S)
        kind_limits = dict.fromkeys(("prime", "flush"), edge_batch_limit)
        if batch_buckets is None:
            batch_buckets = default_batch_buckets(max_streams)
            kind_limits["window"] = DEFAULT_WINDOW_BATCH_LIMIT
        if edge_lane and not max_streams:
            raise ConfigError(
                "edge_lane needs stateful slots (max_streams > 0): primes and flushes are theirs"
            )
        if edge_lane is None:
            edge_lane = self.device.type == "cuda" and max_streams > 0
        self._lanes = [
            _Lane(
                index,
                Scheduler(
                    batch_buckets, cost=self._cost, kind_limits=kind_limits, frame_budget=step_frame_budget
                ),
            )
            for index in range(2 if edge_lane else 1)
        ]
        self._scheduler = self._lanes[MAIN].scheduler  # the buckets and plans every lane shares
        self.batch_buckets = self._scheduler.batch_buckets
        # which lane last wrote each slot's state, and when that call ends (device thread only)
        self._fences: SlotFences[torch.cuda.Event] = SlotFences(max_streams)
        self._busy_union = BusyUnion(len(self._lanes))
        # both lanes' call times on one clock (CUDA events, or a modelled device's)
        self._clock: DeviceClock[Any] | None = None
        self._sim_device: SharedDevice | None = None  # a simulated engine's modelled device with lanes
        self._pad_cpu = pad.to("cpu", torch.float32)
        self._stats = EngineStats()
        # the latest device calls, for benchmarks' timelines (a few per replay period: minutes of them)
        self._calls: collections.deque[DeviceCall] = collections.deque(maxlen=_CALLS_KEPT)
        self._lock = threading.RLock()  # guards scheduler, stats, commands, inflight count
        # The device thread sleeps on this, released by whoever has work for it (held: no wake pending).
        # A lock released from another thread, not a Condition: a wake is one C call on the loop, with no
        # lock to take and no waiter list to walk, and it comes once per loop turn under load.
        self._bell = threading.Lock()
        self._bell.acquire()
        self._commands: collections.deque[Callable[[], None]] = collections.deque()
        # Submitted and withdrawn requests on their way to the Scheduler: appended on the loop without the
        # lock, taken by the device thread (see submit).
        self._arrivals: collections.deque[_Pending] = collections.deque()
        self._withdrawn: collections.deque[_Pending] = collections.deque()
        self._sleeping = False  # the device thread waits on _bell (or is about to): a wake must ring it
        # event loops with a wake-up of the device thread scheduled (see _wake_soon)
        self._wakes_scheduled: set[asyncio.AbstractEventLoop] = set()
        self._mailboxes: dict[asyncio.AbstractEventLoop, Mailbox] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self._tiers: GraphTiers | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed: create a new one")
        if self._thread is not None:
            return
        if self.device.type == "cuda":
            for lane in self._lanes:
                # the edge lane at a higher priority: its blocks go first as the step's retire
                lane.stream = torch.cuda.Stream(device=self.device, priority=-1 if lane.index == EDGE else 0)  # type: ignore[no-untyped-call]
            if len(self._lanes) > 1:
                origin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                origin.record(self._lanes[MAIN].stream)
                self._clock = DeviceClock(origin)
        self._saved_threads = torch.get_num_threads()
        torch.set_num_threads(min(self._saved_threads, self.cpu_threads))
        if self.simulated is None:
            self._start_tiers()
        if self.simulated is not None and self.simulated.overlap is not None:
            self._sim_device = SharedDevice(self.simulated.overlap)
            if len(self._lanes) > 1:
                self._clock = DeviceClock(self._sim_device.origin())
        loop = asyncio.get_running_loop()
        host = HostCompleter()  # a call on the host is complete when it returns: no thread to wait on it
        for lane in self._lanes:
            if self.completion == "poll":
                lane.completer = PollCompleter(loop, self.poll_interval)
            elif self.device.type == "cuda" or self._sim_device is not None:
                lane.completer = ThreadCompleter()  # one a lane: each completes its calls in launch order
            else:
                lane.completer = host
        self._thread = threading.Thread(target=self._run, name="streamdec-cuda", daemon=True)
        self._thread.start()

    def _start_tiers(self) -> None:
        self._tiers = GraphTiers(
            static_forward(self.codec),
            latent_dim=self.latent_dim,
            dtype=self.dtype,
            device=self.device,
            stream=self._lanes[MAIN].stream,
            pad_latent=self.codec.pad_latent,
            options=self.options,
            shapes=lambda: f"{self.codec!r} precision={self.codec.precision}",
        )
        if self.net is not None:
            self._tiers.state = StatePool(
                self.net, self.max_streams, device=self.device, dtype=self.dtype, lanes=len(self._lanes)
            )

    async def warmup(self, window_sizes: tuple[int, ...]) -> WarmupReport:
        """Compile/capture one graph per (batch bucket, window size); time each replay for the scheduler."""
        await self.start()
        sched = self._scheduler
        keys = [
            BucketKey(b, int(f)) for f in sorted(set(window_sizes)) for b in sched.buckets_for("window", f)
        ]
        if self.simulated is not None:
            return self._simulated_warmup(keys)
        return await self._call_on_device(lambda: self._warm(keys))

    async def warmup_steps(self, keys: tuple[tuple[str, int], ...]) -> WarmupReport:
        """Capture one graph per (batch bucket, stateful call kind, frames); time each replay."""
        if self.net is None:
            raise EngineError("warmup_steps() on an engine without max_streams: nothing is stateful")
        await self.start()
        sched = self._scheduler
        buckets = [
            BucketKey(b, int(f), kind) for kind, f in sorted(set(keys)) for b in sched.buckets_for(kind, f)
        ]
        if self.simulated is not None:
            return self._simulated_warmup(buckets)
        return await self._call_on_device(lambda: self._warm(buckets))

    def _simulated_warmup(self, keys: list[BucketKey]) -> WarmupReport:
        assert self.simulated is not None
        return WarmupReport(
            buckets=tuple((k.batch, k.frames) for k in keys),
            notes=(
                f"simulated device (a measurement tool): cost {self.simulated.cost} ms per call, per frame",
            ),
        )

    def freeze(self) -> None:
        """From now on a shape with no graph is an error (or a counted eager decode), never a capture."""
        if self.simulated is not None:
            return  # a simulated device captures nothing
        if self._tiers is None:
            raise EngineError("freeze() before start(): start and warm up the engine first")
        self._tiers.freeze()

    async def aclose(self) -> None:
        if self._closed:
            return
        with self._lock:
            self._closed = True
            leftovers = self._take_leftovers()
            self._rouse()
        _fail_closed(leftovers)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            with self._lock:  # what another loop submitted while the device thread was stopping
                _fail_closed(self._take_leftovers())
        for completer in {id(lane.completer): lane.completer for lane in self._lanes}.values():
            if completer is None:
                continue
            await asyncio.to_thread(completer.close)
            if isinstance(completer, PollCompleter):
                await completer.wait_closed()
        if self._sim_device is not None:  # after the completers, which wait for its calls
            await asyncio.to_thread(self._sim_device.close)
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)

    @property
    def lanes(self) -> int:
        """Lanes of device work: 2 where primes and flushes have one of their own (``edge_lane``), else 1."""
        return len(self._lanes)

    @property
    def stats(self) -> EngineStats:
        with self._lock:
            return self._stats.snapshot()

    def recent_calls(self) -> list[DeviceCall]:
        with self._lock:
            return list(self._calls)

    @property
    def tiers(self) -> GraphTiers:
        """The graph tiers (for inspection and tests); exists after ``start()``."""
        if self._tiers is None:
            raise EngineError("the engine has not started: await engine.start() first")
        return self._tiers

    # -- requests ------------------------------------------------------------------------------------

    async def decode_window(self, request: WindowRequest) -> torch.Tensor:
        return (await self.decode_request(request)).samples

    async def decode_step(self, request: StepRequest) -> torch.Tensor:
        return (await self.decode_request(request)).samples

    async def decode_request(self, request: WindowRequest | StepRequest) -> DecodedAudio:
        if self._thread is None and not self._closed:
            await self.start()
        future: asyncio.Future[DecodedAudio] = asyncio.get_running_loop().create_future()
        submission = self.submit(request, lambda audio, error: _settle(future, audio, error))
        if isinstance(submission, _Pending):
            submission.future = future
        try:
            return await future
        except asyncio.CancelledError:
            submission.cancel()
            raise

    def submit(
        self,
        request: WindowRequest | StepRequest,
        on_done: OnDone,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Submission:
        """Queue ``request`` (see :meth:`Engine.submit`): checked here, then appended to the arrivals,
        which the device thread moves into its Scheduler; ``on_done`` runs from this loop's mailbox."""
        kind: str
        if isinstance(request, StepRequest):
            self._check_step(request)
            frames, kind = request.frames, request.kind
        else:
            self._check(request)
            frames, kind = request.window_frames, "window"
        if self._closed:
            raise EngineClosedError("decode after aclose(): the engine is closed")
        if self._thread is None:  # not started: decode_request starts the engine first
            return super().submit(request, on_done, loop)
        if loop is None:
            loop = asyncio.get_running_loop()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = Mailbox(loop)
        pending = _Pending(
            request, on_done, mailbox, frames, kind, lane_of(kind, len(self._lanes)), self._withdrawn
        )
        self._arrivals.append(pending)
        self._wake_soon(loop)
        return pending

    def open_slot(self) -> int:
        if self._slots is None:
            raise EngineError("this engine was built without max_streams: it keeps no per-stream state")
        with self._lock:
            return self._slots.take()

    def close_slot(self, slot: int) -> None:
        if self._slots is None:
            raise EngineError("this engine was built without max_streams: it keeps no per-stream state")
        with self._lock:
            self._slots.give_back(slot)

    @property
    def open_slots(self) -> int:
        """Slots in use right now."""
        with self._lock:
            return 0 if self._slots is None else self._slots.in_use

    def _wake_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the device thread once the loop has run the callbacks at hand: a server's loop submits
        the calls of every message one ``select`` returned, and the device thread then wakes once and
        finds them together (one batch, one launch), not once per call."""
        if loop not in self._wakes_scheduled:
            self._wakes_scheduled.add(loop)
            loop.call_soon(self._wake, loop)

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        self._wakes_scheduled.discard(loop)
        # Without the lock: the device thread sets _sleeping and then looks at the arrivals once more
        # before it waits, so an arrival appended before this read is seen either way.
        self._rouse()

    def _rouse(self) -> None:
        """Wake the device thread if it sleeps (any thread). Cleared here, not when the device thread
        resumes: until it has the GIL back, the next loop turns' wakes find it awake and ring nothing.
        Every clearing is followed by a ring, so the device thread never waits marked awake with no ring
        to come; a ring it finds pending when it has woken otherwise costs it one more look for work."""
        if self._sleeping:
            self._sleeping = False
            with contextlib.suppress(RuntimeError):  # another thread rang it first: one ring is pending
                self._bell.release()

    def _take_arrivals(self) -> None:
        """Move submitted requests into the Scheduler and withdrawn ones out of it (device thread, under
        the lock)."""
        arrivals, lanes, stats = self._arrivals, self._lanes, self._stats
        while arrivals:
            p = arrivals.popleft()
            if p.withdrawn():  # withdrawn before it was queued: never decoded
                stats.cancelled += 1
                continue
            p.ticket = lanes[p.lane].scheduler.push(p, p.frames, p.request.deadline, p.kind)
        withdrawn = self._withdrawn
        while withdrawn:
            p = withdrawn.popleft()
            ticket, p.ticket = p.ticket, None
            if ticket is not None and lanes[p.lane].scheduler.cancel(ticket):  # queued: its slot is free now
                stats.cancelled += 1
        stats.queued = self._queued()

    def _queued(self) -> int:
        return sum(lane.scheduler.pending for lane in self._lanes)

    def _take_leftovers(self) -> list[_Pending]:
        """Every request not yet launched (under the lock, at close)."""
        self._take_arrivals()
        self._stats.queued = 0
        return [p for lane in self._lanes for p in lane.scheduler.drain() if not p.withdrawn()]

    def _sleep(self, timeout: float | None) -> None:
        """Wait for a ring (see :meth:`_rouse`) or ``timeout``, the lock (held) released meanwhile, unless
        work arrived. What a waker changes under the lock before it rings is seen after the wait; what
        it changed before the lock was let go, before it."""
        self._sleeping = True
        if not (self._arrivals or self._withdrawn):
            self._lock.release()
            try:
                self._bell.acquire(timeout=-1 if timeout is None else timeout)
            finally:
                self._lock.acquire()
        self._sleeping = False

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` for the next launch round, the lock (held) released meanwhile. No ring cuts it
        short: arrivals during the pause are what the round gathers."""
        self._lock.release()
        try:
            time.sleep(seconds)
        finally:
            self._lock.acquire()

    def _check(self, request: WindowRequest) -> None:
        z = request.latents
        if z.dim() != 2 or z.shape[1] != self.latent_dim or z.shape[0] < 1:
            raise ShapeError(
                f"window latents have shape {tuple(z.shape)}: expected [frames >= 1, {self.latent_dim}]"
            )
        end = request.emit_offset + request.emit_frames
        if request.emit_offset < 0 or request.emit_frames < 1 or end > z.shape[0]:
            raise ShapeError(
                f"emitted frames {request.emit_offset}..{end} fall outside the window of {z.shape[0]} frames"
            )

    def _check_step(self, request: StepRequest) -> None:
        if self.net is None:
            raise EngineError("decode_step() on an engine without max_streams: use mode='halo'")
        shape = request.latents.shape  # read once: every call of every stream passes here
        if len(shape) != 2 or shape[1] != self.latent_dim:
            raise ShapeError(f"step latents have shape {tuple(shape)}: expected [frames, {self.latent_dim}]")
        least = self._least_frames.get(request.kind)
        if least is None:
            raise ConfigError(f"unknown stateful call {request.kind!r}: expected 'prime', 'step' or 'flush'")
        if shape[0] < least:
            raise ShapeError(f"a {request.kind} takes at least {least} frames, got {shape[0]}")
        if not 0 <= request.slot < self.max_streams:
            raise ConfigError(f"slot {request.slot} is outside 0..{self.max_streams - 1}")

    def _replay_s(self, key: BucketKey) -> float | None:
        """Device seconds of one call of ``key``: measured at warm-up, or the simulated device's model;
        None where unknown (the scheduler then holds nothing)."""
        if self.simulated is not None:
            return bucket_seconds(self.simulated.cost, key, key.batch)
        measured_ms = self._measured.get(key)
        return None if measured_ms is None else 1e-3 * measured_ms

    def _cost(self, key: BucketKey) -> float:
        measured = self._measured.get(key)
        return measured if measured is not None else self._default_cost(key)

    # -- device thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # The codec's precision policy (TF32 off by default) holds for every capture, compile and eager
        # call this thread makes, so all tiers compute the function codec.decode computes.
        # A simulated device runs no codec: its stand-in audio is numpy made into tensors, which need no
        # inference mode, and without it handing a call's output out needs no guard to leave it per call.
        inference = torch.inference_mode() if self.simulated is None else contextlib.nullcontext()
        with inference, self.codec.numerics():
            while (work := self._next_work()) is not None:
                try:
                    work()
                except Exception:  # never let one bad batch kill the thread every stream depends on
                    log.exception("streamdec device thread: unexpected error")

    def _next_work(self) -> Callable[[], None] | None:
        with self._lock:
            while True:
                if self._commands:
                    return self._commands.popleft()
                if self._closed:
                    return None
                self._take_arrivals()
                now = time.monotonic()
                lane, wait = self._ready_lane(now)
                if lane is not None:
                    if self._round_left <= 0:
                        pause = self._round_at + self.launch_interval - now
                        if pause > 0:
                            self._pause(pause)
                            continue
                        self._round_at = now
                        self._round_left = self._queued()
                    popped = lane.scheduler.pop_batch()
                    pending = self._stats.queued = self._queued()
                    if popped is not None:
                        lane.inflight += 1
                        key, items = popped
                        self._round_left = self._round_left - len(items) if pending else 0
                        for p in items:
                            p.ticket = None
                        lane.free_at = max(now, lane.free_at) + (self._replay_s(key) or 0.0)
                        return functools.partial(self._launch, lane, key, items, now)
                if not self._queued():
                    self._round_left = 0  # withdrawn before it went: the next round starts afresh
                self._sleep(wait)

    def _ready_lane(self, now: float) -> tuple[_Lane | None, float | None]:
        """The lane whose queued work goes next (the most urgent of those ready), or None and how long
        until a held lane's work is due to go (None: until something wakes the device thread).

        The engine is the one place that holds work: until the latest start at which every group queued
        on a lane still meets its deadline after that lane's replays in flight, arrivals join its next
        replay. A lane with ``max_inflight`` replays in flight waits for one to finish."""
        ready: _Lane | None = None
        ready_due = math.inf
        wait: float | None = None
        loaded: bool | None = None
        for lane in self._lanes:
            scheduler = lane.scheduler
            if lane.inflight >= self.max_inflight or not scheduler.pending:
                continue
            if self.hold_lead is not None:
                if loaded is None:
                    loaded = self._busy.fraction(now) >= HOLD_BUSY_FRACTION
                held = (
                    scheduler.hold(now, self._replay_s, self.hold_lead, lane.free_at, self._leads)
                    if loaded
                    else None
                )
                if held is not None:
                    wait = held if wait is None else min(wait, held)
                    continue
            if len(self._lanes) == 1:
                return lane, None  # nothing to choose between: no deadline to look up
            due = scheduler.next_deadline()
            if due is not None and due < ready_due:
                ready, ready_due = lane, due
        return ready, wait

    async def _call_on_device(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the device thread (captures and warm-up must happen there) and await its result."""
        done: concurrent.futures.Future[R] = concurrent.futures.Future()

        def command() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        with self._lock:
            if self._closed:
                raise EngineClosedError("engine is closed")
            self._commands.append(command)
            self._rouse()
        return await asyncio.wrap_future(done)

    def _finished(self, lane: _Lane, item: Inflight) -> None:
        call = item.extra.get("call")
        span = self._span(item, call)
        elapsed = span[1] - span[0] if span is not None else item.elapsed_s()
        with self._lock:
            lane.inflight -= 1
            now = time.monotonic()
            if call is not None:
                self._calls.append(
                    call._replace(finished=now, device_s=elapsed if elapsed is not None else call.device_s)
                )
            if lane.inflight == 0:  # an estimate that ran long (or short) ends with the lane free
                lane.free_at = now
            # the device's busy time: the lanes' calls overlap, and an overlap counts once
            busy = elapsed if span is None else self._busy_union.add(lane.index, *span)
            self._busy.add(now, busy if busy is not None else float(item.extra.get("seconds", 0.0)))
            if busy is not None:
                self._stats.decode_seconds += busy
            self._rouse()

    def _span(self, item: Inflight, call: DeviceCall | None) -> tuple[float, float] | None:
        """When a call on a GPU, or on a modelled device with lanes, began and ended, in seconds on the
        lanes' one clock, where there is more than one lane to set it against; None otherwise."""
        if self._clock is None or item.began is None or item.done is None or call is None:
            return None
        return self._clock.span(item.began, item.done, call.launched, time.monotonic())

    def _launch(self, lane: _Lane, key: BucketKey, items: list[_Pending], decided: float) -> None:
        launched = time.monotonic()
        live = [p for p in items if not p.withdrawn()]
        with self._lock:
            self._stats.cancelled += len(items) - len(live)
            queued = self._queued()
        if not live:
            self._finished(lane, Inflight(torch.empty(0), [], None))
            return
        try:
            item, tier = self._device_call(lane, key, live)
        except Exception as exc:
            error = exc if isinstance(exc, EngineError) else EngineError(f"decode of {key} failed: {exc}")
            if error is not exc:
                error.__cause__ = exc
            failed = Inflight(torch.empty(0), [Waiter(p, 0, 0, 0) for p in live], None)
            failed.fail(error)
            self._finished(lane, failed)
            return
        due = min(p.request.deadline for p in live)
        # a simulated device's time is its model's (what it slept); a GPU's, or a modelled device's with
        # lanes, comes from the call's events once it has finished (_finished)
        item.extra["call"] = DeviceCall(
            key.kind, key.frames, key.batch, len(live), queued, decided, due, launched, launched,
            item.extra.get("modelled_s"), self._replay_s(key), lane.index,
        )  # fmt: skip
        with self._lock:
            s = self._stats
            s.decodes += 1
            s.windows += len(live)
            s.frames += key.frames * len(live)
            s.by_tier[tier] = s.by_tier.get(tier, 0) + 1
            if item.began is None:
                s.decode_seconds += float(item.extra.get("seconds", 0.0))
        item.on_finish = functools.partial(self._finished, lane)
        assert lane.completer is not None
        lane.completer.submit(item)

    def _device_call(self, lane: _Lane, key: BucketKey, live: list[_Pending]) -> tuple[Inflight, str]:
        if self.simulated is not None:
            lo, hi, waiters = self._waiters(key, live)
            return self._simulated_call(lane, key, live, waiters, lo, hi), "simulated"
        tiers = self.tiers
        frozen_miss = tiers.is_frozen_miss(key)
        graph = tiers.lookup(key)  # may capture (not frozen) or raise CaptureFrozenError
        if graph is None and frozen_miss:
            tier = "eager-frozen"
        else:
            tier = graph.tier if graph is not None else "eager"
        lo, hi, waiters = self._waiters(key, live)
        if lane.stream is None:
            return self._cpu_call(lane, key, live, waiters, lo, hi), tier
        return self._cuda_call(lane, key, graph, live, waiters, lo, hi), tier

    def _waiters(self, key: BucketKey, live: list[_Pending]) -> tuple[int, int, list[Waiter]]:
        """The output columns ``lo:hi`` that travel back, and where each row's result lies in them."""
        if key.kind != "window":  # a stateful call returns all it decodes
            assert self.net is not None
            frames = {"prime": -self.net.right_frames, "step": 0, "flush": self.net.right_frames}[key.kind]
            width = (key.frames + frames) * self.hop
            return 0, width, [Waiter(p, row, 0, width) for row, p in enumerate(live)]
        windows = [p.request for p in live]
        assert all(isinstance(w, WindowRequest) for w in windows)
        spans = [(w.emit_offset * self.hop, (w.emit_offset + w.emit_frames) * self.hop) for w in windows]  # type: ignore[union-attr]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        return (
            lo,
            hi,
            [Waiter(p, row, a - lo, b - lo) for row, (p, (a, b)) in enumerate(zip(live, spans, strict=True))],
        )

    def _slots_of(self, lane: _Lane, live: list[_Pending], rows: int, count: bool = False) -> torch.Tensor:
        """Slot index per row ``[rows]`` int64 on the host; padding rows take the lane's scratch slot.
        ``count``: then the number of real rows (``[rows + 1]``, a captured call's static slots)."""
        slots = [p.request.slot for p in live]  # type: ignore[union-attr]
        if rows > len(slots):
            slots += [self.max_streams + lane.index] * (rows - len(slots))
        if count:
            slots.append(len(live))
        # one array from a list and a tensor over it: a third of the time of torch.tensor (every call)
        return torch.from_numpy(np.array(slots, dtype=np.int64))

    def _stage(self, live: list[_Pending], rows: int, pin: bool) -> torch.Tensor:
        """Stacked window latents ``[rows, frames, D]`` on the host; rows past ``len(live)`` are padding."""
        frames = int(live[0].request.latents.shape[0])
        host = torch.empty((rows, frames, self.latent_dim), dtype=torch.float32, pin_memory=pin)
        # stack casts into float32 itself; a .to() per request would cost more than the stack
        torch.stack([p.request.latents for p in live], out=host[: len(live)])
        if rows > len(live):
            host[len(live) :] = self._pad_cpu
        return host

    def _cuda_call(
        self,
        lane: _Lane,
        key: BucketKey,
        graph: CapturedGraph | None,
        live: list[_Pending],
        waiters: list[Waiter],
        lo: int,
        hi: int,
    ) -> Inflight:
        stream = lane.stream
        assert stream is not None
        rows = key.batch if graph is not None else len(live)
        host_in = self._stage(live, rows, pin=True)
        began = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        # blocking: the completer thread sleeps in its wait for the replay instead of spinning on the event,
        # which held a core flat out beside the server (0.96 of one at 512 real-time streams on an H100
        # host: server CPU 0.0031 s per stream-second against 0.0011 with the sleeping wait, same streams)
        done = torch.cuda.Event(enable_timing=True, blocking=True)  # type: ignore[no-untyped-call]
        slots = (
            self._slots_of(lane, live, rows, graph is not None).pin_memory() if key.kind != "window" else None
        )
        # with one lane the stream orders every call: no fences to keep
        own = [p.request.slot for p in live] if slots is not None and len(self._lanes) > 1 else []  # type: ignore[union-attr]
        with torch.cuda.stream(stream):
            for fence in self._fences.waits(lane.index, own):  # the other lane's last call on these slots
                stream.wait_event(fence)
            began.record(stream)
            if graph is not None:
                graph.static_in.copy_(host_in, non_blocking=True)
                if graph.static_slots is not None and slots is not None:
                    graph.static_slots.copy_(slots, non_blocking=True)
                graph.graph.replay()
                out = graph.static_out
            else:
                x = host_in.to(self.device, self.dtype, non_blocking=True)
                if slots is None:
                    out = self.tiers.eager(x)
                else:
                    out = self.tiers.eager_call(key.kind, slots.to(self.device, non_blocking=True), x)
            # Only the real rows and the emitted columns travel back; the result must not alias `out`.
            host_out = torch.empty((len(live), self.channels, hi - lo), dtype=torch.float32, pin_memory=True)
            host_out.copy_(out[: len(live), :, lo:hi], non_blocking=True)
            done.record(stream)
        self._fences.mark(lane.index, own, done)
        return Inflight(host_out, waiters, done, began)

    def _cpu_call(
        self, lane: _Lane, key: BucketKey, live: list[_Pending], waiters: list[Waiter], lo: int, hi: int
    ) -> Inflight:
        began = time.perf_counter()
        x = self._stage(live, len(live), pin=False).to(self.dtype)
        if key.kind == "window":
            decoded = self.tiers.eager(x)
        else:
            decoded = self.tiers.eager_call(key.kind, self._slots_of(lane, live, len(live)), x)
        out = decoded[:, :, lo:hi].to("cpu", torch.float32, copy=True)
        return self._host_inflight(out, waiters, began)

    def _simulated_call(
        self, lane: _Lane, key: BucketKey, live: list[_Pending], waiters: list[Waiter], lo: int, hi: int
    ) -> Inflight:
        tier = self.simulated
        assert tier is not None
        began = time.perf_counter()  # the host's time, for a call slept on this thread
        x = torch.stack([p.request.latents for p in live])  # [rows, frames, D]
        modelled = bucket_seconds(tier.cost, key, len(live))  # the live rows of this bucket
        device = self._sim_device
        sleep = 0.0 if device is not None else modelled  # a modelled device with lanes keeps the time itself
        if key.kind == "window":
            out = tier.windows(x, lo // self.hop, hi // self.hop, seconds=sleep)
        else:
            # the slots in numpy, which the stand-in reads: no tensor made only to be read back
            slots = np.array([p.request.slot for p in live], dtype=np.int64)  # type: ignore[union-attr]
            out = tier.call(key.kind, slots, x, seconds=sleep)
        if device is not None:
            start, end = device.launch(lane.index, modelled)
            item = Inflight(out, waiters, end, start, owned=True)  # type: ignore[arg-type]
        else:
            item = self._host_inflight(out, waiters, began)
        item.extra["modelled_s"] = modelled
        return item

    def _host_inflight(self, out: torch.Tensor, waiters: list[Waiter], began: float) -> Inflight:
        """A call the host finished already (no events): its output (fresh memory of its own, handed out
        without a copy) and how long it took."""
        item = Inflight(out, waiters, None, None, owned=True)
        item.extra["seconds"] = time.perf_counter() - began
        return item

    # -- warm-up (device thread) ---------------------------------------------------------------------

    def _warm(self, keys: list[BucketKey]) -> WarmupReport:
        tiers = self.tiers
        began = time.perf_counter()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            # Each capture first runs its shape eagerly, and the caching allocator keeps those blocks;
            # hand cached blocks back before and after, so the figure is the graphs' pools and buffers.
            torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        graphs_before = tiers.graph_count
        notes = tiers.warm(keys)
        warmed, failed = [], []
        for key in keys:
            graph = tiers.buckets.get(key)
            if graph is not None:
                warmed.append(key)
                if graph.replay_ms is not None:
                    self._measured[key] = graph.replay_ms
        for lane in self._lanes:
            lane.scheduler.forget_plans()  # the cost model now has measured replays
        failed = [k for k in tiers.failed if k in keys]
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        memory = (torch.cuda.memory_reserved(self.device) - reserved) if cuda else 0
        return WarmupReport(
            seconds=time.perf_counter() - began,
            graphs=tiers.graph_count - graphs_before,
            graph_memory_bytes=max(0, memory),
            buckets=tuple((k.batch, k.frames) for k in (warmed or keys)),
            failed=tuple((k.batch, k.frames) for k in failed),
            notes=tuple(notes),
        )

    # -- introspection for tests and benchmarks -----------------------------------------------------

    async def replay_ms(self) -> dict[tuple[int, int], tuple[str, float | None]]:
        """Measured replay time and tier of every bucket graph, keyed ``(batch, frames)``."""
        tiers = self.tiers
        return {
            (k.batch, k.frames): (g.tier, g.replay_ms) for k, g in tiers.buckets.items() if k.kind == "window"
        }

    def measured_replay_ms(self) -> dict[BucketKey, float]:
        """Replay time of every graph measured at warm-up, by bucket (what the scheduler's cost model uses)."""
        return dict(self._measured)

    def buckets_for(self, kind: str, frames: int) -> tuple[int, ...]:
        """The batch buckets a call of ``kind`` (``"window"``, ``"prime"``, ``"step"``, ``"flush"``) and
        ``frames`` frames may take: the graphs warm-up captures for it."""
        return self._scheduler.buckets_for(kind, frames)

    def step_replay_ms(self) -> dict[str, float | None]:
        """Measured replay time of every stateful graph, keyed ``"kind BATCHxFRAMES"``."""
        return {k.label: g.replay_ms for k, g in self.tiers.buckets.items() if k.kind != "window"}

    def step_empty_ms(self) -> dict[str, float | None]:
        """Replay time of every stateful graph with no real row (its kernels skip padding rows): what a
        bucket costs by itself, keyed as :meth:`step_replay_ms`."""
        return {k.label: g.empty_ms for k, g in self.tiers.buckets.items() if k.kind != "window"}

    def state_memory_bytes(self) -> int:
        """Device memory of the stateful slot pool (0 without ``max_streams``)."""
        pool = self.tiers.state if self._tiers is not None else None
        return 0 if pool is None else pool.nbytes


class BusyMeter:
    """The share of recent wall time a device spent on calls: device seconds averaged exponentially
    over ``tau`` seconds of wall time (1.0: busy all the time)."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self._level = 0.0
        self._at: float | None = None

    def add(self, now: float, seconds: float) -> None:
        """A call that finished at ``now`` kept the device busy ``seconds``."""
        self._level = self.fraction(now) + seconds / self.tau
        self._at = now

    def fraction(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._level * math.exp(-max(0.0, now - self._at) / self.tau)


def _settle(
    future: asyncio.Future[DecodedAudio], audio: DecodedAudio | None, error: BaseException | None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(audio)  # type: ignore[arg-type]


def _fail_closed(leftovers: list[_Pending]) -> None:
    for p in leftovers:
        p.mailbox.post([(p, None, EngineClosedError("engine closed before this window was decoded"))])
