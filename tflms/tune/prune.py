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
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from tflms.errors import GraphError
from tflms.policies.eligibility import is_inserted
from tflms.policies.swapplan import SwapDecision
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate
from tflms.units import format_bytes

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
#: A link idle for less than this between two copies is not a gap to fill.
LINK_IDLE_S = 1e-4
#: The parameters the pruned candidate adds to its source's: how many swaps were dropped, how many got one
#: swap-in for all their readers, how many no longer make compute wait for their swap-out, how many had a wait
#: split (:func:`split_waits`), how many wait later, how many swap in earlier (each only when not 0).
PRUNED_PARAM, MERGED_PARAM, UNSYNCED_PARAM, SPLIT_PARAM, LATER_PARAM, EARLIER_PARAM = (
    "pruned", "merged", "unsynced", "waits_split", "waits_later", "earlier")
#: The parameter for how many swaps that went out and straight back became waits (only when not 0).
ROUND_TRIP_PARAM = "round_trips"


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


def _spans(times: np.ndarray, intervals: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """Timeline event ranges ``[lo, hi)`` covering each ``(begin, end)``: the state in force at ``begin`` and
    every change strictly before ``end``."""
    spans = []
    for begin, end in intervals:
        lo = max(0, int(np.searchsorted(times, begin, side="right")) - 1)
        hi = int(np.searchsorted(times, end, side="left"))
        if hi > lo:
            spans.append((lo, hi))
    return spans


def _pack(sim: SimResult, limit_bytes: int, proposals: list[tuple[SwapDecision, list]]) -> list[SwapDecision]:
    """The proposals (``(swap, [(begin, end), ...])``: when the change adds the swap's bytes to the device),
    in the given order, whose additions all fit together under ``limit_bytes`` on ``sim``'s timeline."""
    times = np.array([t for t, _, _ in sim.timeline], dtype=float)
    headroom = limit_bytes - np.array([a for _, a, _ in sim.timeline], dtype=np.int64)
    chosen = []
    for swap, intervals in proposals:
        spans = _spans(times, intervals)
        if any(headroom[lo:hi].min() < swap.num_bytes for lo, hi in spans):
            continue
        for lo, hi in spans:
            headroom[lo:hi] -= swap.num_bytes
        chosen.append(swap)
    return chosen


def predicted_drops(plan_swaps: tuple[SwapDecision, ...], sim: SimResult, limit_bytes: int,
                    exclude: frozenset = frozenset()) -> list[SwapDecision]:
    """Swaps of ``plan_swaps`` that can be dropped together with live bytes staying within ``limit_bytes``
    on ``sim``'s timeline (see the module doc), smallest first; ``exclude``: tensors not to try.

    Smallest first: a small tensor's bytes fit more gaps, so the first half of a refused set (the half the
    bisection tries first) is the likelier to be kept (DenseNet-121 at batch 1108 on v100-16gb-pcie3, 24
    simulations: 727 swaps dropped, 23.43 s; largest first 17 swaps, 23.57 s).
    """
    records = _records(sim)
    proposals = []
    for swap in sorted((s for s in plan_swaps if s.tensor not in exclude),
                       key=lambda s: (s.num_bytes, s.tensor.name, s.tensor.index)):
        away = _away_intervals(swap, records)
        if away is not None:
            proposals.append((swap, away))
    return _pack(sim, limit_bytes, proposals)


def earlier_swap_ins(analysis, plan_swaps: tuple[SwapDecision, ...], sim: SimResult, limit_bytes: int,
                     exclude: frozenset = frozenset(), *, into_gaps: bool = False) -> list[SwapDecision]:
    """Swaps of ``plan_swaps`` with each asynchronous swap-in triggered twice as many levels before its first
    reader (:func:`~tflms.policies.swapplan.find_trigger`), those whose earlier copies fit together under
    ``limit_bytes`` on ``sim``'s timeline (a copy then starts when its new trigger ended, holding its bytes
    until it started before), in the order the copies started; ``exclude``: tensors not to try.

    ``into_gaps``: instead, only the swap-ins whose copy started when the host-to-device link had been idle,
    each triggered by the first reader's ancestor that ended last by the time the link went idle in ``sim``
    (:func:`~tflms.policies.swapplan.trigger_ended_by`; the link then copies while it would have idled: on a
    step whose compute waits for swap-ins, each such gap is time lost)."""
    from tflms.policies.swapplan import find_trigger, trigger_ended_by
    records = _records(sim)
    levels = analysis.levels
    if into_gaps:
        idle_since = link_idle_since(sim, "h2d")
        ends = {r.name: r.end_s for r in sim.ops if r.stream == "compute" and r.name in levels}
    proposals = []
    for swap in plan_swaps:
        if swap.tensor in exclude:
            continue
        groups, added, first_copy = [], [], None
        for group in swap.swap_ins:
            copies = records.get(group.name + "/_recv") or records.get(group.name)
            new = None
            if not group.sync and group.trigger is not None and group.trigger_level is not None and copies:
                first = group.consumers[0]
                start = min(r.start_s for r in copies)
                if not into_gaps:
                    distance = max(1, levels[first] - group.trigger_level)
                    new = find_trigger(analysis, first, swap.producer_level, levels[first] - 2 * distance)
                elif start in idle_since:
                    new = trigger_ended_by(analysis, first, swap.producer_level, ends, idle_since[start])
            if new is None or new == group.trigger or new not in records:
                groups.append(group)
                continue
            ready = max(r.end_s for r in records[new])
            first_copy = start if first_copy is None else min(first_copy, start)
            if ready < start:
                added.append((ready, start))
            groups.append(dataclasses.replace(group, trigger=new, trigger_level=levels.get(new)))
        if first_copy is not None:
            proposals.append((first_copy, swap.tensor.name, swap.tensor.index,
                              dataclasses.replace(swap, swap_ins=tuple(groups)), added))
    proposals.sort(key=lambda p: p[:3])
    return _pack(sim, limit_bytes, [(p[3], p[4]) for p in proposals])


def link_idle_since(sim: SimResult, stream: str) -> dict[float, float]:
    """``{start: idle_since}`` for each copy on ``stream`` that started after the link had been idle (more
    than :data:`LINK_IDLE_S`; from the step's start for the first copy): when it went idle."""
    since, busy_until = {}, 0.0
    for r in sorted((r for r in sim.ops if r.stream == stream), key=lambda r: (r.start_s, r.name)):
        if r.start_s > busy_until + LINK_IDLE_S:
            since[r.start_s] = busy_until
        busy_until = max(busy_until, r.end_s)
    return since


def merged_swap_ins(plan_swaps: tuple[SwapDecision, ...], sim: SimResult, limit_bytes: int,
                    exclude: frozenset = frozenset()) -> list[SwapDecision]:
    """Swaps of ``plan_swaps`` with several swap-ins, each with one swap-in (the first group's trigger) for all
    its readers instead, those whose merged copies fit together under ``limit_bytes`` on ``sim``'s timeline
    (the tensor then stays on the device between its groups), most copies saved first; ``exclude``: tensors
    not to try."""
    records = _records(sim)
    proposals = []
    for swap in plan_swaps:
        if swap.tensor in exclude or len(swap.swap_ins) < 2 or any(g.sync for g in swap.swap_ins):
            continue
        lives = []
        for group in swap.swap_ins:
            copies = records.get(group.name + "/_recv") or records.get(group.name)
            readers = [r.end_s for c in group.consumers for r in records.get(c, ())]
            if not copies or not readers:
                break
            lives.append((min(r.start_s for r in copies), max(readers)))
        else:
            lives.sort()
            gaps = [(lives[k][1], lives[k + 1][0]) for k in range(len(lives) - 1) if lives[k][1] < lives[k + 1][0]]
            first = swap.swap_ins[0]
            members = sorted(((c, level) for g in swap.swap_ins for c, level in zip(g.consumers, g.consumer_levels)),
                             key=lambda m: (m[1], m[0]))
            group = dataclasses.replace(first, consumers=tuple(c for c, _ in members),
                                        consumer_levels=tuple(level for _, level in members))
            proposals.append((-(len(swap.swap_ins) - 1) * swap.num_bytes, swap.tensor.name, swap.tensor.index,
                              dataclasses.replace(swap, swap_ins=(group,)), gaps))
    proposals.sort(key=lambda p: p[:3])
    return _pack(sim, limit_bytes, [(p[3], p[4]) for p in proposals])


def later_waits(graph, plan_swaps: tuple[SwapDecision, ...], sim: SimResult, ordered: set[str],
                exclude: frozenset = frozenset()) -> list[SwapDecision]:
    """Swaps of ``plan_swaps`` that make compute wait for their swap-out, each waiting instead at the op the
    order pins (``ordered``) twice as many ops after the producer in ``sim``'s compute order as its first
    wait now is: compute runs on while the copy goes, and still waits for it before going much further.
    In the order the producers ran; ``exclude``: tensors not to try. ``graph``: what ``sim`` simulated."""
    names = _compute_order(graph, sim)
    pos = {name: i for i, name in enumerate(names)}
    proposals = []
    for swap in plan_swaps:
        if swap.tensor in exclude or not swap.sync_out_consumers or swap.tensor.op not in pos:
            continue
        waits = [pos[c] for c in swap.sync_out_consumers if c in pos]
        if not waits:
            continue
        produced = pos[swap.tensor.op]
        target = produced + 2 * max(1, min(waits) - produced)
        later = next((n for n in names[target:] if n in ordered and not is_inserted(n)), None)
        if later is None or (later,) == swap.sync_out_consumers:
            continue
        proposals.append((produced, swap.tensor.name, swap.tensor.index,
                          dataclasses.replace(swap, sync_out_consumers=(later,))))
    proposals.sort(key=lambda p: p[:3])
    return [p[3] for p in proposals]


def _copy_spans(plan_swaps: tuple[SwapDecision, ...], records: dict[str, list]) -> dict:
    """``{tensor: (start, end)}`` of each swap-out copy that ran in the simulation ``records`` come from."""
    spans = {}
    for swap in plan_swaps:
        copies = records.get(swap.swap_out)
        if copies:
            spans[swap.tensor] = (min(r.start_s for r in copies), max(r.end_s for r in copies))
    return spans


def _compute_order(graph, sim: SimResult) -> list[str]:
    """The ops of ``graph`` in the order ``sim``'s compute stream ran them."""
    return [r.name for r in sorted((r for r in sim.ops if r.stream == "compute"), key=lambda r: (r.start_s, r.name))
            if r.name in graph]


def split_waits(graph, plan_swaps: tuple[SwapDecision, ...], sim: SimResult, ordered: set[str],
                exclude: frozenset = frozenset(), *, reach: float = 1.0
                ) -> list[tuple[SwapDecision, tuple[tuple[object, str], ...]]]:
    """Waits that stand for several copies, split: ``(swap with its wait moved later, ((tensor, op), ...))``.

    A swap-out copy queues behind the copies started before it, so a wait for it also waits for theirs. When
    compute waits at ``w`` for swap ``s``'s copy (ending at ``E_s``) and another swap ``q``'s copy, queued
    before it and still going when ``s``'s producer ended, ends at ``E_q < E_s``, the fit may need only
    ``q``'s bytes gone by ``w`` (VGG-16 at batch 432 on v100-16gb-pcie3: ``block1_pool`` waited 650 ms for
    ``block1_conv2``'s 5.2 GiB copy, queued behind ``block1_conv1``'s; block 2 needs only one of them gone).
    The proposal: ``q`` waits at ``w`` and ``s`` at the op the order pins that would start about ``E_s`` if
    compute ran on from ``E_q`` (the ops from ``w`` on, by their durations in ``sim``): compute runs beside
    ``s``'s copy; ``reach`` < 1 moves ``s``'s wait only that fraction of the way (the fit may need its bytes
    gone sooner). ``graph``: what ``sim`` simulated; ``ordered``: the ops the order pins (the only ones that
    may be given waits); ``exclude``: swaps not to change. In the order the producers ran.
    """
    records = _records(sim)
    names = _compute_order(graph, sim)
    pos = {name: i for i, name in enumerate(names)}
    took = np.array([sum(r.end_s - r.start_s for r in records[n] if r.stream == "compute") for n in names])
    copies = _copy_spans(plan_swaps, records)
    proposals = []
    for swap in plan_swaps:
        if (swap.tensor in exclude or swap.tensor not in copies or not swap.sync_out_consumers
                or swap.tensor.op not in pos):
            continue
        waits = [pos[c] for c in swap.sync_out_consumers if c in pos]
        produced = max(r.end_s for r in records[swap.tensor.op])
        started, ended = copies[swap.tensor]
        queued = sorted((end, q.tensor.name, q.tensor.index, q.tensor) for q in plan_swaps
                        if q.tensor != swap.tensor and q.tensor in copies and not q.sync_out_consumers
                        and q.tensor not in exclude and copies[q.tensor][0] <= started
                        and produced < (end := copies[q.tensor][1]) < ended)
        if not waits or not queued:
            continue
        first = min(waits)
        ran_on = np.cumsum(took[first:]) - took[first:]  # compute before each op from the wait on
        target = first + int(np.searchsorted(ran_on, reach * (ended - queued[-1][0]), side="right")) - 1
        later = next((n for n in names[max(target, first + 1):] if n in ordered and not is_inserted(n)), None)
        if later is None:
            continue
        pairs = tuple((queued[-1][3], c) for c in swap.sync_out_consumers)  # the copies before it end first
        proposals.append((pos[swap.tensor.op], swap.tensor.name, swap.tensor.index,
                          dataclasses.replace(swap, sync_out_consumers=(later,)), pairs))
    proposals.sort(key=lambda p: p[:3])
    return [(p[3], p[4]) for p in proposals]


def round_trips(plan_swaps: tuple[SwapDecision, ...], sim: SimResult, ordered: set[str],
                exclude: frozenset = frozenset()) -> list[tuple[SwapDecision, tuple[tuple[object, str], ...]]]:
    """Swaps of ``plan_swaps`` that never leave the device in ``sim`` (every swap-in's copy starts by the time
    the swap-out's copy ended: :func:`_away_intervals` is empty), each with the waits that would replace it:
    ``(swap, ((tensor, reader), ...))``, the reader being the swap's first reader in ``sim`` and each tensor a
    swap whose swap-out copy was queued before this one's and ended after this one's producer ran.

    Such a swap saves no memory of its own; it only delays its readers until the copies queued before it are
    done, so that their tensors' bytes leave first (BERT-base at batch 477 on v100-16gb-nvlink2: every
    attention-dropout ``Mul`` goes out and straight back, 2 x 100 ms, so that its ``SelectV2`` allocates only
    after the 5.6 GiB ``Softmax`` copy ended). Waiting for those copies instead keeps the delay without the
    two copies. Readers the order does not pin (``ordered``) cannot be given waits: such swaps are left
    out. In the order the swap-outs started; ``exclude``: tensors not to try.
    """
    records = _records(sim)
    outs = _copy_spans(plan_swaps, records)
    proposals = []
    for swap in plan_swaps:
        if swap.tensor in exclude or swap.tensor not in outs or _away_intervals(swap, records) != []:
            continue
        produced = records.get(swap.tensor.op)
        readers = sorted((r.start_s, c) for g in swap.swap_ins for c in g.consumers for r in records.get(c, ()))
        if not produced or not readers or readers[0][1] not in ordered:
            continue
        ready, reader, started = max(r.end_s for r in produced), readers[0][1], outs[swap.tensor][0]
        waits = tuple((t, reader) for t, (begin, end) in sorted(outs.items(), key=lambda kv: (kv[1], kv[0].name,
                                                                                               kv[0].index))
                      if t != swap.tensor and begin <= started and end > ready)
        proposals.append((started, swap.tensor.name, swap.tensor.index, swap, waits))
    proposals.sort(key=lambda p: p[:3])
    return [(p[3], p[4]) for p in proposals]


def _with_waits_for(kept: list[SwapDecision], trial: list[tuple[SwapDecision, tuple]], *,
                    replace: bool = False) -> tuple[tuple, set]:
    """``kept`` without the round trips of ``trial`` and with their waits (see :func:`round_trips`); a wait
    for a swap dropped by the same trial goes with it. Returns the swaps and the dropped tensors.
    ``replace``: ``trial``'s swaps replace those of their tensors instead (:func:`split_waits`), and the
    tensors returned are the replaced ones."""
    changed = {swap.tensor: swap for swap, _ in trial}
    waits: dict = {}
    for _, pairs in trial:
        for tensor, reader in pairs:
            waits.setdefault(tensor, []).append(reader)
    swaps = []
    for s in kept:
        if s.tensor in changed:
            if not replace:
                continue
            s = changed[s.tensor]
        extra = tuple(r for r in dict.fromkeys(waits.get(s.tensor, ())) if r not in s.sync_out_consumers)
        swaps.append(dataclasses.replace(s, sync_out_consumers=s.sync_out_consumers + extra) if extra else s)
    return tuple(swaps), set(changed)


def _with_split_waits(kept: list[SwapDecision], trial: list[tuple[SwapDecision, tuple]]) -> tuple[tuple, set]:
    return _with_waits_for(kept, trial, replace=True)


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
