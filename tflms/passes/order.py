"""The order pass: pin a memory-aware execution order with control edges, when it lowers the peak.

:func:`enforce_order` runs after the swaps, the compression and the placement (docs/design.md,
"Enforced order"): it asks :func:`tflms.schedule.schedule_order` for the order with the lowest
simulated peak, derives the fewest control edges that make TensorFlow run the ordered ops that way
(:func:`tflms.schedule.order_edges`) and adds them (:func:`tflms.schedule.add_order_edges`).

The edges are kept only if they pay: the graph *with* the edges, simulated in its own level order
(what the edges alone enforce), must peak strictly lower than the input graph in level order (the
order the simulator and the tuner assume without edges). Otherwise the input graph is returned
unchanged and the report says why. Order edges never change values (the ordered ops exclude
the ones grappler would fuse differently, see ``tflms.schedule.edges``) and never close a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tflms.ir.graph import Graph
from tflms.passes.result import PassResult
from tflms.schedule import add_order_edges, order_edges, schedule_with_report
from tflms.schedule.edges import DEFAULT_MIN_BYTES
from tflms.sim.simulator import SimOptions, SimResult, simulate


@dataclasses.dataclass(frozen=True)
class OrderReport:
    """What :func:`enforce_order` did.

    ``edges``: the control edges added (``(before, after)`` op names; empty when not applied);
    ``applied``: whether they were added; ``heuristic``: the schedule chosen
    (:data:`tflms.schedule.HEURISTICS`); ``level_peak_bytes``: the simulated peak of the input graph in
    level order; ``ordered_peak_bytes``: the simulated peak with the edges (``None`` when no schedule
    beat level order, so no edges were tried); ``why``: one sentence.
    """

    edges: tuple[tuple[str, str], ...]
    applied: bool
    heuristic: str
    level_peak_bytes: int
    ordered_peak_bytes: int | None
    why: str
    #: the simulation of the graph with the edges (``None`` when no edges were tried); not in :meth:`to_dict`
    ordered_sim: SimResult | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    def to_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "edges": len(self.edges), "heuristic": self.heuristic,
                "level_peak_bytes": self.level_peak_bytes, "ordered_peak_bytes": self.ordered_peak_bytes,
                "why": self.why}


def enforce_order(graph: Graph, profile: Any, *, options: SimOptions | None = None,
                  min_bytes: int = DEFAULT_MIN_BYTES, fusion_safe: bool = True,
                  level_peak_bytes: int | None = None) -> PassResult:
    """Add the control edges of the lowest-peak schedule of ``graph`` on ``profile``, if they lower its peak.

    Returns a :class:`PassResult` whose report is an :class:`OrderReport`; ``graph`` itself when nothing
    is added (``changed`` False). ``options`` are the simulator's (host device, pruning); ``min_bytes`` and
    ``fusion_safe`` choose the ordered ops (:func:`tflms.schedule.ordered_ops`; keep ``fusion_safe`` for
    bitwise training); when the edges among ops of ``min_bytes`` leave the simulated peak above the
    schedule's, every op the fusion rules allow is ordered instead, if that simulates lower. ``level_peak_bytes``: the simulated peak of ``graph`` in level order with these
    ``options``, when the caller has it (the tuner does), so it is not simulated again.
    """
    options = options or SimOptions()
    level_peak = (simulate(graph, profile, options=options).peak_bytes if level_peak_bytes is None
                  else level_peak_bytes)
    chosen = schedule_with_report(graph, options=options, profile=profile)
    best = chosen.peak_bytes
    if chosen.chosen == "level" or best >= chosen.peaks.get("level", level_peak):
        return PassResult(graph, False, OrderReport((), False, chosen.chosen, level_peak, None,
                                                    "no schedule peaks lower than level order: no edges"))
    edges = order_edges(graph, list(chosen.order), options=options, min_bytes=min_bytes,
                        fusion_safe=fusion_safe, model=chosen.model)
    if not edges:
        return PassResult(graph, False, OrderReport((), False, chosen.chosen, level_peak, None,
                                                    "no edge needed: the graph's own edges already order every "
                                                    "op large enough to order"))
    ordered = add_order_edges(graph, edges)
    ordered_sim = simulate(ordered, profile, options=options)
    if ordered_sim.peak_bytes > best and min_bytes > 1:
        # The edges between large ops left a small op free whose place matters: on VGG-16 (batch 362, an
        # ungrouped distance plan) the bias gradient's Reshape after BiasAddGrad (fusion-safe rules do not
        # order BiasAddGrad itself): unordered, BiasAddGrad ran late and kept a 4.3 GiB gradient live,
        # 21.0 GiB with 61 edges against 14.1 GiB with 84. Order every op the fusion rules allow (as
        # tools/schedule_report.py --bitwise-min-bytes 1 checked bitwise on ResNet-50) when that is lower.
        fine = order_edges(graph, list(chosen.order), options=options, min_bytes=1, fusion_safe=fusion_safe,
                           model=chosen.model)
        if fine and fine != edges:
            fine_graph = add_order_edges(graph, fine)
            fine_sim = simulate(fine_graph, profile, options=options)
            if fine_sim.peak_bytes < ordered_sim.peak_bytes:
                edges, ordered, ordered_sim = fine, fine_graph, fine_sim
    ordered_peak = ordered_sim.peak_bytes
    if ordered_peak >= level_peak:
        return PassResult(graph, False, OrderReport((), False, chosen.chosen, level_peak, ordered_peak,
                                                    "the edges alone do not lower the simulated peak: not added",
                                                    ordered_sim=ordered_sim))
    return PassResult(ordered, True, OrderReport(tuple(edges), True, chosen.chosen, level_peak, ordered_peak,
                                                 f"{len(edges)} order edges ({chosen.chosen} schedule) lower the "
                                                 "simulated peak", ordered_sim=ordered_sim))


#: How a budgeted rewrite holds TensorFlow's executor to its verdict (``RewriteReport.order["guarantee"]``).
GUARANTEE_PINNED = "pinned"  # control edges make the executor run the order the verdict was simulated in
GUARANTEE_ANY_ORDER = "any-order"  # no edges needed: every order peaks at most the bound, within the budget
GUARANTEE_NONE = "not-guaranteed"  # the executor may take another order, peaking up to the bound


def apply_tuned_order(graph: Graph, verdict: dict[str, Any] | None, profile: Any, *,
                      options: SimOptions | None = None) -> tuple[Graph, dict[str, Any] | None]:
    """The order the tuner judged its winner in, on the graph that will run; returns ``(graph, order record)``.

    ``verdict``: the winner's order record (``Candidate.order``). The tuner judged each finalist with and
    without the order pass's edges; the pass runs only when the winner was the ordered one, so that what
    runs is what was predicted. A winner whose order was pinned before the swaps
    (:func:`tflms.tune.search.search_order_first`) already has its edges, and no pass may add others. A
    winner judged without edges gets ``(graph, None)`` (:func:`hold_to_budget` decides what it needs).
    """
    if verdict is None or not verdict["applied"]:
        return graph, None
    if verdict.get("before_swaps"):
        return graph, verdict
    ordered = enforce_order(graph, profile, options=options)
    ordered.graph.lint()
    return ordered.graph, ordered.report.to_dict()


def pin_level_order(graph: Graph, *, options: SimOptions | None = None,
                    min_bytes: int = DEFAULT_MIN_BYTES) -> PassResult:
    """Pin ``graph``'s level order, the order the simulator and the tuner judge a graph in without edges.

    The fewest control edges that make the ordered ops (:func:`tflms.schedule.edges.ordered_ops`, fusion-safe)
    run in level order. Returns a :class:`PassResult` whose report is an :class:`OrderReport`
    (``heuristic`` ``"level"``); ``graph`` itself when its own edges already order those ops.
    """
    options = options or SimOptions()
    level = schedule_with_report(graph, options=options, heuristics=("level",))
    edges = order_edges(graph, list(level.order), options=options, min_bytes=min_bytes, model=level.model)
    peak = level.peaks["level"]
    if not edges:
        return PassResult(graph, False, OrderReport((), False, "level", peak, None,
                                                    "no edge needed: the graph's own edges already run its large "
                                                    "ops in level order"))
    return PassResult(add_order_edges(graph, edges), True, OrderReport(
        tuple(edges), True, "level", peak, peak, f"{len(edges)} order edges pin level order, in which the plan "
                                                 "was judged"))


def hold_to_budget(graph: Graph, order: dict[str, Any] | None, *, budget_bytes: int,
                   options: SimOptions | None = None, pin: bool = True,
                   profile: Any = None) -> tuple[Graph, dict[str, Any]]:
    """Make TensorFlow's executor keep a budgeted rewrite under ``budget_bytes`` (issue 31), and say how.

    ``graph``: the rewrite as it will run; ``order``: the order record it already has
    (:meth:`OrderReport.to_dict`, or ``None``). When that record says its edges were applied, the
    verdict's order is pinned already. Otherwise the upper bound over every execution
    (:func:`tflms.sim.footprint.any_order_peak_bound`) decides: within the budget, no order TensorFlow may
    take goes over it and nothing is added; above it, level order is pinned (:func:`pin_level_order`) when
    ``pin``, else the record says the peak is not guaranteed and by how much it could rise. Returns the
    graph to run and the order record with ``guarantee`` (:data:`GUARANTEE_PINNED`,
    :data:`GUARANTEE_ANY_ORDER` or :data:`GUARANTEE_NONE`), ``any_order_bound_bytes`` and ``guarantee_why``.

    On the ``xla-clusters`` clock (a step that keeps XLA, issue 47) the pinning edges are cluster boundaries: they
    cut the clusters the tuner priced. So the pinned step is simulated again on ``profile``; where it no longer fits,
    nothing is pinned, and the record says why (``pinned_peak_bytes``).
    """
    from tflms.sim.footprint import any_order_peak_bound
    from tflms.units import format_bytes
    record = dict(order or {})
    if record.get("applied"):
        record.update(guarantee=GUARANTEE_PINNED, any_order_bound_bytes=None,
                      guarantee_why="the order the plan was judged in is pinned by control edges")
        return graph, record
    bound = any_order_peak_bound(graph, options)
    record["any_order_bound_bytes"] = bound.bound_bytes
    if bound.bound_bytes <= budget_bytes:
        record.update(guarantee=GUARANTEE_ANY_ORDER, guarantee_why=(
            f"no order pinned: in any order TensorFlow may take, the step peaks at most "
            f"{format_bytes(bound.bound_bytes)} (an upper bound), within the budget {format_bytes(budget_bytes)}"))
        return graph, record
    if pin:
        pinned = pin_level_order(graph, options=options)
        clustered = _clustered_sim(pinned.graph, options, profile)
        cut = None if clustered is None or clustered.peak_with_margin_bytes <= budget_bytes else \
            clustered.peak_with_margin_bytes
        if cut is not None:
            record.update(guarantee=GUARANTEE_NONE, pinned_peak_bytes=cut, guarantee_why=(
                f"the peak is not guaranteed: pinning level order ({pinned.report.num_edges} edges) would cut the "
                f"step's XLA clusters, and the step would then need {format_bytes(cut)} (simulated), over the budget "
                f"{format_bytes(budget_bytes)}; so nothing is pinned, and TensorFlow's executor may run another order "
                f"than the one simulated, peaking up to {format_bytes(bound.bound_bytes)} (an upper bound over "
                f"every order, at {bound.op})"))
            return graph, record
        record.update(pinned.report.to_dict())
        held, waits = _wait_for_swap_outs(pinned.graph, options, profile, pinned.report.edges, before=clustered)
        record.update(guarantee=GUARANTEE_PINNED, swap_out_waits=len(waits), guarantee_why=(
            f"level order pinned ({pinned.report.num_edges} edges"
            + (f", and {len(waits)} more for the swap-outs to end where simulated" if waits else "")
            + f"): unpinned, another order could peak up to {format_bytes(bound.bound_bytes)}, over the budget "
            f"{format_bytes(budget_bytes)}"))
        return held, record
    record.update(guarantee=GUARANTEE_NONE, guarantee_why=(
        f"the peak is not guaranteed: no order is pinned (enforce_order off), and TensorFlow's executor may take "
        f"another order than the one simulated, peaking up to {format_bytes(bound.bound_bytes)} (an upper bound "
        f"over every order, at {bound.op}) against the budget {format_bytes(budget_bytes)}"))
    return graph, record


def _wait_for_swap_outs(pinned: Graph, options: SimOptions | None, profile: Any,
                        chain: Sequence[tuple[str, str]] = (), before: SimResult | None = None
                        ) -> tuple[Graph, list[tuple[str, str]]]:
    """On the ``xla-clusters`` clock, the pinned step with each swap-out waited for by the first unit (a cluster's
    first op, or an op outside them) that its simulation starts after the copy ends, among the units the pinning
    edges ``chain`` order (so that every unit after it waits too); and those edges. The step as given, and none,
    elsewhere. Edges that would change the simulated step are left out (where all of them do, each is simulated
    on its own: one simulation per swap-out at most).

    Pinning level order orders the compute ops, not when a copy to the host ends, and a buffer a swap-out reads is
    freed only then: where the copy runs late (on the emulated machine, a copy waits for the executor's threads), the
    next cluster's buffers arrive beside it (issue 47, item 5: BERT's pinned plan, 2 MiB over its simulation in every
    run). The simulation already has the copy end first, so these edges cost it nothing; a copy slower than
    simulated then delays compute instead of raising the peak. ``before``: the pinned step's simulation
    (:func:`_clustered_sim`'s), where the caller has it."""
    import bisect

    from tflms.ir.op_types import FREE_OPS
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    from tflms.sim.simulator import kernel_reads
    if before is None:
        before = _clustered_sim(pinned, options, profile)
    if before is None or before.clock != CLOCK_XLA_CLUSTERS:
        return pinned, []
    first = kernel_reads(pinned, profile, options).cluster_first  # an edge into a cluster waits for all of it
    ordered = {first.get(name, name) for edge in chain for name in edge}  # a unit's first op
    compute = sorted((op.start_s, op.name) for op in before.ops if op.stream == "compute" and op.name in ordered and (
        op.name in first or pinned.op(op.name).type not in FREE_OPS))
    edges = []
    for op in before.ops:
        if op.stream == "d2h":
            k = bisect.bisect_left(compute, (op.end_s, ""))
            if k < len(compute):
                edges.append((op.name, compute[k][1]))

    def unchanged(candidate: list[tuple[str, str]]) -> Graph | None:
        held = add_order_edges(pinned, candidate)
        after = simulate(held, profile, options=options)
        return held if (after.peak_with_margin_bytes <= before.peak_with_margin_bytes
                        and after.step_time_s <= before.step_time_s * (1 + 1e-9)) else None

    if not edges:
        return pinned, []
    held = unchanged(edges)
    if held is None:  # keep the edges that change nothing on their own (a unit the simulation starts as the copy ends)
        edges = [edge for edge in edges if unchanged([edge]) is not None]
        held = unchanged(edges) if edges else None
    return (pinned, []) if held is None else (held, edges)


def _clustered_sim(pinned: Graph, options: SimOptions | None, profile: Any) -> SimResult | None:
    """The pinned step simulated on the ``xla-clusters`` clock, whose clusters its pinning edges may cut (to check
    that it still fits, and where its swap-outs end); ``None`` on other clocks or without a profile."""
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    if profile is None or options is None or options.clock != CLOCK_XLA_CLUSTERS:
        return None
    return simulate(pinned, profile, options=options)
