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
