"""The ``xla-clusters`` clock (issue 47): a rewritten step that keeps XLA, priced cluster by cluster.

:func:`tflms.passes.xla_clusters.cluster_for_xla` marks the ops of a rewritten step for XLA in segments between
tflms's copies; TensorFlow compiles each cluster on its own and runs it as one ``_XlaRun`` op of its executor. This
clock prices that step (:func:`cluster_kernels`):

- **Which clusters.** Where the graph carries the pass's marks (``_XlaCompile`` / ``_XlaScope``), its clusters are
  the marked ops of one scope that edges join, as ``mark_for_compilation_pass`` makes them. Otherwise (a tuner's
  candidate, swaps applied and not yet marked) the pass's own rule (:func:`~tflms.passes.xla_clusters.segment_rule`)
  runs on the simulated graph, with what it leaves out read off the indexed ops: tflms's copies and TensorFlow's
  implicit ones, host ops, :data:`~tflms.ir.op_types.XLA_NEVER_TYPES`, ``string``/``variant`` tensors, the types
  in ``SimOptions.xla_unsupported`` and the ops the rules in ``SimOptions.xla_left_out_rules`` pick; and the
  variables' updates in parts where ``SimOptions.xla_update_parts`` asks for them (each part one cluster, as the
  pass's ``NoOp`` joins it). So the tuner prices each candidate as the pass will cluster it.
- **Fusion within a cluster.** The ``xla`` clock's fusion model (:func:`tflms.sim.fusion.xla_kernels`) on each
  cluster, never across one: a producer fuses into its consumers only where they all share its cluster, and so for
  the convolution epilogues and the sibling reductions. Ops outside every cluster run in TensorFlow's executor, priced
  as the ``graph`` clock prices them (their launches on the host, overlapping compute).
- **Timing.** A cluster is one op of the executor: it starts when all its inputs exist and publishes its outputs when
  it ends. The compute stream runs each cluster's kernels back to back (:func:`contracted_order`: the clusters and
  the other ops in the order TensorFlow's executor runs them, each unit once all its inputs exist, in the order the
  units became ready), and timing
  waits along contracted edges: an edge into a cluster waits before its first kernel, an edge out of one leaves after
  its last (:func:`contracted_preds`). So a swap-out copies after its producer's whole cluster and a swap-in must land
  before its reader's cluster starts. Each cluster's launch costs the host :data:`XLA_CLUSTER_LAUNCHES` launches
  (``_XlaCompile``, a cache lookup after the first step, and ``_XlaRun``); XLA issues the kernels inside.
- **Memory.** A cluster's inputs are held until it ends (the executor keeps an op's inputs until it completes); its
  outputs (buffers read outside it, or returned) are allocated when it starts (XLA allocates its result buffers before
  it runs); its fused tensors get no buffer; its other intermediates live from their kernel's start to their last
  reader's end inside it, as the ``xla`` clock has them (XLA's buffer assignment reuses a buffer once its last reader
  has run; its temporary allocation is their peak).
- **Variable updates.** A cluster compiled for ``_XlaCompile`` / ``_XlaRun`` never updates a variable in place:
  ``XlaCompileOp`` compiles with ``may_alias_resource_update=false`` (``tensorflow/compiler/jit/kernels/xla_ops.cc``:
  locking the variables in ``_XlaCompile`` and unlocking them in ``_XlaRun`` could deadlock), so each new value is a
  result buffer of its own, allocated when the cluster starts; ``_XlaRun`` hands it to the variable when the cluster
  ends, and the old buffer goes then. (A step compiled whole, the ``xla`` clock's, runs as ``XlaLaunch``, which may
  alias them.) On the zoo ResNet-50 the momentum update cluster holds every gradient and every new momentum at once.
- **Kernel copies.** A machine whose XLA copies an op's kernel (input 1) before running it
  (``HardwareProfile.xla_kernel_copies``: XLA:CPU's backward-input convolutions, the emulated accelerator's) holds
  a temporary of the kernel's size for that op's kernel, from its start to its end, in its cluster. XLA:GPU copies
  none.
- **Kernel scratch.** A machine whose TensorFlow kernels of some types allocate temporaries while they run
  (``HardwareProfile.xla_outside_scratch``) holds them from such an op's start to its end where it runs outside the
  clusters. The emulated accelerator's max-pool gradients, left out of XLA there: TensorFlow's CPU kernel
  (``MaxPoolingGradOp``; its forward pool ran in XLA, so oneDNN has no workspace to hand it) allocates a copy of the
  pooled output and an int64 argmax per pooled element (the zoo CNN at 0.8: 0.5 and 1 MiB beside a 2 MiB gradient,
  the measured peak 1.5 MiB above the simulated one in the runs where that gradient ran at it).
- **Resource order.** A cluster reads its variables at its start and writes them at its end, so TensorFlow keeps a
  variable's write and a later read in different clusters (:func:`~tflms.ir.xla_segments.segment_rule`'s resource
  split): a Keras optimizer's slot updates and the variables' updates that read them run as two clusters.

Deterministic: the same graph, order and options give the same clusters, order and result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from tflms.errors import GraphError
from tflms.ir.op_types import FREE_OPS, XLA_ASSIGNS, XLA_NEVER_DTYPES, XLA_NEVER_TYPES
from tflms.ir.names import is_clone
from tflms.ir.xla_copy_cuts import release_through
from tflms.ir.xla_gates import BARRIER, gate_role, is_gate, is_tflms_copy
from tflms.ir.xla_left_out import left_out_by
from tflms.ir.xla_segments import (HOST_OP, NEVER_COMPILED, NO_XLA_KERNEL, TFLMS_COPY, VARIABLE_READ,
                                   XLA_COMPILE_ATTR, XLA_SCOPE_ATTR, connected_clusters, is_free_variable_read,
                                   resource_rules, segment_rule)
from tflms.profiles import HardwareProfile
from tflms.sim.clock import CLOCK_XLA_CLUSTERS, Kernels, op_durations
from tflms.sim.cost import op_launches
from tflms.sim.fusion import xla_kernels
from tflms.sim.indexed import ACCEL, HOST, IndexedGraph, OpCosts, positions
from tflms.sim.records import SimOptions

#: Executor launches per cluster and step: ``_XlaCompile`` (after the first step, a lookup in the compilation cache)
#: and ``_XlaRun``, each dispatched like a kernel (an assumption: TensorFlow runs the pair for every cluster).
XLA_CLUSTER_LAUNCHES = 2


def step_clusters(net: IndexedGraph, order: Sequence[int], position: Sequence[int], is_transfer: Sequence[bool],
                  options: SimOptions | None = None) -> list[int]:
    """By op id, the XLA cluster each op of ``order`` runs in, numbered from 0 in order of their first op (-1: none;
    module doc, "Which clusters"). Of ``options`` (``None``: the defaults) it reads ``xla_unsupported``,
    ``xla_left_out_rules`` and, as :func:`~tflms.passes.xla_clusters.cluster_for_xla` reads its parameters of those
    names, ``xla_update_parts``, ``xla_land_cuts`` and ``xla_clones_last``."""
    options = options or SimOptions()
    preds = {i: [p for p in net.preds[i] if position[p] >= 0] for i in order}
    succs: dict[int, list[int]] = {i: [] for i in order}
    for i in order:
        for p in preds[i]:
            succs[p].append(i)
    marked = _marked_segments(net, order)
    if marked is not None:
        clusters = connected_clusters(order, preds, marked)
    else:
        unsupported = frozenset(options.xla_unsupported)
        outside = {i: why for i in order
                   if (why := _why_outside(net, i, is_transfer, unsupported, succs, options.xla_left_out_rules))}
        names = net.names
        types, t_info, inputs = net.types, net.t_info, net.inputs
        resource, updates = resource_rules({i: types[i] for i in order},
                                           lambda i: t_info[inputs[i][1]].num_bytes if len(inputs[i]) > 1 else None,
                                           options.xla_update_parts)
        def lands(i: int) -> bool:  # as the pass's: a copy of a copy (a swap-in, and here TensorFlow's _Recv of one)
            return (outside[i] == TFLMS_COPY and not is_gate(types[i], names[i])
                    and any(outside.get(net.t_op[t]) == TFLMS_COPY for t in inputs[i]))

        def fused_bytes(i: int) -> int:  # as the pass's: a member's output bytes where XLA fuses it
            if not release_through(types[i]):
                return 0
            start = net.out_start[i]
            return sum(t_info[t].num_bytes or 0 for t in range(start, start + net.n_out[i]))

        def leaves(i: int) -> bool:  # as the pass's: a copy of a member's tensor (a swap-out, an encoder)
            return (outside[i] == TFLMS_COPY and not is_gate(types[i], names[i])
                    and any(net.t_op[t] not in outside for t in inputs[i]))

        _, _, _, clusters, _ = segment_rule(order, range(len(names)), preds, succs, outside,
                                            lambda i: is_clone(names[i]), resource, updates,
                                            lands if options.xla_land_cuts else None, options.xla_clones_last,
                                            leaves, lambda i: release_through(types[i]), lands, fused_bytes)
        clusters = [c for c in clusters if not all(net.types[i] in FREE_OPS for i in c)]
    cluster = [-1] * len(net.names)
    for k, members in enumerate(sorted(clusters, key=lambda c: position[c[0]])):
        for i in members:
            cluster[i] = k
    return cluster


def _why_outside(net: IndexedGraph, i: int, is_transfer: Sequence[bool], unsupported: frozenset[str],
                 succs: dict[int, list[int]], rules: tuple[str, ...] = ()) -> str | None:
    """Why op ``i`` stays out of every cluster, as :func:`tflms.passes.xla_clusters.cluster_for_xla` decides it for
    the op's IR form (``rules``: ``SimOptions.xla_left_out_rules``), or ``None`` for a member."""
    op_type, name = net.types[i], net.names[i]
    if is_transfer[i] or (net.src_ops[i] is None and not is_gate(op_type, name)):
        return TFLMS_COPY  # (an op the simulator added is one of TensorFlow's implicit copies, or a tuner's gate)
    if is_tflms_copy(op_type, name) and (not is_gate(op_type, name) or _gate_role(net, i, unsupported, succs) is None):
        return TFLMS_COPY  # (a recompute gate that gate_role lets in is a member)
    if net.dev[i] == HOST:
        return HOST_OP
    t_info = net.t_info
    if op_type in XLA_NEVER_TYPES or any(t_info[t].dtype in XLA_NEVER_DTYPES for t in net.inputs[i]) or any(
            t_info[t].dtype in XLA_NEVER_DTYPES for t in range(net.out_start[i], net.out_start[i] + net.n_out[i])):
        return NEVER_COMPILED
    if is_free_variable_read(op_type, (net.types[p] for p in net.preds[i])):
        return VARIABLE_READ
    if op_type in unsupported or (rules and net.src_ops[i] is not None
                                  and left_out_by(rules, net.src_ops[i], [t_info[t] for t in net.inputs[i]])):
        return NO_XLA_KERNEL
    return None


