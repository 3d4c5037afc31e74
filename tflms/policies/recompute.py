"""Recompute as a plan action: drop a forward tensor after its last forward use, rebuild it for the backward pass.

A :class:`RecomputeDecision` re-runs a connected set of forward ops (a *chain*, Capuchin's
collective recompute) as clones named ``lms/recompute_<op>``. Each clone reads the clones of
its inputs inside the chain and the original tensors outside it (its *sources*, which stay
alive until the clone runs). Every reader of a chain op's output that is not in the forward
pass reads the clone instead, so the original is freed after its last forward reader.

Without a trigger TensorFlow's executor would run a clone as soon as its sources exist, in
the forward pass, and save nothing. So each clone waits for a *trigger*: an ancestor of the
first backward reader it serves, ``ahead`` levels before it (as a swap-in's trigger,
:func:`~tflms.policies.swapplan.find_trigger`); a clone that only feeds other clones takes the
earliest trigger among them. It waits through *gates*, ``Identity`` s of what it reads with the
trigger as control input (:func:`clone_inputs` says why the clone carries none itself).

Which ops may be cloned is :func:`~tflms.policies.eligibility.recompute_skip_reason`; which
tensors are worth it is the tuner's question (:func:`rank_candidates` ranks them by bytes freed
per second of recompute, Capuchin's rule; :mod:`tflms.tune.hybrid` searches). The pass is
:func:`tflms.passes.recompute.insert_recomputes`, which :func:`tflms.passes.swaps.apply_swaps` runs first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from tflms.analysis.cto import Analysis, Category
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import CONSTANT_OPS, METADATA_ONLY_TYPES, SOURCE_OPS, VARIABLE_READ_OPS
from tflms.policies.eligibility import CLONE_PREFIX, NEVER_RECOMPUTE_DTYPES, recompute_skip_reason
from tflms.config import LMSConfig
from tflms.policies.swapplan import Skip, SwapPlan, find_trigger

#: The most ops one chain may re-run to rebuild one tensor (a longer chain costs more than it frees).
MAX_CHAIN_OPS = 12
#: The most ops chains joined by :func:`select` may hold together (one trigger region of the backward pass).
MAX_JOINED_OPS = 32
#: The most times one op is cloned (its first clone and the re-runs :func:`plan_recomputes` may add).
MAX_COPIES = 4


def clone_name(op: str, copy: int = 0) -> str:
    """The deterministic name of ``op``'s clone (its ``copy``-th: a chain op re-run again, :func:`plan_recomputes`)."""
    return CLONE_PREFIX + op if copy == 0 else f"{CLONE_PREFIX}{op}/again{copy}"


def gate_name(ref: TensorRef, trigger: str) -> str:
    """The deterministic name of the ``Identity`` that passes ``ref`` to clones once ``trigger`` has run."""
    return f"{CLONE_PREFIX}gate_{ref.op}_{ref.index}_after_{trigger}"


def clone_inputs(op, chain: frozenset[str] | set[str], trigger: str, copy: int = 0
                 ) -> tuple[list[TensorRef], list[TensorRef]]:
    """``(the clone's inputs, the tensors gated)``: each input from outside the chain comes through a gate, an
    ``Identity`` with the trigger as its control input; a clone reading only clones has its first input gated.

    The clone itself has no control input: oneDNN's CPU graph pass checks the in-edges of ops it merges (a
    ``Pad`` before a ``Conv2D`` must have exactly two: TensorFlow aborts on a third, a control edge), and the
    gate is an ``Identity`` no pass merges. It forwards its input's buffer: no copy, no memory.
    """
    inputs = [TensorRef(clone_name(ref.op, copy), ref.index) if ref.op in chain else ref for ref in op.inputs]
    outside = [ref for ref in op.inputs if ref.op not in chain]
    gated = list(dict.fromkeys(outside)) if outside else inputs[:1]
    gates = {ref: TensorRef(gate_name(ref, trigger), 0) for ref in gated}
    return [gates.get(ref, ref) for ref in inputs], gated


#: The kinds of op a :class:`RecomputeDecision` inserts (:meth:`RecomputeDecision.insertions`).
GATE, CLONE = "gate", "clone"


