"""The XLA clustering pass (issue 47): the rewritten step's compute ops run as XLA clusters between tflms's copies.

``jit_compile=True`` compiles a whole function for the accelerator and ignores where its ops are placed, so a swap
copy compiles to a pass-through (docs/tf-facts.md, "XLA and tflms"). This pass keeps XLA another way: it marks the
ops of the rewritten step, a function built *without* ``jit_compile``, for TensorFlow's own clustering
(``mark_for_compilation_pass``, which runs when the function is instantiated, with no auto-jit flag):

- a *member* gets ``_XlaCompile=true`` and its segment's scope in ``_XlaScope`` (honoured with global jit off) and
  ``_XlaInternalScope`` (honoured with it on); ops of different scopes never share a cluster;
- tflms's copies (swap-outs, swap-ins, codec calls, and the recompute gates that cannot be barriers, below), ops
  placed on the host while the accelerator is another device, and ops without an XLA kernel get
  ``_XlaCompile=false``, which vetoes them even under global jit; so they run in TensorFlow's executor, between
  clusters, and the copies stay copies (the arguments and the other ops XLA never compiles, below, are no candidates
  anyway and keep their attributes).

**Recompute gates.** Outside XLA a gate is an ``Identity`` of a tensor a clone reads, with the trigger as its control
input (:mod:`tflms.passes.recompute`). Left out of the clusters, every gate would be a boundary and split the backward
pass where its clones start (BERT-base: 3405 kernels against 2337). So a gate whose trigger has an output on the
accelerator of a type XLA compiles (:func:`~tflms.ir.xla_gates.barrier_operand`) is a member. Where its cluster
is kept, the pass turns it into ``XlaOptimizationBarrier(gated tensor, that output of the trigger)``; its readers
still read its output 0, and its control edge from the trigger becomes that data edge. The barrier is what JAX's
``checkpoint`` uses to keep its recomputation:

- XLA cannot see through it, so its CSE (``HloCSE``) never merges a clone with the forward op it re-runs, even in
  one cluster;
- the clone depends on the trigger by data, so XLA cannot run it before the trigger;
- XLA:GPU removes the barriers only after scheduling (``OptimizationBarrierExpander`` in gpu_compiler.cc's
  post-scheduling and rematerialization pipelines), so the order holds on a GPU. XLA:CPU removes them after its
  first CSE (cpu_compiler.cc), so there only the merge is prevented;
- a clone fuses into the kernels of the backward ops that read it, as XLA's fusion decides; it reads the gated
  tensor from memory (a barrier's operands are buffers);
- the trigger's output it reads is written to memory too, where XLA would otherwise have fused it away. So where
  the trigger is an op XLA fuses into its consumers (Keras's batch norm in mixed precision casts each incoming
  gradient to float32), the barrier reads instead a tensor the trigger's fused chain reads that reaches memory anyway,
  the output of a library call or reduction that descends from a gradient op, in the same cluster
  (:func:`~tflms.ir.xla_gates.barrier_read`): an input of the same fused kernel, so the clone waits as long.

A gated ``int32``/``int64`` tensor may be an argument XLA needs at compile time (a shape, an axis): behind a barrier
it would be none, and the cluster would fail to compile. Its gate becomes a barrier only where every clone reading it
is element-wise (:data:`~tflms.ir.op_types.XLA_ELEMENTWISE`, whose inputs are all data); otherwise it stays an
``Identity`` inside the cluster, where XLA sees through it to the constant, if each clone reading it differs from its
original by another input or computes integers only; else it stays out (:func:`~tflms.ir.xla_gates.gate_role`).
A gate that would be a barrier but gates a clone that already waits for the same trigger behind a barrier (the first
input of a clone that reads only clones) adds no wait: it stays an ``Identity`` inside the cluster, and the chain
fuses (:func:`~tflms.ir.xla_gates.gates_seen_through`).

**Which ops XLA cannot compile:** :data:`~tflms.ir.op_types.XLA_NEVER_TYPES` (arguments, Python callbacks, ops
that create resources), ops reading or producing a ``string`` or ``variant`` tensor, and ops with no kernel
registered for the accelerator's XLA device (``has_xla_kernel``; ``XLA_CPU_JIT`` or ``XLA_GPU_JIT``). Besides, a
planner may declare op types that the machine it plans for runs outside XLA (:func:`leave_out`, reason ``LEFT_OUT``),
and rules that pick single ops by their attributes and shapes (:mod:`tflms.ir.xla_left_out`): the emulated accelerator
of :mod:`tflms.measure` leaves out the gradients that XLA:CPU lowers into buffers XLA:GPU does not have
(:data:`tflms.measure.emulation.EMULATION_XLA_LEFT_OUT`), and the convolutions whose kernels it reverses
(:data:`~tflms.ir.xla_left_out.SWAPPED_CONV`).

**Variable reads** that nothing orders (a ``ReadVariableOp`` whose only predecessor is its variable's handle) stay out
too, reason ``VARIABLE_READ`` (:func:`~tflms.ir.xla_segments.is_free_variable_read`): each cluster then takes the
variable's own buffer as an input. Inside a cluster, a read whose value other clusters also read (a weight the
backward pass reads again) would be returned by its cluster, and XLA returns a parameter only as a copy.

**The segment rule.** An op left out is a *boundary* when it lies between members: some member reaches it and it
reaches some member (a source such as an argument, or a sink, bounds nothing). The ops are taken in one topological
order, Kahn's over data and control edges where a ready boundary goes first and ties go by graph order, a recompute
clone at the place of the first op other than a clone that it feeds: each copy runs as soon as it can, a swap-out
right after the op that produces its tensor, a swap-in right after its trigger (where the trigger sits inside a fused
chain, after the member where the fewest bytes XLA would fuse cross the cut its swap-in makes: a cluster allocates
its outputs when it starts; :func:`~tflms.ir.xla_copy_cuts.trigger_cuts`); and a clone, appended to the graph
by the rewrite, is not left until no original op is ready. (It was: the weight gradients that read re-run chains
waited with them past the swap-ins that became ready meanwhile, each chain was cut in two, and its first part's
results, buffers of the earlier cluster from its start, waited for the second. BERT-base in mixed_bfloat16 at batch
5460 on h200-141gb, simulated, with one swap added to its closest recompute plan: 296.5 GiB, then 153.9; tflms-xla's
tune there went from a hybrid at 53.5 s a step to one at 5.79 s: :func:`~tflms.ir.xla_segments._where_needed`. Not
better for every plan: with ``clones_last`` the clones go by graph order, and the tune judges both where its winner
is a hybrid, :func:`tflms.tune.xla_cuts.tune_xla`.)
A member's segment is the number of boundaries met before it in that order (consecutive boundaries count once).
With ``land_cuts``, a member that reads a swap-in (a copy of a copy: not a swap-out, whose synchronous readers wait
for it on purpose, nor a recompute gate) also starts a segment where its segment has members already: a swap-in
follows its trigger in the order, so without that cut the ops between the trigger and the swap-in's reader share the
reader's cluster and wait for the copy they could hide (:func:`~tflms.ir.xla_segments.segment_rule`'s ``lands``).
The cut is a boundary like any other, and those ops run and allocate while the copy is on the link, so it can cost
memory: the tune judges both (:func:`tflms.tune.xla_cuts.tune_xla`). A swap-out's *release cut* starts a segment too:
after the last of its tensor's readers near it in the forward pass (and on through the ops XLA fuses to the first
whose output reaches memory), where no boundary ended the swap-out's segment first. A cluster holds its inputs until
it ends, so without it the cluster those readers open holds the swapped tensor to the next boundary, and the copy
frees nothing meanwhile (:func:`~tflms.ir.xla_copy_cuts.release_cuts`). Then, in reverse order, a recompute clone (or
in-cluster gate) or an op without inputs (a constant) whose successors are all members moves to the earliest
segment among them: a clone joins the cluster of the backward ops that read it. Where its gate stays out, XLA cannot
merge it with the forward op it re-runs, which lies in an earlier cluster (XLA's CSE would otherwise undo the
recompute); where its gate is a barrier, the barrier prevents the merge.

**Clusters.** ``mark_for_compilation_pass`` merges along edges, so the members of one segment that no edge between
them joins are clusters of their own (the report counts them so). A cluster of nothing but
:data:`~tflms.ir.op_types.FREE_OPS` (a lone constant, identity or variable read) would launch a compiled kernel to
do nothing: it is left unmarked, to TensorFlow's executor; no path joins it to another member of its segment, or
the two would share a cluster. The segments that keep a cluster are numbered from 0 in order, and the scope of
segment ``k`` is ``lms_xla_segment_k``.

Why no cycle: along every edge the segment never decreases (an op comes after its predecessors in the order, and
the clones and constants move only up to their successors' segments), and it increases across every boundary; so
a path that leaves a segment never comes back, and each segment can be contracted into one cluster, as
``mark_for_compilation_pass``'s cycle check requires. A segment splits where TensorFlow would split its cluster over
resource order (a variable's write and a later read never share a cluster: a Keras optimizer's slot updates and the
variables' updates that read them run as two; :func:`~tflms.ir.xla_segments.segment_rule`), which keeps that order.
TensorFlow may still split a cluster for reasons the rule does not model, never merge two.

**Update parts.** A cluster never updates a variable in place (``XlaCompileOp`` compiles with
``may_alias_resource_update=false``): each new value is a result buffer, allocated when the cluster starts and handed
to the variable when it ends. So the cluster that updates every slot of a Keras optimizer holds every new slot beside
every gradient, a floor no swap or recompute lowers (the zoo ResNet-50's peak in TensorFlow's executor). With
``update_parts`` above 1 (the pipeline's choice where the step as it is does not fit its budget,
:func:`tflms.pipeline.hardware.update_parts_for`) each segment's updates go into parts of about equal bytes, each
with the element-wise ops that feed only it, in segments of their own (:class:`~tflms.ir.xla_segments.UpdateSplit`).
The updates of one part share no edge (each variable's update reads only its own gradient and slot), so a ``NoOp``
(``lms/xla_update_join_<scope>``, in the part's scope) with a control edge to each of them makes the part one
cluster, as ``mark_for_compilation_pass`` merges along edges; and its control inputs from the updates of the part
before make the parts run one after another, as the simulator runs clusters (TensorFlow's executor may start parts
that nothing orders at once, each allocating its new values).

What a boundary costs: a cluster starts when all its inputs exist and publishes its outputs when it ends. So a
swap-out copies its tensor after the producer's whole cluster, and a swap-in lands before the consumer's cluster
starts: the points where tensors leave and return are where the step's kernels stop fusing. With ``land_cuts``, the
cluster between a swap-in's trigger and its reader runs while the copy lands.

Deterministic: the same graph gives the same segments, attributes and GraphDef bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tflms.ir.graph import Graph, Op, TensorRef
from tflms.ir.op_types import FREE_OPS, GRADIENT_OP_TYPES, XLA_FUSIBLE, XLA_NEVER_DTYPES, XLA_NEVER_TYPES
from tflms.passes.result import PassResult
from tflms.ir.names import XLA_JOIN_PREFIX, is_clone, is_inserted

# (the rule and its names live below the passes, where the simulator's xla-clusters clock reads them too)
from tflms.ir.xla_copy_cuts import release_through
from tflms.ir.xla_gates import (BARRIER, BARRIER_READ_DTYPES, GATE_BARRIER, GATE_IDENTITY,  # noqa: F401
                                barrier_operand, barrier_read, fuses_into_readers, gate_role, gates_seen_through,
                                gradient_descendants, is_gate, is_tflms_copy)
from tflms.ir.xla_left_out import check_rules, left_out_by
from tflms.ir.xla_segments import (HOST_OP, LEFT_OUT, NEVER_COMPILED, NO_XLA_KERNEL, SCOPE_PREFIX,
                                   TFLMS_COPY, VARIABLE_READ, XLA_COMPILE_ATTR, XLA_INTERNAL_SCOPE_ATTR,
                                   XLA_SCOPE_ATTR, is_free_variable_read, reads_a_landing,
                                   resource_rules, segment_rule)


@dataclasses.dataclass(frozen=True)
class ClusterReport:
    """What :func:`cluster_for_xla` did.

    ``clusters``: ``(segment, members)`` for each cluster marked, in the pass's order; ``unmarked``: members of
    clusters left to TensorFlow's executor because they would compute nothing (only
    :data:`~tflms.ir.op_types.FREE_OPS`: constants, identities, variable reads); ``boundaries``: the ops left out
    that lie between members; ``outside``: every op left out of the clusters, with why (``TFLMS_COPY``,
    ``HOST_OP``, ``NEVER_COMPILED``, ``VARIABLE_READ``, ``NO_XLA_KERNEL``, ``LEFT_OUT``); ``jit_device``: the XLA device
    the kernels were checked for; ``update_parts``: the segments that are parts of the variables' updates, with how
    many updates each has (module doc, "Update parts"); ``land_cuts``: with ``land_cuts`` on, the members that read a
    swap-in, each of which begins a segment (module doc, "The segment rule"; empty with it off); ``clones_last``:
    whether the recompute clones were ordered by graph position instead of where they are needed.
    """

    clusters: tuple[tuple[int, tuple[str, ...]], ...]
    unmarked: tuple[str, ...]
    boundaries: tuple[str, ...]
    outside: tuple[tuple[str, str], ...]
    jit_device: str
    update_parts: tuple[tuple[int, int], ...] = ()
    land_cuts: tuple[str, ...] = ()
    clones_last: bool = False

    @property
    def num_clusters(self) -> int:
        return len(self.clusters)

    @property
    def num_segments(self) -> int:
        return len({k for k, _ in self.clusters})

    def blocked(self) -> tuple[str, ...]:
        """The boundaries that are not tflms's copies: ops that split the step's clusters because XLA cannot
        compile them, they run on the host, or the machine leaves them out of XLA (:func:`leave_out`)."""
        why = dict(self.outside)
        return tuple(b for b in self.boundaries if why.get(b) != TFLMS_COPY)

    def to_dict(self) -> dict[str, Any]:
        """The report's record (``RewriteReport.xla_clusters``): ``kept`` (whether any cluster was marked),
        ``clusters``, ``segments``, ``cluster_ops`` (members per cluster), ``boundaries`` (how many),
        ``blocked_by`` (a few boundaries that are no copy of tflms), ``unmarked`` (ops of clusters left unmarked),
        ``outside`` (ops left out, counted by why), ``jit_device``, ``update_parts`` (how many clusters update the
        variables in parts), ``land_cuts`` (how many readers of a swap-in begin a segment), ``clones_last``,
        ``why``."""
        blocked = self.blocked()
        if self.clusters:
            why = (f"{self.num_clusters} XLA cluster(s) in {self.num_segments} segment(s) between tflms's copies: "
                   "each segment between swap points has its own _XlaScope, and the copies _XlaCompile=false")
        else:
            why = f"no op of this step can be compiled by {self.jit_device}: it runs without XLA"
        if blocked:
            why += (f"; {len(blocked)} op(s) that run outside XLA (not compiled, on the host or left out) also split "
                    f"segments (e.g. {blocked[0]})")
        if self.update_parts:
            why += (f"; the variables' updates run in {len(self.update_parts)} part(s) of their own, each holding only "
                    "its own new values (XLA clusters update no variable in place)")
        if self.land_cuts:
            why += (f"; {len(self.land_cuts)} reader(s) of a swap-in begin a segment of their own (land cuts, e.g. "
                    f"{self.land_cuts[0]}), so that the ops before them run while the copy lands")
        if self.clones_last and self.clusters:
            why += ("; the recompute clones are ordered last (by graph position) among the ops the copies separate, "
                    "not where the ops they feed run, as the tune found faster for this plan")
        return {"kept": bool(self.clusters), "clusters": self.num_clusters, "segments": self.num_segments,
                "cluster_ops": [len(c) for _, c in self.clusters], "boundaries": len(self.boundaries),
                "blocked_by": list(blocked[:5]), "unmarked": len(self.unmarked),
                "outside": dict(sorted(Counter(w for _, w in self.outside).items())),
                "jit_device": self.jit_device, "update_parts": len(self.update_parts),
                "land_cuts": len(self.land_cuts), "clones_last": self.clones_last, "why": why}


def jit_device_for(accelerator_device: str) -> str:
    """The XLA compilation device of ``accelerator_device``: ``XLA_GPU_JIT`` for a GPU, else ``XLA_CPU_JIT``."""
    return "XLA_GPU_JIT" if "GPU" in accelerator_device.upper() else "XLA_CPU_JIT"


#: The op types and the rules declared by :func:`leave_out`, innermost last.
_DECLARED_LEFT_OUT: list[tuple[Mapping[str, str], tuple[str, ...]]] = []


@contextlib.contextmanager
def leave_out(types: Mapping[str, str], rules: tuple[str, ...] = ()) -> Iterator[None]:
    """Plan for a machine that runs these op types (``{type: why}``), and the ops these ``rules`` pick (names in
    :data:`tflms.ir.xla_left_out.RULES`), outside its XLA clusters, in TensorFlow's executor, though XLA could compile
    them: :func:`cluster_for_xla` leaves them out (reason ``LEFT_OUT``) and the ``xla-clusters`` clock prices them so
    (:func:`tflms.pipeline.hardware.xla_sim_options`). For a step that another machine will run, as
    :func:`tflms.devices.onednn_kernels` declares its kernels."""
    _DECLARED_LEFT_OUT.append((dict(types), check_rules(rules)))
    try:
        yield
    finally:
        _DECLARED_LEFT_OUT.pop()


def left_out() -> Mapping[str, str]:
    """The op types :func:`leave_out` declares here (``{type: why}``; empty outside it)."""
    return _DECLARED_LEFT_OUT[-1][0] if _DECLARED_LEFT_OUT else {}


def left_out_rules() -> tuple[str, ...]:
    """The rules :func:`leave_out` declares here (names in :data:`tflms.ir.xla_left_out.RULES`; none outside it)."""
    return _DECLARED_LEFT_OUT[-1][1] if _DECLARED_LEFT_OUT else ()


def registered_xla_kernels(jit_device: str) -> Callable[[str], bool]:
    """Whether an op type has an XLA kernel for ``jit_device``, from TensorFlow's kernel registry."""
    from tflms._compat.tf import xla_kernel_types
    types = xla_kernel_types(jit_device)
    return types.__contains__


