"""Enforcing an execution order with the fewest control edges.

Which ops are ordered (:func:`ordered_ops`): the accelerator ops that run and touch
device memory (allocate a device buffer or read one). Their relative order is what
decides the device peak; host ops and copies between devices run when their inputs
are ready whatever the order, and ops such as variable reads and constants neither
allocate nor free. docs/design.md ("Enforced order") says what TensorFlow guarantees
once these ops form a chain.

The edges (:func:`order_edges`): for consecutive ordered ops ``a``, ``b`` of the
order, an edge ``a -> b`` unless ``b`` is already reachable from ``a``. This is the
fewest edges that make the ordered ops run in exactly this order:

- every such pair needs an edge, since nothing else forces ``b`` after ``a``;
- one edge cannot serve two pairs: an edge ``x -> y`` that puts ``a_j`` before
  ``a_{j+1}`` and ``a_k`` before ``a_{k+1}`` (``j < k``) needs ``a_k`` before ``x``
  and ``y`` before ``a_{j+1}``, so ``x`` after ``y`` in the order: it would close a
  cycle with the order's own paths or contradict the order;
- no edge is implied by the others: a path from ``a_j`` to ``a_{j+1}`` only visits
  ops between them in the order, and no other added edge starts there.

A path between consecutive ordered ops only visits ops placed between them in the
order, so each reachability test is a search of that window: linear time overall.
"""

from __future__ import annotations

from collections.abc import Sequence

from tflms.analysis.cto import may_be_dead
from tflms.errors import GraphError
from tflms.ir.graph import Graph
from tflms.schedule.memory import BufferModel, buffer_model
from tflms.sim.simulator import SimOptions
from tflms.ir.op_types import METADATA_OPS, FUSABLE, FUSION_SENSITIVE_OPS


#: Ops that touch only buffers below this size are not ordered (shape arithmetic, per-channel vectors): their
#: place changes the peak by at most a few such buffers, and edges on them would stop grappler from folding them.
DEFAULT_MIN_BYTES = 1 << 16


def ordered_ops(graph: Graph, order: Sequence[str], options: SimOptions | None = None, *,
                min_bytes: int = DEFAULT_MIN_BYTES, fusion_safe: bool = True,
                model: BufferModel | None = None) -> list[str]:
    """The ops of ``order`` whose relative order the edges enforce (see the module doc).

    Accelerator ops that run and allocate or read a device buffer of at least ``min_bytes``, except
    metadata ops (:data:`METADATA_OPS`), ops in a branch of a lowered conditional
    (:func:`tflms.analysis.cto.may_be_dead`: an edge from one whose branch was not taken would kill the next ordered
    op, and every op after it; Keras's mixed_float16 ``fit`` applies its update in such a branch) and, with
    ``fusion_safe``, ops grappler may fuse into their one
    consumer (:data:`FUSABLE`, metadata consumers aside) and :data:`FUSION_SENSITIVE_OPS` with a sibling
    they could merge with (:func:`fusion_siblings`): it does
    so (``Conv2D`` into ``BiasAdd``, an add tree into one ``AddN``) only if they have no control edges, and
    a different fusion gives other bits. Such an op stays between its inputs and its one consumer.
    ``model``: ``buffer_model(graph, options)`` when the caller has it (e.g. from the schedule).
    """
    m = model if model is not None else buffer_model(graph, options)
    if fusion_safe:
        inner = fusion_siblings(graph)
        for op in graph:
            if op.type not in FUSABLE:
                continue
            users = {c for k in range(len(op.outputs)) for c, _ in graph.consumers(op.output(k))
                     if graph.op(c).type not in METADATA_OPS}
            if len(users) == 1 and graph.op(next(iter(users))).type in FUSABLE[op.type]:
                inner.add(op.name)
    else:
        inner = set()
    dead = may_be_dead(graph)  # a control edge from an op whose branch was not taken kills its target
    touches = {m.names[i] for i in range(len(m))
               if m.needed[i] and not m.eager[i] and graph.op(m.names[i]).type not in METADATA_OPS
               and m.names[i] not in inner and m.names[i] not in dead
               and any(m.size[b] >= min_bytes for b in m.allocs[i] + m.reads[i])}
    return [name for name in order if name in touches]


