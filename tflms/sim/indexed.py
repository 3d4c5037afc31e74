"""The graph in index form (:class:`IndexedGraph`) and what the simulator derives from it before it runs:
the ops a step needs, TensorFlow's implicit cross-device copies, resident variable bytes, op costs.

The model is in the module doc of :mod:`tflms.sim.simulator`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress

from tflms.devices import normalize_device
from tflms.errors import ConfigError
from tflms.ir.graph import Graph, Op, TensorInfo, TensorRef
from tflms.ir.consts import is_view_transpose
from tflms.ir.op_types import VARIABLE_READ_OPS
from tflms.sim.cost import op_launches, op_time_s
from tflms.profiles import HardwareProfile


ACCEL, HOST = "accelerator", "host"


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
#: The type a transpose that moves no data (:func:`~tflms.ir.consts.is_view_transpose`) has in the simulator: a view of
#: its first input with a second, integer input, as a ``Reshape`` is.
VIEW_TRANSPOSE_TYPE = "Reshape"
#: dtypes without a device buffer of their own (handles, host data): never copied, never counted.
_NO_BUFFER_DTYPES = frozenset({"resource", "variant", "string"})


class Origin:
    """What the copies of one :meth:`IndexedGraph.from_graph` net share, compared by identity: how many ops it had
    (``ops``: below that, every copy's ops are its ops), and what the simulator worked out from those ops' types
    alone, kept by the stage that did (``memo``: :class:`tflms.sim.buffers._Buffers`)."""

    __slots__ = ("ops", "memo")

    def __init__(self, ops: int):
        self.ops = ops
        self.memo: dict = {}


class IndexedGraph:
    """A graph as flat lists over integer op ids and tensor ids: what the simulator's inner loops read.

    Op ``i`` has ``names[i]``, ``types[i]``, ``dev[i]`` (:data:`ACCEL` or :data:`HOST`), data
    inputs ``inputs[i]`` (tensor ids), control inputs ``ctrl[i]`` (op ids), ``preds[i]`` (data then
    control predecessors, deduplicated, like :meth:`Graph.predecessors`) and outputs
    ``out_start[i] .. out_start[i] + n_out[i] - 1``. Tensor ``t`` is output ``t_idx[t]`` of op
    ``t_op[t]`` with facts ``t_info[t]``; ``unsized`` lists, in id order, the tensors whose size is
    unknown (no ``num_bytes``) though their dtype has a buffer. Op ids follow graph order, so sorting by id is
    sorting by graph position. ``src_ops[i]`` is the IR :class:`Op` an op came from (``None`` for ops the
    simulator adds), used only to cost it. ``origin`` (:class:`Origin`) stands for the net :meth:`from_graph` built:
    every copy shares it, and only appends ops or replaces the per-op lists of inputs, so the ops below its count
    are the same ops in every net sharing it, and what the simulator works out from an op's type and prices alone
    can be kept for them at once (:func:`~tflms.sim.clock.graph_kernels`).

    Built once per graph (:meth:`from_graph`); :class:`tflms.tune.evaluator.PlanEvaluator` derives
    one per swap plan from a base graph's by copying the lists and appending the swap ops, instead
    of copying the IR.
    """

    __slots__ = ("names", "types", "dev", "inputs", "ctrl", "preds", "out_start", "n_out", "t_op", "t_idx",
                 "t_info", "unsized", "src_ops", "graph", "origin")

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
        self.unsized: list[int] = []
        self.src_ops: list = []
        self.graph: Graph | None = None
        self.origin = Origin(0)

    @classmethod
    def from_graph(cls, graph: Graph, host: str) -> "IndexedGraph":
        net = cls()
        net.graph = graph
        op_id: dict[str, int] = {}
        ops = graph.ops
        for i, op in enumerate(ops):
            op_id[op.name] = i
            net.names.append(op.name)
            # (a transpose that moves no data is the view it is: tflms.ir.consts)
            net.types.append(VIEW_TRANSPOSE_TYPE if is_view_transpose(graph, op) else op.type)
            net.dev.append(_device_class(op.device, host))
            net.out_start.append(len(net.t_op))
            net.n_out.append(len(op.outputs))
            for k, info in enumerate(op.outputs):
                if info.num_bytes is None and info.dtype not in _NO_BUFFER_DTYPES:
                    net.unsized.append(len(net.t_op))
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
        net.origin = Origin(len(ops))
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
            if info.num_bytes is None and info.dtype not in _NO_BUFFER_DTYPES:
                self.unsized.append(len(self.t_op))
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


def positions(order: Sequence[int], n: int) -> list[int]:
    """By op id (``n`` of them) its position in ``order``, -1 for an op not in it."""
    position = [-1] * n
    for k, i in enumerate(order):
        position[i] = k
    return position


def _indices(values: list | bytearray, value: object) -> list[int]:
    """Where ``value`` is in ``values`` (``list.index`` scans: fast where it is rare)."""
    found: list[int] = []
    k = -1
    try:
        while True:
            k = values.index(value, k + 1)
            found.append(k)
    except ValueError:
        return found


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
        stack.extend(preds[i])  # (those needed already are skipped when popped)
    return needed


def successor_counts(net: IndexedGraph, alive: Sequence[bool]) -> list[int]:
    """By op id, how many ``alive`` ops list it among their predecessors (what :func:`still_needed` starts from)."""
    count = [0] * len(net.names)
    preds = net.preds
    for i in compress(range(len(alive)), alive):
        for p in preds[i]:
            count[p] += 1
    return count


def still_needed(net: IndexedGraph, base_preds: Sequence[Sequence[int]], alive: Sequence[bool],
                 count: Sequence[int], roots: Sequence[int], changed: Iterable[int]) -> list[bool]:
    """:func:`_needed` of ``net``, a base net with ops appended and the predecessors of the base ops ``changed``
    replaced, from the base's answer: ``alive`` (:func:`_needed` of the base), ``count`` (its
    :func:`successor_counts`), ``base_preds`` (the base's predecessor lists) and its ``roots``.

    The edges that changed are counted (an op an alive one newly reads is revived, with what it reads in turn), then
    an op no alive op reads any more and no root is leaves, and with it what only it read: on a graph without cycles
    what stays is what the roots need, as a search from them finds (a reference count). A tune's recompute plans
    re-run a few hundred ops of thousands, and the search from the roots was a twentieth of each simulation."""
    n0, n = len(alive), len(net.names)
    alive = list(alive) + [True] * (n - n0)
    count = list(count) + [0] * (n - n0)
    preds = net.preds
    revive: list[int] = []
    unread: list[int] = []
    for c in dict.fromkeys(changed):
        if alive[c]:
            for p in base_preds[c]:
                count[p] -= 1
                unread.append(p)
            for p in preds[c]:
                count[p] += 1
                if not alive[p]:
                    revive.append(p)
    for j in range(n0, n):
        unread.append(j)
        for p in preds[j]:
            count[p] += 1
            if not alive[p]:
                revive.append(p)
    while revive:
        r = revive.pop()
        if alive[r]:
            continue
        alive[r] = True
        for p in preds[r]:
            count[p] += 1
            if not alive[p]:
                revive.append(p)
    is_root = set(roots)
    while unread:
        x = unread.pop()
        if not alive[x] or count[x] or x in is_root:
            continue
        alive[x] = False
        for p in preds[x]:
            count[p] -= 1
            if not count[p]:
                unread.append(p)
    return alive


def _recv_needs(net: IndexedGraph, ops: Iterable[int], alive: Sequence[bool]) -> dict[int, list[tuple[int, int]]]:
    """Host tensors that accelerator ops among ``ops`` read: ``{tensor: [(consumer, input index)]}``."""
    needs: dict[int, list[tuple[int, int]]] = {}
    dev, types, inputs, t_info = net.dev, net.types, net.inputs, net.t_info
    out_start, n_out = net.out_start, net.n_out
    host = set()  # the host's tensors that have a buffer (host ops are few: ``list.index`` finds them)
    h = -1
    try:
        while True:
            h = dev.index(HOST, h + 1)
            host.update(t for t in range(out_start[h], out_start[h] + n_out[h])
                        if t_info[t].dtype not in _NO_BUFFER_DTYPES)
    except ValueError:
        pass
    if not host:
        return needs
    reads_none = host.isdisjoint
    for i in ops:
        if not alive[i] or dev[i] != ACCEL or types[i] == "DeepCopy" or reads_none(inputs[i]):
            continue
        for k, t in enumerate(inputs[i]):
            if t in host:
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


def _resident_variable_bytes(net: IndexedGraph, alive: Sequence[bool]) -> int:
    """:func:`~tflms.sim.simulator.variable_bytes` summed, over the alive ops of ``net``."""
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

    def __init__(self, graph: Graph, profile: HardwareProfile, known_s: Mapping[str, float] | None = None,
                 names: Sequence[str] | None = None):
        self.graph, self.profile = graph, profile
        self._known = known_s or {}  # op name -> seconds, priced already on this profile (e.g. a base graph's)
        # by op id where ``names`` (the ids' op names) are given: the simulator's loop reads ``_times`` first
        self._times: dict[int, float] = {} if names is None or not self._known else {
            i: t for i, t in enumerate(map(self._known.get, names)) if t is not None}

    def launches_memo(self) -> dict[int, tuple[Op, float]]:
        """:meth:`launches_s`' memo: op id -> (the op priced, its launch seconds)."""
        return self.__dict__.setdefault("_launches", {})

    def graph_clock_memo(self) -> dict[int, tuple[Op, float, float, bool]]:
        """:func:`~tflms.sim.clock.graph_kernels`' memo: op id -> (the op priced, its time on the stream, its host
        launch seconds, whether it is a kernel)."""
        return self.__dict__.setdefault("_graph_clock", {})

    def launches_s(self, op_id: int, op, launch_s: float) -> float:
        """The host's launch time of op ``op_id`` (``op``): ``launch_s`` per kernel it launches
        (:func:`~tflms.sim.cost.op_launches`), computed once per op, as :meth:`time_s` is."""
        memo = self.launches_memo()
        hit = memo.get(op_id)
        if hit is None or hit[0] is not op:  # (an id a plan appended may be another op in the next plan)
            hit = memo[op_id] = (op, launch_s * op_launches(op, self.profile))
        return hit[1]

    def time_s(self, op_id: int, op) -> float:
        t = self._times.get(op_id)
        if t is None:
            t = self._known.get(op.name)
            if t is None:
                t = op_time_s(self.graph, op, self.profile)
            self._times[op_id] = t
        return t


def _synthetic_op(net: IndexedGraph, i: int) -> Op:
    """An IR op standing for op ``i`` of ``net`` (one the simulator added), to cost it."""
    return Op(net.names[i], net.types[i], "", [TensorRef(net.names[net.t_op[t]], net.t_idx[t]) for t in net.inputs[i]],
              [], {}, tuple(net.t_info[net.out_start[i] + k] for k in range(net.n_out[i])))
