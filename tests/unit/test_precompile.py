"""The parallel precompile's bookkeeping, without a GPU (its GPU behaviour: tests/gpu/test_precompile_cuda.py)."""

from __future__ import annotations

from streamdec.kernels import precompile


def test_nothing_to_compile_spawns_nothing() -> None:
    report = precompile.compile_variants([])
    assert (report.variants, report.workers, report.failed) == (0, 0, 0)


def test_a_variant_that_cannot_compile_is_counted_not_raised() -> None:
    bad = precompile.Variant("streamdec.no_such_module", "_kernel", "{}")
    report = precompile.compile_variants([bad], workers=1)
    assert report.failed == 1 and report.variants == 1
    assert "1 left to their first launch" in report.describe()


def test_default_workers_leave_a_core_and_cap_at_sixteen() -> None:
    assert 1 <= precompile.default_workers() <= 16
