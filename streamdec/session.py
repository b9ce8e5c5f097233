"""Sans-I/O stream session: one stream's latents in, windows out; decoded windows in, audio tiles out.

No asyncio, no threads, no device work. The async shell (:mod:`streamdec.streaming`) drives it::

    session.feed(chunk)                     # validate and buffer latents
    while (job := session.next_job()) ...   # planned windows, latents cut and padded
    tile = session.complete(job, audio)     # audio of the emitted frames -> Tile
    session.end()                           # no more chunks; the remaining frames become due

It also decides *when* ready frames go out below the emission target, as a pure function of the clock the
shell passes in (``now``), the listener's deadline and the stream's measured decode time
(:class:`FlushPolicy`)::

    wait = session.flush_wait(now)          # how long the shell may wait for a chunk; None: no limit
    job = session.next_job(flush=True)      # that wait ran out: the ready frames go out now
    session.decoded(seconds)                # submit-to-result time of a call, for the next estimate
    session.first_audio(now)                # the listener's clock starts at the first tile

The session keeps only the latents a future window can still reach (``planner.history_frames`` before
the next emitted frame), so memory stays bounded however long the stream runs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict

import numpy as np
import torch

from .errors import ConfigError, DTypeError, InputError, NonFiniteError, ShapeError, StreamEndedError
from .io import pcm16
from .planning import StreamPlanner, Window

__all__ = [
    "DECODE_TIME_SMOOTHING",
    "FLUSH_MARGIN_S",
    "MIN_PULL_WAIT_S",
    "FlushPolicy",
    "Job",
    "S16Source",
    "SessionOptions",
    "StatefulSession",
    "StepJob",
    "StepPolicy",
    "StreamSession",
    "Tile",
    "all_finite",
    "as_latents",
    "first_non_finite_row",
    "latents_array",
]

_FLOAT32 = np.dtype(np.float32)
#: weight of the newest decode time in a stream's moving average of its submit-to-result time
DECODE_TIME_SMOOTHING = 0.3
#: how long before a listener would run dry its ready frames are flushed, beyond the recent decode time:
#: the trip to the listener, event-loop lag included (10 ms under-ran at 60 streams on a loaded host)
FLUSH_MARGIN_S = 0.04
#: the shortest wait for a chunk before flushing: a source with the next chunk at hand delivers it within
MIN_PULL_WAIT_S = 0.001
#: how long after it is submitted a stream's first call is due: a busy device batches the first calls
#: of streams that start together instead of replaying each alone ahead of every step (one replay each
#: for 256 streams starting within a second kept an H200 busy and made every stream under-run once);
#: with the engine's 50 ms lead for first calls the first tile then comes within about 30 ms plus a replay
FIRST_CALL_DUE_S = 0.08


@dataclass(frozen=True)
class FlushPolicy:
    """When a stream's ready frames go out before the emission schedule asks: pure, clock passed in.

    The listener starts playing ``prebuffer_s`` after the stream's first tile and then consumes audio in
    real time, so the stream's *deadline* is ``first_audio + prebuffer_s + audio sent so far`` (before the
    first tile: ``first_call_s`` after the call, the listener is already waiting). Ready frames must be submitted a decode time
    (``decode_s``, a moving average of this stream's submit-to-result time, queueing included) plus
    ``margin_s`` before it::

        now ......... flush_at = deadline - decode_s - margin_s ......... deadline
        wait for a chunk  |  then send what is ready    | decode |  trip  |  listener runs dry

    A larger margin flushes more often and, where a decode costs about the audio a tile carries, spends
    more calls than it saves stalls.
    """

    prebuffer_s: float = 0.1
    margin_s: float = FLUSH_MARGIN_S
    smoothing: float = DECODE_TIME_SMOOTHING
    min_wait_s: float = MIN_PULL_WAIT_S
    first_call_s: float = FIRST_CALL_DUE_S

    def __post_init__(self) -> None:
        for name in ("prebuffer_s", "margin_s", "min_wait_s", "first_call_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ConfigError(f"flush policy {name}={value!r} must be a finite number of seconds >= 0")
        if not 0 < self.smoothing <= 1:
            raise ConfigError(f"flush policy smoothing={self.smoothing!r} must be in (0, 1]")

    def deadline(self, first_audio_at: float | None, played_s: float, now: float) -> float:
        """When the listener runs out of audio, having been sent ``played_s`` seconds of it; before the
        first tile, ``first_call_s`` after ``now`` (the listener waits for it already)."""
        if first_audio_at is None:
            return now + self.first_call_s
        return first_audio_at + self.prebuffer_s + played_s

    def smoothed(self, estimate: float | None, sample: float) -> float:
        """The decode-time estimate after one more measured ``sample`` (the first sample is taken as is)."""
        if estimate is None:
            return sample
        return (1 - self.smoothing) * estimate + self.smoothing * sample

    def wait(self, now: float, deadline: float, decode_s: float | None) -> float:
        """Seconds the shell may wait for a chunk before the ready frames must go out (>= ``min_wait_s``:
        a source that has the next chunk at hand delivers it within that)."""
        flush_at = deadline - (decode_s or 0.0) - self.margin_s
        return max(flush_at - now, self.min_wait_s)


class S16Source(Protocol):
    """Audio that knows its own s16 form (an engine computes it once per device call)."""

    def pcm16(self) -> bytes: ...


@dataclass(frozen=True, eq=False)
class Tile:
    """A slice of a stream's audio: ``samples`` is float32 ``[channels, frames * hop_size]`` on the CPU."""

    start_frame: int
    frames: int
    start_sample: int  # per channel
    samples: torch.Tensor
    s16_source: S16Source | None = field(default=None, repr=False)  # the engine's, for pcm16()

    @property
    def end_sample(self) -> int:
        return self.start_sample + int(self.samples.shape[-1])

    def pcm16(self) -> bytes:
        """``samples`` as interleaved little-endian s16, as :func:`streamdec.io.pcm16` gives them: of the
        audio as decoded (the engine may have converted its whole call before this tile was handed out,
        so changes made to ``samples`` in place do not show here)."""
        if self.s16_source is not None:
            return self.s16_source.pcm16()
        return pcm16(self.samples)


@dataclass(frozen=True, eq=False)
class Job:
    """A planned window with its latents ``[window.window_frames, latent_dim]``, ready for an engine."""

    window: Window
    latents: torch.Tensor


def all_finite(values: np.ndarray) -> bool:
    """Whether every element of a float16 or float32 array is finite. One float64 sum is finite exactly
    when every element is (such a sum cannot overflow), and costs a few microseconds against tens for an
    elementwise ``isfinite`` on a small array: it runs on every message of every stream."""
    if not values.size:
        return True
    try:  # np.add.reduce is what ndarray.sum calls, without its Python wrapper (a third of the cost here)
        total = np.add.reduce(values, axis=None, dtype=np.float64)
    except RuntimeWarning:  # warnings as errors, and +Inf and -Inf summed to NaN ("invalid value")
        return False
    return math.isfinite(total)


def first_non_finite_row(values: np.ndarray) -> int | None:
    """The first row of ``[T, D]`` values holding NaN or Inf, or None; rows are scanned only when
    :func:`all_finite` says one does."""
    if all_finite(values):
        return None
    return int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])


