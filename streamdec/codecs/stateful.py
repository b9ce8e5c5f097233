"""Stateful streaming: each layer keeps the inputs its next outputs need, so every latent frame is decoded once.

A decoder is described as a small tree of streaming nodes (:func:`layout_of`): leaves wrap this package's
layers, composites are sequences, residual sums and means of parallel branches. Every node runs in three
modes, all with static shapes so that one captured graph serves any batch of streams:

* ``prime(x)``  - the first ``m`` input samples of a stream, with the layer's own left padding (zeros,
  replicate: whatever the whole-clip decode does at a clip's start). It returns the outputs whose right
  reach has arrived and the layer's state.
* ``step(x)``   - ``n`` more input samples: ``layer(cat(state, x))`` cropped to the outputs that read only
  real samples. Output count per step is constant (``n * up``); the output trails the input by the node's
  ``lag`` samples.
* ``flush(x)``  - the last ``n`` samples of a stream: the layer's own right padding at the true end, so the
  final ``lag`` outputs equal the whole-clip decode's.

A leaf whose output ``t`` reads inputs ``t - a .. t + b`` keeps the last ``a + b`` inputs::

        state (a + b)         new input (n)
    |<--- a --->|<- b ->|<-------- n -------->|
                |<--------- n outputs -------->|  (trailing the input by b: the lag)

Composites align their branches with delay lines (a residual's identity path waits for the branch's lag),
and the whole network gets a final delay that rounds its lag up to whole frames, so a step of ``n`` latent
frames yields exactly ``n`` frames of audio ``right_frames`` frames behind.

Exactness needs every state sample to be a real sample of the stream (or a zero where the layer pads with
zeros): a layer with internal replicate padding (the alias-free activation) must see at least ``a + b``
real inputs in the prime. :attr:`StatefulNet.min_prime_frames` is the smallest prime that guarantees it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamdec.codecs.layers import (
    AliasFreeActivation,
    CausalConvTranspose1d,
    GeoSequential,
    PaddedConv1d,
    PaddedConvTranspose1d,
    Pointwise,
    SnakeBeta,
)
from streamdec.errors import CodecError
from streamdec.kernels.conv import joined_residual

if TYPE_CHECKING:
    from streamdec.codecs.base import Codec

__all__ = [
    "Delay",
    "Leaf",
    "Mean",
    "Node",
    "Residual",
    "Seq",
    "StateIO",
    "StateSpec",
    "StatefulNet",
    "Windowed",
    "layout_of",
    "supports_stateful",
]


#: an optional tensor a call hands a layer: row peaks, or one part of a residual
_Opt = Tensor | None


@dataclass(frozen=True)
class StateSpec:
    """One state tensor of one stream: ``[channels, length]`` samples."""

    channels: int
    length: int


class StateIO(Protocol):
    """Where a call reads each leaf's state (``get``) and writes its new state (``put``), by leaf index.

    Every leaf reads its state, computes, then writes the new one; ``get`` returns a tensor that no
    ``put`` of the same call changes (a copy, or a state nobody writes again), so a store may write a new
    state the moment it is put. ``fuse`` lets a call hand work across layers where the kernels allow it
    (a residual added in a convolution's epilogue, an activation's row peaks handed to the convolution
    after it): the same values, bit for bit, in fewer passes.
    """

    fuse: bool

    def get(self, index: int) -> Tensor: ...

    def put(self, index: int, value: Tensor) -> None: ...

    def target(self, index: int) -> tuple[Tensor, Tensor] | None:
        """Where a kernel may write leaf ``index``'s new state itself, instead of handing it to ``put``:
        ``(pool, slots)``, the leaf's states ``[S, channels, state_len]`` and the pool row of each batch
        row; None where the new states are collected."""
        ...


class _States:
    """A :class:`StateIO` over a list of tensors: the new states are collected for the caller."""

    fuse = True

    def __init__(self, tensors: Sequence[Tensor] | None, count: int) -> None:
        self.inputs = tensors
        self.outputs: list[Tensor | None] = [None] * count

    def get(self, index: int) -> Tensor:
        assert self.inputs is not None, "a prime reads no state"
        return self.inputs[index]

    def put(self, index: int, value: Tensor) -> None:
        self.outputs[index] = value

    def target(self, index: int) -> tuple[Tensor, Tensor] | None:
        return None


class Node(abc.ABC):
    """A streaming node: static-shape prime, step and flush (module docstring)."""

    #: output samples per input sample
    up: int = 1

    @abc.abstractmethod
    def lag(self) -> int:
        """Output samples by which a step's output trails its input (in the output's sample domain)."""

    @abc.abstractmethod
    def prime_len(self, m: int) -> int:
        """Output samples of a prime on ``m`` input samples; raises :class:`_TooShort` if ``m`` is too few."""

    @abc.abstractmethod
    def leaves(self) -> list[Stateful]:
        """The stateful leaves below this node, in state order."""

    @abc.abstractmethod
    def prime(self, x: Tensor, states: StateIO) -> Tensor: ...

    @abc.abstractmethod
    def step(self, x: Tensor, states: StateIO) -> Tensor: ...

    @abc.abstractmethod
    def flush(self, x: Tensor, states: StateIO) -> Tensor: ...


class _TooShort(Exception):
    """A prime that gives some layer fewer real samples than its state needs."""


class Stateless(Node):
    """A pointwise layer (Snake, tanh, clamp): no state, no lag."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        self.fn = fn

    def lag(self) -> int:
        return 0

    def prime_len(self, m: int) -> int:
        return m

    def leaves(self) -> list[Stateful]:
        return []

    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        return self.fn(x)

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        return self.fn(x)

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        return self.fn(x)


