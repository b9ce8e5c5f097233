"""streamdec: decode codec latents into audio while the chunks are still arriving.

Where things are: windows are planned in :mod:`streamdec.planning`, one stream's state is the sans-I/O
:mod:`streamdec.session`, decoding happens in :mod:`streamdec.engine` (eager worker, CUDA graph replay),
the async API is :mod:`streamdec.streaming`, the wire format :mod:`streamdec.protocol`, and the websocket
server :mod:`streamdec.server`.
"""

from __future__ import annotations

from ._version import __version__
from .codecs import Codec, load_codec, save_codec
from .codecs.stateful import supports_stateful
from .engine import Engine, WarmupReport, WindowRequest, create_engine
from .planning import StreamPlanner, Window, plan_tiles
from .session import StreamSession, Tile
from .streaming import DecoderStats, StreamDecoder, TileStream

__all__ = [
    "Codec",
    "DecoderStats",
    "Engine",
    "StreamDecoder",
    "StreamPlanner",
    "StreamSession",
    "Tile",
    "TileStream",
    "WarmupReport",
    "Window",
    "WindowRequest",
    "__version__",
    "create_engine",
    "load_codec",
    "plan_tiles",
    "save_codec",
    "supports_stateful",
]