def as_latents(chunk: Any, latent_dim: int, *, allow_non_finite: bool = False) -> torch.Tensor:
    """Validate one chunk (array or tensor, ``[T, D]`` or ``[1, T, D]``) into a float32 CPU ``[T, D]`` tensor."""
    array = latents_array(chunk, latent_dim, allow_non_finite=allow_non_finite)
    return torch.from_numpy(np.ascontiguousarray(array))


def latents_array(chunk: Any, latent_dim: int, *, allow_non_finite: bool = False) -> np.ndarray:
    """:func:`as_latents` as a float32 numpy ``[T, D]`` array (which may share the chunk's memory).

    Sessions buffer numpy arrays: the few operations a chunk goes through cost about a microsecond each in
    numpy and several in torch, and a server runs them for every message of every stream.
    """
    if isinstance(chunk, np.ndarray) and chunk.dtype == np.float32 and chunk.shape[1:] == (latent_dim,):
        array = chunk  # the usual chunk (a server's float32 message): nothing to convert
    else:
        array = _float32_rows(chunk, latent_dim)
    bad = None if allow_non_finite else first_non_finite_row(array)
    if bad is not None:
        raise NonFiniteError(
            f"latent chunk holds NaN or Inf (first at frame {bad} of {array.shape[0]}): fix the producer, "
            "or pass allow_non_finite=True to decode it anyway"
        )
    return array


