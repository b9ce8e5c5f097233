"""Shared pieces of one benchmark run: the time budget, the progress line and the random latents."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import torch

__all__ = ["Budget", "Latents", "Progress"]


@dataclass
class Budget:
    """A soft wall-clock budget: sections ask before they start and record what they skipped."""

    seconds: float | None
    reserve: float = 0.0  # seconds kept back for later sections
    began: float = field(default_factory=time.monotonic)
    skipped: list[str] = field(default_factory=list)

    def left(self) -> float:
        """Seconds the current section may still use (the reserve for later sections excluded)."""
        if self.seconds is None:
            return float("inf")
        return self.seconds - (time.monotonic() - self.began) - self.reserve

    def allows(self, needed: float, what: str) -> bool:
        """True if ``needed`` seconds fit; otherwise records ``what`` as skipped."""
        if self.left() >= needed:
            return True
        self.skipped.append(f"{what}: needed about {needed:.0f} s, {max(0.0, self.left()):.0f} s left")
        return False


class Progress:
    """One line on stderr: ``[####....] 3/12 label``; the total may grow as sections plan their steps."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 30, quiet: bool = False) -> None:
        self.total, self.stream, self.width, self.quiet = max(total, 1), stream, width, quiet
        self.done = 0
        self.label = ""
        self._t0 = time.monotonic()

    def start(self, label: str) -> None:
        self.label = label
        self._draw()

    def step(self, label: str | None = None) -> None:
        self.done = min(self.done + 1, self.total)
        if label is not None:
            self.label = label
        self._draw()

    def close(self) -> None:
        if not self.quiet:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if self.quiet:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self._t0
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {self.label[:60]:<60}")
        self.stream.flush()


class Latents:
    """Fresh random normalised latents ``[T, D]`` from one seeded generator: never zeros, never reused."""

    def __init__(self, latent_dim: int, seed: int) -> None:
        self.latent_dim = latent_dim
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, frames: int) -> torch.Tensor:
        return torch.randn(frames, self.latent_dim, generator=self.generator)
