"""Ops that TensorFlow merges into one node after tflms hands a graph back, and the cycles that closes.

tflms's passes keep the IR acyclic, but the graph TensorFlow runs is not the IR: at graph partitioning, after the
rewrite, oneDNN's layout pass (``mkl_layout_pass.cc``, on by default on x86 CPUs) merges pairs of nodes into one
(its ``minfo_`` table; ``CheckForNodeMerge``):

- ``Conv2DBackpropFilter`` and the ``BiasAddGrad`` reading the same output gradient (the filter gradient's input 2,
  the bias gradient's input 0: the same producing node) into ``_MklConv2DBackpropFilterWithBias``; float32 only;
- ``Conv2D`` and the ``BiasAdd`` that is its output's only reader (``_MklConv2DWithBias``);
- ``Pad`` and the ``Conv2D`` / ``_FusedConv2D`` it feeds as input 0 with ``VALID`` padding (``_MklPadWith...``);

each only when both nodes carry the same control inputs and the same device. The merged node waits for every input of
both and feeds every reader of both. A path from one member to the other through other ops, which the IR allows
(e.g. ``BiasAddGrad`` -> the bias's optimizer update -> an order edge -> a swap-in trigger -> a recompute clone ->
``Conv2DBackpropFilter``), becomes a cycle, and TensorFlow refuses the step ("N nodes in a cycle") at its first call
(issue 45).

**The invariant** (docs/design.md, "Runnable graphs"): the IR with each merge group contracted to one node is
acyclic. :func:`merge_groups` models the groups; :func:`merge_cycle` checks the invariant (``Graph.lint`` runs it);
:func:`merge_unit_edges` gives the scheduler the edges that keep every order it builds consistent with the merges.
The groups are modelled on every machine, GPU ones included, so that a rewrite is the same wherever it is made: on a
GPU nothing merges, and the only cost is that a bias gradient waits for its filter gradient's inputs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tflms.ir.op_types import ONEDNN_CONV_BIAS as CONV_BIAS
from tflms.ir.op_types import ONEDNN_FILTER_BIAS_GRADS as FILTER_BIAS_GRADS
from tflms.ir.op_types import ONEDNN_PAD_CONVS as PAD_CONVS
from tflms.ir.topo import connected_groups


def _attr_s(op, key: str) -> str | None:
    attrs = op.attrs
    if attrs is None or key not in attrs:
        return None
    value = attrs[key]
    return value.s.decode() if value.s else None


def _attr_type(op, key: str) -> int | None:
    attrs = op.attrs
    if attrs is None or key not in attrs:
        return None
    return attrs[key].type


def _same_unit(graph, a: str, b: str) -> bool:
    """Whether oneDNN would merge ``a`` and ``b`` as far as their control inputs and devices go."""
    x, y = graph.op(a), graph.op(b)
    return set(x.control_inputs) == set(y.control_inputs) and x.device == y.device


def merge_groups(graph) -> list[tuple[str, str]]:
    """The pairs of ops oneDNN's layout pass would merge into one node (see the module doc), in graph order.

    Modelled wider where TensorFlow's choice depends on the order it visits nodes in: a bias gradient whose output
    gradient feeds several filter gradients is paired with each of them.
    """
    pairs: list[tuple[str, str]] = []
    float32 = 1  # DT_FLOAT
    for op in graph:
        if op.type == FILTER_BIAS_GRADS[1] and op.inputs and _attr_type(op, "T") in (None, float32):
            source = op.inputs[0].op
            fmt = _attr_s(op, "data_format")
            for k in range(len(graph.op(source).outputs)):
                for reader, slot in graph.consumers(graph.op(source).output(k)):
                    other = graph.op(reader)
                    if (other.type == FILTER_BIAS_GRADS[0] and slot == 2 and _attr_s(other, "data_format") == fmt
                            and _same_unit(graph, op.name, reader)):
                        pairs.append((reader, op.name))
        elif op.type == CONV_BIAS[0] or op.type == "Pad":
            readers = {c for k in range(len(op.outputs)) for c, _ in graph.consumers(op.output(k))}
            if len(readers) != 1:
                continue
            reader = graph.op(next(iter(readers)))
            if op.type == CONV_BIAS[0]:
                ok = reader.type == CONV_BIAS[1] and reader.inputs[0].op == op.name
            else:
                ok = (reader.type in PAD_CONVS and reader.inputs and reader.inputs[0].op == op.name
                      and _attr_s(reader, "padding") == "VALID")
            if ok and _same_unit(graph, op.name, reader.name):
                pairs.append((op.name, reader.name))
    position = _positions(graph)
    return sorted(set(pairs), key=lambda p: (position[p[0]], position[p[1]]))


def _positions(graph) -> dict[str, int]:
    return {op.name: i for i, op in enumerate(graph)}


def _components(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{op: its group's representative}`` for the ops of ``pairs``: the groups the pairs join, each represented by
    its least name."""
    pairs = list(pairs)
    ops = list(dict.fromkeys(op for pair in pairs for op in pair))
    return {op: min(group) for group in connected_groups(ops, pairs) for op in group}


