"""The float16 split convolution's launch planning (pure; the kernel itself is tested on the GPU)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from streamdec.kernels import f16_launch, sizing
from streamdec.kernels.f16_launch import CHUNK_STEPS, LARGE, SMALL, Tiles, chunking, plan


@given(st.integers(1, 5000))
def test_chunks_cover_the_reduction_in_as_few_equal_pieces_as_fit(steps: int) -> None:
    per, chunks = chunking(steps)
    assert 1 <= per <= CHUNK_STEPS
    assert per * (chunks - 1) < steps <= per * chunks  # every step in exactly one chunk, none empty
    assert chunks == -(-steps // CHUNK_STEPS)  # no more chunks than the limit forces


layers = st.fixed_dictionaries(
    {
        "padded_channels": st.integers(1, 64).map(lambda n: 32 * n),
        "cout": st.integers(1, 4000),
        "tout": st.integers(1, 40000),
        "ksize": st.integers(1, 11),
    }
)
launches = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 64),
        "sms": st.sampled_from([78, 108, 132]),
        "tiles": st.sampled_from([None, LARGE, SMALL, Tiles(128, 64, 8, 2), Tiles(64, 128, 4, 3)]),
        "split": st.sampled_from([None, False, True]),
    }
)


@given(layers, launches, launches)
def test_the_arithmetic_is_the_layers_whatever_the_launch(
    layer: dict[str, int], one: dict[str, object], other: dict[str, object]
) -> None:
    """Step size and chunking (what sets the rounding) never depend on batch, tiles, split or GPU."""
    a, b = plan(**layer, **one), plan(**layer, **other)  # type: ignore[arg-type]
    assert (a.block_k, a.chunk_steps, a.chunks) == (b.block_k, b.chunk_steps, b.chunks)
    assert layer["padded_channels"] % a.block_k == 0


@given(layers, launches)
@example(  # two rows of 16 samples: both in one program of 32 columns, where one row alone would pad to 32
    {"padded_channels": 32, "cout": 1, "tout": 16, "ksize": 1},
    {"batch": 2, "sms": 78, "tiles": LARGE, "split": None},
)
@example(  # rows of 240 in 16-sample pieces, 8 rows a program, instead of two 128-sample tiles each
    {"padded_channels": 192, "cout": 192, "tout": 240, "ksize": 7},
    {"batch": 64, "sms": 132, "tiles": None, "split": None},
)
def test_the_grid_covers_the_output(layer: dict[str, int], launch: dict[str, object]) -> None:
    p = plan(**layer, **launch)  # type: ignore[arg-type]
    tiles_n, tiles_m, programs = p.grid
    row_n = p.block_n // p.rows  # samples of each row a program covers
    assert tiles_n * row_n >= layer["tout"] and (tiles_n - 1) * row_n < layer["tout"]
    assert tiles_m * p.block_m >= layer["cout"] and (tiles_m - 1) * p.block_m < layer["cout"]
    groups = -(-launch["batch"] // p.rows)  # type: ignore[operator]
    assert programs == groups * (p.chunks if p.split else 1)
    assert p.block_m >= 64 and p.block_n >= 16 and p.warps * 16 <= p.block_m  # a warpgroup per 64 rows
    if p.rows > 1:  # packed: pieces of one of the sizes, none smaller padding a row less
        tout = layer["tout"]
        assert row_n in f16_launch.PACK_ROW_NS
        assert all(
            -(-tout // row_n) * row_n <= -(-tout // n) * n for n in f16_launch.PACK_ROW_NS if n <= row_n
        )
    assert not p.split or p.chunks > 1


@given(layers, launches)
def test_packing_is_only_a_choice_of_programs(layer: dict[str, int], launch: dict[str, object]) -> None:
    """Packed or not, the layer's arithmetic is the same; unpacked, every program covers one row."""
    packed, alone = plan(**layer, **launch), plan(**layer, **launch, pack=False)  # type: ignore[arg-type]
    assert (packed.block_k, packed.chunk_steps, packed.chunks) == (
        alone.block_k,
        alone.chunk_steps,
        alone.chunks,
    )
    assert alone.rows == 1


