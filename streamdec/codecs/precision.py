"""How a codec's convolutions use a CUDA GPU's matrix units: ``"fp32"``, ``"tf32x3"``, ``"fp16x3"``,
``"fp16"``, ``"tf32"``.

* ``"fp32"`` (default): true float32 on CUDA cores. Exact to float32 round-off, and the slowest on a GPU
  at large batches.
* ``"tf32"``: cuDNN rounds every operand to TF32 (a 10-bit mantissa). About 3x faster, but it moves AuK's
  output by about 1e-3, and two graphs whose convolutions cuDNN implements differently (an eager call and
  a compiled one) then disagree by 62-68 dB: that breaks "streamed equals offline" at 1e-4.
* ``"tf32x3"``: TF32 tensor cores with split operands. Each operand is split into a TF32 head and a
  float32 tail and three of the four partial products are kept (NVIDIA's "3xTF32", as CUTLASS names it)::

      x = x_hi + x_lo,  w = w_hi + w_lo      x_hi, w_hi: rounded to 11 significant bits (exact in TF32)
      conv(x, w) ~ conv(x_hi, w_hi) + conv(x_hi, w_lo) + conv(x_lo, w_hi)

  Each tail is at most ``2**-11`` of its operand, so the dropped ``x_lo * w_lo`` is at most ``2**-22`` of
  ``|x * w|``: the products carry float32-level error (tests/unit/test_precision.py shows it on an emulated
  tensor core). A convolution sums over input channels, so the three terms are one convolution over three
  stacked copies of the input channels, ``[x_hi, x_hi, x_lo]`` against ``[w_hi, w_lo, w_hi]``: one kernel
  launch with three times the FLOPs, and weights split once and cached (:mod:`streamdec.kernels.split` holds the arithmetic) (three times the conv weights'
  memory).

  Through cuDNN it is not float32, though: measured on an H200, the tensor cores' float32 accumulator
  loses a little at every MMA step (it behaves like truncation, not round-to-nearest), so a layer's error
  grows with its reduction length ``3 * Cin * k``: about 1e-6 of the output peak at 200 terms, 2-3e-5 at
  7,000, in cuDNN and cuBLAS alike, against 0.4-3e-6 for float32 on CUDA cores and 3e-4 for plain TF32
  (``scripts/probe_conv_precision.py``; ``docs/precision.md``); a whole AuK decode lands at
  83 dB against float64. So where Triton is installed, ``"tf32x3"`` runs this package's convolutions
  through its own kernel (:mod:`streamdec.kernels.conv`), which takes the same three products but starts a
  fresh accumulator every reduction step and adds the steps in plain float32: a whole AuK decode then
  lands at 120 dB (fp32: 115 dB, tf32: 61 dB; max abs 1.3e-6, 2.6e-6, 1.2e-3). ``STREAMDEC_TRITON_CONV=0``
  falls back to the stacked cuDNN form above.

* ``"fp16x3"``: the same three products on the float16 tensor cores, where this package's float16 kernel
  runs (Triton and a GPU with TMA: compute capability 9.0, an H100 or H200). Each operand is first scaled
  by a power of two (one per batch row of the input, one per output channel of the weight) so that its
  largest magnitude lands in ``[2**13, 2**14)``, then split into a float16 head and tail
  (:func:`streamdec.kernels.split.split_input_f16`,
  :func:`streamdec.kernels.split.pack_split_weight_f16`): 22 bits, like the TF32 split, in half the
  bytes, and float16 products run at twice TF32's rate. The scales are exact and factor out of every sum.
  Each step's three products go into a fresh tensor-core accumulator, as in the TF32 kernel. A whole AuK
  decode lands at 122 dB against float64 on an H200 (max abs 1.1e-6), a layer at 0.05-0.2x cuDNN fp32's
  error. Layers the float16 kernel cannot take run as ``"tf32x3"`` does.

* ``"fp16"`` (opt-in; ``auto`` never picks it): the float16 kernel with one product instead of three,
  ``x_hi * w_hi``, the scaled operands rounded to float16's 11 significant bits and accumulated in the
  tensor cores. It reads half the operand bytes and does a third of the products of ``"fp16x3"``, and
  it is about as accurate as ``"tf32"`` (``docs/precision.md`` gives the measured dB). Layers the float16
  kernel cannot take run as ``"tf32x3"`` does.

The split happens only on CUDA float32 tensors; on the CPU every precision computes plain float32. Only
this package's conv layers know how to split (:func:`streamdec.codecs.layers.set_split_convs`): a codec
holding another convolution module cannot take ``"tf32x3"`` or ``"fp16x3"``.
"""

from __future__ import annotations

from typing import Literal, get_args

from streamdec.errors import ConfigError

__all__ = ["AUTO_PREFERENCE", "PRECISIONS", "Precision", "check_precision"]

Precision = Literal["fp32", "tf32x3", "fp16x3", "fp16", "tf32"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
# What Codec.use_auto_precision tries, in order: the first with every convolution on a Triton split kernel.
AUTO_PREFERENCE: tuple[Precision, ...] = ("fp16x3", "tf32x3")


def check_precision(value: object) -> Precision:
    """``value`` as a :data:`Precision`, or a :class:`ConfigError` naming the choices."""
    if value not in PRECISIONS:
        raise ConfigError(f"precision {value!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    return value
