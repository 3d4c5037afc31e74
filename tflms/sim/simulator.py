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
import functools
import gc
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from tflms.analysis.cto import compute_levels
from tflms.devices import normalize_device
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import DTYPE_BYTES, Graph, Op, TensorInfo, TensorRef
from tflms.ir.op_types import ALIAS_OPS, COPY_OPS, FORWARDING_OPS, SOURCE_OPS, VARIABLE_READ_OPS
from tflms.sim.cost import op_time_s
from tflms.profiles import HardwareProfile, get_profile

ACCEL, HOST = "accelerator", "host"

#: Kernel workspaces of TensorFlow's oneDNN CPU kernels (``SimOptions.workspace_bytes_per_element``):
#: ``_MklNativeMaxPool`` returns a workspace of one byte per output element (the argmax
#: index in the window) that ``MaxPoolGrad`` reads, so it lives as long as the output.
ONEDNN_CPU_WORKSPACES = {"MaxPool": 1.0}
#: ``SimOptions.transfer_order``: copies take their stream in the order the simulator releases them while it
#: walks the execution order ("release", the model so far), or first come first served by the time they became
#: ready ("fifo", what one copy engine per direction does).
TRANSFER_ORDER_RELEASE, TRANSFER_ORDER_FIFO = "release", "fifo"


@dataclasses.dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulator (see module doc)."""

    host_device: str = "/device:CPU:0"
    margin_fraction: float = 0.0
    margin_bytes: int = 0
    model_forwarding: bool = True
    resident_inputs: bool = True
    prune_unused: bool = True
    #: Extra bytes per element of output 0 that kernels of these op types allocate with
    #: that output and keep as long as it (see ``ONEDNN_CPU_WORKSPACES``); ``{type: bytes}``.
    workspace_bytes_per_element: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: How copies queue on each direction's stream (:data:`TRANSFER_ORDER_RELEASE` or :data:`TRANSFER_ORDER_FIFO`,
    #: see the module doc). ``release`` serves a copy released later in the order after an earlier-released one
    #: even when it was ready sooner (a host swap-in whose trigger ran earlier on a parallel branch).
    transfer_order: str = TRANSFER_ORDER_RELEASE

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_device", normalize_device(self.host_device, field="host_device"))
        workspaces = dict(self.workspace_bytes_per_element)
        for op_type, per_element in workspaces.items():
            if not isinstance(per_element, (int, float)) or per_element < 0:
                raise ConfigError(f"workspace_bytes_per_element[{op_type!r}] must be a number >= 0, "
                                  f"got {per_element!r}")
        object.__setattr__(self, "workspace_bytes_per_element", workspaces)
        if not 0 <= self.margin_fraction < 10:
            raise ConfigError(f"margin_fraction must be in [0, 10), got {self.margin_fraction}")
        if self.margin_bytes < 0:
            raise ConfigError("margin_bytes must be >= 0")
        if self.transfer_order not in (TRANSFER_ORDER_RELEASE, TRANSFER_ORDER_FIFO):
            raise ConfigError(f"transfer_order must be {TRANSFER_ORDER_RELEASE!r} or {TRANSFER_ORDER_FIFO!r}, "
                              f"got {self.transfer_order!r}")


class OpRecord(NamedTuple):
    """When one op ran, where (a tuple: thousands are made per simulation)."""

    name: str
    device: str
    stream: str  # "compute", "d2h", "h2d" or "host"
    start_s: float
    end_s: float


@dataclasses.dataclass(frozen=True)
class SimResult:
    """The simulator's answer for one graph on one profile."""

    profile: str
    peak_bytes: int  # accelerator: resident + transient
    resident_bytes: int  # variables, optimizer slots, step arguments
    transient_peak_bytes: int  # peak of step activations alone
    peak_with_margin_bytes: int
    peak_time_s: float
    live_at_peak: tuple[tuple[str, int], ...]  # (tensor, bytes), largest first
    host_peak_bytes: int
    step_time_s: float
    compute_time_s: float
    transfer_time_s: float
    stall_time_s: float  # time compute waited for transfers
    timeline: tuple[tuple[float, int, int], ...]  # (time, accelerator bytes, host bytes) after each change
    ops: tuple[OpRecord, ...]
    unknown_size_tensors: tuple[str, ...]
    buffer_owner: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # tensor -> buffer
    #: accelerator buffers as (name, bytes, first, last): alive from memory event ``first`` to ``last``
    #: inclusive (event indices in time order), the input of the memory planner (``tflms.plan``).
    buffer_lifetimes: tuple[tuple[str, int, int, int], ...] = dataclasses.field(default=(), repr=False)

    def tensors_sharing(self, owner: str) -> list[str]:
        """Tensors that live in ``owner``'s buffer (aliases and forwarded outputs)."""
        return sorted(t for t, o in self.buffer_owner.items() if o == owner)

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_with_margin_bytes <= budget_bytes

    def overhead_vs(self, baseline: "SimResult") -> float:
        """Relative step-time overhead against ``baseline`` (0.1 = 10% slower)."""
        return self.step_time_s / baseline.step_time_s - 1.0 if baseline.step_time_s else 0.0

    def summary(self) -> dict:
        return {"profile": self.profile, "peak_bytes": self.peak_bytes, "resident_bytes": self.resident_bytes,
                "transient_peak_bytes": self.transient_peak_bytes,
                "peak_with_margin_bytes": self.peak_with_margin_bytes, "host_peak_bytes": self.host_peak_bytes,
                "step_time_s": self.step_time_s, "stall_time_s": self.stall_time_s,
                "transfer_time_s": self.transfer_time_s}


