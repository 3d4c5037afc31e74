"""Where compute waits for a swap-out's copy: waits moved later, waits split, round trips made waits.

Steps 0, 4 and 5 of :func:`tflms.tune.prune.prune_swaps` (see its module doc). A wait keeps a tensor's successors
from allocating before its bytes leave, and a copy queues behind the copies started before it; these proposals
move a wait (:func:`later_waits`), hand it to an earlier copy (:func:`split_waits`), or replace a swap that never
leaves the device by waits for the copies queued before it (:func:`round_trips`). No timeline prediction says which
ones the fit needs: the pruning pass judges them by simulation.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tflms.policies.eligibility import is_inserted
from tflms.policies.swapplan import SwapDecision
from tflms.sim.simulator import SimResult
from tflms.tune.prune_predict import _away_intervals, _records

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
