"""Memory and time simulator over an execution order.

Model (checked against TensorFlow's executor in ``tools/validate_memory.py`` and
``tests/test_validation.py``):

- **Devices.** An op whose device is the host device runs on the host; every
  other op on the accelerator. A copy op (``Identity``/``DeepCopy``) whose input
  lives on the other device is a *transfer*: it runs on that direction's copy
  stream, in parallel with compute, at the profile's link bandwidth.
- **Schedule.** Compute ops run one at a time in the given order (default: CTO
  levels, ties by graph order). An op starts when the previous compute op ended
  and all its data and control predecessors finished, so a consumer waits for
  its swap-in and ``sync_mode`` edges are honoured. A transfer starts when its
  predecessors finished and its stream is free. ``simulate(observed=...)``
  replays a measured run instead: every listed op starts and ends when it did.
  :func:`order_from_start_times` turns observed start times (e.g. the executor's
  ``ExecutorMeasurement.node_times``) into an order for ``simulate(order=...)``.
- **Copy queues.** Each direction has one copy stream; a copy waits for the copies
  ahead of it. ``SimOptions.transfer_order="fifo"`` serves copies in the order they
  became ready (an event-driven walk: compute in the given order, host ops and
  copies when ready); the default ``"release"`` serves them in the order the walk
  over the execution order releases them, which puts a copy whose trigger ran
  early on a parallel branch behind copies released before it
  (``tests/test_sim_queues.py`` works both out by hand).
- **Memory.** Outputs are allocated when their op starts and freed when the last
  op reading them (directly or through an alias) has ended. Aliasing ops
  (``Identity`` on one device, ``Reshape``, ...) share their input's buffer;
  ``ReadVariableOp`` reads the resident variable. Variables (and optimizer
  slots), constants and the step's arguments are resident for the whole step.
  Function outputs live to the end of the step.
- **Margin.** ``peak_with_margin_bytes`` adds ``margin_fraction`` of the peak
  plus ``margin_bytes``, for workspaces that static shapes cannot see.

Rules learned from TensorFlow's executor (emulated accelerator, allocation records
of a traced step; each is pinned by a hand-built test in ``tests/test_validation.py``):

- **Unused ops do not run** (``SimOptions.prune_unused``). TensorFlow runs only the
  fan-in of a function's outputs and control outputs (a Session prunes to its
  fetches and targets; a tf.function body is pruned the same way and makes every
  stateful op a control output). Evidence: the input gradient of a CNN's first
  convolution (``Conv2DBackpropInput``, no consumer, 393 KiB at batch 32) and the
  int32 shape arithmetic of the BatchNorm gradients have no node stats at all.
- **Forwarding** (TensorFlow's ``forward_input_or_allocate_output``): an
  element-wise op (:data:`FORWARDING_OPS`; unary and binary cwise kernels, their
  ``*Grad`` kernels, ``BiasAdd``, ``AddN``) writes into an input buffer of the same
  dtype and size when nothing else references it: the op is that buffer's last
  reader and every other reader has *ended* when it starts (a reader still running,
  e.g. a concurrent copy, holds a reference). Chains forward through: in
  ``MatMul -> BiasAdd -> Relu`` only the MatMul allocates (Dense layers), and in
  Adam's ``Square -> Sub -> Mul`` only the Square. Evidence: those ops have no
  allocation records and their outputs carry the input's buffer address.
  Never forwarded: variable reads (the variable holds a reference: Adam's
  ``Sqrt(ReadVariableOp)`` allocates), fed arguments and constants, function
  outputs (held by the caller), and ``Cast`` between dtypes (allocates).
- **Kernel workspaces** (``SimOptions.workspace_bytes_per_element``, e.g.
  :data:`ONEDNN_CPU_WORKSPACES`): TensorFlow's x86 CPU build runs oneDNN kernels;
  ``_MklNativeMaxPool`` allocates, besides its output, a workspace of one byte per
  output element that lives until ``MaxPoolGrad`` (+25% of a float32 output).
  Convolutions take a scratchpad of ~12 KiB for the duration of the kernel (not
  modelled; it is below the measurement's resolution here).
- **Concurrency.** TensorFlow's executor runs ready ops on several inter-op
  threads. On the emulated accelerator (two logical CPUs) two expensive ops may
  overlap: then neither can forward a buffer they both read, and a slow op keeps
  its inputs alive while the other thread moves on. The peak of one graph then
  varies from run to run, typically by one activation (test CNN of
  ``tests/test_validation.py``: 7.74 or 8.26 MB; the CNN of the validation tool with
  a tuned rewrite, on a loaded machine: 8.97 or 11.07 MB). The sequential model
  predicts the runs without overlap; a replay of the observed times (``observed=``)
  reproduces every run to within 0.1%. On a GPU, kernels of one stream do not
  overlap, which is what the sequential model assumes.

Timing matters for memory once tensors are swapped: a copy's start decides when its
buffer appears. Judge a plan with the profile of the machine it will run on (for the
emulation: ``tflms.measure.EMULATION_PROFILE``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterable, Mapping, Sequence

# The simulator's parts, re-exported so every name stays importable from here.
from tflms.analysis.cto import compute_levels
from tflms.devices import normalize_device
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import DTYPE_BYTES, Graph, Op, TensorInfo, TensorRef
from tflms.ir.op_types import ALIAS_OPS, COPY_OPS, FORWARDING_OPS, SOURCE_OPS, VARIABLE_READ_OPS
from tflms.sim.cost import op_time_s
from tflms.sim.engine import _run, step_kernels
from tflms.sim.indexed import (_NO_BUFFER_DTYPES, ACCEL, HOST, RECV_SUFFIX, IndexedGraph, OpCosts, _add_recvs,
                               _device_class, _needed, _recv_needs, _resident_variable_bytes, _synthetic_op)
from tflms.sim.order import (_check_order, _level_sorted, _observed_order, _order_ids, level_order,
                             order_from_start_times)
from tflms.sim.records import (ONEDNN_CPU_WORKSPACES, TRANSFER_ORDER_FIFO, TRANSFER_ORDER_RELEASE, OpRecord,
                               SimOptions, SimResult)
from tflms.profiles import HardwareProfile, get_profile

__all__ = [
    # defined here
    "KernelReads", "compare", "gc_paused", "kernel_reads", "simulate", "variable_bytes",
    # tflms.sim.records
    "ONEDNN_CPU_WORKSPACES", "TRANSFER_ORDER_FIFO", "TRANSFER_ORDER_RELEASE", "OpRecord", "SimOptions", "SimResult",
    # tflms.sim.indexed
    "ACCEL", "HOST", "RECV_SUFFIX", "_NO_BUFFER_DTYPES", "IndexedGraph", "OpCosts", "_add_recvs", "_device_class",
    "_needed", "_recv_needs", "_resident_variable_bytes", "_synthetic_op",
    # tflms.sim.order
    "level_order", "order_from_start_times", "_check_order", "_level_sorted", "_observed_order", "_order_ids",
    # tflms.sim.engine
    "_run",
    # names this module imported before the split
    "compute_levels", "normalize_device", "ConfigError", "GraphError", "DTYPE_BYTES", "Graph", "Op", "TensorInfo",
    "TensorRef", "ALIAS_OPS", "COPY_OPS", "FORWARDING_OPS", "SOURCE_OPS", "VARIABLE_READ_OPS", "op_time_s",
    "HardwareProfile", "get_profile", "Iterable", "Mapping", "Sequence",
]


def variable_bytes(graph: Graph) -> dict[str, int]:
    """Bytes of each variable the step uses, by resource handle.

    Taken from ``graph.resource_bytes`` (recorded when the IR was read from a
    ConcreteFunction) or else from the largest read of each handle.
    """
    known = graph.resource_bytes
    if known:
        return dict(known)
    sizes: dict[str, int] = {}
    for op in graph:
        if op.type in VARIABLE_READ_OPS and op.inputs and op.outputs:
            handle = op.inputs[0].name
            sizes[handle] = max(sizes.get(handle, 0), op.outputs[0].num_bytes or 0)
    return sizes


@contextlib.contextmanager
def gc_paused():
    """Pause CPython's cyclic garbage collector for a simulation.

    A simulation allocates tens of thousands of small tuples; each allocation burst triggers
    collections that scan every tracked object of the process (the IR graph, earlier results), which
    cost more than the simulation itself on a ResNet-50 step. The simulator makes no reference
    cycles worth collecting early; the collector resumes afterwards (if it was enabled).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def simulate(graph: Graph, profile: str | HardwareProfile, *, order: Sequence[str] | None = None,
             options: SimOptions | None = None, output_names: Sequence[str] | None = None,
             observed: Mapping[str, tuple[float, float]] | None = None,
             known_op_times_s: Mapping[str, float] | None = None) -> SimResult:
    """Simulate one step of ``graph`` (see module doc); ``order`` defaults to CTO levels.

    ``order`` may also list ops that do not run (unused ops, see ``SimOptions.prune_unused``).
    ``observed`` replays a measured run: ``{op: (start_s, end_s)}`` replaces the profile's
    timing for the ops it lists (an op it does not list takes no time and starts when its
    inputs are done); ``order`` then defaults to the observed start order.
    ``known_op_times_s``: op name -> compute seconds already priced on ``profile`` for an op with the
    same type, attributes and tensors (a rewrite's unchanged ops and clones; the tuner's recompute search).
    """
    profile = get_profile(profile)
    options = options or SimOptions()
    net, order_ids, position, outputs, alive = _indexed(graph, options, order, output_names, observed)
    with gc_paused():
        return _run(net, order_ids, position, outputs, profile, options,
                    OpCosts(graph, profile, known_op_times_s, names=net.names), alive, observed=observed)