def _float32_rows(chunk: Any, latent_dim: int) -> np.ndarray:
    """Any accepted chunk as a float32 ``[T, latent_dim]`` array; typed errors for the rest."""
    if isinstance(chunk, np.ndarray):
        if not np.issubdtype(chunk.dtype, np.floating):
            raise DTypeError(
                f"latent chunk has dtype {chunk.dtype}: expected a floating dtype (float16/32/64); "
                "cast with .astype(np.float32)"
            )
        array = chunk
    elif isinstance(chunk, torch.Tensor):
        array = _tensor_array(chunk)
    else:
        raise DTypeError(f"latent chunk is a {type(chunk).__name__}: expected a numpy array or torch tensor")
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[1] != latent_dim:
        raise ShapeError(
            f"latent chunk has shape {tuple(array.shape)}: expected [T, {latent_dim}] or [1, T, {latent_dim}] "
            f"(frames first, latent_dim={latent_dim} last)"
        )
    return array if array.dtype == np.float32 else array.astype(np.float32)


def _tensor_array(tensor: torch.Tensor) -> np.ndarray:
    """A floating tensor's values as numpy (float32 where numpy lacks its dtype), on the CPU."""
    if not tensor.is_floating_point():
        raise DTypeError(
            f"latent chunk has dtype {tensor.dtype}: expected a floating dtype; cast with .float()"
        )
    if tensor.device.type == "meta":
        raise InputError(
            f"latent chunk of shape {tuple(tensor.shape)} is on the meta device and holds no data: "
            "materialise it (e.g. on 'cpu') before streaming"
        )
    if tensor.device.type != "cpu" or tensor.requires_grad or tensor.dtype == torch.bfloat16:
        tensor = tensor.detach().to(device="cpu", dtype=torch.float32)
    return tensor.numpy()


class SessionOptions(TypedDict):
    """What every kind of session takes besides its plan: the codec's geometry and the stream's settings."""

    latent_dim: int
    hop_size: int
    pad_latent: torch.Tensor
    allow_non_finite: bool
    latents_checked: bool
    flush_policy: FlushPolicy | None
    sample_rate: int | None


