"""Band-limited sample-rate conversion, streaming: a polyphase Kaiser-windowed sinc filter.

Opus takes 8, 12, 16, 24 or 48 kHz; a codec at 22,050 Hz (the Piper voice) goes through this on its way to
the encoder, and the Python client uses it to bring Opus's decode back to the codec's rate.

Output sample ``j`` sits at input time ``t = j * down / up`` (``up / down`` = ``rate_out / rate_in`` in
lowest terms). It is the sum of the input around ``t`` weighted by a low-pass kernel centred there::

        x[b-R] ... x[b-1]  x[b]  x[b+1] ... x[b+R+1]        b = floor(t), phase = t - b = p / up
                          ^-- t --^

The kernel is a sinc at ``cutoff`` (``rolloff`` x the lower Nyquist frequency) under a Kaiser window, so
nothing above the lower Nyquist frequency survives (no aliasing down, no images up). Its ``up`` phases are
tabulated once (``[up, 2R + 2]``) and each normalised to unit DC gain. Output ``j`` is computed once the
``R + 1`` input samples after ``t`` are in (a look-ahead of ``R`` input samples, about 1.5 ms at the
defaults); :meth:`flush` ends the input with zeros. Input before the first sample is zero too, so any
split of the input into ``push`` calls gives the same output as one call (tests/unit/test_resample.py).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from streamdec.errors import ConfigError

__all__ = ["Resampler", "resample"]


class Resampler:
    """One stream's rate converter: float32 mono samples in, float32 samples at ``rate_out`` out."""

    def __init__(
        self,
        rate_in: int,
        rate_out: int,
        *,
        zero_crossings: int = 32,
        beta: float = 9.0,
        rolloff: float = 0.94,
    ) -> None:
        if rate_in < 1 or rate_out < 1:
            raise ConfigError(f"sample rates must be >= 1 Hz, got {rate_in} -> {rate_out}")
        if not 0.5 <= rolloff <= 1.0 or zero_crossings < 4:
            raise ConfigError(
                f"rolloff={rolloff} must be in [0.5, 1] and zero_crossings={zero_crossings} at least 4"
            )
        g = math.gcd(rate_in, rate_out)
        self.rate_in, self.rate_out = rate_in, rate_out
        self.up, self.down = rate_out // g, rate_in // g
        self._taps, self.reach = _phases(self.up, rate_in, rate_out, zero_crossings, beta, rolloff)
        self._offsets = np.arange(-self.reach, self.reach + 2)  # taps x[b + o]
        self._buf = np.zeros(self.reach, np.float64)  # input from absolute index _x0 on
        self._x0 = -self.reach
        self._n_in = 0  # input samples received
        self._next = 0  # the next output index

    def output_length(self, n_in: int) -> int:
        """Output samples for ``n_in`` input samples: every output time before the input's end."""
        return -(-n_in * self.up // self.down)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Take more input; return every output sample whose taps are all in."""
        x = np.asarray(samples, np.float64).reshape(-1)
        self._buf = np.concatenate([self._buf, x])
        self._n_in += len(x)
        # output j is ready when b_j + R + 1 < n_in, i.e. j * down < (n_in - R - 1) * up
        ready = max(-(-(self._n_in - self.reach - 1) * self.up // self.down), self._next)
        return self._emit(min(ready, self.output_length(self._n_in)))

    def flush(self) -> np.ndarray:
        """The rest of the output, with the input ended by zeros."""
        self._buf = np.concatenate([self._buf, np.zeros(self.reach + 2)])
        return self._emit(self.output_length(self._n_in))

    def _emit(self, end: int) -> np.ndarray:
        j = np.arange(self._next, end)
        if len(j) == 0:
            return np.zeros(0, np.float32)
        base, phase = np.divmod(j * self.down, self.up)
        rows = self._buf[base[:, None] + self._offsets[None, :] - self._x0]  # [n, 2R + 2]
        out = np.einsum("nk,nk->n", rows, self._taps[phase])
        self._next = end
        keep = (end * self.down) // self.up - self.reach  # the first input the next output needs
        if keep > self._x0:
            self._buf, self._x0 = self._buf[keep - self._x0 :], keep
        result: np.ndarray = out.astype(np.float32)
        return result


@functools.cache
def _phases(
    up: int, rate_in: int, rate_out: int, zero_crossings: int, beta: float, rolloff: float
) -> tuple[np.ndarray, int]:
    """The kernel's ``up`` phases ``[up, 2R + 2]`` (read-only, shared by every stream) and ``R``."""
    cutoff = rolloff * min(rate_in, rate_out) / 2 / rate_in  # cycles per input sample
    half = zero_crossings / (2 * cutoff)  # the kernel's half-length, in input samples
    reach = math.ceil(half)  # R above: input samples needed after t
    offsets = np.arange(-reach, reach + 2)
    tau = np.arange(up)[:, None] / up - offsets[None, :]  # t - (b + o), in input samples
    window = np.i0(beta * np.sqrt(np.clip(1 - (tau / half) ** 2, 0, 1))) / np.i0(beta)
    kernel = np.where(np.abs(tau) < half, 2 * cutoff * np.sinc(2 * cutoff * tau) * window, 0.0)
    taps = kernel / kernel.sum(axis=1, keepdims=True)  # unit DC gain in every phase
    taps.setflags(write=False)
    return taps, reach


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """The whole of ``samples`` (mono) at ``rate_out``: ``ceil(n * rate_out / rate_in)`` samples."""
    if rate_in == rate_out:
        return np.asarray(samples, np.float32).reshape(-1).copy()
    conv = Resampler(rate_in, rate_out)
    return np.concatenate([conv.push(samples), conv.flush()])
