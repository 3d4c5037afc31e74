"""The simulator's clocks: how long each op keeps the accelerator busy, and what launching it costs the host.

A clock turns the per-op prices of :mod:`tflms.sim.cost` into the kernels a device runs (issue 46). Three modes
(``SimOptions.clock``):

- ``serial`` (:data:`CLOCK_SERIAL`): every op is one kernel, its launch added to its time, one after another.
  What TensorFlow's executor does on CPU devices, where a kernel runs in the thread that dispatched it: the clock
  of the emulated accelerator (``tflms.measure``), and of every simulation before issue 46.
- ``graph`` (:data:`CLOCK_GRAPH`): TensorFlow's executor on a GPU, after grappler, without XLA.
  - *Launches overlap.* The executor enqueues GPU kernels on a stream and moves on without waiting for them
    (``GPUDevice`` kernels are asynchronous; ``BaseGPUDevice::Compute`` only enqueues). So the host issues op
    ``k`` at ``launch x k`` (one ``launch_overhead_s`` per kernel, in the order), and a kernel starts at the latest
    of: its inputs done, the stream free, its launch issued. A launch costs step time only where the GPU would
    otherwise wait for it: a run of tiny kernels.
  - *Grappler's GPU fusions* (:func:`tflms.sim.fusion.remapper_kernels`): the remapper's GPU patterns, as
    ``tensorflow/core/grappler/optimizers/remapper.cc`` matches them. Keras 3 graphs match almost none; what
    remains is priced op by op.
- ``xla`` (:data:`CLOCK_XLA`): the step compiled by XLA:GPU (:func:`tflms.sim.fusion.xla_kernels`). Element-wise,
  broadcast, cast and data-movement ops fuse into their consumers, reductions take their producers in, and each
  fusion is priced by the bytes that cross its boundary; convolutions and products are library calls priced as
  before. Tensors inside a fusion never get a buffer. XLA's runtime issues kernels from command buffers (CUDA
  graphs), so launches cost the host nothing; each kernel lasts at least :data:`XLA_MIN_KERNEL_S`.
- ``xla-clusters`` (:data:`CLOCK_XLA_CLUSTERS`): a step that keeps XLA in clusters between tflms's copies (issue 47,
  :mod:`tflms.sim.clusters`): the ``xla`` clock's fusions within each cluster and never across one; a cluster starts
  when all its inputs exist, publishes its outputs at its end, and holds its inputs until then.
- ``auto`` (:data:`CLOCK_AUTO`, the default): ``serial`` on a CPU profile (``HardwareProfile.host_kernels``: the
  emulation), ``graph`` on a GPU profile: the step tflms's own rewrites run (without XLA, issue 47).

A clock's answer is a :class:`Kernels`: per op of the simulated graph its time on the compute stream (0 for an op
fused into another), its host launch cost, and, where ops fused, which buffers each kernel reads and which tensors
never reach memory. The engine (:mod:`tflms.sim.engine`) runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tflms.errors import ConfigError
from tflms.ir.op_types import FREE_OPS
from tflms.sim.cost import op_time_s
from tflms.sim.indexed import ACCEL, IndexedGraph, OpCosts, _indices, _synthetic_op, positions
from tflms.sim.records import SimOptions
from tflms.profiles import HardwareProfile

CLOCK_AUTO, CLOCK_SERIAL, CLOCK_GRAPH, CLOCK_XLA = "auto", "serial", "graph", "xla"
CLOCK_XLA_CLUSTERS = "xla-clusters"
CLOCKS = (CLOCK_AUTO, CLOCK_SERIAL, CLOCK_GRAPH, CLOCK_XLA, CLOCK_XLA_CLUSTERS)
#: The clocks that price XLA's fusions (the whole step, or its clusters).
XLA_CLOCKS = (CLOCK_XLA, CLOCK_XLA_CLUSTERS)
#: The shortest an XLA kernel takes on a GPU, launched from a command buffer: the grid's start and drain. An
#: assumption (a few microseconds is what CUDA graph launches of tiny kernels take on recent GPUs), named here
#: so that every figure it touches can be traced to it.
XLA_MIN_KERNEL_S = 2e-6


def check_clock(clock: str) -> str:
    if clock not in CLOCKS:
        raise ConfigError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, got {clock!r}")
    return clock


def resolve_clock(clock: str, profile: HardwareProfile) -> str:
    """The clock ``clock`` means on ``profile`` (``auto``: ``serial`` on a CPU profile, else ``graph``)."""
    if clock != CLOCK_AUTO:
        return clock
    return CLOCK_SERIAL if profile.host_kernels else CLOCK_GRAPH


@dataclasses.dataclass
class Kernels:
    """What a clock makes of a graph: by op id, ``duration`` on its stream and the host's ``launch`` cost.

    ``reads``: by op id, the tensors whose buffers the op's kernel reads (``None``: its inputs); a fused member
    reads nothing (its kernel does). ``virtual``: by tensor id, 1 for a tensor that never reaches memory (it
    lives inside a fusion). ``kernels``: how many kernels the step launches; ``mode``: the clock used.
    """

    mode: str
    duration: list[float]
    launch: list[float]
    kernels: int
    reads: list[list[int]] | None = None
    virtual: bytearray | None = None
    #: ``xla-clusters`` only (:mod:`tflms.sim.clusters`): the order the compute stream runs (each cluster's kernels
    #: back to back), the predecessors timing waits for (an edge into or out of a cluster is one into its first or
    #: out of its last member), and by op id its cluster (-1: none) and the cluster's first member.
    order: list[int] | None = None
    preds: list[list[int]] | None = None
    cluster: list[int] | None = None
    first: list[int] | None = None
    #: ``xla-clusters`` only: buffers no tensor owns, each ``(first op, last op, label tensor, bytes)``, from the first
    #: op's start to the last op's end: the new values of the variables a cluster updates, from the cluster's start to
    #: its end, and the kernel copies of the machine's XLA and the scratch of its kernels outside the clusters, for
    #: their op (:mod:`tflms.sim.clusters`, "Variable updates", "Kernel copies", "Kernel scratch").
    unowned: list[tuple[int, int, int, int]] | None = None


def op_durations(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                 profile: HardwareProfile) -> list[float]:
    """Each compute op's price (:func:`~tflms.sim.cost.op_time_s`, launch included), by op id; 0 elsewhere."""
    duration = [0.0] * len(net.names)
    times, src_ops, dev, types = costs._times, net.src_ops, net.dev, net.types
    for i in order:
        if is_transfer[i] or dev[i] != ACCEL:
            continue
        src = src_ops[i]
        if src is not None:
            t = times.get(i)
            if t is None:
                t = costs.time_s(i, src)
        elif types[i] in FREE_OPS:
            t = 0.0  # (what ``op_time_s`` says of a free op: a gate or copy the simulator or a plan added)
        else:
            t = op_time_s(net.graph, _synthetic_op(net, i), profile)
        duration[i] = t
    return duration


