"""The least overhead of any plan that fits, at the loss: what each forward tensor costs kept, re-run or sent away.

When the loss's gradient starts (:func:`cut_op`), every forward tensor that a gradient op reads later is in one of
three places: on
the device (*kept*), on the host (*swapped*), or nowhere yet, to be rebuilt by re-running its producers
(*recomputed*). Whatever a plan does before or after that moment, the device then holds the resident bytes and every
kept buffer, so a plan that fits keeps at most ``budget / (1 + margin) - resident`` bytes of them. This module finds
the cheapest way to choose, by an exact search (a mixed-integer program, scipy's HiGHS), and so a lower bound on the
overhead of every plan of tflms's (swaps, recomputation or both, in any order) at that budget: the figure that says
whether a target on overhead can be met at all (issue 47's "show why with a bound"). It is Checkmate's formulation
(Jain et al., MLSys 2020) relaxed to that one moment. Derived in docs/design.md, "The cut bound".

The search stops where its gap closes (:data:`MIP_REL_GAP`) or at :data:`DEFAULT_NODE_LIMIT` branch-and-bound nodes,
never at a time: HiGHS's search is deterministic (the same program explores the same nodes, whatever its threads), so
the bound is a function of the step and the budget alone, the same on a fast machine as on a busy one. Stopped
before its gap closes, the bound is the search's proven (dual) bound: lower than the least overhead, still a bound.
A wall-clock limit (:data:`SAFETY_TIME_LIMIT_S`) is a safety net only; a bound it stops says so.

The program, over the forward ops ``v`` that run before the loss (its ancestors) and the buffers ``b``:

- each forward tensor a gradient op after the loss reads is kept, swapped or recomputed: ``k_v + r_v >= 1``, where
  ``k_v`` says that ``v``'s output is somewhere (device or host) at the loss;
- a recomputed op reads what it read, kept or itself recomputed: ``k_u + r_u >= r_v`` for each input ``u`` of ``v``
  that is neither resident nor produced after the loss;
- a kept tensor's buffer is on the device or the host: ``d_b + h_b >= k_v`` (views share their input's buffer);
- the device holds at most the budget's bytes: ``sum bytes_b d_b <= cap``;
- the step lasts at least the plain step plus every re-run's least time and reads, less what fused re-runs save,
  and at least twice the swapped bytes' time over the host link: ``t >= plain + sum c_v r_v + reads``,
  ``t >= 2 sum bytes_b h_b / link``; minimise ``t``. Twice: a buffer on the host at the loss left the device before
  it (its device memory is free) and returns after it (a gradient op, or a re-run for one, reads it later), so its
  two copies fall in two windows that do not overlap, whether or not the link copies both ways at once; one copy at
  a time each way.

A forward op that is not an ancestor of the loss may run after it (the program re-runs it for free); an op that may
not be re-run (:func:`~tflms.policies.eligibility.recompute_skip_reason`) is kept or swapped.

Each re-run's least time ``c_v`` is a floor under the ``xla`` clock's prices (:mod:`tflms.sim.fusion`), whatever
fusion the rewritten step gets: :func:`rerun_floor_s` less :func:`rerun_savings_s`.

- a library call (product, convolution, an op XLA runs as its own kernel) costs its price, less its launch;
- a reduction writes its output to memory, and so does an element-wise op a library call reads (a library call
  reads its operands from memory): at least its output's bytes at memory bandwidth;
- any other element-wise op (or a view) may fuse into its reader: 0;
- *reads*: a re-run that writes its output and is no library call (whose price counts its reads) is a kernel of its
  own, and reads each input that is kept, or re-run and written itself, from memory: once per tensor.

**What a fused re-run saves** (:func:`rerun_savings_s`). An element-wise op re-run inside the fusion of a gradient
op that read its output spares that read: the fusion reads what the re-run is made from instead, and that may be
what it reads anyway (batch norm's backward reads the convolution output a fused ReLU re-runs from). So for each
kernel of the plain step (:func:`~tflms.sim.simulator.kernel_reads`, the ``xla`` clock's) after the cut that reads
the output and is no library call, the floor takes off the output's bytes less the fewest new bytes the re-run must
read: the least cut, in buffers, between the output and the ends of its chain of element-wise ops (library calls,
reductions, ops that may not be re-run, resident tensors), a buffer the kernel may read anyway counting nothing (a
max-flow, networkx; "anyway": what any op of the largest kernel it can share reads, the ops of its side of the step
joined by edges from element-wise ops to readers that are no library call, but for the re-run chain's own ops).
Where the plain step writes the output and no library call reads it before the re-run either, the step need not
write it then, nor those kernels read it: those reads come off too, and the write less the least cut the step must
write instead (a buffer the plain step writes anyway counting nothing: a convolution's output that XLA wrote with its
bias folded in is written raw instead, as many bytes). A saving is counted in full even where the rewritten step's
fusions could not make it, and a chain is followed :data:`SAVING_DEPTH` ops up, its buffers beyond free: each only
lowers the bound. So a bound may be below 0, faster than the plain step, where the clock says re-runs would make it so.

Relaxations, each making the bound lower, never higher: one moment only (the backward pass's own peaks, and every
clone's own memory, are not counted); swapped bytes cost nothing on the device at the loss, and their copies are
counted as if nothing else ran while they cross (no compute added to them); a fused re-run costs nothing but what
it saves; the buffers a re-run reads instead are not charged their writes. The resident bytes stay on the device
(tflms never swaps variables: the bound is one for tflms's plans). A copy moves the tensor's bytes: the bound is for
plans without compressed copies (``compress``, which move fewer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from tflms.analysis.cto import Analysis, Category
from tflms.errors import ConfigError
from tflms.ir.consts import is_view_transpose
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import (ALIAS_OPS, CONTRACTION_OPS, FREE_OPS, METADATA_OPS, XLA_ASSIGNS, XLA_FUSIBLE,
                               XLA_REDUCTIONS)
from tflms.ir.topo import reachable
from tflms.policies.eligibility import recompute_skip_reason
from tflms.policies.recompute_chains import is_resident
from tflms.profiles import HardwareProfile, get_profile
from tflms.sim.clock import XLA_MIN_KERNEL_S
from tflms.sim.cost import op_time_s

#: Branch-and-bound nodes the exact search may explore before the bound is its best proven bound so far (HiGHS's
#: dual bound): a count of work, not seconds, so that the bound depends on its inputs alone and never on the machine's
#: speed (the project's rule: the same graph and config, the same figure). Chosen by measurement (docs/design.md, "The
#: cut bound"): the hardest known search, BERT-base's at batch 728 on h200-141gb, closes its gap at 3960 nodes
#: (recompute only) or not in 72,515 (any plan, whose proven bound is its root's).
DEFAULT_NODE_LIMIT = 10_000
#: A safety net only: seconds after which the search stops whatever the nodes. A bound it stops is not repeatable, and
#: its status says so ("time limit").
SAFETY_TIME_LIMIT_S = 3600.0
#: The relative gap at which HiGHS stops: the bound is its dual bound, which is a bound whatever the gap (its
#: incumbent, up to this much above, is not).
MIP_REL_GAP = 1e-4
_GIB = float(1 << 30)
_MS = 1e3  # the program's times are in milliseconds


@dataclasses.dataclass(frozen=True)
class CutBound:
    """:func:`cut_bound`'s answer. ``overhead_s`` is the bound; ``recomputed``, ``swapped_bytes`` and ``kept_bytes``
    describe the choice that reaches it (a plan at the loss, not a runnable plan)."""

    plain_step_s: float
    overhead_s: float  # no plan that fits adds less to the plain step (inf: none fits)
    cap_bytes: int  # forward bytes the device may hold at the loss
    status: str  # what stopped the search: "optimal" (its gap closed), "node limit" or "time limit" (the safety
    # net's: not repeatable); or "infeasible". The bound is the search's proven bound whatever stopped it
    nodes: int  # branch-and-bound nodes the search explored
    swaps: bool  # whether swaps were allowed
    recomputed: tuple[str, ...]
    recompute_s: float  # the choice's re-run floor
    swapped_bytes: int
    kept_bytes: int
    needed_bytes: int  # the bytes of every buffer a gradient op after the loss reads
    cut_op: str  # the gradient op the bound is taken before (:func:`cut_op`)
    ops_after_loss: int  # forward ops that are not its ancestors (free to run after it)
    gradient_ops_after: int  # backward ops that are its descendants (their reads count)

    @property
    def fits(self) -> bool:
        return self.overhead_s != float("inf")

    @property
    def overhead(self) -> float:
        """The bound as a fraction of the plain step (``inf`` where nothing fits)."""
        return self.overhead_s / self.plain_step_s if self.plain_step_s > 0 else float("inf")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["recomputed"] = len(self.recomputed)
        out["overhead"] = self.overhead
        return out


def cut_op(analysis: Analysis, succs: Mapping[str, Sequence[str]] | None = None) -> str:
    """The gradient op the bound is taken before: the backward op with the most forward ancestors times gradient-op
    descendants (then the least level, then name), in a training step the seed of the loss's gradient, which every
    forward op the loss depends on precedes and nearly every gradient op follows. Any backward op gives a valid
    bound (module doc); this one keeps the most tensors on both sides of it. ``succs``: the graph's successors, where
    the caller has them (:meth:`~tflms.ir.graph.Graph.adjacency`)."""
    order, cats, preds = analysis.order, analysis.categories, analysis.predecessors
    forward_bit, backward_bit = {}, {}
    for name in order:
        if cats[name] is Category.FORWARD:
            forward_bit[name] = 1 << len(forward_bit)
        elif cats[name] is Category.BACKWARD:
            backward_bit[name] = 1 << len(backward_bit)
    if not backward_bit or not forward_bit:
        raise ConfigError("the step has no forward or no backward pass: nothing to bound")
    above: dict[str, int] = {}
    for name in order:
        bits = forward_bit.get(name, 0)
        for p in preds[name]:
            bits |= above[p]
        above[name] = bits
    if succs is None:
        succs = analysis.graph.adjacency()[1]
    below: dict[str, int] = {}
    for name in reversed(order):
        bits = backward_bit.get(name, 0)
        for c in succs[name]:
            bits |= below[c]
        below[name] = bits
    return max(backward_bit, key=lambda n: (above[n].bit_count() * below[n].bit_count(), -analysis.levels[n], n))


def rerun_floor_s(analysis: Analysis, name: str, profile: HardwareProfile,
                  readers: Mapping[str, tuple[str, ...]] | None = None) -> float:
    """The least time re-running op ``name`` adds to a step on the ``xla`` clock (module doc). ``readers``: by op, the
    gradient ops that read its outputs (default: every non-forward reader)."""
    graph = analysis.graph
    op = graph.op(name)
    mine = readers.get(name, ()) if readers is not None else tuple(
        c for ref in _outputs(op, name) for c, _ in graph.consumers(ref)
        if analysis.categories[c] is not Category.FORWARD)
    if not _writes(graph, op, mine):
        return 0.0
    if _library(op.type):
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
        if _library(op.type) or op.type in XLA_REDUCTIONS or _reads_nothing(graph, op):
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
            fused = [c for c in backward if not _library(graph.op(c).type)]
            early = [c for c in kernels if c not in backward]  # before the re-run: the forward's, the loss's gradient
            cone = cone or _cone(analysis, v, buf)
            if tensor not in plain.virtual and not any(_library(graph.op(c).type) for c in early):
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
        if _library(op.type) or op.type in XLA_REDUCTIONS:
            continue
        forward = cats[op.name] is Category.FORWARD
        for c in {c for k in range(len(op.outputs)) for c, _ in graph.consumers(TensorRef(op.name, k))}:
            if not _library(graph.op(c).type) and (cats[c] is Category.FORWARD) == forward:
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
            fusible = (cats[ref.op] is Category.FORWARD and not _library(producer.type)
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


def _writes(graph, op, readers: Sequence[str]) -> bool:
    """Whether a re-run of ``op`` is a kernel of its own that writes its output to memory (module doc): a library
    call, a reduction, or an element-wise op one of ``readers`` (its gradient readers) reads as a library call; never
    a view."""
    if _reads_nothing(graph, op):
        return False
    return _library(op.type) or op.type in XLA_REDUCTIONS or any(_library(graph.op(r).type) for r in readers)


def _library(op_type: str) -> bool:
    """Whether XLA:GPU runs ``op_type`` as a library call or its own kernel, fusing no producer into it."""
    return op_type in CONTRACTION_OPS or not (op_type in XLA_FUSIBLE or op_type in XLA_REDUCTIONS
                                              or op_type in XLA_ASSIGNS or op_type in FREE_OPS
                                              or op_type in METADATA_OPS or op_type in ALIAS_OPS)


def _outputs(op, name: str) -> list[TensorRef]:
    return [TensorRef(name, k) for k in range(len(op.outputs))]


def cut_bound(analysis: Analysis, plain, profile: str | HardwareProfile, budget_bytes: int, *,
              margin_fraction: float = 0.0, margin_bytes: int = 0, swaps: bool = True,
              node_limit: int | None = DEFAULT_NODE_LIMIT, time_limit_s: float = SAFETY_TIME_LIMIT_S,
              log: bool = False) -> CutBound:
    """The least overhead any plan of the step of ``analysis`` adds to ``plain`` (its simulation, on the clock the
    overhead is measured on: its buffers say which tensors are views of which) to fit ``budget_bytes`` with the
    simulator's margin (module doc). ``swaps=False``: recomputation only.

    The search stops at ``node_limit`` branch-and-bound nodes (``None``: none), so that the bound is a function of
    its inputs alone; ``time_limit_s`` is a safety net, and a bound it stopped says so (``status``). ``log``: HiGHS's
    progress on stdout (nodes, the dual bound, seconds), to measure the search."""
    program = _program(analysis, plain, get_profile(profile), budget_bytes, margin_fraction, margin_bytes, swaps)
    if program.cap < 0:  # the resident bytes alone do not fit
        return _infeasible(program)
    return _answer(program, _search(program, node_limit, time_limit_s, log), node_limit)


@dataclasses.dataclass(frozen=True)
class _Program:
    """The mixed-integer program of :func:`cut_bound` (module doc) in :func:`scipy.optimize.milp`'s terms, and what
    its columns mean (``r`` and ``k`` by forward op, ``d`` and ``h`` by buffer, ``t``, then the reads), to read its
    answer."""

    objective: np.ndarray
    constraints: object  # scipy.optimize.LinearConstraint
    integrality: np.ndarray
    upper: np.ndarray  # the columns' upper bounds (their lower bounds are 0)
    forward: list[str]
    col: dict[str, int]
    before: set[str]  # the cut's ancestors
    cost: np.ndarray  # each forward op's re-run floor, seconds
    bufs: list[str]
    sizes: dict[str, int]
    cap: int
    common: dict  # the fields of CutBound that do not depend on the answer

    @property
    def columns(self) -> tuple[int, int, int, int]:
        """The first column of ``r``, ``d``, ``h`` and ``t``."""
        n, nb = len(self.forward), len(self.bufs)
        return 0, 2 * n, 2 * n + nb, 2 * n + 2 * nb


def _program(analysis: Analysis, plain, profile: HardwareProfile, budget_bytes: int, margin_fraction: float,
             margin_bytes: int, swaps: bool) -> _Program:
    """The program (module doc), as sparse rows."""
    from scipy import sparse
    from scipy.optimize import LinearConstraint

    graph, cats = analysis.graph, analysis.categories
    cap = int((budget_bytes - margin_bytes) / (1.0 + margin_fraction)) - plain.resident_bytes
    succs = graph.adjacency()[1]
    cut = cut_op(analysis, succs)
    before = reachable([cut], analysis.predecessors)
    after = reachable([cut], succs)
    forward = [n for n in analysis.order if cats[n] is Category.FORWARD]
    col = {n: k for k, n in enumerate(forward)}
    n = len(forward)
    readers = {v: tuple(sorted({c for ref in _outputs(graph.op(v), v) for c, _ in graph.consumers(ref)
                                if cats[c] is not Category.FORWARD and c in after})) for v in forward}
    needed = [v for v in forward if readers[v] and any(graph.op(v).outputs)]
    # buffers: a view's is its source's (the plain step's simulation knows which)
    owner, sizes = plain.buffer_owner, {}
    for buf, size, _, _ in plain.buffer_lifetimes:
        sizes[buf] = max(size, sizes.get(buf, 0))
    members: dict[str, list[int]] = {}
    for v in forward:
        for k, info in enumerate(graph.op(v).outputs):
            tensor = f"{v}:{k}"
            buf = owner.get(tensor, tensor)
            if info.num_bytes and not is_resident(analysis, TensorRef(v, k)):
                members.setdefault(buf, []).append(col[v])
                sizes.setdefault(buf, info.num_bytes)
    bufs = sorted(members)
    nb = len(bufs)
    # columns: r (n), k (n), d (nb), h (nb), t (1)
    R, K, D, H, T = 0, n, 2 * n, 2 * n + nb, 2 * n + 2 * nb
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries, low, high):
        r = len(lo)
        for c, x in entries:
            rows.append(r)
            cols.append(c)
            vals.append(x)
        lo.append(low)
        hi.append(high)

    for v in needed:
        row([(R + col[v], 1.0), (K + col[v], 1.0)], 1.0, np.inf)
    for v in forward:
        seen = set()
        for ref in graph.op(v).inputs:
            u = ref.op
            if u in seen or u not in col or is_resident(analysis, ref):
                continue
            seen.add(u)
            row([(K + col[u], 1.0), (R + col[u], 1.0), (R + col[v], -1.0)], 0.0, np.inf)
    for j, buf in enumerate(bufs):
        for c in members[buf]:
            row([(D + j, 1.0), (H + j, 1.0), (K + c, -1.0)], 0.0, np.inf)
    row([(D + j, sizes[buf] / _GIB) for j, buf in enumerate(bufs)], -np.inf, max(cap, 0) / _GIB)
    cost = np.zeros(n)
    fixed = []  # before the loss and may not be re-run: kept or swapped
    savings = rerun_savings_s(analysis, profile, [v for v in forward if v in before
                                                  and recompute_skip_reason(analysis, v) is None], after)
    for v in forward:
        if v in savings:
            cost[col[v]] = rerun_floor_s(analysis, v, profile, readers) - savings[v]
        elif v in before:
            fixed.append(col[v])
    # reads: a re-run that writes its output (a reduction, or an element-wise op a library call reads) is a kernel of
    # its own, and reads each input that is kept, or re-run and written itself, from memory: once per tensor
    reads = _reads(analysis, forward, before, readers, col)
    Y = T + 1
    for j, (ref, readers_of) in enumerate(reads):
        u = col[ref.op]
        written = _writes(graph, graph.op(ref.op), readers[ref.op])
        for v in readers_of:
            if written:  # kept or re-run, it is in memory
                row([(Y + j, 1.0), (R + col[v], -1.0)], 0.0, np.inf)
            else:  # unless re-run and fused into the reader
                row([(Y + j, 1.0), (R + col[v], -1.0), (R + u, 1.0)], 0.0, np.inf)
    read_ms = [graph.tensor(ref).num_bytes / profile.effective_memory_bytes_per_s * 1e3
               for ref, _ in reads]
    # t >= plain + sum c r + reads (in ms), t >= 2 * swapped GiB * s/GiB (out before the loss, back after it)
    row([(T, 1.0)] + [(R + col[v], -cost[col[v]] * _MS) for v in forward if cost[col[v]] != 0]
        + [(Y + j, -x) for j, x in enumerate(read_ms)], plain.step_time_s * _MS, np.inf)
    link_ms_per_gib = _MS * _GIB / profile.effective_link_bytes_per_s
    row([(T, 1.0)] + [(H + j, -2.0 * sizes[buf] / _GIB * link_ms_per_gib) for j, buf in enumerate(bufs)], 0.0, np.inf)
    width = Y + len(reads)
    upper = np.ones(width)
    upper[T] = np.inf
    upper[[R + c for c in fixed]] = 0.0
    if not swaps:
        upper[H:H + nb] = 0.0
    objective = np.zeros(width)
    objective[T] = 1.0
    integrality = np.ones(width)
    integrality[T] = 0
    integrality[Y:] = 0  # (a read is 1 wherever a constraint asks, at the optimum)
    matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(len(lo), width))
    needed_bytes = sum(sizes[b] for b in {owner.get(f"{v}:{k}", f"{v}:{k}") for v in needed
                                          for k in range(len(graph.op(v).outputs))} if b in members)
    common = dict(plain_step_s=plain.step_time_s, cap_bytes=cap, swaps=swaps, needed_bytes=needed_bytes,
                  cut_op=cut, ops_after_loss=sum(1 for v in forward if v not in before),
                  gradient_ops_after=sum(1 for c in after if cats[c] is Category.BACKWARD))
    return _Program(objective=objective, constraints=LinearConstraint(matrix, lo, hi), integrality=integrality,
                    upper=upper, forward=forward, col=col, before=before, cost=cost, bufs=bufs, sizes=sizes, cap=cap,
                    common=common)


def _search(program: _Program, node_limit: int | None, time_limit_s: float, log: bool):
    """HiGHS's answer to ``program`` (:func:`scipy.optimize.milp`'s result), stopped at ``node_limit`` nodes, the
    gap :data:`MIP_REL_GAP` or ``time_limit_s``, whichever comes first."""
    from scipy.optimize import Bounds, milp
    options = {"time_limit": time_limit_s, "mip_rel_gap": MIP_REL_GAP, "disp": log}
    if node_limit is not None:
        options["node_limit"] = node_limit
    with solver_prints_to_stderr():
        return milp(program.objective, constraints=program.constraints, integrality=program.integrality,
                    bounds=Bounds(0.0, program.upper), options=options)


@contextlib.contextmanager
def solver_prints_to_stderr() -> Iterator[None]:
    """While HiGHS runs, what it writes to the process's standard output goes to standard error. HiGHS prints some
    lines from C++, past Python (``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``, on
    BERT-base bf16 at 1872 on h200-141gb), and ``tools/bench.py --json`` prints its records on standard output: they
    were no longer JSON lines. File descriptor 1 points at standard error for the while."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _status(result, node_limit: int | None) -> str:
    """Which rule stopped the search: ``"optimal"`` (within :data:`MIP_REL_GAP`), ``"node limit"`` (HiGHS's
    "solution limit", which scipy does not name: its status 4 with the node count at the limit), ``"time limit"``
    (scipy's status 1: milp sets no iteration limit) or ``"infeasible"``; ``None`` for any other end."""
    if result.status == 0:
        return "optimal"
    if result.status == 2:
        return "infeasible"
    if result.status == 1:
        return "time limit"
    if result.status == 4 and node_limit is not None and (result.mip_node_count or 0) >= node_limit:
        return "node limit"
    return None


