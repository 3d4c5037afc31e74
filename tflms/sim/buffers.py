"""Where a simulated step's tensors live: which buffer each tensor is (views, forwarding), who reads each buffer, and
the step's memory events (an allocation when a buffer's producer starts, a free when its last reader ends).

The model is in the module doc of :mod:`tflms.sim.simulator`; :mod:`tflms.sim.engine` times the ops these events are
placed by. The loops are tuned for speed: keep function calls out of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress

from tflms.ir.graph import DTYPE_BYTES
from tflms.ir.op_types import (ALIAS_OPS, CONSTANT_OPS, COPY_OPS, FORWARDING_OPS, IDENTITY_REDUCTION_OPS, SOURCE_OPS,
                               VARIABLE_READ_OPS, trivial_reduction)
from tflms.sim.indexed import ACCEL, IndexedGraph, _resident_variable_bytes
from tflms.sim.records import SimOptions


#: The op types whose outputs :class:`_Buffers` places by their type alone (resident or variable reads), and those it
#: places by their inputs (copies between devices, aliases, reductions that may hand back their input): every other
#: op's outputs are buffers of their own. (The two are disjoint.)
_TYPED = VARIABLE_READ_OPS | SOURCE_OPS | CONSTANT_OPS
_BY_INPUTS = COPY_OPS | ALIAS_OPS | IDENTITY_REDUCTION_OPS


class _Buffers:
    """Which buffer each tensor lives in before forwarding, and the facts the later stages read by tensor or op.

    ``position``: by op id its position in ``order`` (-1: not in it; :func:`~tflms.sim.indexed.positions`). The tensors placed by their op's type alone are
    the same in every net sharing an origin (:attr:`IndexedGraph.origin`): they are worked out once for the origin's
    ops (:func:`_typed`), whether or not an op is in the order (the later stages read those facts only for buffers of
    ops in the order), and only the ops placed by their inputs are walked in the order. (Walked op by op, this was a
    tenth of each simulation of a tune.)"""

    __slots__ = ("buffer_of", "in_order", "resident", "variable_reads", "unknown", "is_transfer")

    def __init__(self, net: IndexedGraph, order: Sequence[int], options: SimOptions, position: Sequence[int]):
        types, dev, inputs, t_op, t_info = net.types, net.dev, net.inputs, net.t_op, net.t_info
        out_start, n_out = net.out_start, net.n_out
        n, num_tensors = len(net.names), len(t_op)
        n0 = net.origin.ops
        resident, variable_reads, by_inputs = _typed(net, options.resident_inputs)
        t0 = len(resident)
        # buffer_of[t] is the tensor owning t's buffer; until forwarding it is always resolved (an owner),
        # because an alias takes its input's (resolved) owner and inputs come earlier in the order.
        buffer_of = self.buffer_of = list(range(num_tensors))
        resident = self.resident = resident + [False] * (num_tensors - t0)
        variable_reads = self.variable_reads = variable_reads + [False] * (num_tensors - t0)
        is_transfer = self.is_transfer = [False] * n
        if n > n0:  # the ops appended to the origin's (a plan's): placed as the origin's are
            by_inputs = by_inputs + bytearray(n - n0)
            for i in range(n0, n):
                if position[i] >= 0:
                    _place_typed(types[i], out_start[i], n_out[i], options.resident_inputs, resident, variable_reads)
                    by_inputs[i] = types[i] in _BY_INPUTS
        for i in compress(order, map(by_inputs.__getitem__, order)):
            op_type = types[i]
            s, k = out_start[i], n_out[i]
            ins = inputs[i]
            if op_type in COPY_OPS and ins and dev[t_op[ins[0]]] != dev[i]:
                is_transfer[i] = True
            if op_type in ALIAS_OPS and ins:
                if dev[t_op[ins[0]]] == dev[i] or op_type not in COPY_OPS:
                    last = len(ins) - 1
                    for j in range(k):
                        buffer_of[s + j] = buffer_of[ins[min(j, last)]]
            elif (op_type in IDENTITY_REDUCTION_OPS and ins and k == 1
                  and trivial_reduction(t_info[ins[0]], t_info[s])):
                buffer_of[s] = buffer_of[ins[0]]
        # the outputs of ops in the order
        in_order = self.in_order = list(map((-1).__lt__, map(position.__getitem__, t_op)))
        self.unknown = _unknown_sizes(net, order, in_order)

    def owner_of(self, t: int) -> int:
        buffer_of = self.buffer_of
        owner = buffer_of[t]
        while buffer_of[owner] != owner:
            owner = buffer_of[owner]
        buffer_of[t] = owner
        return owner


def _unknown_sizes(net: IndexedGraph, order: Sequence[int], in_order: Sequence[bool]) -> list[str]:
    """The tensors of the order whose size is unknown (:attr:`IndexedGraph.unsized`), by name, in order (of their op's
    position, then output index)."""
    unsized = [t for t in net.unsized if in_order[t]]
    if len(unsized) > 1:
        t_op = net.t_op
        where = {i: k for k, i in enumerate(order)}
        unsized.sort(key=lambda t: (where[t_op[t]], t))
    return [net.tensor_name(t) for t in unsized]


def _place_typed(op_type: str, s: int, k: int, resident_inputs: bool, resident: list[bool],
                 variable_reads: list[bool]) -> None:
    """Mark the outputs ``s .. s + k - 1`` of an op of type ``op_type`` placed by its type alone (:data:`_TYPED`)."""
    if op_type in VARIABLE_READ_OPS:
        if k:
            variable_reads[s] = True
    elif (op_type in SOURCE_OPS and resident_inputs) or op_type in CONSTANT_OPS:
        for t in range(s, s + k):
            resident[t] = True


def _typed(net: IndexedGraph, resident_inputs: bool) -> tuple[list[bool], list[bool], bytearray]:
    """For the ops of ``net``'s origin (:attr:`IndexedGraph.origin`): by tensor, whether it is resident and whether
    it is a variable read, and by op whether :class:`_Buffers` places its outputs by its inputs (:data:`_BY_INPUTS`);
    worked out once per origin."""
    key = ("buffers", resident_inputs)
    hit = net.origin.memo.get(key)
    if hit is None:
        n0 = net.origin.ops
        types, out_start, n_out = net.types, net.out_start, net.n_out
        t0 = out_start[n0 - 1] + n_out[n0 - 1] if n0 else 0
        resident, variable_reads = [False] * t0, [False] * t0
        for i in range(n0):
            if types[i] in _TYPED:
                _place_typed(types[i], out_start[i], n_out[i], resident_inputs, resident, variable_reads)
        by_inputs = bytearray(map(_BY_INPUTS.__contains__, types[:n0]))
        hit = net.origin.memo[key] = (resident, variable_reads, by_inputs)
    return hit


def _readers(order: Sequence[int], reads: Sequence[Sequence[int]], buffer_of: Sequence[int],
             outputs: Iterable[int], in_order: Sequence[bool], position: Sequence[int],
             n_order: int) -> tuple[list[list[int] | None], list[int]]:
    """By buffer (its owner's tensor id), the ops reading it, in order (``None``: no reader), and the position of its
    last reader (-1: none; the end of the order for a function output, which the caller reads after the last op).
    Lists by tensor id, not dicts: the later stages look them up once per read."""
    readers: list[list[int] | None] = [None] * len(buffer_of)
    read: list[int] = []  # the buffers read, in order of their first reader
    for i in order:
        for t in reads[i]:
            o = buffer_of[t]
            r = readers[o]
            if r is None:
                readers[o] = [i]
                read.append(o)
            else:
                r.append(i)
    last_reader = [-1] * len(buffer_of)
    for o in read:
        last_reader[o] = position[readers[o][-1]]
    for t in outputs:
        if in_order[t]:
            last_reader[buffer_of[t]] = n_order
    return readers, last_reader


def _forward(net: IndexedGraph, order: Sequence[int], position: Sequence[int], bufs: _Buffers, timing,
             reads: Sequence[Sequence[int]], virtual: bytearray | None, readers: list[list[int] | None],
             last_reader: list[int], cluster: Sequence[int] | None = None) -> None:
    """An element-wise op reuses an input buffer when nothing else holds a reference to it: it is the buffer's last
    reader in the order and every other reader has ended by the time it starts (a concurrent reader, e.g. a copy
    still running, keeps its reference). Function outputs are read by the caller after the last op (never
    forwarded).

    ``cluster`` (the ``xla-clusters`` clock): by op id its XLA cluster (-1: none). A member reuses only a buffer its
    own cluster made: XLA writes a result into an input's buffer only where the module declares an input/output
    alias, and TensorFlow's clusters declare one only for a variable's update, which ``_XlaCompile`` turns off
    (``may_alias_resource_update=false``; ``tensorflow/compiler/jit/xla_launch_util.cc`` hands every other input over
    as not XLA's to reuse). So XLA allocates a result of its own even where the input dies with the cluster. On the
    3D U-Net a batch norm's gradient, fused with the swap-in it read, was priced in the swap-in's buffer: 1 MiB the
    executor allocated and the clock did not."""
    types, n_out, out_start, t_info, t_op, dev = net.types, net.n_out, net.out_start, net.t_info, net.t_op, net.dev
    is_transfer, resident, variable_reads = bufs.is_transfer, bufs.resident, bufs.variable_reads
    buffer_of, owner_of, start, end = bufs.buffer_of, bufs.owner_of, timing.start, timing.end
    forwarding = FORWARDING_OPS
    for i in order:
        if types[i] not in forwarding or n_out[i] != 1 or is_transfer[i]:
            continue
        inside = cluster[i] if cluster is not None else -1
        own = out_start[i]
        out = t_info[own]
        size = out.num_bytes
        if not size or (virtual is not None and virtual[own]):
            continue
        pos_i, start_i, dev_i, dtype = position[i], start[i], dev[i], out.dtype
        for t in reads[i]:
            buf = buffer_of[t]
            if buffer_of[buf] != buf:  # (a chain forwarding made: ``owner_of`` walks it)
                buf = owner_of(t)
            if (resident[buf] or variable_reads[buf] or dev[t_op[buf]] != dev_i or last_reader[buf] != pos_i
                    or t_info[buf].num_bytes != size or t_info[buf].dtype != dtype
                    or (inside >= 0 and cluster[t_op[buf]] != inside)):
                continue
            for r in readers[buf]:
                if r != i and end[r] > start_i:
                    break  # a concurrent reader holds a reference
            else:
                buffer_of[own] = buf
                # The forwarded output's readers now read ``buf``: it lives as long as they do.
                later = last_reader[own]
                if later > last_reader[buf]:
                    last_reader[buf] = later
                mine = readers[own]
                if mine is not None:
                    readers[buf].extend(mine)
                    readers[own] = None
                break
    _forward_resolve(bufs)  # the chains forwarding made; ``readers`` is keyed by final owners already


class _Events:
    """The memory events of a step, sorted: ``events`` of (time, seq, phase, tensor id, delta, device), the buffer of
    each tensor id (``tid_buf``), and the bytes resident on each device for the whole step."""

    __slots__ = ("events", "tid_buf", "resident_bytes", "host_resident")


def _memory_events(net: IndexedGraph, order: Sequence[int], bufs: _Buffers, timing,
                   readers: list[list[int] | None], outputs: Iterable[int], virtual: bytearray | None,
                   alive: Sequence[bool], options: SimOptions, step_time: float,
                   cluster: Sequence[int] | None = None, first: Sequence[int] | None = None,
                   unowned: Sequence[tuple[int, int, int, int]] | None = None) -> _Events:
    """An allocation when a buffer's producer starts, a free when its last reader ends (module doc). ``cluster`` /
    ``first`` (the ``xla-clusters`` clock): by op id its XLA cluster (-1: none) and that cluster's first op; a
    cluster's outputs (buffers read outside it, or returned) are allocated when it starts, as XLA allocates its
    result buffers before it runs. ``unowned``: buffers no tensor owns (:attr:`Kernels.unowned`), each ``(first op,
    last op, label tensor, bytes)``, allocated when the first op starts and freed when the last ends: the clusters' new
    variable values, from a cluster's start to its end (the variable's old buffer goes then), and the kernel copies of
    the machine's XLA."""
    types, dev, out_start, n_out, t_info = net.types, net.dev, net.out_start, net.n_out, net.t_info
    buffer_of, resident, variable_reads, is_transfer = bufs.buffer_of, bufs.resident, bufs.variable_reads, \
        bufs.is_transfer
    start, end, event_seq = timing.start, timing.end, timing.event_seq
    ev = _Events()
    events: list[tuple[float, float, int, int, int, str]] = []
    tid_buf: list[int] = []
    resident_bytes = _resident_variable_bytes(net, alive)
    host_resident = 0
    output_owners = {buffer_of[t] for t in outputs if bufs.in_order[t]}
    workspaces = options.workspace_bytes_per_element
    inf = float("inf")
    for op in order:  # owners in order of (position, output index)
        s = out_start[op]
        k = n_out[op]
        if k == 1:
            if buffer_of[s] != s:
                continue  # (an alias: most ops have one output)
            outs = (s,)
        else:
            outs = range(s, s + k)
        for buf in outs:
            if buffer_of[buf] != buf or (virtual is not None and virtual[buf]):
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
            tid = len(tid_buf)
            tid_buf.append(buf)
            users = readers[buf]
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
            at = op
            if cluster is not None and cluster[op] >= 0 and (buf in output_owners or any(
                    cluster[u] != cluster[op] for u in users or ())):
                at = first[op]
            events.append((start[at], event_seq[at] - (0.25 if is_transfer[at] else 0.0), 0, tid, size, d))
            events.append((t_free, seq_free, 1, tid, -size, d))
    for head, tail, label, size in unowned or ():
        tid = len(tid_buf)
        tid_buf.append(label)
        events.append((start[head], event_seq[head], 0, tid, size, ACCEL))
        events.append((end[tail], event_seq[tail], 1, tid, -size, ACCEL))
    # Ties of (time, seq, phase) keep tensor order (the order events were made in).
    events.sort()
    ev.events, ev.tid_buf, ev.resident_bytes, ev.host_resident = events, tid_buf, resident_bytes, host_resident
    return ev


def _forward_resolve(bufs: _Buffers) -> None:
    """Point every tensor at its buffer's final owner, through alias and forwarding chains (:func:`_forward` ends
    with it; without forwarding it runs alone)."""
    buffer_of, owner_of = bufs.buffer_of, bufs.owner_of
    # (every tensor whose owner is not final, listed first: resolving one changes no other's test)
    for t in [t for t, o in enumerate(buffer_of) if o != t and buffer_of[o] != o]:
        owner_of(t)
