"""Ogg Opus framing (RFC 3533 pages, RFC 7845 Opus mapping), mono, both ways.

The writer makes the two header pages (``OpusHead`` with the encoder's look-ahead as ``pre_skip``, then
``OpusTags``) and one page per call of :meth:`OggOpusWriter.pages` holding every packet it is given: the
server calls it once per tile, so a page adds no wait of its own. Granule positions count 48 kHz samples
from the start of the decoded stream, pre-skip included; the last page (``eos``) has the granule of the
real samples only, which tells a decoder how much of the padded last packet to drop.

The reader does the reverse for the Python client: bytes in, in any split, packets and the last granule out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from streamdec.errors import ConfigError

__all__ = ["OggOpusReader", "OggOpusWriter", "ogg_crc", "opus_head"]

_PAGE = struct.Struct("<4sBBqIII")  # capture, version, flags, granule, serial, sequence, checksum
_CONTINUED, _BOS, _EOS = 0x01, 0x02, 0x04
_HEADER = 27  # the fixed part of a page header, then the segment count and lacing values
_VENDOR = b"streamdec"


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
    """Ogg's CRC-32 (polynomial 0x04C11DB7, no reflection, no final xor) over a page with a zero checksum."""
    crc = 0
    for byte in page:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[((crc >> 24) & 0xFF) ^ byte]
    return crc


def opus_head(pre_skip_48k: int, input_rate: int) -> bytes:
    """The ``OpusHead`` packet of a mono stream (RFC 7845 section 5.1), output gain 0, mapping family 0."""
    return b"OpusHead" + struct.pack("<BBHIhB", 1, 1, pre_skip_48k, input_rate, 0, 0)


def _opus_tags() -> bytes:
    return b"OpusTags" + struct.pack("<I", len(_VENDOR)) + _VENDOR + struct.pack("<I", 0)


def _lacing(packet: bytes) -> bytes:
    return bytes([255] * (len(packet) // 255) + [len(packet) % 255])


@dataclass
class OggOpusWriter:
    """Pages of one logical stream; ``serial`` tells streams apart where several are chained."""

    pre_skip_48k: int
    input_rate: int
    serial: int = 1
    _sequence: int = 0
    _packets: int = 0  # audio packets written so far

    def headers(self) -> bytes:
        """The ``OpusHead`` page (beginning of stream) and the ``OpusTags`` page."""
        head = self._page([opus_head(self.pre_skip_48k, self.input_rate)], 0, _BOS)
        return head + self._page([_opus_tags()], 0, 0)

    def pages(self, packets: list[bytes], frame_48k: int, *, final_granule: int | None = None) -> bytes:
        """Pages holding ``packets`` of ``frame_48k`` samples each. A page's granule counts the 48 kHz
        samples decoded once its last packet is (pre-skip included); with ``final_granule`` the last page
        ends the stream and carries that instead: pre-skip plus the real samples only."""
        out: list[bytes] = []
        batch: list[bytes] = []
        segments = 0
        for packet in packets:
            if len(packet) >= 255 * 255:
                raise ConfigError(f"an Opus packet of {len(packet)} bytes does not fit an Ogg page here")
            lacing = len(packet) // 255 + 1
            if segments + lacing > 255:  # a page holds at most 255 lacing values: start another
                out.append(self._page(batch, self._packets * frame_48k, 0))
                batch, segments = [], 0
            batch.append(packet)
            self._packets += 1
            segments += lacing
        if final_granule is not None:
            out.append(self._page(batch, final_granule, _EOS))
        elif batch:
            out.append(self._page(batch, self._packets * frame_48k, 0))
        return b"".join(out)

    def _page(self, packets: list[bytes], granule: int, flags: int) -> bytes:
        lacing = b"".join(_lacing(p) for p in packets)
        header = _PAGE.pack(b"OggS", 0, flags, granule, self.serial, self._sequence, 0)
        page = bytearray(header + bytes([len(lacing)]) + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
        self._sequence += 1
        return bytes(page)


@dataclass
class OggOpusReader:
    """Packets of one Ogg Opus stream, fed in any split; checks each page's capture pattern and checksum."""

    pre_skip_48k: int | None = None  # from OpusHead, once read
    input_rate: int | None = None
    granule: int = -1  # of the last page that ended a packet
    eos: bool = False
    _pending: bytes = b""
    _partial: list[bytes] = field(default_factory=list)
    _packets: int = 0

    def push(self, data: bytes) -> list[bytes]:
        """The audio packets completed by ``data`` (the two header packets are read, not returned)."""
        buf, out, at = self._pending + data, [], 0
        while len(buf) - at >= _HEADER:
            size = self._page_size(buf, at)
            if size is None:
                break
            out.extend(self._page(buf[at : at + size]))
            at += size
        self._pending = buf[at:]
        return out

    @staticmethod
    def _page_size(buf: bytes, at: int) -> int | None:
        if buf[at : at + 4] != b"OggS":
            raise ConfigError(f"Opus stream: an Ogg page does not start with OggS (got {buf[at : at + 4]!r})")
        n = buf[at + 26]
        if len(buf) - at < _HEADER + n:
            return None
        size = _HEADER + n + sum(buf[at + _HEADER : at + _HEADER + n])
        return size if len(buf) - at >= size else None

    def _page(self, page: bytes) -> list[bytes]:
        _, _, flags, granule, _, sequence, crc = _PAGE.unpack_from(page)
        if ogg_crc(page[:22] + b"\0\0\0\0" + page[26:]) != crc:
            raise ConfigError(f"Opus stream: Ogg page {sequence} fails its checksum")
        n = page[26]
        body, packets = _HEADER + n, []
        for size in page[_HEADER : _HEADER + n]:
            self._partial.append(page[body : body + size])
            body += size
            if size < 255:
                packets.append(b"".join(self._partial))
                self._partial = []
        if packets:
            self.granule = granule
        self.eos = self.eos or bool(flags & _EOS)
        return [p for p in packets if self._audio(p)]

    def _audio(self, packet: bytes) -> bool:
        """False for the two header packets (read here), True for audio."""
        self._packets += 1
        if self._packets == 1:
            if packet[:8] != b"OpusHead" or len(packet) < 19:
                raise ConfigError("Opus stream: the first packet is not OpusHead")
            self.pre_skip_48k, self.input_rate = struct.unpack_from("<HI", packet, 10)
            return False
        return self._packets > 2