class _Intake:
    """What every session shares: the codec's geometry, validated latents buffered up to ``received``, the
    frames whose tiles went out, and the stream's pacing (first tile, decode-time estimate) under its
    :class:`FlushPolicy`. Each kind of session says where its buffer starts."""

    latent_dim: int
    hop_size: int
    allow_non_finite: bool  # NaN and Inf pass: latents are not scanned, decoded audio is not checked
    latents_checked: bool  # the caller refused non-finite latents already: they are not scanned again
    _buf: np.ndarray  # [frames, latent_dim] float32
    _row: tuple[int]
    received: int
    ended: bool
    completed_frames: int
    flush_policy: FlushPolicy
    sample_rate: int | None
    first_audio_at: float | None
    decode_s: float | None
    last_chunk_frames: int

    def __init__(
        self, *, latent_dim: int, hop_size: int, pad_latent: torch.Tensor, allow_non_finite: bool,
        latents_checked: bool, flush_policy: FlushPolicy | None, sample_rate: int | None,
    ) -> None:  # fmt: skip
        if tuple(pad_latent.shape) != (latent_dim,):
            raise ConfigError(f"pad_latent has shape {tuple(pad_latent.shape)}, expected ({latent_dim},)")
        if sample_rate is not None and sample_rate < 1:
            raise ConfigError(f"sample_rate must be >= 1 Hz, got {sample_rate}")
        self.latent_dim = latent_dim
        self._row = (latent_dim,)  # the shape of one frame's latents
        self.hop_size = hop_size
        self.allow_non_finite = allow_non_finite
        self.latents_checked = latents_checked
        self._buf = np.empty((0, latent_dim), np.float32)  # latents not yet dropped, up to `received`
        self.received = 0
        self.ended = False
        self.completed_frames = 0  # frames whose audio went out in tiles
        self.flush_policy = flush_policy or FlushPolicy()
        self.sample_rate = sample_rate
        self.first_audio_at = None  # the caller's clock at the first tile
        self.last_chunk_frames = 0  # frames of the latest non-empty chunk: the producer's chunk size
        self.decode_s = None  # moving average of this stream's submit-to-result time

    @property
    def ready_frames(self) -> int:
        raise NotImplementedError

    @property
    def call_room(self) -> int:
        """Frames the next call could still take beyond those buffered (0: more would wait for a later
        call). A stream that fell behind takes what is at hand up to this, so its calls grow instead of
        each carrying one chunk while the backlog grows."""
        raise NotImplementedError

    def awaits_input(self) -> bool:
        """True only when nothing but a new chunk or the end can make a call due: no frame is pending,
        the stream has not ended, and no flush could be due (``next_job`` is None, ``flush_wait`` None,
        ``finished`` False). False says nothing (the caller asks the session itself)."""
        return False

    # -- pacing: pure, the caller passes its clock ---------------------------------------------------
    def deadline(self, now: float) -> float:
        """When this stream's listener runs out of audio (see :meth:`FlushPolicy.deadline`)."""
        if self.sample_rate is None:
            raise ConfigError("this session was built without sample_rate: deadlines need it")
        played = self.completed_frames * self.hop_size / self.sample_rate
        return self.flush_policy.deadline(self.first_audio_at, played, now)

    def flush_wait(self, now: float) -> float | None:
        """How long to wait for the next chunk before ready frames go out below the emission target;
        None: no limit (nothing is ready, or nobody listens yet: the first tile follows the schedule)."""
        if self.first_audio_at is None or self.ready_frames == 0:
            return None
        return self.flush_policy.wait(now, self.deadline(now), self.decode_s)

    def decoded(self, seconds: float) -> None:
        """One call of this stream took ``seconds`` from submit to result."""
        self.decode_s = self.flush_policy.smoothed(self.decode_s, seconds)

    def first_audio(self, now: float) -> None:
        """A tile went to the listener at ``now``; the first one starts the listener's clock."""
        if self.first_audio_at is None:
            self.first_audio_at = now

    def feed(self, chunk: Any) -> int:
        """Buffer one chunk; returns its frame count. Empty chunks are fine."""
        if self.ended:
            raise StreamEndedError(
                f"chunk fed after the stream ended at frame {self.received}: start a new stream"
            )
        skip_scan = self.allow_non_finite or self.latents_checked
        if (
            skip_scan
            and type(chunk) is np.ndarray
            and chunk.dtype == _FLOAT32
            and chunk.shape[1:] == self._row
        ):
            latents = chunk  # a server's message, checked already: latents_array would return it as it is
        else:
            latents = latents_array(chunk, self.latent_dim, allow_non_finite=skip_scan)
        frames = int(latents.shape[0])
        if frames:
            self.last_chunk_frames = frames
            # a copy either way: the buffer never shares memory with the caller's chunk
            self._buf = np.concatenate([self._buf, latents]) if len(self._buf) else latents.copy()
            self.received += frames
        return frames

    def end(self) -> None:
        """No more chunks: every remaining frame becomes due. Idempotent."""
        self.ended = True

    def _tile(
        self, emit_start: int, emit_end: int, audio: torch.Tensor, s16: S16Source | None = None
    ) -> Tile:
        """The tile of frames ``emit_start .. emit_end``, checked: the audio's length, and tiles in order."""
        expected = (emit_end - emit_start) * self.hop_size
        shape = audio.shape  # read once: every tile of every stream is checked here
        if len(shape) != 2 or shape[1] != expected:
            raise ShapeError(f"engine returned audio {tuple(shape)}, expected [channels, {expected}]")
        if emit_start != self.completed_frames:
            raise ConfigError(
                f"tile for frame {emit_start} completed out of order (next is {self.completed_frames})"
            )
        self.completed_frames = emit_end
        return Tile(emit_start, emit_end - emit_start, emit_start * self.hop_size, audio, s16)


