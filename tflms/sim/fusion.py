"""Which ops run as one kernel on a GPU: grappler's remapper (the ``graph`` clock) and XLA:GPU (the ``xla`` clock).

Both answer with :class:`tflms.sim.clock.Kernels`: a fused op's time goes to the fusion's *root* (the op whose
output leaves the fusion), its members take no time, and a tensor that stays inside a fusion never gets a buffer.

**Grappler on a GPU** (:func:`remapper_kernels`; ``tensorflow/core/grappler/optimizers/remapper.cc``). The remapper
fuses, on a GPU, a ``Conv2D`` with its ``BiasAdd`` and a ``Relu`` into ``_FusedConv2D`` (cuDNN's
convolution-bias-activation), when the convolution is float32 with a spatial filter (not 1x1), and the convolution
and the bias add each have one consumer and no control edges (``HasControlFaninOrFanout``,
``HasAtMostOneFanoutAtPort0``). Its other GPU patterns need what a default installation does not have:
``_FusedMatMul`` needs ``TF_USE_CUBLASLT=1``; ``_FusedBatchNormEx`` needs ``FusedBatchNormV3`` in float16 with
``TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT``; the LayerNorm fusion is oneDNN's (CPU). Keras 3 adds biases with
``AddV2`` (not ``BiasAdd``) and builds batch normalisation from element-wise ops, so its graphs match none of them;
tf_keras's convolutions with bias and ReLU do.

**XLA:GPU** (:func:`xla_kernels`). The rules follow XLA's GPU fusion pipeline (``xla/service/gpu``):

- ``PriorityFusion`` (the default producer-consumer fusion, which replaced ``GpuInstructionFusion`` and
  ``FusionMerger``): an element-wise op, broadcast, convert (``Cast``), or data movement (transpose, slice, pad,
  concatenate) fuses into *all* its consumers or none; it is duplicated where it has several, which it does only
  where that moves fewer bytes (:func:`_worth_duplicating`; never, on a machine whose XLA duplicates no op of its
  type: ``HardwareProfile.xla_no_duplicate``, XLA:CPU's expensive ops). A consumer accepts it if it is itself fusible, a
  reduction (an *input fusion*: the reduction reads the fused producers' inputs), or a variable update (the new
  value is written where the variable lives).
- Library calls take no producers and fuse into nothing: convolutions (cuDNN, ``GpuConvRewriter``) and products
  (cuBLAS, ``GemmRewriter``) read their operands from memory and write their outputs there. So do ops XLA runs as
  their own kernels here (``select-and-scatter`` for ``MaxPoolGrad``, sorts, scatters).
- Stateless random numbers (dropout's) are element-wise ops on an iota once XLA:GPU has expanded its Philox generator
  (``RngBitGeneratorExpander``; :data:`~tflms.ir.op_types.XLA_STATELESS_RANDOM`): they fuse into their readers as
  any element-wise op, reading nothing from memory, and a re-run of dropout costs its mask's kernel alone.
- A reduction's output always reaches memory (a reduction fuses into no consumer's loop).
- A fusion reads each buffer crossing its boundary once and writes its outputs once, and is priced
  max(FLOPs at the FP32 rate, those bytes at memory bandwidth), at least :data:`~tflms.sim.clock.XLA_MIN_KERNEL_S`.
- Not modelled: multi-output (sibling) fusion of reductions reading the same input, horizontal fusion of small
  independent kernels (the optimizer's per-variable updates), and epilogue fusion into cuBLAS/cuDNN calls (bias,
  activation). Each would make the step shorter than priced here.

Ops that XLA cannot place on the accelerator (host ops, copies to or from the host) take no producers either: a
swap point is a fusion boundary (issue 47). Nor does a recompute gate inside a cluster, an ``XlaOptimizationBarrier``
(:mod:`tflms.passes.xla_clusters`): it fuses with nothing, so the tensor it gates and the output of its trigger that
it reads are written to memory (where the trigger is fused, a tensor its chain reads instead:
:func:`~tflms.ir.xla_gates.barrier_read`), and its output is the gated tensor's buffer; the clones behind it fuse
into their readers as any op does. (On the ``xla`` clock, the whole step as one module, gates stay the views they are.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from tflms.ir.names import is_clone, is_inserted
from tflms.ir.xla_gates import (BARRIER, BARRIER_READ_DTYPES, barrier_operand, barrier_passes, barrier_read,
                                fuses_into_readers, gates_seen_through, gradient_descendants, is_gate)
from tflms.ir.op_types import (ALIAS_OPS, CONTRACTION_OPS, FREE_OPS, GRADIENT_OP_TYPES, METADATA_OPS,
                               VARIABLE_READ_OPS, XLA_ASSIGNS, XLA_FUSIBLE, XLA_OWN_KERNEL_REDUCTIONS, XLA_REDUCTIONS,
                               XLA_TAKES_PRODUCERS)
from tflms.sim.clock import CLOCK_GRAPH, CLOCK_XLA, XLA_MIN_KERNEL_S, Kernels, op_durations
from tflms.sim.cost import op_flops
from tflms.sim.indexed import ACCEL, IndexedGraph, OpCosts
from tflms.profiles import HardwareProfile

class _Net:
    """What the fusion rules read of an :class:`IndexedGraph` for one simulation: who reads each tensor, which ops
    run on the accelerator as compute, which tensors are views of which."""

    def __init__(self, net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], outputs: Sequence[int],
                 cluster: Sequence[int] | None = None):
        self.net = net
        n = len(net.names)
        self.compute = [False] * n  # accelerator ops of the order that are not copies (and XLA compiles)
        for i in order:
            self.compute[i] = net.dev[i] == ACCEL and not is_transfer[i] and (cluster is None or cluster[i] >= 0)
        self.cluster = cluster  # by op id, its XLA cluster (None: the whole step is one)
        self.readers: list[list[int]] = [[] for _ in net.t_op]
        for i in order:
            for t in dict.fromkeys(net.inputs[i]):
                self.readers[t].append(i)
        # recompute gates inside a cluster: barriers, which fuse with nothing and read their trigger's output
        self.barrier = bytearray(n)
        self.trigger_read: dict[int, int] = {}  # an unmarked gate -> the trigger output its barrier will read
        if cluster is not None:
            for i in order:
                if self.compute[i] and (net.types[i] == BARRIER or (
                        is_gate(net.types[i], net.names[i]) and net.inputs[i]
                        and barrier_passes(net.t_info[net.inputs[i][0]].dtype,
                                           [net.types[r] for r in self.readers[net.out_start[i]]]))):
                    self.barrier[i] = 1
            for i in seen_through(net, order, self.barrier):
                self.barrier[i] = 0
            descends = gradient_descendants(lambda i: [net.t_op[t] for t in net.inputs[i]],
                                            lambda i: net.types[i] in GRADIENT_OP_TYPES)
            for i in order:
                if self.barrier[i]:
                    t = gate_trigger_tensor(net, i)
                    if t is not None:
                        t = self._barrier_read(t, cluster[i], descends)
                        self.trigger_read[i] = t
                        self.readers[t].append(i)
        self.is_output = bytearray(len(net.t_op))
        for t in outputs:
            self.is_output[t] = 1
        self.order = order

    def _barrier_read(self, t: int, cluster: int, descends: Callable[[int], bool]) -> int:
        """The tensor a barrier in ``cluster`` reads to wait for the trigger output ``t``
        (:func:`~tflms.ir.xla_gates.barrier_read`, with the rule the pass applies)."""
        net, compute = self.net, self.compute

        def fused(i: int) -> bool:
            return (compute[i] and net.types[i] in XLA_FUSIBLE and net.n_out[i] == 1
                    and fuses_into_readers([(net.names[c], net.types[c]) for c in self.readers[net.out_start[i]]]))

        def may_read(x: int) -> bool:
            p = net.t_op[x]
            return (compute[p] and self.cluster[p] == cluster and not is_inserted(net.names[p])
                    and net.t_info[x].dtype in BARRIER_READ_DTYPES and descends(p))
        return barrier_read(t, net.t_op.__getitem__, net.inputs.__getitem__, fused, may_read)

    def is_view(self, i: int) -> bool:
        """An op whose output is a view of its input on the accelerator (``Reshape``, ``Identity``...)."""
        net = self.net
        return self.compute[i] and net.types[i] in ALIAS_OPS and bool(net.inputs[i]) and not self.barrier[i]

    def consumers(self, t: int) -> list[int] | None:
        """The ops reading tensor ``t``'s data, through views (metadata ops such as ``Shape`` read none: XLA knows
        static shapes); ``None`` where ``t`` (or a view of it) is a function output."""
        if self.is_output[t]:
            return None
        net = self.net
        out: list[int] = []
        for c in self.readers[t]:
            if net.types[c] in METADATA_OPS:
                continue
            if self.is_view(c):
                # a view's output k is a view of its input k (IdentityN), else of input 0
                ks = [k for k, x in enumerate(net.inputs[c]) if x == t] if net.n_out[c] > 1 else [0]
                for k in ks:
                    more = self.consumers(net.out_start[c] + k)
                    if more is None:
                        return None
                    out.extend(more)
            else:
                out.append(c)
        return out

    def source(self, t: int) -> int:
        """The tensor ``t`` is a view of (itself if none)."""
        net = self.net
        while self.is_view(net.t_op[t]):
            i = net.t_op[t]
            ins = net.inputs[i]
            t = ins[min(net.t_idx[t], len(ins) - 1)]
        return t

    def nbytes(self, t: int) -> int:
        return self.net.t_info[t].num_bytes or 0

    def together(self, i: int, ops: Sequence[int]) -> bool:
        """Whether ``ops`` are in op ``i``'s cluster: XLA fuses nothing across a cluster's boundary."""
        cluster = self.cluster
        return cluster is None or all(cluster[c] == cluster[i] for c in ops)


def seen_through(net: IndexedGraph, order: Sequence[int], barrier: Sequence[int]) -> set[int]:
    """The barrier gates of ``order`` that stay ``Identity`` s in their cluster
    (:func:`~tflms.ir.xla_gates.gates_seen_through`, as :mod:`tflms.passes.xla_clusters` decides it)."""
    names, types = net.names, net.types

    def trigger(gate: int) -> int | None:
        if types[gate] == BARRIER:  # (marked by the pass: its trigger is its second input's op)
            return net.t_op[net.inputs[gate][1]] if len(net.inputs[gate]) > 1 else None
        return net.ctrl[gate][0] if len(net.ctrl[gate]) == 1 else None

    def gated_clone(gate: int) -> int | None:
        producer = net.t_op[net.inputs[gate][0]]
        return producer if is_clone(names[producer]) else None

    def input_gates(clone: int) -> list[int]:
        return [p for p in (net.t_op[t] for t in net.inputs[clone])
                if types[p] == BARRIER or is_gate(types[p], names[p])]

    return gates_seen_through(order, barrier.__getitem__, trigger, gated_clone, input_gates)


def gate_trigger_tensor(net: IndexedGraph, gate: int) -> int | None:
    """The tensor a recompute gate not yet made a barrier (an ``Identity`` with its trigger as control input) will
    read of its trigger inside a cluster (:func:`~tflms.ir.xla_gates.barrier_operand`), or ``None``."""
    if net.types[gate] == BARRIER or len(net.ctrl[gate]) != 1:
        return None
    trigger = net.ctrl[gate][0]
    start = net.out_start[trigger]
    k = barrier_operand([net.t_info[t].dtype for t in range(start, start + net.n_out[trigger])],
                        net.dev[trigger] == ACCEL)
    return None if k is None else start + k


def _worth_duplicating(in_bytes: int, out_bytes: int, copies: int) -> bool:
    """Whether fusing a producer into ``copies`` consumer fusions moves no more bytes than giving it its own kernel:
    each copy reads the producer's inputs (``copies x in``) against writing its output once and reading it in every
    consumer (``in + out + copies x out``). However many copies: ``PriorityFusion`` fuses a producer into all its
    users when it can fuse with each (``CanFuseWithAllNonBitcastUsers``) and its cost model finds the fused time
    shorter (``time_unfused - time_fused``), with no limit on the users' count
    (xla/service/gpu/transforms/priority_fusion.cc)."""
    return copies <= 1 or copies * in_bytes <= in_bytes + (copies + 1) * out_bytes


def _xla_virtual(g: _Net, keep: Mapping[int, int], no_duplicate: frozenset[str] = frozenset()) -> bytearray:
    """Which ops XLA fuses into their consumers (by op id, 1 = fused away), deciding consumers before producers;
    ops in ``keep`` stay kernels, and so does an op of a type in ``no_duplicate`` whose consumers fall in more than
    one fusion (``HardwareProfile.xla_no_duplicate``)."""
    net = g.net
    virtual = bytearray(len(net.names))
    roots: list[frozenset[int] | None] = [None] * len(net.names)  # the fusions an op's output flows into
    for i in reversed(g.order):
        if not g.compute[i] or g.is_view(i):
            continue
        roots[i] = frozenset((i,))
        if net.types[i] not in XLA_FUSIBLE or net.n_out[i] != 1 or not g.nbytes(net.out_start[i]) or i in keep:
            continue
        consumers = g.consumers(net.out_start[i])
        if not consumers or not all(g.compute[c] and net.types[c] in XLA_TAKES_PRODUCERS for c in consumers):
            continue
        if not g.together(i, consumers):
            continue
        into = frozenset().union(*(roots[c] or frozenset((c,)) for c in consumers))
        if len(into) > 1 and net.types[i] in no_duplicate:
            continue
        in_bytes = sum(g.nbytes(g.source(t)) for t in dict.fromkeys(net.inputs[i]))
        if _worth_duplicating(in_bytes, g.nbytes(net.out_start[i]), len(into)):
            virtual[i] = 1
            roots[i] = into
    return virtual


def _fusion(g: _Net, root: int, virtual: bytearray) -> tuple[list[int], list[int]]:
    """The members fused into ``root`` (the root first) and the tensors its kernel reads from memory."""
    net = g.net
    members, reads, seen = [root], [], {root}
    stack = list(net.inputs[root])
    while stack:
        t = stack.pop()
        src = g.source(t)
        p = net.t_op[src]
        if virtual[p]:
            if p not in seen:
                seen.add(p)
                members.append(p)
                stack.extend(net.inputs[p])
        else:
            reads.append(t)
    return members, list(dict.fromkeys(reads))


def _conv_epilogues(g: _Net) -> dict[int, int]:
    """``{bias add: convolution}`` for the bias adds XLA's ``CudnnFusedConvRewriter`` folds into the cuDNN call of
    the forward convolution they follow: a ``BiasAdd``, or an add of a vector along the channels, that is the
    convolution's only reader."""
    net, out = g.net, {}
    for conv in g.order:
        if net.types[conv] != "Conv2D" or not g.compute[conv]:
            continue
        t = net.out_start[conv]
        readers = g.consumers(t)
        if not readers or len(readers) != 1 or len(net.inputs[readers[0]]) != 2:
            continue
        add = readers[0]
        if not g.together(conv, readers):
            continue
        if net.types[add] == "BiasAdd" or (net.types[add] in ("Add", "AddV2") and _is_channel_vector(g, add, t)):
            out[add] = conv
    return out