def cluster_for_xla(graph: Graph, *, accelerator_device: str, host_device: str,
                    has_xla_kernel: Callable[[str], bool] | None = None, update_parts: int = 1,
                    land_cuts: bool = False, clones_last: bool = False) -> PassResult:
    """A copy of ``graph`` whose ops are marked for XLA in segments between tflms's copies (see the module doc).

    ``has_xla_kernel(op type)``: whether XLA can compile the type (default: TensorFlow's registry for the
    accelerator's XLA device); ``update_parts``: the most clusters one segment's variable updates split into
    (module doc, "Update parts"; 1: none); ``land_cuts``: a reader of a swap-in starts a segment of its own;
    ``clones_last``: recompute clones are ordered by graph position, not where they are needed (module doc, "The
    segment rule"). The report is a :class:`ClusterReport`.
    """
    jit_device = jit_device_for(accelerator_device)
    if has_xla_kernel is None:
        has_xla_kernel = registered_xla_kernels(jit_device)
    on_host = _host_check(accelerator_device, host_device)
    declared, rules = left_out(), left_out_rules()
    roles = {op.name: _gate_role(graph, op, on_host, has_xla_kernel) for op in graph if _is_gate(op)}
    preds, succs = graph.adjacency()
    topological = graph.topological_order((preds, succs))
    for name in _seen_through(graph, topological, roles):
        roles[name] = GATE_IDENTITY
    outside = {op.name: why for op in graph
               if (why := _why_outside(graph, op, on_host, has_xla_kernel, roles, declared, rules))}
    index = {op.name: i for i, op in enumerate(graph)}

    def value_bytes(name: str) -> int | None:
        ins = graph.op(name).inputs
        return graph.tensor(ins[1]).num_bytes if len(ins) > 1 else None

    resource, updates = resource_rules({op.name: op.type for op in graph}, value_bytes, update_parts)
    def lands(name: str) -> bool:  # a swap-in: a copy of a copy (not a swap-out, which may hold its readers back)
        op = graph.op(name)
        return (outside[name] == TFLMS_COPY and not _is_gate(op)
                and any(outside.get(r.op) == TFLMS_COPY for r in op.inputs))

    def fused_bytes(name: str) -> int:  # a member's output bytes where XLA fuses it (what a cut there writes)
        op = graph.op(name)
        return sum(t.num_bytes or 0 for t in op.outputs) if release_through(op.type) else 0

    def leaves(name: str) -> bool:  # a swap-out (or an encoder): a copy of a member's tensor
        op = graph.op(name)
        return (outside[name] == TFLMS_COPY and not _is_gate(op)
                and any(r.op not in outside for r in op.inputs))

    order, boundary, segment, clusters, parts = segment_rule(topological, index, preds, succs, outside, is_clone,
                                                             resource, updates, lands if land_cuts else None,
                                                             clones_last, leaves,
                                                             lambda name: release_through(graph.op(name).type),
                                                             lands, fused_bytes)
    kept = [c for c in clusters if not all(graph.op(n).type in FREE_OPS for n in c)]
    numbers = {s: k for k, s in enumerate(sorted({segment[c[0]] for c in kept}))}
    new = graph.copy()
    read = _barrier_reads(graph, segment, on_host)
    for cluster in kept:
        scope = f"{SCOPE_PREFIX}{numbers[segment[cluster[0]]]}".encode()
        for name in cluster:
            if roles.get(name) == GATE_BARRIER:
                _to_barrier(new, name, on_host, read)
            _set_attrs(new.op(name), {XLA_COMPILE_ATTR: True, XLA_SCOPE_ATTR: scope, XLA_INTERNAL_SCOPE_ATTR: scope})
    before: list[str] = []  # the updates of the part before
    for s in sorted(parts):  # each update part one cluster, one after another (module doc, "Update parts")
        writers = parts[s]
        scope = f"{SCOPE_PREFIX}{numbers[s]}".encode()
        join = new.add_op(f"{XLA_JOIN_PREFIX}{numbers[s]}", "NoOp", device=new.op(writers[0]).device,
                          control_inputs=before)
        _set_attrs(join, {XLA_COMPILE_ATTR: True, XLA_SCOPE_ATTR: scope, XLA_INTERNAL_SCOPE_ATTR: scope})
        for w in writers:
            new.add_control_input(w, join.name)
        before = writers
    for name, why in outside.items():
        if why != NEVER_COMPILED:
            _set_attrs(new.op(name), {XLA_COMPILE_ATTR: False})
    marked = set(kept)
    marked_ops = {n for c in kept for n in c}
    report = ClusterReport(
        clusters=tuple((numbers[segment[c[0]]], c) for c in kept),
        unmarked=tuple(n for c in clusters if c not in marked for n in c),
        boundaries=tuple(n for n in order if n in boundary),
        outside=tuple((n, outside[n]) for n in order if n in outside), jit_device=jit_device,
        update_parts=tuple((numbers[s], len(w)) for s, w in sorted(parts.items())),
        land_cuts=tuple(n for n in order if land_cuts and n in marked_ops
                        and reads_a_landing(preds[n], boundary, lands)), clones_last=clones_last)
    return PassResult(new, changed=bool(kept) or any(w != NEVER_COMPILED for w in outside.values()), report=report)


