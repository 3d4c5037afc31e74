"""The accelerator-memory model the scheduler optimizes, as the simulator counts memory.

:func:`buffer_model` reduces a graph to integer-indexed ops and *buffers* with the
rules of :mod:`tflms.sim.simulator` (its module doc is the reference):

- only ops the function's outputs and control outputs need run (``prune_unused``);
- an alias op (``Identity`` on one device, ``Reshape``, ...) shares its input's buffer, and so does a
  reduction that reduces nothing (:data:`~tflms.ir.op_types.IDENTITY_REDUCTION_OPS`);
  variable reads, constants and fed arguments are resident, not step memory;
- a buffer is allocated when the op producing it runs and freed when the last op
  reading it (directly or through an alias) has run; a function output lives to the end;
- an element-wise op (:data:`~tflms.sim.simulator.FORWARDING_OPS`) writes into an input
  buffer of its output's dtype and size when it is that buffer's last reader;
- host ops and copies between devices take no compute-stream time: they run when their
  inputs are ready (*eager*). A swap-out (host copy of an accelerator tensor) is one more
  reader of the device buffer; an accelerator op reading a host tensor gets it through
  TensorFlow's implicit ``_Recv``, a device buffer allocated when the host tensor's op
  runs (for a tflms swap-in: when its trigger has run).

The model is sequential (one compute op at a time, copies instantaneous); the
simulator adds time. :func:`replay_peak` gives a model order's peak.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence

from tflms.devices import normalize_device
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.ir.merges import merge_cycle, merge_groups, merge_unit_edges
from tflms.ir.op_types import (ALIAS_OPS, CONSTANT_OPS, COPY_OPS, FORWARDING_OPS, IDENTITY_REDUCTION_OPS, SOURCE_OPS,
                               VARIABLE_READ_OPS, trivial_reduction)
from tflms.sim.simulator import SimOptions, variable_bytes

_NO_SIZE_DTYPES = ("resource", "variant", "string")


def is_host(device: str, host_device: str) -> bool:
    """Whether ``device`` is the host device (the simulator's device classes)."""
    if not device:
        return False
    try:
        local = normalize_device(device, field="device").rpartition("/device:")[2]
    except ConfigError:
        return False
    return local == host_device.rpartition("/device:")[2]


@dataclasses.dataclass
class BufferModel:
    """A graph as the scheduler sees it; ops and buffers are integers.

    ``names[i]`` is op ``i`` (graph order). ``preds``/``succs``: data and control
    edges. ``needed[i]``: op ``i`` runs. ``eager[i]``: a host op, a copy between
    devices or an op that does not run: it takes no compute-stream time and runs
    as soon as it is ready. ``allocs[i]``: device buffers op ``i`` allocates;
    ``reads[i]``: device buffers it reads (distinct). ``size[b]``, ``dtype[b]``,
    ``readers[b]`` (distinct needed ops), ``pinned[b]`` (a function output).
    ``forward_out[i]``: for an element-wise op, the buffer it would allocate for its
    output (which it may take from a dying input instead), else ``-1``.
    """

    names: list[str]
    index: dict[str, int]
    preds: list[list[int]]
    succs: list[list[int]]
    needed: list[bool]
    eager: list[bool]
    on_accelerator: list[bool]
    allocs: list[list[int]]
    reads: list[list[int]]
    size: list[int]
    dtype: list[str]
    readers: list[list[int]]
    pinned: list[bool]
    forward_out: list[int]
    resident_bytes: int
    buffer_names: list[str]
    transfer: list[bool] = dataclasses.field(default_factory=list)  # by op: a copy between devices
    recv: list[bool] = dataclasses.field(default_factory=list)  # by buffer: TensorFlow's implicit _Recv
    #: :func:`timed_replay`'s durations by profile, ``{profile: (graph, durations, recv, direction)}``: the
    #: heuristics and their judge replay one model several times on one profile
    timings: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.names)


