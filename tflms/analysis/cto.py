"""Categorized topological ordering (CTO) of a training step (Le et al., ISMM 2019).

*Level* of an op: 0 for ops without data or control inputs, else 1 + the largest
level of its inputs. The *distance* from a producer to a consumer is their level
difference; it is what the TFLMS rules compare with ``swapout_threshold``.

*Category* of an op, decided from the graph's structure:

- ``update``: ops that write variables (``AssignVariableOp``, ``ResourceApply*``,
  ...), and ops all of whose data consumers are ``update`` ops (the optimizer's
  arithmetic, batch-norm moving-average updates) unless they are gradient ops.
- ``backward``: *gradient seeds* and their data descendants that are not
  ``update``. Seeds are ops of gradient-only types (``ReluGrad``,
  ``Conv2DBackpropInput``, ``BiasAddGrad``, ...) and, as a hint only, ops under a
  ``gradient_tape/`` or ``gradients/`` name scope (Keras and TF rename scopes
  between versions, so names never decide alone).
- ``forward``: ops that feed the backward or update ops, or descend from such
  ops, and are neither of the above.
- ``other``: ops without data inputs (placeholders, constants, variable
  handles) and anything unconnected to the training computation.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Iterator, Mapping

from tflms.errors import GraphError, NoTrainingStepError
from tflms.ir.graph import Graph, TensorInfo, TensorRef
from tflms.ir.op_types import CALL_OP_TYPES, CONDITIONAL_TYPES, GRADIENT_OP_TYPES, LOOP_TYPES, METADATA_ONLY_TYPES


class Category(str, enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    UPDATE = "update"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


#: Op types that write variables (resource or TF1 ref variables).
_UPDATE_TYPE = re.compile(
    r"^(Assign(Add|Sub)?VariableOp|Assign(Add|Sub)?|ResourceApply\w+|ResourceSparseApply\w+|"
    r"ResourceScatter\w+|Apply\w+|SparseApply\w+|Scatter(Add|Sub|Update|Mul|Div|Min|Max|NdAdd|NdSub|NdUpdate))$")

#: Name-scope prefixes of gradient ops, used as a hint only.
_GRADIENT_SCOPE = re.compile(r"^(gradient_tape|gradients(_\d+)?)/")


def is_update_type(op_type: str) -> bool:
    return bool(_UPDATE_TYPE.match(op_type))


def is_gradient_type(op_type: str) -> bool:
    return op_type in GRADIENT_OP_TYPES


def may_be_dead(graph: Graph, successors: Mapping[str, list[str]] | None = None) -> frozenset[str]:
    """Ops reached from a ``Switch`` output without passing a ``Merge``: they run only when their branch of a lowered
    conditional is taken, and a control edge from one that did not run makes its target dead too
    (:attr:`Analysis.conditional`). ``successors``: ``graph.adjacency()[1]`` where the caller has it."""
    switches = [op.name for op in graph if op.type in CONDITIONAL_TYPES and "Switch" in op.type]
    if not switches:
        return frozenset()
    successors = successors if successors is not None else graph.adjacency()[1]
    seen: set[str] = set()
    stack = [s for sw in switches for s in successors[sw]]
    while stack:
        name = stack.pop()
        if name in seen or "Merge" in graph.op(name).type:
            continue
        seen.add(name)
        stack.extend(successors[name])
    return frozenset(seen)


@dataclasses.dataclass(frozen=True)
class TensorFacts:
    """A tensor's producer, consumers and their level distances."""

    ref: TensorRef
    info: TensorInfo
    producer_level: int
    producer_category: Category
    consumers: tuple[str, ...]
    consumer_levels: tuple[int, ...]

    @property
    def distances(self) -> tuple[int, ...]:
        return tuple(level - self.producer_level for level in self.consumer_levels)

    @property
    def num_bytes(self) -> int | None:
        return self.info.num_bytes


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Levels, categories and tensor facts of one graph (see module doc)."""

    graph: Graph
    order: tuple[str, ...]
    levels: Mapping[str, int]
    categories: Mapping[str, Category]

    @functools.cached_property
    def conditional(self) -> frozenset[str]:
        """Ops that may be dead: reached from a ``Switch`` output without passing a ``Merge``.

        Such an op runs only when its branch is taken. tflms never swaps its outputs
        and never uses it as a trigger: a control edge from a dead op would make the
        swap-in, and every consumer of it, dead too.
        """
        return may_be_dead(self.graph)

    @functools.cached_property
    def predecessors(self) -> dict[str, list[str]]:
        """Data and control predecessors of every op (``Graph.predecessors``, computed once)."""
        return self.graph.adjacency()[0]

    @property
    def num_levels(self) -> int:
        return 1 + max(self.levels.values(), default=-1)

    @property
    def has_backward(self) -> bool:
        return any(c is Category.BACKWARD for c in self.categories.values())

    def category_counts(self) -> dict[str, int]:
        counts = {c.value: 0 for c in Category}
        for c in self.categories.values():
            counts[c.value] += 1
        return counts

    def tensor(self, ref: TensorRef | str) -> TensorFacts:
        ref = TensorRef.parse(ref) if isinstance(ref, str) else ref
        info = self.graph.tensor(ref)
        consumers = tuple(sorted({c for c, _ in self.graph.consumers(ref)},
                                 key=lambda n: (self.levels[n], n)))
        return TensorFacts(ref=ref, info=info, producer_level=self.levels[ref.op],
                           producer_category=self.categories[ref.op], consumers=consumers,
                           consumer_levels=tuple(self.levels[c] for c in consumers))

    def tensors(self) -> Iterator[TensorFacts]:
        for name in self.order:
            op = self.graph.op(name)
            for i in range(len(op.outputs)):
                yield self.tensor(TensorRef(name, i))

    def ops_at_level(self) -> dict[int, list[str]]:
        by_level: dict[int, list[str]] = {}
        for name in self.order:
            by_level.setdefault(self.levels[name], []).append(name)
        return by_level

    def summary(self) -> dict:
        return {"ops": len(self.order), "levels": self.num_levels, "categories": self.category_counts()}


def compute_levels(graph: Graph, order: list[str] | None = None,
                   predecessors: dict[str, list[str]] | None = None) -> dict[str, int]:
    """Level of every op (longest path from a source over data and control edges)."""
    if predecessors is None:
        predecessors = graph.adjacency()[0]
    order = graph.topological_order() if order is None else order
    levels: dict[str, int] = {}
    for name in order:
        preds = predecessors[name]
        levels[name] = 1 + max(levels[p] for p in preds) if preds else 0
    return levels


def _data_consumers(graph: Graph) -> dict[str, list[str]]:
    """Data consumers of every op (any output), deduplicated, in one pass."""
    out: dict[str, list[str]] = {op.name: [] for op in graph}
    for op in graph:
        for ref in dict.fromkeys(op.inputs):
            out[ref.op].append(op.name)
    return {name: list(dict.fromkeys(v)) for name, v in out.items()}





def _static_ops(ops, order: list[str]) -> set[str]:
    """Ops whose value does not depend on the step's data (its non-resource arguments): constants, shapes,
    variable reads, and ops computed from such ops only."""
    static: set[str] = set()
    for name in order:
        op = ops[name]
        data_argument = op.type in ("Placeholder", "_Arg") and any(o.dtype != "resource" for o in op.outputs)
        if not data_argument and (op.type in METADATA_ONLY_TYPES or op.type == "ReadVariableOp"
                                  or all(ref.op in static for ref in op.inputs)):
            static.add(name)
    return static


def categorize(graph: Graph, order: list[str]) -> dict[str, Category]:
    """Category of every op; see the module doc for the rules."""
    ops = {op.name: op for op in graph}
    consumers_of = _data_consumers(graph)
    static = _static_ops(ops, order)

    def shared_with_forward(name: str) -> bool:
        # grappler's deduplication keeps one of two identical nodes, e.g. a constant or a shape named
        # gradient_tape/... that forward ops then read: such a node is no gradient seed.
        return name in static and any(not _GRADIENT_SCOPE.match(c) and not is_gradient_type(ops[c].type)
                                      for c in consumers_of[name])

    grad_seed = {name for name, op in ops.items()
                 if is_gradient_type(op.type) or (_GRADIENT_SCOPE.match(name) and not shared_with_forward(name))}
    # Data descendants of gradient seeds, in topological order.
    in_backward: set[str] = set()
    for name in order:
        if name in grad_seed or any(ref.op in in_backward for ref in ops[name].inputs):
            in_backward.add(name)
    # Update ops: variable writers, then (reverse order) ops whose every data consumer is an update op.
    update = {name for name, op in ops.items() if is_update_type(op.type)}
    for name in reversed(order):
        if name in update or name in grad_seed:
            continue
        consumers = consumers_of[name]
        if consumers and ops[name].inputs and all(c in update for c in consumers):
            update.add(name)
    backward = in_backward - update
    # Forward: data ancestors of backward/update ops, and their non-backward descendants.
    forward: set[str] = set()
    for name in reversed(order):
        if name in backward or name in update:
            continue
        if ops[name].inputs and any(c in backward or c in update or c in forward for c in consumers_of[name]):
            forward.add(name)
    for name in order:
        if name in backward or name in update or name in forward:
            continue
        if any(ref.op in forward for ref in ops[name].inputs):
            forward.add(name)
    categories = {}
    for name in order:
        if name in update:
            categories[name] = Category.UPDATE
        elif name in backward:
            categories[name] = Category.BACKWARD
        elif name in forward:
            categories[name] = Category.FORWARD
        else:
            categories[name] = Category.OTHER
    return categories


def check_supported(graph: Graph) -> None:
    """Raise :class:`UnsupportedGraphError` for constructs tflms cannot rewrite."""
    from tflms.errors import UnsupportedGraphError
    for op in graph:
        if op.type in LOOP_TYPES:
            raise UnsupportedGraphError(
                f"op {op.name!r} is TF1 loop control flow ({op.type}); tflms handles TF2 loops (While ops, as made "
                "by tf.function) as opaque single ops and lowered conditionals (Switch/Merge), not lowered loops. "
                "Trace the step with tf.function under TF2 behaviour (no tf.compat.v1.disable_control_flow_v2())")


def analyze_graph(graph: Graph) -> Analysis:
    """Compute the CTO of ``graph`` (an IR graph)."""
    check_supported(graph)
    if len(graph) == 0:
        raise GraphError("the graph is empty: nothing to analyze")
    adjacency = graph.adjacency()
    order = graph.topological_order(adjacency)
    levels = compute_levels(graph, order, adjacency[0])
    categories = categorize(graph, order)
    return Analysis(graph=graph, order=tuple(order), levels=levels, categories=categories)


def no_training_step_error(analysis: Analysis) -> NoTrainingStepError:
    """The error for a graph without gradient ops, naming nested function calls if that is why."""
    calls = [op.name for op in analysis.graph if op.type in CALL_OP_TYPES]
    if calls:
        return NoTrainingStepError(
            f"the graph has no gradient ops of its own but calls other functions ({calls[:3]}), which tflms treats "
            "as opaque: the training step is probably a tf.function inside the function given to tflms. Give "
            "tflms the plain Python step (do not decorate it with tf.function as well)")
    return NoTrainingStepError(
        "the graph has no gradient ops (no op of a gradient type such as ReluGrad or MatMul under "
        "gradient_tape/): tflms swaps activations kept from the forward pass for the backward pass, so "
        "give it a training step (forward + tape.gradient + optimizer update)")