def _host_check(accelerator_device: str, host_device: str) -> Callable[[str], bool]:
    """Whether an op's device is the host, where the host is another device than the accelerator."""
    def kind(device: str) -> str:
        tail = device.rpartition("/device:")[2] or device.rpartition("/")[2]
        return tail.upper()

    host, accelerator = kind(host_device), kind(accelerator_device)
    if host == accelerator:
        return lambda device: False
    return lambda device: bool(device) and kind(device) == host


def _why_outside(graph: Graph, op: Op, on_host: Callable[[str], bool], has_xla_kernel: Callable[[str], bool],
                 roles: dict[str, str | None], declared: Mapping[str, str], rules: tuple[str, ...] = ()) -> str | None:
    """Why ``op`` stays out of every cluster, or ``None`` for a member (``roles``: each recompute gate's,
    :func:`_gate_role`; ``declared`` and ``rules``: the types and rules :func:`leave_out` declares)."""
    if is_tflms_copy(op.type, op.name) and roles.get(op.name) is None:
        return TFLMS_COPY
    if on_host(op.device):
        return HOST_OP
    dtypes = [t.dtype for t in op.outputs] + [graph.tensor(r).dtype for r in op.inputs]
    if op.type in XLA_NEVER_TYPES or any(d in XLA_NEVER_DTYPES for d in dtypes):
        return NEVER_COMPILED
    if is_free_variable_read(op.type, (graph.op(p).type for p in (*(r.op for r in op.inputs), *op.control_inputs))):
        return VARIABLE_READ
    if not has_xla_kernel(op.type):
        return NO_XLA_KERNEL
    if op.type in declared or (rules and left_out_by(rules, op, [graph.tensor(r) for r in op.inputs])):
        return LEFT_OUT
    return None