def _indexed(graph: Graph, options: SimOptions, order: Sequence[str] | None = None,
             output_names: Sequence[str] | None = None, observed: Mapping[str, tuple[float, float]] | None = None):
    """What :func:`simulate` runs: the indexed graph, its order (ids) and positions, the step's output tensors and
    which ops run."""
    sig = graph.signature
    if output_names is None:
        output_names = sig.output_names if sig is not None else ()
    net = IndexedGraph.from_graph(graph, options.host_device)
    op_id = {name: i for i, name in enumerate(net.names)}
    if options.prune_unused and sig is not None:
        alive = _needed(net, net.roots(graph, output_names, op_id))
    else:
        alive = [True] * len(net.names)
    if observed is not None and order is None:
        order = _observed_order(net, alive, {name: span[0] for name, span in observed.items()})
    needs = _recv_needs(net, range(len(net.names)), alive)
    recvs = _add_recvs(net, needs, alive)
    if order is not None:
        order_ids = _order_ids(net, order, alive, recvs, needs)
    else:
        order_ids = _level_sorted(net, alive)
    position = _check_order(net, order_ids, alive)
    outputs = []
    for name in output_names:
        ref = TensorRef.parse(name)
        if ref.op in op_id and alive[op_id[ref.op]] and 0 <= ref.index < net.n_out[op_id[ref.op]]:
            outputs.append(net.out_start[op_id[ref.op]] + ref.index)
    return net, order_ids, position, list(dict.fromkeys(outputs)), alive


