"""The float16 convolution kernel compiles for an H100/H200 (sm_90) without a GPU.

The Triton interpreter runs a kernel's Python, not its compilation, so a kernel can pass every
interpreter test and still fail to compile (a constexpr branch the code generator emits although it is
never taken, a descriptor load of the wrong rank). Compiling each launch family here, offline, catches
that before a GPU run does."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("rows", "block_n", "products", "split", "residual"),
    [(1, 128, 3, False, True), (16, 128, 3, True, False), (1, 64, 1, False, False), (8, 64, 1, True, True)],
)
def test_float16_conv_kernel_compiles_for_sm90(
    rows: int,
    block_n: int,
    products: int,
    split: bool,
    residual: bool,
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
    signature |= dict.fromkeys(("x_inv_ptr", "w_inv_ptr", "bias_ptr", "res_ptr", "out_ptr"), "*fp32")
    signature |= dict.fromkeys(("B", "CP", "COUT", "TIN", "TOUT", "DIL", "CHUNK", "NCHUNK", "KSIZE"), "i32")
    constants = {
        "HAS_RES": residual, "HAS_BIAS": True, "SPLIT": split, "BLOCK_M": 128, "BLOCK_N": block_n,
        "BLOCK_K": 64, "ROWS": rows, "PRODUCTS": products,
    }  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    names = list(signature)
    constexprs = {(names.index(name),): value for name, value in constants.items()}

    source = ASTSource(_conv1d_f16x3_kernel, signature, constexprs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}
    )

    assert "wgmma" in compiled.asm["ptx"]  # the Hopper tensor-core path, not a fallback
