"""The stateful twin of each family, called directly: prime, steps and flush equal the whole-clip decode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import streamdec
from streamdec.codecs.layers import routing
from streamdec.codecs.stateful import Conv, ConvTranspose, Leaf, StatefulNet, supports_stateful
from streamdec.engine.scheduler import Scheduler
from streamdec.engine.slots import SlotAllocator, StatePool
from streamdec.errors import ConfigError, TooManyStreamsError
from streamdec.protocol import ErrorCode, error_code_for
from streamdec.session import StatefulSession, StepPolicy
from support.conv_cases import needs_interpreter
from support.split_routing import route_cpu_through_split

FAMILIES = ["tiny", "dac-tiny", "oobleck-tiny", "bigvgan-tiny", "vits-tiny"]
# bigvgan-tiny's reference activation is slow on a small CPU: the property gets room, not fewer cases
pytestmark = pytest.mark.timeout(900)
_NETS: dict[str, tuple[streamdec.Codec, StatefulNet]] = {}


def net_of(name: str) -> tuple[streamdec.Codec, StatefulNet]:
    if name not in _NETS:
        # float64: the property checks the streaming algebra, not float32 rounding
        codec = streamdec.load_codec(name, dtype=torch.float64)
        _NETS[name] = (codec, StatefulNet(codec))
    return _NETS[name]


@pytest.mark.parametrize("name", FAMILIES)
def test_right_frames_equal_the_exact_context(name: str) -> None:
    """The stateful lag is the codec's exact right context, and a prime needs one frame more."""
    codec, net = net_of(name)
    assert net.right_frames == codec.context_frames()[1]
    assert net.min_prime_frames == net.right_frames + 1
    assert supports_stateful(codec)


