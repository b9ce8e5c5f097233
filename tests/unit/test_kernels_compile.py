"""The float16 convolution kernel compiles for an H100/H200 (sm_90) without a GPU.

The Triton interpreter runs a kernel's Python, not its compilation, so a kernel can pass every
interpreter test and still fail to compile (a constexpr branch the code generator emits although it is
never taken, a descriptor load of the wrong rank). Compiling each launch family here, offline, catches
that before a GPU run does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under TRITON_INTERPRET=1 the kernels are built for the interpreter and nothing compiles for a GPU.
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for sm_90 only without TRITON_INTERPRET=1"
)

_SIZES = ("B", "CP", "COUT", "TIN", "TOUT", "DIL", "CHUNK", "NCHUNK", "KSIZE", "RES_ROW", "RES_CHAN", "RES_LEN",
          "TAIL_ROW", "TAIL_CHAN")  # fmt: skip


def _pointers_and_sizes() -> dict[str, str]:
    """The Triton convolution kernels' arguments after the four descriptors, in their order."""
    pointers = ("x_inv_ptr", "w_inv_ptr", "bias_ptr", "res_ptr", "tail_ptr", "out_ptr")
    return dict.fromkeys(pointers, "*fp32") | {"live_ptr": "*i64"} | dict.fromkeys(_SIZES, "i32")


def _first(ptx: str, *needles: str) -> int:
    """Where in ``ptx`` the first of ``needles`` is (its length if none is)."""
    found = [i for i in (ptx.find(n) for n in needles) if i >= 0]
    return min(found, default=len(ptx))


