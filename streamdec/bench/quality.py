"""The approaches a user might write instead of streamdec, and how far their audio is from the exact one.

All functions take latents ``[T, D]`` and a ``decode`` callable (``[B, T, D] -> [B, C, T * hop]``, the
codec's plain decode) and return audio ``[C, T * hop]`` on the CPU.

* :func:`naive_chunks` - every ``chunk`` frames decoded on their own, no context: seams click.
* :func:`crossfade_chunks` - every chunk decoded with ``overlap`` extra frames on the right; the tail of one
  chunk and the head of the next are mixed with a linear ramp (CosyVoice/XTTS style). Hides seams, not exact.
* :func:`seed_tiles` - the seed approach: fixed ``tile``-frame windows with a full halo, one at a time (exact).

Error metrics, against the whole-clip decode ``ref`` (computed in float64):

* ``snr_db = 10 log10( sum(ref^2) / sum((x - ref)^2) )`` over the whole clip.
* ``click_energy_db = 10 log10( sum_seams sum_{|n - s| < W} (x - ref)[n]^2 / sum_seams sum_{|n - s| < W} ref[n]^2 )``
  with ``W = 5 ms`` of samples around every seam ``s``: the error energy at seams relative to the signal
  energy there (higher = louder clicks; an exact decode has none).
* ``seam_error_share``: the fraction of the whole clip's error energy that falls within those seam windows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Decode", "crossfade_chunks", "error_metrics", "naive_chunks", "seam_samples", "seed_tiles"]

Decode = Callable[[torch.Tensor], torch.Tensor]
SEAM_HALF_WIDTH_S = 0.005


def _cpu(audio: torch.Tensor) -> torch.Tensor:
    return audio.detach().to("cpu", torch.float32)


def naive_chunks(latents: torch.Tensor, chunk: int, decode: Decode) -> torch.Tensor:
    """Decode ``chunk``-frame pieces independently and concatenate them."""
    frames = int(latents.shape[0])
    whole = frames // chunk * chunk
    pieces = []
    if whole:
        # Chunks share no state, so one batched call gives exactly what one call per chunk would.
        batch = latents[:whole].reshape(whole // chunk, chunk, -1)
        audio = _cpu(decode(batch))  # [n, C, chunk * hop]
        pieces.append(audio.permute(1, 0, 2).reshape(audio.shape[1], -1))
    if whole < frames:
        pieces.append(_cpu(decode(latents[None, whole:]))[0])
    return torch.cat(pieces, dim=-1)


def crossfade_chunks(
    latents: torch.Tensor, chunk: int, overlap: int, decode: Decode, hop: int
) -> torch.Tensor:
    """Chunks of ``chunk`` frames, each decoded with ``overlap`` frames more, joined by a linear crossfade.

    Chunk ``k`` decodes frames ``[k*chunk, k*chunk + chunk + overlap)``. Its first ``overlap`` frames of
    audio are mixed with the previous chunk's last ``overlap`` frames, ramping linearly from the previous
    to the current one; its own last ``overlap`` frames wait for the next chunk (or are played as they are
    at the end of the clip)::

        chunk k-1: |========== chunk ==========|~~ overlap ~~|
        chunk k:                               |~~ overlap ~~|========== chunk ==========|~~ ...
                                                 ramp 1 -> 0 / 0 -> 1
    """
    frames = int(latents.shape[0])
    spans = [(start, min(start + chunk + overlap, frames)) for start in range(0, frames, chunk)]
    decoded = _decode_spans(latents, spans, decode)
    out = torch.zeros(decoded[0].shape[0], frames * hop)
    for k, ((start, end), audio) in enumerate(zip(spans, decoded, strict=True)):
        lo = start * hop
        head = min(overlap, end - start) * hop if k else 0
        if head:
            ramp = torch.linspace(0.0, 1.0, head + 2)[1:-1]  # excludes the exact 0 and 1 ends
            out[:, lo : lo + head] = out[:, lo : lo + head] * (1 - ramp) + audio[:, :head] * ramp
        out[:, lo + head : end * hop] = audio[:, head:]
    return out


def _decode_spans(latents: torch.Tensor, spans: list[tuple[int, int]], decode: Decode) -> list[torch.Tensor]:
    """Audio ``[C, (end - start) * hop]`` of each independent span; spans of one length share a batched call."""
    by_length: dict[int, list[int]] = {}
    for i, (start, end) in enumerate(spans):
        by_length.setdefault(end - start, []).append(i)
    out: list[torch.Tensor | None] = [None] * len(spans)
    for length, rows in by_length.items():
        batch = torch.stack([latents[spans[i][0] : spans[i][0] + length] for i in rows])
        audio = _cpu(decode(batch))
        for row, i in enumerate(rows):
            out[i] = audio[row]
    return [a for a in out if a is not None]


def seed_tiles(
    latents: torch.Tensor, windows: list[tuple[int, int, int, int]], decode: Decode, hop: int
) -> torch.Tensor:
    """Decode planned ``(window_start, window_frames, emit_start, emit_end)`` windows one at a time."""
    pieces = []
    for ws, wf, es, ee in windows:
        audio = _cpu(decode(latents[None, ws : ws + wf]))[0]
        pieces.append(audio[:, (es - ws) * hop : (ee - ws) * hop])
    return torch.cat(pieces, dim=-1)


def seam_samples(frames: int, chunk: int, hop: int, offset: int = 0) -> list[int]:
    """Sample positions of the seams between ``chunk``-frame pieces (shifted by ``offset`` frames)."""
    return [(k + offset) * hop for k in range(chunk, frames, chunk) if 0 < k + offset < frames]


def error_metrics(
    x: torch.Tensor, ref: torch.Tensor, seams: list[int], sample_rate: int
) -> dict[str, object]:
    """SNR, click energy at ``seams`` and the seams' share of the error; see the module docstring."""
    x64, r64 = x.to(torch.float64), ref.to(torch.float64)
    if x64.shape != r64.shape:
        raise ValueError(f"audio {tuple(x64.shape)} and reference {tuple(r64.shape)} differ in shape")
    err = x64 - r64
    err_energy = float((err**2).sum())
    ref_energy = float((r64**2).sum())
    max_abs = float(err.abs().max()) if err.numel() else 0.0
    width = max(1, round(SEAM_HALF_WIDTH_S * sample_rate))
    mask = torch.zeros(x64.shape[-1], dtype=torch.bool)
    for s in seams:
        mask[max(0, s - width) : s + width] = True
    seam_err = float((err[..., mask] ** 2).sum())
    seam_ref = float((r64[..., mask] ** 2).sum())
    return {
        "snr_db": _db(ref_energy, err_energy),
        "bit_exact": err_energy == 0.0,
        "max_abs_error": max_abs,
        "click_energy_db": _db(seam_err, seam_ref) if seams else None,
        "seam_error_share": (seam_err / err_energy) if seams and err_energy > 0 else None,
        "seams": len(seams),
        "seam_half_width_samples": width,
    }


def _db(num: float, den: float) -> float | None:
    """``10 log10(num / den)``; None where it is infinite or undefined (an exact match)."""
    if num <= 0.0 or den <= 0.0:
        return None
    return float(10.0 * torch.log10(torch.tensor(num / den, dtype=torch.float64)))