def _gate_role(net: IndexedGraph, gate: int, unsupported: frozenset[str], succs: dict[int, list[int]]) -> str | None:
    """Where a recompute gate sits (:func:`~tflms.ir.xla_gates.gate_role`), as the pass decides it."""
    if BARRIER in unsupported or len(net.ctrl[gate]) != 1 or not net.inputs[gate]:
        return None
    trigger, t_info, out = net.ctrl[gate][0], net.t_info, net.out_start[gate]
    start = net.out_start[trigger]
    readers = [(net.types[r], [t_info[t].dtype for t in net.inputs[r]],
                [t_info[t].dtype for t in range(net.out_start[r], net.out_start[r] + net.n_out[r])])
               for r in dict.fromkeys(succs[gate]) if out in net.inputs[r]]
    return gate_role(t_info[net.inputs[gate][0]].dtype, [t_info[t].dtype for t in range(start, start + net.n_out[trigger])],
                     net.dev[trigger] == ACCEL, readers)


def _marked_segments(net: IndexedGraph, order: Sequence[int]) -> dict[int, bytes] | None:
    """``{op: its _XlaScope}`` for the ops of ``order`` marked ``_XlaCompile=true``, where the graph carries the
    pass's marks (any op with an ``_XlaScope``); ``None`` where it carries none."""
    scopes: dict[int, bytes] = {}
    marked = False
    for i in order:
        op = net.src_ops[i]
        attrs = getattr(op, "attrs", None)
        if not attrs or XLA_SCOPE_ATTR not in attrs:
            continue
        marked = True
        compile_ = attrs.get(XLA_COMPILE_ATTR)
        if compile_ is not None and getattr(compile_, "b", False):
            scopes[i] = attrs[XLA_SCOPE_ATTR].s
    return scopes if marked else None


