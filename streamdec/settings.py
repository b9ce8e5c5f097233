"""Every ``STREAMDEC_*`` environment variable, declared once: type, default, meaning and when it is read.

Nothing else in the package reads ``STREAMDEC_*`` from the environment; modules ask a declared
:class:`Setting` for its value (``settings.NO_FUSED.value()``) at the moment the declaration names. The
list, with the same words, is ``docs/settings.md``; a test checks that the two agree.

One parsing rule per type:

* switch: ``1``, ``true``, ``yes``, ``on`` are true; ``0``, ``false``, ``no``, ``off`` and empty are false
  (any case, surrounding spaces ignored); anything else is a :class:`~streamdec.errors.ConfigError` that
  names the variable, the value and the accepted spellings.
* text: the value as given; empty means unset.

The environment is the process's, read when the moment comes; the package never writes ``STREAMDEC_*``
or any other variable while it runs. The one process-wide variable it may set,
``TORCHINDUCTOR_CACHE_DIR`` (Inductor reads its cache directory from nowhere else), is set once at
process start by the programs that take a cache option (:func:`use_inductor_cache_dir`).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from streamdec.errors import ConfigError

__all__ = [
    "COMMIT",
    "DEPENDENT_LAUNCH",
    "NO_COMPILE",
    "NO_FUSED",
    "NO_GRAPHS",
    "PACK_SHORT_ROWS",
    "PARALLEL_COMPILE",
    "REQUIRE_REF",
    "SETTINGS",
    "SPECIALIZED_CONV",
    "TOKEN",
    "TRITON_CONV",
    "Moment",
    "Setting",
    "check_inductor_cache_dir",
    "flag",
    "parse_switch",
    "recorded",
    "use_inductor_cache_dir",
]

T = TypeVar("T")

#: When a setting is read. ``import``: once, when the module that uses it is first imported (compiled
#: graphs trace module constants, so a later change could not reach them anyway). ``engine``: when a GPU
#: engine is constructed. ``cli``: when a command line is parsed (it is the option's default). ``results``:
#: when a benchmark writes a results header. ``tests``: when the test suite collects.
Moment = Literal["import", "engine", "cli", "results", "tests"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_SWITCH_SPELLINGS = "1/true/yes/on or 0/false/no/off (or empty)"


def parse_switch(name: str, raw: str) -> bool:
    """``raw`` as a switch (module docstring), or a :class:`ConfigError` naming ``name``."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a switch: use {_SWITCH_SPELLINGS}")


