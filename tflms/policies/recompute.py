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
tensors are worth it is the tuner's question (:func:`~tflms.policies.recompute_rank.rank_candidates` ranks them
by bytes freed per second of recompute, Capuchin's rule; :mod:`tflms.tune.hybrid` searches). The pass is
:func:`tflms.passes.recompute.insert_recomputes`, which :func:`tflms.passes.swaps.apply_swaps` runs first.

This module decides what a recompute inserts (:class:`RecomputeDecision`: clones, gates, their names) and plans the
decisions for a set of ops (:func:`plan_recomputes`: chains, triggers, re-runs). Beside it: which ops rebuild a
tensor (:mod:`tflms.policies.recompute_chains`), which tensors are worth it (:mod:`tflms.policies.recompute_rank`)
and graph-level checkpoints (:mod:`tflms.policies.checkpoints`); their names stay importable from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

from tflms.analysis.cto import Analysis
from tflms.ir.graph import TensorRef
from tflms.ir.topo import connected_groups
from tflms.policies.eligibility import CLONE_PREFIX, recompute_skip_reason
from tflms.config import LMSConfig
from tflms.policies.swapplan import Skip, SwapPlan, find_trigger
# which ops rebuild a tensor, which tensors are worth it, graph-level checkpoints: the names stay importable here
from tflms.policies.recompute_chains import (MAX_CHAIN_OPS, backward_readers, chain_for, is_kept,  # noqa: F401
                                               is_resident)
from tflms.policies.recompute_rank import MAX_JOINED_OPS, Candidate, rank_candidates, select  # noqa: F401
from tflms.policies.checkpoints import (ACTIVATION_DTYPES, _activations, _recomputable,  # noqa: F401
                                        _step_arguments, articulations, balanced_segment_ops, output_bytes,
                                        segment_ops)

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


def recompute_plan(analysis: Analysis, ops: Iterable[str], config: LMSConfig | None = None, *,
                   accelerator_device: str = "/device:GPU:0", split_levels: int | None = None,
                   per_reader: Iterable[str] = (), skipped: Sequence[Skip] = (),
                   split_readers: bool = False) -> SwapPlan:
    """A plan that recomputes ``ops`` (:func:`plan_recomputes`) and swaps nothing, on ``config`` (default
    ``LMSConfig()``) for ``accelerator_device``; its skips are ``skipped`` and the ops :func:`plan_recomputes`
    refused. ``apply_swaps`` applies it; an empty ``recomputes`` means nothing could be recomputed."""
    decisions, skips = plan_recomputes(analysis, ops, split_levels=split_levels, per_reader=per_reader,
                                       split_readers=split_readers)
    return SwapPlan(config=config or LMSConfig(), accelerator_device=accelerator_device, swaps=(),
                    skipped=tuple(skipped) + skips, recomputes=decisions)


def plan_recomputes(analysis: Analysis, ops: Iterable[str], *, ahead: int = 1, split_levels: int | None = None,
                    per_reader: Iterable[str] = (), split_readers: bool = False
                    ) -> tuple[tuple[RecomputeDecision, ...], tuple[Skip, ...]]:
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
    With ``split_readers``, a clone per reader: a tensor read by backward ops at several levels gets a clone for
    the readers at the first of them and is re-run again (a later copy, from the same kept tensors) for the rest,
    and every op is split at 0 levels, as ``per_reader`` does for its ops: without it one clone serves every reader
    and waits on the device between them. Issue 45's CNN: the second convolution's output is
    read by the third's filter gradient and by its own ReLU gradient, and the third's input gradient, made between
    them, is the step's peak; one clone per reader fits 90 MiB at +20.2%, where the tuner had swapped that tensor
    (+109%; docs/design.md, "The pick against a broader search").

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
            decided, missing = _decided(analysis, tuple(members), ahead, split_levels, eager.intersection(members),
                                        split_readers)
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
             per_reader: frozenset[str] = frozenset(), split_readers: bool = False
             ) -> tuple[tuple[RecomputeDecision, ...] | None, tuple[str, ...]]:
    """:func:`_decide` of a whole chain, memoized with the analysis (stored in its ``__dict__`` as
    :func:`functools.cached_property` stores its values: the analysis is frozen, and a chain's decisions depend on it
    and the arguments alone)."""
    memo = analysis.__dict__.setdefault("_recompute_decisions", {})
    key = (members, ahead, split_levels, per_reader, split_readers)
    hit = memo.get(key)
    if hit is None:
        decided, missing = _decide(analysis, members, ahead, split_levels=split_levels, per_reader=per_reader,
                                   split_readers=split_readers)
        if len(memo) >= DECISION_MEMO_SIZE:
            memo.clear()
        hit = memo[key] = (None if decided is None else tuple(decided), tuple(missing))
    return hit


def _chains(analysis: Analysis, chosen: set[str]) -> list[list[str]]:
    """The ops of ``chosen`` in connected chains (joined by data edges), each in level order, chains in level order."""
    levels, graph = analysis.levels, analysis.graph
    groups = connected_groups(sorted(chosen), ((ref.op, name) for name in sorted(chosen)
                                               for ref in graph.op(name).inputs if ref.op in chosen))
    return sorted((sorted(g, key=lambda n: (levels[n], n)) for g in groups),
                  key=lambda g: (levels[g[0]], g[0]))


