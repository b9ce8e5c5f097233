"""Placement of a new stream across devices, and the --devices list."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdec.errors import ConfigError
from streamdec.server.placement import DeviceLoad, parse_devices, place


def _loads(*pairs: tuple[int, int | None]) -> list[DeviceLoad]:
    return [DeviceLoad(f"fake:{i}", open_, cap) for i, (open_, cap) in enumerate(pairs)]


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        (((0, 4), (0, 4)), 0),  # a tie: the first listed
        (((1, 4), (0, 4)), 1),  # more free slots
        (((2, 8), (1, 4)), 0),  # 6 free beats 3 free although it has more streams
        (((4, 4), (3, 4)), 1),  # the only one with room
        (((4, 4), (4, 4)), None),  # every device full
        (((3, None), (0, 4)), 0),  # unbounded (halo) beats any bound
        (((3, None), (1, None)), 1),  # both unbounded: fewest open streams
    ],
    ids=["tie", "more-free", "bigger-device", "only-room", "all-full", "unbounded", "both-unbounded"],
)
def test_the_device_with_most_free_capacity_takes_the_stream(
    pairs: tuple[tuple[int, int | None], ...], expected: int | None
) -> None:
    """argmax of free slots; ties by fewest open streams, then order; None when all are full."""
    assert place(_loads(*pairs)) == expected


def _fill(capacities: list[int], steps: int | None = None) -> list[int]:
    opened = [0] * len(capacities)
    for _ in range(sum(capacities) if steps is None else steps):
        i = place([DeviceLoad(str(k), n, c) for k, (n, c) in enumerate(zip(opened, capacities, strict=True))])
        if i is None:
            break
        opened[i] += 1
    return opened


@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_every_slot_of_every_device_is_used(capacities: list[int]) -> None:
    """Placing streams one by one fills every device exactly, then refuses."""
    opened = _fill(capacities)
    assert opened == capacities
    assert place([DeviceLoad(str(k), c, c) for k, c in enumerate(capacities)]) is None


@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_equal_devices_stay_within_one_stream(devices: int, slots: int, data: st.DataObject) -> None:
    """On equal devices, after any number of placements no device holds two streams more than another."""
    opened = _fill([slots] * devices, data.draw(st.integers(0, devices * slots)))
    assert max(opened) - min(opened) <= 1


@pytest.mark.parametrize(
    ("spec", "count", "expected"),
    [
        ("all", 2, ["cuda:0", "cuda:1"]),
        ("cuda:0,cuda:1", 2, ["cuda:0", "cuda:1"]),
        (" cuda:1 ", 4, ["cuda:1"]),
    ],
    ids=["all", "list", "one"],
)
def test_devices_are_parsed(spec: str, count: int, expected: list[str]) -> None:
    """`all` is every CUDA device; a list names them."""
    assert parse_devices(spec, count) == expected


@pytest.mark.parametrize(
    ("spec", "count", "needle"),
    [
        ("all", 0, "no CUDA device"),
        ("", 2, "names no device"),
        ("cpu", 2, "not a CUDA device"),
        ("cuda:2", 2, "this host has 2"),
        ("cuda:0,cuda:0", 2, "twice"),
    ],
    ids=["all-none", "empty", "cpu", "missing", "duplicate"],
)
def test_bad_devices_are_refused_with_the_fix(spec: str, count: int, needle: str) -> None:
    """A wrong --devices value is a ConfigError that says what is wrong."""
    with pytest.raises(ConfigError, match=needle):
        parse_devices(spec, count)
