"""Incremental evaluation of swap plans: many plans, one base graph, no IR copies.

The tuner judges dozens of :class:`~tflms.policies.swapplan.SwapPlan` s of one graph.
``simulate(apply_swaps(graph, plan))`` copies the IR, prunes it, inserts the
implicit copies and recomputes adjacency and levels for every plan.
:class:`PlanEvaluator` derives the plan-independent facts once per base graph:

- the graph in index form (:class:`~tflms.sim.simulator.IndexedGraph`: integer
  op and tensor ids, predecessor lists, device classes);
- which ops run (pruning to the outputs and control outputs), and which host
  tensors accelerator ops read (TensorFlow's implicit ``_Recv`` copies);
- each op's compute time (:class:`~tflms.sim.simulator.OpCosts`; a swap plan
  does not change any op's inputs' shapes, so costs never change);
- the consumers of every tensor.

:meth:`PlanEvaluator.evaluate` then copies the flat lists, appends the plan's
swap ops exactly as :func:`~tflms.passes.swaps.apply_swaps` inserts them
(same names, devices, edges, graph order), extends the pruning and the implicit
copies from the base's (only ops whose edges changed are revisited) and runs the
simulator's core on the result. A plan that only recomputes is applied the same way
(gates and clones appended, their readers rewired; a clone costs what its original does),
and which ops run and the implicit copies are derived again (a reader rewired to a clone can
leave its original unread). A plan with both, or with a given ``order``, is simulated on its
rewritten IR graph. The answer is the same :class:`SimResult`,
field for field, as ``simulate(apply_swaps(base, plan, copy_op=...), profile,
options=options)`` (``tests/test_incremental.py`` checks this on many plans),
and it is memoized by plan.

Execution order. By default the rewritten graph runs in CTO level order, as in
:func:`~tflms.sim.simulator.simulate`. A given ``order`` (op names of the
*base* graph, e.g. a memory-aware schedule) is extended to the swap ops by
:func:`order_with_plan`: each swap op goes right after its last predecessor in
the order (a swap-out after the tensor's producer; a swap-in after the later of
its swap-out and its trigger), several after one op in ``apply_swaps``'s
insertion order; the simulator then places each implicit ``_Recv`` just before
its first consumer. Swap ops run on the host or a copy stream, so their place
only decides ties between events at one instant and the order in which ready
copies queue; the rule is "as early as the edges allow", which is where the level
order puts them too (a swap op's level is one more than its latest input's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from itertools import compress

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.passes.swaps import DEFAULT_COPY_OP, SWAPIN_ON_HOST, apply_swaps, resolve_swapin_on
from tflms.policies.eligibility import is_clone, is_inserted
from tflms.policies.recompute import GATE, RecomputeDecision, clone_inputs, clone_name
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import HardwareProfile, get_profile
from tflms.sim.simulator import (IndexedGraph, OpCosts, SimOptions, SimResult, _add_recvs, _check_order,
                                 _device_class, _level_sorted, gc_paused, _needed, _order_ids, _recv_needs, _run)
from tflms.sim.indexed import positions, still_needed, successor_counts

logger = logging.getLogger(__name__)

#: Results a :class:`PlanEvaluator` keeps (oldest dropped first); a tune simulates a few dozen plans.
MEMO_SIZE = 256


def order_with_plan(order: Sequence[str], plan: SwapPlan) -> list[str]:
    """``order`` (op names of the base graph) with the plan's swap ops slotted in (see module doc).

    A swap op whose predecessor is not in ``order`` is left out (the simulator
    then reports the order as incomplete, unless the op does not run).
    """
    pos = {name: k for k, name in enumerate(order)}
    after: dict[str, list[str]] = {}
    anchor: dict[str, str] = {}  # new op -> the base op it follows
    placed: set[str] = set()
    for decision in plan.recomputes:
        # a gate or clone runs after its trigger, which follows its sources (forward tensors); each clone after
        # its gates (insertion order), each trigger no later than the next clone's (a clone takes the earliest of
        # its readers'); a gate shared by two chains is placed once
        triggers = decision.triggers_by_name()
        for name in decision.inserted:
            trigger = triggers[name]
            if trigger in pos and name not in placed:
                placed.add(name)
                anchor[name] = trigger
                after.setdefault(trigger, []).append(name)
    for swap in plan.swaps:
        producer = swap.tensor.op
        if producer not in pos:
            continue
        anchor[swap.swap_out] = producer
        after.setdefault(producer, []).append(swap.swap_out)
        for group in swap.swap_ins:
            at = producer
            if group.trigger is not None:
                if group.trigger not in pos:
                    continue
                if pos[group.trigger] > pos[at]:
                    at = group.trigger
            anchor[group.name] = at
            after.setdefault(at, []).append(group.name)
    out: list[str] = []
    for name in order:
        out.append(name)
        out.extend(after.get(name, ()))
    return out


class PlanEvaluator:
    """Simulates swap plans of one base graph without copying it (see module doc).

    ``copy_op`` and ``swapin_on`` mean what they mean for
    :func:`~tflms.passes.swaps.apply_swaps`; ``order`` (op names of the base
    graph) replaces the level order (see :func:`order_with_plan`); ``topological_order`` (op names of the base
    graph, e.g. its analysis's ``order``) spares computing one, and ``known_op_times_s`` (op name -> seconds on
    ``profile``, for ops of the same type, attributes and tensors: :class:`~tflms.sim.simulator.OpCosts`) pricing
    those ops again. Results are
    memoized by plan (the last :data:`MEMO_SIZE`); ``simulations`` and
    ``memo_hits`` count what was simulated and what was answered from memory.
    """

    def __init__(self, base_graph: Graph, profile: str | HardwareProfile, options: SimOptions | None = None, *,
                 copy_op: str = DEFAULT_COPY_OP, swapin_on: str | None = None, order: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None, topological_order: Sequence[str] | None = None,
                 known_op_times_s: Mapping[str, float] | None = None):
        swapin_on = resolve_swapin_on(copy_op, swapin_on)
        self.graph = base_graph
        self.profile = get_profile(profile)
        self.options = options or SimOptions()
        self.copy_op, self.swapin_on = copy_op, swapin_on
        self.order = tuple(order) if order is not None else None
        with gc_paused():
            self._derive(base_graph, output_names, topological_order, known_op_times_s)
        self._memo: dict = {}
        self._recipes: dict[int, tuple] = {}  # what each recompute decision inserts (:meth:`_recipe`), by id
        self.simulations = 0  # plans simulated (memo misses)
        self.memo_hits = 0

    def _derive(self, base_graph: Graph, output_names: Sequence[str] | None,
                topological_order: Sequence[str] | None, known_op_times_s: Mapping[str, float] | None) -> None:
        """The plan-independent facts of the base graph (see module doc). ``topological_order``: one the caller has
        (an analysis's), else the graph's; :meth:`_level_sorted` walks it, and any topological order gives the same
        level order (longest paths, ties by op id)."""
        sig = base_graph.signature
        if output_names is None:
            output_names = sig.output_names if sig is not None else ()
        host = self.options.host_device
        net = IndexedGraph.from_graph(base_graph, host)
        self._net = net
        self._op_id = {name: i for i, name in enumerate(net.names)}
        self._lms_op = next((name for name in net.names if is_inserted(name) and not is_clone(name)), None)
        self._prunes = self.options.prune_unused and sig is not None
        n = len(net.names)
        self._roots = net.roots(base_graph, output_names, self._op_id) if self._prunes else []
        self._alive = _needed(net, self._roots) if self._prunes else [True] * n
        self._readers_of = successor_counts(net, self._alive) if self._prunes else None  # (for ``still_needed``)
        self._recv_needs = _recv_needs(net, range(n), self._alive)
        self._recv_entries: dict[int, list[tuple[int, int]]] = {}
        for t, entries in self._recv_needs.items():
            for consumer, index in entries:
                self._recv_entries.setdefault(consumer, []).append((t, index))
        self._consumers: dict[int, list[tuple[int, int]]] = {}
        for i, ins in enumerate(net.inputs):
            for k, t in enumerate(ins):
                self._consumers.setdefault(t, []).append((i, k))
        self._outputs = []
        for name in output_names:
            ref = TensorRef.parse(name)
            i = self._op_id.get(ref.op)
            if i is not None and self._alive[i] and 0 <= ref.index < net.n_out[i]:
                self._outputs.append(net.out_start[i] + ref.index)
        self._costs = OpCosts(base_graph, self.profile, known_op_times_s, names=net.names)
        if topological_order is None:
            topological_order = base_graph.topological_order()
        self._topo = [self._op_id[name] for name in topological_order]
        self._rank = [0] * n  # position in ``_topo``
        for k, i in enumerate(self._topo):
            self._rank[i] = k

    # ------------------------------------------------------------------ public
    def op_times(self) -> dict[str, float]:
        """Every base op's price by name (:func:`~tflms.sim.cost.op_time_s`), from the costs the simulations share:
        each op is priced once per tune, not once more per search."""
        costs, net = self._costs, self._net
        return {name: costs.time_s(i, src) for i, (name, src) in enumerate(zip(net.names, net.src_ops))
                if src is not None}

    def remember(self, plan: SwapPlan | None, result: SimResult) -> None:
        """Take ``result`` as :meth:`evaluate`'s answer for ``plan`` (one simulated already, e.g. the base graph's
        own simulation, which an outer tune made)."""
        self._store(self._key(plan), result)

    def remembered(self, plan: SwapPlan | None) -> SimResult | None:
        """:meth:`evaluate`'s answer for ``plan`` where it is memoized, else ``None`` (nothing is simulated)."""
        return self._memo.get(self._key(plan))

    @staticmethod
    def _key(plan: SwapPlan | None) -> tuple | None:
        """The memo's key of ``plan`` (``None``: the base graph, also for a plan that inserts nothing)."""
        if plan is None or not plan.changed:
            return None
        return plan.config.host_device, plan.accelerator_device, plan.swaps, plan.recomputes

    def _store(self, key: tuple | None, result: SimResult) -> None:
        if len(self._memo) >= MEMO_SIZE:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = result

    def evaluate(self, plan: SwapPlan | None) -> SimResult:
        """The simulation of ``plan`` applied to the base graph (``None``: the base graph itself)."""
        if plan is not None and not plan.changed:
            plan = None  # nothing inserted: the base graph
        key = self._key(plan)
        hit = self._memo.get(key)
        if hit is not None:
            self.memo_hits += 1
            return hit
        with gc_paused():
            rewritten = (plan is not None and plan.recomputes
                         and (plan.swaps or self.order is not None or self._lms_op is not None))
            result = self._simulate_rewritten(plan) if rewritten else self._simulate(plan)
        self._store(key, result)
        self.simulations += 1
        return result

    def rewritten_graph(self, plan: SwapPlan) -> Graph:
        """The IR graph ``plan`` makes (what :meth:`evaluate` simulated), built on demand."""
        return apply_swaps(self.graph, plan, copy_op=self.copy_op, swapin_on=self.swapin_on).graph

    # ----------------------------------------------------------------- private
    def _simulate_rewritten(self, plan: SwapPlan) -> SimResult:
        """A plan with recomputes and swaps (or a given order), simulated on its rewritten IR graph (the hybrid search
        plans swaps on the recomputed graph with an evaluator of its own); recomputes alone go incrementally
        (:meth:`_apply_recomputes`)."""
        from tflms.sim.simulator import simulate
        graph = self.rewritten_graph(plan)
        order = order_with_plan(self.order, plan) if self.order is not None else None
        return simulate(graph, self.profile, options=self.options, order=order)

    def _simulate(self, plan: SwapPlan | None) -> SimResult:
        base = self._net
        n_base = len(base.names)
        net = base.copy()
        alive = list(self._alive)
        modified: list[int] = []
        costs = self._costs
        if plan is not None and plan.recomputes:
            costs, rewired = self._apply_recomputes(net, plan)
            # a rewired reader can leave an original unread: which ops run is derived again, from the base's
            alive = (still_needed(net, base.preds, self._alive, self._readers_of, self._roots, rewired) if self._prunes
                     else [True] * len(net.names))
            _add_recvs(net, _recv_needs(net, range(len(net.names)), alive), alive)
            order = self._level_sorted(net, alive, n_base)
            position = positions(order, len(net.names))
            return _run(net, order, position, self._outputs, self.profile, self.options, costs, alive)
        if plan is not None and plan.swaps:
            modified = self._apply(net, alive, plan)
        revived: list[int] = []
        if self._prunes:
            stack = [p for c in modified if alive[c] for p in net.preds[c] if not alive[p]]
            preds = net.preds
            while stack:
                i = stack.pop()
                if alive[i]:
                    continue
                alive[i] = True
                if i < n_base:
                    revived.append(i)
                stack.extend(p for p in preds[i] if not alive[p])
        else:
            alive = [True] * len(net.names)
        needs = self._recv_needs
        if len(net.names) > n_base or revived:
            needs = dict(needs)
            affected = set(modified) | set(revived) | set(range(n_base, len(net.names)))
            for op in affected:
                for t, index in self._recv_entries.get(op, ()):
                    rest = [e for e in needs[t] if e != (op, index)]
                    if rest:
                        needs[t] = rest
                    else:
                        del needs[t]
            for t, entries in _recv_needs(net, sorted(affected), alive).items():
                needs[t] = needs.get(t, []) + entries
        recvs = _add_recvs(net, needs, alive)
        if self.order is not None:
            names = order_with_plan(self.order, plan) if plan is not None else self.order
            order = _order_ids(net, names, alive, recvs, needs)
            position = _check_order(net, order, alive)
        else:
            order = self._level_sorted(net, alive, n_base)
            position = positions(order, len(net.names))
        return _run(net, order, position, self._outputs, self.profile, self.options, self._costs, alive)

    def _level_sorted(self, net: IndexedGraph, alive: list[bool], n_base: int) -> list[int]:
        """:func:`~tflms.sim.simulator._level_sorted`, walking the base's topological order with each added op
        right after its latest predecessor; falls back to a full topological sort if a plan's edge runs backwards
        in that order (a trigger after a consumer)."""
        n = len(net.names)
        preds = net.preds
        rank = self._rank
        after: dict[int, list[int]] = {}
        anchor: dict[int, int] = {}
        for j in range(n_base, n):
            if not alive[j]:
                continue
            best = None
            for p in preds[j]:
                q = p if p < n_base else anchor.get(p)
                if q is None:
                    return _level_sorted(net, alive)
                if best is None or rank[q] > rank[best]:
                    best = q
            if best is None:
                return _level_sorted(net, alive)
            anchor[j] = best
            after.setdefault(best, []).append(j)
        walk = self._topo
        if after:  # (an added op is alive, and so is the op it follows)
            walk = []
            for b in self._topo:
                walk.append(b)
                if b in after:
                    walk.extend(after[b])
        level = [-1] * n
        for i in walk:
            if not alive[i]:
                continue
            top = -1
            for p in preds[i]:
                lp = level[p]
                if lp < 0:  # an input later in this order: sort properly
                    return _level_sorted(net, alive)
                if lp > top:
                    top = lp
            level[i] = top + 1
        return sorted(compress(range(n), alive), key=level.__getitem__)  # stable: ties keep graph order

    def _rewire(self, net: IndexedGraph, t: int, new_t: int, members: set[int], modified: list[int]) -> None:
        """Point the inputs of ``members`` that read tensor ``t`` (among its consumers in the base graph) at
        ``new_t``, as ``Graph.set_input`` does for each; the consumers rewired are added to ``modified``."""
        inputs = net.inputs
        for consumer, index in self._consumers.get(t, ()):
            if consumer in members and inputs[consumer][index] == t:
                ins = list(inputs[consumer])
                ins[index] = new_t
                inputs[consumer] = ins
                modified.append(consumer)

    def _apply_recomputes(self, net: IndexedGraph, plan: SwapPlan) -> tuple[OpCosts, list[int]]:
        """Append ``plan``'s gates and clones to ``net`` as :func:`~tflms.passes.recompute.insert_recomputes` inserts
        them (same names, devices, edges, graph order) and rewire their readers; returns the op costs of the result (a
        clone costs what its original does: the same type, attributes and tensors; it carries the original as its
        source op) and the base ops rewired."""
        op_id = self._op_id
        costs = OpCosts(self.graph, self.profile)
        n_base = len(self._net.names)
        times = costs._times = dict(self._costs._times)
        if times and max(times) >= n_base:  # (an id past the base's is another op in each plan)
            times = costs._times = {i: t for i, t in times.items() if i < n_base}
        costs._launches = self._costs.launches_memo()  # (checked by op: shared safely)
        costs._graph_clock = self._costs.graph_clock_memo()  # (the same)
        new_ids: dict[str, int] = {}

        def tensor(ref: TensorRef) -> int:
            i = op_id.get(ref.op, new_ids.get(ref.op))
            if i is None:
                raise GraphError(f"a recompute reads {ref}, which names no op in the graph")
            return net.out_start[i] + ref.index

        modified: list[int] = []
        for decision in plan.recomputes:
            steps, rewires = self._recipe(decision)
            for name, trigger, what, clone in steps:
                if clone is None:  # a gate
                    if name not in new_ids:
                        t = tensor(what)
                        new_ids[name] = net.add_op(name, "Identity", net.dev[net.t_op[t]], [t], [op_id[trigger]],
                                                   [net.t_info[t]])
                    continue
                if name in op_id or name in new_ids:
                    raise GraphError(f"an op named {name!r} already exists: is {what!r} recomputed twice?")
                o, op, refs, price = clone if clone else (op_id[what], None, None, None)  # (a KeyError, as before)
                c = new_ids[name] = net.add_op(name, net.types[o], net.dev[o], [tensor(r) for r in refs], [],
                                               op.outputs)
                net.src_ops[c] = op
                times[c] = price
            for ref, clone_ref, members in rewires:
                self._rewire(net, tensor(ref), tensor(clone_ref), members, modified)
        modified = list(dict.fromkeys(modified))
        for c in modified:
            net.refresh_preds(c)
        return costs, modified

    def _recipe(self, decision: RecomputeDecision) -> tuple[list[tuple], list[tuple]]:
        """What :meth:`_apply_recomputes` inserts for ``decision``, by name, worked out once per evaluator (the plans
        of a tune share most decisions: :func:`~tflms.policies.recompute.plan_recomputes` memoizes them):
        ``(steps, rewires)``. A step is ``(name, trigger, what, clone)``: a gate of tensor ``what`` (``clone``
        ``None``), or a clone of op ``what``, ``clone`` its original's ``(id, op, the clone's inputs, price)`` (``()``
        where no op has that name: applying it raises). A rewire is ``(tensor, clone's tensor, reader ids)``."""
        hit = self._recipes.get(id(decision))
        if hit is not None and hit[0] is decision:
            return hit[1]
        op_id, graph = self._op_id, self.graph
        chain = frozenset(decision.ops)
        steps = []
        for kind, name, trigger, what in decision.insertions():
            if kind == GATE:
                steps.append((name, trigger, what, None))
            elif what not in op_id:
                steps.append((name, trigger, what, ()))
            else:
                o = op_id[what]
                op = graph.op(what)
                steps.append((name, trigger, what, (o, op, clone_inputs(op, chain, trigger, decision.copy)[0],
                                                    self._costs.time_s(o, op))))
        rewires = [(ref, TensorRef(clone_name(ref.op, decision.copy), ref.index),
                    {op_id[r] for r in readers if r in op_id}) for ref, readers in zip(decision.tensors, decision.readers)]
        if len(self._recipes) >= MEMO_SIZE * 16:
            self._recipes.clear()
        self._recipes[id(decision)] = (decision, (steps, rewires))
        return steps, rewires

    def _apply(self, net: IndexedGraph, alive: list[bool], plan: SwapPlan) -> list[int]:
        """Append ``plan``'s swap ops to ``net`` as ``apply_swaps`` inserts them; returns the ops whose edges changed."""
        if self._lms_op is not None:
            raise GraphError(f"the graph already holds tflms swap ops (e.g. {self._lms_op!r}); rewrite the "
                             "original graph, not a rewritten one")
        host = self.options.host_device
        swapin_device = plan.config.host_device if self.swapin_on == SWAPIN_ON_HOST else plan.accelerator_device
        out_dev = _device_class(plan.config.host_device, host)
        in_dev = _device_class(swapin_device, host)
        op_id = self._op_id
        new_ids: dict[str, int] = {}

        def lookup(name: str, what: str) -> int:
            i = op_id.get(name, new_ids.get(name))
            if i is None:
                raise GraphError(f"{what} {name!r} names no op in the graph")
            return i

        def claim(name: str) -> None:
            if name in op_id or name in new_ids:
                raise GraphError(f"an op named {name!r} already exists")

        modified: list[int] = []
        ctrl = net.ctrl
        for swap in plan.swaps:
            producer = lookup(swap.tensor.op, "swapped tensor's op")
            if not 0 <= swap.tensor.index < net.n_out[producer]:
                raise GraphError(f"op {swap.tensor.op!r} ({net.types[producer]}) has no output {swap.tensor.index}")
            t = net.out_start[producer] + swap.tensor.index
            info = net.t_info[t]
            claim(swap.swap_out)
            out_op = net.add_op(swap.swap_out, self.copy_op, out_dev, [t], [], [info])
            new_ids[swap.swap_out] = out_op
            alive.append(False)
            for consumer in swap.sync_out_consumers:
                c = lookup(consumer, "sync-out consumer")
                if out_op not in ctrl[c]:
                    ctrl[c] = ctrl[c] + [out_op]
                    modified.append(c)
            out_t = net.out_start[out_op]
            for group in swap.swap_ins:
                claim(group.name)
                trigger = [lookup(group.trigger, f"control input of {group.name!r}:")] if group.trigger else []
                in_op = net.add_op(group.name, self.copy_op, in_dev, [out_t], trigger, [info])
                new_ids[group.name] = in_op
                alive.append(False)
                self._rewire(net, t, net.out_start[in_op], {op_id[c] for c in group.consumers if c in op_id},
                             modified)
        modified = list(dict.fromkeys(modified))
        for c in modified:
            net.refresh_preds(c)
        return modified
