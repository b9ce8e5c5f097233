"""Ogg Opus framing and the libopus binding: pages read back as written for any split, checksums are
checked, the headers carry the encoder's look-ahead and the real length, bad settings are refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.audio.libopus import LibopusDecoder, LibopusEncoder, libopus_available
from streamdec.audio.ogg import OggOpusReader, OggOpusWriter, ogg_crc
from streamdec.errors import ConfigError
from streamdec.server.opus import OpusEncoder, check_bitrate, wire_rate

needs_libopus = pytest.mark.skipif(
    not libopus_available(), reason="needs the system's libopus: apt-get install libopus0"
)


def _stream(packets: list[bytes], per_page: int) -> bytes:
    writer = OggOpusWriter(pre_skip_48k=312, input_rate=24000)
    out = [writer.headers()]
    for i in range(0, len(packets), per_page):
        batch = packets[i : i + per_page]
        last = i + per_page >= len(packets)
        out.append(writer.pages(batch, 960, final_granule=len(packets) * 960 - 100 if last else None))
    return b"".join(out)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=40),
    per_page=st.integers(1, 40),
    cuts=st.lists(st.integers(1, 300), max_size=30),
)
def test_packets_read_back_as_written_for_any_split(sizes: list[int], per_page: int, cuts: list[int]) -> None:
    """Packets of any size (255 and its multiples too), pages of any count, bytes fed in any pieces."""
    packets = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    data, reader, got, at = _stream(packets, per_page), OggOpusReader(), [], 0
    for n in [*cuts, len(data)]:
        got.extend(reader.push(data[at : at + n]))
        at += n
    assert got == packets
    assert (reader.pre_skip_48k, reader.input_rate, reader.eos) == (312, 24000, True)
    assert reader.granule == len(packets) * 960 - 100  # the last page's: the real samples only


def test_a_page_holds_at_most_255_lacing_values() -> None:
    """300 packets in one call make two pages, each within Ogg's 255 segments, each with its own granule."""
    writer = OggOpusWriter(pre_skip_48k=312, input_rate=24000)
    data = writer.headers() + writer.pages([b"x" * 10] * 300, 960)
    reader = OggOpusReader()
    assert len(reader.push(data[: data.rfind(b"OggS")])) == 255 and reader.granule == 255 * 960
    assert len(reader.push(data[data.rfind(b"OggS") :])) == 45 and reader.granule == 300 * 960
    assert data.count(b"OggS") == 4  # OpusHead, OpusTags, two audio pages


def test_a_corrupted_page_fails_its_checksum() -> None:
    """One flipped byte in a page body is an error that names the page."""
    data = bytearray(_stream([b"abc"] * 3, per_page=3))
    data[-1] ^= 0xFF
    with pytest.raises(ConfigError, match="page 2 fails its checksum"):
        OggOpusReader().push(bytes(data))


def test_the_checksum_is_oggs_crc() -> None:
    """Ogg's CRC-32 (0x04C11DB7, unreflected) of '123456789' is 0x89A1897F."""
    assert ogg_crc(b"123456789") == 0x89A1897F


@pytest.mark.parametrize(("rate", "wire"), [(8000, 8000), (11025, 12000), (22050, 24000), (24000, 24000),
                                            (44100, 48000), (96000, 48000)])  # fmt: skip
def test_the_wire_rate_is_the_next_opus_rate_up(rate: int, wire: int) -> None:
    """Opus rates pass through; others go to the next one up (48 kHz at most)."""
    assert wire_rate(rate) == wire


@pytest.mark.parametrize("bitrate", [5999, 510001, -1])
def test_a_bitrate_libopus_would_not_honour_is_refused(bitrate: int) -> None:
    """Outside [6000, 510000] b/s: ConfigError with the range and the default."""
    with pytest.raises(ConfigError, match=r"outside libopus's range \[6000, 510000\].*default is 56000"):
        check_bitrate(bitrate)