class StreamSession(_Intake):
    """One stream's state: buffered latents, its planner, and where its audio has got to."""

    def __init__(
        self,
        planner: StreamPlanner,
        *,
        latent_dim: int,
        hop_size: int,
        pad_latent: torch.Tensor,
        allow_non_finite: bool = False,
        latents_checked: bool = False,
        flush_policy: FlushPolicy | None = None,
        sample_rate: int | None = None,
    ) -> None:
        super().__init__(
            latent_dim=latent_dim, hop_size=hop_size, pad_latent=pad_latent, allow_non_finite=allow_non_finite,
            latents_checked=latents_checked, flush_policy=flush_policy, sample_rate=sample_rate,
        )  # fmt: skip
        self.planner = planner
        self._pad = pad_latent.detach().to("cpu", torch.float32).numpy()
        self._base = 0  # the frame `_buf` starts at

    # -- planning ----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every frame has been handed out in a window (tiles may still be in flight)."""
        return self.planner.finished(self.received, self.ended)

    @property
    def ready_frames(self) -> int:
        """Frames whose right context has arrived but that are in no window yet."""
        return max(0, self.planner.ready(self.received, self.ended))

    @property
    def call_room(self) -> int:
        unplanned = self.received - self.planner.emitted  # includes the right context of what is ready
        return max(0, self.planner.max_emit + self.planner.right - unplanned)

    def next_job(self, *, flush: bool = False) -> Job | None:
        """The next window to decode with its latents, or None until one is due (see ``flush`` in
        :meth:`StreamPlanner.next_window`)."""
        window = self.planner.next_window(self.received, self.ended, flush=flush)
        if window is None:
            return None
        latents = self._cut(window)
        self._drop_before(self.planner.emitted - self.planner.history_frames)
        return Job(window, latents)

    def _cut(self, window: Window) -> torch.Tensor:
        # [window_frames, D]: real latents up to `received`, then pad_latent (only ever beyond
        # emit_end + right, which the planner guarantees).
        start = window.window_start - self._base
        real_end = min(window.window_end, self.received) - self._base
        assert start >= 0, "planner reached latents the session already dropped"
        real = self._buf[start:real_end]
        missing = window.window_frames - int(real.shape[0])
        if missing == 0:
            return torch.from_numpy(real.copy())
        return torch.from_numpy(
            np.concatenate([real, np.broadcast_to(self._pad, (missing, self.latent_dim))])
        )

    def _drop_before(self, frame: int) -> None:
        drop = frame - self._base
        if drop > 0:
            self._buf = self._buf[drop:].copy()
            self._base = frame

    # -- output ------------------------------------------------------------------------------------
    def complete(self, job: Job, audio: torch.Tensor, s16: S16Source | None = None) -> Tile:
        """Turn the decoded emitted audio of ``job`` (``[channels, emit_frames * hop]``) into a Tile."""
        return self._tile(job.window.emit_start, job.window.emit_end, audio, s16)

    def snapshot(self) -> dict[str, int | bool]:
        return {
            "received": self.received,
            "emitted": self.planner.emitted,
            "completed": self.completed_frames,
            "buffered": int(self._buf.shape[0]),
            "ended": self.ended,
        }


