"""The event-loop lag monitor's accounting and its Prometheus lines."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamdec.bench.loadstats import parse_prometheus
from streamdec.server.looplag import LAG_BUCKETS, LoopLagMonitor

NAME = "streamdec_event_loop_lag_seconds"


def test_render_gives_cumulative_buckets_and_a_max_since_the_last_scrape() -> None:
    """Three samples land in their buckets cumulatively; the max gauge resets after each render."""
    monitor = LoopLagMonitor()
    for lag in (0.0002, 0.003, 2.0):
        monitor.observe(lag)
    first = parse_prometheus(monitor.render())
    assert first[f'{NAME}_bucket{{le="0.0005"}}'] == 1
    assert first[f'{NAME}_bucket{{le="0.005"}}'] == 2
    assert first[f'{NAME}_bucket{{le="{LAG_BUCKETS[-1]:g}"}}'] == 2  # 2 s is above every finite bound
    assert first[f'{NAME}_bucket{{le="+Inf"}}'] == first[f"{NAME}_count"] == 3
    assert first[f"{NAME}_sum"] == pytest.approx(2.0032)
    assert first[f"{NAME}_max"] == 2.0 and first[f"{NAME}_last"] == 2.0
    assert parse_prometheus(monitor.render())[f"{NAME}_max"] == 0.0


async def test_a_blocked_loop_shows_as_lag() -> None:
    """Blocking the loop for 50 ms makes the next sample at least that late."""
    monitor = LoopLagMonitor.start(interval=0.005)
    await asyncio.sleep(0.02)
    time.sleep(0.05)  # deliberately block the loop
    await asyncio.sleep(0.02)
    monitor.stop()
    assert monitor.max_recent >= 0.04
