"""DirectMessages splits frames itself only where websockets would have made the same messages: frames cut
anywhere across reads, several in one read, control frames and fragments between them, and frames it
must refuse all behave on the wire as websockets alone behaves; what it writes is websockets' framing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import CLIENT, Protocol, State

from streamdec.protocol import encode_latents
from streamdec.server.direct import DirectMessages, binary_frame_header
from support.server_support import clip, collect, offline, raw, ready, running_server

pytestmark = pytest.mark.timeout(120)


def _frames(*messages: str | bytes) -> bytes:
    """Each message as the masked frame a client sends (one frame each)."""
    client = Protocol(CLIENT, state=State.OPEN)
    for message in messages:
        if isinstance(message, str):
            client.send_text(message.encode())
        else:
            client.send_binary(message)
    return b"".join(client.data_to_send())


def _stream_messages(latents: Any, chunk: int = 5) -> list[str | bytes]:
    """start, the latents in messages of ``chunk`` frames, end: one whole stream."""
    starts: list[str | bytes] = [json.dumps({"type": "start", "stream": 1, "format": "pcm_f32le"})]
    body = [encode_latents(1, i, latents[b : b + chunk]) for i, b in enumerate(range(0, len(latents), chunk))]
    return [*starts, *body, json.dumps({"type": "end", "stream": 1})]


async def _audio_of(ws: Any) -> np.ndarray:
    got, other = await collect(ws, {1: "pcm_f32le"})
    assert other == [] and got[1].errors == [] and got[1].done is not None
    assert got[1].done["status"] == "completed"
    return got[1].audio


@pytest.mark.parametrize("cut", [1, 3, 7, 200], ids=["1-byte", "3-byte", "7-byte", "200-byte"])
async def test_frames_cut_anywhere_across_reads_arrive_whole(codec: Any, cut: int) -> None:
    """The same bytes written a few at a time (headers and payloads split anywhere) make the same stream."""
    latents = clip(23, 1)
    wire = _frames(*_stream_messages(latents))
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        for at in range(0, len(wire), cut):
            ws.transport.write(wire[at : at + cut])
            await asyncio.sleep(0)  # each piece its own read, as often as the loop allows
        audio = await _audio_of(ws)
    np.testing.assert_allclose(audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_a_whole_stream_in_one_write_is_handled_in_order(codec: Any) -> None:
    """start, every latent message and end in one read: each handed over in turn, the stream exact."""
    latents = clip(31, 2)
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        ws.transport.write(_frames(*_stream_messages(latents, chunk=4)))
        audio = await _audio_of(ws)
    np.testing.assert_allclose(audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_pings_and_fragments_between_whole_frames_keep_their_place(codec: Any) -> None:
    """A ping between data frames is answered; a fragmented latent message between whole ones is
    delivered in its place (ServerState refuses any message out of seq order)."""
    latents = clip(20, 3)
    messages = [encode_latents(1, seq, latents[5 * seq : 5 * seq + 5]) for seq in range(4)]
    client = Protocol(CLIENT, state=State.OPEN)
    client.send_text(json.dumps({"type": "start", "stream": 1, "format": "pcm_f32le"}).encode())
    client.send_binary(messages[0])
    client.send_ping(b"between")
    client.send_binary(messages[1][:30], fin=False)
    client.send_continuation(messages[1][30:], fin=True)
    client.send_binary(messages[2])
    client.send_binary(messages[3])
    client.send_text(json.dumps({"type": "end", "stream": 1}).encode())
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        ws.transport.write(b"".join(client.data_to_send()))
        audio = await _audio_of(ws)
        pong = await ws.ping(b"still-open")
        await asyncio.wait_for(pong, 10)
    np.testing.assert_allclose(audio, offline(codec, latents), atol=1e-4, rtol=0)


async def test_an_unmasked_frame_from_a_client_closes_1002(codec: Any) -> None:
    """A client frame without a mask is websockets' to refuse, with a protocol error."""
    unmasked = Frame(Opcode.BINARY, encode_latents(1, 0, clip(2, 4))).serialize(mask=False, extensions=[])
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        ws.transport.write(_frames(json.dumps({"type": "start", "stream": 1})) + unmasked)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1002


async def test_a_close_frame_between_messages_closes_cleanly(codec: Any) -> None:
    """A close from the client after whole messages: websockets answers it and the connection ends 1000."""
    client = Protocol(CLIENT, state=State.OPEN)
    client.send_text(json.dumps({"type": "start", "stream": 1}).encode())
    client.send_close(1000, "bye")
    async with running_server(codec) as server, raw(server.url) as ws:
        await ready(ws)
        (conn,) = server._connections
        assert isinstance(conn.ws, DirectMessages)
        ws.transport.write(b"".join(client.data_to_send()))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


@pytest.mark.parametrize("size", [0, 1, 125, 126, 4000, 65535, 65536, 70000])
def test_the_binary_frame_header_is_websockets_own(size: int) -> None:
    """What the server writes before an audio message is the header websockets would write."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    framed = Frame(Opcode.BINARY, data).serialize(mask=False, extensions=[])
    assert binary_frame_header(size) + data == framed