def needed_ops(graph: Graph, options: SimOptions, predecessors: Mapping[str, list[str]] | None = None) -> set[str]:
    """Ops that run: the fan-in of the function's outputs and control outputs (all ops without a signature).
    ``predecessors``: ``graph.adjacency()[0]``, where the caller has it."""
    sig = graph.signature
    if sig is None or not options.prune_unused:
        return {op.name for op in graph}
    if predecessors is None:
        predecessors = graph.adjacency()[0]
    roots = [TensorRef.parse(n).op for n in sig.output_names] + list(sig.control_output_names)
    needed: set[str] = set()
    stack = [r for r in roots if r in graph]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(predecessors[name])  # (those needed already are skipped when popped)
    return needed


def _add_merge_unit_edges(graph: Graph, preds: list[list[int]], succs: list[list[int]], index: dict[str, int],
                          adjacency) -> None:
    """Make each op that oneDNN merges with another wait for the other's inputs too (:mod:`tflms.ir.merges`).

    Every order the scheduler builds then keeps the merged node runnable: no edge the order pass derives from it
    leads from one member to another. A graph that already closes such a cycle is left as it is (``lint`` names it).
    """
    pairs = merge_groups(graph)
    if not pairs or merge_cycle(graph, pairs, adjacency) is not None:
        return
    for before, after in merge_unit_edges(graph, pairs):
        b, a = index[before], index[after]
        preds[a].append(b)
        succs[b].append(a)