def contracted_order(order: Sequence[int], preds: Sequence[Sequence[int]], position: Sequence[int],
                     cluster: Sequence[int]) -> list[int]:
    """``order`` with each cluster's ops back to back: a topological order of the graph with every cluster contracted
    to one unit, and each cluster's ops in their order within it.

    The units run as TensorFlow's executor runs them: a unit once all its inputs exist, first in, first out (an op's
    completion hands the ops it makes ready to the executor's inline queue or its thread pool in turn:
    ``ExecutorState::ScheduleReady`` in ``tensorflow/core/common_runtime/executor.cc``), the unit that became ready
    first first, ties by where its earliest op is in ``order``. So ``order`` orders the ops within a cluster and
    breaks ties; only edges pin the rest. Not the earliest op's place in ``order`` alone, as before: a cluster whose
    earliest op has a low level (a shape computation, a weight's transpose) then ran ahead of ops ready long before
    it. On the clustered 3D U-Net (32^3, batch 1) that put the simulated peak at 39.2 MiB against 32.8 measured (32.7
    so); on ResNet-50 (64x64, batch 16, updates in 16 parts), 168.1 against 171.3 (170.6 so): docs/design.md, "The
    executor's order".

    Raises :class:`~tflms.errors.GraphError` where the contraction has a cycle (clusters the pass never makes)."""
    base = max(cluster, default=-1) + 1

    def unit(i: int) -> int:
        return cluster[i] if cluster[i] >= 0 else base + position[i]

    members: dict[int, list[int]] = {}
    for i in order:
        members.setdefault(unit(i), []).append(i)
    after: dict[int, set[int]] = {u: set() for u in members}
    waiting = dict.fromkeys(members, 0)
    for i in order:
        u = unit(i)
        for p in preds[i]:
            v = unit(p)
            if v != u and u not in after[v]:
                after[v].add(u)
                waiting[u] += 1
    ready = [(0, position[ops[0]], u) for u, ops in members.items() if not waiting[u]]  # (when ready, tie, unit)
    heapq.heapify(ready)
    out: list[int] = []
    done = 0
    while ready:
        _, _, u = heapq.heappop(ready)
        done += 1
        out.extend(members[u])
        for v in sorted(after[u]):
            waiting[v] -= 1
            if not waiting[v]:
                heapq.heappush(ready, (done, position[members[v][0]], v))
    if len(out) != len(order):
        stuck = sorted(u for u, w in waiting.items() if w)
        raise GraphError(f"the XLA clusters of this step depend on each other in a cycle (e.g. the cluster of op id "
                         f"{members[stuck[0]][0]}): TensorFlow's clustering never makes one; mark the graph with "
                         "tflms.passes.xla_clusters.cluster_for_xla")
    return out


