"""A wire stream's intake: chunks reach the decoder in order; ending or closing it stops both sides."""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest
import torch

from streamdec.protocol import CodecInfo, Limits, ServerState
from streamdec.server.connection import _Intake

DIM = 2
CODEC = CodecInfo(name="toy", latent_dim=DIM, hop_size=3, sample_rate=24000, channels=1, context=(1, 1))


def _intake(capacity: float | None = None) -> tuple[_Intake, ServerState]:
    state = ServerState(CODEC, Limits().resolved(DIM))
    state.receive_text(json.dumps({"type": "start", "stream": 1}))
    return (_Intake(state, 1) if capacity is None else _Intake(state, 1, capacity)), state


def _chunk(value: float, frames: int = 1) -> torch.Tensor:
    return torch.full((frames, DIM), value)


def test_chunks_come_out_in_order_and_the_listener_hears_each_put_and_the_end() -> None:
    """Every put and the end call the listener; chunks come out in order; after end nothing more goes in."""
    intake, _ = _intake()
    heard: list[bool] = []
    intake.listener = lambda: heard.append(intake.exhausted)
    intake.put(_chunk(0))
    intake.put(_chunk(1))
    intake.end()
    intake.put(_chunk(2))  # after end: dropped
    intake.end()  # a second end tells nobody
    assert heard == [False, False, False]
    got = [float(c[0, 0]) for c in iter(intake.take_ready, None)]
    assert got == [0.0, 1.0]
    assert intake.exhausted


def test_take_ready_never_waits_and_counts_what_was_taken() -> None:
    """take_ready hands out what is at hand, else None, and ServerState learns the frames were taken."""
    intake, state = _intake()
    assert intake.take_ready() is None
    intake.put(_chunk(5, frames=3))
    state._streams[1].buffered = 3  # as receive_binary counts them
    taken = intake.take_ready()
    assert taken is not None and taken.shape == (3, DIM)
    assert state._streams[1].buffered == 0
    assert intake.take_ready() is None


def test_has_input_says_whether_a_chunk_or_the_end_waits() -> None:
    """has_input is True while a chunk is at hand and once the stream ended, else False."""
    intake, _ = _intake()
    assert not intake.has_input()
    intake.put(_chunk(1))
    assert intake.has_input()
    intake.take_ready()
    assert not intake.has_input()
    intake.end()
    assert intake.has_input() and intake.take_ready() is None


async def test_a_voice_waits_for_room_then_fails_once_the_stream_is_gone() -> None:
    """feed waits while the intake holds its capacity, resumes when a chunk is taken, raises after close."""
    intake, _ = _intake(capacity=1)
    await intake.feed(_chunk(0))
    with anyio.move_on_after(0.05) as waited:
        await intake.feed(_chunk(1))
    assert waited.cancelled_caught  # no room: still waiting
    async with anyio.create_task_group() as tg:
        tg.start_soon(intake.feed, _chunk(1))
        await asyncio.sleep(0.01)
        assert intake.take_ready() is not None  # room: the waiting feed goes in
    assert intake.take_ready() is not None
    intake.close()
    with pytest.raises(anyio.BrokenResourceError):
        await intake.feed(_chunk(2))
    assert intake.take_ready() is None and intake.exhausted