class Stateful(Node):
    """A node that keeps ``state_len`` input samples of ``channels`` channels; ``index`` is set by the net."""

    index: int = -1
    channels: int
    state_len: int

    def leaves(self) -> list[Stateful]:
        return [self] if self.state_len > 0 else []

    def _keep(self, buffer: Tensor, states: StateIO) -> None:
        if self.state_len > 0:
            states.put(self.index, buffer[..., buffer.shape[-1] - self.state_len :])

    def _keep_after(self, head: Tensor, x: Tensor, states: StateIO) -> None:
        """Keep the last ``state_len`` samples of ``cat(head, x)`` without building it: a view of ``x`` when
        the step is at least as long as the state, else the state's newer part and ``x``."""
        n = x.shape[-1]
        if self.state_len == 0:
            return
        if n >= self.state_len:
            states.put(self.index, x[..., n - self.state_len :])
        else:
            states.put(self.index, torch.cat([head[..., n:], x], dim=-1))

    def _buffer(self, x: Tensor, states: StateIO) -> Tensor:
        if self.state_len == 0:
            return x
        # Two copies into one buffer: measured a little faster than torch.cat along time on an H200
        # (scripts/profile_stateful.py).
        buffer = x.new_empty(x.shape[0], x.shape[1], self.state_len + x.shape[-1])
        buffer[..., : self.state_len] = states.get(self.index)
        buffer[..., self.state_len :] = x
        return buffer

    def _prime_state(self, x: Tensor, states: StateIO, pad: str) -> None:
        """The state after a prime on ``x``: its last inputs, left-padded as the layer pads if too few."""
        short = self.state_len - x.shape[-1]
        if short > 0:
            if pad != "zeros":
                raise _TooShort
            x = F.pad(x, (short, 0))
        self._keep(x, states)


class Windowed(Protocol):
    """A layer that gives any window of its output on ``cat(head, x)`` (:meth:`AliasFreeActivation.window`)."""

    def __call__(self, x: Tensor) -> Tensor: ...

    def window(
        self, head: Tensor, x: Tensor, start: int, length: int, keep: tuple[Tensor, Tensor] | None = None
    ) -> Tensor: ...

    def window_with_peak(
        self,
        head: Tensor,
        x: Tensor,
        start: int,
        length: int,
        before: Tensor | None,
        keep: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]: ...


