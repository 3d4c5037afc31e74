"""The tuner's searches: the TFLMS distance ladder, greedy idle-time rounds, the enforced-order finalists.

Each search judges candidates through one :class:`~tflms.tune.judge.TuneEvaluator` (simulated by
:class:`~tflms.tune.evaluator.PlanEvaluator`, memoized by plan) and records them;
:func:`tflms.tune.tuner.tune` runs the searches and picks the winner. The judge is :mod:`tflms.tune.judge`, the
enforced-order finalists :mod:`tflms.tune.finalists` (:func:`judge_ordered`); their names stay importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tflms.analysis.cto import Analysis, analyze_graph
from tflms.passes.swaps import apply_swaps
from tflms.policies.base import IdleTime
from tflms.policies.idle_time import NO_OVERHEAD, majority_order
from tflms.policies.swapplan import SwapPlan
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate
# the judge and the enforced-order finalists: the names stay importable from here
from tflms.tune.judge import FIT_BY_BFC, FIT_BY_LIVE, SCORED_MEMO_SIZE, VIEWS_KEPT, TuneEvaluator  # noqa: F401
from tflms.tune.finalists import (ORDER_FAMILIES, ORDER_FINALISTS, ORDER_MAX_OVERSHOOT,  # noqa: F401
                                  ORDER_UNGROUPED_TWINS, ORDER_WALKS, _closest_families, _family, judge_ordered,
                                  record_ordered)

logger = logging.getLogger(__name__)

#: Rounds of re-simulation the idle-time strategy may take (the peak moves after each).
IDLE_MAX_ROUNDS = 12
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
