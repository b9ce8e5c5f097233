"""The benchmark: its pure pieces (listener model, policy simulation, baselines, error metrics) and a
small CPU smoke run of the whole ``streamdec bench`` so it cannot rot. No timing is asserted."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.bench import BenchConfig, run
from streamdec.bench.cli import config_from_args, configure_bench, summary_table
from streamdec.bench.concurrency import device_seconds_by_kind, listen, simulate_policy, underruns_of
from streamdec.bench.meta import ResultFile
from streamdec.bench.quality import crossfade_chunks, error_metrics, naive_chunks, seam_samples
from streamdec.engine.base import DeviceCall
from streamdec.errors import ConfigError

HOP = 4


def _local_decode(z: torch.Tensor) -> torch.Tensor:
    """A context-free 'codec': each frame becomes HOP samples of its first latent value. [B,T,D] -> [B,1,T*HOP]"""
    return z[..., :1].repeat_interleave(HOP, dim=1).transpose(1, 2)


@pytest.mark.parametrize(
    ("tiles", "prebuffer", "expected"),
    [
        pytest.param([(0.0, 0, 2), (0.04, 2, 2), (0.08, 4, 2)], 0.0, (0, 0.0), id="on-time"),
        pytest.param([(0.0, 0, 2), (0.05, 2, 2), (0.08, 4, 2)], 0.0, (1, 0.01), id="late-then-stall-absorbs"),
        pytest.param([(0.0, 0, 2), (0.05, 2, 2)], 0.02, (0, 0.0), id="prebuffer-covers"),
        pytest.param([], 0.0, (0, 0.0), id="no-tiles"),
    ],
)
def test_listener_counts_late_tiles_and_stalls(
    tiles: Any, prebuffer: float, expected: tuple[int, float]
) -> None:
    """A tile later than its playback time is one underrun; playback stalls by the lateness."""
    underruns, stall = listen(tiles, prebuffer, frame_s=0.02)
    assert underruns == expected[0]
    assert stall == pytest.approx(expected[1])


def test_underrun_events_carry_their_arrival_and_stall() -> None:
    """Each late tile is one event: when it arrived and how long playback stalled for it; later deadlines
    move by the stall, so a second tile as late as the first only stalls by what it adds."""
    tiles = [(0.0, 0, 2), (0.05, 2, 2), (0.10, 4, 2), (0.2, 6, 2)]
    events = underruns_of(tiles, 0.0, frame_s=0.02)
    assert [at for at, _ in events] == [0.05, 0.10, 0.2]
    assert [stall for _, stall in events] == pytest.approx([0.01, 0.01, 0.06])
    assert listen(tiles, 0.0, frame_s=0.02) == (3, pytest.approx(0.08))


def test_device_seconds_are_split_by_kind_of_call_from_the_start_of_a_point() -> None:
    """Only calls launched at or after the point's start count; untimed calls (the CPU) give None."""

    def call(kind: str, launched: float, device_s: float | None) -> DeviceCall:
        return DeviceCall(
            kind, 4, 16, 16, 0, launched, launched + 0.08, launched, launched + 0.01, device_s, 0.01
        )

    calls = [
        call("step", 0.5, 0.030),  # before the point: an earlier point's call
        call("prime", 1.0, 0.004),
        call("step", 1.1, 0.035),
        call("step", 1.2, 0.033),
        call("flush", 1.3, 0.006),
    ]
    assert device_seconds_by_kind(calls, since=1.0) == {
        "flush": pytest.approx(0.006),
        "prime": pytest.approx(0.004),
        "step": pytest.approx(0.068),
    }
    assert device_seconds_by_kind([call("window", 1.0, None)], since=0.0) is None
    assert device_seconds_by_kind(calls, since=2.0) is None


def test_policy_simulation_finds_the_chunk_completing_the_first_window() -> None:
    """With 4-frame chunks, min_emit 4 and right context 7, the first window needs 11 frames: chunk 2."""
    first, tiles = simulate_policy(52, 7, 4, 8, frames=100, burst=4, frame_s=0.02)
    assert first == 2
    assert sum(t[2] for t in tiles) == 100
    assert [t[1] for t in tiles] == sorted(t[1] for t in tiles)


