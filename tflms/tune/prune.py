"""Dropping the swaps a fitting plan does not need: fewer copies, the same fit.

The distance rules swap every tensor past a threshold; the threshold that makes the peak fit swaps
far more bytes than fitting needs, away from the peak too, and the copy streams (one per direction,
simulated as queues) then stall compute. :func:`prune_swaps` takes the fastest fitting candidate and
removes swaps from its plan while the plan still fits (the tuner's rule: ``ev.need(sim) <= budget``
and the host peak within the host budget) and the simulated step is no slower.

Which swaps to try (:func:`predicted_drops`): a swap dropped keeps its tensor on the device from the
end of its swap-out to the start of its first swap-in's copy, and between one swap-in group's last
reader and the next group's copy. On the candidate's simulated timeline that adds the tensor's bytes
over those intervals; the swaps are taken by copy time saved (bytes times copies, largest first; ties by
tensor name) and kept in the set while the accelerator's live bytes, with all the set's additions, stay
within what the budget allows at every instant. The set is then judged by simulation: all at once, and
on failure (it no longer fits, or the step got slower) split in two halves, earlier (larger) half first,
down to single swaps, which are then kept in the plan for good. Dropping changes the timeline (copies
end sooner, compute stalls less), so when a round's set is settled the prediction is made again from
the new simulation, for the swaps not yet tried; at most :data:`PRUNE_MAX_SIMULATIONS` simulations in
all.

A candidate judged in the enforced order (``order`` set) is judged the same way: each trial plan goes
through the order pass (:func:`tflms.passes.order.enforce_order`, deterministic, what the pipeline runs
on the winner), so what is predicted is what runs. Dropping a swap drops its swap-out, swap-ins and
their control edges (sync and trigger edges name only ops of the original graph), so every subset of a
valid plan is a valid plan; its order edges are derived anew.

Every step is deterministic: the order of trials depends only on the plan and its simulation.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging

import numpy as np

from tflms.errors import GraphError
from tflms.policies.swapplan import SwapDecision
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate
from tflms.units import format_bytes

logger = logging.getLogger(__name__)

#: Simulations one pruning pass may run (a ResNet-50 step at batch 1347 simulates in about a second, and a
#: trial in the enforced order also schedules the graph).
PRUNE_MAX_SIMULATIONS = 24
#: Rounds of prediction (each re-predicts from the last accepted simulation).
PRUNE_MAX_ROUNDS = 4
#: The parameter the pruned candidate adds to its source's (how many swaps were dropped).
PRUNED_PARAM = "pruned"


def _records(sim: SimResult) -> dict[str, list]:
    by_name: dict[str, list] = {}
    for r in sim.ops:
        by_name.setdefault(r.name, []).append(r)
    return by_name


def _away_intervals(swap: SwapDecision, records: dict[str, list]) -> list[tuple[float, float]] | None:
    """When ``swap``'s tensor is off the device in the simulation (``None``: its ops did not run)."""
    out = records.get(swap.swap_out)
    if not out:
        return None
    start = max(r.end_s for r in out)
    lives = []
    for group in swap.swap_ins:
        copies = records.get(group.name + "/_recv") or records.get(group.name)
        readers = [r.end_s for c in group.consumers for r in records.get(c, ())]
        if not copies or not readers:
            return None
        lives.append((min(r.start_s for r in copies), max(readers)))
    away = []
    for begin, end in sorted(lives):
        if begin > start:
            away.append((start, begin))
        start = max(start, end)
    return away


def predicted_drops(plan_swaps: tuple[SwapDecision, ...], sim: SimResult, limit_bytes: int,
                    exclude: frozenset = frozenset()) -> list[SwapDecision]:
    """Swaps of ``plan_swaps`` that can be dropped together with live bytes staying within ``limit_bytes``
    on ``sim``'s timeline (see the module doc), largest copy time first; ``exclude``: tensors not to try."""
    times = np.array([t for t, _, _ in sim.timeline], dtype=float)
    # live bytes on the accelerator between event k and event k+1 (the timeline holds the bytes after each change)
    headroom = limit_bytes - np.array([a for _, a, _ in sim.timeline], dtype=np.int64)
    records = _records(sim)
    ranked = sorted((s for s in plan_swaps if s.tensor not in exclude),
                    key=lambda s: (-s.num_bytes * (1 + len(s.swap_ins)), s.tensor.name, s.tensor.index))
    chosen = []
    for swap in ranked:
        away = _away_intervals(swap, records)
        if away is None:
            continue
        spans = []
        for begin, end in away:
            # the events strictly inside (begin, end) and the state in force at begin
            lo = max(0, bisect.bisect_right(times, begin) - 1)
            hi = bisect.bisect_left(times, end)
            if hi > lo:
                spans.append((lo, hi))
        if any(headroom[lo:hi].min() < swap.num_bytes for lo, hi in spans):
            continue
        for lo, hi in spans:
            headroom[lo:hi] -= swap.num_bytes
        chosen.append(swap)
    return chosen


