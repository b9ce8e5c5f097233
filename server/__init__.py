"""The streamdec WebSocket server (protocol v1, see PROTOCOL.md): moves bytes between
:mod:`streamdec.protocol` and :class:`~streamdec.StreamDecoder`, plus ``/healthz``, ``/metrics`` and ``/``.

Import it as ``streamdec.server``; ``streamdec serve`` is :func:`streamdec.server.cli.run_serve`.
"""

from __future__ import annotations

from .app import StreamServer
from .config import ServerConfig

__all__ = ["ServerConfig", "StreamServer"]