@settings(max_examples=40, deadline=None)
@given(frames=st.integers(1, 40), chunk=st.integers(1, 12), overlap=st.integers(0, 12))
def test_chunked_baselines_are_exact_for_a_context_free_decoder(
    frames: int, chunk: int, overlap: int
) -> None:
    """For every chunking, naive and crossfaded chunks equal the whole decode when no frame needs context."""
    z = torch.randn(frames, 3)
    whole = _local_decode(z[None])[0]
    assert torch.equal(naive_chunks(z, chunk, _local_decode), whole)
    assert torch.allclose(
        crossfade_chunks(z, chunk, min(overlap, chunk), _local_decode, HOP), whole, atol=1e-6
    )


def test_error_metrics_exact_and_noisy() -> None:
    """An exact copy is bit-exact with no SNR; added noise gives the SNR it was made with."""
    ref = torch.randn(1, 48_000, generator=torch.Generator().manual_seed(1))
    exact = error_metrics(ref.clone(), ref, seam_samples(100, 10, 480), 24_000)
    assert exact["bit_exact"] is True and exact["snr_db"] is None and exact["seams"] == 9
    noisy = error_metrics(ref + 0.1 * torch.randn_like(ref), ref, [], 24_000)
    assert noisy["snr_db"] == pytest.approx(20.0, abs=0.3)
    assert noisy["click_energy_db"] is None


def test_config_refuses_unknown_tier_and_bad_policy() -> None:
    """Bad settings fail once, with the value in the message."""
    with pytest.raises(ConfigError, match="warp"):
        BenchConfig(tiers=("warp",))
    with pytest.raises(ConfigError, match="conc_max_emit=2"):
        BenchConfig(conc_min_emit=4, conc_max_emit=2)


def test_cpu_defaults_come_from_the_device() -> None:
    """Unset arguments take the device's defaults: tiny and eager on the CPU."""
    parser = argparse.ArgumentParser()
    configure_bench(parser)
    cfg = config_from_args(parser.parse_args(["--device", "cpu", "--repeats", "3"]))
    assert (cfg.codec, cfg.tiers, cfg.repeats) == ("tiny", ("eager",), 3)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench")
    cfg = BenchConfig(
        codec="tiny", device="cpu", sizes=(4,), clip_seconds=0.5, repeats=1, warm_calls=0, ttfa_repeats=1,
        streams=(1,), conc_seconds=0.5, stagger=0.0, out=str(out), name="smoke",
        max_point_s=600.0,  # stream the point however loaded the machine: the tests check its audio
    )  # fmt: skip
    result = asyncio.run(run(cfg, quiet=True))
    gc.collect()  # an unclosed resource of the run surfaces here, as an error (filterwarnings = error)
    return result, out


def test_smoke_run_writes_json_with_provenance(smoke: tuple[dict[str, Any], Path]) -> None:
    """The JSON on disk records command, device, torch, commit and date, and no section failed."""
    _, out = smoke
    on_disk = json.loads((out / "smoke.json").read_text())
    assert on_disk["errors"] == []
    meta = on_disk["meta"]
    for key in ("command", "device", "torch", "git_commit", "date_utc"):
        assert meta[key]
    assert on_disk["warmup"]["eager"]["seconds"] >= 0  # warm-up reported on its own
    assert "click_energy_db" in on_disk["definitions"]


def test_smoke_run_streamdec_is_exact_and_naive_is_not(smoke: tuple[dict[str, Any], Path]) -> None:
    """Streamed tiles match the whole decode; naive chunks do not (their seams click)."""
    result, _ = smoke
    point = result["tiles"]["tiers"][0]["points"][0]
    error = point["stream"]["error"]
    assert error["bit_exact"] or error["snr_db"] > 100
    naive = result["baselines"]["naive"][0]["error"]
    assert naive["snr_db"] is not None and naive["snr_db"] < 60
    assert naive["click_energy_db"] is not None


def test_smoke_run_measures_both_concurrency_paths(smoke: tuple[dict[str, Any], Path]) -> None:
    """One real-time stream went through StreamDecoder and one through the websocket server, completely."""
    conc = smoke[0]["concurrency"]
    for path in ("decoder", "websocket"):
        (point,) = conc[path]
        assert point["broken_streams"] == 0 and point["ttfa_ms"]["n"] == 1
    assert "max streams" in summary_table(smoke[0])