@dataclasses.dataclass(frozen=True)
class RecomputeDecision:
    """Re-run ``ops`` (one connected chain, in topological order) for the backward pass.

    ``tensors``: the chain's outputs that readers outside the forward pass read, with
    ``readers[k]`` the ops that read ``tensors[k]`` from its clone; ``num_bytes``: their bytes
    (what the gap between the forward and the backward pass no longer holds); ``sources``: the
    tensors the clones read from outside the chain; ``triggers[k]``: what the clone of ``ops[k]``
    waits for (its gates' control input).
    """

    ops: tuple[str, ...]
    tensors: tuple[TensorRef, ...]
    readers: tuple[tuple[str, ...], ...]
    num_bytes: int
    sources: tuple[TensorRef, ...]
    triggers: tuple[str, ...]
    #: ``(gate name, tensor gated, trigger)`` for each gate (:func:`clone_inputs`)
    gates: tuple[tuple[str, TensorRef, str], ...] = ()
    #: every op the decision inserts, in insertion order: before each clone, the gates it is the first to read
    inserted: tuple[str, ...] = ()
    #: 0, or which re-run this is of ops an earlier decision of the same chain also clones (``split_levels``)
    copy: int = 0

    @property
    def clones(self) -> tuple[str, ...]:
        """The clones' names (one per op of the chain)."""
        return tuple(clone_name(op, self.copy) for op in self.ops)

    def triggers_by_name(self) -> dict[str, str]:
        """What each inserted op (a gate or a clone) waits for, by name."""
        return {**{gate: trigger for gate, _, trigger in self.gates}, **dict(zip(self.clones, self.triggers))}

    def insertions(self) -> Iterator[tuple[str, str, str, TensorRef | str]]:
        """What the decision inserts, in ``inserted`` order (a gate just before the first clone that reads it):
        ``(GATE, name, trigger, the tensor gated)`` and ``(CLONE, name, trigger, the original op)``. Where two
        decisions share a gate, each names it: the first inserts it."""
        gates = {gate[0]: gate for gate in self.gates}
        ops = dict(zip(self.clones, zip(self.ops, self.triggers)))
        for name in self.inserted:
            if name in gates:
                _, ref, trigger = gates[name]
                yield GATE, name, trigger, ref
            else:
                original, trigger = ops[name]
                yield CLONE, name, trigger, original