class _Judge:
    """Simulates reduced plans of one candidate the way the candidate was judged (level or enforced order)."""

    def __init__(self, ev, cand: Candidate):
        self.ev, self.cand = ev, cand
        self.ordered = cand.order is not None
        self.simulations = 0

    def __call__(self, swaps: tuple[SwapDecision, ...]):
        """``(sim, graph, order report)`` of the candidate's plan with only ``swaps``; ``None`` if it cannot run."""
        from tflms.passes.order import enforce_order
        from tflms.passes.swaps import apply_swaps
        ev = self.ev
        plan = dataclasses.replace(self.cand.plan, swaps=swaps)
        self.simulations += 1
        level_sim = ev.plans.evaluate(plan)
        if not self.ordered:
            return level_sim, None, None
        try:
            graph = apply_swaps(ev.analysis.graph, plan, copy_op=ev.copy_op).graph
            graph.topological_order()
            result = enforce_order(graph, ev.profile, options=ev.sim_options, level_peak_bytes=level_sim.peak_bytes)
        except GraphError as exc:  # the sync or trigger edges would close a cycle
            logger.debug("pruned plan not judged: %s", exc)
            return None
        return (result.report.ordered_sim if result.changed else level_sim), graph, result.report

    def fits(self, sim: SimResult) -> bool:
        return self.ev.need(sim) <= self.ev.budget and sim.host_peak_bytes <= self.ev.host_budget


def prune_swaps(ev, cand: Candidate, *, max_simulations: int = PRUNE_MAX_SIMULATIONS) -> Candidate | None:
    """The candidate ``cand``'s plan minus the swaps fitting does not need (see the module doc), recorded in
    ``ev.candidates`` with ``pruned`` (swaps dropped) added to its parameters; ``None`` when no drop was kept.

    ``ev``: the tuner's evaluator; ``cand``: a fitting candidate with a plan. Not with compressed swaps
    (``ev.compress``: the trial plans would be judged without the compression the winner gets). The new
    candidate fits and is at least as fast as ``cand`` by construction; its ``policy`` is ``None`` (the
    pipeline applies ``plan``).
    """
    if cand.plan is None or not cand.plan.swaps or not cand.fits or ev.compress is not None:
        return None
    judge = _Judge(ev, cand)
    margin = ev.sim_options.margin_fraction
    kept = list(cand.plan.swaps)  # in plan order (the pruned plan keeps it)
    best = (cand.sim, None, None)
    settled: set = set()  # tensors tried alone and needed, or dropped
    dropped = 0
    for round_ in range(PRUNE_MAX_ROUNDS):
        sim = best[0]
        slack = ev.budget - ev.need(sim)
        limit = sim.peak_bytes + int(slack / (1 + margin))
        chunk = predicted_drops(tuple(kept), sim, limit, frozenset(settled))
        if ev.progress:
            ev.progress(f"pruning {cand.strategy} {cand.params} (round {round_ + 1}): {len(chunk)} of {len(kept)} "
                        f"swaps ({format_bytes(sum(s.num_bytes for s in chunk))}) predicted unneeded")
        if not chunk:
            break
        pending = [chunk]
        while pending and judge.simulations < max_simulations:
            trial = pending.pop(0)
            gone = {s.tensor for s in trial}
            rest = tuple(s for s in kept if s.tensor not in gone)
            judged = judge(rest)
            ok = judged is not None and judge.fits(judged[0]) and judged[0].step_time_s <= best[0].step_time_s
            if ev.progress:
                what = ("not judged (cycle)" if judged is None else
                        f"peak {format_bytes(judged[0].peak_with_margin_bytes)}, step {judged[0].step_time_s * 1e3:.2f} ms")
                ev.progress(f"pruning: without {len(trial)} swaps ({format_bytes(sum(s.num_bytes for s in trial))}): "
                            f"{what}, {'kept' if ok else 'refused'}")
            if ok:
                kept = list(rest)
                best = judged
                dropped += len(trial)
                settled |= gone
            elif len(trial) > 1:
                half = len(trial) // 2
                pending[:0] = [trial[:half], trial[half:]]
            else:
                settled |= gone
        if judge.simulations >= max_simulations or not kept:
            break
    if not dropped:
        return None
    sim, graph, report = best
    params = {**cand.params, PRUNED_PARAM: dropped}
    plan = dataclasses.replace(cand.plan, swaps=tuple(kept))
    if report is not None:
        from tflms.tune.search import record_ordered
        return record_ordered(ev, cand.strategy, params, plan, sim, report, graph, None,
                              f"pruned of {dropped} swaps in {judge.simulations} simulations")
    return ev.run(cand.strategy, params, plan)
