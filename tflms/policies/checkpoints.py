"""Graph-level checkpointing as recompute: which articulations are kept, and which ops segments re-run.

Chen et al.'s checkpoints are the :func:`articulations`, the forward ops every activation path from the batch to
the loss passes through; :func:`segment_ops` keeps evenly spaced ones, :func:`balanced_segment_ops` chooses them by
bytes, and every other op the batch flows through that may be recomputed is re-run, segment by segment
(:func:`~tflms.policies.recompute.recompute_plan` plans the clones).
"""

from __future__ import annotations

from collections.abc import Sequence

from tflms.analysis.cto import Analysis, Category
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import SOURCE_OPS
from tflms.policies.eligibility import NEVER_RECOMPUTE_DTYPES, recompute_skip_reason

#: dtypes of the activations a batch carries through the layers (a mask or an index tensor is a side input).
ACTIVATION_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def articulations(analysis: Analysis) -> list[str]:
    """The forward ops every activation path from the step's main input to its loss passes through, in order
    (Chen et al.'s candidate checkpoints: a layer's output in a chain of layers, a residual block's sum).

    The main input is the step argument the most forward ops descend from (the batch, not the labels). The
    paths run over edges that carry floating-point tensors, or that lead into an op with no floating-point input
    from the batch (token ids into an embedding lookup of a weight table): an attention mask reaches every layer
    from the input, and as a path it would leave no op on every path. Side inputs (weights, dropout's random
    numbers) are no paths. The articulations are the dominators of the loss (the last forward op) from the main
    input. Found once per analysis (kept in its ``__dict__``, as :func:`functools.cached_property` keeps its values):
    the tuner's segment plans ask for them several times.
    """
    found = analysis.__dict__.get("_articulations")
    if found is None:
        found = analysis.__dict__["_articulations"] = tuple(_articulations(analysis))
    return list(found)


def _articulations(analysis: Analysis) -> list[str]:
    """:func:`articulations`, found again."""
    import networkx as nx
    graph, levels = analysis.graph, analysis.levels
    reach = {name: _activations(analysis, [name]) for name in _step_arguments(graph)}
    if not reach:
        return []
    main = max(reach, key=lambda n: (len(reach[n]), n))
    active = reach[main]
    root = "\0root"
    dag = nx.DiGraph()
    dag.add_node(root)
    for name in active:
        inputs = graph.op(name).inputs
        # an edge carries the activations when its tensor is floating point, or when it enters the float stream
        # (ids into an embedding lookup); a mask joins a float op and is a side input there
        entry = not any(ref.op in active and graph.tensor(ref).dtype in ACTIVATION_DTYPES for ref in inputs)
        for ref in inputs:
            if ref.op == main:
                dag.add_edge(root, name)
            elif ref.op in active and (entry or graph.tensor(ref).dtype in ACTIVATION_DTYPES):
                dag.add_edge(ref.op, name)
    reachable = nx.descendants(dag, root)
    if not reachable:
        return []
    sink = max(reachable, key=lambda n: (levels[n], n))
    idom = nx.immediate_dominators(dag, root)
    chain, node = [], idom.get(sink)
    while node is not None and node != root:
        chain.append(node)
        node = idom.get(node) if idom.get(node) != node else None
    return sorted(chain, key=lambda n: (levels[n], n))


def _step_arguments(graph) -> list[str]:
    """The step's data arguments (not variable handles)."""
    return [op.name for op in graph if op.type in SOURCE_OPS
            and all(info.dtype not in NEVER_RECOMPUTE_DTYPES for info in op.outputs)]


def _activations(analysis: Analysis, sources: Sequence[str] | None = None) -> set[str]:
    """The forward ops that descend from ``sources`` (default: the step's data arguments): what a batch flows
    through."""
    graph, cats = analysis.graph, analysis.categories
    active: set[str] = set()
    stack = list(_step_arguments(graph) if sources is None else sources)
    while stack:
        name = stack.pop()
        for index, _ in enumerate(graph.op(name).outputs):
            for consumer, _ in graph.consumers(TensorRef(name, index)):
                if consumer not in active and cats[consumer] is Category.FORWARD:
                    active.add(consumer)
                    stack.append(consumer)
    return active