def backward_readers(analysis: Analysis, ref: TensorRef, chain: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The readers of ``ref`` that are neither forward ops nor in the chain, by (level, name). Readers of its
    shape alone (``Shape``, ``Size``, ...: gradient ops run them as soon as the forward tensor exists) keep
    reading the original."""
    cats, levels, graph = analysis.categories, analysis.levels, analysis.graph
    readers = {c for c, _ in graph.consumers(ref) if c not in chain and cats[c] is not Category.FORWARD
               and graph.op(c).type not in METADATA_ONLY_TYPES}
    return tuple(sorted(readers, key=lambda n: (levels[n], n)))


def is_resident(analysis: Analysis, ref: TensorRef) -> bool:
    """Whether ``ref`` is on the device for the whole step: a constant, a variable read or a step argument."""
    op_type = analysis.graph.op(ref.op).type
    return op_type in CONSTANT_OPS or op_type in VARIABLE_READ_OPS or op_type in SOURCE_OPS


def is_kept(analysis: Analysis, ref: TensorRef) -> bool:
    """Whether ``ref`` is alive into the backward pass anyway: resident (:func:`is_resident`) or read by some op
    outside the forward pass."""
    graph = analysis.graph
    if is_resident(analysis, ref):
        return True
    if analysis.categories[ref.op] is not Category.FORWARD:
        return True
    cats = analysis.categories
    return any(cats[c] is not Category.FORWARD for c, _ in graph.consumers(ref))


def chain_for(analysis: Analysis, target: str, *, max_ops: int = MAX_CHAIN_OPS,
              kept: Callable[[TensorRef], bool] | None = None
              ) -> tuple[tuple[str, ...] | None, tuple[str, str] | None]:
    """The ops to re-run to rebuild ``target``'s outputs from kept tensors: ``(chain, None)`` or
    ``(None, (reason, sentence))``.

    Walks back from ``target``: an input that is kept (``kept``, default :func:`is_kept`) is a source; any other
    input's producer joins the chain if it may be recomputed, up to ``max_ops`` ops.
    """
    if kept is None:
        def kept(ref: TensorRef) -> bool:
            return is_kept(analysis, ref)
    reason = recompute_skip_reason(analysis, target)
    if reason is not None:
        return None, reason
    graph = analysis.graph
    chain, stack = {target}, [target]
    while stack:
        for ref in graph.op(stack.pop()).inputs:
            if ref.op in chain or kept(ref):
                continue
            why = recompute_skip_reason(analysis, ref.op)
            if why is not None:
                return None, ("source", f"input {ref.name} is freed in the forward pass and its producer cannot be "
                              f"recomputed ({why[0]}: {why[1]})")
            if len(chain) >= max_ops:
                return None, ("long-chain", f"rebuilding it needs more than {max_ops} ops")
            chain.add(ref.op)
            stack.append(ref.op)
    return tuple(sorted(chain, key=lambda n: (analysis.levels[n], n))), None


def recompute_plan(analysis: Analysis, ops: Iterable[str], config: LMSConfig | None = None, *,
                   accelerator_device: str = "/device:GPU:0", split_levels: int | None = None,
                   per_reader: Iterable[str] = (), skipped: Sequence[Skip] = ()) -> SwapPlan:
    """A plan that recomputes ``ops`` (:func:`plan_recomputes`) and swaps nothing, on ``config`` (default
    ``LMSConfig()``) for ``accelerator_device``; its skips are ``skipped`` and the ops :func:`plan_recomputes`
    refused. ``apply_swaps`` applies it; an empty ``recomputes`` means nothing could be recomputed."""
    decisions, skips = plan_recomputes(analysis, ops, split_levels=split_levels, per_reader=per_reader)
    return SwapPlan(config=config or LMSConfig(), accelerator_device=accelerator_device, swaps=(),
                    skipped=tuple(skipped) + skips, recomputes=decisions)


def plan_recomputes(analysis: Analysis, ops: Iterable[str], *, ahead: int = 1, split_levels: int | None = None,
                    per_reader: Iterable[str] = ()) -> tuple[tuple[RecomputeDecision, ...], tuple[Skip, ...]]:
    """Decisions that re-run ``ops`` (forward ops, e.g. the union of :func:`chain_for` chains), one per connected
    chain, with their triggers; ops whose clone would serve no reader or find no trigger are skipped.

    A clone that feeds other clones runs with the earliest of them, and then waits for its own readers: in a long
    chain (a checkpointed segment of several layers) the first layers' clones wait through the last layers'
    backward pass. With ``split_levels``, an op whose own trigger comes more than that many levels after the
    trigger of the clones it feeds is re-run again for its own readers, with what it reads inside the chain (a
    second decision of the chain, ``copy`` 1, its clones named ``.../again1``; and so on, at most
    :data:`MAX_COPIES` clones of one op): time for memory, as a chain split in two would be, but from the same
    kept tensors. The ops of ``per_reader`` are re-run again wherever their own readers come later than those of
    the clones they feed (a split at 0 levels, for them alone): each clone lives only until its readers ran.

    Deterministic: the same analysis and ops give the same decisions, in level order.
    """
    chosen = set(ops)
    eager = frozenset(per_reader)
    skipped: list[Skip] = []
    for name in sorted(chosen):
        why = recompute_skip_reason(analysis, name)
        if why is not None:
            skipped.append(Skip(TensorRef(name, 0), *why))
            chosen.discard(name)
    while True:  # an op whose clone finds no trigger leaves the set, and the chains are formed again
        decisions, dropped, unread = [], [], []
        for members in _chains(analysis, chosen):
            decided, missing = _decided(analysis, tuple(members), ahead, split_levels, eager.intersection(members))
            if decided is None and missing:
                dropped.extend(missing)
            elif decided is None:
                unread.append(Skip(TensorRef(members[-1], 0), "no-backward-reader",
                                   "nothing outside the forward pass reads this chain's outputs"))
            else:
                decisions.extend(decided)
        if not dropped:
            return tuple(decisions), tuple(skipped + unread)
        for name in sorted(dropped):
            chosen.discard(name)
            skipped.append(Skip(TensorRef(name, 0), "no-trigger",
                                "no op after the forward pass can hold its clone back (it would run at once)"))


#: Chains whose decisions :func:`_decided` keeps per analysis (the tuner's recompute search plans a few hundred
#: distinct chains, each several times: the price sets, segment plans and relaxed plans share most of them).
DECISION_MEMO_SIZE = 1 << 14


def _decided(analysis: Analysis, members: tuple[str, ...], ahead: int, split_levels: int | None,
             per_reader: frozenset[str] = frozenset()
             ) -> tuple[tuple[RecomputeDecision, ...] | None, tuple[str, ...]]:
    """:func:`_decide` of a whole chain, memoized with the analysis (stored in its ``__dict__`` as
    :func:`functools.cached_property` stores its values: the analysis is frozen, and a chain's decisions depend on it
    and the arguments alone)."""
    memo = analysis.__dict__.setdefault("_recompute_decisions", {})
    key = (members, ahead, split_levels, per_reader)
    hit = memo.get(key)
    if hit is None:
        decided, missing = _decide(analysis, members, ahead, split_levels=split_levels, per_reader=per_reader)
        if len(memo) >= DECISION_MEMO_SIZE:
            memo.clear()
        hit = memo[key] = (None if decided is None else tuple(decided), tuple(missing))
    return hit


def _chains(analysis: Analysis, chosen: set[str]) -> list[list[str]]:
    """The ops of ``chosen`` in connected chains (joined by data edges), each in level order, chains in level order."""
    levels, graph = analysis.levels, analysis.graph
    parent = {name: name for name in chosen}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name in sorted(chosen):
        for ref in graph.op(name).inputs:
            if ref.op in chosen:
                parent[find(ref.op)] = find(name)
    groups: dict[str, list[str]] = {}
    for name in chosen:
        groups.setdefault(find(name), []).append(name)
    return sorted((sorted(g, key=lambda n: (levels[n], n)) for g in groups.values()),
                  key=lambda g: (levels[g[0]], g[0]))


def _decide(analysis: Analysis, members: Sequence[str], ahead: int, *, split_levels: int | None = None,
            per_reader: frozenset[str] = frozenset(), copy: int = 0, serves: frozenset[str] | None = None,
            top: int | None = None) -> tuple[list[RecomputeDecision] | None, list[str]]:
    """The decisions for one chain (its re-runs after the first, see :func:`plan_recomputes`), or ``(None, the ops
    whose clone finds no trigger)`` (``[]``: no reader). ``serves``: the ops whose backward readers this re-run
    serves (default: all; the others only feed them); ``top``: the whole chain's highest level (a trigger comes
    after it); ``per_reader``: the ops split at 0 levels."""
    graph, levels = analysis.graph, analysis.levels
    chain = frozenset(members)
    own: dict[str, list[tuple[TensorRef, tuple[str, ...]]]] = {}
    for name in members:
        if serves is None or name in serves:
            for index, _ in enumerate(graph.op(name).outputs):
                ref = TensorRef(name, index)
                rs = backward_readers(analysis, ref, chain)
                if rs:
                    own.setdefault(name, []).append((ref, rs))
    if not own:
        return None, []
    top = max(levels[n] for n in members) if top is None else top

    def earliest(options):
        return min(options, key=lambda n: (levels[n], n))

    # each clone's trigger: before its own first backward reader, or the earliest trigger of the clones it feeds
    trigger: dict[str, str | None] = {}
    missing, again = [], []
    for name in reversed(members):
        own_trigger = None
        if name in own:
            # a clone serving its own readers must run before the first of them: its own trigger or none (a
            # later trigger of a clone it feeds could depend on that reader: a cycle)
            first = earliest(rs[0] for _, rs in own[name])
            own_trigger = find_trigger(analysis, first, top, levels[first] - ahead)
            if own_trigger is None:
                missing.append(name)
        fed = [trigger[c] for index, _ in enumerate(graph.op(name).outputs)
               for c, _ in graph.consumers(TensorRef(name, index)) if c in chain and trigger[c] is not None]
        feeder = earliest(fed) if fed else None
        split = 0 if name in per_reader else split_levels
        if (split is not None and own_trigger is not None and feeder is not None and copy + 1 < MAX_COPIES
                and levels[own_trigger] - levels[feeder] > split):
            again.append(name)  # it feeds now and is re-run for its own readers, rather than wait for them
            own.pop(name)
            trigger[name] = feeder
            continue
        options = [t for t in (own_trigger, feeder) if t is not None]
        trigger[name] = earliest(options) if options else None
    missing += [n for n in members if trigger[n] is None and n not in missing]
    if missing:
        return None, missing
    decisions = [_decision(analysis, members, own, trigger, copy)]
    if again:
        # the ops to re-run again: those waiting and what they read inside the chain, back to its sources
        rerun, stack = set(again), list(again)
        while stack:
            for ref in graph.op(stack.pop()).inputs:
                if ref.op in chain and ref.op not in rerun:
                    rerun.add(ref.op)
                    stack.append(ref.op)
        later, missing = _decide(analysis, [n for n in members if n in rerun], ahead, split_levels=split_levels,
                                 per_reader=per_reader, copy=copy + 1, serves=frozenset(again), top=top)
        if later is None:
            return None, missing
        decisions += later
    return decisions, []


def _decision(analysis: Analysis, members: Sequence[str], own: dict[str, list[tuple[TensorRef, tuple[str, ...]]]],
              trigger: Mapping[str, str], copy: int) -> RecomputeDecision:
    """The ``copy``-th decision of a chain: its clones, the gates they read through, and the tensors it serves
    (``own``: by op, each tensor with its backward readers)."""
    graph, levels = analysis.graph, analysis.levels
    chain = frozenset(members)
    served = [pair for name in members for pair in own.get(name, ())]
    tensors = tuple(ref for ref, _ in served)
    sources = sorted({ref for name in members for ref in graph.op(name).inputs if ref.op not in chain},
                     key=lambda r: (levels[r.op], r.op, r.index))
    num_bytes = sum(graph.tensor(ref).num_bytes or 0 for ref in tensors)
    gates: dict[str, tuple[str, TensorRef, str]] = {}
    inserted: list[str] = []
    for name in members:
        for ref in clone_inputs(graph.op(name), chain, trigger[name], copy)[1]:
            gate = gate_name(ref, trigger[name])
            if gate not in gates:
                gates[gate] = (gate, ref, trigger[name])
                inserted.append(gate)
        inserted.append(clone_name(name, copy))
    return RecomputeDecision(ops=tuple(members), tensors=tensors, readers=tuple(rs for _, rs in served),
                             num_bytes=num_bytes, sources=tuple(sources),
                             triggers=tuple(trigger[n] for n in members), gates=tuple(gates.values()),
                             inserted=tuple(inserted), copy=copy)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A forward op whose outputs the backward pass reads, the chain that rebuilds them, and what it is worth."""

    target: str
    chain: tuple[str, ...]
    freed_bytes: int
    cost_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.freed_bytes / self.cost_s if self.cost_s > 0 else float("inf")


