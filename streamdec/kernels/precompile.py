"""Compile a warm-up's Triton kernel variants in parallel processes before its first launch needs them.

Triton compiles one binary per constexpr set the first time a launch asks for it, on the launching
thread, one at a time: on a host with a cold cache that is most of a GPU warm-up (the stateful
``auk-24k`` buckets ask for 46 variants, about 40 s of compiling). Which variants a warm-up needs
depends only on shapes, never on values, so they can be found before any is compiled:

1. :func:`discovering` - the warm-up runs its calls once while Triton's compile hook declines every
   compile it is asked for and records it; the variant's launches are skipped, so outputs are garbage
   and the pass costs only the host's work;
2. :func:`compile_variants` - worker processes compile the recorded variants side by side into Triton's
   on-disk cache, each from the specialization record Triton wrote for it, for the GPU the warm-up runs
   on (the workers need no GPU);
3. :func:`load_variants` - this process loads every recorded binary from that cache into Triton's
   in-process kernel caches (what a first launch would do), so the warm-up's captures need no launch
   first to load them.

Nothing here changes a binary: a worker compiles the source, specialization and options the launch
would have compiled, so Triton's cache key is the same. Where a step fails (no spawn, a worker error),
the launch compiles the variant itself, as it would have anyway. :func:`warm_marker` names a file in
Triton's cache directory that lists the variants of a warm-up with this fingerprint, precompiled there
(:func:`write_marker`, :func:`read_marker`), so a warm start skips the discovery pass and only loads them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CompileReport",
    "LoadReport",
    "Variant",
    "compile_variants",
    "current_target",
    "default_workers",
    "discovering",
    "load_variants",
    "read_marker",
    "warm_marker",
    "write_marker",
]


@dataclass(frozen=True)
class Variant:
    """One kernel binary a launch asked for: the kernel (module and name) and Triton's specialization
    record of it (JSON: signature, constexprs, attributes, options)."""

    module: str
    name: str
    specialization: str


@dataclass(frozen=True)
class _Report:
    """What one step did with a warm-up's variants; a variant it failed is left to its first launch."""

    variants: int
    seconds: float
    failed: int = 0
    first_error: str = ""

    def describe(self) -> str:
        failed = f", {self.failed} left to their first launch ({self.first_error})" if self.failed else ""
        return f"{self.variants} Triton variants {self._done()} in {self.seconds:.1f} s{failed}"

    def _done(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class CompileReport(_Report):
    workers: int = field(kw_only=True)

    def _done(self) -> str:
        return f"compiled in {self.workers} processes"


@dataclass(frozen=True)
class LoadReport(_Report):
    def _done(self) -> str:
        return "loaded"


def _failures(errors: list[BaseException]) -> dict[str, Any]:
    """A report's failure fields: how many, and the first one's type and message."""
    first = f"{type(errors[0]).__name__}: {errors[0]}"[:200] if errors else ""
    return {"failed": len(errors), "first_error": first}


class _Skipped:
    """Stands in Triton's in-process kernel cache for a declined variant while discovery runs, so the
    variant's later launches do nothing at once instead of asking the compile hook again."""

    function = None
    packed_metadata = None

    def launch_metadata(self, *args: Any) -> None:
        return None

    def run(self, *args: Any) -> None:
        return None


@contextlib.contextmanager
def discovering() -> Iterator[list[Variant]]:
    """Within the block every Triton compile is declined and recorded, and its launches skipped.

    Only for a pass whose outputs nobody reads: a launch that needs a new binary does nothing. Launches
    of variants already compiled in this process still run. On leaving, Triton's caches are as before."""
    from triton import knobs

    found: list[Variant] = []
    stand_ins: list[tuple[dict[str, Any], str]] = []

    def decline(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        found.append(Variant(fn.module, fn.name, compile["specialization_data"]))
        cache = fn.jit_function.device_caches[compile["device"]][0]
        cache[compile["key"]] = _Skipped()
        stand_ins.append((cache, compile["key"]))
        return True  # Triton: "handled", so it neither compiles nor launches this time

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = decline
    try:
        yield found
    finally:
        knobs.runtime.jit_cache_hook = saved
        for cache, key in stand_ins:
            if isinstance(cache.get(key), _Skipped):
                del cache[key]


def current_target() -> Any:
    """Triton's target for the current CUDA device (what the workers compile for)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_target()


def default_workers() -> int:
    """Processes for :func:`compile_variants`: every core but one (this process's), at most 16."""
    return max(1, min(16, (os.cpu_count() or 2) - 1))


def compile_variants(variants: list[Variant], target: Any, workers: int | None = None) -> CompileReport:
    """Compile ``variants`` for ``target`` in ``workers`` spawned processes into Triton's on-disk cache;
    blocks until all are done. Variants that fail are counted, not raised: their first launch compiles
    them (and raises there, with the launch's context, if they really cannot)."""
    began = time.perf_counter()
    count = min(len(variants), workers or default_workers())
    if count == 0:
        return CompileReport(0, 0.0, workers=0)
    errors: list[BaseException] = []
    context = multiprocessing.get_context("spawn")  # this process holds CUDA: never fork it
    with concurrent.futures.ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        futures = [pool.submit(_compile_one, v.module, v.name, v.specialization, target) for v in variants]
        for future in concurrent.futures.as_completed(futures):
            error = future.exception()
            if error is not None:
                errors.append(error)
    return CompileReport(len(variants), time.perf_counter() - began, workers=count, **_failures(errors))


def load_variants(variants: list[Variant]) -> LoadReport:
    """Load each of ``variants`` from Triton's on-disk cache into this process, as its first launch
    would: into its kernel's in-process cache, with its module loaded on the current CUDA device. A
    launch of a loaded variant then does no compile lookup and loads nothing, so a graph capture can
    record it without a run first. Failures are counted, not raised: such a variant loads (or compiles)
    at its first launch, as it would have without this step."""
    began = time.perf_counter()
    errors: list[BaseException] = []
    for variant in variants:
        try:
            kernel = getattr(importlib.import_module(variant.module), variant.name)
            # Triton's own inverse of the compile hook's record: it rebuilds the specialization, finds
            # the binary in the on-disk cache (compiling only on a miss) and keeps it under the record's
            # key, the key a launch with these arguments looks up.
            compiled = kernel.preload(variant.specialization)
            if compiled is None:
                raise RuntimeError("Triton's preload returned no kernel")
            compiled._init_handles()  # the module load a first launch would do (never mid-capture)
        except Exception as exc:
            errors.append(exc)
    return LoadReport(len(variants), time.perf_counter() - began, **_failures(errors))


def warm_marker(fingerprint: str) -> Path:
    """The file in Triton's cache directory that lists the variants of a warm-up with ``fingerprint``
    (whatever fixes its variants: layer shapes, precision, buckets, GPU, versions), precompiled into it."""
    from triton import knobs

    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:24]
    return Path(knobs.cache.dir) / f"streamdec-variants-{digest}.json"


def write_marker(marker: Path, variants: list[Variant]) -> None:
    """Record ``variants`` as precompiled for ``marker``'s warm-up; written whole or not at all (a
    concurrent reader never sees half a list)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    records = [{"module": v.module, "name": v.name, "specialization": v.specialization} for v in variants]
    partial = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(records))
    partial.replace(marker)


def read_marker(marker: Path) -> list[Variant] | None:
    """The variants :func:`write_marker` recorded for ``marker``'s warm-up; None where there is no such
    marker or it cannot be read (the warm-up then discovers its variants again)."""
    try:
        records = json.loads(marker.read_text())
        return [Variant(r["module"], r["name"], r["specialization"]) for r in records]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _compile_one(module: str, name: str, specialization: str, target: Any) -> None:
    # In a fresh process (no CUDA needed): the kernel's module is imported here and the variant compiled
    # from Triton's record of it, rebuilt as JITFunction.preload rebuilds it, for the given target.
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend

    kernel = getattr(importlib.import_module(module), name)
    source: Any = ASTSource
    if type(kernel).__name__ == "GluonJITFunction":  # a Gluon kernel's source carries its layouts
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource
    record = json.loads(specialization)
    constexprs = {
        tuple(path): (
            tl.dtype(value)
            if tl.dtype.is_dtype(value)
            else tl.constexpr(value["constexpr"])
            if isinstance(value, dict) and "constexpr" in value
            else value
        )
        for path, value in zip(record["constant_keys"], record["constant_vals"], strict=True)
    }
    attrs = dict(zip(map(tuple, record["attrs_keys"]), record["attrs_vals"], strict=True))
    signature = {arg: _tuples(kind) for arg, kind in record["signature"].items()}
    # JSON made the options' tuples lists; the options' hash (part of the cache key) needs them back.
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in record["options"].items()}
    parsed = make_backend(target).parse_options(options)
    triton.compile(source(kernel, signature, constexprs, attrs), target=target, options=parsed.__dict__)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