def merge_cycle(graph, pairs: list[tuple[str, str]] | None = None, adjacency=None) -> str | None:
    """``None`` when ``graph`` stays acyclic once the :func:`merge_groups` are merged, else one sentence naming a
    merged pair on a cycle and a path that closes it. ``adjacency``: ``graph.adjacency()`` where the caller has it."""
    pairs = merge_groups(graph) if pairs is None else pairs
    if not pairs:
        return None
    rep = _components(pairs)
    unit = lambda name: rep.get(name, name)  # noqa: E731
    preds, succs = adjacency or graph.adjacency()
    indegree: dict[str, int] = {}
    out: dict[str, set[str]] = {}
    for name, ps in preds.items():
        u = unit(name)
        indegree.setdefault(u, 0)
        for p in ps:
            pu = unit(p)
            if pu != u and u not in out.setdefault(pu, set()):
                out[pu].add(u)
                indegree[u] = indegree.get(u, 0) + 1
    ready = [u for u, d in indegree.items() if d == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for s in out.get(u, ()):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if done == len(indegree):
        return None
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            path = _path(x, y, succs, skip_direct=True)
            if path:
                return (f"oneDNN merges {a!r} and {b!r} into one node, and {' -> '.join(path)} leads from one to "
                        "the other: the merged node would wait for itself")
    return "oneDNN's merged nodes close a cycle through several merged pairs"


def _path(start: str, goal: str, succs: dict[str, list[str]], *, skip_direct: bool) -> list[str] | None:
    """A path ``start`` -> ... -> ``goal`` through at least one other op (breadth first), or ``None``."""
    prev: dict[str, str] = {}
    queue = deque(s for s in succs[start] if not (skip_direct and s == goal))
    for s in queue:
        prev[s] = start
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [goal]
            while path[-1] != start:
                path.append(prev[path[-1]])
            return path[::-1]
        for s in succs[node]:
            if s not in prev and s != start:
                prev[s] = node
                queue.append(s)
    return None


def merge_unit_edges(graph, pairs: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Edges ``(before, after)`` that make every member of a merge group wait for the other members' inputs.

    A schedule that is a topological order of the graph with these edges, and control edges that go forward in it,
    never lead from one member of a group to another through other ops (docs/design.md, "Runnable graphs"): a
    last step into a member ``y`` would come from one of ``y``'s inputs, which every member waits for.
    """
    pairs = merge_groups(graph) if pairs is None else pairs
    rep = _components(pairs)
    members: dict[str, list[str]] = {}
    for name, r in rep.items():
        members.setdefault(r, []).append(name)
    edges: list[tuple[str, str]] = []
    position = _positions(graph) if members else {}
    for group in members.values():
        inside = set(group)
        inputs = {p for m in group for p in graph.predecessors(m) if p not in inside}
        for m in sorted(group, key=position.__getitem__):
            own = set(graph.predecessors(m))
            edges.extend((p, m) for p in sorted(inputs - own, key=position.__getitem__))
    return edges