def _gated(op, chain: frozenset[str], copy: int) -> list[TensorRef]:
    """The tensors :func:`clone_inputs` gates for ``op``'s clone (its second answer), without making its inputs."""
    outside = [ref for ref in op.inputs if ref.op not in chain]
    if outside:
        return list(dict.fromkeys(outside))
    return [TensorRef(clone_name(ref.op, copy), ref.index) for ref in op.inputs[:1]]


def _trigger(analysis: Analysis, first: str, top: int, target: int) -> str | None:
    """:func:`~tflms.policies.swapplan.find_trigger` of a clone's first reader, kept with the analysis as
    :func:`_decided` keeps its decisions (the chains of a tune ask again about the same readers)."""
    memo = analysis.__dict__.setdefault("_recompute_triggers", {})
    key = (first, top, target)
    if key not in memo:
        memo[key] = find_trigger(analysis, first, top, target)
    return memo[key]


def _consumer_ops(analysis: Analysis, name: str) -> tuple[str, ...]:
    """The consumers of each output of op ``name``, output by output (as ``Graph.consumers`` lists them), kept with the
    analysis as :func:`_decided` keeps its decisions."""
    memo = analysis.__dict__.setdefault("_consumer_ops", {})
    found = memo.get(name)
    if found is None:
        graph = analysis.graph
        found = memo[name] = tuple(c for index, _ in enumerate(graph.op(name).outputs)
                                   for c, _ in graph.consumers(TensorRef(name, index)))
    return found


def _decide(analysis: Analysis, members: Sequence[str], ahead: int, *, split_levels: int | None = None,
            per_reader: frozenset[str] = frozenset(), copy: int = 0,
            serves: Mapping[str, Mapping[TensorRef, tuple[str, ...]] | None] | None = None,
            top: int | None = None, split_readers: bool = False) -> tuple[list[RecomputeDecision] | None, list[str]]:
    """The decisions for one chain (its re-runs after the first, see :func:`plan_recomputes`), or ``(None, the ops
    whose clone finds no trigger)`` (``[]``: no reader). ``serves``: the ops whose backward readers this re-run
    serves (default: all; the others only feed them), each with the readers it serves by tensor (``None``: all of
    them); ``top``: the whole chain's highest level (a trigger comes after it); ``per_reader``: the ops split at 0
    levels; ``split_readers``: a tensor's readers after the first level are left to the next re-run, and every op
    is split at 0 levels (each clone serves one level of readers, or feeds)."""
    graph, levels = analysis.graph, analysis.levels
    chain = frozenset(members)
    own: dict[str, list[tuple[TensorRef, tuple[str, ...]]]] = {}
    later: dict[str, dict[TensorRef, tuple[str, ...]]] = {}  # readers left to the next re-run (``split_readers``)
    considered: dict[str, dict[TensorRef, tuple[str, ...]]] = {}  # every reader this re-run was to serve, by op
    for name in members:
        if serves is None or name in serves:
            only = None if serves is None else serves[name]
            for index, _ in enumerate(graph.op(name).outputs):
                ref = TensorRef(name, index)
                rs = backward_readers(analysis, ref, chain)
                if only is not None:
                    rs = tuple(r for r in rs if r in only.get(ref, ()))
                if rs:
                    considered.setdefault(name, {})[ref] = rs
                if rs and split_readers and copy + 1 < MAX_COPIES and levels[rs[-1]] > levels[rs[0]]:
                    first = tuple(r for r in rs if levels[r] == levels[rs[0]])
                    later.setdefault(name, {})[ref] = rs[len(first):]
                    rs = first
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
            own_trigger = _trigger(analysis, first, top, levels[first] - ahead)
            if own_trigger is None:
                missing.append(name)
        fed = [trigger[c] for c in _consumer_ops(analysis, name) if c in chain and trigger[c] is not None]
        feeder = earliest(fed) if fed else None
        split = 0 if name in per_reader or split_readers else split_levels
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
    if again or later:
        # the ops to re-run again: those waiting and what they read inside the chain, back to its sources
        # (an op re-run again for its own readers is served all it was to serve here; a split one the rest)
        served: dict[str, Mapping[TensorRef, tuple[str, ...]] | None] = {
            **later, **{n: None if serves is None else considered[n] for n in again}}
        rerun, stack = set(served), list(served)
        while stack:
            for ref in graph.op(stack.pop()).inputs:
                if ref.op in chain and ref.op not in rerun:
                    rerun.add(ref.op)
                    stack.append(ref.op)
        again_decided, missing = _decide(analysis, [n for n in members if n in rerun], ahead,
                                         split_levels=split_levels, per_reader=per_reader, copy=copy + 1,
                                         serves=served, top=top, split_readers=split_readers)
        if again_decided is None:
            return None, missing
        decisions += again_decided
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
        for ref in _gated(graph.op(name), chain, copy):
            gate = gate_name(ref, trigger[name])
            if gate not in gates:
                gates[gate] = (gate, ref, trigger[name])
                inserted.append(gate)
        inserted.append(clone_name(name, copy))
    return RecomputeDecision(ops=tuple(members), tensors=tensors, readers=tuple(rs for _, rs in served),
                             num_bytes=num_bytes, sources=tuple(sources),
                             triggers=tuple(trigger[n] for n in members), gates=tuple(gates.values()),
                             inserted=tuple(inserted), copy=copy)
