"""Baselines on the same clip: whole-clip decode, the seed's fixed 512-frame tiles, naive chunking and
overlap with a linear crossfade, each written the way a user would (plain codec calls, eager).

Per approach: decode time per call (p50/p99, device-timed), the latent wait before the first audio can
exist (frames that must have arrived, at the codec's frame rate), and the error against the whole decode
(see :mod:`.quality` for the definitions of SNR and click energy).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..codecs import Codec
from ..planning import plan_tiles
from .common import Budget, Latents, Progress
from .quality import crossfade_chunks, error_metrics, naive_chunks, seam_samples, seed_tiles
from .stats import summary, timed

__all__ = ["run_baselines"]


def _decoder(codec: Codec) -> Any:
    def decode(z: torch.Tensor) -> torch.Tensor:
        return codec.decode(z)

    return decode


def _call_latency(codec: Codec, latents: Latents, frames: int, repeats: int, warm: int) -> dict[str, Any]:
    device = codec.pad_latent.device
    seconds = []
    for i in range(warm + repeats):
        z = latents(frames)[None].to(device)
        _, s = timed(functools.partial(codec.decode, z), device)
        if i >= warm:
            seconds.append(s)
    return summary(seconds, 1e3)


def run_baselines(
    codec: Codec,
    clip: torch.Tensor,
    sizes: tuple[int, ...],
    *,
    seed_tile: int,
    xfade_frames: int,
    repeats: int,
    warm: int,
    latents: Latents,
    budget: Budget,
    progress: Progress,
) -> tuple[dict[str, Any], torch.Tensor]:
    """All baselines; returns the results and the whole-clip reference audio ``[C, T * hop]`` (CPU)."""
    left, right = codec.context_frames()
    hop, rate = codec.hop_size, codec.sample_rate
    frame_ms = 1e3 * hop / rate
    frames = int(clip.shape[0])
    device = codec.pad_latent.device
    decode = _decoder(codec)

    progress.start("baselines: whole clip")
    z = clip[None].to(device)
    reference = codec.decode(z)[0].to("cpu")  # also the warm-up call
    whole_ms = []
    for _ in range(max(3, repeats // 4)):
        _, s = timed(lambda: codec.decode(z), device)
        whole_ms.append(s)
    out: dict[str, Any] = {
        "whole": {
            "frames": frames,
            "decode_ms": summary(whole_ms, 1e3),
            "latent_wait_ms": frames * frame_ms,
        }
    }

    progress.step("baselines: seed tiles")
    windows = plan_tiles(frames, seed_tile, left, right)
    audio = seed_tiles(clip.to(device), windows, decode, hop)
    out["seed_tiles"] = {
        "tile_frames": seed_tile,
        "windows": [list(w) for w in windows],
        "decode_ms": _call_latency(codec, latents, min(seed_tile, frames), max(3, repeats // 4), warm),
        "latent_wait_ms": (windows[0][0] + windows[0][1]) * frame_ms,
        "error": error_metrics(audio, reference, [w[2] * hop for w in windows[1:]], rate),
    }

    naive, fade = [], []
    for chunk in sizes:
        progress.step(f"baselines: chunks of {chunk}")
        if not budget.allows(3.0, f"baselines chunk {chunk}"):
            continue
        audio = naive_chunks(clip.to(device), chunk, decode)
        naive.append(
            {
                "chunk_frames": chunk,
                "decode_ms": _call_latency(codec, latents, chunk, repeats, warm),
                "latent_wait_ms": chunk * frame_ms,
                "error": error_metrics(audio, reference, seam_samples(frames, chunk, hop), rate),
            }
        )
        overlap = min(xfade_frames, chunk)
        audio = crossfade_chunks(clip.to(device), chunk, overlap, decode, hop)
        # A crossfade's seam is the middle of its ramp.
        seams = [s + overlap * hop // 2 for s in seam_samples(frames, chunk, hop)]
        fade.append(
            {
                "chunk_frames": chunk,
                "overlap_frames": overlap,
                "decode_ms": _call_latency(codec, latents, chunk + overlap, repeats, warm),
                "latent_wait_ms": (chunk + overlap) * frame_ms,
                "error": error_metrics(audio, reference, seams, rate),
            }
        )
    out["naive"] = naive
    out["crossfade"] = fade
    return out, reference
