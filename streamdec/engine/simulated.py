"""A measurement tool, not a decoder: the engine's simulated device, which models a delay and returns
stand-in audio.

``simulated_engine(codec)`` is the one :class:`~streamdec.engine.core.DecodeEngine` (same queue,
scheduler, batching, completion, cancellation, stateful slots) with its "run a bucket" step replaced by
:class:`SimulatedTier`. It lets the host path (websocket server, protocol, ``StreamDecoder``, event loop)
be measured on any machine, a 2-core CPU included, without the codec's cost hiding it. A call:

* sleeps the delay of :class:`SimulatedCost`: ``fixed_ms`` per device call plus ``per_frame_ms`` per
  frame of every stream's row in the call (``0,0`` measures the host path alone), or, for the buckets a
  :class:`ReplayTable` holds, the replay time a GPU measured for that bucket with as many rows live;
* returns audio that is a cheap pure function of each *emitted* frame's latents
  (:func:`stand_in_frames`): frame ``f`` becomes ``hop`` samples of one sine period scaled by
  ``0.2 + 0.3 * tanh(latents[f, 0])``. So a stream's audio depends on its latents only, never on how they
  were chunked, windowed or stepped, and the streamed audio of any stream (halo or stateful mode) equals
  :meth:`StreamDecoder.decode` of the same latents, bit for bit: a load test can check routing, order and
  completeness of every sample.

Never use it to produce audio anyone listens to. Select it with
``StreamDecoder(codec, engine=simulated_engine(codec, cost=SimulatedCost(2.0, 0.01), max_streams=64))``
or ``streamdec serve --engine simulated --simulated-cost-ms 2,0.01``; the codec only supplies geometry
(hop size, channels, latent width, the stateful lag) and is never called.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ConfigError
from .base import WindowRequest
from .scheduler import BucketKey

if TYPE_CHECKING:
    from ..codecs import Codec
    from .core import DecodeEngine

__all__ = [
    "DEFAULT_SIMULATED_SLOTS",
    "ReplayTable",
    "SimulatedCost",
    "SimulatedTier",
    "bucket_seconds",
    "call_seconds",
    "plan_calls",
    "simulated_engine",
    "stand_in_audio",
    "stand_in_frames",
]


@dataclass(frozen=True)
class ReplayTable:
    """Replay times a GPU engine measured for its stateful graphs, per bucket: with every row live
    (``full_ms``) and with none (``empty_ms``: padding rows return at once, but the launches stay). A call
    of ``live`` real rows is modelled as ``empty + (full - empty) * live / batch``."""

    full_ms: Mapping[BucketKey, float]
    empty_ms: Mapping[BucketKey, float] = field(default_factory=dict)

    def seconds(self, key: BucketKey, live: int) -> float | None:
        """Modelled seconds of a call of ``key`` with ``live`` real rows; None for a bucket not measured."""
        full = self.full_ms.get(key)
        if full is None:
            return None
        empty = self.empty_ms.get(key, full)
        return (empty + (full - empty) * min(live, key.batch) / key.batch) / 1000.0

    @classmethod
    def from_warmup(cls, warmup: Mapping[str, Any]) -> ReplayTable:
        """From the ``replay_ms`` and ``empty_replay_ms`` a stateful warm-up reports (``scripts/
        bench_stateful.py`` keeps them in its result), keyed ``"step 64x16"``."""
        try:
            full = {BucketKey.from_label(name): float(ms) for name, ms in warmup["replay_ms"].items()}
            empty = {
                BucketKey.from_label(name): float(ms)
                for name, ms in (warmup.get("empty_replay_ms") or {}).items()
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a stateful warm-up's replay times ({exc!r}): need 'replay_ms'") from exc
        if not full:
            raise ConfigError("a replay table needs at least one measured bucket")
        return cls(full, empty)


@dataclass(frozen=True)
class SimulatedCost:
    """The modelled device time of one call: ``fixed_ms + per_frame_ms * (sum of window frames)``, or the
    ``replays`` table's time for a bucket it measured."""

    fixed_ms: float = 0.0
    per_frame_ms: float = 0.0
    replays: ReplayTable | None = None

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "per_frame_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"simulated cost {name}={value!r} must be a finite number >= 0 ms")

    @classmethod
    def parse(cls, text: str) -> SimulatedCost:
        """``"FIXED,PER_FRAME"`` in milliseconds, e.g. ``"2,0.01"``; a single number is the fixed part."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if not 1 <= len(values) <= 2:
            raise ConfigError(
                f"simulated cost {text!r}: expected 'FIXED,PER_FRAME' in ms (e.g. '2,0.01') or 'FIXED'"
            )
        return cls(values[0], values[1] if len(values) == 2 else 0.0)

    def __str__(self) -> str:
        text = f"{self.fixed_ms:g},{self.per_frame_ms:g}"
        return (
            text
            if self.replays is None
            else f"{text} (measured replays of {len(self.replays.full_ms)} buckets)"
        )


def call_seconds(cost: SimulatedCost, window_frames: Sequence[int]) -> float:
    """Modelled seconds of one device call decoding windows of these lengths as one batch."""
    return (cost.fixed_ms + cost.per_frame_ms * sum(window_frames)) / 1000.0


def bucket_seconds(cost: SimulatedCost, key: BucketKey, live: int) -> float:
    """Modelled seconds of one call of bucket ``key`` with ``live`` real rows: the replay table's time
    where it measured the bucket, else :func:`call_seconds` of the live rows."""
    measured = cost.replays.seconds(key, live) if cost.replays is not None else None
    return measured if measured is not None else call_seconds(cost, [key.frames] * live)


def plan_calls(requests: Sequence[WindowRequest], max_batch: int) -> list[list[int]]:
    """Indices of ``requests`` grouped into device calls: most urgent first, at most ``max_batch`` each.

    A device batches rows of one shape; the simulated one has no shapes, so any windows share a call.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].deadline)
    return [order[i : i + max_batch] for i in range(0, len(order), max_batch)]