def contracted_preds(net: IndexedGraph, order: Sequence[int], cluster: Sequence[int]) -> tuple[list[list[int]],
                                                                                                 list[int]]:
    """``(preds, first)``: the predecessors timing waits for, and by op id its cluster's first op in ``order``.

    An edge from cluster A (or an op outside) into cluster B becomes one from A's last op to B's first: a cluster
    starts when all its inputs exist and publishes its outputs when it ends (module doc)."""
    n = len(net.names)
    first, last = [-1] * n, {}
    heads: dict[int, int] = {}
    for i in order:
        k = cluster[i]
        if k >= 0:
            first[i] = heads.setdefault(k, i)
            last[k] = i
    preds: list[list[int]] = [list(p) for p in net.preds]
    gathered: dict[int, list[int]] = {}
    for i in order:
        k = cluster[i]
        mapped = [p if cluster[p] < 0 or cluster[p] == k else last[cluster[p]] for p in net.preds[i]]
        if k < 0:
            preds[i] = list(dict.fromkeys(mapped))
            continue
        inside = [p for p in mapped if cluster[p] == k]
        gathered.setdefault(k, []).extend(p for p in mapped if cluster[p] != k)
        preds[i] = inside
    for k, outer in gathered.items():
        head = heads[k]
        preds[head] = list(dict.fromkeys(outer + preds[head]))
    return preds, first