def level_order(graph: Graph) -> list[str]:
    """Ops sorted by CTO level, ties by graph order."""
    levels = compute_levels(graph)
    position = {op.name: i for i, op in enumerate(graph)}
    return sorted(levels, key=lambda n: (levels[n], position[n]))


def order_from_start_times(graph: Graph, start_times: Mapping[str, float]) -> list[str]:
    """An execution order of ``graph`` that follows observed start times.

    ``start_times`` maps op names to when they started (e.g. the executor's
    ``ExecutorMeasurement.node_times``); names not in the graph are ignored. The
    result is a topological order: among ready ops the earliest observed start runs
    first; an op that was not observed (a fed placeholder, a runtime-only node) runs
    as soon as its inputs are ready, ties by graph order. A correct observation of a
    run respects every edge, so the result is then exactly the observed order.
    """
    position = {op.name: i for i, op in enumerate(graph)}
    indegree = {op.name: len(graph.predecessors(op.name)) for op in graph}
    successors: dict[str, list[str]] = {name: [] for name in indegree}
    for name in indegree:
        for pred in graph.predecessors(name):
            successors[pred].append(name)
    key: dict[str, float] = {}
    ready = []
    for name, n in indegree.items():
        if n == 0:
            key[name] = start_times.get(name, float("-inf"))
            heapq.heappush(ready, (key[name], position[name], name))
    order: list[str] = []
    while ready:
        _, _, name = heapq.heappop(ready)
        order.append(name)
        for succ in successors[name]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                inherited = max(key[p] for p in graph.predecessors(succ))
                key[succ] = start_times.get(succ, inherited)
                heapq.heappush(ready, (key[succ], position[succ], succ))
    if len(order) != len(graph):
        raise GraphError("the graph has a cycle; no execution order exists")
    return order


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


@functools.lru_cache(maxsize=4096)
def _device_class(device: str, host: str) -> str:
    if not device:
        return ACCEL
    try:
        local = normalize_device(device, field="device").rpartition("/device:")[2]
    except ConfigError:
        return ACCEL
    return HOST if local == host.rpartition("/device:")[2] else ACCEL


#: Suffix of the virtual copy ops that stand for TensorFlow's _Send/_Recv pairs.
RECV_SUFFIX = "/_recv"
#: dtypes without a device buffer of their own (handles, host data): never copied, never counted.
_NO_BUFFER_DTYPES = frozenset({"resource", "variant", "string"})