def buffer_model(graph: Graph, options: SimOptions | None = None) -> BufferModel:
    """The memory model of ``graph`` (see the module doc)."""
    options = options or SimOptions()
    host = options.host_device
    ops = graph.ops
    names = [op.name for op in ops]
    index = {n: i for i, n in enumerate(names)}
    preds_n, succs_n = graph.adjacency()
    preds = [[index[p] for p in preds_n[n]] for n in names]
    succs = [[index[s] for s in succs_n[n]] for n in names]
    _add_merge_unit_edges(graph, preds, succs, index, (preds_n, succs_n))
    needed_set = needed_ops(graph, options, preds_n)
    needed = [n in needed_set for n in names]
    on_accel = [not is_host(op.device, host) for op in ops]
    crosses = [op.type in COPY_OPS and bool(op.inputs) and on_accel[index[op.inputs[0].op]] != on_accel[i]
               for i, op in enumerate(ops)]
    # A copy on the accelerator of a host tensor other than DeepCopy reads TensorFlow's _Recv: an alias of it.
    reads_recv = [crosses[i] and on_accel[i] and op.type != "DeepCopy" for i, op in enumerate(ops)]
    is_transfer = [crosses[i] and not reads_recv[i] for i in range(len(ops))]
    eager = [not needed[i] or not on_accel[i] or is_transfer[i] for i in range(len(ops))]

    # Tensors are (op name, output index) tuples here: hashing them is much cheaper than TensorRefs.
    alias_of: dict[tuple[str, int], tuple[str, int]] = {}
    resident_refs: set[tuple[str, int]] = set()
    for i, op in enumerate(ops):  # graph order is not topological in general: resolve owners lazily below
        if op.type in VARIABLE_READ_OPS:
            resident_refs.add((op.name, 0))
        elif (op.type in SOURCE_OPS and options.resident_inputs) or op.type in CONSTANT_OPS:
            resident_refs.update((op.name, k) for k in range(len(op.outputs)))
        elif op.type in ALIAS_OPS and op.inputs:
            src = op.inputs[0]
            if (on_accel[index[src.op]] == on_accel[i] or op.type not in COPY_OPS) and not reads_recv[i]:
                for k in range(len(op.outputs)):
                    ref = op.inputs[min(k, len(op.inputs) - 1)]
                    alias_of[(op.name, k)] = (ref.op, ref.index)
        elif (op.type in IDENTITY_REDUCTION_OPS and op.inputs and len(op.outputs) == 1
              and trivial_reduction(graph.tensor(op.inputs[0]), op.outputs[0])):
            alias_of[(op.name, 0)] = (op.inputs[0].op, op.inputs[0].index)

    def root(ref: tuple[str, int]) -> tuple[str, int]:
        seen = []
        while ref in alias_of:
            seen.append(ref)
            ref = alias_of[ref]
        for r in seen[:-1]:
            alias_of[r] = ref
        return ref

    resident_bytes = sum(variable_bytes(graph).values())
    buf_id: dict[tuple[str, int], int] = {}
    size: list[int] = []
    dtype: list[str] = []
    buffer_names: list[str] = []
    allocs: list[list[int]] = [[] for _ in ops]

    def new_buffer(name: str, nbytes: int, dt: str, by: int) -> int:
        b = len(size)
        size.append(nbytes)
        dtype.append(dt)
        buffer_names.append(name)
        allocs[by].append(b)
        return b

    for i, op in enumerate(ops):
        if not needed[i]:
            continue
        for k, info in enumerate(op.outputs):
            ref = (op.name, k)
            if ref in resident_refs:
                if on_accel[i] and op.type not in VARIABLE_READ_OPS:
                    resident_bytes += info.num_bytes or 0
                continue
            if ref in alias_of or not on_accel[i] or not info.num_bytes:
                continue
            buf_id[ref] = new_buffer(f"{op.name}:{k}", info.num_bytes, info.dtype, i)

    # Implicit _Recv of host tensors read by accelerator ops (DeepCopy swap-ins are explicit copies).
    recv_id: dict[tuple[str, int], int] = {}
    for i, op in enumerate(ops):
        if not needed[i] or not on_accel[i] or op.type == "DeepCopy":
            continue
        for ref in op.inputs:
            key = (ref.op, ref.index)
            if on_accel[index[ref.op]] or key in recv_id:
                continue
            info = graph.tensor(ref)
            if info.dtype not in _NO_SIZE_DTYPES and info.num_bytes:
                recv_id[key] = new_buffer(ref.name + "/_recv", info.num_bytes, info.dtype, index[ref.op])
        first = (op.inputs[0].op, op.inputs[0].index) if op.inputs else None
        if reads_recv[i] and first in recv_id:
            for k in range(len(op.outputs)):
                buf_id[(op.name, k)] = recv_id[first]
    reads: list[list[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        if not needed[i]:
            continue
        seen: set[int] = set()
        for ref in op.inputs:
            key = (ref.op, ref.index)
            if on_accel[i] and not on_accel[index[ref.op]] and op.type != "DeepCopy":
                b = recv_id.get(key, -1)
            else:
                b = buf_id.get(root(key), -1)
            if b >= 0 and b not in seen:
                seen.add(b)
                reads[i].append(b)
    recv_set = set(recv_id.values())
    readers: list[list[int]] = [[] for _ in size]
    for i in range(len(ops)):
        for b in reads[i]:
            readers[b].append(i)
    pinned = [False] * len(size)
    sig = graph.signature
    for name in (sig.output_names if sig is not None else ()):
        ref = TensorRef.parse(name)
        if ref.op in index:
            b = buf_id.get(root((ref.op, ref.index)), -1)
            if b >= 0:
                pinned[b] = True
    forward_out = [-1] * len(ops)
    if options.model_forwarding:
        for i, op in enumerate(ops):
            if op.type in FORWARDING_OPS and len(op.outputs) == 1 and not eager[i] and len(allocs[i]) == 1:
                forward_out[i] = allocs[i][0]
    return BufferModel(names=names, index=index, preds=preds, succs=succs, needed=needed, eager=eager,
                       on_accelerator=on_accel, allocs=allocs, reads=reads, size=size, dtype=dtype,
                       readers=readers, pinned=pinned, forward_out=forward_out, resident_bytes=resident_bytes,
                       buffer_names=buffer_names, transfer=is_transfer,
                       recv=[b in recv_set for b in range(len(size))])


def eager_asap(m: BufferModel, order: Sequence[int]) -> list[int]:
    """``order`` with every eager op (host op, copy, pruned op) moved up to run as soon as its inputs ran.

    TensorFlow and the simulator run those when they are ready, whatever their place in a list; a list
    that names one later (after a compute op that waits for a copy) would make the timed model count its
    ``_Recv`` after memory that was freed meanwhile (VGG-16's ``block1`` swap-ins: 15.8 GiB judged,
    19.6 GiB simulated). Compute ops keep their relative order.
    """
    rank = [0] * len(m)
    for k, i in enumerate(order):
        rank[i] = k
    indegree = [len(p) for p in m.preds]
    heap = [(-1 if m.eager[i] else rank[i], i) for i in range(len(m)) if indegree[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for s in m.succs[i]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(heap, (-1 if m.eager[s] else rank[s], s))
    if len(out) != len(m):
        raise GraphError("the graph has a cycle; no execution order exists")
    return out


class Replay:
    """Runs ops of a :class:`BufferModel` one at a time and tracks live device bytes.

    ``remaining[b]``: readers of buffer ``b`` not yet run. ``alias[b]``: the buffer
    ``b`` was forwarded into (its readers are then that buffer's readers).
    """

    def __init__(self, model: BufferModel) -> None:
        self.m = model
        self.remaining = [len(r) for r in model.readers]
        self.done = [False] * len(model)
        self.alias = list(range(len(model.size)))
        self.live = 0
        self.peak = 0
        self.peak_op = -1
        self.pinned = list(model.pinned)

    def owner(self, b: int) -> int:
        while self.alias[b] != b:
            b = self.alias[b]
        return b

    def forward_source(self, i: int) -> int:
        """The dying input buffer op ``i`` would write its output into, or ``-1``."""
        out = self.m.forward_out[i]
        if out < 0:
            return -1
        m = self.m
        for b in m.reads[i]:
            o = self.owner(b)
            if (self.remaining[o] == 1 and not self.pinned[o] and m.size[o] == m.size[out]
                    and m.dtype[o] == m.dtype[out]):
                return o
        return -1

    def net_bytes(self, i: int, end: float | None = None) -> tuple[int, int]:
        """``(allocated, freed)`` device bytes if op ``i`` ran now.

        With ``end`` (the timed model), a buffer whose last read ends after ``end`` is not freed.
        """
        m = self.m
        fwd = self.forward_source(i)
        alloc = sum(m.size[b] for b in m.allocs[i])
        freed = 0
        for b in m.reads[i]:
            o = self.owner(b)
            if (self.remaining[o] == 1 and not self.pinned[o] and o != fwd
                    and (end is None or self.last_end[o] <= end)):
                freed += m.size[o]
        if fwd >= 0:
            alloc -= m.size[m.forward_out[i]]
        return alloc, freed

    def _forward(self, i: int, new: list[int]) -> list[int]:
        """Let op ``i`` write into the dying input it may forward (if any); ``new`` without its output then."""
        fwd = self.forward_source(i)
        if fwd < 0:
            return new
        out = self.m.forward_out[i]
        self.alias[out] = fwd
        # the forwarded buffer now also serves the output's readers
        self.remaining[fwd] += self.remaining[out]
        self.pinned[fwd] = self.pinned[fwd] or self.pinned[out]
        return [b for b in new if b != out]

    def run(self, i: int) -> list[int]:
        """Run op ``i``; returns the buffers whose remaining reader count dropped to one."""
        m = self.m
        self.done[i] = True
        if not m.needed[i]:
            return []
        new = self._forward(i, m.allocs[i])
        for b in new:
            self.live += m.size[b]
        if self.live > self.peak:
            self.peak, self.peak_op = self.live, i
        last_one: list[int] = []
        for b in m.reads[i]:
            o = self.owner(b)
            self.remaining[o] -= 1
            if self.remaining[o] == 0 and not self.pinned[o]:
                self.live -= m.size[o]
            elif self.remaining[o] == 1:
                last_one.append(o)
        for b in new:
            if self.remaining[b] == 0 and not self.pinned[b]:
                self.live -= m.size[b]
        return last_one


def replay_peak(model: BufferModel, order: Sequence[str] | Sequence[int]) -> int:
    """Peak device bytes (resident included) of running ``order`` in the sequential model."""
    replay = Replay(model)
    pos = {}
    for k, item in enumerate(order):
        i = model.index[item] if isinstance(item, str) else item
        for p in model.preds[i]:
            if p not in pos:
                raise GraphError(f"the order runs {model.names[i]!r} before its input {model.names[p]!r}")
        pos[i] = k
        replay.run(i)
    if len(pos) != len(model):
        missing = sorted(set(model.names) - {model.names[i] for i in pos})[:5]
        raise GraphError(f"the order must list every op exactly once; missing e.g. {missing}")
    return model.resident_bytes + replay.peak