@dataclasses.dataclass(frozen=True)
class KernelReads:
    """What the kernels of a step read and write (:func:`kernel_reads`)."""

    readers: Mapping[str, tuple[str, ...]]  # by buffer (the tensor owning it), the ops whose kernels read it, in order
    virtual: frozenset[str]  # the tensors that never reach memory (they live inside a fusion)
    owner: Mapping[str, str]  # by tensor, the tensor owning its buffer (a view's source)
    #: ``xla-clusters`` only: by op in an XLA cluster, the cluster's first op (its kernels run back to back from it)
    cluster_first: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def buffer(self, tensor: str) -> str:
        return self.owner.get(tensor, tensor)


def kernel_reads(graph: Graph, profile: str | HardwareProfile, options: SimOptions | None = None) -> KernelReads:
    """:func:`simulate`'s kernels of ``graph`` in level order, as the clock of ``options`` makes them (the ``xla``
    clock's fusions): which op's kernel reads which buffer (a fused member reads nothing, its fusion's root does; a
    view's reads are its source's) and which tensors never reach memory. The cut bound counts what a re-run can
    spare with them (:mod:`tflms.tune.cut_bound`)."""
    profile = get_profile(profile)
    options = options or SimOptions()
    net, order, _, outputs, _ = _indexed(graph, options)
    bufs, kernels = step_kernels(net, order, outputs, profile, options, OpCosts(graph, profile, names=net.names))
    reads = kernels.reads if kernels.reads is not None else net.inputs
    names, t_op, t_idx, owner = net.names, net.t_op, net.t_idx, bufs.buffer_of

    def tensor(t: int) -> str:
        return f"{names[t_op[t]]}:{t_idx[t]}"

    readers: dict[str, list[str]] = {}
    for i in order:
        for t in dict.fromkeys(owner[t] for t in reads[i]):
            readers.setdefault(tensor(t), []).append(names[i])
    virtual = kernels.virtual or bytearray(len(t_op))
    cluster, first = kernels.cluster, kernels.first
    return KernelReads(readers={b: tuple(ops) for b, ops in readers.items()},
                       virtual=frozenset(tensor(t) for t in range(len(t_op)) if virtual[t]),
                       owner={tensor(t): tensor(o) for t, o in enumerate(owner) if o != t},
                       cluster_first={} if cluster is None or first is None else {
                           names[i]: names[first[i]] for i in order if cluster[i] >= 0})


def compare(original: SimResult, rewritten: SimResult) -> Mapping[str, float]:
    """Peak saved and time overhead of a rewrite."""
    return {"peak_saved_bytes": original.peak_bytes - rewritten.peak_bytes,
            "peak_ratio": rewritten.peak_bytes / original.peak_bytes if original.peak_bytes else 1.0,
            "overhead": rewritten.overhead_vs(original)}