class IndexedGraph:
    """A graph as flat lists over integer op ids and tensor ids: what the simulator's inner loops read.

    Op ``i`` has ``names[i]``, ``types[i]``, ``dev[i]`` (:data:`ACCEL` or :data:`HOST`), data
    inputs ``inputs[i]`` (tensor ids), control inputs ``ctrl[i]`` (op ids), ``preds[i]`` (data then
    control predecessors, deduplicated, like :meth:`Graph.predecessors`) and outputs
    ``out_start[i] .. out_start[i] + n_out[i] - 1``. Tensor ``t`` is output ``t_idx[t]`` of op
    ``t_op[t]`` with facts ``t_info[t]``. Op ids follow graph order, so sorting by id is sorting by
    graph position. ``src_ops[i]`` is the IR :class:`Op` an op came from (``None`` for ops the
    simulator adds), used only to cost it.

    Built once per graph (:meth:`from_graph`); :class:`tflms.tune.evaluator.PlanEvaluator` derives
    one per swap plan from a base graph's by copying the lists and appending the swap ops, instead
    of copying the IR.
    """

    __slots__ = ("names", "types", "dev", "inputs", "ctrl", "preds", "out_start", "n_out", "t_op", "t_idx",
                 "t_info", "src_ops", "graph")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.types: list[str] = []
        self.dev: list[str] = []
        self.inputs: list[list[int]] = []
        self.ctrl: list[list[int]] = []
        self.preds: list[list[int]] = []
        self.out_start: list[int] = []
        self.n_out: list[int] = []
        self.t_op: list[int] = []
        self.t_idx: list[int] = []
        self.t_info: list = []
        self.src_ops: list = []
        self.graph: Graph | None = None

    @classmethod
    def from_graph(cls, graph: Graph, host: str) -> "IndexedGraph":
        net = cls()
        net.graph = graph
        op_id: dict[str, int] = {}
        ops = graph.ops
        for i, op in enumerate(ops):
            op_id[op.name] = i
            net.names.append(op.name)
            net.types.append(op.type)
            net.dev.append(_device_class(op.device, host))
            net.out_start.append(len(net.t_op))
            net.n_out.append(len(op.outputs))
            for k, info in enumerate(op.outputs):
                net.t_op.append(i)
                net.t_idx.append(k)
                net.t_info.append(info)
            net.src_ops.append(op)
        out_start = net.out_start
        for op in ops:
            ins = [out_start[op_id[r.op]] + r.index for r in op.inputs]
            ctl = [op_id[c] for c in op.control_inputs]
            net.inputs.append(ins)
            net.ctrl.append(ctl)
            net.preds.append(list(dict.fromkeys([op_id[r.op] for r in op.inputs] + ctl)))
        return net

    def copy(self) -> "IndexedGraph":
        """A copy whose lists may be appended to and whose per-op lists are replaced, never mutated."""
        new = IndexedGraph()
        for slot in self.__slots__:
            value = getattr(self, slot)
            setattr(new, slot, list(value) if isinstance(value, list) else value)
        return new

    def add_op(self, name: str, type_: str, dev: str, inputs: list[int], ctrl: list[int],
               infos: Sequence[TensorInfo]) -> int:
        i = len(self.names)
        self.names.append(name)
        self.types.append(type_)
        self.dev.append(dev)
        self.inputs.append(inputs)
        self.ctrl.append(ctrl)
        self.preds.append(list(dict.fromkeys([self.t_op[t] for t in inputs] + ctrl)))
        self.out_start.append(len(self.t_op))
        self.n_out.append(len(infos))
        for k, info in enumerate(infos):
            self.t_op.append(i)
            self.t_idx.append(k)
            self.t_info.append(info)
        self.src_ops.append(None)
        return i

    def refresh_preds(self, i: int) -> None:
        self.preds[i] = list(dict.fromkeys([self.t_op[t] for t in self.inputs[i]] + self.ctrl[i]))

    def tensor_name(self, t: int) -> str:
        return f"{self.names[self.t_op[t]]}:{self.t_idx[t]}"

    def tensor_id(self, ref: TensorRef, op_id: Mapping[str, int]) -> int:
        return self.out_start[op_id[ref.op]] + ref.index

    def roots(self, graph: Graph, output_names: Sequence[str], op_id: Mapping[str, int]) -> list[int]:
        """The ops TensorFlow runs for their own sake: producers of the outputs, control outputs."""
        roots = [TensorRef.parse(n).op for n in output_names] + list(graph.signature.control_output_names)
        return [op_id[r] for r in roots if r in op_id]


def _needed(net: IndexedGraph, roots: Sequence[int]) -> list[bool]:
    """Which ops the roots need (their data and control ancestors, themselves included)."""
    needed = [False] * len(net.names)
    preds = net.preds
    stack = list(roots)
    while stack:
        i = stack.pop()
        if needed[i]:
            continue
        needed[i] = True
        stack.extend(p for p in preds[i] if not needed[p])
    return needed


def _recv_needs(net: IndexedGraph, ops: Iterable[int], alive: Sequence[bool]) -> dict[int, list[tuple[int, int]]]:
    """Host tensors that accelerator ops among ``ops`` read: ``{tensor: [(consumer, input index)]}``."""
    needs: dict[int, list[tuple[int, int]]] = {}
    dev, types, inputs, t_op, t_info = net.dev, net.types, net.inputs, net.t_op, net.t_info
    for i in ops:
        if not alive[i] or dev[i] != ACCEL or types[i] == "DeepCopy":
            continue
        for k, t in enumerate(inputs[i]):
            if dev[t_op[t]] == HOST and t_info[t].dtype not in _NO_BUFFER_DTYPES:
                needs.setdefault(t, []).append((i, k))
    return needs


def _add_recvs(net: IndexedGraph, needs: Mapping[int, Sequence[tuple[int, int]]], alive: list[bool]) -> list[int]:
    """Make TensorFlow's implicit cross-device copies explicit; returns the new ops (alive, in id order).

    An accelerator op reading a host tensor gets it through a ``_Recv`` that
    TensorFlow inserts (one per tensor and device), which copies as soon as the
    tensor exists: control inputs of the consumer do not delay it. Each such
    tensor gets an ``Identity`` on the accelerator named ``<op>/_recv`` (output
    index appended when not 0), which the simulator then treats as a transfer.
    ``DeepCopy`` consumers are the exception: they are the explicit copies of the
    two-logical-CPU emulation, where cross-device edges share buffers.
    Recvs are added in tensor-name order, after every other op.
    """
    added = []
    names, t_op, t_idx = net.names, net.t_op, net.t_idx
    for t in sorted(needs, key=lambda t: (names[t_op[t]], t_idx[t])):
        name = names[t_op[t]] + RECV_SUFFIX + ("" if t_idx[t] == 0 else f"_{t_idx[t]}")
        r = net.add_op(name, "Identity", ACCEL, [t], [], [net.t_info[t]])
        alive.append(True)
        out = net.out_start[r]
        touched = []
        for consumer, index in needs[t]:
            ins = list(net.inputs[consumer])
            ins[index] = out
            net.inputs[consumer] = ins
            touched.append(consumer)
        for consumer in dict.fromkeys(touched):
            net.refresh_preds(consumer)
        added.append(r)
    return added


