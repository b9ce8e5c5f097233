"""One benchmark run: load the codec, run every section in priority order, write JSON (after every
section, so a run cut short keeps what it measured) and the plots."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from ..codecs import Codec, load_codec
from ..engine import Engine
from .baselines import run_baselines
from .common import Budget, Latents, Progress
from .concurrency import ConcurrencySettings, point_seconds, sweep
from .config import BenchConfig
from .engines import engine_label, make_engine
from .meta import device_slug, environment, finish_environment
from .tiles import SweepSettings, sweep_tier, warm

__all__ = ["DEFINITIONS", "run", "stem_for"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# What the tile sweep leaves for the concurrency section under a time budget: starting the server and
# engine, then at most this many points per path (later points are skipped when the budget runs out).
_CONCURRENCY_SETUP_S = 15.0
_RESERVED_POINTS = 6

DEFINITIONS = {
    "window_ms": "one window through the engine alone: submit to emitted audio on the CPU (wall), "
    "p50/p99 over `repeats` fresh random windows after `warm_calls` untimed ones",
    "device_ms": "the engine's own device time for that window: CUDA events around H2D copy, replay and "
    "D2H copy on the GPU engine; the worker's decode time (ending in a host sync) on the eager worker",
    "halo_ratio": "(left + right) / emit: recomputed context frames per emitted frame",
    "decoded_per_emitted": "window_frames / emit_frames",
    "ttfa_ms (tiles)": "StreamDecoder stream whose first chunk holds exactly the emit + right frames the first "
    "window needs: from handing that chunk over to holding the first tile",
    "stream": "the whole clip streamed through one StreamDecoder with tiles of `emit` frames, latents all "
    "available: device_s is the engine's booked device time, vs_whole its ratio to one whole-clip decode "
    "through the same engine (a graph tier captures a plain graph for the whole clip), "
    "us_per_emitted_frame = device_s / clip frames; measured=false means estimated from the window median",
    "latent_wait_ms": "latents that must have arrived before an approach can produce its first audio, at the "
    "codec frame rate (whole: the clip; seed tiles: the first tile; naive: one chunk; crossfade: chunk + "
    "overlap; streamdec: emit + right)",
    "snr_db": "10 log10(sum ref^2 / sum (x - ref)^2) against the whole-clip eager decode, float64; null "
    "with bit_exact=true when the error is exactly zero",
    "click_energy_db": "10 log10 of the error energy over the reference energy, both summed over +-5 ms "
    "(seam_half_width_samples) around every seam (chunk boundary; a crossfade's seam is the middle of its "
    "ramp); higher = louder clicks",
    "seam_error_share": "share of the clip's whole error energy that lies within those seam windows",
    "ttfa_ms (concurrency)": "from the scheduled arrival of the chunk that completes a stream's first window "
    "(planner on the arrival schedule) to its first audio in the listener's hands",
    "ttfa_from_start_ms": "from the first chunk's scheduled arrival to the first audio (adds the policy's "
    "first_window_wait_ms)",
    "underrun_events": "tiles that reached a listener after their playback time; the listener starts "
    "prebuffer_ms after its first audio, stalls on an underrun, and later deadlines move by the stall",
    "ideal": "the same listener fed by a zero-time decoder: underruns there come from the policy itself",
    "gpu_util_pct": "mean of torch.cuda.utilization() (NVML: share of time a kernel ran) sampled every "
    "50 ms; null where NVML is unavailable (CPU), then use busy_fraction",
    "busy_fraction": "engine device seconds booked during the point / wall seconds of the point",
    "max_streams": "largest N such that it and every smaller N measured had p99 ttfa_ms <= ttfa_limit_ms, "
    "zero underruns and no broken stream",
    "warmup": "compile/capture/first-call work before any timing, reported and never timed",
}


def stem_for(cfg: BenchConfig, device: torch.device) -> Path:
    if cfg.name:
        return Path(cfg.out) / cfg.name
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return Path(cfg.out) / f"{day}-{device_slug(device)}-bench"


def _codec_info(codec: Codec) -> dict[str, Any]:
    left, right = codec.context_frames()
    return {
        "name": codec.name,
        "parameters": sum(p.numel() for p in codec.parameters()),
        "latent_dim": codec.latent_dim,
        "hop_size": codec.hop_size,
        "sample_rate": codec.sample_rate,
        "frame_rate": codec.sample_rate / codec.hop_size,
        "channels": codec.channels,
        "context": [left, right],
        "dtype": str(codec.pad_latent.dtype),
        "precision": codec.precision,
    }


class _Run:
    def __init__(self, cfg: BenchConfig, quiet: bool) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.budget = Budget(cfg.budget_s)
        self.progress = Progress(self._steps(), quiet=quiet)
        self.result: dict[str, Any] = {}
        self.stem = stem_for(cfg, self.device)
        self.began = time.monotonic()

    def _steps(self) -> int:
        c = self.cfg
        n = (2 + len(c.sizes)) if c.baselines else 0
        n += sum(1 + (len(c.compiled_sizes) if t == "compiled" else len(c.sizes)) for t in c.tiers)
        n += len(c.streams) * (2 if c.websocket else 1) if c.concurrency else 0
        return n

    def save(self) -> Path:
        self.result["elapsed_s"] = round(time.monotonic() - self.began, 1)
        self.result["skipped"] = list(self.budget.skipped)
        path = self.stem.with_suffix(".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        return path

    @contextlib.asynccontextmanager
    async def section(self, name: str) -> AsyncIterator[None]:
        """Run a section; a failure is recorded with its traceback and the run goes on."""
        began = time.monotonic()
        try:
            yield
        except Exception as exc:
            self.result["errors"].append(
                {
                    "section": name,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
            )
        finally:
            self.result["section_seconds"][name] = round(time.monotonic() - began, 1)
            self.save()

    async def main(self) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        codec = load_codec(cfg.codec, device=self.device, dtype=_DTYPES[cfg.dtype])
        codec.precision = cfg.precision
        meta = environment(self.device)
        meta["codec"] = _codec_info(codec)
        self.result = {
            "schema": "streamdec-bench/1",
            "meta": meta,
            "config": dataclasses.asdict(cfg),
            "definitions": DEFINITIONS,
            "warmup": {},
            "baselines": None,
            "tiles": {"tiers": []},
            "concurrency": None,
            "errors": [],
            "section_seconds": {},
        }
        latents = Latents(codec.latent_dim, cfg.seed)
        clip = latents(round(cfg.clip_seconds * codec.sample_rate / codec.hop_size))
        reference = None
        self.budget.reserve = self._concurrency_reserve()
        if cfg.baselines:
            async with self.section("baselines"):
                self.result["baselines"], reference = run_baselines(
                    codec, clip, cfg.sizes, seed_tile=cfg.seed_tile, xfade_frames=cfg.xfade_frames,
                    repeats=cfg.repeats, warm=cfg.warm_calls, latents=latents, budget=self.budget,
                    progress=self.progress,
                )  # fmt: skip
        if reference is None:
            reference = codec.decode(clip[None].to(self.device))[0].cpu()
        for tier in cfg.tiers:
            async with self.section(f"tier {tier}"):
                await self._tier(codec, tier, clip, reference, latents)
        self.budget.reserve = 0.0
        if cfg.concurrency:
            async with self.section("concurrency"):
                await self._concurrency(codec, latents)
        finish_environment(meta)
        self.progress.close()
        path = self.save()
        if cfg.plots:
            from .plots import write_plots

            try:
                self.result["plots"] = [p.name for p in write_plots(self.result, self.stem)]
            except Exception as exc:
                self.result["errors"].append({"section": "plots", "error": f"{type(exc).__name__}: {exc}"})
            self.save()
        self.result["json"] = str(path)
        return self.result

    def _concurrency_reserve(self) -> float:
        cfg = self.cfg
        if not cfg.concurrency or cfg.budget_s is None:
            return 0.0
        paths = 2 if cfg.websocket else 1
        points = min(len(cfg.streams), _RESERVED_POINTS)
        return _CONCURRENCY_SETUP_S + paths * points * point_seconds(cfg.conc_seconds, cfg.stagger)

    async def _tier(
        self, codec: Codec, tier: str, clip: torch.Tensor, reference: torch.Tensor, latents: Latents
    ) -> None:
        cfg = self.cfg
        left, right = codec.context_frames()
        sizes = tuple(s for s in cfg.sizes if tier != "compiled" or s in cfg.compiled_sizes)
        engine = make_engine(codec, tier, (1,))
        try:
            if tier == "compiled":
                sizes, report = await self._warm_compiled(engine, sizes, left, right)
            else:
                self.progress.step(f"{tier}: warm-up")
                report = await warm(engine, tuple(left + e + right for e in sizes))
            report["engine"] = engine_label(engine)
            self.result["warmup"][tier] = report
            settings = SweepSettings(sizes, cfg.repeats, cfg.warm_calls, cfg.ttfa_repeats, cfg.max_point_s)
            out = await sweep_tier(
                codec, engine, tier, sizes, clip, reference, settings, latents, self.budget, self.progress
            )
            out["engine"] = engine_label(engine)
            self.result["tiles"]["tiers"].append(out)
        finally:
            await engine.aclose()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    async def _warm_compiled(
        self, engine: Engine, sizes: tuple[int, ...], left: int, right: int
    ) -> tuple[tuple[int, ...], dict[str, Any]]:
        """Compile one size at a time, and only while the last compile's cost still fits the budget."""
        estimate = self.cfg.compile_estimate_s
        done: list[int] = []
        reports = []
        for e in sizes:
            self.progress.step(f"compiled: compile window {left + e + right}")
            if not self.budget.allows(estimate, f"compile of window {left + e + right} (emit {e})"):
                break
            report = await warm(engine, (left + e + right,))
            reports.append({"emit_frames": e, **report})
            estimate = report["seconds"]
            done.append(e)
        total = sum(r["seconds"] for r in reports)
        return tuple(done), {"seconds": round(total, 3), "per_size": reports}

    async def _concurrency(self, codec: Codec, latents: Latents) -> None:
        cfg = self.cfg
        left, right = codec.context_frames()
        buckets = tuple(b for b in cfg.batch_buckets if b <= max(cfg.streams)) or (1,)
        engine = make_engine(codec, cfg.conc_tier, buckets, max_batch=max(buckets))
        try:
            self.progress.start("concurrency: warm-up")
            from ..planning import default_window_sizes

            sizes = default_window_sizes(left, right, cfg.conc_min_emit, cfg.conc_max_emit)
            report = await warm(engine, sizes)
            report["engine"] = engine_label(engine)
            self.result["warmup"]["concurrency"] = report
            settings = ConcurrencySettings(
                cfg.streams, cfg.conc_seconds, cfg.burst, cfg.stagger, cfg.prebuffer_ms,
                cfg.conc_min_emit, cfg.conc_max_emit, cfg.ttfa_limit_ms, cfg.seed,
            )  # fmt: skip
            out = await sweep(
                codec, engine, settings, websocket=cfg.websocket, latents=latents,
                budget=self.budget, progress=self.progress,
            )  # fmt: skip
            out["tier"] = cfg.conc_tier
            out["engine"] = engine_label(engine)
            out["batch_buckets"] = list(buckets)
            self.result["concurrency"] = out
        finally:
            await engine.aclose()


async def run(cfg: BenchConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Run the benchmark ``cfg`` describes; returns the result (also written to ``<out>/<stem>.json``)."""
    return await _Run(cfg, quiet).main()
