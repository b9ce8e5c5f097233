"""Compile a warm-up's Triton kernel variants in parallel processes before its first launch needs them.

Triton compiles one binary per constexpr set the first time a launch asks for it, on the launching
thread, one at a time: on a host with a cold cache that is most of a GPU warm-up (the stateful
``auk-24k`` buckets alone ask for a few dozen variants at one to three seconds each). Which variants a
warm-up needs depends only on shapes, never on values, so they can be found before any is compiled:

1. :func:`discovering` - the warm-up runs its calls once while Triton's compile hook declines every
   compile it is asked for and records it (Triton then skips that launch, so outputs are garbage and the
   pass costs only the host's work);
2. :func:`compile_variants` - worker processes compile the recorded variants side by side
   (``JITFunction.preload`` of each variant's own specialization record) into Triton's on-disk cache;
3. the warm-up proper runs as before, and each first launch loads its binary from that cache.

Nothing here changes a binary: a worker compiles the specialization the launch would have compiled, in
the same environment, so the cache key is the same. Where a step fails (no spawn, a worker error), the
launch compiles the variant itself, as it would have anyway.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CompileReport", "Variant", "compile_variants", "default_workers", "discovering"]


@dataclass(frozen=True)
class Variant:
    """One kernel binary a launch asked for: the kernel (module and name) and Triton's specialization
    record of it (JSON: signature, constexprs, attributes, options)."""

    module: str
    name: str
    specialization: str


@dataclass(frozen=True)
class CompileReport:
    variants: int
    workers: int
    seconds: float
    failed: int = 0

    def describe(self) -> str:
        failed = f", {self.failed} left to their first launch" if self.failed else ""
        where = f"compiled in {self.workers} processes" if self.workers else "loaded from the on-disk cache"
        return f"{self.variants} Triton variants {where} in {self.seconds:.1f} s{failed}"


@contextlib.contextmanager
def discovering() -> Iterator[list[Variant]]:
    """Within the block every Triton compile is declined and recorded, and its launch skipped.

    Only for a pass whose outputs nobody reads: a launch that needs a new binary does nothing. Launches
    of variants already compiled in this process still run."""
    from triton import knobs

    found: list[Variant] = []
    seen: set[tuple[str, str, str]] = set()

    def decline(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        key = (fn.module, fn.name, str(compile["key"]))
        if key not in seen:
            seen.add(key)
            found.append(Variant(fn.module, fn.name, compile["specialization_data"]))
        return True  # Triton: "handled", so it neither compiles nor launches

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = decline
    try:
        yield found
    finally:
        knobs.runtime.jit_cache_hook = saved


def default_workers() -> int:
    """Processes for :func:`compile_variants`: every core but one (this process's), at most 16."""
    return max(1, min(16, (os.cpu_count() or 2) - 1))


#: a variant that loads this fast was in the on-disk cache already: the rest load in this process
CACHED_LOAD_S = 0.5


def compile_variants(variants: list[Variant], workers: int | None = None) -> CompileReport:
    """Make every variant in ``variants`` ready to launch; blocks until done.

    The first is loaded here: if that was quick the on-disk cache holds this warm-up's binaries (a warm
    start), and the rest load here too, since spawning workers would cost more than it saves. Otherwise
    the rest compile in ``workers`` spawned processes (CUDA must not be forked) into the on-disk cache.
    Variants that fail are counted, not raised: their first launch compiles them (and raises there, with
    the launch's context, if they really cannot)."""
    began = time.perf_counter()
    if not variants:
        return CompileReport(0, 0, 0.0)
    first, rest = variants[0], variants[1:]
    failed = 0 if _try(first) else 1
    if time.perf_counter() - began < CACHED_LOAD_S:
        failed += sum(not _try(v) for v in rest)
        return CompileReport(len(variants), 0, time.perf_counter() - began, failed)
    count = min(len(rest), workers or default_workers())
    if count:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
            futures = [pool.submit(_compile_one, v.module, v.name, v.specialization) for v in rest]
            failed += sum(f.exception() is not None for f in concurrent.futures.as_completed(futures))
    return CompileReport(len(variants), count, time.perf_counter() - began, failed)


def _try(variant: Variant) -> bool:
    try:
        _compile_one(variant.module, variant.name, variant.specialization)
    except Exception:
        return False
    return True


def _compile_one(module: str, name: str, specialization: str) -> None:
    # In a fresh process: the kernel's module is imported here, and its JITFunction compiles the variant
    # from the record exactly as a launch would, writing the binary to the shared on-disk cache.
    kernel = getattr(importlib.import_module(module), name)
    kernel.preload(specialization)
