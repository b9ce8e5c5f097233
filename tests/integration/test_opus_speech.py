"""Opus on speech (the Piper voice, 22,050 Hz, resampled to Opus's 24 kHz on the server and back in the
client): >= 20 dB SNR against the PCM decode, at <= 1/5 of pcm_s16le's bytes, at the default bit rate."""

from __future__ import annotations

import pytest

from streamdec.audio.libopus import libopus_available
from streamdec.clients import connect
from streamdec.voice import DEMO_TEXT
from support.opus import lag, receive, snr_db
from support.server_support import running_server
from support.voice import codec, voice

pytestmark = pytest.mark.skipif(
    not libopus_available(), reason="needs the system's libopus: apt-get install libopus0"
)


async def test_speech_keeps_20_db_at_a_fifth_of_the_bytes() -> None:
    """The voice speaks DEMO_TEXT as pcm_s16le and as opus: same length, aligned, SNR >= 20 dB, bytes <= 1/5."""
    async with running_server(codec(), voice=voice()) as server:
        async with connect(server.url) as conn:  # the voice's 22,050 Hz goes at Opus's 24 kHz
            assert conn.ready["opus"] == {"sample_rate": 24000, "bitrate": 56000}
        pcm, pcm_bytes = await receive(server.url, "pcm_s16le", text=DEMO_TEXT)
        opus, opus_bytes = await receive(server.url, "opus", text=DEMO_TEXT)
    assert len(opus) == len(pcm) > 4 * 22050
    assert lag(pcm, opus) == 0
    snr = snr_db(pcm, opus)
    assert snr >= 20.0, f"Opus at the default bit rate: {snr:.1f} dB SNR against the PCM decode"
    assert opus_bytes <= pcm_bytes / 5, f"Opus {opus_bytes} bytes against pcm_s16le {pcm_bytes}"
