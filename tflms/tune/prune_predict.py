"""Which swap changes fit, predicted on a simulated timeline: drops, merged swap-ins, earlier swap-ins.

Steps 1, 2, 6 and 7 of :func:`tflms.tune.prune.prune_swaps` (see its module doc). Each change keeps a tensor on
the device longer (a swap dropped, a tensor swapped in once for all its readers, a swap-in triggered earlier or
where the host-to-device link idles); its bytes over those intervals are added to the candidate's simulated live
bytes, and the changes are taken in a fixed order into a set while every instant stays within the budget's limit
(:func:`_pack`). The pruning pass judges each set by simulation.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tflms.policies.swapplan import SwapDecision
from tflms.sim.simulator import SimResult

#: A link idle for less than this between two copies is not a gap to fill.
LINK_IDLE_S = 1e-4


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