@pytest.mark.parametrize(
    ("rows", "block_n", "products", "split", "residual", "dependent"),
    [(1, 128, 3, False, True, False), (16, 128, 3, True, False, True), (1, 64, 1, False, False, False),
     (8, 64, 1, True, True, True), (32, 128, 3, False, True, True), (8, 128, 3, False, False, False)],
)  # fmt: skip
def test_float16_conv_kernel_compiles_for_sm90(
    rows: int,
    block_n: int,
    products: int,
    split: bool,
    residual: bool,
    dependent: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from streamdec.kernels._triton_conv_f16 import _conv1d_f16x3_kernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile, never load a cached binary
    x = (
        f"tensordesc<fp16[{block_n}, 64]>"
        if rows == 1
        else f"tensordesc<fp16[{rows}, {block_n // rows}, 64]>"
    )
    signature = {"x_hi_desc": x, "x_lo_desc": x, "w_hi_desc": "tensordesc<fp16[128, 64]>"}
    signature["w_lo_desc"] = signature["w_hi_desc"]
    signature |= _pointers_and_sizes()
    constants = {
        "HAS_RES": residual, "RES_PARTS": False, "HAS_BIAS": True, "SPLIT": split, "BLOCK_M": 128, "BLOCK_N": block_n,
        "BLOCK_K": 64, "ROWS": rows, "PRODUCTS": products, "HAS_LIVE": True, "DEPENDENT": dependent,
    }  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    names = list(signature)
    constexprs = {(names.index(name),): value for name, value in constants.items()}

    source = ASTSource(_conv1d_f16x3_kernel, signature, constexprs)
    options = {"num_warps": 8, "num_stages": 3, "launch_pdl": dependent}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    ptx = compiled.asm["ptx"]
    assert "wgmma" in ptx  # the Hopper tensor-core path, not a fallback
    if rows > 1:  # a packed box of any piece size reaches the tensor cores as a view of shared memory
        ttgir = compiled.asm["ttgir"]
        assert "ttg.memdesc_reshape" in ttgir and "ttg.local_load" not in ttgir
    if dependent:  # waits for the kernel before it ahead of any read, then lets the next one be placed
        wait = ptx.find("griddepcontrol.wait")
        assert 0 <= wait < _first(ptx, "ld.global", "cp.async.bulk.tensor") < len(ptx)
        assert ptx.find("griddepcontrol.launch_dependents") > wait
    else:
        assert "griddepcontrol" not in ptx


@pytest.mark.parametrize(
    ("rows", "block_m", "block_n", "block_k", "split", "parts", "stages", "chunked"),
    [(1, 128, 128, 64, False, False, 3, True), (16, 128, 128, 64, False, True, 3, False),
     (16, 128, 128, 64, True, False, 3, False), (8, 64, 64, 64, False, True, 4, False),
     (1, 64, 128, 32, False, False, 4, False)],
)  # fmt: skip
def test_specialized_conv_kernel_compiles_for_sm90(
    rows: int, block_m: int, block_n: int, block_k: int, split: bool, parts: bool, stages: int, chunked: bool,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The warp-specialized Gluon kernel compiles for sm_90 in each launch family: its roles share the
    registers out (setmaxnreg), and each consumer warpgroup waits for its products once a step, not after
    each of the three."""
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.experimental.gluon")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from streamdec.kernels._gluon_conv_f16 import _conv1d_f16x3_gluon_kernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    def desc(block: list[int]) -> str:
        layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16)
        return f"tensordesc<fp16[{', '.join(map(str, block))}],{layout!r}>"

    x = desc([block_n, block_k] if rows == 1 else [rows, block_n // rows, block_k])
    signature = {"x_hi_desc": x, "x_lo_desc": x, "w_hi_desc": desc([block_m, block_k])}
    signature["w_lo_desc"] = signature["w_hi_desc"]
    signature |= _pointers_and_sizes()
    constants = {
        "HAS_RES": True, "RES_PARTS": parts, "HAS_BIAS": True, "SPLIT": split, "BLOCK_M": block_m,
        "BLOCK_N": block_n, "BLOCK_K": block_k, "ROWS": rows, "STAGES": stages, "CHUNKED": chunked,
        "HAS_LIVE": rows > 1, "DEPENDENT": parts,
    }  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    names = list(signature)
    constexprs = {(names.index(name),): value for name, value in constants.items()}

    source = GluonASTSource(_conv1d_f16x3_gluon_kernel, signature, constexprs)
    options = {"num_warps": 4, "launch_pdl": parts, "maxnreg": 168 if block_m == 128 else 128}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    ptx = compiled.asm["ptx"]
    if parts:  # as a programmatic dependent: the wait comes before any read
        assert (
            0 <= ptx.find("griddepcontrol.wait") < _first(ptx, "ld.global", "cp.async.bulk.tensor") < len(ptx)
        )
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx  # the producer's registers go to the consumers
    consumers = block_m // 64
    assert ptx.count("wgmma.wait_group.sync.aligned") == consumers  # one wait a step in each consumer
    assert ptx.count("wgmma.commit_group.sync.aligned") == 3 * consumers  # three products issued back to back


@pytest.mark.parametrize("cout", [1, 24, 48, 96])
def test_channels_as_n_kernel_compiles_for_sm90(
    cout: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel with output channels along N compiles for sm_90 at each small layer's planned launch,
    on the tensor cores and without spilling."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from streamdec.kernels._triton_conv_f16 import _conv1d_f16x3_cn_kernel
    from streamdec.kernels.f16_launch import plan_channels
    from streamdec.kernels.split import F16_CHANNEL_QUANTUM

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    cp = cout + (-cout % F16_CHANNEL_QUANTUM)
    launch = plan_channels(batch=256, padded_channels=cp, cout=cout, tout=1920, ksize=11)
    x = f"tensordesc<fp16[{launch.block_t}, {launch.block_k}]>"
    w = f"tensordesc<fp16[{launch.block_o}, {launch.block_k}]>"
    signature = {"x_hi_desc": x, "x_lo_desc": x, "w_hi_desc": w, "w_lo_desc": w}
    signature |= _pointers_and_sizes()
    constants = {
        "HAS_RES": True, "RES_PARTS": True, "HAS_BIAS": True, "BLOCK_T": launch.block_t, "BLOCK_O": launch.block_o,
        "BLOCK_K": launch.block_k, "PRODUCTS": 3, "HAS_LIVE": True,
    }  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    names = list(signature)
    constexprs = {(names.index(name),): value for name, value in constants.items()}

    source = ASTSource(_conv1d_f16x3_cn_kernel, signature, constexprs)
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": launch.warps, "num_stages": launch.stages},
    )
    assert "wgmma" in compiled.asm["ptx"]
    ptx = tmp_path / "kernel.ptx"
    ptx.write_text(compiled.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if ptxas.exists():
        import subprocess

        report = subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "kernel.cubin")],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
        assert " 0 bytes spill stores" in report, report