class Leaf(Stateful):
    """A layer whose output ``t`` reads inputs ``t-a .. t+b``, run on ``cat(state, x)``, keeping only the
    outputs that read real samples.

    Fits any layer with internal edge padding (the alias-free activation pads by replication inside): a
    step asks the layer for the outputs ``a ..`` of its history and new samples (the fused activation
    reads the two in place and computes nothing else), and a prime shorter than ``a + b`` is refused.
    """

    def __init__(self, layer: Windowed, channels: int, reach: tuple[int, int]) -> None:
        self.layer = layer
        self.channels = channels
        self.a, self.b = reach
        self.state_len = self.a + self.b

    def lag(self) -> int:
        return self.b

    def prime_len(self, m: int) -> int:
        if m < self.state_len:
            raise _TooShort
        return m - self.b

    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        return self.prime_before(x, states, None)[0]

    def prime_before(self, x: Tensor, states: StateIO, conv: Conv | None) -> tuple[Tensor, Tensor | None]:
        """:meth:`prime`, and the row peaks of its output where ``conv`` (the convolution after it, whose
        prime pads with zeros only) runs the float16 split, which then takes no pass of its own for them;
        None elsewhere."""
        # The window from the stream's first sample is the layer's own output there (its replicate padding
        # included), and only the outputs whose reach has arrived are computed: no cropped copy for the
        # next layer to make contiguous. The fused activation writes the new state as it reads it.
        if x.shape[-1] < self.state_len:
            raise _TooShort
        target = self._target(states)
        out, peak = self._window(x[..., :0], x, 0, x.shape[-1] - self.b, conv, None, target)
        if target is None:
            self._keep(x, states)
        return out, peak

    def _history(self, x: Tensor, states: StateIO) -> Tensor:
        return states.get(self.index) if self.state_len else x[..., :0]

    def _target(self, states: StateIO) -> tuple[Tensor, Tensor] | None:
        """Where the activation writes its new state itself (it reads the same samples)."""
        return states.target(self.index) if self.state_len else None

    def _window(
        self,
        head: Tensor,
        x: Tensor,
        start: int,
        length: int,
        conv: Conv | None,
        before: Tensor | None,
        target: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The layer's outputs ``start .. start + length - 1`` of ``cat(head, x)``, and where ``conv`` (the
        convolution after it) runs the float16 split, the row peaks of ``cat(before, outputs)`` that split
        needs (``before``: ``conv``'s kept history, None for none); None elsewhere."""
        if conv is not None and conv.conv.takes_peak(x):
            return self.layer.window_with_peak(head, x, start, length, before, target)
        return self.layer.window(head, x, start, length, target), None

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        return self.step_before(x, states, None)[0]

    def step_before(self, x: Tensor, states: StateIO, conv: Conv | None) -> tuple[Tensor, Tensor | None]:
        """:meth:`step`, and the row peaks that ``conv``'s float16 split of its history and this output
        needs, where the fused activation takes them as it writes (None elsewhere: the split takes its
        own). Packed short rows too: the activation's kernel raises a peak once a program, all of whose rows
        lie in one batch row (an earlier kernel raised one a lane there, and that contention made a 256 x 4
        step of auk-24k take 79 ms instead of 43 on an H200)."""
        head, target = self._history(x, states), self._target(states)
        out, peak = self._window(head, x, self.a, x.shape[-1], conv, _conv_history(conv, states), target)
        if target is None:
            self._keep_after(head, x, states)
        return out, peak

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        return self.flush_before(x, states, None)[0]

    def flush_before(self, x: Tensor, states: StateIO, conv: Conv | None) -> tuple[Tensor, Tensor | None]:
        """:meth:`flush` (the outputs through the stream's true end, the layer's own padding there), and
        the row peaks ``conv``'s float16 split of its history and this output needs, as
        :meth:`step_before` hands them over (None elsewhere)."""
        head, length = self._history(x, states), self.b + x.shape[-1]
        return self._window(head, x, self.a, length, conv, _conv_history(conv, states))


def _conv_history(conv: Conv | None, states: StateIO) -> Tensor | None:
    """The kept history of ``conv`` (the convolution after an activation), read before its new input."""
    return states.get(conv.index) if conv is not None and conv.state_len else None


class Conv(Stateful):
    """A zero-padded :class:`PaddedConv1d`: steps convolve ``cat(state, x)`` without padding."""

    def __init__(self, conv: PaddedConv1d) -> None:
        self.conv = conv
        self.channels = conv.in_channels
        self.state_len = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.right = self.state_len - conv.pad_left  # right reach: the lag
        if self.right < 0 or conv.stride[0] != 1:
            raise CodecError(f"{conv} reads no future sample or has a stride: no streaming form")

    def lag(self) -> int:
        return self.right

    def prime_len(self, m: int) -> int:
        if m < self.right:
            raise _TooShort
        return m - self.right

    def prime(
        self, x: Tensor, states: StateIO, peak: _Opt = None, residual: _Opt = None, residual_head: _Opt = None
    ) -> Tensor:
        """The outputs whose right reach has arrived, computed alone (the zeros on the right that the
        layer's own padding would add are never read by them), plus ``residual`` and ``peak`` as
        :meth:`step` takes them. The float16 split writes the new state as it reads ``x`` where ``x``
        covers it; a shorter prime keeps its zero-padded state apart."""
        target = states.target(self.index) if 0 < self.state_len <= x.shape[-1] else None
        pads = (self.conv.pad_left, 0)
        out = self.conv.convolve(x, pads, None, residual, peak, residual_head, keep=target)
        if target is None:
            self._prime_state(x, states, pad="zeros")
        return out

    # Steps hand the kept history to the convolution as a separate head: the float16 kernel's input split
    # reads history and new samples in place, so no concatenated buffer is written and read back.
    def step(
        self, x: Tensor, states: StateIO, peak: _Opt = None, residual: _Opt = None, residual_head: _Opt = None
    ) -> Tensor:
        """``conv(cat(state, x))``, plus ``cat(residual_head, residual)`` (a residual unit's delayed
        identity, added in the float16 kernel's epilogue, which reads the delay line's history and new
        samples where they lie); ``peak``: the row peaks of ``cat(state, x)``, if the activation before
        handed them over (:meth:`Leaf.step_before`)."""
        if self.state_len == 0:
            return self.conv.convolve(x, (0, 0), None, residual, peak, residual_head)
        head = states.get(self.index)
        target = states.target(self.index)
        out = self.conv.convolve(x, (0, 0), head, residual, peak, residual_head, keep=target)
        if target is None:
            self._keep_after(head, x, states)
        return out

    def flush(
        self, x: Tensor, states: StateIO, peak: _Opt = None, residual: _Opt = None, residual_head: _Opt = None
    ) -> Tensor:
        """``conv(cat(state, x))`` with the layer's own right padding at the stream's true end, plus
        ``residual`` and ``peak`` as :meth:`step` takes them."""
        head = states.get(self.index) if self.state_len else None
        return self.conv.convolve(x, (0, self.conv.pad_right), head, residual, peak, residual_head)


class ConvTranspose(Stateful):
    """A transposed convolution (stride ``s``, kernel ``k``, ``crop`` leading outputs cropped).

    A new input ``i`` touches outputs ``i*s .. i*s + k - 1`` (before the crop), so the outputs of the new
    inputs are complete once the previous ``floor((k-1)/s)`` inputs are kept; the crop is the lag.
    """

    def __init__(self, conv: CausalConvTranspose1d | PaddedConvTranspose1d) -> None:
        self.conv = conv
        self.channels = conv.in_channels
        kernel, self.stride = conv.kernel_size[0], conv.stride[0]
        self.up = self.stride
        self.state_len = (kernel - 1) // self.stride
        self.crop = int(conv.padding[0]) if isinstance(conv, PaddedConvTranspose1d) else 0
        if self.state_len * self.stride < self.crop:
            raise CodecError(f"{conv} crops more than its kept inputs produce: no streaming form")

    def lag(self) -> int:
        return self.crop

    def prime_len(self, m: int) -> int:
        return m * self.stride - self.crop

    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        self._prime_state(x, states, pad="zeros")
        out: Tensor = self.conv(x)
        return out[..., : x.shape[-1] * self.stride - self.crop]

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        if self.state_len and not self.crop and isinstance(self.conv, CausalConvTranspose1d):
            head, target = states.get(self.index), states.target(self.index)
            direct = self.conv.step_outputs(head, x, target)  # the new inputs' outputs, nothing cropped
            if direct is not None:
                if target is None:
                    self._keep_after(head, x, states)
                return direct
            buffer = torch.cat([head, x], dim=-1)
        else:
            buffer = self._buffer(x, states)
        self._keep(buffer, states)
        start = self.state_len * self.stride - self.crop
        out: Tensor = self.conv(buffer)
        return out[..., start : start + x.shape[-1] * self.stride]

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        out: Tensor = self.conv(self._buffer(x, states))
        return out[..., self.state_len * self.stride - self.crop :]


class Delay(Stateful):
    """A delay line of ``length`` samples: aligns a branch with a slower one.

    A delay line may *share* its state with a ``source``: a stateful layer that reads the same input and
    keeps at least as many of its last samples (a residual unit's identity and the first layer of its
    branch). Its state is then the source's newest ``length`` samples, so it keeps none of its own and
    writes nothing (:meth:`share`). It must read them before the source writes its new state, which
    :meth:`Residual.step` sees to."""

    def __init__(self, channels: int, length: int) -> None:
        self.channels = channels
        self.length = length
        self.state_len = length
        self.source: Stateful | None = None

    def share(self, source: Stateful) -> None:
        """Read ``source``'s newest ``length`` kept samples instead of keeping them too."""
        if source.state_len < self.length or source.channels != self.channels:
            raise CodecError(
                f"a delay line of {self.length} samples cannot share a state of {source.state_len}"
            )
        self.source = source
        self.state_len = 0

    def lag(self) -> int:
        return self.length

    def prime_len(self, m: int) -> int:
        if m < self.length:
            raise _TooShort
        return m - self.length

    def _head(self, states: StateIO) -> Tensor:
        if self.source is None:
            return states.get(self.index)
        kept = states.get(self.source.index)
        return kept[..., kept.shape[-1] - self.length :]

    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        self._keep(x, states)
        return x[..., : x.shape[-1] - self.length]

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        head, tail = self.step_parts(x, states)
        if head is None:
            assert tail is not None  # one part at least
            return tail
        return head if tail is None else torch.cat([head, tail], -1)

    def parts(self, call: str, x: Tensor, states: StateIO) -> tuple[Tensor | None, Tensor | None]:
        """The output of ``call`` (prime, step or flush) in two parts, oldest first, neither copied: a
        convolution's epilogue reads each where it lies. A prime's output is one view of ``x``, given as
        the first part (read in place as it lies, not copied contiguous first)."""
        if call == "prime":
            return self.prime(x, states), None
        if call == "flush":
            return (None, x) if self.length == 0 else (self._head(states), x)
        return self.step_parts(x, states)

    def step_parts(self, x: Tensor, states: StateIO) -> tuple[Tensor | None, Tensor | None]:
        """:meth:`step`'s output in two parts, oldest first, neither copied: the kept history's part (a view
        of the state; None without a state) and the new samples' part (a view of ``x``; None when the
        history covers the step). A convolution's epilogue adds them where they lie."""
        if self.length == 0:
            return None, x
        head, n = self._head(states), x.shape[-1]
        self._keep_after(head, x, states)
        if n <= self.length:
            return head[..., :n], None
        return head, x[..., : n - self.length]

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        if self.length == 0:
            return x
        return torch.cat([self._head(states), x], dim=-1)


class Seq(Node):
    """Nodes applied in order."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.up = 1
        for node in self.nodes:
            self.up *= node.up

    def lag(self) -> int:
        lag = 0
        for node in self.nodes:
            lag = lag * node.up + node.lag()
        return lag

    def prime_len(self, m: int) -> int:
        for node in self.nodes:
            m = node.prime_len(m)
        return m

    def leaves(self) -> list[Stateful]:
        return [leaf for node in self.nodes for leaf in node.leaves()]

    # A call's nodes in order, plus ``cat(residual_head, residual)`` at the end: in the last node's epilogue
    # if it is a convolution. Where ``states.fuse``, an activation hands its row peaks to the convolution
    # after it (``<call>_before``). The three calls take the same path through the nodes.
    def _run(
        self,
        call: str,
        x: Tensor,
        states: StateIO,
        residual: Tensor | None,
        residual_head: Tensor | None,
    ) -> Tensor:
        peak, last = None, len(self.nodes) - 1
        ends_in_conv = _ends_in_conv(self)
        if residual_head is not None and not ends_in_conv:
            residual, residual_head = joined_residual(residual_head, residual), None
        for i, node in enumerate(self.nodes):
            after = self.nodes[i + 1] if i < last else None
            if isinstance(node, Conv):
                tail = (residual, residual_head) if i == last else (None, None)
                x = getattr(node, call)(x, states, peak, *tail)
            elif states.fuse and isinstance(node, Leaf) and isinstance(after, Conv):
                x, peak = getattr(node, f"{call}_before")(x, states, after)
                continue
            else:
                x = getattr(node, call)(x, states)
            peak = None
        if residual is not None and not ends_in_conv:
            x = residual + x
        return x

    def prime(self, x: Tensor, states: StateIO, residual: _Opt = None, residual_head: _Opt = None) -> Tensor:
        return self._run("prime", x, states, residual, residual_head)

    def step(self, x: Tensor, states: StateIO, residual: _Opt = None, residual_head: _Opt = None) -> Tensor:
        return self._run("step", x, states, residual, residual_head)

    def flush(self, x: Tensor, states: StateIO, residual: _Opt = None, residual_head: _Opt = None) -> Tensor:
        return self._run("flush", x, states, residual, residual_head)


class _Parallel(Node):
    """Rate-preserving branches over one input, each delayed to the slowest branch's lag."""

    def __init__(self, branches: Sequence[Node], channels: int) -> None:
        if any(b.up != 1 for b in branches):
            raise CodecError("parallel branches must keep the sample rate")
        slowest = max(b.lag() for b in branches)
        self.branches = [
            Seq([b, Delay(channels, slowest - b.lag())]) if b.lag() < slowest else b for b in branches
        ]

    def lag(self) -> int:
        return self.branches[0].lag()

    def prime_len(self, m: int) -> int:
        lengths = {b.prime_len(m) for b in self.branches}
        assert len(lengths) == 1, "aligned branches give equal prime lengths"
        return lengths.pop()

    def leaves(self) -> list[Stateful]:
        return [leaf for b in self.branches for leaf in b.leaves()]

    @abc.abstractmethod
    def combine(self, outs: list[Tensor]) -> Tensor: ...

    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        return self.combine([b.prime(x, states) for b in self.branches])

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        return self.combine([b.step(x, states) for b in self.branches])

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        return self.combine([b.flush(x, states) for b in self.branches])


class Residual(_Parallel):
    """``branch(x) + x``, the identity path delayed by the branch's lag (the order families add in)."""

    def __init__(self, branch: Node, channels: int, *, identity_first: bool = False) -> None:
        super().__init__([branch, Seq([])], channels)
        self.identity_first = identity_first
        # The identity's delay line keeps the unit's last inputs; so does the branch's first layer, if it
        # is stateful and reads them as they come: one state serves both (a step writes it once).
        delay, source = _identity_delay(self.branches[1]), _first_stateful(self.branches[0])
        if delay is not None and source is not None and source.state_len >= delay.length:
            delay.share(source)

    def combine(self, outs: list[Tensor]) -> Tensor:
        branch, identity = outs
        return identity + branch if self.identity_first else branch + identity

    # Where ``states.fuse`` and the branch ends in a convolution, the identity is added in that
    # convolution's epilogue: one float32 add of the same two values (``a + b`` and ``b + a`` round alike,
    # so either family order gives the same bits), and no separate pass over the output. The identity's
    # delay line hands its output over in two parts, read where they lie (:meth:`Delay.parts`).
    def prime(self, x: Tensor, states: StateIO) -> Tensor:
        fused = self._fused("prime", x, states)
        return super().prime(x, states) if fused is None else fused

    def step(self, x: Tensor, states: StateIO) -> Tensor:
        fused = self._fused("step", x, states)
        if fused is not None:
            return fused
        # The identity first: its delay line may read the state the branch's first layer then replaces.
        branch, identity = self.branches
        delayed = identity.step(x, states)
        return self.combine([branch.step(x, states), delayed])

    def flush(self, x: Tensor, states: StateIO) -> Tensor:
        fused = self._fused("flush", x, states)
        return super().flush(x, states) if fused is None else fused

    def _fused(self, call: str, x: Tensor, states: StateIO) -> Tensor | None:
        branch, identity = self.branches
        if not (states.fuse and _ends_in_conv(branch)):
            return None
        assert isinstance(branch, Seq)
        kept, new = _identity_parts(call, identity, x, states)  # first: it may read what the branch replaces
        out: Tensor = getattr(branch, call)(x, states, residual=new, residual_head=kept)
        return out


def _ends_in_conv(node: Node) -> bool:
    """Whether ``node`` is a sequence whose last node is a convolution (which can add a residual)."""
    return isinstance(node, Seq) and bool(node.nodes) and isinstance(node.nodes[-1], Conv)


def _identity_delay(identity: Node) -> Delay | None:
    """The delay line an identity path ends in, if nothing before it changes the input."""
    if not (isinstance(identity, Seq) and identity.nodes and isinstance(identity.nodes[-1], Delay)):
        return None
    before = identity.nodes[:-1]
    return identity.nodes[-1] if all(isinstance(n, Seq) and not n.nodes for n in before) else None


def _first_stateful(node: Node) -> Stateful | None:
    """The layer that first reads ``node``'s input, if it keeps state of that input as it comes (its
    kept samples are then the input's newest ones, as a delay line's are)."""
    while isinstance(node, Seq) and node.nodes:
        node = node.nodes[0]
    if isinstance(node, Leaf | Conv | ConvTranspose) and node.state_len > 0:
        return node
    return None


def _identity_parts(
    call: str, identity: Node, x: Tensor, states: StateIO
) -> tuple[Tensor | None, Tensor | None]:
    """A residual unit's identity path run on ``x`` (``call``: prime, step or flush), as
    :meth:`Delay.parts` gives a delay line's output (history part, new part): no concatenation where the
    path ends in a delay line."""
    delay = identity.nodes[-1] if isinstance(identity, Seq) and identity.nodes else None
    if not isinstance(delay, Delay):
        return None, getattr(identity, call)(x, states)
    assert isinstance(identity, Seq)
    for node in identity.nodes[:-1]:
        x = getattr(node, call)(x, states)
    return delay.parts(call, x, states)


class Mean(_Parallel):
    """``(b0(x) + b1(x) + ...) / len``, summed left to right as the families do."""

    def combine(self, outs: list[Tensor]) -> Tensor:
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total / len(outs)


def _walk(node: Node) -> list[Node]:
    """``node`` and every node below it."""
    children = node.nodes if isinstance(node, Seq) else node.branches if isinstance(node, _Parallel) else []
    return [node, *(n for child in children for n in _walk(child))]


def _act_channels(act: AliasFreeActivation) -> int:
    return int(act.act.alpha.numel())


def layout_of(module: nn.Module) -> Node:
    """The streaming node tree of ``module``: families describe composites with ``stream_layout()``."""
    own = getattr(module, "stream_layout", None)
    if callable(own):
        node: Node = own()
        return node
    if isinstance(module, GeoSequential):
        return Seq([layout_of(child) for child in module])
    if isinstance(module, PaddedConv1d):
        return Conv(module)
    if isinstance(module, CausalConvTranspose1d | PaddedConvTranspose1d):
        return ConvTranspose(module)
    if isinstance(module, AliasFreeActivation):
        lo, hi = module.input_interval(0, 0)
        return Leaf(module, _act_channels(module), (-lo, hi))
    if isinstance(module, SnakeBeta | Pointwise):
        return Stateless(module)
    raise CodecError(
        f"{type(module).__name__} has no streaming form: stateful mode does not support this decoder; "
        "use mode='halo'"
    )


def supports_stateful(codec: nn.Module) -> bool:
    """Whether ``codec`` describes its layers for stateful streaming (every built-in family does)."""
    try:
        layout_of(codec)
    except CodecError:
        return False
    return True


class StatefulNet:
    """A codec's streaming twin: prime, step and flush on normalised latents ``[B, T, latent_dim]``.

    ``right_frames`` is how many latent frames the audio trails the input by (a step of ``n`` frames
    yields ``n`` frames of audio); ``min_prime_frames`` the fewest frames a stream's first call takes.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.hop = codec.hop_size
        body = layout_of(codec)
        if body.up != self.hop:
            raise CodecError(f"streaming layout upsamples by {body.up}, but the codec's hop is {self.hop}")
        lag = body.lag()
        self.right_frames = -(-lag // self.hop)
        tail = self.right_frames * self.hop - lag
        channels = codec.channels
        self.body = Seq([body, Delay(channels, tail)]) if tail else body
        self.leaves = self.body.leaves()
        for i, leaf in enumerate(self.leaves):
            leaf.index = i
        self.min_prime_frames = self._min_prime()
        self.specs = [StateSpec(leaf.channels, leaf.state_len) for leaf in self.leaves]
        #: delay lines that read another layer's state instead of keeping their own
        self.shared = [n for n in _walk(self.body) if isinstance(n, Delay) and n.source is not None]

    def _min_prime(self) -> int:
        frames = self.right_frames + 1
        while True:
            try:
                self.body.prime_len(frames)
            except _TooShort:
                frames += 1
                continue
            return frames

    def state_bytes(self, dtype: torch.dtype = torch.float32) -> int:
        """Device memory one stream's state takes."""
        size = torch.empty(0, dtype=dtype).element_size()
        return sum(s.channels * s.length for s in self.specs) * size

    def _input(self, z: Tensor) -> Tensor:  # [B, T, D] normalised -> [B, D, T] denormalised
        param = self.codec.global_mean
        return self.codec.denormalize(z.to(device=param.device, dtype=param.dtype)).transpose(1, 2)

    def prime(self, z: Tensor) -> tuple[Tensor, list[Tensor]]:
        """First ``T >= min_prime_frames`` frames -> audio of frames ``0 .. T - right_frames`` and the state."""
        io = _States(None, len(self.leaves))
        audio = self.prime_into(z, io)
        return audio, [s for s in io.outputs if s is not None]

    def step(self, z: Tensor, states: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """``T`` more frames -> ``T`` frames of audio (trailing by ``right_frames``) and the new state."""
        io = _States(states, len(self.leaves))
        audio = self.step_with(z, io)
        return audio, [s for s in io.outputs if s is not None]

    def flush(self, z: Tensor, states: Sequence[Tensor]) -> Tensor:
        """The last ``T >= 0`` frames -> the stream's remaining ``T + right_frames`` frames of audio."""
        return self.flush_with(z, _States(states, len(self.leaves)))

    # The same three calls on a state store that reads and writes each leaf's state as the call reaches
    # it (the engine's slot pool): a store that keeps the new states until the end would keep every
    # layer's whole input alive with them, since a new state is a view of its layer's input.

    def prime_into(self, z: Tensor, io: StateIO) -> Tensor:
        """:meth:`prime`, writing each leaf's state to ``io``; returns the audio."""
        if z.shape[1] < self.min_prime_frames:
            raise CodecError(f"a prime needs >= {self.min_prime_frames} frames, got {z.shape[1]}")
        return self.body.prime(self._input(z), io).float()

    def step_with(self, z: Tensor, io: StateIO) -> Tensor:
        """:meth:`step`, reading and writing each leaf's state through ``io``; returns the audio."""
        return self.body.step(self._input(z), io).float()

    def flush_with(self, z: Tensor, io: StateIO) -> Tensor:
        """:meth:`flush`, reading each leaf's state through ``io``; returns the audio."""
        out = self.body.flush(self._input(z), io)
        # Odd-stride families (DAC 24/16 kHz) end a few samples short of whole frames, and pad with zeros.
        want = (z.shape[1] + self.right_frames) * self.hop
        return F.pad(out, (0, want - out.shape[-1])).float()