def sine_period(hop: int) -> torch.Tensor:
    """``[hop]`` float32: one period of a sine, the shape every stand-in frame repeats."""
    return torch.sin(torch.arange(hop, dtype=torch.float64) * (2 * math.pi / hop)).float()


def stand_in_frames(
    first: torch.Tensor | np.ndarray, period: torch.Tensor | np.ndarray, channels: int
) -> torch.Tensor:
    """``[..., channels, n * hop]`` float32 stand-in audio of frames whose first latent is ``first`` ``[..., n]``.

    The gain is computed in float64 and rounded once: a vectorised ``tanh`` may take another path for a
    remainder of elements, which may differ in the last float32 bit, and a frame's audio must not depend on
    where in a batch it sat. In numpy: it runs on the engine's device thread for every call, and each torch
    call there releases the GIL and takes it back, which costs the event loop a hand-off while it is busy.
    """
    values = first.numpy() if isinstance(first, torch.Tensor) else first
    gain = (0.2 + 0.3 * np.tanh(values.astype(np.float64))).astype(np.float32)  # never silent, inside [-1, 1]
    wave = period if isinstance(period, np.ndarray) else period.numpy()
    mono = (gain[..., :, None] * wave).reshape(*gain.shape[:-1], 1, -1)  # [..., 1, n * hop], fresh
    if channels > 1:
        mono = np.broadcast_to(mono, (*mono.shape[:-2], channels, mono.shape[-1])).copy()
    return torch.from_numpy(mono)


def stand_in_audio(request: WindowRequest, period: torch.Tensor, channels: int) -> torch.Tensor:
    """``[channels, emit_frames * hop]`` float32 for the emitted frames of ``request`` (see module doc)."""
    lo = request.emit_offset
    return stand_in_frames(request.latents[lo : lo + request.emit_frames, 0], period, channels)