def test_a_stateful_steps_short_rows_are_packed_where_the_grid_stays_full() -> None:
    """auk-24k's 768-channel stage in a 512-stream step of 4 frames: 20 samples a row. Packed, a
    128-sample tile covers 4 samples of 32 rows (20 computed per row) instead of 32 samples of one."""
    step = plan(batch=512, padded_channels=768, cout=768, tout=20, ksize=3, sms=132)
    assert (step.block_m, step.rows, step.block_n, step.grid) == (128, 32, 128, (5, 6, 16))
    assert plan(batch=512, padded_channels=768, cout=768, tout=20, ksize=3, sms=132, pack=False).rows == 1
    assert plan(batch=2, padded_channels=768, cout=768, tout=20, ksize=3, sms=132).rows == 1  # grid too small
    assert plan(batch=16, padded_channels=768, cout=768, tout=3500, ksize=3, sms=132).rows == 1  # long rows


@pytest.mark.parametrize("ksize", [3, 7, 11])
def test_packed_large_tiles_with_a_mostly_empty_last_wave_give_way_to_small_ones(
    ksize: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same stage at 256 streams in 8-sample pieces: 288 large packed programs are 2.2 waves of one a
    multiprocessor, so small tiles (two a multiprocessor, 1,152 programs) run it, without split-K
    (measured on an H200: 0.14 against 0.19 ms for 3 taps, 0.31 against 0.37 for 7, 0.49 against 0.53
    for 11). In 4-sample pieces the same rows make 240 large programs, 91 % full, and keep the large tile,
    as 384 channels at 256 streams do (480 programs)."""
    step = plan(batch=256, padded_channels=768, cout=768, tout=20, ksize=ksize, sms=132)
    assert (step.block_m, step.block_n, step.rows, step.split, step.grid) == (128, 128, 32, False, (5, 6, 8))
    assert plan(batch=256, padded_channels=384, cout=384, tout=80, ksize=ksize, sms=132).block_m == 128
    monkeypatch.setattr(f16_launch, "PACK_ROW_NS", (8,))
    step = plan(batch=256, padded_channels=768, cout=768, tout=20, ksize=ksize, sms=132)
    assert (step.block_m, step.block_n, step.rows, step.split, step.grid) == (64, 64, 8, False, (3, 12, 32))
    assert plan(batch=512, padded_channels=768, cout=768, tout=20, ksize=ksize, sms=132).block_m == 128


def test_auk_first_stage_runs_its_chunks_as_programs_when_that_fills_the_waves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """768 channels, 11 taps (3 chunks), 350 samples. Batch 1 fills 72 of 132 SMs with small tiles, so
    its chunks run as separate programs. At batch 16, 128-sample tiles would pad each row to 384: its rows
    go in 32-sample pieces (352), 4 rows a program, and 264 large programs fill two waves exactly, so each
    runs its chunks itself. One row a program, the 288 large tiles were 2.2 waves, and as 864 chunk
    programs 6.5 (measured: 0.44 against 0.52 ms a layer on an H200)."""
    one = plan(batch=1, padded_channels=768, cout=768, tout=350, ksize=11, sms=132)
    assert (one.block_m, one.block_n, one.block_k) == (64, 64, 64)
    assert (one.chunk_steps, one.chunks) == (44, 3)
    assert one.split and one.grid == (6, 12, 3)
    sixteen = plan(batch=16, padded_channels=768, cout=768, tout=350, ksize=11, sms=132)
    assert (sixteen.block_m, sixteen.block_n, sixteen.warps, sixteen.rows) == (128, 128, 8, 4)
    assert not sixteen.split and sixteen.grid == (11, 6, 4)
    monkeypatch.setattr(f16_launch, "PACK_LONG_ROWS", False)
    sixteen = plan(batch=16, padded_channels=768, cout=768, tout=350, ksize=11, sms=132)
    assert sixteen.rows == 1 and sixteen.split and sixteen.grid == (3, 6, 48)
    second = plan(batch=16, padded_channels=384, cout=384, tout=1400, ksize=11, sms=132)
    assert (second.block_m, second.block_n) == (128, 128) and not second.split  # 528 tiles: 4.0 waves


@pytest.mark.parametrize(("channels", "stages"), [(192, 2), (96, 4), (48, 2), (24, 4)])
def test_channel_counts_off_the_large_tile_take_pairs_of_small_ones(channels: int, stages: int) -> None:
    """auk-24k's later stages at batch 16: 64-channel tiles (no idle third of a 128 tile at 192), with as
    many stages as let two programs share a multiprocessor (steps of 64 channels, or 32 below 64)."""
    padded = channels + (-channels % 32)
    p = plan(batch=16, padded_channels=padded, cout=channels, tout=4200, ksize=7, sms=132)
    assert (p.block_m, p.block_n, p.warps, p.stages) == (64, 128, 4, stages)
    assert 2 * p.stages * (p.block_m + p.block_n) * p.block_k * 4 <= 2 * f16_launch.SHARED_PER_PAIR


def test_the_limit_is_read_when_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f16_launch, "CHUNK_STEPS", 4)
    assert chunking(15) == (4, 4)


@given(layers, st.integers(1, 512))
def test_channels_along_n_launch_fits_and_keeps_the_layers_arithmetic(
    layer: dict[str, int], batch: int
) -> None:
    """The channels-along-N launch covers every output once, takes the layer's steps and chunks (so its
    bits are the layer's), fits its tile in 64 accumulator registers a thread and its stages in the shared
    memory of one of two programs on a multiprocessor."""
    launch = f16_launch.plan_channels(batch=batch, **layer)
    assert (launch.chunk_steps, launch.chunks) == chunking(
        layer["ksize"] * layer["padded_channels"] // launch.block_k
    )
    assert launch.block_k == f16_launch.block_k(layer["padded_channels"])
    assert 16 <= launch.block_o <= 128 and launch.block_o & (launch.block_o - 1) == 0
    assert launch.block_o >= min(layer["cout"], 128)
    assert launch.block_t % 64 == 0 and launch.block_t <= 256
    assert launch.block_t * launch.block_o <= 64 * 32 * launch.warps
    stage = (launch.block_t + launch.block_o) * launch.block_k * 4
    assert launch.stages >= 2 and (launch.stages * stage <= f16_launch.SHARED_PER_PAIR or launch.stages == 2)
    tiles_t, tiles_o, rows = launch.grid
    assert rows == batch
    assert (tiles_t - 1) * launch.block_t < layer["tout"] <= tiles_t * launch.block_t
    assert (tiles_o - 1) * launch.block_o < layer["cout"] <= tiles_o * launch.block_o


@pytest.mark.parametrize(("cout", "along_n"), [(1, True), (24, True), (32, True), (33, False), (96, False)])
def test_small_layers_put_their_channels_along_n(cout: int, along_n: bool) -> None:
    assert f16_launch.channels_as_n(cout) is along_n


@given(st.integers(1, 20000))
def test_the_input_split_takes_the_largest_tile_that_wastes_little(length: int) -> None:
    """The split's tile along time: a larger one only where its padding is at most 1/16 of the row; the
    smallest wherever none is that tight. Its warps hold the same elements a lane whatever the tile."""
    block = sizing.split_block_t(length)
    assert block in sizing.SPLIT_BLOCKS_T
    fitting = [b for b in sizing.SPLIT_BLOCKS_T if -length % b * sizing.SPLIT_WASTE <= length]
    assert block == (max(fitting) if fitting else min(sizing.SPLIT_BLOCKS_T))
    assert block * 32 % sizing.SPLIT_ELEMENTS_PER_WARP == 0


@pytest.mark.parametrize(
    ("length", "block"), [(22, 16), (86, 16), (96, 32), (128, 64), (961, 32), (1922, 64)]
)
def test_a_stateful_steps_short_rows_split_in_small_tiles(length: int, block: int) -> None:
    """auk-24k's 256 x 4 step: its wide layers' rows of 22-86 samples split in 16-sample tiles."""
    assert sizing.split_block_t(length) == block
