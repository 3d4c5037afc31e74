"""The tuner's searches: the TFLMS distance ladder, greedy idle-time rounds, the enforced-order finalists.

Each search judges candidates through one :class:`TuneEvaluator` (simulated by
:class:`~tflms.tune.evaluator.PlanEvaluator`, memoized by plan) and records them;
:func:`tflms.tune.tuner.tune` runs the searches and picks the winner.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph
from tflms.config import LMSConfig
from tflms.passes.result import PassResult
from tflms.passes.swaps import apply_swaps
from tflms.policies.base import IdleTime, PlanContext, SwapPolicy, TflmsRules
from tflms.policies.idle_time import NO_OVERHEAD, majority_order, scored_candidates
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import HardwareProfile
from tflms.sim.bounds import AnyOrderTimeBound, any_order_time_bound
from tflms.sim.simulator import SimOptions, SimResult, gc_paused, simulate
from tflms.tune.evaluator import PlanEvaluator
from tflms.tune.result import Candidate
from tflms.ir.graph import Graph
from tflms.units import format_bytes

logger = logging.getLogger(__name__)

#: Rounds of re-simulation the idle-time strategy may take (the peak moves after each).
IDLE_MAX_ROUNDS = 12
#: How "fits" is judged: the live-bytes peak, or what TensorFlow's BFC allocator (modelled) would reserve.
FIT_BY_LIVE, FIT_BY_BFC = "live", "bfc"
#: swapin_groupby the distance search falls back to when one swap-in per level fits nothing.
GROUPBY_RESORT_LEVELS = 4
#: Simulations one idle-time search may run in all (rounds plus no-overhead retries).
IDLE_MAX_EVALUATIONS = 16
#: Extra bytes the idle-time strategy asks for per round beyond the overshoot, as a fraction.
IDLE_OVERSHOOT_SLACK = 0.05
#: Largest relative slowdown the no-overhead mode accepts (simulation round-off, not a real cost).
NO_OVERHEAD_TOLERANCE = 0.001
#: The threshold ladder stops after this many fitting thresholds in a row that are no faster than the best.
LADDER_PATIENCE = 2
#: The swapin_ahead scan stops after this many values in a row that fit exactly as fast as the chosen value
#: (ResNet-50's ahead 16..256 all simulate to one step time). Not the groupby scan: its plateaus end in gains
#: (a CNN's groupby 4 and 8 tie, 16 is faster).
AHEAD_PATIENCE = 2
#: The no-overhead search stops after this many rounds in a row whose new tensors all slowed the step down
#: (each costs a simulation; on ResNet-50 at batch 208, eleven rounds in a row did).
NO_OVERHEAD_PATIENCE = 4
#: Simulations whose scored idle-time candidates the tuner keeps (the searches revisit the last one or two).
SCORED_MEMO_SIZE = 4
#: Simulations recorded last whose views (``ops``, ``timeline``, ...) the tuner keeps built
#: (:meth:`TuneEvaluator.record`).
VIEWS_KEPT = 4


class TuneEvaluator:
    """One tune's judge: every search plans, simulates and records its candidates through it.

    It holds what every candidate is judged against (the analysis, the profile, the budgets, the base config,
    the accelerator and copy op), a :class:`~tflms.tune.evaluator.PlanEvaluator` that simulates swap plans of
    the base graph incrementally (plans with recomputes on their rewritten graph), the candidates recorded so
    far, and the rewritten graphs built for them. :meth:`evaluate` plans a policy and records it;
    :meth:`record` records a plan made elsewhere (the recompute search, pruning, the order pass)."""

    def __init__(self, analysis: Analysis, profile: HardwareProfile, budget: int, host_budget: int,
                 sim_options: SimOptions, base_config: LMSConfig, accelerator: str, copy_op: str,
                 progress: Callable[[str], None] | None):
        self.analysis, self.profile, self.budget, self.host_budget = analysis, profile, budget, host_budget
        self.sim_options, self.base_config, self.accelerator, self.copy_op = (sim_options, base_config,
                                                                             accelerator, copy_op)
        self.progress = progress
        self.fit_by = FIT_BY_LIVE
        self.compress: Callable[[Graph, SwapPlan], Graph] | None = None
        self.candidates: list[Candidate] = []
        self.graphs: dict[int, Graph] = {}  # rewritten graphs by id(candidate), built by graph_of
        # Candidates are simulated incrementally (no IR copy per plan, memoized by plan).
        self.plans = PlanEvaluator(analysis.graph, profile, sim_options, copy_op=copy_op)
        #: what the policies are given besides the analysis and the config (``baseline`` set once simulated)
        self.context = PlanContext(accelerator, profile)
        self._scored: dict[int, tuple[SimResult, list]] = {}  # id(sim) -> (sim, its scored idle candidates)
        self._recent: collections.deque[SimResult] = collections.deque()  # the last sims recorded, views kept
        self._ordered_base: PassResult | None = None
        self._swap_floor: AnyOrderTimeBound | None = None
        self._swap_floor_whole = False

    def ordered_base(self) -> PassResult:
        """The unswapped step through the order pass (:func:`~tflms.passes.order.enforce_order`), once: the
        order-first search orders it before its swaps, and :func:`judge_ordered` judges it as a finalist (on
        ResNet-50 at batch 32, half a second each)."""
        if self._ordered_base is None:
            from tflms.passes.order import enforce_order
            self._ordered_base = enforce_order(self.analysis.graph, self.profile, options=self.sim_options,
                                               level_peak_bytes=self.context.baseline.peak_bytes)
        return self._ordered_base

    def swap_floor_above(self, limit: float) -> bool:
        """Whether no swap-only plan of the step that fits the budget takes less than ``limit`` seconds, in any order
        (:func:`~tflms.sim.bounds.any_order_time_bound` of the unswapped step, its scan stopped at the first op whose
        floor exceeds ``limit``; kept, :attr:`swap_floor`). ``False`` where fit is judged by the BFC model, whose
        need the bound does not know. A plan fits when its peak with the margin is within the budget, so its live
        bytes are within the budget less ``margin_bytes``. On ResNet-50 at batch 32 (8,489 ops) 0.07 s where the
        first op answers, 0.19 s for the whole scan."""
        if self.fit_by != FIT_BY_LIVE:
            return False
        floor = self._swap_floor
        if floor is None or (floor.floor_s <= limit and not self._swap_floor_whole):
            floor = self._swap_floor = self.floor_of(self.analysis.graph, self.context.baseline, limit)
            self._swap_floor_whole = floor.floor_s <= limit  # (the scan ran to its end: the largest floor)
        return floor.floor_s > limit

    def floor_above(self, graph: Graph, sim: SimResult, limit: float) -> bool:
        """Whether no swap-only rewrite of ``graph`` (a recomputed step, simulated as ``sim``) that fits takes less
        than ``limit`` seconds, in any order (:meth:`floor_of`; ``False`` for an infinite limit, or where fit is judged
        by the BFC model)."""
        return (self.fit_by == FIT_BY_LIVE and limit < float("inf")
                and self.floor_of(graph, sim, limit).floor_s > limit)

    def floor_of(self, graph: Graph, sim: SimResult, above: float | None = None) -> AnyOrderTimeBound:
        """:func:`~tflms.sim.bounds.any_order_time_bound` of ``graph`` (simulated as ``sim``) at this tune's budget:
        no swap-only rewrite of it that fits is faster, in any order (``above``: the scan stops at the first op whose
        floor exceeds it)."""
        return any_order_time_bound(graph, self.profile, max(1, self.budget - self.sim_options.margin_bytes),
                                    options=self.sim_options, sim=sim, above=above)

    @property
    def swap_floor(self) -> AnyOrderTimeBound | None:
        """The swap floor :meth:`swap_floor_above` computed (``None`` before): no swap-only plan that fits is faster."""
        return self._swap_floor

    def fastest_fit_s(self) -> float:
        """The simulated step time of the fastest candidate recorded so far that fits (infinite when none)."""
        return min((c.sim.step_time_s for c in self.candidates if c.fits), default=float("inf"))

    def cannot_beat(self, cand: Candidate, limit: float) -> bool:
        """Whether ``cand`` cannot fit faster than ``limit`` seconds in any order: a plan without recomputes (the
        unswapped step among them) where the tune computed the swap floor (:attr:`swap_floor`) and it is slower."""
        floor = self._swap_floor
        return (floor is not None and floor.floor_s > limit
                and (cand.plan is None or not cand.plan.recomputes))

    def graph_of(self, cand: Candidate) -> Graph:
        """The rewritten graph of ``cand`` (built once, on demand: only the winner's is needed)."""
        if id(cand) not in self.graphs:
            with gc_paused():
                self.graphs[id(cand)] = apply_swaps(self.analysis.graph, cand.plan, copy_op=self.copy_op).graph
        return self.graphs[id(cand)]

    def evaluate(self, policy: SwapPolicy, params: dict[str, Any], *, max_overhead: float | None = None,
                 baseline: SimResult | None = None) -> Candidate:
        """The one entry every search judges a policy through: plan it on the base config, simulate, record.

        ``params`` is what the candidate reports (tables, ``to_dict``); ``max_overhead`` (with ``baseline``)
        refuses a plan that slows the step down more than that.
        """
        plan = policy.plan(self.analysis, self.base_config, self.context)
        return self.run(policy.name, params, plan, max_overhead=max_overhead, baseline=baseline, policy=policy)

    def run(self, strategy: str, params: dict[str, Any], plan: SwapPlan, *, max_overhead: float | None = None,
            baseline: SimResult | None = None, policy: SwapPolicy | None = None) -> Candidate:
        """Simulate and record an already made ``plan`` (:meth:`evaluate` plans a policy and calls this)."""
        graph = None
        if self.compress is not None:
            graph = self.compress(apply_swaps(self.analysis.graph, plan, copy_op=self.copy_op).graph, plan)
            sim = simulate(graph, self.profile, options=self.sim_options)
        else:
            sim = self.plans.evaluate(plan)
        return self.record(strategy, params, plan, sim, graph, policy, max_overhead=max_overhead, baseline=baseline)

    def record(self, strategy: str, params: dict[str, Any], plan: SwapPlan | None, sim: SimResult,
               graph: Graph | None, policy: SwapPolicy | None, *, max_overhead: float | None = None,
               baseline: SimResult | None = None, order: dict | None = None, what: str = "") -> Candidate:
        """Judge ``sim`` by the fit rule (budget, host budget, no-overhead limit), record and report it.

        ``order``: the order pass's report of a candidate judged in the enforced order; ``what``: how the
        progress line and a miss name the judgement (e.g. "in the enforced order (12 edges)")."""
        why = ""
        need = self.need(sim)
        if need > self.budget:
            why = f"{'BFC-model need' if self.fit_by == FIT_BY_BFC else 'peak'} {format_bytes(need)} > budget"
        elif sim.host_peak_bytes > self.host_budget:
            why = f"host peak {format_bytes(sim.host_peak_bytes)} > host budget {format_bytes(self.host_budget)}"
        elif max_overhead is not None and baseline is not None and sim.overhead_vs(baseline) > max_overhead:
            why = f"overhead {100 * sim.overhead_vs(baseline):.2f}% in no-overhead mode"
        if why and order is not None:
            why += " with the enforced order"
        cand = Candidate(strategy, params, plan, sim, fits=not why, why_not=why, order=order, policy=policy)
        if graph is not None:
            self.graphs[id(cand)] = graph
        self.candidates.append(cand)
        self._keep_views(sim)
        if self.progress:
            self.progress(f"{strategy} {params}{' ' + what if what else ''}: peak "
                          f"{format_bytes(sim.peak_with_margin_bytes)}, step {sim.step_time_s * 1e3:.2f} ms"
                          f"{'' if cand.fits else ' (' + why + ')'}")
        return cand

    def _keep_views(self, sim: SimResult) -> None:
        """Keep the built views (:class:`~tflms.sim.records.SimDetails`) of the last :data:`VIEWS_KEPT` simulations
        recorded, and release the older ones': the searches read the views of the simulation they just made, and
        a view read again later (the winner's, when pruning) is built again."""
        if any(s is sim for s in self._recent):  # (by identity: equality would compare the views)
            return
        self._recent.append(sim)
        if len(self._recent) > VIEWS_KEPT:
            self._recent.popleft().release_views()

    def scored(self, sim: SimResult) -> list:
        """:func:`~tflms.policies.idle_time.scored_candidates` of ``sim``, kept for the last few simulations
        (the idle-time searches ask again about one simulation with more tensors excluded)."""
        hit = self._scored.get(id(sim))
        if hit is None or hit[0] is not sim:
            if len(self._scored) >= SCORED_MEMO_SIZE:
                del self._scored[next(iter(self._scored))]
            hit = self._scored[id(sim)] = (sim, scored_candidates(self.analysis, sim, self.profile, self.base_config,
                                                                     self.accelerator))
        return hit[1]

    def need(self, sim: SimResult) -> int:
        """Device bytes a simulated step needs: live-bytes peak, or what the BFC allocator model reserves."""
        if self.fit_by == FIT_BY_BFC:
            from tflms.memplan.report import plan_step
            margin = sim.peak_with_margin_bytes - sim.peak_bytes
            return plan_step(sim).bfc_total_bytes + margin
        return sim.peak_with_margin_bytes

    def distance(self, **params: Any) -> Candidate:
        """The TFLMS rules with ``params`` laid over the base config."""
        return self.evaluate(TflmsRules(**params), params)


#: How many candidates that do not fit in level order :func:`judge_ordered` judges again in the enforced order.
ORDER_FINALISTS = 4
#: ... after judging the lowest-peak candidate of at most this many families (strategy, sync mode) first.
ORDER_FAMILIES = 6
#: ... and walks the :data:`ORDER_FINALISTS` next of this many families closest to fitting once ordered; when
#: nothing fits then, the lowest-need plan of each of these families gets the peak swaps
#: (:mod:`tflms.tune.peakswap`). ResNet-50 at batch 1347 on v100-16gb-pcie3 fits through the closest
#: family (asynchronous, threshold 8: 37.97 s before pruning) and through the next (sync mode 1,
#: threshold 492: 29.77 s); the fastest fit wins.
ORDER_WALKS = 2
#: ... among those needing at most this fraction more than the budget in level order (a heuristic: scheduling
#: one finalist costs about half a second on ResNet-50, and at most ``ORDER_FINALISTS + 1`` are scheduled
#: whatever this is. The order can lower the peak a lot: with the ``greedy-dfs`` schedule a distance plan
#: needing 32.2 GiB in level order at batch 1300 on v100-16gb-pcie3 (2.1x the card with 5% headroom) fits
#: in 15.20 GiB once ordered; 1.0 stopped the benchmark at batch 1229, where level order first needs 2x).
ORDER_MAX_OVERSHOOT = 2.0
#: :func:`judge_ordered` also judges the *ungrouped twin* (``swapin_groupby=0``: one swap-in per consumer
#: level) of this many of the lowest-peak distance finalists that group their swap-ins. A grouped swap-in
#: keeps the tensor on the device from its group's first consumer to its last, whatever the order; one
#: per consumer lets the schedule run them apart. The distance ladder never pairs ``groupby=0`` with
#: ``sync_mode>0``, and in level order the twin peaks higher (its copies overlap), so it would not be a
#: finalist: VGG-16 at batch 362 on v100-16gb-pcie3, threshold 75, sync mode 1: grouped by 4 it needs
#: 16.02 GiB in level order and in every schedule (the block1 input, its gradient and the next gradient
#: together); ungrouped 20.57 GiB in level order, 13.75 GiB in the greedy schedule (5% headroom included).
ORDER_UNGROUPED_TWINS = 2


def judge_ordered(ev: TuneEvaluator, first_fit: bool = False) -> list[Candidate]:
    """Judge the finalists in the order the pipeline will enforce; returns the candidates added.

    Scheduling costs seconds on a large step (docs/design.md, "Enforced order"), so only finalists
    are scheduled, each distinct plan (swaps, swap-ins, triggers and waits) once: the fastest fitting
    candidate (the order pass may change its step time and peak), the ungrouped twins of the first
    :data:`ORDER_UNGROUPED_TWINS` lowest-peak candidates that group swap-ins, then among the candidates
    that do not fit in level order (by at most :data:`ORDER_MAX_OVERSHOOT`) and would be faster than
    it, the lowest-peak one of each family (strategy and sync mode; at most :data:`ORDER_FAMILIES`),
    the next :data:`ORDER_FINALISTS` of each of the :data:`ORDER_WALKS` families that came closest to fitting,
    then the :data:`ORDER_FINALISTS` lowest level-order peaks whatever their family (not with ``first_fit``
    once one fits; they add plans, but the peak swaps start from the families walked). Each gets the
    rewritten graph through :func:`~tflms.passes.order.enforce_order` (the same pass, deterministic, as the
    pipeline runs) and the pass's simulation of the result; the new candidate keeps the strategy and
    parameters, with ``order`` set. Its rewritten graph is stored without the edges: the pipeline's pass
    adds them.
    """
    from tflms.passes.order import enforce_order
    fitting = [c for c in ev.candidates if c.fits and c.order is None and c.plan is not None]
    best = min(fitting, key=lambda c: c.sim.step_time_s) if fitting else None
    limit = best.sim.step_time_s if best is not None else float("inf")
    # (a swap plan the floor says cannot beat the fastest fit is not scheduled: half a second each on ResNet-50)
    over = sorted((c for c in ev.candidates if not c.fits and c.order is None and c.sim.step_time_s < limit
                   and not ev.cannot_beat(c, limit) and c.sim.host_peak_bytes <= ev.host_budget
                   and ev.need(c.sim) <= ev.budget * (1 + ORDER_MAX_OVERSHOOT)),
                  key=lambda c: (ev.need(c.sim), c.sim.step_time_s))
    twins = []
    for c in over:
        if len(twins) >= ORDER_UNGROUPED_TWINS:
            break
        if c.strategy == "tflms-distance" and c.params.get("swapin_groupby"):
            twin = ev.distance(**{**c.params, "swapin_groupby": 0})
            if (not twin.fits and twin.sim.step_time_s < limit and twin.sim.host_peak_bytes <= ev.host_budget
                    and ev.need(twin.sim) <= ev.budget * (1 + ORDER_MAX_OVERSHOOT)):
                twins.append(twin)
    seen: set = set()

    def judge(cands: list[Candidate], limit: int) -> list[Candidate]:
        """Judge up to ``limit`` distinct plans of ``cands`` in the enforced order."""
        judged = []
        for c in cands:
            if len(judged) >= limit:
                break
            # the whole decisions: sync edges and triggers differ between sync modes and look-aheads (a plan that
            # changes nothing, a distance threshold past every distance, is the unswapped step)
            key = None if c.plan is None or not (c.plan.swaps or c.plan.recomputes) else (c.plan.swaps,
                                                                                           c.plan.recomputes)
            if key in seen:
                continue
            seen.add(key)
            graph = ev.graph_of(c)
            # c.sim is the simulation of ``graph`` in level order (the incremental evaluator's answer is simulate's)
            result = ev.ordered_base() if key is None else enforce_order(graph, ev.profile, options=ev.sim_options,
                                                                         level_peak_bytes=c.sim.peak_bytes)
            sim = result.report.ordered_sim if result.changed else c.sim
            judged.append(record_ordered(ev, c.strategy, c.params, c.plan, sim, result.report, graph, c.policy,
                                         f"in the enforced order ({result.report.num_edges} edges)"))
        return judged

    # The level-order peak does not see what the order removes: at ResNet-50's largest batches every
    # distance plan needs the same 32.8 GiB in level order (the interleaved backward chains), and the tie
    # goes to the fastest, asynchronous ones. So the first round judges the best of each family
    # (strategy and sync mode), the second walks down the family that came closest once ordered.
    families: dict = {}
    for c in over:
        families.setdefault((c.strategy, c.params.get("sync_mode")), []).append(c)
    # (the fastest fit is judged in the order unless its step lasts its compute time: ordered, it can then be no
    # faster, and of two as fast the tuner keeps the first; on ResNet-50 at batch 32 a third of the tune)
    first = [best] if best is not None and not best.sim.compute_bound else []
    added = judge(first + twins, len(first) + len(twins))
    firsts = judge([group[0] for group in families.values()], ORDER_FAMILIES)
    added += firsts
    if firsts and not any(c.fits for c in firsts):
        for closest in _closest_families(ev, firsts)[:ORDER_WALKS]:
            added += judge(families[_family(closest)][1:], ORDER_FINALISTS)
    # The lowest level-order peaks whatever their family, last, so that they only add plans: BERT-base at
    # batch 450 on v100-16gb-nvlink2 fits through the second-lowest (threshold 4, ahead 1, groupby 0,
    # asynchronous) and through no family's first or walk. They do not choose where the peak swaps start:
    # on ResNet-50 at batch 1347 on nvlink2 that moved them to another family, which fitted only 1303.
    walked = list(added)
    if not (first_fit and any(c.fits for c in added)):
        added += judge(over[:ORDER_FINALISTS], ORDER_FINALISTS)
    if added and not any(c.fits for c in ev.candidates):
        # the enforced order can leave a tensor waiting across its peak that no policy swapped; the
        # lowest-need plan of each of the closest families gets the peak swaps (the closest one is not
        # always the fastest once it fits), until one fits with ``first_fit``
        from tflms.tune.peakswap import swap_across_peak
        for c in _closest_families(ev, walked)[:ORDER_WALKS]:
            added += swap_across_peak(ev, c)
            if first_fit and any(a.fits for a in added):
                break
    return added


def _family(c: Candidate) -> tuple:
    return c.strategy, c.params.get("sync_mode")


def _closest_families(ev: TuneEvaluator, judged: list[Candidate]) -> list[Candidate]:
    """The lowest-need candidate of each family among ``judged``, closest to fitting first; a family whose
    best judged exactly as another's (a sync mode that adds no wait to these swaps) is left out."""
    best: dict = {}
    for c in sorted(judged, key=lambda c: (ev.need(c.sim), c.sim.step_time_s)):
        best.setdefault(_family(c), c)
    distinct, outcomes = [], set()
    for c in best.values():
        outcome = (ev.need(c.sim), c.sim.step_time_s)
        if outcome not in outcomes:
            outcomes.add(outcome)
            distinct.append(c)
    return distinct


def record_ordered(ev: TuneEvaluator, strategy: str, params: dict, plan, sim: SimResult, report, graph: Graph, policy,
                   what: str) -> Candidate:
    """A candidate judged in the enforced order (``report`` the order pass's): fit, recorded, reported."""
    return ev.record(strategy, params, plan, sim, graph, policy, order=report.to_dict(), what=what)


def _threshold_ladder(analysis: Analysis) -> list[int]:
    """Thresholds worth trying, largest first: the distinct far distances, thinned geometrically."""
    levels = analysis.levels
    max_distance = 1
    for name in analysis.order:
        for c in analysis.graph.successors(name):
            max_distance = max(max_distance, levels[c] - levels[name])
    ladder, t = [], max_distance - 1
    while t >= 1:
        ladder.append(t)
        t = t * 2 // 3 if t > 3 else t - 1
    return ladder or [1]


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= max(1, limit):
        out.append(v)
        v *= 2
    return out


def search_distance(ev: TuneEvaluator, first_fit: bool = False) -> None:
    """TFLMS's search, choosing by simulated time among fitting candidates.

    With ``first_fit`` it stops at the first fitting configuration (a yes/no
    answer for the max-batch search).
    """
    ladder = _threshold_ladder(ev.analysis)
    fitting: list[Candidate] = []
    no_better = 0  # fitting thresholds in a row no faster than the best (smaller ones only swap more)
    # One swap-in per consumer level can leave several copies of a tensor on the device
    # (consumers on adjacent levels); grouping them is the next resort before synchronous copies.
    for sync_mode, groupby in [(0, 0), (0, GROUPBY_RESORT_LEVELS), (1, GROUPBY_RESORT_LEVELS),
                               (2, GROUPBY_RESORT_LEVELS), (3, GROUPBY_RESORT_LEVELS)]:
        for threshold in ladder:
            cand = ev.distance(swapout_threshold=threshold, swapin_ahead=1, swapin_groupby=groupby,
                               sync_mode=sync_mode)
            if cand.fits:
                no_better = no_better + 1 if fitting and cand.sim.step_time_s >= min(
                    c.sim.step_time_s for c in fitting) else 0
                fitting.append(cand)
                if first_fit:
                    return
                if no_better >= LADDER_PATIENCE:
                    break
            elif fitting:
                break  # smaller thresholds only swap more: stop once fits have been found and lost
        if fitting:
            break
    if not fitting:
        return
    best = min(fitting, key=lambda c: (c.sim.step_time_s, -c.params["swapout_threshold"]))
    params = dict(best.params)
    for name in ("swapin_ahead", "swapin_groupby"):
        limit = max(1, ev.analysis.num_levels // 4)
        chosen = cand = best
        flat = 0  # fitting values in a row exactly as fast as the chosen one
        for value in _powers(limit)[1:] if name == "swapin_ahead" else [0] + _powers(limit):
            if name == "swapin_groupby" and value == params[name]:
                continue
            if name == "swapin_ahead" and value // 2 >= _useful_ahead(best.plan):
                # Every trigger is already at its earliest level: larger values plan the same swaps. The last
                # value would be chosen exactly when this one was (the same plan: memoized, not simulated).
                if chosen is cand:
                    chosen = ev.distance(**{**params, name: _powers(limit)[-1]})
                break
            cand = ev.distance(**{**params, name: value})
            if cand.fits and cand.sim.step_time_s <= chosen.sim.step_time_s:
                flat = flat + 1 if cand.sim.step_time_s == chosen.sim.step_time_s else 0
                chosen = cand
                if name == "swapin_ahead" and flat >= AHEAD_PATIENCE:
                    break  # a plateau: larger values have moved triggers without changing the step time
            elif not cand.fits:
                break
        params = dict(chosen.params)
        best = chosen


def _copies_can_hide(ev: TuneEvaluator, baseline: SimResult) -> bool:
    """Whether a swap plan might fit without slowing the step: a cheap necessary condition.

    To fit, the live bytes at the baseline's peak must drop by the overshoot ``D`` (live bytes; the
    margin scales with them), so at least ``D`` bytes must be copied out before that instant, one copy
    stream from the step's start. Without overhead the step keeps its timing (to
    :data:`NO_OVERHEAD_TOLERANCE` of its length), so ``copy_time(D)`` must fit before the peak. On
    ResNet-50 at batch 600 (peak 47.9 GiB for a 16 GiB card) it does not: sixteen no-overhead trials were
    simulated for nothing.
    """
    overshoot = ev.need(baseline) - ev.budget
    live_overshoot = (baseline.peak_with_margin_bytes - ev.budget) / (1 + ev.sim_options.margin_fraction)
    if overshoot <= 0 or live_overshoot <= 0:
        return True
    before_peak = baseline.peak_time_s + NO_OVERHEAD_TOLERANCE * baseline.step_time_s
    return ev.profile.copy_time_s(int(live_overshoot)) <= before_peak


def search_order_first(ev: TuneEvaluator, baseline: SimResult,
                       search: Callable[[Analysis], list[Candidate]]) -> list[Candidate]:
    """The no-overhead idle-time search on the step with its memory-aware order pinned *before* the swaps.

    The order pass normally runs after the swaps (:func:`judge_ordered`), so the idle-time search picks its
    tensors in level order, where the peak and the idle windows fall elsewhere. Here the order pass runs
    on the unswapped step first (when its edges lower the peak) and ``search`` (the same search, on the
    analysis of that graph) picks the swaps in the order that will run: at zero predicted overhead
    ResNet-50, VGG-16 and a Transformer encoder (batch 64 / 32 / 16, v100-16gb-pcie3) save 28.1% / 30.0% /
    33.7% of the peak (``tools/plan_report.py --ordered``; 26.8% / 26.5% / 25.4% before this search).
    Each candidate is recorded with ``order_first`` (the order's edges) in its parameters, its order record
    marked ``before_swaps`` (the pipeline adds no edges after them), and its rewritten graph, edges and swaps.
    """
    ordered = ev.ordered_base()
    if not ordered.changed:
        return []
    order = {**ordered.report.to_dict(), "before_swaps": True}
    added = []
    for c in search(analyze_graph(ordered.graph)):
        if c.plan is None or not c.plan.swaps:
            continue
        graph = apply_swaps(ordered.graph, c.plan, copy_op=ev.copy_op).graph
        added.append(ev.record(c.strategy, {**c.params, "order_first": ordered.report.num_edges}, c.plan, c.sim,
                               graph, c.policy, max_overhead=NO_OVERHEAD_TOLERANCE, baseline=baseline, order=order,
                               what=f"with the order pinned before the swaps ({ordered.report.num_edges} edges)"))
    return added


def _useful_ahead(plan: SwapPlan) -> int:
    """The largest ``swapin_ahead`` that can still move a trigger of ``plan`` (``find_trigger`` clamps
    the target level to one above the producer's; synchronous swap-ins ignore ``swapin_ahead``)."""
    if plan.config.sync_swap_in:
        return 0
    return max((g.consumer_levels[0] - s.producer_level - 1 for s in plan.swaps for g in s.swap_ins
                if g.consumer_levels), default=0)


def search_idle(ev: TuneEvaluator, baseline: SimResult, mode: str) -> None:
    """Greedy idle-time selection, re-simulating as the peak moves.

    Each round adds the best-scoring tensors alive at the current peak until
    their bytes cover the overshoot. In no-overhead mode a round that makes the
    step slower is retried with half as many new tensors; a single tensor that
    still slows it down is dropped for good.
    """
    if mode == NO_OVERHEAD and not _copies_can_hide(ev, baseline):
        return
    selected: dict = {}
    rejected: set = set()
    sim = baseline
    evaluations = 0
    slowed = 0  # no-overhead rounds in a row that added nothing (every trial slowed the step down)
    for round_ in range(IDLE_MAX_ROUNDS):
        need = ev.need(sim) - ev.budget
        if need <= 0:
            return
        excluded = set(selected) | rejected
        cands = majority_order([c for c in ev.scored(sim) if c.tensor not in excluded])  # = idle_candidates
        if mode == NO_OVERHEAD:
            cands = [c for c in cands if c.hides]
        if not cands:
            return
        batch, got = [], 0
        for cand in cands:
            batch.append(cand)
            got += cand.num_bytes
            if got >= need * (1 + IDLE_OVERSHOOT_SLACK):
                break
        while evaluations < IDLE_MAX_EVALUATIONS:
            evaluations += 1
            trial = {**selected, **{c.tensor: c for c in batch}}
            result = ev.evaluate(IdleTime(mode, tuple(trial.values())), {"tensors": len(trial), "round": round_ + 1},
                                 max_overhead=NO_OVERHEAD_TOLERANCE if mode == NO_OVERHEAD else None,
                                 baseline=baseline)
            if mode != NO_OVERHEAD or result.sim.overhead_vs(baseline) <= NO_OVERHEAD_TOLERANCE:
                selected = trial
                break
            if len(batch) == 1:
                rejected.add(batch[0].tensor)
                break
            batch = batch[:len(batch) // 2]
        if result.fits or evaluations >= IDLE_MAX_EVALUATIONS:
            return
        slowed = 0 if selected is trial else slowed + 1
        if mode == NO_OVERHEAD and slowed >= NO_OVERHEAD_PATIENCE:
            return
        sim = result.sim if selected is trial else sim