@needs_libopus
def test_libopus_takes_only_its_rates() -> None:
    """22,050 Hz straight into libopus is refused with the rates it takes."""
    with pytest.raises(ConfigError, match=r"\[8000, 12000, 16000, 24000, 48000\], got 22050"):
        LibopusEncoder(22050, 56000)
    with pytest.raises(ConfigError, match="got 44100"):
        LibopusDecoder(44100)


@needs_libopus
@pytest.mark.parametrize("bitrate", [16000, 56000, 96000])
def test_the_encoder_runs_at_the_bitrate_asked(bitrate: int) -> None:
    """Constant bit rate: every 20 ms packet is bitrate / 400 bytes (libopus rounds to whole bytes)."""
    enc = LibopusEncoder(24000, bitrate)
    assert enc.bitrate == bitrate and enc.lookahead == 156  # 2.5 ms + 4 ms at 24 kHz
    t = np.arange(480 * 10) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    sizes = {len(enc.encode(tone[i : i + 480])) for i in range(0, len(tone), 480)}
    assert sizes == {bitrate // 400}


@needs_libopus
def test_an_opus_stream_announces_pre_skip_and_its_real_length() -> None:
    """A 22,050 Hz stream: OpusHead's pre-skip is the look-ahead at 48 kHz, the input rate the codec's, and
    the last page's granule counts pre-skip plus the resampled real samples."""
    enc = OpusEncoder(22050, 1, bitrate=32000)
    audio = torch.rand(1, 22050) - 0.5
    data = enc.encode(audio[:, :10000]) + enc.encode(audio[:, 10000:]) + enc.flush()
    reader = OggOpusReader()
    packets = reader.push(data)
    assert (reader.pre_skip_48k, reader.input_rate, reader.eos) == (312, 22050, True)
    assert reader.granule == 312 + 2 * 24000
    assert len(packets) * 960 >= reader.granule  # the packets hold every real sample
    last_head = data.rfind(b"OggS")
    assert struct.unpack_from("<q", data, last_head + 6)[0] == reader.granule


def _through(enc: OpusEncoder, audio: np.ndarray, tiles: list[int], payload_cuts: list[int]) -> np.ndarray:
    """``audio`` encoded in ``tiles``, its bytes re-cut at ``payload_cuts``, decoded by the client."""
    from streamdec.clients.opus import OpusStreamDecoder

    data, at = [], 0
    for n in [*tiles, len(audio)]:
        data.append(enc.encode(torch.from_numpy(audio[at : at + n])[None]))
        at = min(at + n, len(audio))
    stream = b"".join(data) + enc.flush()
    dec, out, at = OpusStreamDecoder(enc.sample_rate, enc.wire_rate), [], 0
    for n in [*payload_cuts, len(stream)]:
        out.append(dec.push(stream[at : at + n], len(audio) if at == 0 else 0))
        at += n
    out.append(dec.finish(len(audio)))
    return np.concatenate(out)


@needs_libopus
@settings(max_examples=15, deadline=None)
@given(
    tiles=st.lists(st.integers(0, 3000), max_size=8),
    payload_cuts=st.lists(st.integers(1, 400), max_size=10),
)
def test_the_decode_does_not_depend_on_tiles_or_message_cuts(
    tiles: list[int], payload_cuts: list[int]
) -> None:
    """22,050 Hz audio in any tiles, its Ogg bytes in any pieces: the client decodes the same samples."""
    audio = 0.3 * np.sin(np.arange(8000) * 0.05) + 0.05 * np.random.default_rng(1).standard_normal(8000)
    audio = audio.astype(np.float32)
    whole = _through(OpusEncoder(22050, 1, 32000), audio, [], [])
    split = _through(OpusEncoder(22050, 1, 32000), audio, tiles, payload_cuts)
    assert len(split) == len(whole) == len(audio)
    np.testing.assert_array_equal(split, whole)
