"""The least time a re-run adds to a step on the ``xla`` clock, whatever fusion the rewritten step gets: the floors
under each forward op's re-run that the cut bound (:mod:`tflms.tune.cut_bound`) charges, so that its bound is a
bound on every plan.

:func:`rerun_floor_s`, by the op's kind:

- a library call (product, convolution, an op XLA runs as its own kernel) costs its price, less its launch;
- a reduction writes its output to memory, and so does an element-wise op a library call reads (a library call
  reads its operands from memory): at least its output's bytes at memory bandwidth;
- any other element-wise op (or a view) may fuse into its reader: 0.

**What a fused re-run saves** (:func:`rerun_savings_s`), taken off the floor. An element-wise op re-run inside the
fusion of a gradient op that read its output spares that read: the fusion reads what the re-run is made from instead,
and that may be what it reads anyway (batch norm's backward reads the convolution output a fused ReLU re-runs from). So
for each kernel of the plain step (:func:`~tflms.sim.simulator.kernel_reads`, the ``xla`` clock's) after the cut that
reads the output and is no library call, the floor takes off the output's bytes less the fewest new bytes the re-run
must read: the least cut, in buffers, between the output and the ends of its chain of element-wise ops (library calls,
reductions, ops that may not be re-run, resident tensors), a buffer the kernel may read anyway counting nothing (a
max-flow, networkx; "anyway": what any op of the largest kernel it can share reads, the ops of its side of the step
joined by edges from element-wise ops to readers that are no library call, but for the re-run chain's own ops). Where
the plain step writes the output and no library call reads it before the re-run either, the step need not write it then,
nor those kernels read it: those reads come off too, and the write less the least cut the step must write instead (a
buffer the plain step writes anyway counting nothing: a convolution's output that XLA wrote with its bias folded in is
written raw instead, as many bytes). A saving is counted in full even where the rewritten step's fusions could not make
it, and a chain is followed :data:`SAVING_DEPTH` ops up, its buffers beyond free: each only lowers the bound. So a bound
may be below 0, faster than the plain step, where the clock says re-runs would make it so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tflms.analysis.cto import Analysis, Category
from tflms.ir.consts import is_view_transpose
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import (ALIAS_OPS, CONTRACTION_OPS, FREE_OPS, METADATA_OPS, XLA_REDUCTIONS,
                               XLA_TAKES_PRODUCERS)
from tflms.policies.eligibility import recompute_skip_reason
from tflms.policies.recompute_chains import is_resident
from tflms.profiles import HardwareProfile
from tflms.sim.clock import XLA_MIN_KERNEL_S
from tflms.sim.cost import op_time_s


def rerun_floor_s(analysis: Analysis, name: str, profile: HardwareProfile,
                  readers: Mapping[str, tuple[str, ...]] | None = None) -> float:
    """The least time re-running op ``name`` adds to a step on the ``xla`` clock (module doc). ``readers``: by op, the
    gradient ops that read its outputs (default: every non-forward reader)."""
    graph = analysis.graph
    op = graph.op(name)
    mine = readers.get(name, ()) if readers is not None else tuple(
        c for ref in output_refs(op, name) for c, _ in graph.consumers(ref)
        if analysis.categories[c] is not Category.FORWARD)
    if not writes_output(graph, op, mine):
        return 0.0
    if is_library_call(op.type):
        return max(op_time_s(graph, op, profile) - profile.launch_overhead_s, XLA_MIN_KERNEL_S)
    written = sum(info.num_bytes or 0 for info in op.outputs) / profile.effective_memory_bytes_per_s
    return max(written, XLA_MIN_KERNEL_S)


#: How far (in ops) :func:`rerun_savings_s` follows a re-run's fusible inputs back; a tensor beyond is taken as free to
#: read, which can only raise the saving and lower the bound.
SAVING_DEPTH = 64


def rerun_savings_s(analysis: Analysis, profile: HardwareProfile, ops: Sequence[str],
                    after: set[str] | None = None) -> dict[str, float]:
    """By op of ``ops``, the most a fused re-run of it can save on the ``xla`` clock (module doc), seconds: 0 for a
    library call, a reduction and a view. ``after``: the ops whose reads a re-run may replace (default: every op
    outside the forward pass; the bound's: the gradient ops after the cut). The plain step's kernels are
    :func:`~tflms.sim.simulator.kernel_reads`' on the ``xla`` clock."""
    import networkx as nx

    from tflms.sim.clock import CLOCK_XLA
    from tflms.sim.records import SimOptions
    from tflms.sim.simulator import kernel_reads

    graph, cats = analysis.graph, analysis.categories
    plain = kernel_reads(graph, profile, SimOptions(clock=CLOCK_XLA))

    def buf(ref: TensorRef) -> str:
        return plain.buffer(f"{ref.op}:{ref.index}")

    fusion = _fusions(analysis)
    reads: dict[str, set[str]] = {}  # by op, the buffers it reads
    members: dict[object, list[str]] = {}  # by largest possible kernel, its ops
    for op in graph:
        if not _reads_nothing(graph, op):
            reads[op.name] = {buf(ref) for ref in op.inputs if graph.tensor(ref).num_bytes}
            members.setdefault(fusion[op.name], []).append(op.name)

    def anyway(kernel: str, chain: set[str]) -> set[str]:
        """What the largest kernel ``kernel`` can share reads anyway, but for the re-run chain's own ops."""
        return set().union(*(reads[o] for o in members.get(fusion[kernel], ()) if o not in chain))
    bandwidth = profile.effective_memory_bytes_per_s
    out: dict[str, float] = {}
    for v in ops:
        op = graph.op(v)
        if is_library_call(op.type) or op.type in XLA_REDUCTIONS or _reads_nothing(graph, op):
            out[v] = 0.0
            continue
        cone = None
        saved = 0.0
        for k, info in enumerate(op.outputs):
            size, tensor = info.num_bytes or 0, f"{v}:{k}"
            if not size or plain.buffer(tensor) != tensor:  # nothing, or another op's buffer
                continue
            kernels = plain.readers.get(tensor, ())  # the plain step's kernels that read it
            backward = [c for c in kernels if cats[c] is not Category.FORWARD and (after is None or c in after)]
            if not backward:
                continue
            fused = [c for c in backward if not is_library_call(graph.op(c).type)]
            early = [c for c in kernels if c not in backward]  # before the re-run: the forward's, the loss's gradient
            cone = cone or _cone(analysis, v, buf)
            if tensor not in plain.virtual and not any(is_library_call(graph.op(c).type) for c in early):
                # the step need not write it, nor its early kernels read it; it writes what the re-run reads instead
                written = {b for b in cone[0] if b not in plain.virtual}
                saved += max(0, size - _least_cut_bytes(nx, cone, tensor, written))
                fused += early
            for c in fused:
                saved += max(0, size - _least_cut_bytes(nx, cone, tensor, anyway(c, cone[3])))
        out[v] = saved / bandwidth
    return out


def _fusions(analysis: Analysis) -> dict[str, object]:
    """By op, the largest kernel it can share with others of its side of the step (the forward pass, or the rest):
    ops joined by an edge from an element-wise op (or a view) to any reader that is no library call. A re-run fused
    into a reader counts as already read whatever its kernel may read (module doc)."""
    from networkx.utils import UnionFind

    graph, cats = analysis.graph, analysis.categories
    joined = UnionFind()
    for op in graph:
        joined[op.name]
        if is_library_call(op.type) or op.type in XLA_REDUCTIONS:
            continue
        forward = cats[op.name] is Category.FORWARD
        for c in {c for k in range(len(op.outputs)) for c, _ in graph.consumers(TensorRef(op.name, k))}:
            if not is_library_call(graph.op(c).type) and (cats[c] is Category.FORWARD) == forward:
                joined.union(op.name, c)
    return {op.name: joined[op.name] for op in graph}


def _reads_nothing(graph, op) -> bool:
    """An op that reads no tensor's data: a view, a shape, a free op."""
    return (op.type in FREE_OPS or op.type in METADATA_OPS or op.type in ALIAS_OPS
            or is_view_transpose(graph, op))


def _cone(analysis: Analysis, v: str, buf) -> tuple[dict[str, int], list[tuple[str, str]], set[str], set[str]]:
    """What a fused re-run of ``v`` may read instead of its output: the buffers up its chain of forward element-wise
    ops (stopping at library calls, reductions, ops that may not be re-run, and :data:`SAVING_DEPTH` ops up), their
    bytes, the edges from each to the buffers made from it, the buffers at the chain's far end (its sources; those
    past the depth limit at 0 bytes), and the chain's ops (``v`` among them)."""
    graph, cats = analysis.graph, analysis.categories
    sizes: dict[str, int] = {}
    edges: list[tuple[str, str]] = []
    sources: set[str] = set()
    seen = {v}
    frontier = [(v, 0)]
    while frontier:
        name, depth = frontier.pop()
        op = graph.op(name)
        made = {buf(TensorRef(name, k)) for k in range(len(op.outputs))}
        for ref in dict.fromkeys(op.inputs):
            info = graph.tensor(ref)
            if not info.num_bytes:
                continue
            b = buf(ref)
            for m in made:
                if m != b:
                    edges.append((b, m))
            producer = graph.op(ref.op)
            if b in sizes:
                continue
            fusible = (cats[ref.op] is Category.FORWARD and not is_library_call(producer.type)
                       and producer.type not in XLA_REDUCTIONS and not is_resident(analysis, ref)
                       and recompute_skip_reason(analysis, ref.op) is None)
            if depth >= SAVING_DEPTH and fusible:
                sizes[b] = 0
                sources.add(b)
                continue
            sizes[b] = info.num_bytes
            if not fusible:
                sources.add(b)
            elif ref.op not in seen:
                seen.add(ref.op)
                frontier.append((ref.op, depth + 1))
    return sizes, edges, sources, seen


def _least_cut_bytes(nx, cone, target: str, already: set[str]) -> int:
    """The fewest bytes a re-run fused into a reader must read to make ``target``: the least cut of buffers between
    the cone's sources and ``target``, a buffer the reader reads ``already`` counting nothing."""
    sizes, edges, sources, _ = cone
    if not sources:
        return 0
    net = nx.DiGraph()
    for b, size in sizes.items():
        net.add_edge(("in", b), ("out", b), capacity=0 if b in already else size)
    for a, b in edges:
        if a in sizes:
            net.add_edge(("out", a), ("out", b) if b == target else ("in", b))
    for b in sources:
        net.add_edge("source", ("in", b))
    if not net.has_node(("out", target)):
        return 0
    return int(nx.maximum_flow_value(net, "source", ("out", target)))


def writes_output(graph, op, readers: Sequence[str]) -> bool:
    """Whether a re-run of ``op`` is a kernel of its own that writes its output to memory (module doc): a library
    call, a reduction, or an element-wise op one of ``readers`` (its gradient readers) reads as a library call; never
    a view."""
    if _reads_nothing(graph, op):
        return False
    return (is_library_call(op.type) or op.type in XLA_REDUCTIONS
            or any(is_library_call(graph.op(r).type) for r in readers))


def is_library_call(op_type: str) -> bool:
    """Whether XLA:GPU runs ``op_type`` as a library call or its own kernel, fusing no producer into it."""
    return op_type in CONTRACTION_OPS or not (op_type in XLA_TAKES_PRODUCERS or op_type in FREE_OPS
                                              or op_type in METADATA_OPS or op_type in ALIAS_OPS)


def output_refs(op, name: str) -> list[TensorRef]:
    """The references of ``op``'s outputs (``name``: its name)."""
    return [TensorRef(name, k) for k in range(len(op.outputs))]
