"""The garbage-collector pause monitor's accounting and its Prometheus lines."""

from __future__ import annotations

import gc

from streamdec.bench.loadstats import gc_pause_max_ms, parse_prometheus
from streamdec.server.gcpause import GcPauseMonitor

NAME = "streamdec_gc"


def test_a_full_collection_is_counted_and_timed_until_stop() -> None:
    """A full collection counts under generation 2 with its time; the peak gauge resets at each render;
    after stop() collections are no longer seen."""
    monitor = GcPauseMonitor.start()
    try:
        gc.collect()
        first = parse_prometheus(monitor.render())
    finally:
        monitor.stop()
    assert first[f'{NAME}_collections_total{{generation="2"}}'] >= 1
    assert first[f'{NAME}_pause_seconds_total{{generation="2"}}'] > 0
    assert first[f'{NAME}_pause_max_seconds{{generation="2"}}'] > 0
    assert (gc_pause_max_ms(first) or 0) > 0
    counted = monitor.collections[2]
    gc.collect()
    assert monitor.collections[2] == counted  # stopped
    second = parse_prometheus(monitor.render())
    assert second[f'{NAME}_pause_max_seconds{{generation="2"}}'] == 0.0  # reset by the first render
    assert monitor._callback not in gc.callbacks


def test_the_load_test_reads_the_longest_pause_of_any_generation() -> None:
    metrics = {
        f'{NAME}_pause_max_seconds{{generation="0"}}': 0.001,
        f'{NAME}_pause_max_seconds{{generation="2"}}': 0.0425,
        "streamdec_event_loop_lag_seconds_max": 0.05,
    }
    assert gc_pause_max_ms(metrics) == 42.5
    assert gc_pause_max_ms({"streamdec_event_loop_lag_seconds_max": 0.05}) is None
