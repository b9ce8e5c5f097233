"""Minimal WAV writer for the two wire sample formats (16-bit PCM and 32-bit IEEE float)."""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["write_wav"]

_TAGS = {"pcm_s16le": (1, 16), "pcm_f32le": (3, 32)}  # WAVE format tag, bits per sample


def write_wav(path: str | Path, pcm: bytes, *, channels: int, sample_rate: int, fmt: str) -> None:
    """Write interleaved little-endian ``pcm`` in wire format ``fmt`` as a RIFF/WAVE file, unchanged."""
    tag, bits = _TAGS[fmt]
    block = channels * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", tag, channels, sample_rate, sample_rate * block, block, bits)
    chunks = [b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk]
    if tag == 3:  # non-PCM formats carry a fact chunk with the frame count
        chunks.append(b"fact" + struct.pack("<II", 4, len(pcm) // block))
    chunks.append(b"data" + struct.pack("<I", len(pcm)) + pcm + (b"\0" if len(pcm) % 2 else b""))
    body = b"WAVE" + b"".join(chunks)
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