def _answer(program: _Program, result, node_limit: int | None) -> CutBound:
    """The bound (:func:`_proven`) and the choice the search found, from HiGHS's answer."""
    status = _status(result, node_limit)
    if status == "infeasible":  # nothing fits at the loss
        return _infeasible(program)
    if status is None or result.x is None:
        raise RuntimeError(f"the cut bound's search ended without an answer: {result.message}")
    proven = _proven(result, program)
    x, col, (R, D, H, _) = result.x, program.col, program.columns
    recomputed = tuple(v for v in program.forward if x[R + col[v]] > 0.5 and v in program.before)
    bufs, sizes = program.bufs, program.sizes
    return CutBound(overhead_s=proven / _MS - program.common["plain_step_s"], status=status,
                    nodes=int(result.mip_node_count or 0), recomputed=recomputed,
                    recompute_s=float(sum(program.cost[col[v]] for v in recomputed)),
                    swapped_bytes=int(sum(sizes[b] for j, b in enumerate(bufs) if x[H + j] > 0.5 > x[D + j])),
                    kept_bytes=int(sum(sizes[b] for j, b in enumerate(bufs) if x[D + j] > 0.5)), **program.common)


def _proven(result, program: _Program) -> float:
    """The least ``t`` the search proved: its dual bound, whatever stopped it. "optimal" means the gap closed to
    :data:`MIP_REL_GAP`, so the incumbent (``result.fun``) may lie above the least overhead by that much and is no
    bound; a search that proved nothing (no finite dual bound) falls back on the linear relaxation's optimum."""
    proven = result.mip_dual_bound
    return proven if proven is not None and np.isfinite(proven) else _relaxed(program)