def cluster_kernels(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool], costs: OpCosts,
                    profile: HardwareProfile, outputs: Sequence[int], options: SimOptions | None = None,
                    position: Sequence[int] | None = None) -> Kernels:
    """The ``xla-clusters`` clock's kernels (module doc), its clusters as :func:`step_clusters` finds them.
    ``position``: by op id its position in ``order`` (-1: not in it), where the caller has it."""
    if position is None:
        position = positions(order, len(net.names))
    cluster = step_clusters(net, order, position, is_transfer, options)
    kernels = xla_kernels(net, order, is_transfer, costs, profile, outputs, cluster)
    kernels.mode = CLOCK_XLA_CLUSTERS
    _executor_ops(kernels, net, order, is_transfer, costs, profile, cluster)
    kernels.order = contracted_order(order, net.preds, position, cluster)
    kernels.preds, kernels.first = contracted_preds(net, kernels.order, cluster)
    kernels.cluster = cluster
    reads = kernels.reads
    last: dict[int, int] = {}
    for i in kernels.order:
        if cluster[i] >= 0:
            last[cluster[i]] = i
    held: dict[int, list[int]] = {}  # cluster -> the tensors from outside it that its kernels read
    t_op = net.t_op
    for i in kernels.order:
        k = cluster[i]
        if k >= 0:
            held.setdefault(k, []).extend(t for t in reads[i] if cluster[t_op[t]] != k)
    for k, ins in held.items():  # held until the cluster ends: its last op reads them too
        reads[last[k]] = list(dict.fromkeys(reads[last[k]] + ins))
    launch_s = XLA_CLUSTER_LAUNCHES * profile.launch_overhead_s
    for k, i in last.items():
        kernels.launch[kernels.first[i]] += launch_s
    kernels.unowned = (_update_buffers(net, kernels, last) + _kernel_copies(net, kernels, profile)
                       + _outside_scratch(net, kernels, profile))
    return kernels


