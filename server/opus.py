"""Opus on the wire (``format: "opus"``): one Ogg Opus stream (RFC 7845) per wire stream.

The encoder is the system's libopus (:mod:`.libopus`), mono, constant bit rate (``--opus-bitrate``, default
56 kbit/s: at most a fifth of ``pcm_s16le``'s bytes for codecs of 22.05 kHz and up). Opus takes 8, 12, 16,
24 or 48 kHz: a codec at another rate is resampled (:mod:`.resample`, band-limited) to the next rate up,
the *wire rate* ``ready.opus.sample_rate`` announces. Samples wait here until a 20 ms frame is full; each
call makes one Ogg page of the frames it completed (:mod:`.ogg`). At the end of a completed stream the
last frame is padded with zeros, plus what the encoder's look-ahead needs to release the last real
samples; the last page's granule position counts only the real ones.
"""

from __future__ import annotations

import numpy as np
import torch

from streamdec.audio.libopus import MAX_BITRATE, MIN_BITRATE, OPUS_RATES, LibopusEncoder, libopus_available
from streamdec.audio.ogg import OggOpusWriter
from streamdec.audio.resample import Resampler
from streamdec.errors import ConfigError
from streamdec.protocol import CodecInfo, OpusInfo

__all__ = [
    "DEFAULT_BITRATE",
    "OPUS_RATES",
    "OpusEncoder",
    "check_bitrate",
    "check_opus",
    "opus_info",
    "wire_rate",
]

#: bits per second; 7 kB/s of packets against 44.1 kB/s of pcm_s16le at 22.05 kHz (48 kB/s at 24 kHz)
DEFAULT_BITRATE = 56000
_OPUS_CLOCK = 48000  # Ogg Opus counts pre-skip and granule positions at 48 kHz whatever the input rate


def wire_rate(sample_rate: int) -> int:
    """The rate Opus encodes a codec of ``sample_rate`` at: the lowest Opus rate not below it (else 48 kHz)."""
    return next((rate for rate in OPUS_RATES if rate >= sample_rate), OPUS_RATES[-1])


def check_opus(sample_rate: int, channels: int) -> str | None:
    """None when this server can send Opus for a codec of this geometry; else why not, with the fix."""
    if not libopus_available():
        return (
            "this server cannot encode Opus: install the system's libopus (Debian/Ubuntu: apt-get install "
            "libopus0), or ask for pcm_s16le"
        )
    if channels != 1:
        return f"the Opus encoder here is mono; this codec has {channels} channels: ask for pcm_s16le"
    return None


def opus_info(codec: CodecInfo, bitrate: int) -> OpusInfo | None:
    """``ready.opus`` for a server of this codec: None where it cannot send Opus."""
    if check_opus(codec.sample_rate, codec.channels) is not None:
        return None
    return OpusInfo(wire_rate(codec.sample_rate), bitrate)


def check_bitrate(bitrate: int) -> None:
    """Raise ConfigError for a bit rate libopus would not honour."""
    if not MIN_BITRATE <= bitrate <= MAX_BITRATE:
        raise ConfigError(
            f"opus_bitrate={bitrate} b/s is outside libopus's range [{MIN_BITRATE}, {MAX_BITRATE}]; "
            f"the default is {DEFAULT_BITRATE}"
        )


class OpusEncoder:
    """One stream's encoder: float samples ``[1, n]`` at the codec's rate in, Ogg Opus bytes out."""

    def __init__(self, sample_rate: int, channels: int = 1, bitrate: int = DEFAULT_BITRATE) -> None:
        why = check_opus(sample_rate, channels)
        if why is not None:
            raise ConfigError(why)
        check_bitrate(bitrate)
        self.sample_rate, self.wire_rate = sample_rate, wire_rate(sample_rate)
        self._resampler = Resampler(sample_rate, self.wire_rate) if self.wire_rate != sample_rate else None
        self._opus = LibopusEncoder(self.wire_rate, bitrate)
        self.frame = self._opus.frame
        self._scale = _OPUS_CLOCK // self.wire_rate
        self._frame_48k = self.frame * self._scale
        self._ogg = OggOpusWriter(self._opus.lookahead * self._scale, sample_rate)
        self._pending = np.zeros(0, np.float32)
        self._taken = 0  # codec samples taken
        self._encoded = 0  # wire samples handed to libopus (whole frames)
        self._headers: bytes | None = self._ogg.headers()

    @property
    def lookahead(self) -> int:
        """libopus's encoder delay in wire-rate samples: the ``pre_skip`` a decoder drops."""
        return int(self._opus.lookahead)

    def encode(self, samples: torch.Tensor) -> bytes:
        """Encode every whole frame that ``samples`` ([1, n] float) completes; one page, or nothing."""
        mono = np.clip(samples.detach().to("cpu", torch.float32)[0].numpy(), -1.0, 1.0)
        self._taken += len(mono)
        wire = mono if self._resampler is None else self._resampler.push(mono)
        self._pending = np.concatenate([self._pending, wire])
        whole = len(self._pending) // self.frame * self.frame
        packets = [self._opus.encode(self._pending[i : i + self.frame]) for i in range(0, whole, self.frame)]
        self._pending = self._pending[whole:]
        self._encoded += whole
        return self._take_headers() + self._ogg.pages(packets, self._frame_48k)

    def flush(self) -> bytes:
        """The rest, padded with zeros to whole frames and past the encoder's look-ahead; the last page."""
        rest = np.zeros(0, np.float32) if self._resampler is None else self._resampler.flush()
        tail = np.concatenate([self._pending, rest])
        real = self._taken if self._resampler is None else self._resampler.output_length(self._taken)
        # zeros up to whole frames that hold every real sample and the look-ahead after it
        end = -(-(real + self.lookahead) // self.frame) * self.frame
        tail = np.concatenate([tail, np.zeros(end - self._encoded - len(tail), np.float32)])
        packets = [self._opus.encode(tail[i : i + self.frame]) for i in range(0, len(tail), self.frame)]
        self._pending = np.zeros(0, np.float32)
        self._encoded = end
        final = (real + self.lookahead) * self._scale
        return self._take_headers() + self._ogg.pages(packets, self._frame_48k, final_granule=final)

    def _take_headers(self) -> bytes:
        headers, self._headers = self._headers or b"", None
        return headers