def _is_gate(op: Op) -> bool:
    return is_gate(op.type, op.name)


def _gate_role(graph: Graph, gate: Op, on_host: Callable[[str], bool],
               has_xla_kernel: Callable[[str], bool]) -> str | None:
    """Where ``gate`` sits in a step that keeps XLA (:func:`~tflms.ir.xla_gates.gate_role`): ``None`` keeps it out
    of the clusters (so do a trigger that is not its only control input, and an XLA without barriers)."""
    if len(gate.control_inputs) != 1 or not gate.inputs or not has_xla_kernel(BARRIER):
        return None
    trigger = graph.op(gate.control_inputs[0])
    readers = [(op.type, [graph.tensor(r).dtype for r in op.inputs], [t.dtype for t in op.outputs])
               for op in (graph.op(c) for c in dict.fromkeys(c for c, _ in graph.consumers(TensorRef(gate.name, 0))))]
    return gate_role(graph.tensor(gate.inputs[0]).dtype, [t.dtype for t in trigger.outputs],
                     not on_host(trigger.device), readers)


def _seen_through(graph: Graph, order: list[str], roles: dict[str, str | None]) -> set[str]:
    """The barrier gates that stay ``Identity`` s instead (:func:`~tflms.ir.xla_gates.gates_seen_through`)."""
    def trigger(gate: str) -> str | None:
        controls = graph.op(gate).control_inputs
        return controls[0] if len(controls) == 1 else None

    def gated_clone(gate: str) -> str | None:
        producer = graph.op(gate).inputs[0].op
        return producer if is_clone(producer) else None

    def input_gates(clone: str) -> list[str]:
        return [ref.op for ref in graph.op(clone).inputs if ref.op in roles]

    return gates_seen_through([n for n in order if n in roles], lambda g: roles[g] == GATE_BARRIER, trigger,
                              gated_clone, input_gates)


