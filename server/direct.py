"""A server connection that hands each whole data message to its handler as it arrives, and writes binary
messages with a header it frames itself: the two ends of every message of a stream.

websockets parses each received frame with a generator per field, builds a ``Frame``, queues the message
for a reader task and wakes it; for a server that reads one small message per stream every chunk period,
that machinery costs more than the message's own work. :class:`DirectMessages` keeps websockets for
everything that makes the protocol (the handshake, control frames, fragmentation, closing, every error),
and takes only the one case that is most of the traffic: a complete, masked, unfragmented text or binary
frame, received while the connection is open. Such a frame is unmasked and handed to ``on_message`` from
inside ``data_received``. Every other frame is fed to websockets whole, so its parser is always between
frames when it gets bytes from here; anything this class does not expect (an unmasked frame, one over
``max_size``) hands websockets the rest of the connection's bytes, and it fails the connection as it would
have.

::

    bytes --> data_received --+-- whole FIN text/binary, masked, <= max_size, nothing queued --> on_message
                              +-- any other whole frame --> websockets (ping, pong, close, fragments)
                              +-- a partial frame: kept until the rest arrives
                              +-- not open, no handler, unexpected header --> websockets from here on

On the way out, :func:`binary_frame_header` is the header websockets would put before a server's binary
frame (servers do not mask); :meth:`DirectMessages.write_binary` writes header and message at once when
websockets itself holds nothing to send before them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.streams import StreamReader

try:  # websockets' C unmasking, as its own frame parser uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a websockets built without its extension
    from websockets.utils import apply_mask

__all__ = ["DirectMessages", "binary_frame_header"]

_FIN_TEXT, _FIN_BINARY = 0x81, 0x82  # first header byte of a whole (FIN, no RSV bits) text/binary frame
_MASKED = 0x80
_DATA_OPCODES = (Opcode.CONT.value, Opcode.TEXT.value, Opcode.BINARY.value)
_AT_EOF = StreamReader.at_eof.__code__
_OPEN = State.OPEN  # compared for every frame split here


# the two longer headers, packed in one call each (every audio message takes one)
_pack_header16 = struct.Struct("!BBH").pack
_pack_header64 = struct.Struct("!BBQ").pack


def binary_frame_header(size: int) -> bytes:
    """The header of an unmasked, unfragmented binary frame of ``size`` payload bytes (RFC 6455 5.2)."""
    if size < 126:
        return bytes((_FIN_BINARY, size))
    if size < 1 << 16:
        return _pack_header16(_FIN_BINARY, 126, size)
    return _pack_header64(_FIN_BINARY, 127, size)


class DirectMessages(ServerConnection):
    """A ServerConnection that hands each whole data message to ``on_message`` from inside
    ``data_received`` (see the module docstring) instead of queueing it for a reader task.

    Only while a handler is set and no earlier message waits in websockets' queue, so the order holds;
    fragmented messages, and text that is not UTF-8 (which websockets closes with 1007), take the queue.
    """

    on_message: Callable[[str | bytes], None] | None = None
    # None: not decided yet; True: frames are split here; False: websockets parses everything
    _splitting: bool | None = None
    _partial: bytes | bytearray = b""  # the start of a frame whose rest has not arrived
    _limit: int | None = None  # websockets' largest frame (its max_size), read once splitting begins
    # websockets' queue of received frames (never replaced): while it holds any, later messages queue too
    _waiting: Any = None
    _fragmented = False  # websockets was fed the start of a fragmented message and not its end

    # -- receiving ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._splitting is None and self.on_message is not None:
            self._splitting = _parser_between_frames(self)
            self._limit = _max_message_size(self)
            self._waiting = getattr(getattr(self.recv_messages, "frames", None), "queue", None)
            if self._waiting is None:  # another websockets: no queue to look at, so it parses everything
                self._splitting = False
        if not self._splitting:
            super().data_received(data)
            return
        if self._partial:
            self._partial += data
            buf: bytes | bytearray = self._partial
        else:
            buf = data
        self._partial = b""
        end = len(buf)
        pos = 0
        limit = self._limit
        waiting = self._waiting
        while pos < end:
            if self.on_message is None or self.protocol.state is not _OPEN:
                self._stop_splitting(buf[pos:])
                return
            if end - pos < 2:
                break
            first, second = buf[pos], buf[pos + 1]
            size, head = second & 0x7F, 2
            if size == 126:  # most latent messages: a 16-bit length, read without slicing the buffer
                if end - pos < 4:
                    break
                size, head = buf[pos + 2] << 8 | buf[pos + 3], 4
            elif size == 127:
                if end - pos < 10:
                    break
                size, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if not second & _MASKED or (limit is not None and size > limit):
                self._stop_splitting(buf[pos:])  # websockets refuses it and closes (1002, 1009)
                return
            payload_at = pos + head + 4
            frame_end = payload_at + size
            if frame_end > end:
                break
            if first in (_FIN_BINARY, _FIN_TEXT) and not self._fragmented and not waiting:
                payload = apply_mask(buf[payload_at:frame_end], buf[pos + head : payload_at])
                if first == _FIN_BINARY:  # most messages: latents, straight to the handler
                    self.on_message(payload)
                else:
                    self._hand_over_text(payload, buf[pos:frame_end])
            else:
                self._feed_websockets(first, buf[pos:frame_end])
            pos = frame_end
        if pos < end:  # a frame still arriving (bounded: anything over the limit went to websockets)
            self._partial = buf if pos == 0 and isinstance(buf, bytearray) else bytearray(buf[pos:])

    def eof_received(self) -> None:
        if self._splitting and self._partial:
            self._stop_splitting(self._partial)  # a truncated frame: websockets reports it
        super().eof_received()

    def _hand_over_text(self, payload: bytes, frame: bytes | bytearray) -> None:
        handler = self.on_message
        assert handler is not None
        try:
            message = payload.decode()
        except UnicodeDecodeError:
            self._feed_websockets(_FIN_TEXT, frame)  # its parser and queue refuse it (1007)
            return
        handler(message)

    def _feed_websockets(self, first: int, frame: bytes | bytearray) -> None:
        """Give websockets one whole frame; note whether a fragmented message is now open there."""
        if first & 0x0F in _DATA_OPCODES:
            self._fragmented = not first & 0x80
        super().data_received(bytes(frame))

    def _stop_splitting(self, rest: bytes | bytearray) -> None:
        """From here on websockets parses every byte; its parser is between frames, so ``rest`` and what
        follows read to it as if it had had them all along."""
        self._splitting = False
        self._partial = b""
        if rest:
            super().data_received(bytes(rest))

    def _queued(self) -> bool:
        """Whether messages wait in websockets' queue (then later ones must queue behind them)."""
        return bool(getattr(getattr(self.recv_messages, "frames", None), "queue", True))

    def process_event(self, event: Any) -> None:
        # What websockets parsed itself: before the handler was set, or a frame fed to it from here.
        handler = self.on_message
        if (
            handler is None
            or not isinstance(event, Frame)
            or not event.fin
            or event.opcode not in (Opcode.TEXT, Opcode.BINARY)
            or self._queued()  # earlier frames wait
        ):
            super().process_event(event)
            return
        data = bytes(event.data)
        if event.opcode is Opcode.BINARY:
            handler(data)
            return
        try:
            text = data.decode()
        except UnicodeDecodeError:
            super().process_event(event)
            return
        handler(text)

    # -- sending -----------------------------------------------------------------------------------
    def write_binary(self, header: bytes, data: bytes) -> bool:
        """Write one binary message of ``header + data`` (the frame's header from
        :func:`binary_frame_header`); False, writing nothing, when websockets must frame it (it holds
        bytes to send first, or the connection negotiated an extension)."""
        protocol = self.protocol
        if protocol.writes or protocol.extensions or protocol.state is not State.OPEN:
            return False
        self.transport.write(header + data)
        return True


def _parser_between_frames(conn: ServerConnection) -> bool:
    """Whether websockets' parser waits for the first byte of a frame with nothing buffered: the one point
    where frames may be split here instead. Read from its generators: parse() waits in the reader's
    ``at_eof()`` between frames; anywhere else (or another websockets whose parser differs) it is not."""
    protocol = conn.protocol
    if protocol.state is not State.OPEN or protocol.extensions or protocol.reader.buffer:
        return False
    waiting: Any = protocol.parser
    while getattr(waiting, "gi_yieldfrom", None) is not None:
        waiting = waiting.gi_yieldfrom
    return getattr(waiting, "gi_code", None) is _AT_EOF


def _max_message_size(conn: ServerConnection) -> int | None:
    """The largest frame websockets accepts here (its ``max_size``): larger ones are its to refuse."""
    protocol: Any = conn.protocol
    size = getattr(protocol, "max_message_size", getattr(protocol, "max_size", None))
    fragment = getattr(protocol, "max_fragment_size", None)
    if fragment is not None:
        size = fragment if size is None else min(size, fragment)
    return size
