"""Rewriting the fastest fitting plan: drop the swaps fitting does not need, merge and advance swap-ins.

The distance rules swap every tensor past a threshold; the threshold that makes the peak fit swaps
far more bytes than fitting needs, away from the peak too, and the copy streams (one per direction,
simulated as queues) then stall compute. :func:`prune_swaps` takes the fastest fitting candidate and
changes its plan in eight steps, each change kept only while the plan still fits (the tuner's rule:
``ev.need(sim) <= budget`` and the host peak within the host budget) and the simulated step is no
slower (a drop may leave it as it is; every other change must make it faster):

0. round trips (:func:`round_trips`): a swap whose tensor never leaves the device (each swap-in's copy
   starts by the time its swap-out's copy ended) saves no memory of its own; it only delays its readers
   until the copies queued on the link before it are done. It is dropped and its first reader waits for
   those copies instead (the swap-outs' ``sync_out_consumers``): the same delay without its two copies.
   A round trip is not a drop candidate (dropping it alone loses the delay, and the fit with it);
1. drops (:func:`predicted_drops`): a swap dropped keeps its tensor on the device from the end of its
   swap-out to the start of its first swap-in's copy, and between one swap-in group's last reader and
   the next group's copy. On the candidate's simulated timeline that adds the tensor's bytes over those
   intervals; the swaps are taken smallest first (ties by tensor name) into a set while the
   accelerator's live bytes, with all the set's additions, stay within what the budget allows at every
   instant. Dropping changes the timeline (copies end sooner, compute stalls less), so when a set is
   settled the prediction is made again from the new simulation, for the swaps not yet tried;
2. merges (:func:`merged_swap_ins`): a tensor swapped in for several groups of readers gets one swap-in,
   at the first group's trigger, for all of them (fewer host-to-device bytes; the tensor stays on the
   device between the groups, which is what the prediction adds);
3. no waits for swap-outs: every swap-out that makes compute wait for its copy (``sync_out_consumers``,
   the rules' ``sync_mode`` 1 and 3 and the peak swaps' waits) without them, in plan order. A wait keeps
   the tensor's successors from allocating before its bytes leave, so no timeline prediction says which
   ones the fit needs: the set is judged by simulation and bisected (VGG-16 at batch 432 on
   v100-16gb-pcie3: two of three waits go, 7.42 s -> 6.97 s; the one left keeps ``block1_pool`` from
   allocating while two 5.2 GiB copies are still queued);
4. split waits (:func:`split_waits`): a wait for a swap-out's copy also waits for the copies queued before
   it; when an earlier one ends sooner and may be all the fit needs by then, it takes over the wait and
   this swap waits later, about when its own copy ends if compute runs on meanwhile (VGG-16 at batch 432:
   ``block1_pool`` waits for ``block1_conv1``'s copy only, 6.97 s -> 6.64 s); nearer if that does not fit;
5. later waits (:func:`later_waits`): a wait the fit needs moves to the op the order pins twice as far after
   the producer as the first wait is, repeated while it pays: compute runs beside the copy and still waits
   before it allocates much more (ResNet-50 at batch 1347 on v100-16gb-pcie3: 61 of 69 waits move,
   21.80 s -> 20.62 s);
6. earlier swap-ins (:func:`earlier_swap_ins`): every asynchronous swap-in's trigger twice as many levels
   before its first reader (:func:`~tflms.policies.swapplan.find_trigger`, as the rules choose one), the
   copy then holding its bytes from the new trigger's end; repeated (twice as far again) while it pays;
7. swap-ins where the link idles (``earlier_swap_ins(into_gaps=True)``): a swap-in whose copy started after
   the host-to-device link had idled is triggered by the first reader's ancestor that ended last by the time
   the link went idle (:func:`~tflms.policies.swapplan.trigger_ended_by`), where its bytes fit (BERT-base at
   batch 477 on v100-16gb-nvlink2: 20.91 s -> 19.91 s).

Each step judges its set by simulation all at once and, on failure, splits it in two halves, earlier half
first, down to single changes, which are then given up. At most :data:`ROUND_TRIP_MAX_SIMULATIONS`,
:data:`PRUNE_MAX_SIMULATIONS`, :data:`MERGE_MAX_SIMULATIONS`, :data:`UNSYNC_MAX_SIMULATIONS`,
:data:`SPLIT_MAX_SIMULATIONS`, :data:`LATER_MAX_SIMULATIONS`, :data:`RETIME_MAX_SIMULATIONS` and
:data:`GAP_MAX_SIMULATIONS` simulations.

A candidate judged in the enforced order (``order`` set) is judged the same way: each trial plan goes
through the order pass (:func:`tflms.passes.order.enforce_order`, deterministic, what the pipeline runs
on the winner), so what is predicted is what runs. Dropping a swap drops its swap-out, swap-ins and
their control edges (sync and trigger edges name only ops of the original graph), so every subset of a
valid plan is a valid plan; a moved trigger stays after the producer's level and before the first
reader's, so no change closes a cycle; order edges are derived anew.

Every step is deterministic: the order of trials depends only on the plan and its simulation. The tuner's
``progress`` callback gets one line, the new candidate's (the callback counts candidates); each trial is
logged at INFO level.

This module runs the steps and judges their sets (:func:`prune_swaps`); the changes that are proposed come from
:mod:`tflms.tune.prune_predict` (drops, merges, earlier swap-ins: predicted on the timeline) and
:mod:`tflms.tune.prune_waits` (round trips, split and later waits), whose names stay importable from here.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from tflms.errors import GraphError
from tflms.policies.swapplan import SwapDecision
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate
from tflms.units import format_bytes
# which changes fit on the timeline, and where compute waits: the names stay importable from here
from tflms.tune.prune_predict import (LINK_IDLE_S, _away_intervals, _pack, _records, _spans,  # noqa: F401
                                      earlier_swap_ins, link_idle_since, merged_swap_ins, predicted_drops)
from tflms.tune.prune_waits import (_compute_order, _copy_spans, _with_split_waits, _with_waits_for,  # noqa: F401
                                    later_waits, round_trips, split_waits)

if TYPE_CHECKING:
    from tflms.ir.graph import Graph
    from tflms.tune.search import TuneEvaluator

logger = logging.getLogger(__name__)

#: Simulations one pruning pass may run (a ResNet-50 step at batch 1347 simulates in about a second, and a
#: trial in the enforced order also schedules the graph).
PRUNE_MAX_SIMULATIONS = 24
#: Rounds of prediction (each re-predicts from the last accepted simulation).
PRUNE_MAX_ROUNDS = 4
#: Simulations the pass may run first to turn swaps that go out and straight back into waits.
ROUND_TRIP_MAX_SIMULATIONS = 8
#: Simulations the pass may run after the drops to give a tensor one swap-in for all its readers.
MERGE_MAX_SIMULATIONS = 8
#: Simulations the pass may run after the merges to let compute run on while a swap-out copies.
UNSYNC_MAX_SIMULATIONS = 12
#: Simulations the pass may run after those to split waits that stand for several queued copies.
SPLIT_MAX_SIMULATIONS = 8
#: How far a split wait moves, as fractions of the way :func:`split_waits` works out, tried in turn.
SPLIT_REACH = (1.0, 0.75, 0.5, 0.25)
#: Simulations the pass may run after those to move the waits left further from their producers.
LATER_MAX_SIMULATIONS = 24
#: Simulations the pass may run after those to trigger swap-ins earlier.
RETIME_MAX_SIMULATIONS = 12
#: Simulations the pass may run after those to trigger swap-ins where the host-to-device link idles.
GAP_MAX_SIMULATIONS = 12
#: The parameters the pruned candidate adds to its source's: how many swaps were dropped, how many got one
#: swap-in for all their readers, how many no longer make compute wait for their swap-out, how many had a wait
#: split (:func:`split_waits`), how many wait later, how many swap in earlier (each only when not 0).
PRUNED_PARAM, MERGED_PARAM, UNSYNCED_PARAM, SPLIT_PARAM, LATER_PARAM, EARLIER_PARAM = (
    "pruned", "merged", "unsynced", "waits_split", "waits_later", "earlier")
#: The parameter for how many swaps that went out and straight back became waits (only when not 0).
ROUND_TRIP_PARAM = "round_trips"


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


def _settle(ev: TuneEvaluator, judge: _Judge, state: dict, proposals: list, drop: bool, max_simulations: int,
            what: str, apply=None) -> tuple[set, set]:
    """Judge ``proposals`` (swaps to drop, or replacements of kept swaps) all at once, bisecting a refused set,
    earlier half first, down to single ones. ``state`` (``kept``: the swaps in plan order, ``judged``: the
    best ``(sim, graph, order report)``, ``changed``: how many changes were kept) is updated with every set
    kept. ``apply(kept, trial)``: for other changes, the swaps with ``trial``'s changes made and the tensors
    they change (proposals are then ``(swap, ...)`` tuples). Returns the tensors whose changes were kept,
    and those whose change was refused alone."""
    kept: set = set()
    refused: set = set()
    pending = [proposals] if proposals else []
    while pending and judge.simulations < max_simulations:
        trial = pending.pop(0)
        if apply is None:
            change = {s.tensor: (None if drop else s) for s in trial}
            swaps = tuple(change.get(s.tensor, s) if s.tensor in change else s for s in state["kept"])
            swaps = tuple(s for s in swaps if s is not None)
        else:
            swaps, change = apply(state["kept"], trial)
        judged = judge(swaps)
        best = state["judged"][0]
        # a drop may leave the time as it is (fewer copies, less host memory); a swap-in moved earlier must pay
        ok = judged is not None and judge.fits(judged[0]) and (
            judged[0].step_time_s <= best.step_time_s if drop else judged[0].step_time_s < best.step_time_s)
        if logger.isEnabledFor(logging.INFO):
            result = ("not judged (cycle)" if judged is None else
                      f"peak {format_bytes(judged[0].peak_with_margin_bytes)}, step {judged[0].step_time_s * 1e3:.2f} ms")
            logger.info("pruning: %s %d swaps (%s): %s, %s", what, len(trial),
                        format_bytes(sum((p[0] if apply else p).num_bytes for p in trial)), result,
                        "kept" if ok else "refused")
        if ok:
            state.update(kept=list(swaps), judged=judged, changed=state["changed"] + len(trial))
            kept |= set(change)
        elif len(trial) > 1:
            half = len(trial) // 2
            pending[:0] = [trial[:half], trial[half:]]
        else:
            refused |= set(change)
    return kept, refused


def _ordered(ev: TuneEvaluator, graph: Graph) -> set[str]:
    """The ops of ``graph`` the order pins, the only ones that may be given waits (their ops do not change
    from one trial plan to the next: trials change only swap ops and control edges)."""
    from tflms.schedule import ordered_ops
    return set(ordered_ops(graph, [op.name for op in graph], ev.sim_options))


def _limit(ev: TuneEvaluator, sim: SimResult) -> int:
    """The accelerator's live bytes the budget allows, judged from ``sim`` (its slack, less the margin)."""
    return sim.peak_bytes + int((ev.budget - ev.need(sim)) / (1 + ev.sim_options.margin_fraction))


