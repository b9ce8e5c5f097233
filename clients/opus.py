"""Opus for the Python client: one stream's Ogg Opus bytes in, float32 samples at the codec's rate out.

libopus (the system's, through :mod:`streamdec.audio.libopus`) decodes at the wire rate ``ready.opus``
announces; the encoder's pre-skip is dropped; a codec at another rate gets its samples back through the
same band-limited resampler the server used. What comes out is held back to the codec samples the audio
headers have counted (the encoder pads its last frame), so a completed stream gives exactly
``done.samples`` samples, in step with the PCM formats' samples.
"""

from __future__ import annotations

import numpy as np

from streamdec.audio.libopus import LibopusDecoder
from streamdec.audio.ogg import OggOpusReader
from streamdec.audio.resample import Resampler
from streamdec.errors import ConfigError

__all__ = ["OpusStreamDecoder"]

_OPUS_CLOCK = 48000


class OpusStreamDecoder:
    """Decodes one stream: :meth:`push` each audio message's payload with its header's ``n_samples``."""

    def __init__(self, sample_rate: int, wire_rate: int) -> None:
        self.sample_rate, self.wire_rate = sample_rate, wire_rate
        self._ogg = OggOpusReader()
        self._opus = LibopusDecoder(wire_rate)
        self._resampler = Resampler(wire_rate, sample_rate) if wire_rate != sample_rate else None
        self._skip: int | None = None  # wire samples of pre-skip still to drop (None: OpusHead not read)
        self._held = np.zeros(0, np.float32)
        self._announced = 0  # codec samples the headers counted so far
        self._released = 0

    def push(self, payload: bytes, n_samples: int) -> np.ndarray:
        """The samples this message releases (float32, mono), possibly none."""
        self._announced += n_samples
        decoded = [self._opus.decode(packet) for packet in self._ogg.push(payload)]
        if self._skip is None and self._ogg.pre_skip_48k is not None:
            self._skip = self._ogg.pre_skip_48k * self.wire_rate // _OPUS_CLOCK
        for wire in decoded:
            self._take(wire)
        return self._release(self._announced)

    def finish(self, total: int) -> np.ndarray:
        """After a completed stream's ``done``: the rest, up to ``total`` (``done.samples``) in all."""
        if self._resampler is not None:
            self._held = np.concatenate([self._held, self._resampler.flush()])
        if self._released + len(self._held) < total:
            raise ConfigError(
                f"the Opus stream decoded to {self._released + len(self._held)} samples where done "
                f"counts {total}: the stream was cut short"
            )
        return self._release(total)

    def _take(self, wire: np.ndarray) -> None:
        if self._skip is None:
            raise ConfigError("Opus stream: audio before the OpusHead packet")
        drop = min(self._skip, len(wire))
        self._skip -= drop
        wire = wire[drop:]
        out = wire if self._resampler is None else self._resampler.push(wire)
        self._held = np.concatenate([self._held, out])

    def _release(self, limit: int) -> np.ndarray:
        take = max(min(len(self._held), limit - self._released), 0)
        out, self._held = self._held[:take], self._held[take:]
        self._released += take
        return out
