"""The parallel precompile's bookkeeping, without a GPU (its GPU behaviour: tests/gpu/test_precompile_cuda.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamdec.kernels import precompile


def test_nothing_to_compile_spawns_nothing() -> None:
    report = precompile.compile_variants([], target=None)
    assert (report.variants, report.workers, report.failed) == (0, 0, 0)


def test_a_variant_that_cannot_compile_is_counted_not_raised() -> None:
    bad = precompile.Variant("streamdec.no_such_module", "_kernel", "{}")
    report = precompile.compile_variants([bad], target=None, workers=1)
    assert report.failed == 1 and report.variants == 1
    assert "1 left to their first launch" in report.describe()


def test_default_workers_leave_a_core_and_cap_at_sixteen() -> None:
    assert 1 <= precompile.default_workers() <= 16


def test_a_worker_compiles_the_variant_a_launch_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline (no GPU): a specialization record as Triton's compile hook writes it compiles in a worker
    for an sm_90 target into the on-disk cache, under the source and options hashes the launch would use
    (JSON turned the options' tuples into lists: the worker must turn them back, or the key differs)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import serialize_specialization_data

    from support.triton_kernel import scale_kernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 8})
    signature = {
        "x_ptr": "*fp32",
        "out_ptr": "*fp32",
        "N": "i32",
        "FACTOR": "constexpr",
        "BLOCK": "constexpr",
    }
    constexprs = {(3,): 3.0, (4,): 512}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    record = serialize_specialization_data("k", signature, constexprs, attrs, options, "key")
    variant = precompile.Variant(scale_kernel.__module__, "scale_kernel", record)

    report = precompile.compile_variants([variant], target, workers=1)

    assert report.failed == 0, report.describe()
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert any(tmp_path.rglob("*.cubin")), entries
    # What the launch itself compiles (the hook's objects, before JSON) finds the worker's binary: the
    # cache gains no entry.
    triton.compile(
        ASTSource(scale_kernel, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == entries


def test_the_marker_lists_the_variants_it_was_written_with(tmp_path: Path) -> None:
    variants = [
        precompile.Variant("pkg.kernels", "conv", '{"key": "a"}'),
        precompile.Variant("pkg.kernels", "act", '{"key": "b", "signature": {"x": "*fp16"}}'),
    ]
    marker = tmp_path / "cache" / "streamdec-variants-x.json"
    precompile.write_marker(marker, variants)
    assert precompile.read_marker(marker) == variants
    assert [p.name for p in marker.parent.iterdir()] == [marker.name]  # no partial file left behind


@pytest.mark.parametrize("content", [None, "", "{not json", '{"module": "m"}', '[{"module": "m"}]'])
def test_a_missing_or_unreadable_marker_reads_as_none(tmp_path: Path, content: str | None) -> None:
    marker = tmp_path / "streamdec-variants-x.json"
    if content is not None:
        marker.write_text(content)
    assert precompile.read_marker(marker) is None


def test_a_variant_that_cannot_load_is_counted_not_raised() -> None:
    bad = precompile.Variant("streamdec.no_such_module", "_kernel", "{}")
    report = precompile.load_variants([bad, bad])
    assert (report.variants, report.failed) == (2, 2)
    assert "2 left to their first launch (ModuleNotFoundError" in report.describe()
