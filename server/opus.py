"""Opus on the wire (``format: "opus"``): one Ogg Opus stream (RFC 7845) per wire stream.

The encoder is ``sphn`` (Kyutai's bindings to libopus and an Ogg writer; the ``opus`` extra). It takes
whole 20 ms frames, so samples wait here until a frame is full; at the end of a completed stream the last
frame is padded with zeros. The stream sphn writes announces a pre-skip that is not libopus's real
encoder delay, so the identification header is corrected (and its page checksum recomputed) on the way
out: a decoder that honours the header then lines the audio up with the PCM decode sample for sample.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import torch

from streamdec.errors import ConfigError

__all__ = ["OPUS_RATES", "OpusEncoder", "opus_available"]

#: the sample rates libopus encodes natively
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: libopus's encoder delay in samples at 48 kHz (2.5 ms look-ahead + 4 ms delay compensation)
ENCODER_DELAY_48K = 312
_FRAMES_PER_SECOND = 50  # 20 ms frames: the usual size for speech, and what sphn is tested with


def opus_available() -> bool:
    try:
        import sphn  # noqa: F401
    except ImportError:
        return False
    return True


def check_opus(sample_rate: int, channels: int) -> str | None:
    """None when this server can send Opus for a codec of this geometry; else why not, with the fix."""
    if not opus_available():
        return "this server cannot encode Opus: install the `opus` extra (sphn), or ask for pcm_s16le"
    if sample_rate not in OPUS_RATES:
        return (f"Opus takes sample rates {list(OPUS_RATES)}; this codec's is {sample_rate} Hz: "
                "ask for pcm_s16le")  # fmt: skip
    if channels != 1:
        return f"the Opus encoder here is mono; this codec has {channels} channels: ask for pcm_s16le"
    return None


class OpusEncoder:
    """One stream's encoder: float samples ``[1, n]`` in, Ogg Opus bytes out (possibly none yet)."""

    def __init__(self, sample_rate: int, channels: int = 1) -> None:
        why = check_opus(sample_rate, channels)
        if why is not None:
            raise ConfigError(why)
        import sphn

        self._writer: Any = sphn.OpusStreamWriter(sample_rate)
        self.frame = sample_rate // _FRAMES_PER_SECOND
        self._pending = np.zeros(0, np.float32)
        self._first = True

    def encode(self, samples: torch.Tensor) -> bytes:
        """Encode every whole frame that ``samples`` ([1, n] float) completes."""
        mono = samples.detach().to("cpu", torch.float32)[0].numpy()
        self._pending = np.concatenate([self._pending, np.clip(mono, -1.0, 1.0)])
        whole = len(self._pending) // self.frame * self.frame
        out = [self._frame(self._pending[i : i + self.frame]) for i in range(0, whole, self.frame)]
        self._pending = self._pending[whole:]
        return b"".join(out)

    def flush(self) -> bytes:
        """The last partial frame, padded with zeros (the stream's headers say how many samples are real),
        and one frame of silence more, so that the encoder delay releases the last real samples."""
        pad = np.zeros(self.frame - len(self._pending) % self.frame, np.float32)
        tail = np.concatenate([self._pending, pad, np.zeros(self.frame, np.float32)])
        self._pending = np.zeros(0, np.float32)
        return b"".join(self._frame(tail[i : i + self.frame]) for i in range(0, len(tail), self.frame))

    def _frame(self, pcm: np.ndarray) -> bytes:
        data: bytes = self._writer.append_pcm(np.ascontiguousarray(pcm, np.float32))
        if self._first and data:
            self._first = False
            data = _with_pre_skip(data, ENCODER_DELAY_48K)
        return data


# -- Ogg page surgery -------------------------------------------------------------------------------
# Page header (RFC 3533): "OggS", version, flags, granule (8), serial (4), sequence (4), CRC (4),
# segment count, lacing values; the CRC covers the whole page with its own field zeroed.
_CRC_AT, _SEGMENTS_AT, _HEADER = 22, 26, 27


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return table


_TABLE = _crc_table()


def ogg_crc(page: bytes) -> int:
    crc = 0
    for byte in page:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[((crc >> 24) & 0xFF) ^ byte]
    return crc


def _with_pre_skip(data: bytes, pre_skip: int) -> bytes:
    """``data`` starts with the OpusHead page: set its pre-skip (bytes 10-11 of the packet), re-checksum."""
    if data[:4] != b"OggS":
        raise ConfigError("the Opus encoder's first bytes are not an Ogg page")
    segments = data[_SEGMENTS_AT]
    body = _HEADER + segments
    size = body + sum(data[_HEADER:body])
    page = bytearray(data[:size])
    if page[body : body + 8] != b"OpusHead":
        raise ConfigError("the Opus encoder's first page is not OpusHead")
    struct.pack_into("<H", page, body + 10, pre_skip)
    struct.pack_into("<I", page, _CRC_AT, 0)
    struct.pack_into("<I", page, _CRC_AT, ogg_crc(bytes(page)))
    return bytes(page) + data[size:]
