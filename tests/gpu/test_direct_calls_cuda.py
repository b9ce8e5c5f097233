"""Eager CUDA calls skip the custom ops' dispatch (``streamdec.kernels.availability.direct_cuda_call``):
the functions layers call must give exactly what the ops give through the dispatcher, kept state included,
and go through the dispatcher wherever it is needed (fake tensors)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from streamdec.kernels import alias_free
from streamdec.kernels.availability import direct_cuda_call
from streamdec.kernels.conv import f16_conv_supported, split_conv1d_f16
from streamdec.kernels.split import pack_split_weight_f16
from support.cuda_checks import NEEDS_TMA

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(300),
    NEEDS_TMA,
]


def _activation_args(batch: int, channels: int, samples: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(batch, channels, samples, device="cuda", generator=g)
    filt = torch.randn(12, device="cuda", generator=g) * 0.2
    alpha = torch.rand(channels, device="cuda", generator=g) + 0.5
    beta = torch.rand(channels, device="cuda", generator=g) + 0.5
    return x, filt, alpha, beta


def test_only_plain_eager_cuda_tensors_go_direct() -> None:
    assert direct_cuda_call(torch.empty(2, device="cuda"))
    assert not direct_cuda_call(torch.empty(2))
    with FakeTensorMode():
        assert not direct_cuda_call(torch.empty(2, device="cuda"))


def test_activations_equal_the_ops_bit_for_bit() -> None:
    x, filt, alpha, beta = _activation_args(3, 16, 40)
    head = torch.randn(3, 16, 12, device="cuda")
    with torch.inference_mode():
        assert torch.equal(
            alias_free.activation(x, filt, alpha, beta),
            torch.ops.streamdec.alias_free_activation(x, filt, alpha, beta),
        )
        for a, b in zip(
            alias_free.activation_peak(x, filt, alpha, beta),
            torch.ops.streamdec.alias_free_activation_peak(x, filt, alpha, beta),
            strict=True,
        ):
            assert torch.equal(a, b)
        pools = [torch.zeros(5, 16, 9, device="cuda") for _ in range(4)]
        slots = torch.tensor([4, 0, 2], device="cuda")
        direct = alias_free.activation_window(head, x, filt, alpha, beta, 6, 30, pools[0], slots)
        op = torch.ops.streamdec.alias_free_activation_window(
            head, x, filt, alpha, beta, 6, 30, pools[1], slots
        )
        assert torch.equal(direct, op) and torch.equal(pools[0], pools[1])
        before = torch.randn(3, 16, 7, device="cuda")
        direct_pair = alias_free.activation_window_peak(
            head, x, filt, alpha, beta, 0, 52, before, pools[2], slots
        )
        op_pair = torch.ops.streamdec.alias_free_activation_window_peak(
            head, x, filt, alpha, beta, 0, 52, before, pools[3], slots
        )
        for a, b in zip(direct_pair, op_pair, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(pools[2], pools[3]) and pools[2].abs().sum() > 0


def test_split_convolution_equals_the_op_bit_for_bit() -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(4, 48, 37, device="cuda", generator=g)
    head = torch.randn(4, 48, 6, device="cuda", generator=g)
    w = torch.randn(64, 48, 7, device="cuda", generator=g) / 20
    bias = torch.randn(64, device="cuda", generator=g)
    residual = torch.randn(4, 64, 37, device="cuda", generator=g)
    packed, inverse = pack_split_weight_f16(w)
    assert f16_conv_supported(x)
    slots = torch.tensor([1, 3, 0, 2], device="cuda")
    with torch.inference_mode():
        direct = split_conv1d_f16(x, packed, inverse, bias, 1, (0, 0), residual, head=head)
        op = torch.ops.streamdec.conv1d_split_f16(
            x, packed[0], packed[1], inverse, bias, 1, 0, 0, residual, None, 1, head
        )
        assert torch.equal(direct, op)
        pools = [torch.zeros(4, 48, 6, device="cuda") for _ in range(2)]
        kept = split_conv1d_f16(
            x, packed, inverse, bias, 1, (0, 0), residual, head=head, keep=(pools[0], slots)
        )
        op_kept = torch.ops.streamdec.conv1d_split_f16_keep(
            pools[1], slots, x, packed[0], packed[1], inverse, bias, 1, 0, 0, residual, None, 1, head
        )
        assert torch.equal(kept, op_kept) and torch.equal(kept, direct)
        assert torch.equal(pools[0], pools[1]) and torch.equal(pools[0][slots], x[..., -6:])
