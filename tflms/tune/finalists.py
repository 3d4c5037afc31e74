"""Which candidates are judged again in the enforced order, and how: the finalists of :func:`judge_ordered`.

The level-order peak does not see what the memory-aware order removes, so the candidates that do not fit in level
order but might once ordered (the lowest peak of each family, the families that came closest, the lowest peaks
whatever their family, ungrouped twins) go through the order pass the pipeline runs, within the bounds below; when
nothing fits then, the closest families get the swaps across the ordered peak (:mod:`tflms.tune.peakswap`).
Each is recorded by :func:`record_ordered`.
"""

from __future__ import annotations

from tflms.ir.graph import Graph
from tflms.sim.simulator import SimResult
from tflms.tune.judge import TuneEvaluator
from tflms.tune.result import Candidate

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
    # (where a plan fits, the swaps across the ordered peak below do not run: a finalist that no order fits is not
    # scheduled; ResNet-50's recompute plans that missed at batch 32, 1.1 to 1.5 times the budget at the loss)
    orderable = ((lambda c: not ev.cannot_fit_ordered(c)) if any(c.fits for c in ev.candidates)
                 else (lambda c: True))
    over = [c for c in over if orderable(c)]
    twins = []
    for c in over:
        if len(twins) >= ORDER_UNGROUPED_TWINS:
            break
        if c.strategy == "tflms-distance" and c.params.get("swapin_groupby"):
            twin = ev.distance(**{**c.params, "swapin_groupby": 0})
            if (not twin.fits and twin.sim.step_time_s < limit and twin.sim.host_peak_bytes <= ev.host_budget
                    and ev.need(twin.sim) <= ev.budget * (1 + ORDER_MAX_OVERSHOOT) and orderable(twin)):
                twins.append(twin)
    seen: set = set()
    # (a plan's judgment in the order, and its swaps across the ordered peak, once per tune: with first_fit the
    # tuner judges the order before the recompute search and again after it)
    memo: dict = ev.__dict__.setdefault("_ordered_memo", {})
    peak_memo: dict = ev.__dict__.setdefault("_peak_swaps_memo", {})

    def judge(cands: list[Candidate], limit: int) -> list[Candidate]:
        """Judge up to ``limit`` distinct plans of ``cands`` in the enforced order."""
        judged = []
        for c in cands:
            if len(judged) >= limit or (first_fit and any(j.fits for j in judged)):
                break  # (with ``first_fit``, once one fits: the tune's question is answered)
            # the whole decisions: sync edges and triggers differ between sync modes and look-aheads (a plan that
            # changes nothing, a distance threshold past every distance, is the unswapped step)
            key = None if c.plan is None or not (c.plan.swaps or c.plan.recomputes) else (c.plan.swaps,
                                                                                           c.plan.recomputes)
            if key in seen:
                continue
            seen.add(key)
            if key is not None and key in memo:  # judged by an earlier call of this tune (first_fit's early one)
                judged.append(memo[key])
                continue
            graph = ev.graph_of(c)
            # c.sim is the simulation of ``graph`` in level order (the incremental evaluator's answer is simulate's)
            result = ev.ordered_base() if key is None else enforce_order(graph, ev.profile, options=ev.sim_options,
                                                                         level_peak_bytes=c.sim.peak_bytes)
            sim = result.report.ordered_sim if result.changed else c.sim
            judged.append(record_ordered(ev, c.strategy, c.params, c.plan, sim, result.report, graph, c.policy,
                                         f"in the enforced order ({result.report.num_edges} edges)"))
            if key is not None:
                memo[key] = judged[-1]
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
    if first_fit and any(c.fits for c in added):
        return added
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
            key = (c.plan.swaps, c.plan.recomputes) if c.plan is not None else None
            if key not in peak_memo:
                peak_memo[key] = swap_across_peak(ev, c)
            added += peak_memo[key]
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