def _is_channel_vector(g: _Net, add: int, t: int) -> bool:
    """Whether the other operand of ``add`` is a vector as long as tensor ``t``'s last (channel) dimension."""
    net = g.net
    shape = net.t_info[t].resolved_shape
    other = [x for x in net.inputs[add] if g.source(x) != g.source(t)]
    if not shape or len(other) != 1:
        return False
    o = net.t_info[g.source(other[0])].resolved_shape
    return bool(o) and [d for d in o if d != 1] == [shape[-1]]


def _reaches(g: _Net, a: int, b: int, position: Sequence[int]) -> bool:
    """Whether op ``b`` depends on op ``a`` (``a`` earlier in the order): a walk back from ``b`` over ops no earlier
    than ``a``."""
    net, stop, seen, stack = g.net, position[a], {b}, [b]
    while stack:
        for p in net.preds[stack.pop()]:
            if p == a:
                return True
            if p not in seen and position[p] > stop:
                seen.add(p)
                stack.append(p)
    return False


def _siblings(g: _Net, roots: Sequence[int], reads: Sequence[list[int]]) -> dict[int, int]:
    """``{reduction: the later reduction it shares a kernel with}``: XLA's sibling multi-output fusion
    (``GpuMultiOutputFusion``) of reductions that read the same large buffer into outputs of one shape, where
    neither depends on the other (module doc)."""
    net = g.net
    position = {i: k for k, i in enumerate(g.order)}
    open_: dict[tuple, int] = {}  # (largest buffer read, output shape) -> the group's latest reduction
    merged: dict[int, int] = {}
    for r in roots:
        if net.types[r] not in XLA_REDUCTIONS or net.types[r] in XLA_OWN_KERNEL_REDUCTIONS or not reads[r]:
            continue
        big = max((g.source(t) for t in reads[r]), key=g.nbytes)
        key = (big, net.t_info[net.out_start[r]].resolved_shape if net.n_out[r] else None,
               g.cluster[r] if g.cluster is not None else 0)
        prev = open_.get(key)
        if prev is not None and not _reaches(g, prev, r, position):
            merged[prev] = r
        open_[key] = r
    return merged


