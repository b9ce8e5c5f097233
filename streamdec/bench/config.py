"""The benchmark's settings: one frozen dataclass, validated once, with per-device defaults."""

from __future__ import annotations

from dataclasses import dataclass

from ..codecs.precision import Precision, check_precision
from ..errors import ConfigError
from .engines import TIERS

__all__ = ["BenchConfig"]

POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BenchConfig:
    """Everything one ``streamdec bench`` run does; see ``streamdec bench --help`` for each field."""

    codec: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    precision: Precision = "fp32"
    sizes: tuple[int, ...] = POWERS
    tiers: tuple[str, ...] = ("eager",)
    compiled_sizes: tuple[int, ...] = (8, 64)
    clip_seconds: float = 10.0
    repeats: int = 20
    warm_calls: int = 2
    ttfa_repeats: int = 10
    max_point_s: float = 8.0
    xfade_frames: int = 4
    seed_tile: int = 512
    baselines: bool = True
    concurrency: bool = True
    websocket: bool = True
    streams: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    conc_seconds: float = 4.0
    burst: int = 4
    stagger: float = 0.5
    prebuffer_ms: float = 100.0
    conc_min_emit: int = 4
    conc_max_emit: int = 8
    conc_tier: str = "eager"
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    ttfa_limit_ms: float = 100.0
    budget_s: float | None = None
    compile_estimate_s: float = 60.0
    threads: int | None = None
    seed: int = 0
    out: str = "bench/results"
    name: str | None = None
    plots: bool = True

    def __post_init__(self) -> None:
        for name in ("sizes", "streams", "batch_buckets"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ConfigError(f"{name}={values}: need at least one value, every one >= 1")
        check_precision(self.precision)
        bad = [t for t in (*self.tiers, self.conc_tier) if t not in TIERS]
        if bad:
            raise ConfigError(f"unknown tier(s) {bad}: pick from {TIERS}")
        for name in ("repeats", "ttfa_repeats", "burst", "seed_tile", "conc_min_emit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if self.conc_max_emit < self.conc_min_emit:
            raise ConfigError(
                f"conc_max_emit={self.conc_max_emit} < conc_min_emit={self.conc_min_emit}: raise the maximum"
            )
        for name in ("clip_seconds", "conc_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0 seconds")
        if self.warm_calls < 0 or self.xfade_frames < 0 or self.stagger < 0 or self.prebuffer_ms < 0:
            raise ConfigError("warm_calls, xfade_frames, stagger and prebuffer_ms must be >= 0")

    @classmethod
    def for_device(cls, device: str) -> dict[str, object]:
        """Defaults that differ by device: the real codec and every tier on CUDA, ``tiny`` on the CPU."""
        if device.startswith("cuda"):
            return {
                "codec": "auk-24k",
                "tiers": ("graph", "eager", "compiled"),
                "conc_tier": "graph",
                "streams": (1, 2, 4, 8, 16, 32, 64, 128),
            }
        return {
            "codec": "tiny",
            "tiers": ("eager",),
            "conc_tier": "eager",
            "clip_seconds": 4.0,
            "repeats": 5,
            "ttfa_repeats": 5,
            "streams": (1, 2, 3, 4, 6, 8),
        }