def test_smoke_run_writes_png_plots(smoke: tuple[dict[str, Any], Path]) -> None:
    """Four plots, each a PNG file."""
    result, out = smoke
    assert len(result["plots"]) == 4
    for name in result["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_result_file_is_written_at_once_and_rewritten_whole(tmp_path: Path) -> None:
    """The GPU scripts' JSON exists from the start and each save replaces it with the current figures."""
    out = tmp_path / "deep" / "run.json"
    run = ResultFile(out, {"command": "x", "shapes": []})
    assert json.loads(out.read_text()) == {"command": "x", "shapes": []}
    run.result["shapes"].append({"batch": 1, "ms": 2.5})
    run.save()
    assert json.loads(out.read_text())["shapes"] == [{"batch": 1, "ms": 2.5}]
    assert run.elapsed() >= 0.0


def test_median_ms_times_each_call_between_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA-event medians without a GPU: a fake clock advances 1, 5, 2, 9, 3 ms over the timed calls."""
    from streamdec.bench import stats

    durations = iter([1.0, 5.0, 2.0, 9.0, 3.0])
    clock = [0.0]
    calls: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = 0.0

        def record(self, stream: object = None) -> None:
            self.at = clock[0]

        def synchronize(self) -> None:
            calls.append("sync")

        def elapsed_time(self, other: FakeEvent) -> float:
            return other.at - self.at

    def fn() -> None:
        calls.append("call")
        if len([c for c in calls if c == "call"]) > 2:  # the two warm-up calls take no time
            clock[0] += next(durations)

    monkeypatch.setattr(stats.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(stats.torch.cuda, "synchronize", lambda: calls.append("device sync"))
    assert stats.median_ms(fn, 5, warm=2) == 3.0
    assert calls[:3] == ["call", "call", "device sync"]  # warm-up, then a synchronisation, then timing
    assert calls.count("call") == 7 and calls.count("sync") == 5


def test_profile_summary_sorts_kernels_by_kind() -> None:
    """scripts/profile_decode.py's per-decode summary: Inductor's kernels stay Inductor's even when their
    names list the custom op they were fused next to."""
    import importlib.util
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[2] / "scripts" / "profile_decode.py"
    spec = importlib.util.spec_from_file_location("profile_decode", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    events = [
        SimpleNamespace(key=name, self_device_time_total=us)
        for name, us in [
            ("_conv1d_f16x3_kernel", 5000.0), ("_chunk_sum_kernel", 500.0),
            ("triton_poi_fused_constant_pad_nd_conv1d_split_f16_select_64", 1000.0),
            ("_af_blocked_kernel", 2000.0), ("_row_amax_kernel", 250.0), ("cudaLaunchKernel", 0.0),
        ]
    ]  # fmt: skip
    lines = module.summarise(events, calls=5).splitlines()
    per_kind = {line[:32].strip(): float(line[32:].split()[0]) for line in lines[1:]}
    assert per_kind == {
        "split conv": 1.1, "fused activation": 0.4, "inductor (adds, pads, casts)": 0.2,
        "split pre-pass": 0.05, "total": 1.75,
    }  # fmt: skip


def test_bench_stateful_prints_a_line_per_point_with_its_verdict_and_device_time() -> None:
    """scripts/bench_stateful.py's closing lines, from a committed result: each point's verdict, p99 first
    audio, streams that under-ran, and where it was timed, the device time against a whole clip."""
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_stateful", root / "scripts" / "bench_stateful.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = json.loads((root / "bench/results/h100/stateful-512-fused-calls-1.json").read_text())
    (line,) = module._summary(result)
    assert line.startswith("bench_stateful: stateful 512 streams: fails, p99 first audio 71.2 ms, 18 streams")
    assert "1.38x a whole clip at batch 32 (flush 0.056, prime 0.124, step 1.199)" in line
    del result["modes"]["stateful"]["device_per_audio_second"]
    (bare,) = module._summary(result)
    assert bare.endswith("mean batch 74.7") and "whole clip" not in bare


def test_sim_batching_on_measured_replays_reports_device_time_by_kind(tmp_path: Path) -> None:
    """scripts/sim_batching.py with a GPU result's replay times: a few real-time streams through the
    engine's scheduling on the simulated device, the device time by kind set against that GPU's whole
    clip, and a JSON with its environment and where its replay times came from."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    replays = "bench/results/h100/stateful-512-fused-calls-2.json"
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [sys.executable, "scripts/sim_batching.py", "--streams", "6", "--seconds", "1.5", "--replays", replays,
         "--out", str(out)],
        cwd=root, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "   6 streams: ok=" in done.stdout  # whether a loaded host kept time is not what is tested
    assert "x the whole clip at batch 32 (flush " in done.stdout
    record = json.loads(out.read_text())
    assert record["replays"] == {"from": replays, "device": "NVIDIA H100 80GB HBM3"}
    assert record["environment"]["command"]
    (point,) = record["sweep"]["decoder"]
    assert set(point["device_s_by_kind"]) == {"prime", "step", "flush"}