def fusion_siblings(graph: Graph) -> set[str]:
    """The :data:`FUSION_SENSITIVE_OPS` the edges must leave alone, by name.

    oneDNN's graph pass merges a filter gradient and the ``BiasAddGrad`` reading the same output gradient
    into one kernel (``_MklConv2DBackpropFilterWithBias``) only when neither carries control edges. Every
    ``BiasAddGrad`` stays unordered, and every filter gradient sharing an input with one (whichever input:
    oneDNN matches the output gradient only, this is wider). A filter gradient with no bias gradient beside
    it has nothing to merge with and is ordered like any other op: the filter gradient of a convolution
    without bias (a 3D U-Net's, before each batch norm) reads the layer's input, often a swapped-in feature
    map, and left unordered it ran after the input gradient, both big tensors live together (docs/design.md,
    "Enforced order").
    """
    bias_inputs = {t.name for op in graph if op.type == "BiasAddGrad" for t in op.inputs}
    return {op.name for op in graph if op.type in FUSION_SENSITIVE_OPS
            and (op.type == "BiasAddGrad" or any(t.name in bias_inputs for t in op.inputs))}


def _check_order(graph: Graph, order: Sequence[str]) -> dict[str, int]:
    position = {name: k for k, name in enumerate(order)}
    if len(position) != len(order) or len(order) != len(graph) or any(op.name not in position for op in graph):
        missing = sorted(op.name for op in graph if op.name not in position)[:5]
        raise GraphError(f"the order must list every op of the graph exactly once (missing e.g. {missing}, "
                         f"{len(order)} names for {len(graph)} ops)")
    for op in graph:
        for pred in graph.predecessors(op.name):
            if position[pred] > position[op.name]:
                raise GraphError(f"the order runs {op.name!r} before its input {pred!r}: it is not a "
                                 "topological order of the graph")
    return position


def order_edges(graph: Graph, order: Sequence[str], *, options: SimOptions | None = None,
                ops: Sequence[str] | None = None, min_bytes: int = DEFAULT_MIN_BYTES,
                fusion_safe: bool = True, model: BufferModel | None = None) -> list[tuple[str, str]]:
    """The fewest control edges ``(before, after)`` that make ``ops`` run in ``order``.

    ``ops`` defaults to :func:`ordered_ops` (with ``min_bytes``, ``fusion_safe`` and ``model``).
    ``order`` must be a topological order of ``graph`` listing every op. Edges go
    forward in ``order``, so they never close a cycle.
    """
    position = _check_order(graph, order)
    chain = list(ops) if ops is not None else ordered_ops(graph, order, options, min_bytes=min_bytes,
                                                              fusion_safe=fusion_safe, model=model)
    chain.sort(key=position.__getitem__)
    _, succs = graph.adjacency()
    edges: list[tuple[str, str]] = []
    for a, b in zip(chain, chain[1:]):
        if not _reaches(a, b, succs, position):
            edges.append((a, b))
    return edges


def _reaches(a: str, b: str, succs: dict[str, list[str]], position: dict[str, int]) -> bool:
    """Whether ``b`` is reachable from ``a``, searching only ops between them in the order."""
    limit = position[b]
    if b in succs[a]:
        return True
    stack = [s for s in succs[a] if position[s] < limit]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for s in succs[node]:
            if s == b:
                return True
            if position[s] < limit and s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def add_order_edges(graph: Graph, edges: Sequence[tuple[str, str]]) -> Graph:
    """A copy of ``graph`` with the control edges ``before -> after`` added.

    Raises :class:`GraphError` naming the edge if one would close a cycle (an edge
    whose ``before`` is reachable from its ``after``).
    """
    new = graph.copy()
    if not edges:
        return new
    for before, after in edges:
        for name in (before, after):
            if name not in new:
                raise GraphError(f"order edge {before!r} -> {after!r}: no op named {name!r} in the graph")
        new.add_control_input(after, before)
    try:
        new.topological_order()
    except GraphError:
        order = graph.topological_order()
        position = {n: k for k, n in enumerate(order)}
        _, succs = graph.adjacency()
        for before, after in edges:
            if position[after] < position[before] or _reaches_any(after, before, succs):
                raise GraphError(f"order edge {before!r} -> {after!r} closes a cycle: {before!r} already "
                                 f"depends on {after!r}; edges must follow a topological order") from None
        raise
    return new


def _reaches_any(a: str, b: str, succs: dict[str, list[str]]) -> bool:
    stack, seen = [a], {a}
    while stack:
        node = stack.pop()
        if node == b:
            return True
        for s in succs[node]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False