def serial_kernels(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                   profile: HardwareProfile) -> Kernels:
    """One kernel per op, its launch in its time (see module doc)."""
    duration = op_durations(net, order, is_transfer, costs, profile)
    return Kernels(CLOCK_SERIAL, duration, [0.0] * len(duration), sum(1 for d in duration if d > 0))


def asynchronous(kernels: Kernels, net: IndexedGraph, profile: HardwareProfile, costs: OpCosts) -> Kernels:
    """``kernels`` with each priced op's launches (:func:`~tflms.sim.cost.op_launches`, once per op in ``costs``)
    moved from its time to the host (``graph`` clock)."""
    duration, launch, types, src_ops = kernels.duration, kernels.launch, net.types, net.src_ops
    launch_s = profile.launch_overhead_s
    memo = costs.launches_memo()
    for i, d in enumerate(duration):
        if d > 0 and types[i] not in FREE_OPS:
            src = src_ops[i]
            if src is None:
                host = launch_s
            else:
                hit = memo.get(i)  # (:meth:`OpCosts.launches_s`, without a call per op)
                host = hit[1] if hit is not None and hit[0] is src else costs.launches_s(i, src, launch_s)
            duration[i] = d - min(host, d)
            launch[i] = host
    return kernels


def graph_kernels(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                  profile: HardwareProfile, position: Sequence[int] | None = None) -> Kernels:
    """The ``graph`` clock's kernels of a step grappler's GPU remapper fuses nothing of: :func:`asynchronous` of
    :func:`serial_kernels`, the same figures without a pass over each op. Each op's pair (time on the stream, launch)
    is worked out once and kept with ``costs`` (:meth:`OpCosts.graph_clock_memo`): a tune simulates the same ops in
    every plan. Those of the net every plan's was copied from (:attr:`IndexedGraph.origin`) are kept as whole lists
    (:func:`_origin_kernels`) and copied; only the ops a plan appended, the copies between devices and the ops the
    order leaves out are looked at one by one. (Op by op, this clock was an eighth of each simulation, and a memo
    per op still a tenth.)"""
    n = len(net.names)
    memo, launch_s = costs.graph_clock_memo(), profile.launch_overhead_s
    _, base_duration, base_launch, priced, count = _origin_kernels(net, costs, memo, launch_s, profile)
    n0 = len(base_duration)
    duration, launch = base_duration + [0.0] * (n - n0), base_launch + [0.0] * (n - n0)
    if position is None:
        position = positions(order, n)
    # an op of the origin out of the order, or a copy between devices, keeps the stream free (both are few)
    idle = _indices(position[:n0], -1)
    idle.extend(i for i in _indices(is_transfer, True) if i < n0 and position[i] >= 0)
    for i in idle:
        count -= priced[i]
        duration[i] = launch[i] = 0.0
    for i in range(n0, n):
        if position[i] >= 0 and not is_transfer[i]:
            duration[i], launch[i], kernel = _op_kernel(net, i, costs, memo, launch_s, profile)
            count += kernel
    return Kernels(CLOCK_GRAPH, duration, launch, count)