def rank_candidates(analysis: Analysis, op_time: Callable[[str], float], *,
                    min_bytes: int = 0) -> tuple[list[Candidate], list[Skip]]:
    """Every forward op whose outputs a backward op reads, more than ``min_bytes`` of them, with the chain that
    rebuilds them (:func:`chain_for`), ranked by bytes freed per second of recompute (Capuchin's rule; ties by
    name). ``op_time(name)`` is an op's simulated time."""
    graph, cats = analysis.graph, analysis.categories
    out, skipped = [], []
    for name in analysis.order:
        if cats[name] is not Category.FORWARD:
            continue
        op = graph.op(name)
        freed = 0
        for index, info in enumerate(op.outputs):
            if backward_readers(analysis, TensorRef(name, index)):
                freed += info.num_bytes or 0
        if freed <= min_bytes:  # (min_bytes >= 0: nothing freed is never a candidate)
            continue
        chain, why = chain_for(analysis, name)
        if chain is None:
            skipped.append(Skip(TensorRef(name, 0), *why))
            continue
        out.append(Candidate(name, chain, freed, sum(op_time(n) for n in chain)))
    out.sort(key=lambda c: (-c.bytes_per_s, c.target))
    return out, skipped


def select(analysis: Analysis, ranked: Sequence[Candidate], *, max_joined: int = MAX_JOINED_OPS) -> set[str]:
    """The ops to re-run for ``ranked`` candidates taken greedily in order, keeping every chain local.

    A candidate is taken unless its target is recomputed already, or its chain would recompute a tensor an
    earlier chain reads as a kept source (that chain's clone would keep the original alive), or it joins
    chains (by reading a tensor they recompute) into more than ``max_joined`` ops. Without the last two rules
    the union of every chain is one region whose clones start at the first backward reader of any of them:
    the whole forward pass re-run at once, which saves nothing.
    """
    graph = analysis.graph
    chosen: set[str] = set()
    pinned: set[TensorRef] = set()  # tensors some clone reads as kept originals
    root: dict[str, str] = {}
    size: dict[str, int] = {}

    def find(x: str) -> str:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for cand in ranked:
        if cand.target in chosen:
            continue
        ops = set(cand.chain)
        if any(TensorRef(op, i) in pinned for op in ops for i, _ in enumerate(graph.op(op).outputs)):
            continue
        sources = {ref for op in ops for ref in graph.op(op).inputs if ref.op not in ops}
        joined = {find(op) for op in ops if op in chosen} | {find(ref.op) for ref in sources if ref.op in chosen}
        new = ops - chosen
        if len(new) + sum(size[g] for g in joined) > max_joined:
            continue
        for op in new:
            root[op], size[op] = op, 1
        roots = joined | new
        top = min(roots)
        size[top] = sum(size[r] for r in roots)
        for r in roots:
            root[r] = top
        chosen |= new
        pinned |= {ref for ref in sources if ref.op not in chosen}
    return chosen


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
    input.
    """
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
    """The ops the batch flows through in the forward pass (:func:`_activations`) that may be recomputed."""
    return {name for name in _activations(analysis) if recompute_skip_reason(analysis, name) is None}


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
