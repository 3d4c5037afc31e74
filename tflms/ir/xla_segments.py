"""The XLA segment rule (issue 47): which ops share a cluster between tflms's copies, over names or op ids.

:mod:`tflms.passes.xla_clusters` marks a rewritten step's ops with it, and the simulator's ``xla-clusters`` clock
(:mod:`tflms.sim.clusters`) prices each tuner candidate with it, so both live below them. The rule, its reasons and
why it closes no cycle are in :mod:`tflms.passes.xla_clusters`'s doc. Where a copy's cut goes is decided in
:mod:`tflms.ir.xla_copy_cuts`, where a recompute gate sits in :mod:`tflms.ir.xla_gates`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from tflms.ir.op_types import (SOURCE_OPS, XLA_ASSIGNS, XLA_ELEMENTWISE, XLA_RESOURCE_MODIFIES, XLA_RESOURCE_READS,
                               XLA_RESOURCE_WRITES)
from tflms.ir.topo import connected_groups, priority_order
from tflms.ir.xla_copy_cuts import release_cuts, trigger_cuts

#: A node of :func:`segment_rule`: an op name in the pass, an op id in the simulator.
Node = TypeVar("Node", bound=Hashable)

XLA_COMPILE_ATTR = "_XlaCompile"
XLA_SCOPE_ATTR = "_XlaScope"
XLA_INTERNAL_SCOPE_ATTR = "_XlaInternalScope"
#: The scope of segment ``k`` is this prefix and ``k``.
SCOPE_PREFIX = "lms_xla_segment_"

#: Why an op stays out of every cluster (:attr:`tflms.passes.xla_clusters.ClusterReport.outside`).
TFLMS_COPY = "tflms copy"         # swap-out, swap-in, recompute gate, codec call: it must stay a copy
HOST_OP = "host op"               # placed on the host while the accelerator is another device
NEVER_COMPILED = "never compiled"  # XLA_NEVER_TYPES or a string/variant tensor
NO_XLA_KERNEL = "no XLA kernel"   # no kernel registered for the accelerator's XLA device
LEFT_OUT = "left out"             # a type the machine planned for runs outside XLA (xla_clusters.leave_out)
VARIABLE_READ = "variable read"   # a read of a variable that nothing orders (is_free_variable_read)


def segment_rule(topological: Sequence[Node], index: Mapping[Node, int], preds: Mapping[Node, Sequence[Node]],
                 succs: Mapping[Node, Sequence[Node]], outside: Mapping[Node, str],
                 clone: Callable[[Node], bool], resource: Mapping[Node, str] | None = None,
                 updates: UpdateSplit | None = None, lands: Callable[[Node], bool] | None = None,
                 clones_last: bool = False, leaves: Callable[[Node], bool] | None = None,
                 through: Callable[[Node], bool] | None = None, triggered: Callable[[Node], bool] | None = None,
                 fused_bytes: Callable[[Node], int] | None = None
                 ) -> tuple[list[Node], set[Node], dict[Node, int], list[tuple], dict[int, list[Node]]]:
    """The segment rule of the module doc over any graph whose nodes are names (this pass) or op ids (the simulator's
    ``xla-clusters`` clock, :mod:`tflms.sim.clusters`, which prices what this pass will mark).

    ``topological``: the nodes in some topological order; ``index``: each node's graph position (ties);
    ``preds`` / ``succs``: data and control neighbours of every node; ``outside``: the nodes left out (with why);
    ``clone(node)``: a recompute clone; ``resource``: the resource ops among the nodes and their kind
    (:func:`resource_kind`), for :func:`_resource_split`; ``updates``: how the variables' updates split into parts
    (:class:`UpdateSplit`; ``None``: they do not); ``lands(node)``: whether a boundary is a swap-in (a copy of a
    copy), whose readers start a segment of their own (:func:`_segments`; ``None``: no such cut); ``clones_last``:
    the clones go by graph order too, not where they are needed (:func:`_where_needed`); ``leaves(node)``: whether a
    boundary is a swap-out (a copy of a member's tensor, no recompute gate), whose tensor's readers near it end a
    segment, up to the first whose output XLA writes (``through(node)``: an op XLA fuses, read through;
    :func:`~tflms.ir.xla_copy_cuts.release_cuts`; ``None``: no such cut); ``triggered(node)``: whether a boundary is
    a copy back (a swap-in, with or without land cuts), whose cut moves to where the fewest bytes that XLA would fuse
    cross it (``fused_bytes(node)``: a member's output bytes where XLA fuses it, else 0;
    :func:`~tflms.ir.xla_copy_cuts.trigger_cuts`; either ``None``: it goes into the order as soon as it is ready).
    Returns ``(order, boundaries, segment of each member, clusters, parts)``: the order the segments follow, the
    left-out nodes between members, the clusters (members joined by edges in one segment, or updates of one part,
    each in ``order``), sorted by segment then first member, the free-only ones included; and the segments that are
    update parts, with their updates (a caller that marks the graph joins them, as
    :func:`tflms.passes.xla_clusters.cluster_for_xla` does with a ``NoOp``).
    """
    boundary = _boundaries(topological, preds, succs, outside)
    where = _where_needed(topological, index, succs, (lambda n: False) if clones_last else clone)
    deferred = (trigger_cuts(where, preds, succs, outside, boundary, triggered, fused_bytes)
                if triggered is not None and fused_bytes is not None else {})
    order = _boundaries_first(where, preds, succs, boundary, deferred)
    releases = (release_cuts(where, preds, succs, outside, boundary, leaves, through)
                if leaves is not None and through is not None else {})
    segment = _segments(order, preds, outside, boundary, lands, releases)
    if resource:
        _resource_split(order, preds, succs, segment, resource)
    parts = _update_split(order, preds, succs, segment, updates) if updates is not None else {}
    _move_up(order, preds, succs, segment, clone)
    position = {name: i for i, name in enumerate(order)}
    joins = [(ws[0], w) for ws in parts.values() for w in ws[1:]]
    clusters = sorted(_clusters(order, preds, segment, joins), key=lambda c: (segment[c[0]], position[c[0]]))
    return order, boundary, segment, clusters, parts


#: :func:`resource_kind`'s answers.
READ, WRITE, MODIFY = "read", "write", "modify"


def resource_kind(op_type: str) -> str | None:
    """What an XLA cluster does with an op's resource: :data:`READ`, :data:`WRITE`, :data:`MODIFY` (both), or
    ``None`` for no resource op (:data:`~tflms.ir.op_types.XLA_RESOURCE_READS` and the sets beside it)."""
    if op_type in XLA_RESOURCE_READS:
        return READ
    if op_type in XLA_RESOURCE_WRITES:
        return WRITE
    if op_type in XLA_RESOURCE_MODIFIES:
        return MODIFY
    return None


def _resource_split(order: Sequence[Node], preds: Mapping[Node, Sequence[Node]],
                    succs: Mapping[Node, Sequence[Node]], segment: dict[Node, int], resource: Mapping[Node, str]
                    ) -> None:
    """Split each segment where TensorFlow splits its cluster over resource operations, and number them again.

    A cluster reads all its resources at its start and writes them at its end, so ``mark_for_compilation_pass`` keeps
    apart any write (or modify) and a read (or modify) that a path orders after it, of any resource
    (``resource_operation_safety_analysis.cc``: only the edges read-to-anything and anything-to-write are safe). A
    Keras optimizer assigns each slot and then reads it (SGD's momentum: ``m.assign(...)``, then
    ``variable.assign_add(m)``), so TensorFlow runs the slots' update and the variables' in two clusters. Here each
    member takes the highest part of its segment among its predecessors there, and a read or modify one past every
    write or modify reaching it in its segment: the fewest parts that keep every such pair apart. Then, in reverse
    order, an op that is no resource op and all of whose successors lie in later parts of its segment moves to the
    earliest of them: Adam's step size, computed once from the step counter for every variable, joins the variables'
    updates that read it, which nothing else joins (on the 3D U-Net they ran as one cluster each: 74 ``_XlaRun`` for
    23).
    A part follows its predecessors' along every edge, so no cycle appears."""
    part: dict[Node, int] = {}
    written: dict[Node, int] = {}  # the highest part of a write or modify that reaches the member (-1: none)
    for name in order:
        s = segment.get(name)
        if s is None:
            continue
        same = [p for p in preds[name] if segment.get(p) == s]
        k = max((part[p] for p in same), default=0)
        w = max((written[p] for p in same), default=-1)
        kind = resource.get(name)
        if kind in (READ, MODIFY):
            k = max(k, w + 1)
        part[name] = k
        written[name] = max(w, k) if kind in (WRITE, MODIFY) else w
    if not any(part.values()):
        return
    for name in reversed(order):
        s = segment.get(name)
        if s is None or name in resource or not succs[name] or any(segment.get(x) != s for x in succs[name]):
            continue
        part[name] = max(part[name], min(part[x] for x in succs[name]))
    _renumber(segment, part)


def _renumber(segment: dict[Node, int], part: Mapping[Node, int]) -> None:
    """Number the segments again after a split: by segment, then by part within it, from 0."""
    ranks = {key: r for r, key in enumerate(sorted({(s, part[n]) for n, s in segment.items()}))}
    for name, s in segment.items():
        segment[name] = ranks[(s, part[name])]


#: :class:`UpdateSplit`'s defaults: the most parts one segment's updates split into, and the fewest bytes a part
#: writes. Each part costs a cluster's launches (two executor ops); it holds its new values alone.
UPDATE_PARTS, UPDATE_PART_MIN_BYTES = 16, 4 << 20


@dataclasses.dataclass(frozen=True)
class UpdateSplit:
    """How :func:`segment_rule` splits the variables' updates of a segment into clusters of their own.

    ``written``: the bytes each variable update among the nodes writes (its new value); ``fusible(node)``: an op XLA
    fuses into its consumers (element-wise, a cast, a read of a variable), which may follow its update into a part;
    ``parts`` / ``min_bytes``: a segment's updates go into at most ``parts`` parts, each writing at least
    ``min_bytes`` (fewer parts where the segment writes less, none under ``2 * min_bytes``).

    Why (:func:`_update_split`): a cluster never updates a variable in place, and allocates every new value when it
    starts, so the cluster that updates all of a model's slots holds every new slot beside every gradient."""

    written: Mapping
    fusible: Callable
    parts: int = UPDATE_PARTS
    min_bytes: int = UPDATE_PART_MIN_BYTES


#: The ops that may follow a variable's update into its part (:class:`UpdateSplit`): element-wise ones (their inputs
#: are no larger than their outputs, but for broadcast scalars) and variable reads.
UPDATE_FOLLOWERS = XLA_ELEMENTWISE | frozenset({"ReadVariableOp"})


def update_split(types: Mapping[Node, str], value_bytes: Callable[[Node], int | None],
                 parts: int = UPDATE_PARTS) -> UpdateSplit:
    """The :class:`UpdateSplit` of a graph whose nodes have ``types``: the variable updates
    (:data:`~tflms.ir.op_types.XLA_ASSIGNS`) write their value input's bytes (``value_bytes(node)``)."""
    written = {n: b for n, t in types.items() if t in XLA_ASSIGNS and (b := value_bytes(n))}
    return UpdateSplit(written, lambda n: types[n] in UPDATE_FOLLOWERS, parts)


def resource_rules(types: Mapping[Node, str], value_bytes: Callable[[Node], int | None],
                   update_parts: int) -> tuple[dict[Node, str], UpdateSplit | None]:
    """What :func:`segment_rule` takes about a graph's resource ops, whose nodes have ``types``: each resource op's
    kind (:func:`resource_kind`), and the updates' split into ``update_parts`` (:func:`update_split`; ``None`` for
    fewer than 2). The pass and the simulator's ``xla-clusters`` clock both call it, so they split alike."""
    resource = {n: kind for n, t in types.items() if (kind := resource_kind(t))}
    return resource, (update_split(types, value_bytes, update_parts) if update_parts > 1 else None)


def _update_split(order: Sequence[Node], preds: Mapping[Node, Sequence[Node]], succs: Mapping[Node, Sequence[Node]],
                  segment: dict[Node, int], split: UpdateSplit) -> dict[int, list[Node]]:
    """Split each segment's variable updates into parts of their own, number the segments again, and return the
    parts' segments with their updates (in ``order``).

    ``_XlaCompile`` clusters write no variable in place: each new value is a result buffer, allocated when the cluster
    starts and handed to the variable when it ends (:mod:`tflms.sim.clusters`, "Variable updates"). One cluster that
    updates every momentum of a Keras SGD holds every new momentum beside every gradient: on the zoo ResNet-50 (64x64,
    batch 16) that was the step's peak in TensorFlow's executor, 179.9 MiB, higher than anything the backward pass
    held. In parts, a part holds its own new values beside the gradients not yet used.

    The updates of one segment (in ``order``) go into ``k`` contiguous parts of about equal bytes (``k`` as
    :class:`UpdateSplit` says). With each update go the fusible ops all of whose successors lie in its part (the
    ``Mul`` s and ``Sub`` of the new momentum, the read of a slot), never a convolution or a reduction, whose inputs
    would then live until the part runs. Each member then takes the highest part among its predecessors in its segment
    (an op that waits for several updates follows the last), so the parts follow one another along every edge and no
    cycle appears."""
    writers: dict[int, list[Node]] = {}
    for name in order:
        if name in split.written and name in segment:
            writers.setdefault(segment[name], []).append(name)
    part: dict[Node, int] = {}
    for ws in writers.values():
        total = sum(split.written[w] for w in ws)
        k = min(split.parts, len(ws), total // max(split.min_bytes, 1))
        if k < 2:
            continue
        before = 0
        for w in ws:
            part[w] = 1 + min(k - 1, before * k // total)
            before += split.written[w]
    if not part:
        return {}
    for name in reversed(order):
        if name in part or name not in segment or not split.fusible(name):
            continue
        after = succs[name]
        if after and all(segment.get(x) == segment[name] for x in after):
            theirs = {part.get(x) for x in after}
            if len(theirs) == 1 and None not in theirs:
                part[name] = theirs.pop()
    level: dict[Node, int] = {}
    for name in order:
        s = segment.get(name)
        if s is None:
            continue
        level[name] = max([part.get(name, 0), *(level[p] for p in preds[name] if segment.get(p) == s)])
    _renumber(segment, level)
    parts: dict[int, list[Node]] = {}
    for name in order:
        if name in split.written and level.get(name, 0) > 0:
            parts.setdefault(segment[name], []).append(name)
    return parts


def _boundaries(order: list[str], preds: dict[str, list[str]], succs: dict[str, list[str]],
                outside: dict[str, str]) -> set[str]:
    """The ops left out that some member reaches and that reach some member."""
    after_member: set[str] = set()  # ops some member reaches
    for name in order:
        if any(p not in outside or p in after_member for p in preds[name]):
            after_member.add(name)
    before_member: set[str] = set()  # ops that reach some member
    for name in reversed(order):
        if any(s not in outside or s in before_member for s in succs[name]):
            before_member.add(name)
    return {n for n in outside if n in after_member and n in before_member}


def _where_needed(topological: Sequence[Node], index: Mapping[Node, int], succs: Mapping[Node, Sequence[Node]],
                  clone: Callable[[Node], bool]) -> dict[Node, tuple[int, int]]:
    """Each node's place among the ready ones in :func:`_boundaries_first`: ``(index, 0)``, but for a recompute
    clone, ``(the smallest index of the ops other than clones that it feeds, its own index)``: a clone is ordered as
    if it stood right before the first op it serves.

    A rewrite appends its clones to the graph, so by graph order alone a ready clone waits until no original op is
    ready. The ops that read it wait with it (a weight's gradient reads the re-run input of its product; the
    input's gradient, which does not, goes on), past the boundaries that become ready meanwhile; a chain of clones is
    then cut in two, and the first part's results (re-run softmax, dropout and GELU tensors), allocated when its
    cluster starts, wait for the second (module doc of :mod:`tflms.passes.xla_clusters`, "The segment rule")."""
    where: dict[Node, tuple[int, int]] = {}
    for n in reversed(topological):
        if clone(n):
            fed = [where[s][0] for s in succs[n] if s in where]
            where[n] = (min(fed, default=index[n]), index[n])
        else:
            where[n] = (index[n], 0)
    return where


def _boundaries_first(where: Mapping[Node, tuple[int, int]], preds: Mapping[Node, Sequence[Node]],
                      succs: Mapping[Node, Sequence[Node]], boundary: set[Node],
                      deferred: Mapping[Node, Node] | None = None) -> list[Node]:
    """Kahn's order over data and control edges where a ready boundary goes first, then each node's place
    (:func:`_where_needed`: graph order, a clone where it is needed); a ``deferred`` boundary goes as if it stood
    right after the member it waits for (:func:`~tflms.ir.xla_copy_cuts.trigger_cuts`)."""
    deferred = deferred or {}

    def place(n: Node) -> tuple:
        if n in deferred:
            return True, (*where[deferred[n]], 1, where[n])
        return n not in boundary, where[n]
    return priority_order({n: len(p) for n, p in preds.items()}, succs, place)


def _segments(order: list[Node], preds: Mapping[Node, Sequence[Node]], outside: Mapping[Node, str],
              boundary: set[Node], lands: Callable[[Node], bool] | None = None,
              releases: Mapping[Node, frozenset[Node]] | None = None) -> dict[Node, int]:
    """Each member's segment: the boundaries met before it in ``order``, consecutive ones counted once; a member
    that reads a boundary which ``lands`` (a swap-in) starts a segment, where its segment has members already; and so
    does the member after the last of a swap-out's ``releases`` (:func:`~tflms.ir.xla_copy_cuts.release_cuts`) met
    in the segment the swap-out opens (where a boundary comes first, that segment has ended already, and the cut is
    not made).

    A boundary goes into the order as soon as it is ready, so a swap-in follows its trigger, and the ops between the
    trigger and the swap-in's reader share the reader's cluster, which starts only when all its inputs exist: they
    wait for the copy they could hide. Cut before the reader too, and they run as a cluster of their own while the
    copy lands (module doc of :mod:`tflms.passes.xla_clusters`, "The segment rule")."""
    releases = releases or {}
    segment: dict[Node, int] = {}
    current, open_, cut = 0, False, False
    pending: list[set[Node]] = []  # the releases of the swap-outs that opened this segment, not yet all met
    for name in order:
        if name in boundary:
            if open_:
                current, open_, pending = current + 1, False, []
            if name in releases:
                pending.append(set(releases[name]))
        elif name not in outside:
            if open_ and (cut or (lands is not None and reads_a_landing(preds[name], boundary, lands))):
                current += 1
            segment[name] = current
            open_, cut = True, False
            for waits in pending:
                waits.discard(name)
            if any(not waits for waits in pending):
                pending, cut = [waits for waits in pending if waits], True
    return segment


def reads_a_landing(preds: Sequence[Node], boundary: set[Node], lands: Callable[[Node], bool]) -> bool:
    """Whether a member with these ``preds`` reads a boundary that ``lands`` (a swap-in): with land cuts, it begins
    a segment (:func:`_segments`)."""
    return any(p in boundary and lands(p) for p in preds)


def _clusters(order: list[str], preds: dict[str, list[str]], segment: dict[str, int],
              joins: Sequence[tuple] = ()) -> list[tuple[str, ...]]:
    """The clusters TensorFlow can make of the segments: the members of one segment joined by edges between them
    (``mark_for_compilation_pass`` merges along edges, so a segment's unconnected parts are clusters of their own),
    or by ``joins`` (the updates of one part, which the pass joins), each in ``order``."""
    members = [name for name in order if name in segment]
    joined = [(p, name) for name in members for p in preds[name] if p in segment and segment[p] == segment[name]]
    return [tuple(g) for g in connected_groups(members, [*joined, *joins])]


def connected_clusters(order: Sequence[Node], preds: Mapping[Node, Sequence[Node]],
                       segment: Mapping[Node, Hashable]) -> list[tuple]:
    """The clusters ``mark_for_compilation_pass`` makes of ops marked with ``segment`` (a segment number, or an
    ``_XlaScope``): those of one segment joined by edges between them, each in ``order``."""
    return _clusters(order, preds, segment)


def _move_up(order: list[Node], preds: Mapping[Node, Sequence[Node]], succs: Mapping[Node, Sequence[Node]],
             segment: dict[Node, int], clone: Callable[[Node], bool]) -> None:
    """Move each recompute clone and each member without inputs whose successors are all members to the earliest
    of their segments (in reverse order, so that a chain of clones moves together)."""
    for name in reversed(order):
        if name not in segment or not succs[name] or not (clone(name) or not preds[name]):
            continue
        if all(s in segment for s in succs[name]):
            segment[name] = max(segment[name], min(segment[s] for s in succs[name]))


def is_free_variable_read(op_type: str, pred_types: Iterable[str]) -> bool:
    """Whether an op is a ``ReadVariableOp`` whose only predecessors are the step's arguments (its variable's handle;
    no control input), which stays out of every cluster (reason ``VARIABLE_READ``).

    Inside a cluster, a read whose value another cluster (or an op outside) also reads becomes an output of its
    cluster, and XLA returns an entry parameter only as a copy (``CopyInsertion`` copies the live-out parameters it
    may not alias), so the cluster writes a second copy of the variable that lives until its last reader (the zoo
    ResNet-50's forward module returned one of each weight the backward pass reads: docs/design.md, "What XLA:CPU
    allocated, separated"). Outside, the read hands each cluster the variable's own buffer as an input. Nothing reaches
    such a read, so leaving it out bounds no segment and the clusters are the same. ``pred_types`` is read only for a
    ``ReadVariableOp`` (callers on every op pass a generator).
    """
    return op_type == "ReadVariableOp" and all(t in SOURCE_OPS for t in pred_types)