def _fusion_time(g: _Net, members: Sequence[int], reads: Sequence[int], written: int,
                 profile: HardwareProfile) -> float:
    """A fusion's time: max(its members' FLOPs at the FP32 rate, the bytes crossing its boundary at memory
    bandwidth), at least :data:`~tflms.sim.clock.XLA_MIN_KERNEL_S`."""
    net = g.net
    flops = sum(op_flops(net.graph, net.src_ops[m]) for m in members if net.src_ops[m] is not None)
    moved = sum(g.nbytes(s) for s in dict.fromkeys(g.source(r) for r in reads)) + written
    return max(flops / profile.effective_flops, moved / profile.effective_memory_bytes_per_s, XLA_MIN_KERNEL_S)


def _written(g: _Net, i: int) -> int:
    """Bytes op ``i``'s kernel writes: its outputs, or the new value of a variable it updates."""
    net = g.net
    if net.types[i] in XLA_ASSIGNS:
        return g.nbytes(net.inputs[i][1]) if len(net.inputs[i]) > 1 else 0
    return sum(g.nbytes(o) for o in range(net.out_start[i], net.out_start[i] + net.n_out[i]))


def xla_kernels(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                profile: HardwareProfile, outputs: Sequence[int], cluster: Sequence[int] | None = None) -> Kernels:
    """The ``xla`` clock's kernels (module doc). ``cluster``: by op id, the XLA cluster each op runs in (-1: none, it
    is no kernel here; :mod:`tflms.sim.clusters` prices it): nothing fuses across clusters. ``None``: the whole step
    is one cluster."""
    g = _Net(net, order, is_transfer, outputs, cluster)
    priced = op_durations(net, order, is_transfer, costs, profile)
    epilogues = _conv_epilogues(g)
    virtual = _xla_virtual(g, keep=epilogues, no_duplicate=frozenset(profile.xla_no_duplicate))
    n = len(net.names)
    duration, reads = [0.0] * n, [list(ins) for ins in net.inputs]
    for i, t in g.trigger_read.items():
        reads[i].append(t)
    virtual_t = bytearray(len(net.t_op))
    members: dict[int, list[int]] = {}
    for i in order:
        if not g.compute[i]:
            continue
        if virtual[i] or net.types[i] in METADATA_OPS or i in epilogues.values():
            reads[i] = []
            for t in range(net.out_start[i], net.out_start[i] + net.n_out[i]):
                virtual_t[t] = 1
            continue
        if g.is_view(i) or net.types[i] in FREE_OPS or net.types[i] in VARIABLE_READ_OPS or priced[i] <= 0:
            continue
        members[i], reads[i] = _fusion(g, i, virtual)
    for i in members:
        conv, t = epilogues.get(i), net.types[i]
        if conv is not None:  # the convolution's library call writes the bias add's output
            reads[i] = list(dict.fromkeys(net.inputs[conv] + [x for x in reads[i] if net.t_op[g.source(x)] != conv]))
            duration[i] = max(priced[conv] - profile.launch_overhead_s, XLA_MIN_KERNEL_S)
        elif t in CONTRACTION_OPS or t not in XLA_TAKES_PRODUCERS:
            duration[i] = max(priced[i] - profile.launch_overhead_s, XLA_MIN_KERNEL_S)  # a library call
        else:
            duration[i] = _fusion_time(g, members[i], reads[i], _written(g, i), profile)
    for first, later in _siblings(g, list(members), reads).items():
        both = members[first] + members[later]
        reads[later] = list(dict.fromkeys(reads[first] + reads[later]))
        duration[later] = _fusion_time(g, both, reads[later], _written(g, first) + _written(g, later), profile)
        duration[first], reads[first] = 0.0, []
        members[later] = both
        del members[first]
    # views of a fused-away tensor are fused away too
    for i in order:
        if g.is_view(i) and virtual_t[g.source(net.inputs[i][0])]:
            for t in range(net.out_start[i], net.out_start[i] + net.n_out[i]):
                virtual_t[t] = 1
    return Kernels(CLOCK_XLA, duration, [0.0] * n, len(members), reads=reads, virtual=virtual_t)