def _barrier_reads(graph: Graph, segment: Mapping[str, int], on_host: Callable[[str], bool]
                   ) -> Callable[[str, TensorRef], TensorRef]:
    """``read(gate, trigger output)``: the tensor the barrier ``gate`` reads to wait for its trigger
    (:func:`~tflms.ir.xla_gates.barrier_read`): ``segment``: the members' segments (the walk stays in the gate's)."""
    descends = gradient_descendants(lambda n: [ref.op for ref in graph.op(n).inputs],
                                    lambda n: graph.op(n).type in GRADIENT_OP_TYPES)

    def fused(name: str) -> bool:
        op = graph.op(name)
        return (name in segment and op.type in XLA_FUSIBLE and len(op.outputs) == 1 and not on_host(op.device)
                and fuses_into_readers([(c, graph.op(c).type) for c, _ in graph.consumers(op.output(0))]))

    def read(gate: str, trigger: TensorRef) -> TensorRef:
        def may_read(ref: TensorRef) -> bool:
            return (segment.get(ref.op) == segment[gate] and not is_inserted(ref.op)
                    and not on_host(graph.op(ref.op).device)
                    and graph.tensor(ref).dtype in BARRIER_READ_DTYPES and descends(ref.op))
        return barrier_read(trigger, lambda ref: ref.op, lambda n: graph.op(n).inputs, fused, may_read)
    return read


