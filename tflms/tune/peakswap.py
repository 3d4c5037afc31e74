"""Swapping a tensor that waits across the peak of the enforced order.

The distance and idle-time policies swap what the CTO levels (or a level-order simulation) show idle.
Once an order is pinned (docs/design.md, "Enforced order") the schedule runs one input chain of a join
after the other, and a tensor the *second* chain reads waits on the device while the first one peaks:
on ResNet-50 the gradient of a residual block's output, which the identity shortcut adds back only after
the whole main branch (and, at a projection block, the main branch reads after the shortcut branch), is
live beside the three full-size inputs of the batch-norm backward ``AddN`` (ResNet-50 at batch 1200 on
v100-16gb-pcie3: 16.18 GiB in the enforced order, four 3.59 GiB tensors at ``conv2_block1_0_bn``; with
the three ``conv2`` block gradients swapped this way, 14.30 GiB).

:func:`swap_across_peak` takes the lowest-need finalist judged in the enforced order, finds the
largest tensor live at its simulated peak with readers that start only after the op running at the peak
ended, and adds a swap of it: the swap-out synchronizes the ops that allocated what is live at the
peak (they wait until the copy to the host ended, so the device buffer is gone when they allocate), and
the swap-in for the late readers is triggered by the latest ordered op ending a copy time before them.
The plan is judged again in the enforced order, up to :data:`PEAK_SWAP_ROUNDS` times while the need
does not rise and nothing fits (ResNet-50's three ``conv2`` blocks peak equally high: the need drops
only once all three are swapped). Swaps and their control edges never change values; a plan whose edges would
close a cycle is not kept.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.ir.topo import reachable
from tflms.ir.op_types import ALIAS_OPS, IDENTITY_REDUCTION_OPS
from tflms.passes.swaps import apply_swaps
from tflms.policies.eligibility import is_inserted
from tflms.policies.swapplan import SwapDecision, SwapInGroup, SwapPlan, skip_reason, swap_op_names
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate

if TYPE_CHECKING:
    from tflms.tune.search import TuneEvaluator

logger = logging.getLogger(__name__)

#: How many tensors :func:`swap_across_peak` adds, one per judged plan (ResNet-50 at batch 1200 needs three).
PEAK_SWAP_ROUNDS = 10
#: Tensors live at the peak smaller than this fraction of the largest one are not considered.
PEAK_SWAP_MIN_FRACTION = 0.25
#: How many producers up :func:`peak_swap` looks for a pinned op to wait for a copy in place of one the
#: order does not pin (ResNet-50: a forward ``Conv2D`` that grappler fuses with its ``BiasAdd``).
PEAK_SWAP_WAIT_DEPTH = 4


def swap_across_peak(ev: TuneEvaluator, cand: Candidate) -> list[Candidate]:
    """Candidates adding swaps of tensors that wait across the enforced order's peak (see the module doc).

    ``ev``: the tuner's evaluator; ``cand``: a candidate judged in the enforced order (``order`` set) that
    does not fit. Not with compressed swaps (``ev.compress``). The new candidates keep ``cand``'s strategy
    and parameters plus ``peak_swaps`` (how many tensors were added); their ``policy`` is ``None`` (no
    policy makes their plan: the pipeline applies ``plan``). Returns the candidates added (each also in
    ``ev.candidates``), the last one lowest.
    """
    from tflms.passes.order import enforce_order
    from tflms.schedule import ordered_ops
    from tflms.tune.search import record_ordered
    added: list[Candidate] = []
    if ev.compress is not None:  # the new plans would be judged without the compression the winner gets
        return added
    if cand.plan is not None and cand.plan.recomputes:  # its swaps were planned on the recomputed graph
        return added
    best = cand
    for _ in range(PEAK_SWAP_ROUNDS):
        if best.fits or best.plan is None:
            break
        graph = ev.graph_of(best)
        names = [r.name for r in sorted(best.sim.ops, key=lambda r: (r.start_s, r.end_s)) if r.name in graph]
        listed = set(names)
        ordered = set(ordered_ops(graph, names + [op.name for op in graph if op.name not in listed],
                                  ev.sim_options))
        decision = peak_swap(graph, best.sim, best.plan, ordered, ev.profile, ev.analysis)
        if decision is None:
            break
        known = any(s.tensor == decision.tensor for s in best.plan.swaps)
        swaps = tuple(decision if s.tensor == decision.tensor else s for s in best.plan.swaps)
        plan = dataclasses.replace(best.plan, swaps=swaps if known else swaps + (decision,))
        try:
            new = apply_swaps(ev.analysis.graph, plan, copy_op=ev.copy_op).graph
            new.topological_order()
            result = enforce_order(new, ev.profile, options=ev.sim_options)
        except GraphError as exc:  # the sync or trigger edges would close a cycle
            logger.debug("peak swap of %s not kept: %s", decision.tensor, exc)
            break
        if not result.changed:
            break
        sim = result.report.ordered_sim
        need = ev.need(sim)
        if need > ev.need(best.sim):  # equal is progress: another join of the same size may peak as high
            break
        params = {**best.params, "peak_swaps": best.params.get("peak_swaps", 0) + 1}
        what = (f"waiting for the copy of {decision.tensor} at the ordered peak" if known
                else f"swapping {decision.tensor} across the ordered peak")
        best = record_ordered(ev, best.strategy, params, plan, sim, result.report, new, None, what)
        added.append(best)
    return added


def peak_swap(graph: Graph, sim: SimResult, plan: SwapPlan, ordered: set[str], profile,
              analysis) -> SwapDecision | None:
    """The swap of the largest tensor live at ``sim``'s peak whose late readers can wait a copy, or ``None``.

    ``graph``: the rewritten graph ``sim`` simulated (its order edges aside: same ops); ``ordered``: the
    ops the order pins (the only ones given control edges, see :func:`tflms.schedule.ordered_ops`);
    ``analysis``: the original graph's (its levels, and the never-swap rules and the user's filters of
    :func:`~tflms.policies.swapplan.skip_reason`, under ``plan``'s config and accelerator, which a new
    swap obeys like every other).
    """
    levels = analysis.levels
    span = sim.op_spans("compute")
    peak_t = sim.peak_time_s
    running = [e for s, e in span.values() if s <= peak_t < e]
    peak_end = max(running, default=peak_t)
    owner = sim.buffer_owner
    by_owner: dict[str, list[str]] = {}
    for tensor, buf in owner.items():
        by_owner.setdefault(buf, []).append(tensor)
    swapped = {s.tensor.name: s for s in plan.swaps}
    copy_end = {name: end for name, (_, end) in sim.op_spans("d2h").items()}
    live = [(buf, n) for buf, n in sim.live_at_peak]
    if not live:
        return None
    floor = live[0][1] * PEAK_SWAP_MIN_FRACTION
    values = {}  # buffer -> the tensor it holds at the peak
    for buf, nbytes in live:
        if nbytes < floor:
            continue
        held = [t for t in [buf] + by_owner.get(buf, [])
                if _produced(graph, t, span, peak_t) and not _is_alias(graph, t, owner)]
        if held:
            values[buf] = max(held, key=lambda t: (span[TensorRef.parse(t).op][0], t))
    for buf, nbytes in live:
        value = values.get(buf)
        if value is None or is_inserted(TensorRef.parse(value).op):
            continue
        ref = TensorRef.parse(value)
        if value in swapped:
            # swapped, but its copy to the host has not ended: the ops allocating at the peak wait for it
            lagging = swapped[value]
            if copy_end.get(lagging.swap_out, 0.0) <= peak_t:
                logger.debug("%s: swapped, its copy to the host ended before the peak", value)
                continue
            sync = _peak_allocators(graph, live, floor, buf, span, peak_t, ordered, span[ref.op][1],
                                    {c for g in lagging.swap_ins for c in g.consumers})
            sync = sorted(set(sync) - set(lagging.sync_out_consumers))
            if sync:
                return dataclasses.replace(lagging, sync_out_consumers=tuple(
                    sorted(set(lagging.sync_out_consumers) | set(sync))))
            logger.debug("%s: swapped, no op at the peak can wait for its copy", value)
            continue
        reason = (skip_reason(analysis, ref, plan.config, plan.accelerator_device) if ref.op in analysis.graph
                  else ("not-original", "made by the rewrite"))
        if reason is not None:
            logger.debug("%s: never swapped (%s)", value, reason[0])
            continue
        info = graph.tensor(ref)
        copy_s = profile.copy_time_s(info.num_bytes or nbytes)
        # late readers may start before the copy could return: the copy then stalls them, which the judge counts
        late, first_late = [], float("inf")
        for consumer, _ in graph.consumers(ref):
            reads = _real_reads(graph, consumer, owner, buf, span)
            # a consumer (or the view it makes) read after the peak and not by the op running at it
            if reads and max(s for s, _ in reads) > peak_end and not any(s <= peak_t < e for s, e in reads):
                late.append(consumer)
                first_late = min([first_late] + [s for s, _ in reads if s > peak_end])
        if not late:
            logger.debug("%s: no reader waits across the peak", value)
            continue
        sync = _peak_allocators(graph, live, floor, buf, span, peak_t, ordered, span[ref.op][1], set(late))
        if not sync:
            logger.debug("%s: no op at the peak can wait for its copy", value)
            continue
        # the trigger must not depend on the late consumers (a view among them may have run before the peak)
        after = _descendants(graph, late)
        pinned = [(s, e, name) for name, (s, e) in span.items() if name in ordered and s >= peak_end
                  and name not in after]
        on_time = [(e, name) for s, e, name in pinned if e <= first_late - copy_s]
        trigger = max(on_time)[1] if on_time else min(pinned, default=(0.0, 0.0, None))[2]
        if trigger is None:
            logger.debug("%s: no ordered op after the peak can trigger its swap-in", value)
            continue
        out_name, in_base = swap_op_names(ref)
        return SwapDecision(
            tensor=ref, dtype=info.dtype, num_bytes=info.num_bytes or nbytes, producer_level=levels.get(ref.op, 0),
            swap_out=out_name, sync_out_consumers=tuple(sync),
            swap_ins=(SwapInGroup(f"{in_base}_0", tuple(sorted(late)), tuple(levels.get(c, 0) for c in sorted(late)),
                                  trigger, levels.get(trigger), sync=False, note="waits across the ordered peak"),))
    return None


def _peak_allocators(graph: Graph, live, floor: float, buf: str, span, peak_t: float, ordered: set[str],
                     made: float, readers: set[str]) -> list[str]:
    """The ops that can wait for ``buf``'s copy to the host so that it is gone at the peak: those that
    allocated what is live at the peak (besides ``buf``) or run at it, started after the value was made
    (``made``) and are not its ``readers``. An op the order does not pin (one grappler may fuse into its
    consumer must keep its control inputs empty) hands the wait to its nearest pinned producers that
    started after ``made``: it cannot start before they end."""
    sync, seen = set(), set()
    stack = sorted({TensorRef.parse(b).op for b, n in live if n >= floor and b != buf}
                   | {name for name, (s, e) in span.items() if s <= peak_t < e}, key=str)
    for _ in range(PEAK_SWAP_WAIT_DEPTH):
        above = []
        for name in stack:
            if name in seen or name not in span or span[name][0] < made or name in readers:
                continue
            seen.add(name)
            if name in ordered:
                sync.add(name)
            else:
                above += [t.op for t in graph.op(name).inputs]
        stack = above
    return sorted(sync, key=str)


def _descendants(graph: Graph, names: list[str]) -> set[str]:
    """``names`` and every op reachable from them."""
    return reachable(names, graph.adjacency()[1])


def _produced(graph: Graph, tensor: str, span, peak_t: float) -> bool:
    op = TensorRef.parse(tensor).op
    return op in graph and op in span and span[op][0] <= peak_t


def _is_alias(graph: Graph, tensor: str, owner) -> bool:
    """Whether ``tensor`` is a view of its op's input buffer (an alias op or a reduction that reduces nothing)."""
    op = graph.op(TensorRef.parse(tensor).op)
    if op.type not in ALIAS_OPS and op.type not in IDENTITY_REDUCTION_OPS:
        return False
    return bool(op.inputs) and owner.get(op.inputs[0].name) == owner.get(tensor)


def _real_reads(graph: Graph, consumer: str, owner, buf: str, span) -> list[tuple[float, float]]:
    """``(start, end)`` of ``consumer`` or, if it only makes a view of ``buf``, of the ops reading through it."""
    stack, seen, reads = [consumer], set(), []
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        op = graph.op(name)
        views = [t.name for t in (op.output(k) for k in range(len(op.outputs)))
                 if owner.get(t.name) == buf and _is_alias(graph, t.name, owner)]
        if not views:
            if name in span:
                reads.append(span[name])
            continue
        for view in views:
            stack.extend(c for c, _ in graph.consumers(TensorRef.parse(view)))
    return reads