@dataclass(frozen=True)
class StepPolicy:
    """How a stateful stream groups frames into calls (each size must be a captured shape).

    ``step_sizes`` are the frame counts a ``step`` or ``flush`` may take (ascending); ``prime_sizes`` those
    of a stream's first call. ``min_step`` is the fewest new frames worth a call unless the listener is
    about to run dry; a step takes one chunk's worth of the pending frames, or the largest size once that
    many are pending (:meth:`StatefulSession._step_frames`).
    """

    step_sizes: tuple[int, ...]
    prime_sizes: tuple[int, ...]
    min_step: int
    right_frames: int

    def __post_init__(self) -> None:
        if (
            not self.step_sizes
            or self.step_sizes[0] < 1
            or list(self.step_sizes) != sorted(set(self.step_sizes))
        ):
            raise ConfigError(f"step sizes must be distinct, ascending and >= 1, got {self.step_sizes}")
        if 1 not in self.step_sizes:
            raise ConfigError(f"step sizes {self.step_sizes} must include 1, so any remainder can be decoded")
        if not self.prime_sizes or list(self.prime_sizes) != sorted(set(self.prime_sizes)):
            raise ConfigError(f"prime sizes must be distinct and ascending, got {self.prime_sizes}")
        if self.prime_sizes[0] <= self.right_frames:
            raise ConfigError(
                f"the smallest prime ({self.prime_sizes[0]} frames) must exceed right_frames={self.right_frames}"
            )

    @classmethod
    def default(cls, right_frames: int, min_prime: int, min_step: int, max_step: int) -> StepPolicy:
        """Powers of two from 1 to ``max_step``; primes of ``right_frames + e`` for those sizes ``e``, each
        rounded up to a multiple of ``min_step``.

        The rounding is for producers whose chunks are multiples of ``min_step``: a prime then takes all
        the frames at hand and every later chunk is one step. A prime of ``right_frames + e`` would leave
        ``right_frames`` modulo the chunk behind for good (one frame, with 4-frame chunks and 7 frames of
        right context), each step carrying it on: the stream's audio a frame late, and a flush timer
        armed and cancelled for every chunk.
        """
        if min_step < 1 or max_step < min_step:
            raise ConfigError(f"need 1 <= min_emit <= max_emit, got {min_step} and {max_step}")
        sizes = sorted({1 << i for i in range(max_step.bit_length()) if 1 << i <= max_step} | {max_step})
        emitted = {e for e in sizes if e >= min_step} | {min_step}
        primes = sorted({-(-max(min_prime, right_frames + e) // min_step) * min_step for e in emitted})
        return cls(tuple(sizes), tuple(primes), min_step, right_frames)

    def shapes(self) -> tuple[tuple[str, int], ...]:
        """Every ``(kind, frames)`` a stream under this policy may ask for: the shapes to capture."""
        return (
            *(("prime", n) for n in self.prime_sizes),
            *(("step", n) for n in self.step_sizes),
            ("flush", 0),
            *(("flush", n) for n in self.step_sizes),
        )


@dataclass(frozen=True, eq=False)
class StepJob:
    """A stateful call of one stream: ``kind`` on ``latents``, emitting frames ``emit_start .. emit_end``."""

    kind: Literal["prime", "step", "flush", "whole"]
    latents: torch.Tensor  # [frames, latent_dim]
    emit_start: int
    emit_end: int

    @property
    def emit_frames(self) -> int:
        return self.emit_end - self.emit_start


class StatefulSession(_Intake):
    """One stream decoded once per frame: latents in, stateful calls out; their audio in, tiles out.

    The stream's first call primes its layer state with ``prime`` frames and emits all but the last
    ``right_frames``; each ``step`` of ``n`` frames emits ``n`` frames, ``right_frames`` behind; the ``flush``
    at the end emits the rest. A stream that ends before it could prime is decoded whole (``kind="whole"``,
    a window of its own length). Only latents not yet handed to a call are kept.
    """

    def __init__(
        self, policy: StepPolicy, *, latent_dim: int, hop_size: int, pad_latent: torch.Tensor,
        allow_non_finite: bool = False, latents_checked: bool = False, flush_policy: FlushPolicy | None = None,
        sample_rate: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            latent_dim=latent_dim, hop_size=hop_size, pad_latent=pad_latent, allow_non_finite=allow_non_finite,
            latents_checked=latents_checked, flush_policy=flush_policy, sample_rate=sample_rate,
        )  # fmt: skip
        self.policy = policy
        self.fed = 0  # frames handed to calls; `_buf` starts here
        self.primed = False  # the first call (the prime) was cut: fed > 0 (read for every chunk)
        self._done = False
        # the largest call before and after the prime, for call_room (asked several times per chunk)
        self._largest_call = (policy.prime_sizes[-1], policy.step_sizes[-1])

    @property
    def finished(self) -> bool:
        return self._done

    @property
    def ready_frames(self) -> int:
        """Frames a step could take now (none before the prime: it needs its own size)."""
        return self.received - self.fed if self.primed else 0

    @property
    def call_room(self) -> int:
        return max(0, self._largest_call[self.primed] - (self.received - self.fed))

    def awaits_input(self) -> bool:
        # primed, every received frame handed to a call, not ended: next_job has nothing to cut
        return self.primed and not self.ended and not self._done and self.received == self.fed

    def next_job(self, *, flush: bool = False) -> StepJob | None:
        """The next call, or None until one is due. ``flush``: the listener is about to run dry, so any
        pending frames go out now (a prime still needs its smallest size)."""
        if self._done:
            return None
        pending = self.received - self.fed
        if not self.primed:
            return self._first_job(pending, flush)
        if self.ended:
            if pending in self.policy.step_sizes or pending == 0:
                self._done = True
                return self._cut("flush", pending, pending + self.policy.right_frames)
            return self._cut("step", _largest_at_most(self.policy.step_sizes, pending), None)
        if pending >= self.policy.min_step or (flush and pending > 0):
            return self._cut("step", self._step_frames(pending), None)
        return None

    def _step_frames(self, pending: int) -> int:
        """How many of the ``pending`` frames a step takes. A largest step's worth pending (a producer
        ahead of real time): the largest step, the fewest calls. Less: one chunk's worth (at least
        ``min_step``), so that a real-time stream that fell a chunk behind keeps the size every other
        real-time stream steps with and shares their replays; two chunks in a call of a size of its own
        would split the engine's batches by size just when the device is busiest."""
        sizes = self.policy.step_sizes
        if pending >= sizes[-1]:
            return sizes[-1]
        chunk = max(self.policy.min_step, self.last_chunk_frames)
        return _largest_at_most(sizes, min(pending, chunk))

    def _first_job(self, pending: int, flush: bool) -> StepJob | None:
        primes = self.policy.prime_sizes
        if pending < primes[0]:
            if self.ended and pending > 0:
                self._done = True
                return self._cut("whole", pending, pending)
            if self.ended:
                self._done = True
            return None
        return self._cut("prime", _largest_at_most(primes, pending), None)

    def _cut(
        self, kind: Literal["prime", "step", "flush", "whole"], frames: int, emit: int | None
    ) -> StepJob:
        buf = self._buf
        if frames == len(buf):  # the usual call takes every pending frame: the buffer is the session's own
            latents, self._buf = torch.from_numpy(buf), buf[:0]
        else:
            latents, self._buf = torch.from_numpy(buf[:frames].copy()), buf[frames:]
        start = self.fed - (self.policy.right_frames if self.primed else 0)
        if kind == "prime":
            emit = frames - self.policy.right_frames
        elif emit is None:
            emit = frames
        self.fed += frames
        self.primed = True
        return StepJob(kind, latents, start, start + emit)

    def complete(self, job: StepJob, audio: torch.Tensor, s16: S16Source | None = None) -> Tile:
        """Turn the decoded audio of ``job`` (``[channels, emit_frames * hop]``) into a Tile."""
        return self._tile(job.emit_start, job.emit_end, audio, s16)

    def snapshot(self) -> dict[str, int | bool]:
        return {
            "received": self.received,
            "emitted": self.fed,
            "completed": self.completed_frames,
            "buffered": int(self._buf.shape[0]),
            "ended": self.ended,
        }


def _largest_at_most(sizes: Sequence[int], limit: int) -> int:
    """The largest of ascending ``sizes`` that is at most ``limit`` (one is, by the caller's check)."""
    return sizes[bisect.bisect_right(sizes, limit) - 1]
