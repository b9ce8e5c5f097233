"""Async Python client for protocol v1.

Example::

    async with connect("ws://127.0.0.1:8765/v1/stream", token=None) as conn:
        stream = await conn.open_stream(format="pcm_f32le")
        await stream.send(latents)          # [T, latent_dim]; split to the server's max_frames_per_message
        await stream.end()
        async for frame in stream:          # AudioFrame, in order, until the server's done
            play(frame.samples)             # float32 [channels, n]

One task reads the socket and routes each message to its stream's bounded queue. A stream whose frames
are not consumed fills its queue, which stops that reading task, which pauses every stream of the
connection (and, through TCP, the server's decoding for it): consume every open stream.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import torch
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamdec.errors import ServerError, ShapeError
from streamdec.protocol import (
    DEFAULT_DTYPE,
    DEFAULT_FORMAT,
    LATENT_DTYPES,
    SAMPLE_FORMATS,
    STREAM_ENDING_CODES,
    CodecInfo,
    Limits,
    decode_audio_samples,
    encode_latents,
    parse_audio,
    parse_server_text,
)

__all__ = ["AudioFrame", "ClientStream", "Connection", "connect"]

#: audio messages are one tile each; this bounds a tile at 16 Mi samples of float32
DEFAULT_MAX_SIZE = 64 * 2**20
_QUEUE = 64  # messages buffered per stream before the reading task waits
_ENDING_CODES = frozenset(code.value for code in STREAM_ENDING_CODES)


@dataclass(frozen=True, eq=False)
class AudioFrame:
    """One audio message: ``pcm`` is the raw interleaved payload, ``samples`` float32 ``[channels, n]``."""

    stream: int
    seq: int
    start_sample: int
    n_samples: int
    pcm: bytes
    samples: np.ndarray


class ClientStream:
    """One stream on a :class:`Connection`; iterate it for :class:`AudioFrame` until ``done``.

    After iteration ``done`` holds the server's ``done`` message. A stream that ends in ``error`` raises
    :class:`~streamdec.errors.ServerError` out of the iteration, with the server's code and message.
    """

    def __init__(self, conn: Connection, stream: int, dtype: str, fmt: str) -> None:
        self.conn, self.id, self.dtype, self.format = conn, stream, dtype, fmt
        self._in, self._out = anyio.create_memory_object_stream[Any](_QUEUE)
        self._seq = 0
        self._expected_sample = 0
        self.done: dict[str, Any] | None = None
        self.errors: list[ServerError] = []  # every error message the server sent about this stream

    async def send(self, latents: torch.Tensor | np.ndarray) -> None:
        """Send ``[T, latent_dim]`` latents, as many messages as ``max_frames_per_message`` requires.

        Raises :class:`~streamdec.errors.ShapeError` before sending when the shape does not fit the
        server's codec (its ``latent_dim`` from ``ready``).
        """
        _check_latent_dim(latents, self.conn.codec)
        step = self.conn.limits.max_frames_per_message
        for begin in range(0, max(len(latents), 1), step):
            await self.conn.ws.send(
                encode_latents(self.id, self._seq, latents[begin : begin + step], self.dtype)
            )
            self._seq += 1

    async def end(self) -> None:
        """No more latents: the server decodes the rest, sends it, then ``done``."""
        await self.conn.send_json({"type": "end", "stream": self.id})

    async def cancel(self) -> None:
        """Stop now: the server drops what is pending and sends ``done`` with status ``cancelled``."""
        await self.conn.send_json({"type": "cancel", "stream": self.id})

    def _cause(self) -> ServerError:
        """The error that ended the stream: the first stream-ending one. Latents still in flight when the
        stream ended draw unknown_stream errors that can arrive before it; they are echoes, not the cause."""
        ending = [e for e in self.errors if e.code in _ENDING_CODES]
        return (ending or self.errors or [ServerError("internal", "stream failed", stream=self.id)])[0]

    def __aiter__(self) -> AsyncIterator[AudioFrame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[AudioFrame]:
        channels = self.conn.codec.channels
        async for item in self._out:
            if isinstance(item, dict):  # done
                self.done = item
                if item["status"] == "error":
                    raise self._cause()
                return
            samples = decode_audio_samples(item, self.format, channels)
            if item.start_sample != self._expected_sample:
                raise ServerError(
                    "internal",
                    f"audio gap: start_sample {item.start_sample}, expected {self._expected_sample}",
                    stream=self.id,
                )
            self._expected_sample += item.n_samples
            yield AudioFrame(item.stream, item.seq, item.start_sample, item.n_samples, item.pcm, samples)
        raise self.conn.closed_error(self.id)


class Connection:
    """A connected client; ``codec`` and ``limits`` come from the server's ``ready``."""

    def __init__(self, ws: ClientConnection, ready: dict[str, Any]) -> None:
        self.ws = ws
        self.ready = ready
        codec = ready["codec"]
        self.codec = CodecInfo(
            codec["name"],
            codec["latent_dim"],
            codec["hop_size"],
            codec["sample_rate"],
            codec["channels"],
            tuple(codec["context"]),
        )
        self.limits = Limits(**ready["limits"])
        self.errors: list[ServerError] = []  # error messages about no open stream (stream null or unknown)
        self._streams: dict[int, ClientStream] = {}
        self._pending: dict[int, MemoryObjectSendStream[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._handles: list[ClientStream] = []  # every stream opened; all are closed with the connection

    async def send_json(self, obj: dict[str, Any]) -> None:
        await self.ws.send(_json(obj))

    async def open_stream(
        self, *, stream: int | None = None, dtype: str = DEFAULT_DTYPE, format: str = DEFAULT_FORMAT
    ) -> ClientStream:
        """Start a stream and wait for ``started``; raises ServerError if the server refuses it."""
        if dtype not in LATENT_DTYPES or format not in SAMPLE_FORMATS:
            raise ValueError(
                f"dtype {dtype!r} / format {format!r}: pick from {list(LATENT_DTYPES)} / "
                f"{list(SAMPLE_FORMATS)}"
            )
        sid = next(i for i in self._ids if i not in self._streams) if stream is None else stream
        reply_in, reply_out = anyio.create_memory_object_stream[dict[str, Any]](1)
        self._pending[sid] = reply_in
        try:
            with reply_in, reply_out:
                await self.send_json({"type": "start", "stream": sid, "dtype": dtype, "format": format})
                reply = await reply_out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise self.closed_error(sid) from None
        finally:
            self._pending.pop(sid, None)
        if reply["type"] == "error":
            raise _server_error(reply)
        handle = ClientStream(self, sid, dtype, format)
        self._streams[sid] = handle
        self._handles.append(handle)
        return handle

    def closed_error(self, stream: int) -> ServerError:
        """What a stream raises when the connection ended before its ``done``."""
        last = self.errors[-1] if self.errors else None
        code = last.code if last else "internal"
        why = f": {last}" if last else ""
        return ServerError(
            code,
            f"connection closed ({self.ws.close_code}) before stream {stream} was done{why}",
            stream=stream,
        )

    # -- the reading task --------------------------------------------------------------------------
    async def _dispatch(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    audio = parse_audio(message)
                    if audio.stream in self._streams:
                        await self._streams[audio.stream]._in.send(audio)
                else:
                    await self._on_text(parse_server_text(message))
        except ConnectionClosed:
            pass
        finally:
            for handle in self._streams.values():
                handle._in.close()
            for reply in self._pending.values():
                reply.close()

    async def _on_text(self, msg: dict[str, Any]) -> None:
        kind, stream = msg["type"], msg.get("stream")
        handle = self._streams.get(stream) if isinstance(stream, int) else None
        reply = self._pending.get(stream) if isinstance(stream, int) else None
        if reply is not None and kind in ("started", "error"):
            await reply.send(msg)
        elif kind == "error" and handle is not None:
            handle.errors.append(_server_error(msg))
        elif kind == "error":
            self.errors.append(_server_error(msg))
        elif kind == "done" and handle is not None:
            del self._streams[handle.id]
            await handle._in.send(msg)
            handle._in.close()


def _check_latent_dim(latents: torch.Tensor | np.ndarray, codec: CodecInfo) -> None:
    shape = tuple(latents.shape)
    if len(shape) != 2 or shape[1] != codec.latent_dim:
        raise ShapeError(
            f"latents of shape {shape}: the server's codec {codec.name!r} takes [frames, {codec.latent_dim}]; "
            "send the latents of the model this codec belongs to"
        )


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _server_error(msg: dict[str, Any]) -> ServerError:
    return ServerError(str(msg.get("code")), str(msg.get("message")), stream=msg.get("stream"))


@contextlib.asynccontextmanager
async def connect(
    url: str, *, token: str | None = None, max_size: int = DEFAULT_MAX_SIZE, **kwargs: Any
) -> AsyncIterator[Connection]:
    """Connect, wait for ``ready``, and keep a reading task running until the block exits.

    ``token`` goes in an ``Authorization: Bearer`` header. Other keyword arguments go to
    :func:`websockets.asyncio.client.connect` (``proxy`` defaults to None: a local server is the
    common case, and environment proxies break loopback connections).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else None
    kwargs.setdefault("proxy", None)
    async with ws_connect(
        url, additional_headers=headers, compression=None, max_size=max_size, **kwargs
    ) as ws:
        first = parse_server_text(await ws.recv())
        if first["type"] == "error":
            raise _server_error(first)
        if first["type"] != "ready" or first.get("protocol") != 1:
            raise ServerError("bad_message", f"expected ready for protocol 1, got {first!r:.200}")
        conn = Connection(ws, first)
        tg: TaskGroup
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn._dispatch)
            try:
                yield conn
            except Exception as exc:  # re-raised below, outside the task group: not in an ExceptionGroup
                failure = exc
            finally:
                tg.cancel_scope.cancel()
                for handle in conn._handles:
                    handle._in.close()
                    handle._out.close()
        if failure is not None:
            raise failure
