"""Sans-I/O stream session: one stream's latents in, windows out; decoded windows in, audio tiles out.

No asyncio, no threads, no device work. The async shell (:mod:`streamdec.streaming`) drives it::

    session.feed(chunk)                     # validate and buffer latents
    while (job := session.next_job()) ...   # planned windows, latents cut and padded
    tile = session.complete(job, audio)     # audio of the emitted frames -> Tile
    session.end()                           # no more chunks; the remaining frames become due

The session keeps only the latents a future window can still reach (``planner.history_frames`` before
the next emitted frame), so memory stays bounded however long the stream runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import ConfigError, DTypeError, NonFiniteError, ShapeError, StreamEndedError
from .planning import StreamPlanner, Window

__all__ = ["Job", "StreamSession", "Tile", "as_latents"]


@dataclass(frozen=True, eq=False)
class Tile:
    """A slice of a stream's audio: ``samples`` is float32 ``[channels, frames * hop_size]`` on the CPU."""

    start_frame: int
    frames: int
    start_sample: int  # per channel
    samples: torch.Tensor

    @property
    def end_sample(self) -> int:
        return self.start_sample + int(self.samples.shape[-1])


@dataclass(frozen=True, eq=False)
class Job:
    """A planned window with its latents ``[window.window_frames, latent_dim]``, ready for an engine."""

    window: Window
    latents: torch.Tensor


def as_latents(chunk: Any, latent_dim: int, *, allow_non_finite: bool = False) -> torch.Tensor:
    """Validate one chunk (array or tensor, ``[T, D]`` or ``[1, T, D]``) into a float32 CPU ``[T, D]`` tensor."""
    if isinstance(chunk, np.ndarray):
        if not np.issubdtype(chunk.dtype, np.floating):
            raise DTypeError(
                f"latent chunk has dtype {chunk.dtype}: expected a floating dtype (float16/32/64); "
                "cast with .astype(np.float32)"
            )
        tensor = torch.from_numpy(np.ascontiguousarray(chunk))
    elif isinstance(chunk, torch.Tensor):
        tensor = chunk
        if not tensor.is_floating_point():
            raise DTypeError(
                f"latent chunk has dtype {tensor.dtype}: expected a floating dtype; cast with .float()"
            )
    else:
        raise DTypeError(f"latent chunk is a {type(chunk).__name__}: expected a numpy array or torch tensor")
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 2 or tensor.shape[1] != latent_dim:
        raise ShapeError(
            f"latent chunk has shape {tuple(tensor.shape)}: expected [T, {latent_dim}] or [1, T, {latent_dim}] "
            f"(frames first, latent_dim={latent_dim} last)"
        )
    tensor = tensor.detach().to(device="cpu", dtype=torch.float32)
    if not allow_non_finite and tensor.numel() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).any(dim=1).nonzero()[0])
        raise NonFiniteError(
            f"latent chunk holds NaN or Inf (first at frame {bad} of {tensor.shape[0]}): fix the producer, "
            "or pass allow_non_finite=True to decode it anyway"
        )
    return tensor


class StreamSession:
    """One stream's state: buffered latents, its planner, and where its audio has got to."""

    def __init__(
        self,
        planner: StreamPlanner,
        *,
        latent_dim: int,
        hop_size: int,
        pad_latent: torch.Tensor,
        allow_non_finite: bool = False,
    ) -> None:
        if tuple(pad_latent.shape) != (latent_dim,):
            raise ConfigError(f"pad_latent has shape {tuple(pad_latent.shape)}, expected ({latent_dim},)")
        self.planner = planner
        self.latent_dim = latent_dim
        self.hop_size = hop_size
        self.allow_non_finite = allow_non_finite
        self._pad = pad_latent.detach().to("cpu", torch.float32)
        self._buf = torch.empty(0, latent_dim)  # latents from frame `_base` to `received`
        self._base = 0
        self.received = 0
        self.ended = False
        self.completed_frames = 0  # frames whose audio went out in tiles

    # -- intake ------------------------------------------------------------------------------------
    def feed(self, chunk: Any) -> int:
        """Buffer one chunk; returns its frame count. Empty chunks are fine."""
        if self.ended:
            raise StreamEndedError(
                f"chunk fed after the stream ended at frame {self.received}: start a new stream"
            )
        latents = as_latents(chunk, self.latent_dim, allow_non_finite=self.allow_non_finite)
        if latents.shape[0]:
            self._buf = torch.cat([self._buf, latents])
            self.received += int(latents.shape[0])
        return int(latents.shape[0])

    def end(self) -> None:
        """No more chunks: every remaining frame becomes due. Idempotent."""
        self.ended = True

    # -- planning ----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every frame has been handed out in a window (tiles may still be in flight)."""
        return self.planner.finished(self.received, self.ended)

    @property
    def ready_frames(self) -> int:
        """Frames whose right context has arrived but that are in no window yet."""
        return max(0, self.planner.ready(self.received, self.ended))

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
            return real.clone()
        return torch.cat([real, self._pad.expand(missing, self.latent_dim)])

    def _drop_before(self, frame: int) -> None:
        drop = frame - self._base
        if drop > 0:
            self._buf = self._buf[drop:].clone()
            self._base = frame

    # -- output ------------------------------------------------------------------------------------
    def complete(self, job: Job, audio: torch.Tensor) -> Tile:
        """Turn the decoded emitted audio of ``job`` (``[channels, emit_frames * hop]``) into a Tile."""
        window = job.window
        expected = window.emit_frames * self.hop_size
        if audio.dim() != 2 or audio.shape[-1] != expected:
            raise ShapeError(f"engine returned audio {tuple(audio.shape)}, expected [channels, {expected}]")
        if window.emit_start != self.completed_frames:
            raise ConfigError(
                f"tile for frame {window.emit_start} completed out of order (next is {self.completed_frames})"
            )
        self.completed_frames = window.emit_end
        return Tile(
            start_frame=window.emit_start,
            frames=window.emit_frames,
            start_sample=window.emit_start * self.hop_size,
            samples=audio,
        )

    def snapshot(self) -> dict[str, int | bool]:
        return {
            "received": self.received,
            "emitted": self.planner.emitted,
            "completed": self.completed_frames,
            "buffered": int(self._buf.shape[0]),
            "ended": self.ended,
        }
