"""HOLD: the tuned rewrite, held to its budget in TensorFlow's executor (issues 31 and 47).

The tuner judged its winner in one order; the executor runs any order the graph's edges allow.
:func:`tflms.passes.order.hold_to_budget` holds it: pinned already, proved for every order, pinned now, or said. On
the ``xla-clusters`` clock a pinning edge is a cluster boundary, so a winner close to its budget may fit only
unpinned, and then nothing holds the executor to what was simulated. BERT (the zoo's, at 0.65 of its clustered
transient on the emulated machine, `tools/validate_xla_memory.py --models bert`), while the tune gave three misses
swaps (:data:`tflms.tune.hybrid.HYBRIDS`): its fastest fit, a hybrid at 48.2 ms, 22.4 MiB against a budget of 23.9
(with the margin), needed 24.7 pinned; unpinned, its runs peaked at 26.2 and 30.2 MiB in the executor (resident
bytes included). Where the step keeps XLA, :func:`held` judges the next fastest fits that leave room for
what pinning cost the winner, in order, and takes the first the executor can be held to (at most
:data:`ALTERNATIVES`); the report says which plan it passed over and why (``order["held_instead_of"]``). Where none
can be held, the winner runs as before, with the warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tflms.ir.graph import Graph
from tflms.passes import PassResult, apply_swaps, place_swaps
from tflms.passes.swaps import DEFAULT_COPY_OP
from tflms.passes import order as order_pass
from tflms.passes.order import GUARANTEE_NONE, apply_tuned_order
from tflms.tune.result import Candidate, TuneResult

#: Fitting plans :func:`held` judges after a winner that cannot be held, fastest first.
ALTERNATIVES = 3


def held(placed: PassResult, ordered: Graph, order: dict[str, Any] | None, result: TuneResult, profile: Any,
         options: Any, *, pin: bool, xla: bool, copy_op: str, compress: Callable[[Graph, Any], Graph] | None = None,
         ) -> tuple[Graph, dict[str, Any], TuneResult, bool, PassResult]:
    """The step to run for ``result``'s winner (``placed``: its rewrite with the swaps placed; ``ordered`` and
    ``order``: that graph with its tuned order applied, :func:`~tflms.passes.order.apply_tuned_order`) held to the
    budget; returns ``(graph, order record, result, pinned here, placed)``. ``result`` is the tune's, or, where the
    winner of a step that keeps XLA (``xla``) cannot be held and another fit can, the same with that fit as its best
    (its ``graph`` that fit's rewrite, ``placed`` its placement); ``pinned here``: whether holding added the edges.
    ``compress``: the tune's compressor, applied to another fit's rewrite as the tune applied it."""
    final, order, pinned = _guard(ordered, order, result.budget_bytes, profile, options, pin)
    if not (xla and pin and order["guarantee"] == GUARANTEE_NONE):
        return final, order, result, pinned, placed
    for cand in alternatives(result, order.get("pinned_peak_bytes")):
        graph = apply_swaps(result.analysis.graph, cand.plan, copy_op=copy_op).graph
        if compress is not None:
            graph = compress(graph, cand.plan)
        other, ordered, other_order = _placed_and_ordered(graph, cand, profile, options)
        tried, record, by_hold = _guard(ordered, other_order, result.budget_bytes, profile, options, pin)
        if record["guarantee"] != GUARANTEE_NONE:
            record["held_instead_of"] = {
                "strategy": result.best.strategy, "params": result.best.params,
                "predicted_step_time_s": result.best.sim.step_time_s, "why": order["guarantee_why"]}
            record["guarantee_why"] += (
                f"; this plan ({cand.sim.step_time_s * 1e3:.1f} ms a step, simulated) runs instead of the fastest "
                f"found ({result.best.strategy}, {result.best.sim.step_time_s * 1e3:.1f} ms), which could not be "
                f"held: {order['guarantee_why']}")
            return tried, record, dataclasses.replace(result, best=cand, graph=graph), by_hold, other
    return final, order, result, pinned, placed


def hold_tuned(result: TuneResult, profile: Any, options: Any, *, copy_op: str = DEFAULT_COPY_OP,
               ) -> tuple[TuneResult, dict[str, Any]]:
    """What the pipeline runs for ``result``, the tune of a step that keeps XLA with its order pinned (the default,
    ``LMSConfig.orders``), on ``options`` (its clock and cuts, as tuned): ``result``, or the same with the fit
    :func:`held` takes instead, and the order record (``guarantee``, and ``held_instead_of`` where another fit runs).
    The pipeline's steps from the tune's rewrite (placed, its tuned order applied, held), without TensorFlow: for
    tools that price the tune's choice (tools/benchlib/xla.py)."""
    plan = result.best.plan
    if result.graph is not None:
        swapped = result.graph
    elif plan is None:  # (the unswapped step won)
        swapped = result.analysis.graph
    else:
        swapped = apply_swaps(result.analysis.graph, plan, copy_op=copy_op).graph
    placed, ordered, order = _placed_and_ordered(swapped, result.best, profile, options)
    _, order, after, _, _ = held(placed, ordered, order, result, profile, options, pin=True, xla=True, copy_op=copy_op)
    return after, order


def _placed_and_ordered(graph: Graph, cand: Candidate, profile: Any, options: Any,
                        ) -> tuple[PassResult, Graph, dict[str, Any] | None]:
    """``graph``, ``cand``'s rewrite, as the pipeline runs it before holding: its swaps placed (none to place for the
    unswapped step) and its tuned order applied; ``(placement, ordered graph, order record)``."""
    placed = PassResult(graph, False, None) if cand.plan is None else place_swaps(graph, cand.plan)
    return (placed, *apply_tuned_order(placed.graph, cand.order, profile, options=options))


def alternatives(result: TuneResult, pinned_peak: int | None = None) -> list[Candidate]:
    """The fits after ``result``'s winner that may be held, fastest first, at most :data:`ALTERNATIVES`: their plans
    differ from the winner's, and where pinning the winner's level order needed ``pinned_peak`` bytes, each leaves
    at least as much room under the budget as that pinning added to the winner's peak (pinning one step's plans
    costs each about as much: BERT above, 2.4 MiB on the winner, 2.0 to 6.0 on the sixteen next fastest, all over;
    the first with that much room held; each ``pinned_peak_bytes`` of the order record, read by a scratch script)."""
    best = result.best
    added = max(0, (pinned_peak or 0) - best.sim.peak_with_margin_bytes)
    fits = sorted((c for c in result.candidates if c.fits and c.plan is not None and c is not best
                   and c.plan != best.plan and result.budget_bytes - c.sim.peak_with_margin_bytes >= added),
                  key=lambda c: c.sim.step_time_s)
    return fits[:ALTERNATIVES]


def _guard(graph: Graph, order: dict[str, Any] | None, budget: int, profile: Any, options: Any,
           pin: bool) -> tuple[Graph, dict[str, Any], bool]:
    """:func:`~tflms.passes.order.hold_to_budget` on ``graph`` (its tuned order applied, ``order`` that pass's
    record), and whether holding added the edges (the order pass may run and add nothing)."""
    before = bool(order and order.get("applied"))
    final, order = order_pass.hold_to_budget(graph, order, budget_bytes=budget, options=options, pin=pin,
                                             profile=profile)
    return final, order, bool(order.get("applied")) and not before


def held_plan(plan: Any, before: TuneResult, after: TuneResult) -> Any:
    """The plan to report once :func:`held` took another fit: that fit's plan, with the warnings the pipeline added
    to the winner's (filters, no GPU) in front."""
    if after.best is before.best:
        return plan
    added = tuple(w for w in plan.warnings if w not in before.best.plan.warnings)
    return dataclasses.replace(after.best.plan, warnings=added + after.best.plan.warnings)

