"""Graph tiers of the GPU engine: compiled bucket graphs, plain graphs in retiring generations, eager.

Every method here runs on the engine's device thread, with the engine's CUDA stream current; nothing is
thread-safe on its own.

Tiers, tried in order for a ``(batch, frames)`` key:

1. *Bucket graphs*, made by :meth:`GraphTiers.warm` at start-up for every planner window size and batch
   bucket: ``torch.compile`` of the decode, then one CUDA graph per key (tier ``compiled``), or a plain
   capture of the eager decode when compile is off or failed (tier ``graph``). They share one private
   memory pool for the engine's lifetime: replays are serialised on one stream, so a graph's
   intermediates may reuse another's; only each graph's static input and output stay reserved. Where a
   second lane replays stateful primes and flushes beside the steps (:mod:`.lanes`), their graphs share
   a pool of their own, since a replay on one lane may run while one on the other does.
2. *Ad-hoc plain graphs*, captured on first use for any other key (a clip shorter than the smallest window
   arrives with its own length; never a primes' or flushes' call on a second lane, which decodes
   eagerly instead). They live in a *generation* with its own private pool. When
   ``max_graphs`` is reached the whole generation is retired (stream synchronised, every graph and pool
   dropped) and a fresh one begins. Evicting single graphs from a shared pool is unsafe: a survivor's
   replay could write memory that the evicted graph's pool handed back to someone else.
3. *Eager*: graphs off (``graphs=False`` or ``STREAMDEC_NO_GRAPHS=1``), a capture that failed, or a call
   made while a capture is under way on this thread.

After :meth:`GraphTiers.freeze`, a key with no graph raises :class:`~streamdec.errors.CaptureFrozenError`,
or, with ``on_frozen_miss="eager"``, decodes eagerly and counts it (tier ``eager-frozen``): never a silent
capture stall in the middle of serving.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from .. import settings
from ..errors import CaptureFrozenError, ConfigError
from ..kernels.availability import HAS_TRITON
from .lanes import EDGE, lane_of
from .scheduler import BucketKey
from .slots import StatePool

__all__ = ["CapturedGraph", "Forward", "GraphTiers", "TierOptions", "env_flag", "static_forward"]

log = logging.getLogger("streamdec.engine")

Forward = Callable[[Tensor], Tensor]  # normalised latents [B, T, D] -> float32 audio [B, C, T * hop]
DynamicMode = Literal["none", "batch", "all"]


def env_flag(name: str) -> bool:
    """The declared switch ``name``, parsed by :mod:`streamdec.settings` (e.g. ``STREAMDEC_NO_GRAPHS``)."""
    return settings.flag(name)


def static_forward(codec: Any) -> Forward:
    """The codec's decode without input validation or host syncs, safe to capture in a CUDA graph.

    Same arithmetic as ``Codec.decode`` (denormalise, synthesise, cast to float32) on a latents tensor
    that is already on the codec's device and dtype.
    """

    def forward(z: Tensor) -> Tensor:  # [B, T, D] -> [B, C, T * hop]
        audio: Tensor = codec.synthesize(codec.denormalize(z).transpose(1, 2))
        return audio.float()

    return forward


@dataclass(frozen=True)
class TierOptions:
    """Validated tier settings; see :class:`~streamdec.engine.core.DecodeEngine` for their meaning."""

    graphs: bool = True
    compile: bool = True
    compile_dynamic: DynamicMode = "batch"
    compile_mode: str | None = None
    max_graphs: int = 16
    on_frozen_miss: Literal["error", "eager"] = "error"
    inductor_cache_dir: str | None = None
    parallel_compile: bool = True  # Triton variants compiled side by side before the captures

    def __post_init__(self) -> None:
        if self.max_graphs < 1:
            raise ConfigError(f"max_graphs must be >= 1, got {self.max_graphs}")
        if self.compile_dynamic not in ("none", "batch", "all"):
            raise ConfigError(
                f"compile_dynamic must be 'none', 'batch' or 'all', got {self.compile_dynamic!r}"
            )
        if self.on_frozen_miss not in ("error", "eager"):
            raise ConfigError(f"on_frozen_miss must be 'error' or 'eager', got {self.on_frozen_miss!r}")


@dataclass(eq=False)
class CapturedGraph:
    """One captured decode: replay after writing ``static_in``; read ``static_out`` before the next replay."""

    key: BucketKey
    tier: str  # "compiled" or "graph"
    graph: torch.cuda.CUDAGraph
    static_in: Tensor  # [batch, frames, latent_dim] on the device
    static_out: Tensor  # [batch, channels, frames * hop] float32 on the device
    generation: int  # -1 for the permanent bucket pool
    replay_ms: float | None = None
    # A stateful call's (kind != "window") [batch + 1] int64: each row's state slot, then how many rows
    # are real (the first ones; the kernels skip the rest).
    static_slots: Tensor | None = None
    empty_ms: float | None = None  # a stateful replay with no real row: what the bucket costs by itself


@dataclass(eq=False)
class _Generation:
    index: int
    pool: Any  # an opaque torch graph-pool handle
    graphs: dict[BucketKey, CapturedGraph] = field(default_factory=dict)


class GraphTiers:
    """Owns every graph and pool of one engine (see the module docstring)."""

    def __init__(
        self,
        forward: Forward,
        *,
        latent_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        stream: torch.cuda.Stream | None,
        pad_latent: Tensor,
        options: TierOptions,
        shapes: Callable[[], str] | None = None,
    ) -> None:
        self.forward = forward
        # what fixes the kernels ``forward`` launches besides the keys (layer shapes, precision): the
        # parallel precompile's warm-cache marker is keyed by it; None: no marker, always discover
        self.shapes = shapes
        self.latent_dim = latent_dim
        self.dtype = dtype
        self.device = device
        self.stream = stream
        self.pad_latent = pad_latent
        self.options = options
        self.frozen = False
        self.state: StatePool | None = None  # the stateful streams' pool, where the engine keeps one
        self.buckets: dict[BucketKey, CapturedGraph] = {}
        self.failed: list[BucketKey] = []
        self.retired_generations = 0
        self._bucket_pool: Any = None
        self._edge_pool: Any = None  # the second lane's bucket graphs' pool (see the module docstring)
        self._generation: _Generation | None = None
        self._compiled: Forward | None = None
        self._capturing = False
        # where the captures' seconds go (the warm-up's note): eager runs, recording, timing replays
        self.capture_seconds = {"eager": 0.0, "capture": 0.0, "timing": 0.0}
        self._ran: set[tuple[str, int]] = set()  # (kind, frames) of calls run eagerly here at least once
        self.recorded_straight = 0  # captures that needed no run first (_record_loaded)
        self.recordings_dropped = 0  # recordings without a run first that met a variant not yet loaded

    # -- lookup ---------------------------------------------------------------------------------------

    @property
    def graphs_enabled(self) -> bool:
        return self.options.graphs and self.device.type == "cuda"

    def lookup(self, key: BucketKey) -> CapturedGraph | None:
        """The graph to replay for ``key``; None means decode eagerly. May capture (tier 2) or raise."""
        if not self.graphs_enabled or self._capturing:
            return None
        graph = self.buckets.get(key)
        if graph is not None:
            return graph
        if key in self.failed:
            return None  # its capture failed once: eager from now on, no retry per call
        gen = self._generation
        if gen is not None and key in gen.graphs:
            return gen.graphs[key]
        if self.frozen:
            if self.options.on_frozen_miss == "eager":
                return None
            raise CaptureFrozenError(
                f"no graph for batch={key.batch} x frames={key.frames} and the engine is frozen: warm up "
                f"this window size (warmup(window_sizes=...)), or build the engine with "
                f"on_frozen_miss='eager', or set STREAMDEC_NO_GRAPHS=1"
            )
        return self._capture_adhoc(key)

    def is_frozen_miss(self, key: BucketKey) -> bool:
        """True when ``key`` has no graph only because the engine is frozen (counted as such)."""
        gen = self._generation
        return (
            self.graphs_enabled
            and self.frozen
            and key not in self.buckets
            and not (gen is not None and key in gen.graphs)
        )

    @property
    def graph_count(self) -> int:
        return len(self.buckets) + (len(self._generation.graphs) if self._generation else 0)

    def freeze(self) -> None:
        self.frozen = True

    # -- warm-up: the permanent bucket pool ------------------------------------------------------------

    def warm(self, keys: Sequence[BucketKey]) -> list[str]:
        """Compile and/or capture every key into the bucket pool, largest first; returns notes."""
        notes: list[str] = []
        if not self.graphs_enabled:
            for kind, frames in sorted({(k.kind, k.frames) for k in keys}):
                self._run_eager_once(BucketKey(1, frames, kind))
            return ["graphs off: eager decode warmed only"]
        if self._bucket_pool is None:
            self._bucket_pool = torch.cuda.graph_pool_handle()
        if self._edge_pool is None and self._lanes > 1:
            self._edge_pool = torch.cuda.graph_pool_handle()
        # Largest first: the shared pool is sized by the first capture, later ones reuse its blocks.
        todo = [
            key
            for key in sorted(set(keys), key=lambda k: (k.frames * k.batch, k.frames), reverse=True)
            if key not in self.buckets
        ]
        if self.options.parallel_compile:
            notes.extend(self._precompile(todo))
        before, straight, dropped = (
            dict(self.capture_seconds),
            self.recorded_straight,
            self.recordings_dropped,
        )
        for key in todo:
            graph = self._warm_one(key, notes)
            if graph is not None:
                self.buckets[key] = graph
        spent = {name: self.capture_seconds[name] - before[name] for name in before}
        notes.append(
            f"{len(todo)} captures: {self.recorded_straight - straight} without a run first "
            f"({self.recordings_dropped - dropped} such recordings dropped), "
            f"{spent['eager']:.1f} s running shapes first, {spent['capture']:.1f} s recording, "
            f"{spent['timing']:.1f} s timing replays"
        )
        return notes

    def _precompile(self, keys: Sequence[BucketKey]) -> list[str]:
        """Have every Triton variant ``keys`` will launch compiled and loaded before any capture needs it
        (:mod:`streamdec.kernels.precompile`): one pass over the keys finds them, launching nothing new,
        worker processes compile them, and this process loads them. Where an earlier warm-up of the same
        fingerprint listed its variants in Triton's cache directory, they are only loaded. A failure only
        means each variant compiles or loads at its first launch, as without this step."""
        if not keys or not HAS_TRITON:
            return []
        from streamdec.kernels import precompile

        marker = precompile.warm_marker(self._variant_fingerprint(keys)) if self.shapes else None
        known = precompile.read_marker(marker) if marker is not None else None
        if known is not None:
            loaded = self._load_variants(known)
            return [f"Triton variants: precompiled in the on-disk cache by an earlier warm-up; {loaded}"]
        began = time.perf_counter()
        assert self.stream is not None
        try:
            with torch.cuda.stream(self.stream), precompile.discovering() as found:
                for key in keys:
                    self._run_eager_once(key)
                if self.state is not None:  # the skipped launches left garbage in the scratch row's state
                    self.state.flat.zero_()
            self.stream.synchronize()
            looked = time.perf_counter() - began
            report = precompile.compile_variants(found, precompile.current_target())
            # Each call ran once (its Triton launches skipped, everything else done): what a run first
            # initialises lazily is done, and the variants are loaded below, so captures need no run first.
            self._ran.update((key.kind, key.frames) for key in keys)
        except Exception as exc:
            log.warning(
                "precompiling the warm-up's Triton variants failed (%s); each compiles at first launch", exc
            )
            return [f"Triton variants not precompiled: {type(exc).__name__}: {exc}"]
        if marker is not None and report.failed == 0:
            precompile.write_marker(marker, found)
        return [f"{report.describe()} (found in {looked:.1f} s); {self._load_variants(found)}"]

    def _load_variants(self, variants: list[Any]) -> str:
        from streamdec.kernels import precompile

        with torch.cuda.device(self.device):
            report = precompile.load_variants(variants)
        if report.failed:
            log.warning("loading the warm-up's Triton variants: %s", report.describe())
        return report.describe()

    def _variant_fingerprint(self, keys: Sequence[BucketKey]) -> str:
        """Everything the kernel variants of a warm-up of ``keys`` depend on."""
        import triton

        assert self.shapes is not None
        props = torch.cuda.get_device_properties(self.device)
        kernels = Path(__file__).resolve().parents[1] / "kernels"
        sources = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(kernels.glob("*.py")))).hexdigest()
        return "|".join([
            self.shapes(), repr(sorted(keys)), str(self.dtype), props.name, str(props.multi_processor_count),
            torch.__version__, triton.__version__, sources, repr(settings.recorded()),
        ])  # fmt: skip

    def _warm_one(self, key: BucketKey, notes: list[str]) -> CapturedGraph | None:
        if self.options.compile and key.kind == "window":
            try:
                began = time.perf_counter()
                graph = self._capture(key, self._compiled_forward(), "compiled", self._pool_for(key), -1)
                notes.append(f"compiled {key.batch}x{key.frames} in {time.perf_counter() - began:.1f} s")
                return graph
            except Exception as exc:  # a compile or capture failure falls back to tier 2, loudly
                log.warning(
                    "compile/capture of bucket %s failed (%s); falling back to a plain graph", key, exc
                )
                notes.append(f"compiled {key.batch}x{key.frames} failed: {type(exc).__name__}: {exc}")
                self.failed.append(key)
        try:
            return self._capture(key, None, "graph", self._pool_for(key), -1)
        except Exception as exc:
            log.warning("plain capture of bucket %s failed (%s); it decodes eagerly", key, exc)
            notes.append(f"graph {key.batch}x{key.frames} failed: {type(exc).__name__}: {exc}")
            if key not in self.failed:
                self.failed.append(key)
            return None

    @property
    def _lanes(self) -> int:
        return 1 if self.state is None else self.state.lanes

    def _pool_for(self, key: BucketKey) -> Any:
        """The bucket pool ``key``'s graph draws on: its lane's."""
        return self._edge_pool if lane_of(key.kind, self._lanes) == EDGE else self._bucket_pool

    def _compiled_forward(self) -> Forward:
        if self._compiled is None:
            if self.options.inductor_cache_dir:
                settings.check_inductor_cache_dir(self.options.inductor_cache_dir)  # process-wide
            self._compiled = torch.compile(self.forward, dynamic=None, mode=self.options.compile_mode)
        return self._compiled

    # -- ad-hoc generations -----------------------------------------------------------------------------

    def _capture_adhoc(self, key: BucketKey) -> CapturedGraph | None:
        if lane_of(key.kind, self._lanes) == EDGE:
            return None  # a generation's pool serves the main lane alone (module docstring): eager
        gen = self._generation
        if gen is not None and len(gen.graphs) >= self.options.max_graphs:
            self.retire_generation()
            gen = None
        if gen is None:
            index = self.retired_generations + (1 if self._generation is None else 0)
            gen = self._generation = _Generation(index, torch.cuda.graph_pool_handle())
        try:
            graph = self._capture(key, None, "graph", gen.pool, gen.index)
        except Exception as exc:
            log.warning("capture of %s failed (%s); decoding it eagerly", key, exc)
            self.failed.append(key)
            return None
        gen.graphs[key] = graph
        return graph

    def retire_generation(self) -> None:
        """Drop every ad-hoc graph and its pool at once, after all work on the stream has finished."""
        if self._generation is None:
            return
        if self.stream is not None:
            self.stream.synchronize()  # no replay or copy-out may still read the generation's memory
        self._generation.graphs.clear()
        self._generation = None
        self.retired_generations += 1
        torch.cuda.empty_cache()  # hand the released pool's blocks back to the device

    # -- capture --------------------------------------------------------------------------------------

    def random_input(self, key: BucketKey, seed: int = 0) -> Tensor:
        gen = torch.Generator(device="cpu").manual_seed(seed + 7919 * key.frames + key.batch)
        x = torch.randn(key.batch, key.frames, self.latent_dim, generator=gen, dtype=torch.float32)
        return x.to(device=self.device, dtype=self.dtype)

    def _capture(
        self,
        key: BucketKey,
        fn: Forward | None,
        tier: str,
        pool: Any,
        generation: int,
    ) -> CapturedGraph:
        """Capture ``fn`` (None: the plain call for ``key``'s kind) on a static input of ``key``'s shape."""
        assert self.stream is not None
        with self._dynamo_config(), torch.cuda.stream(self.stream):
            static_slots = None
            if fn is None:
                fn, static_slots = self._plain_call(key)
            static_in = self.random_input(key)  # random, never zeros: a bad capture must show in the output
            if tier == "compiled":
                self._mark_dynamic(static_in)
            began = time.perf_counter()
            call_shape = (key.kind, key.frames)
            recorded = (
                self._record_loaded(fn, static_in, pool)
                if tier == "graph" and call_shape in self._ran
                else None
            )
            if recorded is not None:
                graph, static_out = recorded
                self.recorded_straight += 1
                recording = began
            else:
                # Lazy init, Triton's compiles and cuDNN's heuristics happen here, outside the capture; a
                # compiled function runs twice, since its first call may recompile for the marked dimensions.
                self.capture_seconds["capture"] += time.perf_counter() - began  # a dropped recording's
                began = time.perf_counter()
                for _ in range(2 if tier == "compiled" else 1):
                    fn(static_in)
                self.stream.synchronize()
                self._ran.add(call_shape)
                recording = time.perf_counter()
                graph, static_out = self._record(fn, static_in, pool)
            captured = CapturedGraph(key, tier, graph, static_in, static_out, generation, None, static_slots)
            timing = time.perf_counter()
            captured.replay_ms = self._time_replay(captured)
            if static_slots is not None:
                static_slots[key.batch] = 0
                captured.empty_ms = self._time_replay(captured, first=False)
                static_slots[key.batch] = key.batch
            done = time.perf_counter()
        for name, seconds in (
            ("eager", recording - began),
            ("capture", timing - recording),
            ("timing", done - timing),
        ):
            self.capture_seconds[name] += seconds
        return captured

    def _record(self, fn: Forward, static_in: Tensor, pool: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Capture one call of ``fn`` on ``static_in`` into a graph drawing on ``pool``."""
        assert self.stream is not None
        graph = torch.cuda.CUDAGraph()
        self._capturing = True
        # torch.cuda.graph() would also synchronize the device and empty the allocator's cache before
        # every capture, to free memory for it; a warm-up records 80 graphs in a row into one pool, and
        # the emptied cache only made the next eager run allocate its blocks from the driver again.
        try:
            with torch.cuda.stream(self.stream):
                graph.capture_begin(pool, capture_error_mode="thread_local")
                try:
                    static_out = fn(static_in)
                finally:
                    graph.capture_end()
        finally:
            self._capturing = False
        return graph, static_out

    def _record_loaded(
        self, fn: Forward, static_in: Tensor, pool: Any
    ) -> tuple[torch.cuda.CUDAGraph, Any] | None:
        """Capture ``fn`` without running it first, where that records what a run first would have let
        the capture record; None (nothing captured) where it would not.

        The run first is there for what a first launch does outside the kernel: lazy initialisation of the
        process and of each torch kernel (done by an earlier run of the same kind and length, which the
        caller checks), and loading each Triton variant the launch needs into this process. A launch whose
        variant is not loaded yet is declined, not loaded mid-capture (:func:`precompile.discovering`), and
        such a recording is dropped: the caller runs the call first, then captures it, as always. Every
        other recording is the same sequence of launches with the same arguments, so the graph is the one
        the run-first way would have captured. For a plain graph that skips a whole eager call, most of
        the warm-up's time on a warm host."""
        if not HAS_TRITON:
            return None
        from streamdec.kernels import precompile

        try:
            with precompile.discovering() as missing:
                graph, static_out = self._record(fn, static_in, pool)
        except Exception as exc:  # whatever a capture of a call never run can trip on: the usual way
            log.debug("capture without a run first failed (%s); running it first", exc)
            return None
        if missing:
            graph.reset()
            self.recordings_dropped += 1
            return None
        return graph, static_out

    def _time_replay(self, captured: CapturedGraph, first: bool = True) -> float:
        """Device ms of one replay; ``first``: the graph has not been replayed yet, and its first replay
        (which pays one-off costs) is made untimed before it."""
        assert self.stream is not None
        if first:
            captured.graph.replay()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record(self.stream)
        captured.graph.replay()
        end.record(self.stream)
        end.synchronize()
        return float(start.elapsed_time(end))

    def _mark_dynamic(self, x: Tensor) -> None:
        # A dynamic batch lets one compile serve many batch buckets of a window size ("batch"), or many
        # window sizes too ("all"). "maybe": dynamo may still split the range where a kernel choice
        # depends on the size (convolution layouts split at batch 16 on some backends) and recompiles
        # outside it; a strict mark_dynamic would raise instead. Size 1 is always specialised.
        mode = self.options.compile_dynamic
        if mode == "none":
            return
        if x.shape[0] >= 2:
            torch._dynamo.maybe_mark_dynamic(x, 0)
        if mode == "all":
            torch._dynamo.maybe_mark_dynamic(x, 1)

    @contextlib.contextmanager
    def _dynamo_config(self) -> Iterator[None]:
        # Static shapes per bucket unless marked: no automatic dynamic-shape recompiles, and a recompile
        # limit above the number of buckets (the default of 8 would silently fall back to eager).
        patch: dict[str, Any] = {"automatic_dynamic_shapes": False}
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        for name in (limit, "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                patch[name] = max(int(getattr(torch._dynamo.config, name)), 512)
        with torch._dynamo.config.patch(**patch):
            yield

    def _plain_call(self, key: BucketKey) -> tuple[Forward, Tensor | None]:
        """The uncompiled call for ``key``; a stateful call reads its slots and its count of real rows
        from a static tensor that the graph keeps (every row the scratch slot, and every row real, until
        a replay writes the real ones)."""
        if key.kind == "window":
            return self.forward, None
        pool = self._state_pool()
        static = torch.full(
            (key.batch + 1,), pool.scratch_row(key.kind), dtype=torch.int64, device=self.device
        )
        static[key.batch] = key.batch
        slots, live = static[: key.batch], static[key.batch :]
        call = pool.fn(key.kind)
        return (lambda z: call(slots, z, live)), static

    def _state_pool(self) -> StatePool:
        if self.state is None:
            raise ConfigError("a stateful call on an engine built without max_streams: use mode='halo'")
        return self.state

    def _run_eager_once(self, key: BucketKey) -> None:
        """The call ``key``'s capture makes, once: it launches the kernel variants the capture will (a
        stateful call's, which read the count of real rows, among them)."""
        with torch.inference_mode():
            call, _ = self._plain_call(key)
            call(self.random_input(key))

    def eager(self, x: Tensor) -> Tensor:
        """Tier 3: the plain decode of ``x`` ``[B, T, D]`` on the current stream."""
        return self.forward(x)

    def eager_call(self, kind: str, slots: Tensor, x: Tensor) -> Tensor:
        """Tier 3 of a stateful call: ``x`` ``[B, T, D]`` for the streams in ``slots`` ``[B]``."""
        return self._state_pool().fn(kind)(slots, x)