@settings(max_examples=8, deadline=None)
@given(
    name=st.sampled_from(FAMILIES),
    extra=st.integers(0, 6),
    steps=st.lists(st.integers(1, 9), max_size=3),
    tail=st.integers(0, 5),
    seed=st.integers(0, 5),
)
def test_prime_steps_flush_equal_whole_clip(
    name: str, extra: int, steps: list[int], tail: int, seed: int
) -> None:
    """For any prime length, step sizes and final chunk, the pieces concatenate to codec.decode (1e-5),
    batched over two rows at once."""
    codec, net = net_of(name)
    n0 = net.min_prime_frames + extra
    total = n0 + sum(steps) + tail
    z = torch.randn(2, total, codec.latent_dim, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        audio, state = net.prime(z[:, :n0])
        pieces, at = [audio], n0
        for n in steps:
            audio, state = net.step(z[:, at : at + n], state)
            pieces.append(audio)
            at += n
        pieces.append(net.flush(z[:, at:], state))
    out = torch.cat(pieces, dim=-1)
    torch.testing.assert_close(out, codec.decode(z), atol=1e-6, rtol=0)


def test_pool_rows_are_independent_and_padding_rows_touch_only_scratch() -> None:
    """Streams in one pool step independently; a batch's padding rows write only the scratch slot."""
    codec, net = net_of("tiny")
    pool = StatePool(net, 3, device=torch.device("cpu"), dtype=torch.float32)
    z = torch.randn(2, 30, codec.latent_dim)
    with torch.inference_mode():
        a0 = pool.prime(torch.tensor([2, 0]), z[:, :12])
        before = [t[1].clone() for t in pool.tensors]
        a1 = pool.step(torch.tensor([0, 3]), z[:1, 12:16].expand(2, -1, -1).contiguous())  # row 2: scratch
        a2 = pool.step(torch.tensor([2]), z[:1, 12:16])
        rest = pool.flush(torch.tensor([0, 2]), torch.stack([z[1, 16:], z[0, 16:]]))
    assert all(torch.equal(t[1], b) for t, b in zip(pool.tensors, before, strict=True))  # slot 1 untouched
    stream0 = torch.cat([a0[0], a2[0], rest[1]], dim=-1)
    stream1 = torch.cat([a0[1], a1[0], rest[0]], dim=-1)
    torch.testing.assert_close(stream0, codec.decode(z[:1])[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        stream1, codec.decode(torch.cat([z[1:, :12], z[:1, 12:16], z[1:, 16:]], 1))[0], atol=1e-5, rtol=0
    )


def test_slot_allocator_refuses_and_reuses() -> None:
    """Slots go lowest first; a full allocator raises TooManyStreamsError; a given-back slot is reused."""
    slots = SlotAllocator(2)
    assert [slots.take(), slots.take()] == [0, 1]
    with pytest.raises(TooManyStreamsError, match="all 2 stream slots"):
        slots.take()
    slots.give_back(0)
    assert slots.take() == 0
    with pytest.raises(ConfigError):
        slots.give_back(5)


def test_full_slots_map_to_the_too_many_streams_wire_code() -> None:
    """A stream refused for want of a slot reaches a client as too_many_streams, not internal."""
    assert error_code_for(TooManyStreamsError("all slots taken")) == ErrorCode.TOO_MANY_STREAMS


def test_step_policy_shapes_and_validation() -> None:
    """The default policy covers every remainder with its step sizes and refuses impossible ones."""
    policy = StepPolicy.default(right_frames=7, min_prime=8, min_step=4, max_step=16)
    assert policy.step_sizes == (1, 2, 4, 8, 16)
    assert policy.prime_sizes == (12, 16, 24)  # 7 + 4, 7 + 8, 7 + 16 rounded up to whole 4-frame chunks
    assert ("flush", 0) in policy.shapes() and ("prime", 12) in policy.shapes()
    with pytest.raises(ConfigError, match="must include 1"):
        StepPolicy((2, 4), (11,), 4, 7)
    with pytest.raises(ConfigError, match="must exceed right_frames"):
        StepPolicy((1, 4), (7,), 4, 7)


@pytest.mark.parametrize(
    ("chunks", "calls"),
    [
        pytest.param([5], [("whole", 5)], id="short"),
        pytest.param([11], [("whole", 11)], id="too-short-to-prime"),
        pytest.param([12], [("prime", 12), ("flush", 0)], id="prime-then-flush"),
        pytest.param([12, 4, 3], [("prime", 12), ("step", 4), ("step", 2), ("flush", 1)], id="remainder"),
        pytest.param([13, 4], [("prime", 12), ("step", 4), ("flush", 1)], id="flush-takes-the-rest"),
        pytest.param(
            [4] * 6,
            [("prime", 12), ("step", 4), ("step", 4), ("step", 4), ("flush", 0)],
            id="whole-chunks-stay-whole",
        ),
    ],
)
def test_session_plans_calls(chunks: list[int], calls: list[tuple[str, int]]) -> None:
    """A stateful session turns chunks into prime, step and flush calls that emit every frame once."""
    policy = StepPolicy.default(right_frames=7, min_prime=8, min_step=4, max_step=16)
    session = StatefulSession(policy, latent_dim=2, hop_size=1, pad_latent=torch.zeros(2))
    got, emitted = [], 0
    for n in chunks:
        session.feed(torch.zeros(n, 2))
        while (job := session.next_job()) is not None:
            got.append((job.kind, int(job.latents.shape[0])))
            assert job.emit_start == emitted
            emitted = job.emit_end
    session.end()
    while (job := session.next_job()) is not None:
        got.append((job.kind, int(job.latents.shape[0])))
        assert job.emit_start == emitted
        emitted = job.emit_end
    assert got == calls
    assert emitted == sum(chunks) and session.finished


def test_scheduler_holds_work_until_its_deadline_nears_or_its_bucket_fills() -> None:
    """hold(): wait while the earliest deadline is beyond the lead; pop once it nears or the bucket is full."""
    s: Scheduler[int] = Scheduler((1, 2, 4), kind_limits={"prime": 2})
    s.push(0, 4, deadline=10.0, kind="step")
    instant = lambda key: 0.0  # noqa: E731  # replays that take no time: only the lead counts
    assert s.hold(now=9.0, replay_s=instant, lead=0.5) == pytest.approx(0.5)
    assert s.hold(now=9.6, replay_s=instant, lead=0.5) is None
    for i in range(3):
        s.push(i + 1, 4, deadline=10.0, kind="step")
    assert s.hold(now=9.0, replay_s=instant, lead=0.5) is None  # four rows fill the largest bucket
    assert s.buckets_for("prime", 12) == (1, 2)


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops a block of code dispatches, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["tiny", "dac-tiny"])
def test_fused_pool_gives_the_per_layer_bits_with_repeated_scratch_slots(name: str) -> None:
    """A fused pool (one gather a call, residuals handed to the conv) gives the per-layer pool's audio and
    states bit for bit, for steps longer and shorter than the delay lines and with several padding rows
    on the scratch slot; it reads the pool once a call, where the per-layer pool reads it once a layer."""
    codec = streamdec.load_codec(name, dtype=torch.float32)
    net = StatefulNet(codec)
    pools = [
        StatePool(net, 4, device=torch.device("cpu"), dtype=torch.float32, fused=f) for f in (True, False)
    ]
    gen = torch.Generator().manual_seed(2)
    index = torch.tensor([4, 2, 4, 0, 4])  # 4: the scratch slot, three times
    live = index != 4
    calls = [
        ("prime", torch.arange(4), torch.randn(4, net.min_prime_frames + 1, codec.latent_dim, generator=gen))
    ]
    calls += [("step", index, torch.randn(5, n, codec.latent_dim, generator=gen)) for n in (4, 1, 7)]
    calls.append(("flush", index, torch.randn(5, 2, codec.latent_dim, generator=gen)))
    with torch.inference_mode():
        for kind, slots, z in calls:
            counters = [_OpCounter(), _OpCounter()]
            outs = []
            for pool, counter in zip(pools, counters, strict=True):
                with counter:
                    outs.append(pool.fn(kind)(slots, z))
            rows = slice(None) if kind == "prime" else live
            assert torch.equal(outs[0][rows], outs[1][rows]), kind
            assert torch.equal(pools[0].flat[:4], pools[1].flat[:4]), kind
            if kind != "prime":
                assert counters[0].counts["index_select"] == 1
                # the per-layer pool reads each layer's state, and again for a delay line sharing it
                assert counters[1].counts["index_select"] == len(net.leaves) + len(net.shared)
    assert pools[0].nbytes == net.state_bytes() * 5


def test_fused_step_after_a_prime_equals_the_direct_net() -> None:
    """The pool's fused step after its prime equals StatefulNet.step on the prime's state (no pool)."""
    codec32 = streamdec.load_codec("tiny", dtype=torch.float32)
    net = StatefulNet(codec32)
    pool = StatePool(net, 2, device=torch.device("cpu"), dtype=torch.float32)
    z = torch.randn(
        2, net.min_prime_frames + 4, codec32.latent_dim, generator=torch.Generator().manual_seed(8)
    )
    n0 = net.min_prime_frames
    with torch.inference_mode():
        pool.prime(torch.tensor([1, 0]), z[:, :n0])
        stepped = pool.step(torch.tensor([1, 0]), z[:, n0:])
        _, state = net.prime(z[:, :n0])
        direct, new_state = net.step(z[:, n0:], state)
    assert torch.equal(stepped, direct)
    for pool_view, s in zip(pool.tensors, new_state, strict=True):
        assert torch.equal(pool_view[[1, 0]], s)  # batch row 0 is slot 1


@settings(max_examples=20, deadline=None)
@given(stride=st.integers(1, 5), taps=st.integers(1, 4), frames=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_transposed_conv_steps_on_its_phases_without_a_buffer(
    stride: int, taps: int, frames: int, seed: int
) -> None:
    """On the phase-convolution path a stateful transposed convolution computes only its new inputs'
    outputs, reading its kept inputs in place: the outputs of the whole buffer's convolution past the
    kept part, and the same kept state."""
    from streamdec.codecs.layers import CausalConvTranspose1d

    gen = torch.Generator().manual_seed(seed)
    conv = CausalConvTranspose1d(6, 5, taps * stride, stride)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
    head, x = torch.randn(3, 6, taps - 1, generator=gen), torch.randn(3, 6, frames, generator=gen)
    pool, slots = torch.zeros(4, 6, taps - 1), torch.tensor([2, 0, 3])
    with pytest.MonkeyPatch.context() as patch, torch.inference_mode():
        route_cpu_through_split(patch, f16=True)
        conv.set_split(True, f16=True)
        direct = conv.step_outputs(head, x, (pool, slots) if taps > 1 else None)
        whole = conv(torch.cat([head, x], -1))[..., (taps - 1) * stride :]
    assert direct is not None
    torch.testing.assert_close(direct, whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(pool[slots], torch.cat([head, x], -1)[..., frames:])
    assert conv.step_outputs(torch.randn(3, 6, taps), x) is None  # not the kept inputs' length


def _route_through_interpreted_kernels(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], Counter[str]]:
    """CPU float32 calls take the fp16x3 and fused-activation paths a CUDA input takes while the returned
    switch is on, each op calling its own CUDA implementation, whose Triton kernels run under the
    interpreter (the float16 weight caches are built either way); the counter counts those calls, the
    states they keep and the residuals they read in two parts."""
    from streamdec.kernels import alias_free as af
    from streamdec.kernels import conv as conv_ops

    on = [False]

    def cuda_path(x: Tensor) -> bool:
        return on[0] and x.dtype == torch.float32

    route_cpu_through_split(monkeypatch, f16=True)
    for module, name in (
        (routing, "takes_split"),
        (routing, "fused_supported"),
        (conv_ops, "direct_cuda_call"),
        (af, "direct_cuda_call"),
    ):
        monkeypatch.setattr(module, name, cuda_path)
    calls: Counter[str] = Counter()

    def counted(module: Any, impl: str, name: str, keeps: Callable[..., bool]) -> None:
        run = getattr(module, impl)

        def call(*args: Any) -> Any:
            calls[name] += 1
            calls["state kept by the kernel"] += keeps(*args)
            return run(*args)

        monkeypatch.setattr(module, impl, call)

    def conv_keeps(a: Any, keep: Any) -> bool:
        calls["residual in two parts"] += a.residual_head is not None
        return keep is not None

    counted(conv_ops, "_f16_on_cuda", "conv1d_split_f16", conv_keeps)
    counted(af, "_window_cuda", "alias_free_activation_window", lambda *a: a[7] is not None)
    counted(af, "_window_peak_cuda", "alias_free_activation_window_peak", lambda *a: a[8] is not None)
    return on, calls


def _fused_and_per_layer_pools(slots: int) -> tuple[streamdec.Codec, StatefulNet, list[StatePool]]:
    """The tiny codec in fp16x3 and two CPU pools of ``slots`` slots on it: fused, then per-layer."""
    codec = streamdec.load_codec("tiny")
    codec.precision = "fp16x3"
    net = StatefulNet(codec)
    cpu = torch.device("cpu")
    return (
        codec,
        net,
        [StatePool(net, slots, device=cpu, dtype=torch.float32, fused=f) for f in (True, False)],
    )


@needs_interpreter
@pytest.mark.timeout(1800)  # about ten minutes of interpreted kernels on two shared cores
def test_fused_step_on_the_interpreted_kernels_gives_the_per_layer_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tiny-codec fp16x3 step on the kernels a GPU runs (interpreted), after a prime on the CPU path:
    the fused step (residuals in the conv epilogue, read in two parts where a delay line gives them, row
    peaks from the window op, heads read in place from the gathered copy, new states written by the splits
    and the activations) gives the per-layer step's audio and new states bit for bit."""
    on, calls = _route_through_interpreted_kernels(monkeypatch)
    codec, net, pools = _fused_and_per_layer_pools(2)
    gen = torch.Generator().manual_seed(6)
    prime = torch.randn(2, net.min_prime_frames, codec.latent_dim, generator=gen)
    index = torch.tensor([1, 2, 0])  # 2: the scratch slot
    z = torch.randn(3, 2, codec.latent_dim, generator=gen)
    with torch.inference_mode():
        for pool in pools:
            pool.prime(torch.tensor([0, 1]), prime)
        on[0] = True
        outs, handed, in_parts, kept = [], [], [], []
        for pool in pools:
            calls.clear()
            outs.append(pool.step(index, z))
            handed.append(calls["alias_free_activation_window_peak"])
            in_parts.append(calls["residual in two parts"])
            kept.append(calls["state kept by the kernel"])
    assert torch.equal(outs[0][[0, 2]], outs[1][[0, 2]])
    assert torch.equal(pools[0].flat[:2], pools[1].flat[:2])
    assert handed[0] > 0 and handed[1] == 0  # only the fused step hands peaks over
    assert in_parts[0] > 0 and in_parts[1] == 0  # and reads delay lines' outputs in two parts
    # its convolutions' splits and its activations write their layers' new states themselves
    assert (
        kept[0] == sum(isinstance(leaf, Conv | ConvTranspose | Leaf) for leaf in net.leaves) and kept[1] == 0
    )


@needs_interpreter
@pytest.mark.timeout(1800)
def test_fused_prime_and_flush_on_the_interpreted_kernels_give_the_per_layer_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tiny-codec fp16x3 prime and flush on the kernels a GPU runs (interpreted): the fused calls (row
    peaks from the window op, residuals in the conv epilogue, a prime's new states written by the splits
    and the activations where the input covers them) give the per-layer calls' audio and states bit for
    bit."""
    on, calls = _route_through_interpreted_kernels(monkeypatch)
    codec, net, pools = _fused_and_per_layer_pools(3)
    gen = torch.Generator().manual_seed(8)
    prime = torch.randn(2, net.min_prime_frames + 1, codec.latent_dim, generator=gen)
    tail = torch.randn(2, 3, codec.latent_dim, generator=gen)
    slots = torch.tensor([2, 0])
    on[0] = True
    with torch.inference_mode():
        for kind, z in (("prime", prime), ("flush", tail)):
            runs = []
            for pool in pools:
                calls.clear()
                runs.append((pool.fn(kind)(slots, z), Counter(calls)))
            (fused, fused_calls), (apart, apart_calls) = runs
            assert torch.equal(fused, apart), kind
            assert torch.equal(pools[0].flat[[0, 2]], pools[1].flat[[0, 2]]), kind
            # only the fused call hands peaks over and adds residuals in the conv epilogue; a fused prime
            # also has its kernels write the states they read
            names = ["alias_free_activation_window_peak", "residual in two parts"]
            for name in names + (["state kept by the kernel"] if kind == "prime" else []):
                assert fused_calls[name] > 0 and apart_calls[name] == 0, (kind, name)
    assert not pools[0].flat[1].any()  # a slot no call named keeps its zeros


def test_live_rows_takes_one_int64_count_and_restores_the_outer_one() -> None:
    """The count kernels read is one int64; a nested context hands back the outer count when it ends,
    and a bad count is a typed error that leaves the context unchanged."""
    from streamdec.errors import DTypeError, ShapeError
    from streamdec.kernels.rows import live_count, live_rows

    outer, inner = torch.tensor([3]), torch.tensor([1])
    assert live_count() is None
    with live_rows(outer):
        with live_rows(inner):
            assert live_count() is inner
        assert live_count() is outer
        with pytest.raises(ShapeError, match="one-element"), live_rows(torch.tensor([1, 2])):
            pass
        with pytest.raises(DTypeError, match="int64"), live_rows(torch.tensor([True])):
            pass
        assert live_count() is outer
    assert live_count() is None