@dataclass(eq=False)
class SimulatedTier:
    """The "run a bucket" step of :class:`~streamdec.engine.core.DecodeEngine` when it simulates a device.

    Runs on the engine's device thread: sleeps the modelled cost, then returns stand-in audio. A stateful
    stream's "layer state" is the first latent of its last ``right_frames`` frames (``tails``, one row per
    slot plus the scratch row), so prime, step and flush emit the same frames, as late, as the real ones.
    """

    cost: SimulatedCost
    hop: int
    channels: int
    slots: int = 0
    right_frames: int = 0
    sleep: Callable[[float], None] = time.sleep
    #: where given, calls run on a :class:`~.simdevice.SharedDevice` with these shares of speed while both
    #: lanes run (the engine then waits for them as for a GPU's) instead of sleeping on the device thread
    overlap: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.period = sine_period(self.hop)
        self._wave = self.period.numpy()  # what each call multiplies, read once
        self.tails = np.zeros((self.slots + 1, self.right_frames), np.float32)  # [slots + 1, right_frames]

    def windows(
        self, latents: torch.Tensor | np.ndarray, lo: int, hi: int, seconds: float | None = None
    ) -> torch.Tensor:
        """``[rows, channels, (hi - lo) * hop]`` for frames ``lo:hi`` of windows ``[rows, frames, D]`` (or
        their first latents alone, ``[rows, frames]``), after ``seconds`` (the call's modelled time, as
        :func:`bucket_seconds` gives it; default: a bucket of as many rows as given)."""
        first = _first_of_frames(latents)
        rows, frames = int(first.shape[0]), int(first.shape[1])
        self._wait(seconds, BucketKey(rows, frames, "window"))
        return stand_in_frames(first[:, lo:hi], self._wave, self.channels)

    def call(
        self,
        kind: str,
        slots: torch.Tensor | np.ndarray,
        latents: torch.Tensor | np.ndarray,
        seconds: float | None = None,
    ) -> torch.Tensor:
        """A batched stateful ``kind`` call of rows ``slots`` ``[rows]`` on ``latents`` ``[rows, n, D]`` (or
        their first latents alone, ``[rows, n]``), after ``seconds`` (the call's modelled time, as
        :func:`bucket_seconds` gives it; default: a bucket of as many rows as given).

        Returns ``[rows, channels, emitted * hop]``: ``n - right_frames`` frames for a prime, ``n`` for a
        step, ``n + right_frames`` for a flush (see :class:`~streamdec.engine.base.StepRequest`).
        """
        new = _first_of_frames(latents)  # [rows, n]; numpy, as stand_in_frames says why
        n = int(new.shape[1])
        self._wait(seconds, BucketKey(int(new.shape[0]), n, kind))
        r = self.right_frames
        rows = slots.numpy() if isinstance(slots, torch.Tensor) else slots
        seq = new if kind == "prime" else np.concatenate([self.tails[rows], new], axis=1)
        emitted = n - r if kind == "prime" else n if kind == "step" else n + r
        if kind != "flush":
            self.tails[rows] = seq[:, seq.shape[1] - r :]
        return stand_in_frames(seq[:, :emitted], self._wave, self.channels)

    def _wait(self, seconds: float | None, key: BucketKey) -> None:
        """Sleep ``seconds``, or where not given the cost of a call of ``key`` with every row live."""
        delay = seconds if seconds is not None else bucket_seconds(self.cost, key, key.batch)
        if delay > 0:  # cost 0,0 (the host path alone): nothing to wait
            self.sleep(delay)


def _first_of_frames(latents: torch.Tensor | np.ndarray) -> np.ndarray:
    """The first latent of each frame as float32 numpy ``[rows, frames]``, from ``[rows, frames, D]`` or
    from those first latents already."""
    if isinstance(latents, torch.Tensor):
        if latents.dtype != torch.float32 or latents.requires_grad:
            latents = latents.detach().float()
        latents = latents.numpy()
    first = latents[:, :, 0] if latents.ndim == 3 else latents
    return first if first.dtype == np.float32 else first.astype(np.float32)


#: stateful slots of a simulated engine when none are asked for: host-path runs hold thousands of streams,
#: and a simulated slot is ``right_frames`` floats
DEFAULT_SIMULATED_SLOTS = 4096


def simulated_engine(
    codec: Codec,
    *,
    cost: SimulatedCost | None = None,
    max_batch: int = 256,
    max_streams: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    overlap: tuple[float, float] | None = None,
    **options: Any,
) -> DecodeEngine:
    """A :class:`~streamdec.engine.core.DecodeEngine` whose device is simulated (see the module docstring).

    ``max_batch`` is the largest batch bucket (the buckets are the powers of two below it, and it);
    ``max_streams`` the stateful slots (0: halo windows only); ``sleep`` waits the modelled cost on the
    engine's device thread (tests pass one that blocks until released). ``overlap``: run the calls on a
    modelled device whose two lanes (``edge_lane=True``) run at once, each at that share of its speed
    while the other runs too (:mod:`.simdevice`), instead. Other ``options`` go to the engine.
    """
    from .core import DecodeEngine  # the engine imports this module for its tier

    if max_batch < 1:
        raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
    buckets = sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})
    engine = DecodeEngine(
        codec,
        simulated=cost or SimulatedCost(),
        batch_buckets=buckets,
        max_streams=max_streams,
        **options,
    )
    assert engine.simulated is not None
    engine.simulated.sleep = sleep
    engine.simulated.overlap = overlap
    return engine