def segment_ops(analysis: Analysis, segments: int) -> set[str]:
    """Chen et al.'s sqrt(n) checkpointing at graph level, as recompute: of the :func:`articulations`, about
    ``segments`` evenly spaced ones are kept (the checkpoints); every other op the batch flows through in the
    forward pass that may be recomputed is re-run, segment by segment, before the segment's backward pass."""
    cuts = articulations(analysis)
    if not cuts or segments < 1:
        return set()
    step = max(1, round(len(cuts) / segments))
    kept = set(cuts[step - 1::step])
    return _recomputable(analysis) - kept


def _recomputable(analysis: Analysis) -> set[str]:
    """The ops the batch flows through in the forward pass (:func:`_activations`) that may be recomputed (found once
    per analysis, as :func:`articulations` are)."""
    found = analysis.__dict__.get("_recomputable")
    if found is None:
        found = analysis.__dict__["_recomputable"] = frozenset(
            name for name in _activations(analysis) if recompute_skip_reason(analysis, name) is None)
    return set(found)


def output_bytes(graph, name: str) -> int:
    """The bytes of op ``name``'s outputs (sizes not known count 0)."""
    return sum(info.num_bytes or 0 for info in graph.op(name).outputs)


def balanced_segment_ops(analysis: Analysis, slack: float = 1.0) -> tuple[set[str], int]:
    """Checkpointing with the kept articulations chosen by bytes, not evenly spaced: ``(ops to recompute, how
    many articulations are kept)``.

    While a segment's backward pass runs, the checkpoints kept before it, the segment's re-run activations and
    the checkpoint that ends it are all on the device. Evenly spaced checkpoints ignore how large each layer's
    tensors are: on ResNet-50 at batch 1347 every articulation kept still keeps the stem's large outputs, and
    sqrt(n) segments put the stem and the first stage's three blocks in one (tools/segment_report.py). Here a
    dynamic programme over the :func:`articulations` (in order) finds the least ``target`` for which checkpoints
    exist with, for every segment, the bytes kept before it plus the bytes it re-runs plus its closing
    checkpoint's at most ``target`` (activation bytes by output size, a bisection to a thousandth); then, at
    ``target * slack``, the checkpoints that keep the fewest bytes (a larger ``slack`` keeps fewer). Chen et al.'s
    memory-planned checkpointing (2016, section 4.3) greedily closes a segment once it holds a given number of
    bytes; this also weighs the kept checkpoints' own sizes. ``(set(), 0)`` when the graph has no articulation.
    """
    import bisect
    if not slack >= 1:
        raise ValueError(f"slack must be at least 1 (the least bound times slack), got {slack!r}")
    graph, levels = analysis.graph, analysis.levels
    cuts = articulations(analysis)
    if not cuts:
        return set(), 0

    recomputable = sorted((levels[n], output_bytes(graph, n), n) for n in _recomputable(analysis))
    at = [level for level, _, _ in recomputable]
    prefix = [0]
    for _, size, _ in recomputable:
        prefix.append(prefix[-1] + size)

    def between(low: int, high: int) -> int:  # the bytes of recomputable ops with low < level < high
        return prefix[bisect.bisect_left(at, high)] - prefix[bisect.bisect_right(at, low)]

    # a start before the first op, each articulation, an end after the last op (closing the loss's segment)
    points = [(-1, 0, ""), *((levels[c], output_bytes(graph, c), c) for c in cuts), ((at[-1] if at else 0) + 1, 0, "")]

    def kept_for(target: float) -> list[str] | None:
        """The checkpoints that keep the fewest bytes with every segment within ``target``, or ``None``."""
        least = [0.0] + [float("inf")] * (len(points) - 1)  # bytes kept up to and including point j
        back = [0] * len(points)
        for j in range(1, len(points)):
            level, size, _ = points[j]
            for i in range(j - 1, -1, -1):  # a longer segment re-runs more: stop once it alone is over
                span = between(points[i][0], level) + size
                if span > target:
                    break
                if least[i] + span <= target and least[i] + size < least[j]:
                    least[j], back[j] = least[i] + size, i
        if least[-1] == float("inf"):
            return None
        kept, j = [], back[-1]
        while j:
            kept.append(points[j][2])
            j = back[j]
        return kept

    low, high = 0, prefix[-1] + sum(size for _, size, _ in points)  # nothing fits ``low``; ``high`` fits
    while high - low > max(1, high // 1000):
        middle = (low + high) // 2
        if kept_for(middle) is None:
            low = middle
        else:
            high = middle
    kept = set(kept_for(high * slack))
    return {name for _, _, name in recomputable if name not in kept}, len(kept)