def _level_sorted(net: IndexedGraph, alive: Sequence[bool]) -> list[int]:
    """Alive ops by CTO level (longest path from a source), ties by graph order (op id)."""
    n = len(net.names)
    preds = net.preds
    indegree = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    ready = []
    for i in range(n):
        if not alive[i]:
            continue
        p = preds[i]
        indegree[i] = len(p)
        for q in p:
            succs[q].append(i)
        if not p:
            ready.append(i)
    level = [0] * n
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        li = level[i] + 1
        for j in succs[i]:
            if level[j] < li:
                level[j] = li
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    count = sum(1 for a in alive if a)
    if seen != count:
        stuck = sorted(net.names[i] for i in range(n) if alive[i] and indegree[i] > 0)
        raise GraphError(f"the graph has a cycle through {len(stuck)} ops, e.g. {stuck[:5]}; "
                         "TF1 loops (NextIteration) are not supported: use TF2 control flow (tf.while_loop "
                         "inside tf.function)")
    order = [i for i in range(n) if alive[i]]
    order.sort(key=level.__getitem__)  # stable: ties keep graph order
    return order


def _order_ids(net: IndexedGraph, names: Sequence[str], alive: Sequence[bool], recvs: Sequence[int],
               recv_needs: Mapping[int, Sequence[tuple[int, int]]]) -> list[int]:
    """A given order (names; unknown and pruned names dropped) with each recv just before its first consumer."""
    recv_set = set(recvs)
    op_id = {net.names[i]: i for i in range(len(net.names)) if alive[i] and i not in recv_set}
    order = [op_id[n] for n in names if n in op_id]
    if recvs:
        pos = {op: k for k, op in enumerate(order)}
        before: dict[int, list[int]] = {}
        for r in recvs:  # recvs are in tensor-name order, as they were added
            t = net.inputs[r][0]
            consumers = [c for c, _ in recv_needs[t]]
            if any(c not in pos for c in consumers):
                continue  # a consumer missing from the order: reported by the completeness check
            first = min(pos[c] for c in consumers)
            before.setdefault(first, []).append(r)
        out = []
        for k, op in enumerate(order):
            out.extend(before.get(k, ()))
            out.append(op)
        order = out
    return order


def _check_order(net: IndexedGraph, order: Sequence[int], alive: Sequence[bool]) -> list[int]:
    """``position`` of every op in ``order``; raises if the order is incomplete or runs an op before its input."""
    n = len(net.names)
    position = [-1] * n
    for k, i in enumerate(order):
        position[i] = k
    count = sum(1 for a in alive if a)
    if len(order) != count or any(alive[i] and position[i] < 0 for i in range(n)):
        missing = sorted(net.names[i] for i in range(n) if alive[i] and position[i] < 0)[:5]
        raise GraphError(f"the execution order must list every op exactly once; missing e.g. {missing}")
    preds, names = net.preds, net.names
    for k, i in enumerate(order):
        for p in preds[i]:
            if position[p] > k:
                raise GraphError(f"the execution order runs {names[i]!r} before its input {names[p]!r}")
    return position