def _to_barrier(graph: Graph, name: str, on_host: Callable[[str], bool],
                read: Callable[[str, TensorRef], TensorRef]) -> None:
    """Turn the gate ``name`` (of the pass's copy) into an ``XlaOptimizationBarrier`` of the tensor it gates and a
    tensor that waits for its trigger (``read``: an output of the trigger,
    :func:`~tflms.ir.xla_gates.barrier_operand`, or one its fused chain reads), in place of its control edge from
    the trigger: its readers keep reading its output 0, the gated tensor (module doc, "Recompute gates")."""
    from tensorflow.core.framework import attr_value_pb2

    import tensorflow as tf
    gate = graph.op(name)
    trigger_op = graph.op(gate.control_inputs[0])
    k = barrier_operand([t.dtype for t in trigger_op.outputs], not on_host(trigger_op.device))
    trigger = read(name, TensorRef(trigger_op.name, k))
    graph.remove_control_input(name, trigger_op.name)
    graph.append_input(name, trigger)
    gate.outputs = (gate.outputs[0], graph.tensor(trigger))
    types = [tf.as_dtype(t.dtype).as_datatype_enum for t in gate.outputs]
    gate.type = BARRIER
    _set_attrs(gate, {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=types))})


def _set_attrs(op: Op, values: dict[str, Any]) -> None:
    """Give ``op`` (of the pass's copy) these attributes: a new ``NodeDef`` or attribute map, never the input's."""
    from tensorflow.core.framework import attr_value_pb2
    attrs = {k: v if isinstance(v, attr_value_pb2.AttrValue) else
             attr_value_pb2.AttrValue(b=v) if isinstance(v, bool) else attr_value_pb2.AttrValue(s=v)
             for k, v in values.items()}
    if op.node_def is not None:
        from tensorflow.core.framework import node_def_pb2
        node = node_def_pb2.NodeDef()
        node.CopyFrom(op.node_def)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        op.node_def, op.attrs = node, node.attr
    else:
        op.attrs = {**dict(op.attrs), **attrs}