def _faster_changes(ev: TuneEvaluator, judge: _Judge, state: dict, cand: Candidate, ordered: set[str] | None, *,
                    merge_simulations: int, unsync_simulations: int, split_simulations: int,
                    later_simulations: int, retime_simulations: int, gap_simulations: int) -> tuple[set, ...]:
    """Steps 2-7 of :func:`prune_swaps` (merges, waits, earlier swap-ins), each change kept only where the step
    gets faster: the tensors merged, unsynced, whose waits were split, moved later, and whose swap-ins moved."""
    budget = judge.simulations + merge_simulations
    sim = state["judged"][0]
    merged = merged_swap_ins(tuple(state["kept"]), sim, _limit(ev, sim))
    logger.info("pruning %s %s: %d of %d swaps may swap in once for all their readers", cand.strategy,
                cand.params, len(merged), len(state["kept"]))
    merged_tensors = _settle(ev, judge, state, merged, False, budget, "one swap-in for")[0]
    budget = judge.simulations + unsync_simulations
    waiting = [dataclasses.replace(s, sync_out_consumers=()) for s in state["kept"] if s.sync_out_consumers]
    logger.info("pruning %s %s: %d of %d swaps make compute wait for their swap-out", cand.strategy, cand.params,
                len(waiting), len(state["kept"]))
    unsynced_tensors = _settle(ev, judge, state, waiting, False, budget, "not waiting for the swap-out of")[0]
    settled, later_tensors, split_tensors = set(unsynced_tensors), set(), set()
    if any(s.sync_out_consumers for s in state["kept"]):
        sim, graph = state["judged"][0], state["judged"][1] or ev.graph_of(cand)
        ordered = ordered if ordered is not None else _ordered(ev, graph)
        budget, refused = judge.simulations + split_simulations, set()
        for reach in SPLIT_REACH:  # a split refused moving its wait that far may move it less far
            splits = split_waits(graph, tuple(state["kept"]), sim, ordered, frozenset(split_tensors),
                                 reach=reach)
            splits = [p for p in splits if reach == SPLIT_REACH[0] or p[0].tensor in refused]
            logger.info("pruning %s %s: %d of %d waits stand for copies queued before theirs (reach %g)",
                        cand.strategy, cand.params, len(splits), len(state["kept"]), reach)
            done, refused = _settle(ev, judge, state, splits, False, budget, "splitting the wait for",
                                    apply=_with_split_waits)
            split_tensors |= done
            if not refused:
                break
            sim, graph = state["judged"][0], state["judged"][1] or ev.graph_of(cand)
    budget = judge.simulations + later_simulations
    for round_ in range(PRUNE_MAX_ROUNDS):
        if not any(s.sync_out_consumers and s.tensor not in settled for s in state["kept"]):
            break  # nothing waits (the common case): no graph to build or order to read
        sim, graph = state["judged"][0], state["judged"][1] or ev.graph_of(cand)
        if ordered is None:  # the same ops in every round: the rounds change only control edges
            ordered = _ordered(ev, graph)
        deferred = later_waits(graph, tuple(state["kept"]), sim, ordered, frozenset(settled))
        logger.info("pruning %s %s (round %d): %d of %d swaps may wait for their swap-out later", cand.strategy,
                    cand.params, round_ + 1, len(deferred), len(state["kept"]))
        if not deferred or judge.simulations >= budget:
            break
        done, refused = _settle(ev, judge, state, deferred, False, budget, "waiting later for the swap-out of")
        later_tensors |= done
        settled |= refused
    moved_tensors = set()
    for into_gaps, simulations, what in ((False, retime_simulations, "swapping in earlier"),
                                         (True, gap_simulations, "swapping in where the link idles")):
        settled, budget = set(), judge.simulations + simulations
        for round_ in range(PRUNE_MAX_ROUNDS):
            sim = state["judged"][0]
            moved = earlier_swap_ins(ev.analysis, tuple(state["kept"]), sim, _limit(ev, sim), frozenset(settled),
                                     into_gaps=into_gaps)
            logger.info("pruning %s %s (round %d): %d of %d swaps may be %s", cand.strategy, cand.params,
                        round_ + 1, len(moved), len(state["kept"]), what)
            if not moved or judge.simulations >= budget:
                break
            # a swap-in moved earlier may move again (twice as far, or into a new gap); one refused alone stays
            done, refused = _settle(ev, judge, state, moved, False, budget, what)
            moved_tensors |= done
            settled |= refused
    return merged_tensors, unsynced_tensors, split_tensors, later_tensors, moved_tensors