def _spatial_float32_conv(net: IndexedGraph, conv: int) -> bool:
    """A ``Conv2D`` the GPU remapper may fuse: float32, a spatial (not 1x1) filter, no control inputs."""
    if net.types[conv] != "Conv2D" or net.ctrl[conv] or len(net.inputs[conv]) < 2:
        return False
    shape = net.t_info[net.inputs[conv][1]].resolved_shape
    return (net.t_info[net.out_start[conv]].dtype == "float32" and bool(shape) and len(shape) == 4
            and (shape[0] or 1) * (shape[1] or 1) > 1)


def may_fuse_on_gpu(net: IndexedGraph) -> bool:
    """Whether ``net`` has the shape of a chain grappler's GPU remapper fuses (:func:`_remapper_chains`): a Relu
    reading a BiasAdd reading a Conv2D, by types alone. Keras 3 graphs have none, and then no reader need be
    walked; the Relus are found at C speed."""
    types, t_op, inputs = net.types, net.t_op, net.inputs
    return any(inputs[i] and types[b := t_op[inputs[i][0]]] == "BiasAdd" and inputs[b]
               and types[t_op[inputs[b][0]]] == "Conv2D"
               for i in itertools.compress(range(len(types)), map("Relu".__eq__, types)))


def _remapper_chains(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool],
                     outputs: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(conv, bias_add, relu)`` chains grappler's GPU remapper fuses into ``_FusedConv2D`` (module doc). One pass
    over the order's edges, reading only the readers of the candidate convolutions and bias adds; the graph clock
    asks only where :func:`may_fuse_on_gpu` (:func:`~tflms.sim.clock.kernels_for`)."""
    types, out_start, dev = net.types, net.out_start, net.dev
    convs = [i for i in order if types[i] == "Conv2D" and _spatial_float32_conv(net, i)]
    if not convs:
        return []
    watched = {out_start[c]: c for c in convs}
    readers: dict[int, list[int]] = {}
    control_sources: set[int] = set()
    for i in order:  # a bias add comes before its readers: its output is watched from then on
        control_sources.update(net.ctrl[i])
        for t in net.inputs[i]:
            if t in watched:
                readers.setdefault(t, []).append(i)
                if types[i] == "BiasAdd" and types[net.t_op[t]] == "Conv2D":
                    watched[out_start[i]] = i
    exported = set(outputs)

    def only_reader(t: int, want: str) -> int | None:
        rs = list(dict.fromkeys(readers.get(t, ())))
        ok = (t not in exported and len(rs) == 1 and types[rs[0]] == want and dev[rs[0]] == ACCEL
              and not is_transfer[rs[0]])
        return rs[0] if ok else None

    chains = []
    for conv in convs:
        bias_add = only_reader(out_start[conv], "BiasAdd")
        relu = None if bias_add is None else only_reader(out_start[bias_add], "Relu")
        if relu is not None and not net.ctrl[bias_add] and not {conv, bias_add} & control_sources:
            chains.append((conv, bias_add, relu))
    return chains


def remapper_kernels(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                     profile: HardwareProfile, outputs: Sequence[int]) -> Kernels:
    """The ``graph`` clock's kernels before launches are moved to the host: one per op, but for grappler's GPU
    fusions (module doc), whose time goes to the fused op's last member."""
    duration = op_durations(net, order, is_transfer, costs, profile)
    kernels = Kernels(CLOCK_GRAPH, duration, [0.0] * len(duration), sum(1 for d in duration if d > 0))
    chains = _remapper_chains(net, order, is_transfer, outputs)
    if not chains:
        return kernels
    reads, virtual = [list(ins) for ins in net.inputs], bytearray(len(net.t_op))
    for conv, bias_add, relu in chains:
        duration[relu], duration[conv], duration[bias_add] = duration[conv], 0.0, 0.0
        reads[relu] = list(net.inputs[conv]) + [net.inputs[bias_add][1]]
        reads[conv], reads[bias_add] = [], []
        virtual[net.out_start[conv]] = virtual[net.out_start[bias_add]] = 1
        kernels.kernels -= 2
    kernels.reads, kernels.virtual = reads, virtual
    return kernels