def _observed_order(net: IndexedGraph, alive: Sequence[bool], start_times: Mapping[str, float]) -> list[str]:
    """:func:`order_from_start_times` over the alive ops of ``net`` (names out)."""
    n = len(net.names)
    preds, names = net.preds, net.names
    indegree = [len(preds[i]) if alive[i] else 0 for i in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        if alive[i]:
            for p in preds[i]:
                succs[p].append(i)
    key = [0.0] * n
    ready = []
    for i in range(n):
        if alive[i] and indegree[i] == 0:
            key[i] = start_times.get(names[i], float("-inf"))
            heapq.heappush(ready, (key[i], i))
    order: list[str] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(names[i])
        for j in succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                inherited = max(key[p] for p in preds[j])
                key[j] = start_times.get(names[j], inherited)
                heapq.heappush(ready, (key[j], j))
    if len(order) != sum(1 for a in alive if a):
        raise GraphError("the graph has a cycle; no execution order exists")
    return order


def _resident_variable_bytes(net: IndexedGraph, alive: Sequence[bool]) -> int:
    """:func:`variable_bytes` summed, over the alive ops of ``net``."""
    known = net.graph.resource_bytes if net.graph is not None else None
    if known:
        return sum(known.values())
    sizes: dict[int, int] = {}
    for i, op_type in enumerate(net.types):
        if alive[i] and op_type in VARIABLE_READ_OPS and net.inputs[i] and net.n_out[i]:
            handle = net.inputs[i][0]
            sizes[handle] = max(sizes.get(handle, 0), net.t_info[net.out_start[i]].num_bytes or 0)
    return sum(sizes.values())


class OpCosts:
    """Compute time of each op of one IR graph on one profile, computed once per op (:func:`op_time_s`).

    An op's time depends only on its type, attributes and the facts of its input and output
    tensors, none of which a swap plan changes (swap-ins carry the swapped tensor's facts).
    """

    def __init__(self, graph: Graph, profile: HardwareProfile):
        self.graph, self.profile = graph, profile
        self._times: dict[int, float] = {}

    def time_s(self, op_id: int, op) -> float:
        t = self._times.get(op_id)
        if t is None:
            t = self._times[op_id] = op_time_s(self.graph, op, self.profile)
        return t



def _run(net: IndexedGraph, order: Sequence[int], position: Sequence[int], outputs: Iterable[int],
         profile: HardwareProfile, options: SimOptions, costs: OpCosts, alive: Sequence[bool],
         observed: Mapping[str, tuple[float, float]] | None = None) -> SimResult:
    """The simulation proper (see module doc) over an :class:`IndexedGraph` and a checked order."""
    n = len(net.names)
    names, types, dev, inputs, preds = net.names, net.types, net.dev, net.inputs, net.preds
    out_start, n_out, t_op, t_idx, t_info = net.out_start, net.n_out, net.t_op, net.t_idx, net.t_info
    outputs = set(outputs)
    num_tensors = len(t_op)
    # ----------------------------------------------------------- buffers
    # buffer_of[t] is the tensor owning t's buffer; until forwarding it is always resolved (an owner),
    # because an alias takes its input's (resolved) owner and inputs come earlier in the order.
    buffer_of = list(range(num_tensors))
    in_order = [False] * num_tensors  # outputs of ops in the order
    resident = [False] * num_tensors
    variable_reads = [False] * num_tensors
    unknown: list[str] = []
    is_transfer = [False] * n
    resident_inputs = options.resident_inputs
    for i in order:
        s, k = out_start[i], n_out[i]
        for t in range(s, s + k):
            in_order[t] = True
            info = t_info[t]
            if info.num_bytes is None and info.dtype not in _NO_BUFFER_DTYPES:
                unknown.append(net.tensor_name(t))
        op_type = types[i]
        ins = inputs[i]
        if op_type in COPY_OPS and ins and dev[t_op[ins[0]]] != dev[i]:
            is_transfer[i] = True
        if op_type in VARIABLE_READ_OPS:
            if k:
                variable_reads[s] = True
        elif (op_type in SOURCE_OPS and resident_inputs) or op_type in ("Const", "HostConst"):
            for t in range(s, s + k):
                resident[t] = True
        elif op_type in ALIAS_OPS and ins:
            if dev[t_op[ins[0]]] == dev[i] or op_type not in COPY_OPS:
                last = len(ins) - 1
                for j in range(k):
                    buffer_of[s + j] = buffer_of[ins[min(j, last)]]

    def owner_of(t: int) -> int:
        owner = buffer_of[t]
        while buffer_of[owner] != owner:
            owner = buffer_of[owner]
        buffer_of[t] = owner
        return owner

    # ----------------------------------------------------------- timing
    if options.transfer_order == TRANSFER_ORDER_RELEASE or observed is not None:
        end: list = [None] * n
        start = [0.0] * n
        event_seq = [0.0] * n
        records: list[tuple[float, float, str, int, str]] = []  # (start, end, name, op, stream)
        stream_free = {"d2h": 0.0, "h2d": 0.0}
        compute_free = 0.0
        stall = 0.0
        compute_time = 0.0
        transfer_time = 0.0
        pending_transfers = [i for i in order if is_transfer[i]]
        waiting = [0] * n
        dependents: dict[int, list[int]] = {}
        for i in pending_transfers:
            waiting[i] = len(preds[i])
            for p in preds[i]:
                dependents.setdefault(p, []).append(i)
        copy_time_s = profile.copy_time_s

        def release(deps: list[int], seq: float) -> None:
            """Start the transfers that waited only for an op that just finished (in order of position)."""
            nonlocal transfer_time
            ready = []
            for dep in deps:
                waiting[dep] -= 1
                if waiting[dep] == 0:
                    ready.append(dep)
            if len(ready) > 1:
                ready.sort(key=position.__getitem__)
            for i in ready:
                direction = "h2d" if dev[i] == ACCEL else "d2h"
                ready_at = max((end[p] for p in preds[i]), default=0.0)
                t0 = max(ready_at, stream_free[direction])
                duration = copy_time_s(t_info[inputs[i][0]].num_bytes or 0)
                stream_free[direction] = t0 + duration
                transfer_time += duration
                start[i] = t0
                records.append((t0, t0 + duration, names[i], i, direction))
                end[i] = t0 + duration
                event_seq[i] = seq + 0.5
                more = dependents.get(i)
                if more:
                    release(more, seq + 0.5)

        src_ops = net.src_ops
        times = costs._times
        for idx, i in enumerate(order):
            if observed is not None:  # replay: every op at its observed time
                ready_at = max((end[p] for p in preds[i]), default=0.0)
                t0, t1 = observed.get(names[i], (ready_at, ready_at))
                if is_transfer[i]:
                    stream = "h2d" if dev[i] == ACCEL else "d2h"
                    transfer_time += t1 - t0
                else:
                    stream = "host" if dev[i] == HOST else "compute"
                    compute_time += (t1 - t0) if stream == "compute" else 0.0
                start[i], end[i], event_seq[i] = t0, t1, float(idx)
                records.append((t0, t1, names[i], i, stream))
                continue
            if is_transfer[i]:
                continue
            ready_at = 0.0
            latest = -1
            for p in preds[i]:
                e = end[p]
                if e is None:  # a transfer whose own inputs come later cannot happen in a valid order
                    raise GraphError(f"{names[i]!r} depends on {names[p]!r}, which the schedule cannot run before it")
                if latest < 0 or e > ready_at:
                    ready_at, latest = e, p
            if dev[i] == HOST:
                t0 = t1 = ready_at
                records.append((t0, t1, names[i], i, "host"))
            else:
                t0 = compute_free if compute_free > ready_at else ready_at
                if ready_at > compute_free and is_transfer[latest]:
                    stall += ready_at - compute_free
                duration = times.get(i) if src_ops[i] is not None else None
                if duration is None:
                    duration = costs.time_s(i, src_ops[i]) if src_ops[i] is not None else op_time_s(
                        net.graph, _synthetic_op(net, i), profile)
                t1 = compute_free = t0 + duration
                compute_time += duration
                records.append((t0, t1, names[i], i, "compute"))
            start[i] = t0
            end[i] = t1
            event_seq[i] = seq = float(idx)
            deps = dependents.get(i)
            if deps:
                release(deps, seq)
        if observed is None:
            for i in pending_transfers:
                if end[i] is None:
                    raise GraphError(f"transfer {names[i]!r} never became ready (its inputs never ran)")
    else:
        end: list = [None] * n
        start = [0.0] * n
        event_seq = [0.0] * n
        records: list[tuple[float, float, str, int, str]] = []  # (start, end, name, op, stream)
        stall = 0.0
        compute_time = 0.0
        transfer_time = 0.0
        # Events in time order. Compute ops run one at a time in the order; host ops run when their inputs
        # are done; transfers queue on their direction's stream and are served first come (by the time they
        # became ready), first served. ``event_seq`` breaks ties between memory events at one instant: an op's
        # position in the order, and for a transfer the latest sequence of its inputs plus one half.
        remaining = [0] * n
        succs: dict[int, list[int]] = {}
        for i in order:
            p = preds[i]
            remaining[i] = len(p)
            for q in p:
                s_list = succs.get(q)
                if s_list is None:
                    succs[q] = [i]
                else:
                    s_list.append(i)
        ready_at = [0.0] * n
        release_seq = [-1.0] * n
        compute_ops = [i for i in order if not is_transfer[i] and dev[i] != HOST]
        next_compute = 0
        compute_free = 0.0
        stream_free = {"d2h": 0.0, "h2d": 0.0}
        waiting: dict[str, list] = {"d2h": [], "h2d": []}  # heaps of (ready, release seq, position, op)
        heap: list = []  # (time, seq, kind, op, direction): kind 0 = an op finished, 1 = a stream may start a copy
        heappush, heappop = heapq.heappush, heapq.heappop
        copy_time_s = profile.copy_time_s
        src_ops = net.src_ops
        times = costs._times
        inf = float("inf")
        for i in order:
            if remaining[i] == 0 and dev[i] == HOST and not is_transfer[i]:
                start[i] = end[i] = 0.0
                event_seq[i] = float(position[i])
                records.append((0.0, 0.0, names[i], i, "host"))
                heappush(heap, (0.0, event_seq[i], 0, i, ""))
        while True:
            while next_compute < len(compute_ops) and remaining[compute_ops[next_compute]] == 0:
                i = compute_ops[next_compute]
                next_compute += 1
                ready = 0.0
                latest = -1
                for p in preds[i]:
                    e = end[p]
                    if latest < 0 or e > ready:
                        ready, latest = e, p
                t0 = compute_free if compute_free > ready else ready
                if ready > compute_free and is_transfer[latest]:
                    stall += ready - compute_free
                duration = times.get(i) if src_ops[i] is not None else None
                if duration is None:
                    duration = costs.time_s(i, src_ops[i]) if src_ops[i] is not None else op_time_s(
                        net.graph, _synthetic_op(net, i), profile)
                t1 = compute_free = t0 + duration
                compute_time += duration
                records.append((t0, t1, names[i], i, "compute"))
                start[i] = t0
                end[i] = t1
                event_seq[i] = float(position[i])
                heappush(heap, (t1, event_seq[i], 0, i, ""))
            if not heap:
                break
            now, _, kind, i, direction = heappop(heap)
            if kind == 1:
                queue = waiting[direction]
                while queue and max(queue[0][0], stream_free[direction]) <= now:
                    ready, rseq, _, j = heappop(queue)
                    t0 = max(ready, stream_free[direction])
                    duration = copy_time_s(t_info[inputs[j][0]].num_bytes or 0)
                    stream_free[direction] = t0 + duration
                    transfer_time += duration
                    start[j] = t0
                    end[j] = t0 + duration
                    event_seq[j] = rseq + 0.5
                    records.append((t0, t0 + duration, names[j], j, direction))
                    heappush(heap, (end[j], event_seq[j], 0, j, ""))
                if queue:
                    heappush(heap, (max(queue[0][0], stream_free[direction]), inf, 1, -1, direction))
                continue
            e_i, s_i = end[i], event_seq[i]
            for j in succs.get(i, ()):
                if e_i > ready_at[j]:
                    ready_at[j] = e_i
                if s_i > release_seq[j]:
                    release_seq[j] = s_i
                remaining[j] -= 1
                if remaining[j]:
                    continue
                if is_transfer[j]:
                    d = "h2d" if dev[j] == ACCEL else "d2h"
                    heappush(waiting[d], (ready_at[j], release_seq[j], position[j], j))
                    heappush(heap, (max(ready_at[j], stream_free[d]), inf, 1, -1, d))
                elif dev[j] == HOST:
                    t = ready_at[j]
                    start[j] = end[j] = t
                    event_seq[j] = float(position[j])
                    records.append((t, t, names[j], j, "host"))
                    heappush(heap, (t, event_seq[j], 0, j, ""))
        for i in order:
            if end[i] is None:
                blocked = [names[p] for p in preds[i] if end[p] is None]
                raise GraphError(f"{names[i]!r} never ran: it waits for {blocked[:3]}, which the schedule cannot "
                                 "run before it")
    step_time = max((end[i] for i in order), default=0.0)

    # ----------------------------------------------------------- forwarding
    # An element-wise op reuses an input buffer when nothing else holds a reference to it:
    # it is the buffer's last reader in the order and every other reader has ended by the
    # time it starts (a concurrent reader, e.g. a copy still running, keeps its reference).
    # Function outputs are read by the caller after the last op (never forwarded).
    readers: dict[int, list[int]] = {}  # buffer -> the ops reading it, in order
    for i in order:
        for t in inputs[i]:
            o = buffer_of[t]
            r = readers.get(o)
            if r is None:
                readers[o] = [i]
            else:
                r.append(i)
    last_reader: dict[int, int] = {buf: position[rs[-1]] for buf, rs in readers.items()}
    for t in outputs:
        if in_order[t]:
            last_reader[buffer_of[t]] = len(order)
    if options.model_forwarding:
        for i in order:
            if types[i] not in FORWARDING_OPS or n_out[i] != 1 or is_transfer[i]:
                continue
            own = out_start[i]
            out = t_info[own]
            if not out.num_bytes:
                continue
            pos_i, start_i, dev_i = position[i], start[i], dev[i]
            for t in inputs[i]:
                buf = owner_of(t)
                info = t_info[buf]
                if (not resident[buf] and not variable_reads[buf] and dev[t_op[buf]] == dev_i
                        and last_reader.get(buf) == pos_i and info.num_bytes == out.num_bytes
                        and info.dtype == out.dtype
                        and all(end[r] <= start_i for r in readers[buf] if r != i)):
                    buffer_of[own] = buf
                    # The forwarded output's readers now read ``buf``: it lives as long as they do.
                    last_reader[buf] = max(last_reader[buf], last_reader.get(own, -1))
                    readers[buf].extend(readers.pop(own, ()))
                    break
    # Resolve the chains forwarding made; ``readers`` is keyed by final owners already.
    for t in range(num_tensors):
        o = buffer_of[t]
        if o != t and buffer_of[o] != o:
            owner_of(t)

    # ----------------------------------------------------------- memory events
    events: list[tuple[float, float, int, int, int, str]] = []  # (time, seq, phase, tensor id, delta, device)
    tensor_names: list[str] = []
    resident_bytes = _resident_variable_bytes(net, alive)
    host_resident = 0
    output_owners = {buffer_of[t] for t in outputs if in_order[t]}
    workspaces = options.workspace_bytes_per_element
    inf = float("inf")
    for op in order:  # owners in order of (position, output index)
        s = out_start[op]
        for buf in range(s, s + n_out[op]):
            if buffer_of[buf] != buf:
                continue
            info = t_info[buf]
            size = info.num_bytes or 0
            if size == 0 or variable_reads[buf]:
                continue
            if workspaces:
                per_element = workspaces.get(types[op], 0)
                if per_element and buf == s and info.dtype in DTYPE_BYTES:
                    size += int(per_element * size // DTYPE_BYTES[info.dtype])
            d = dev[op]
            if resident[buf]:
                if d == ACCEL:
                    resident_bytes += size
                else:
                    host_resident += size
                continue
            tid = len(tensor_names)
            tensor_names.append(f"{names[op]}:{buf - s}")
            users = readers.get(buf)
            if buf in output_owners:
                t_free, seq_free = step_time, inf
            elif users:
                last = users[0]
                t_free, seq_free = end[last], event_seq[last]
                for u in users:
                    e = end[u]
                    if e > t_free or (e == t_free and event_seq[u] > seq_free):
                        t_free, seq_free = e, event_seq[u]
            else:
                t_free, seq_free = end[op], event_seq[op]
            events.append((start[op], event_seq[op] - (0.25 if is_transfer[op] else 0.0), 0, tid, size, d))
            events.append((t_free, seq_free, 1, tid, -size, d))
    # Ties of (time, seq, phase) keep tensor order (the order events were made in).
    events.sort()
    live_accel, live_host = resident_bytes, host_resident
    peak, peak_index, peak_time, host_peak = live_accel, -1, 0.0, live_host
    timeline = [(0.0, live_accel, live_host)]
    append = timeline.append
    for k, (t, _, _, _, delta, d) in enumerate(events):
        if d == ACCEL:
            live_accel += delta
            if live_accel > peak:
                peak, peak_index, peak_time = live_accel, k, t
        else:
            live_host += delta
            if live_host > host_peak:
                host_peak = live_host
        append((t, live_accel, live_host))
    first_event: dict[int, int] = {}
    lifetimes = []
    for k, (_, _, phase, tid, delta, d) in enumerate(events):
        if d != ACCEL:
            continue
        if phase == 0:
            first_event[tid] = k
        else:
            lifetimes.append((tensor_names[tid], -delta, first_event[tid], max(first_event[tid], k - 1)))
    lifetimes.sort(key=lambda lt: (lt[2], lt[0]))
    alive_at: dict[int, int] = {}
    for _, _, phase, tid, delta, d in events[:peak_index + 1]:
        if d != ACCEL:
            continue
        if phase == 0:
            alive_at[tid] = delta
        else:
            alive_at.pop(tid, None)
    live_at_peak = tuple(sorted(((tensor_names[k], v) for k, v in alive_at.items()), key=lambda kv: (-kv[1], kv[0])))
    margin = int(peak * options.margin_fraction) + options.margin_bytes
    records.sort()  # (start, end, name): names are unique
    op_records = tuple(OpRecord(name, dev[i], stream, t0, t1) for t0, t1, name, i, stream in records)
    buffer_owner = {net.tensor_name(t): net.tensor_name(buffer_of[t]) for t in range(num_tensors)
                    if in_order[t] and buffer_of[t] != t}
    return SimResult(
        profile=profile.name, peak_bytes=peak, resident_bytes=resident_bytes,
        transient_peak_bytes=peak - resident_bytes, peak_with_margin_bytes=peak + margin, peak_time_s=peak_time,
        live_at_peak=live_at_peak, host_peak_bytes=host_peak, step_time_s=step_time, compute_time_s=compute_time,
        transfer_time_s=transfer_time, stall_time_s=stall, timeline=tuple(timeline), ops=op_records,
        unknown_size_tensors=tuple(unknown), buffer_owner=buffer_owner, buffer_lifetimes=tuple(lifetimes))


def _synthetic_op(net: IndexedGraph, i: int) -> Op:
    """An IR op standing for op ``i`` of ``net`` (one the simulator added), to cost it."""
    return Op(net.names[i], net.types[i], "", [TensorRef(net.names[net.t_op[t]], net.t_idx[t]) for t in net.inputs[i]],
              [], {}, tuple(net.t_info[net.out_start[i] + k] for k in range(net.n_out[i])))


def simulate(graph: Graph, profile: str | HardwareProfile, *, order: Sequence[str] | None = None,
             options: SimOptions | None = None, output_names: Sequence[str] | None = None,
             observed: Mapping[str, tuple[float, float]] | None = None) -> SimResult:
    """Simulate one step of ``graph`` (see module doc); ``order`` defaults to CTO levels.

    ``order`` may also list ops that do not run (unused ops, see ``SimOptions.prune_unused``).
    ``observed`` replays a measured run: ``{op: (start_s, end_s)}`` replaces the profile's
    timing for the ops it lists (an op it does not list takes no time and starts when its
    inputs are done); ``order`` then defaults to the observed start order.
    """
    profile = get_profile(profile)
    options = options or SimOptions()
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
    with gc_paused():
        return _run(net, order_ids, position, outputs, profile, options, OpCosts(graph, profile), alive,
                    observed=observed)


def compare(original: SimResult, rewritten: SimResult) -> Mapping[str, float]:
    """Peak saved and time overhead of a rewrite."""
    return {"peak_saved_bytes": original.peak_bytes - rewritten.peak_bytes,
            "peak_ratio": rewritten.peak_bytes / original.peak_bytes if original.peak_bytes else 1.0,
            "overhead": rewritten.overhead_vs(original)}