def _kernel_copies(net: IndexedGraph, kernels: Kernels, profile: HardwareProfile) -> list[tuple[int, int, int, int]]:
    """The copy of its kernel each clustered op of a type in ``profile.xla_kernel_copies`` makes, as
    :attr:`~tflms.sim.clock.Kernels.unowned`' entries from the op's start to its end, labelled by the kernel (module
    doc, "Kernel copies"): XLA:CPU's ``transpose_copy_fusion`` of a backward-input convolution's kernel, in the
    cluster's temporary allocation (XLA's dumps of the clustered CNN and 3D U-Net, TensorFlow 2.21)."""
    copied = profile.xla_kernel_copies
    if not copied:
        return []
    out = []
    for i in kernels.order:
        if kernels.cluster[i] >= 0 and net.types[i] in copied and len(net.inputs[i]) > 1:
            kernel = net.inputs[i][1]
            size = net.t_info[kernel].num_bytes or 0
            if size:
                out.append((i, i, kernel, size))
    return out


def _outside_scratch(net: IndexedGraph, kernels: Kernels, profile: HardwareProfile) -> list[tuple[int, int, int, int]]:
    """The temporaries each op outside the clusters of a type in ``profile.xla_outside_scratch`` allocates while it
    runs, as :attr:`~tflms.sim.clock.Kernels.unowned`' entries labelled by the input they are sized by (module doc,
    "Kernel scratch")."""
    table = {t: (k, copies, per_element) for t, k, copies, per_element in profile.xla_outside_scratch}
    out = []
    for i in kernels.order:
        rule = table.get(net.types[i])
        if rule is None or kernels.cluster[i] >= 0 or net.dev[i] == HOST or len(net.inputs[i]) <= rule[0]:
            continue
        t = net.inputs[i][rule[0]]
        info = net.t_info[t]
        shape = info.resolved_shape
        if info.num_bytes is None or shape is None or None in shape:
            continue
        size = int(rule[1] * info.num_bytes + rule[2] * math.prod(shape))
        if size:
            out.append((i, i, t, size))
    return out


def _update_buffers(net: IndexedGraph, kernels: Kernels, last: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The new value of each variable a cluster updates, as :attr:`~tflms.sim.clock.Kernels.unowned` (module doc,
    "Variable updates"). A value its cluster computes into a buffer of its own (not fused into the update) is that
    buffer, held to the cluster's end, and gets no second one."""
    cluster, reads, virtual, t_op, t_info = kernels.cluster, kernels.reads, kernels.virtual, net.t_op, net.t_info
    updates: list[tuple[int, int, int, int]] = []
    seen: set[tuple[int, int]] = set()
    for i in kernels.order:
        k = cluster[i]
        if k < 0 or net.types[i] not in XLA_ASSIGNS or len(net.inputs[i]) < 2:
            continue
        handle, value = net.inputs[i][0], net.inputs[i][1]
        if (k, handle) in seen:
            continue  # (updated twice in one cluster: XLA returns its last value)
        seen.add((k, handle))
        tail = last[k]
        if net.types[i] == "AssignVariableOp" and cluster[t_op[value]] == k and not virtual[value]:
            reads[tail] = list(dict.fromkeys(reads[tail] + [value]))
            continue
        size = t_info[value].num_bytes or 0
        if size:
            updates.append((kernels.first[i], tail, handle, size))
    return updates


def _executor_ops(kernels: Kernels, net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool],
                  costs: OpCosts, profile: HardwareProfile, cluster: Sequence[int]) -> None:
    """Price the accelerator ops outside every cluster as TensorFlow's executor runs them (the ``graph`` clock without
    grappler's fusions: one kernel each, its launches on the host)."""
    outside = [i for i in order if cluster[i] < 0]
    if not outside:
        return
    priced = op_durations(net, outside, is_transfer, costs, profile)
    launch_s = profile.launch_overhead_s
    for i in outside:
        d = priced[i]
        if d <= 0:
            continue
        host = 0.0
        if net.types[i] not in FREE_OPS:
            src = net.src_ops[i]
            host = launch_s * (op_launches(src, profile) if src is not None else 1)
        kernels.duration[i] = d - min(host, d)
        kernels.launch[i] = host
        kernels.kernels += 1