def prune_swaps(ev: TuneEvaluator, cand: Candidate, *, round_trip_simulations: int = ROUND_TRIP_MAX_SIMULATIONS,
                max_simulations: int = PRUNE_MAX_SIMULATIONS,
                merge_simulations: int = MERGE_MAX_SIMULATIONS,
                retime_simulations: int = RETIME_MAX_SIMULATIONS,
                unsync_simulations: int = UNSYNC_MAX_SIMULATIONS,
                later_simulations: int = LATER_MAX_SIMULATIONS,
                split_simulations: int = SPLIT_MAX_SIMULATIONS,
                gap_simulations: int = GAP_MAX_SIMULATIONS) -> Candidate | None:
    """The candidate ``cand``'s plan with waits for the swaps that go out and straight back, minus the swaps
    fitting does not need, then with merged swap-ins, fewer, split and later waits for swap-outs, and earlier
    swap-ins where they fit and pay (see the module doc), recorded in ``ev.candidates`` with ``round_trips``
    (round trips made waits), ``pruned`` (swaps dropped), ``merged`` (swaps given one swap-in), ``unsynced``
    (swaps whose waits went), ``waits_split`` (swaps whose wait another swap took over), ``waits_later``
    (swaps whose waits moved later) and ``earlier`` (swaps whose swap-ins moved) added to its parameters (each
    only when not 0); ``None`` when no change was kept, or when the changes left the step exactly as fast but
    need more memory (fewer copies alone do not make a better plan).

    ``ev``: the tuner's evaluator; ``cand``: a fitting candidate with a plan. Not with compressed swaps
    (``ev.compress``: the trial plans would be judged without the compression the winner gets). The new
    candidate fits and is at least as fast as ``cand`` by construction; its ``policy`` is ``None`` (the
    pipeline applies ``plan``).
    """
    if cand.plan is None or not cand.plan.swaps or not cand.fits or ev.compress is not None or cand.plan.recomputes:
        return None  # (a hybrid's swaps were pruned by the tune that chose them, on the recomputed graph)
    judge = _Judge(ev, cand)
    state = {"kept": list(cand.plan.swaps), "judged": (cand.sim, None, None), "changed": 0}
    settled: set = set()
    ordered, tripped = None, 0
    records = _records(cand.sim)
    if any(_away_intervals(s, records) == [] for s in cand.plan.swaps) and not cand.sim.compute_bound:
        ordered = _ordered(ev, ev.graph_of(cand))
        trips = round_trips(tuple(state["kept"]), cand.sim, ordered)
        logger.info("pruning %s %s: %d of %d swaps go out and straight back", cand.strategy, cand.params,
                    len(trips), len(state["kept"]))
        done, refused = _settle(ev, judge, state, trips, False, round_trip_simulations, "waits instead of",
                                apply=_with_waits_for)
        # neither a round trip made a wait nor one refused alone is worth a drop trial (a drop keeps no delay)
        settled |= done | refused
        tripped, state["changed"] = len(done), 0
    budget = judge.simulations + max_simulations
    for round_ in range(PRUNE_MAX_ROUNDS):
        sim = state["judged"][0]
        chunk = predicted_drops(tuple(state["kept"]), sim, _limit(ev, sim), frozenset(settled))
        logger.info("pruning %s %s (round %d): %d of %d swaps (%s) predicted unneeded", cand.strategy, cand.params,
                    round_ + 1, len(chunk), len(state["kept"]), format_bytes(sum(s.num_bytes for s in chunk)))
        if not chunk or judge.simulations >= budget:
            break
        settled.update(*_settle(ev, judge, state, chunk, True, budget, "without"))
    dropped, state["changed"] = state["changed"], 0
    if state["judged"][0].compute_bound:
        # no change but a drop is kept unless it makes the step faster, and nothing makes it faster
        merged_tensors = unsynced_tensors = split_tensors = later_tensors = moved_tensors = set()
    else:
        merged_tensors, unsynced_tensors, split_tensors, later_tensors, moved_tensors = _faster_changes(
            ev, judge, state, cand, ordered, merge_simulations=merge_simulations,
            unsync_simulations=unsync_simulations, split_simulations=split_simulations,
            later_simulations=later_simulations, retime_simulations=retime_simulations,
            gap_simulations=gap_simulations)
    earlier = len(moved_tensors)
    sim, graph, report = state["judged"]
    if not (tripped or dropped or earlier or merged_tensors or unsynced_tensors or split_tensors or later_tensors):
        return None
    if (sim.step_time_s, ev.need(sim)) > (cand.sim.step_time_s, ev.need(cand.sim)):
        return None  # as fast as before but closer to the budget: not better (the tuner's regression rule)
    params = {**cand.params, **({ROUND_TRIP_PARAM: tripped} if tripped else {}),
              **({PRUNED_PARAM: dropped} if dropped else {}),
              **({MERGED_PARAM: len(merged_tensors)} if merged_tensors else {}),
              **({UNSYNCED_PARAM: len(unsynced_tensors)} if unsynced_tensors else {}),
              **({SPLIT_PARAM: len(split_tensors)} if split_tensors else {}),
              **({LATER_PARAM: len(later_tensors)} if later_tensors else {}),
              **({EARLIER_PARAM: earlier} if earlier else {})}
    plan = dataclasses.replace(cand.plan, swaps=tuple(state["kept"]))
    if report is not None:
        from tflms.tune.search import record_ordered
        return record_ordered(ev, cand.strategy, params, plan, sim, report, graph, None,
                              f"pruned in {judge.simulations} simulations")
    return ev.run(cand.strategy, params, plan)