#: The key under which :func:`_origin_kernels` keeps its lists in :meth:`OpCosts.graph_clock_memo` (whose other keys
#: are op ids).
_ORIGIN = "origin"


def _origin_kernels(net: IndexedGraph, costs: OpCosts, memo: dict, launch_s: float, profile: HardwareProfile
                    ) -> tuple[object, list[float], list[float], bytearray, int]:
    """By op of ``net``'s origin (:attr:`IndexedGraph.origin`), what :func:`_op_kernel` says of it as a compute op of
    the order: ``(the origin, durations, launches, 1 where it is a kernel, how many are)``; 0 for the host's ops.
    Worked out once per origin and kept in ``memo``."""
    token, n0 = net.origin, net.origin.ops
    hit = memo.get(_ORIGIN)
    if hit is None or hit[0] is not token:
        duration, launch, priced = [0.0] * n0, [0.0] * n0, bytearray(n0)
        for i in range(n0):
            duration[i], launch[i], priced[i] = _op_kernel(net, i, costs, memo, launch_s, profile)
        hit = memo[_ORIGIN] = (token, duration, launch, priced, sum(priced))
    return hit


def _op_kernel(net: IndexedGraph, i: int, costs: OpCosts, memo: dict, launch_s: float, profile: HardwareProfile
               ) -> tuple[float, float, bool]:
    """Op ``i`` of ``net`` on the ``graph`` clock, run on the accelerator and not a copy: ``(its time on the stream,
    its host launch, whether it is a kernel)``; kept in ``memo`` by op id with the op priced."""
    if net.dev[i] != ACCEL:
        return 0.0, 0.0, False
    src = net.src_ops[i]
    if src is None:  # (a free op the simulator or a plan added costs nothing)
        if net.types[i] in FREE_OPS:
            return 0.0, 0.0, False
        t = op_time_s(net.graph, _synthetic_op(net, i), profile)
        return (t - min(launch_s, t), launch_s, True) if t > 0 else (0.0, 0.0, False)
    hit = memo.get(i)
    if hit is None or hit[0] is not src:  # (an id a plan appended may be another op in the next plan)
        t = costs.time_s(i, src)
        if t > 0 and net.types[i] not in FREE_OPS:
            host = costs.launches_s(i, src, launch_s)
            hit = memo[i] = (src, t - min(host, t), host, True)
        else:
            hit = memo[i] = (src, t, 0.0, t > 0)
    return hit[1], hit[2], hit[3]


def kernels_for(mode: str, net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                profile: HardwareProfile, outputs: Sequence[int], options: SimOptions | None = None,
                position: Sequence[int] | None = None) -> Kernels:
    """The :class:`Kernels` of ``net`` under clock ``mode`` (resolved, see :func:`resolve_clock`). The
    ``xla-clusters`` clock reads the segment options of ``options`` (``SimOptions.xla_*``; ``None``: the defaults).
    ``position``: by op id its position in ``order`` (-1: not in it), where the caller has it."""
    if mode == CLOCK_SERIAL:
        return serial_kernels(net, order, is_transfer, costs, profile)
    from tflms.sim import fusion  # noqa: PLC0415 - fusion imports this module
    if mode == CLOCK_GRAPH:
        if not fusion.may_fuse_on_gpu(net):
            return graph_kernels(net, order, is_transfer, costs, profile, position)
        kernels = fusion.remapper_kernels(net, order, is_transfer, costs, profile, outputs)
        return asynchronous(kernels, net, profile, costs)
    if mode == CLOCK_XLA:
        return fusion.xla_kernels(net, order, is_transfer, costs, profile, outputs)
    if mode == CLOCK_XLA_CLUSTERS:
        from tflms.sim.clusters import cluster_kernels  # noqa: PLC0415 - clusters imports fusion
        return cluster_kernels(net, order, is_transfer, costs, profile, outputs, options, position)
    raise ConfigError(f"no clock {mode!r}")
