"""``streamdec bench``: latency per tile size and tier, side by side with the alternatives, and concurrency.

* :mod:`.tiles`       - tile sweep per decode tier (window latency, first audio, streaming cost, halo)
* :mod:`.baselines`   - whole-clip decode, seed 512-frame tiles, naive chunking, crossfade, on the same clip
* :mod:`.quality`     - those approaches and their error metrics (SNR, click energy at seams)
* :mod:`.concurrency` - N real-time streams through StreamDecoder and the websocket server
* :mod:`.runner`      - one run: sections in priority order under a time budget, JSON after each
* :mod:`.plots`       - PNG plots of a result; :mod:`.cli` - the command line

Nothing here is imported by the rest of streamdec.
"""

from __future__ import annotations

from .config import BenchConfig
from .runner import run

__all__ = ["BenchConfig", "run"]