def _parse_text(name: str, raw: str) -> str | None:
    return raw or None


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, default, parser, the moment it is read, and what it does."""

    name: str
    default: T
    parse: Callable[[str, str], T]
    read: Moment
    kind: str  # "switch" or "text": how docs/settings.md names the type
    doc: str

    def value(self, environ: Mapping[str, str] | None = None) -> T:
        """The parsed value in ``environ`` (default: the process environment), or the default if unset."""
        raw = (os.environ if environ is None else environ).get(self.name)
        return self.default if raw is None else self.parse(self.name, raw)


SETTINGS: dict[str, Setting[Any]] = {}


def _declare(setting: Setting[T]) -> Setting[T]:
    if setting.name in SETTINGS or not setting.name.startswith("STREAMDEC_"):
        raise ValueError(f"{setting.name} is declared twice or lacks the STREAMDEC_ prefix")
    SETTINGS[setting.name] = setting
    return setting


def _switch(name: str, default: bool, read: Moment, doc: str) -> Setting[bool]:
    return _declare(Setting(name, default, parse_switch, read, "switch", doc))


def _text(name: str, read: Moment, doc: str) -> Setting[str | None]:
    return _declare(Setting(name, None, _parse_text, read, "text", doc))


NO_GRAPHS = _switch(
    "STREAMDEC_NO_GRAPHS", False, "engine",
    "Turn CUDA graphs off in every GPU engine, whatever its `graphs` argument: every window decodes eagerly.",
)  # fmt: skip
NO_COMPILE = _switch(
    "STREAMDEC_NO_COMPILE", False, "engine",
    "Turn `torch.compile` off in every GPU engine, whatever its `compile` argument: plain graphs only.",
)  # fmt: skip
NO_FUSED = _switch(
    "STREAMDEC_NO_FUSED", False, "import",
    "Turn the fused alias-free activation kernel off: every activation takes the reference path.",
)  # fmt: skip
TRITON_CONV = _switch(
    "STREAMDEC_TRITON_CONV", True, "import",
    "The split convolutions' Triton kernels (`tf32x3`, `fp16x3`); off, `tf32x3` runs the stacked cuDNN "
    "split (83 dB instead of 120 dB on a whole AuK decode) and `fp16x3` does the same.",
)  # fmt: skip
PACK_SHORT_ROWS = _switch(
    "STREAMDEC_PACK_SHORT_ROWS", True, "import",
    "Pack several short rows (a stateful step's few dozen samples) into one program of the float16 split "
    "convolution and the fused activation; off, every row gets programs of its own, as whole clips do. "
    "Results are bit-identical either way; the switch exists to measure the difference.",
)  # fmt: skip
SPECIALIZED_CONV = _switch(
    "STREAMDEC_SPECIALIZED_CONV", True, "import",
    "Run the `fp16x3` split convolution's 128-channel tiles on Hopper GPUs as the warp-specialized Gluon "
    "kernel (a producer warp loading, two consumer warpgroups multiplying), which is faster there; off, "
    "the Triton kernel runs every launch. Results are bit-identical either way (docs/kernels.md).",
)  # fmt: skip
DEPENDENT_LAUNCH = _switch(
    "STREAMDEC_DEPENDENT_LAUNCH", True, "import",
    "Launch the Triton kernels with programmatic dependent launch on GPUs that have it (compute capability "
    "9.0 and up): a kernel's programs are placed while the kernel before it finishes and wait for it before "
    "they read anything, so a graph's hundreds of launches leave fewer idle gaps. Results are bit-identical "
    "either way; the switch exists to measure the difference.",
)  # fmt: skip
PARALLEL_COMPILE = _switch(
    "STREAMDEC_PARALLEL_COMPILE", True, "engine",
    "Before a GPU warm-up captures its graphs, find the Triton kernel variants it will launch and compile "
    "them in worker processes side by side (a cold start compiles them one at a time otherwise). Off, "
    "each variant compiles at its first launch. The binaries are the same either way.",
)  # fmt: skip
TOKEN = _text(
    "STREAMDEC_TOKEN", "cli",
    "Default of `--token` for `streamdec serve` (the bearer token handshakes must carry) and for "
    "`streamdec stream` (the token it sends). Unset or empty: no token.",
)  # fmt: skip
COMMIT = _text(
    "STREAMDEC_COMMIT", "results",
    "The commit a benchmark results file records, in place of the tree's git HEAD: set it where that HEAD "
    "is not the code that runs (a copied tree on a GPU host); also used where git cannot tell.",
)  # fmt: skip
REQUIRE_REF = _switch(
    "STREAMDEC_REQUIRE_REF", False, "tests",
    "Fail the reference-parity tests when the `ref` extra is missing, instead of skipping them "
    "(`make test` sets it).",
)  # fmt: skip


def flag(name: str) -> bool:
    """The value of the declared switch ``name``; a :class:`ConfigError` for an undeclared one."""
    setting = SETTINGS.get(name)
    if setting is None or setting.kind != "switch":
        raise ConfigError(f"{name} is not a declared switch; declared: {', '.join(sorted(SETTINGS))}")
    value: bool = setting.value()
    return value


def recorded(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``STREAMDEC_*`` variable set in ``environ`` (default: the process's), raw, sorted by name:
    what a results file records, undeclared names included (a misspelt switch then shows)."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in sorted(source.items()) if k.startswith("STREAMDEC_")}


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process this package starts (a server under load test): this
    process's, with ``extra`` on top. Read when the child starts."""
    return {**os.environ, **(extra or {})}


_INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def use_inductor_cache_dir(path: str) -> None:
    """Point Inductor's cache at ``path`` for this process. Call it once, at process start, before
    anything compiles: Inductor reads the directory from ``TORCHINDUCTOR_CACHE_DIR`` only (there is no
    ``torch._inductor.config`` entry for it), at its first compile."""
    os.environ[_INDUCTOR_CACHE] = os.path.abspath(path)


#: how many collections of the middle generation come before a full one while serving (CPython's default
#: is 10). What streams allocate dies young, freed by reference counts, so the older generations grow
#: only with open streams (about 190 tracked objects a websocket stream); a full collection walks all of
#: them with the interpreter stopped. With the default, 600 streams opening within two seconds set off a
#: full collection of 24-45 ms on the 2-core machine, a stall of every stream at once; ten times fewer
#: kept them out of such a ramp (bench/results/cpu/serve-gc-*.json). A closed stream leaves a few objects
#: in reference cycles for the full collections to free.
SERVING_FULL_COLLECTION_AFTER = 100


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach and make full collections rarer
    (:data:`SERVING_FULL_COLLECTION_AFTER`); call it once, after warm-up.

    A full collection walks every tracked object (torch and a loaded codec hold a few hundred thousand)
    with the interpreter stopped: 170-360 ms on the 2-core CI machine, which stalled every stream at once
    and made each of them under-run once in real-time runs. Objects alive after warm-up (modules,
    weights, graphs, caches) live as long as the process, so collecting them is wasted work; after this
    call collections walk only what streams allocate. (:func:`gc.freeze`; process-wide.)"""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, SERVING_FULL_COLLECTION_AFTER)


def check_inductor_cache_dir(path: str | None) -> None:
    """Refuse an engine's ``inductor_cache_dir`` that is not this process's Inductor cache: the directory
    is process-wide and fixed at start (:func:`use_inductor_cache_dir`), not per engine."""
    if path is None:
        return
    current = os.environ.get(_INDUCTOR_CACHE)
    if current is None or os.path.abspath(current) != os.path.abspath(path):
        raise ConfigError(
            f"inductor_cache_dir={path!r} but this process's Inductor cache is {current or 'the default'}: "
            f"call streamdec.settings.use_inductor_cache_dir({path!r}) at process start (the serve command "
            f"does it for --inductor-cache) or set {_INDUCTOR_CACHE}"
        )