def _relaxed(program: _Program) -> float:
    """The linear relaxation's optimum: a bound where the search stopped before proving one."""
    from scipy.optimize import Bounds, milp
    with solver_prints_to_stderr():
        return milp(program.objective, constraints=program.constraints,
                    integrality=np.zeros_like(program.integrality), bounds=Bounds(0.0, program.upper)).fun


def _infeasible(program: _Program) -> CutBound:
    return CutBound(overhead_s=float("inf"), status="infeasible", nodes=0, recomputed=(), recompute_s=0.0,
                    swapped_bytes=0, kept_bytes=0, **program.common)


def _reads(analysis: Analysis, forward: list[str], before: set[str], readers: Mapping[str, tuple[str, ...]],
           col: Mapping[str, int]) -> list[tuple[TensorRef, list[str]]]:
    """The forward tensors a re-run that writes its output but is no library call (whose price counts its reads)
    reads from memory: by tensor, those readers."""
    graph = analysis.graph
    found: dict[TensorRef, list[str]] = {}
    for v in forward:
        op = graph.op(v)
        if v not in before or _library(op.type) or not _writes(graph, op, readers[v]):
            continue
        if recompute_skip_reason(analysis, v) is not None:
            continue
        for ref in dict.fromkeys(op.inputs):
            if ref.op in col and not is_resident(analysis, ref) and graph.tensor(ref).num_bytes:
                found.setdefault(ref, []).append(v)
    return sorted(found.items(), key=lambda kv: (col[kv[0].op], kv[0].index))
