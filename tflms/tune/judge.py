"""One tune's judge: how every search plans, simulates, fits and records a candidate (:class:`TuneEvaluator`).

It holds what every candidate is judged against (the analysis, the profile, the budgets, how fit is judged:
:data:`FIT_BY_LIVE` or :data:`FIT_BY_BFC`), simulates swap plans incrementally
(:class:`~tflms.tune.evaluator.PlanEvaluator`, memoized by plan), records the candidates, and answers the lower
bounds that let the searches skip what cannot win (the swap floor, a recomputed step's floor). The searches that
use it are :mod:`tflms.tune.search`'s, :mod:`tflms.tune.finalists`', :mod:`tflms.tune.hybrid`'s and the others of
:mod:`tflms.tune`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph
from tflms.config import LMSConfig
from tflms.passes.result import PassResult
from tflms.passes.swaps import apply_swaps
from tflms.policies.base import PlanContext, SwapPolicy, TflmsRules
from tflms.policies.idle_time import scored_candidates
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import HardwareProfile
from tflms.sim.bounds import AnyOrderTimeBound, any_order_time_bound
from tflms.sim.simulator import SimOptions, SimResult, gc_paused, simulate
from tflms.tune.evaluator import PlanEvaluator
from tflms.tune.result import Candidate
from tflms.ir.graph import Graph
from tflms.units import format_bytes

#: How "fits" is judged: the live-bytes peak, or what TensorFlow's BFC allocator (modelled) would reserve.
FIT_BY_LIVE, FIT_BY_BFC = "live", "bfc"
#: Simulations whose scored idle-time candidates the tuner keeps (the searches revisit the last one or two).
SCORED_MEMO_SIZE = 4
#: Simulations recorded last whose views (``ops``, ``timeline``, ...) the tuner keeps built
#: (:meth:`TuneEvaluator.record`).
VIEWS_KEPT = 4


#: Where :meth:`TuneEvaluator.analyzed` keeps, in an analysis's ``__dict__`` (as :func:`functools.cached_property`
#: keeps its values), what a tune of that analysis may take as known (a :class:`_Known`).
_KNOWN = "_known_to_tune"


@dataclasses.dataclass(frozen=True)
class _Known:
    """What a nested tune of an analysis may take as known (:meth:`TuneEvaluator.analyzed`): its ops' prices on
    ``profile`` (op name -> seconds), and, where the outer tune simulated the analysis's graph itself, that simulation
    (level order, ``options``)."""

    profile: HardwareProfile
    op_times_s: dict[str, float]
    options: SimOptions
    sim: SimResult | None


def known_op_times(analysis: Analysis, profile: HardwareProfile) -> dict[str, float] | None:
    """Op name -> seconds on ``profile`` known for ``analysis``'s ops (:meth:`TuneEvaluator.analyzed`), or ``None``."""
    known = analysis.__dict__.get(_KNOWN)
    return known.op_times_s if known is not None and known.profile is profile else None


def known_simulation(analysis: Analysis, profile: HardwareProfile, options: SimOptions) -> SimResult | None:
    """The simulation of ``analysis``'s graph on ``profile`` with ``options`` (level order) known already
    (:meth:`TuneEvaluator.analyzed`), or ``None``."""
    known = analysis.__dict__.get(_KNOWN)
    return (known.sim if known is not None and known.profile is profile and known.options is options
            else None)


class TuneEvaluator:
    """One tune's judge: every search plans, simulates and records its candidates through it.

    It holds what every candidate is judged against (the analysis, the profile, the budgets, the base config,
    the accelerator and copy op), a :class:`~tflms.tune.evaluator.PlanEvaluator` that simulates swap plans of
    the base graph incrementally (plans with recomputes on their rewritten graph), the candidates recorded so
    far, and the rewritten graphs built for them. :meth:`evaluate` plans a policy and records it;
    :meth:`record` records a plan made elsewhere (the recompute search, pruning, the order pass)."""

    def __init__(self, analysis: Analysis, profile: HardwareProfile, budget: int, host_budget: int,
                 sim_options: SimOptions, base_config: LMSConfig, accelerator: str, copy_op: str,
                 progress: Callable[[str], None] | None):
        self.analysis, self.profile, self.budget, self.host_budget = analysis, profile, budget, host_budget
        self.sim_options, self.base_config, self.accelerator, self.copy_op = (sim_options, base_config,
                                                                             accelerator, copy_op)
        self.progress = progress
        self.fit_by = FIT_BY_LIVE
        self.compress: Callable[[Graph, SwapPlan], Graph] | None = None
        self.candidates: list[Candidate] = []
        self.graphs: dict[int, Graph] = {}  # rewritten graphs by id(candidate), built by graph_of
        # candidates whose rewritten graph is known runnable, by id; the last nested tune's winner (:meth:`nested_winner`)
        self._runnable: dict[int, Candidate] = {}
        self._nested: tuple[Candidate, Graph, Graph] | None = None
        # Candidates are simulated incrementally (no IR copy per plan, memoized by plan).
        self.plans = PlanEvaluator(analysis.graph, profile, sim_options, copy_op=copy_op,
                                   topological_order=analysis.order,
                                   known_op_times_s=known_op_times(analysis, profile))
        known = known_simulation(analysis, profile, sim_options)
        if known is not None:
            self.plans.remember(None, known)
        #: what the policies are given besides the analysis and the config (``baseline`` set once simulated)
        self.context = PlanContext(accelerator, profile)
        self._scored: dict[int, tuple[SimResult, list]] = {}  # id(sim) -> (sim, its scored idle candidates)
        self._recent: collections.deque[SimResult] = collections.deque()  # the last sims recorded, views kept
        self._ordered_base: PassResult | None = None
        self._swap_floor: AnyOrderTimeBound | None = None
        self._swap_floor_whole = False
        self._cut: str | None = None  # the op :meth:`cannot_fit_ordered` bounds at ("": none), once asked

    def analyzed(self, graph: Graph, recompute: Candidate) -> Analysis:
        """The analysis of ``graph``, this tune's step with the recomputes of ``recompute`` (a candidate; the graph
        perhaps with the edges of an order), for a nested tune: with its ops' prices known (:func:`known_op_times`),
        those of the step this tune priced already. An op the recomputes left as it was costs what it cost, and a
        clone what its original costs: the same type, attributes and tensors (a reader rewired to a clone reads a
        tensor of the same facts). Where ``graph`` is the candidate's own rewritten graph (:meth:`graph_of`) and its
        simulation this tune's evaluator's, that simulation is known too (:func:`known_simulation`): the evaluator
        answers what simulating the rewritten graph answers (:mod:`tflms.tune.evaluator`)."""
        analysis = analyze_graph(graph)
        times = self.plans.op_times()
        for decision in recompute.plan.recomputes:
            times.update(zip(decision.clones, map(times.__getitem__, decision.ops)))
        own = (recompute.order is None and self.compress is None and self.graphs.get(id(recompute)) is graph
               and self.plans.remembered(recompute.plan) is recompute.sim)
        analysis.__dict__[_KNOWN] = _Known(self.profile, times, self.sim_options, recompute.sim if own else None)
        return analysis

    def ordered_base(self) -> PassResult:
        """The unswapped step through the order pass (:func:`~tflms.passes.order.enforce_order`), once: the
        order-first search orders it before its swaps, and :func:`judge_ordered` judges it as a finalist (on
        ResNet-50 at batch 32, half a second each)."""
        if self._ordered_base is None:
            from tflms.passes.order import enforce_order
            self._ordered_base = enforce_order(self.analysis.graph, self.profile, options=self.sim_options,
                                               level_peak_bytes=self.context.baseline.peak_bytes)
        return self._ordered_base

    def swap_floor_above(self, limit: float) -> bool:
        """Whether no swap-only plan of the step that fits the budget takes less than ``limit`` seconds, in any order
        (:func:`~tflms.sim.bounds.any_order_time_bound` of the unswapped step, its scan stopped at the first op whose
        floor exceeds ``limit``; kept, :attr:`swap_floor`). ``False`` where fit is judged by the BFC model, whose
        need the bound does not know. A plan fits when its peak with the margin is within the budget, so its live
        bytes are within the budget less ``margin_bytes``. On ResNet-50 at batch 32 (8,489 ops) 0.07 s where the
        first op answers, 0.19 s for the whole scan."""
        if not self.floors_hold():
            return False
        floor = self._swap_floor
        if floor is None or (floor.floor_s <= limit and not self._swap_floor_whole):
            floor = self._swap_floor = self.floor_of(self.analysis.graph, self.context.baseline, limit)
            self._swap_floor_whole = floor.floor_s <= limit  # (the scan ran to its end: the largest floor)
        return floor.floor_s > limit

    def floor_above(self, graph: Graph, sim: SimResult, limit: float) -> bool:
        """Whether no swap-only rewrite of ``graph`` (a recomputed step, simulated as ``sim``) that fits takes less
        than ``limit`` seconds, in any order (:meth:`floor_of`; ``False`` for an infinite limit, or where fit is judged
        by the BFC model)."""
        return (self.floors_hold() and limit < float("inf")
                and self.floor_of(graph, sim, limit).floor_s > limit)

    def floors_hold(self) -> bool:
        """Whether the any-order floor bounds this tune's plans: not where fit is judged by the BFC model (the bound
        does not know its need), nor on a clock that prices XLA's fusions (``xla``, ``xla-clusters``): the floor's cuts
        give every tensor a buffer, where XLA gives a fused one none, and a cluster boundary changes what fuses, so
        the floor could stand above a plan that fits."""
        from tflms.sim.clock import XLA_CLOCKS
        return self.fit_by == FIT_BY_LIVE and self.sim_options.clock not in XLA_CLOCKS

    def floor_of(self, graph: Graph, sim: SimResult, above: float | None = None) -> AnyOrderTimeBound:
        """:func:`~tflms.sim.bounds.any_order_time_bound` of ``graph`` (simulated as ``sim``) at this tune's budget:
        no swap-only rewrite of it that fits is faster, in any order (``above``: the scan stops at the first op whose
        floor exceeds it)."""
        return any_order_time_bound(graph, self.profile, max(1, self.budget - self.sim_options.margin_bytes),
                                    options=self.sim_options, sim=sim, above=above)

    @property
    def swap_floor(self) -> AnyOrderTimeBound | None:
        """The swap floor :meth:`swap_floor_above` computed (``None`` before): no swap-only plan that fits is faster."""
        return self._swap_floor

    def fastest_fit_s(self) -> float:
        """The simulated step time of the fastest candidate recorded so far that fits (infinite when none)."""
        return min((c.sim.step_time_s for c in self.candidates if c.fits), default=float("inf"))

    def cannot_beat(self, cand: Candidate, limit: float) -> bool:
        """Whether ``cand`` cannot fit faster than ``limit`` seconds in any order: a plan without recomputes (the
        unswapped step among them) where the tune computed the swap floor (:attr:`swap_floor`) and it is slower."""
        floor = self._swap_floor
        return (floor is not None and floor.floor_s > limit
                and (cand.plan is None or not cand.plan.recomputes))

    def cannot_fit_ordered(self, cand: Candidate) -> bool:
        """Whether no order of ``cand``'s rewritten graph fits the budget: the bytes live while the loss's gradient
        starts (:func:`~tflms.tune.cut_bound.live_at_cut`, in every order), with the margin, exceed it. ``False`` where
        fit is judged by the BFC model (the bound is one on live bytes) or the step has no backward pass."""
        if self.fit_by != FIT_BY_LIVE:
            return False
        if self._cut is None:
            from tflms.errors import ConfigError
            from tflms.tune.cut_bound import cut_op
            try:
                self._cut = cut_op(self.analysis)
            except ConfigError:  # (no forward or no backward pass: no loss to bound at)
                self._cut = ""
        if not self._cut:
            return False
        from tflms.tune.cut_bound import live_at_cut
        graph = self.graphs.get(id(cand))
        graph = self._rewrite(cand) if graph is None else graph
        live = live_at_cut(graph, cand.sim, self._cut)
        if live + int(live * self.sim_options.margin_fraction) + self.sim_options.margin_bytes > self.budget:
            return True
        self.graphs[id(cand)] = graph  # (kept for the order pass, :meth:`graph_of`; a plan ruled out is not)
        return False

    def graph_of(self, cand: Candidate) -> Graph:
        """The rewritten graph of ``cand`` (built once, on demand: only the winner's is needed)."""
        if id(cand) not in self.graphs:
            self.graphs[id(cand)] = self._rewrite(cand)
        return self.graphs[id(cand)]

    def _rewrite(self, cand: Candidate) -> Graph:
        """``cand``'s plan applied to the step (not kept: :meth:`graph_of` keeps it)."""
        with gc_paused():
            return apply_swaps(self.analysis.graph, cand.plan, copy_op=self.copy_op).graph

    def nested_winner(self, result) -> None:
        """Note the winner of a tune nested in this one (``result``, a :class:`~tflms.tune.result.TuneResult`): its
        graph is what ``apply_swaps`` makes of the nested tune's step with its plan, and that tune found it runnable
        (:func:`tflms.tune.tuner._runnable`). Only the last is kept (one graph), until :meth:`swapped` takes it."""
        self._nested = (result.best, result.analysis.graph, result.graph)

    def swapped(self, graph: Graph, cand: Candidate) -> tuple[Graph, bool]:
        """``(apply_swaps(graph, cand.plan).graph, whether that graph is known runnable)``: a nested tune's winner on
        ``graph`` (:meth:`nested_winner`) answers with the graph that tune built and checked, where this tune does not
        compress its swaps."""
        known = self._nested
        if known is not None and known[0] is cand and known[1] is graph and self.compress is None:
            self._nested = None
            return known[2], True
        return apply_swaps(graph, cand.plan, copy_op=self.copy_op).graph, False

    def known_runnable(self, cand: Candidate) -> bool:
        """Whether ``cand``'s graph is known runnable (recorded with ``runnable=True``): the check need not run."""
        return self._runnable.get(id(cand)) is cand

    def evaluate(self, policy: SwapPolicy, params: dict[str, Any], *, max_overhead: float | None = None,
                 baseline: SimResult | None = None) -> Candidate:
        """The one entry every search judges a policy through: plan it on the base config, simulate, record.

        ``params`` is what the candidate reports (tables, ``to_dict``); ``max_overhead`` (with ``baseline``)
        refuses a plan that slows the step down more than that.
        """
        plan = policy.plan(self.analysis, self.base_config, self.context)
        return self.run(policy.name, params, plan, max_overhead=max_overhead, baseline=baseline, policy=policy)

    def run(self, strategy: str, params: dict[str, Any], plan: SwapPlan, *, max_overhead: float | None = None,
            baseline: SimResult | None = None, policy: SwapPolicy | None = None) -> Candidate:
        """Simulate and record an already made ``plan`` (:meth:`evaluate` plans a policy and calls this)."""
        graph = None
        if self.compress is not None:
            graph = self.compress(apply_swaps(self.analysis.graph, plan, copy_op=self.copy_op).graph, plan)
            sim = simulate(graph, self.profile, options=self.sim_options)
        else:
            sim = self.plans.evaluate(plan)
        return self.record(strategy, params, plan, sim, graph, policy, max_overhead=max_overhead, baseline=baseline)

    def record(self, strategy: str, params: dict[str, Any], plan: SwapPlan | None, sim: SimResult,
               graph: Graph | None, policy: SwapPolicy | None, *, max_overhead: float | None = None,
               baseline: SimResult | None = None, order: dict | None = None, what: str = "",
               runnable: bool = False) -> Candidate:
        """Judge ``sim`` by the fit rule (budget, host budget, no-overhead limit), record and report it.

        ``order``: the order pass's report of a candidate judged in the enforced order; ``what``: how the
        progress line and a miss name the judgement (e.g. "in the enforced order (12 edges)"); ``runnable``: ``graph``
        is known runnable (:meth:`known_runnable`)."""
        why = ""
        need = self.need(sim)
        if need > self.budget:
            why = f"{'BFC-model need' if self.fit_by == FIT_BY_BFC else 'peak'} {format_bytes(need)} > budget"
        elif sim.host_peak_bytes > self.host_budget:
            why = f"host peak {format_bytes(sim.host_peak_bytes)} > host budget {format_bytes(self.host_budget)}"
        elif max_overhead is not None and baseline is not None and sim.overhead_vs(baseline) > max_overhead:
            why = f"overhead {100 * sim.overhead_vs(baseline):.2f}% in no-overhead mode"
        if why and order is not None:
            why += " with the enforced order"
        cand = Candidate(strategy, params, plan, sim, fits=not why, why_not=why, order=order, policy=policy)
        if graph is not None:
            self.graphs[id(cand)] = graph
            if runnable:
                self._runnable[id(cand)] = cand
        self.candidates.append(cand)
        self._keep_views(sim)
        if self.progress:
            self.progress(f"{strategy} {params}{' ' + what if what else ''}: peak "
                          f"{format_bytes(sim.peak_with_margin_bytes)}, step {sim.step_time_s * 1e3:.2f} ms"
                          f"{'' if cand.fits else ' (' + why + ')'}")
        return cand

    def _keep_views(self, sim: SimResult) -> None:
        """Keep the built views (:class:`~tflms.sim.records.SimDetails`) of the last :data:`VIEWS_KEPT` simulations
        recorded, and release the older ones': the searches read the views of the simulation they just made, and
        a view read again later (the winner's, when pruning) is built again."""
        if any(s is sim for s in self._recent):  # (by identity: equality would compare the views)
            return
        self._recent.append(sim)
        if len(self._recent) > VIEWS_KEPT:
            self._recent.popleft().release_views()

    def scored(self, sim: SimResult) -> list:
        """:func:`~tflms.policies.idle_time.scored_candidates` of ``sim``, kept for the last few simulations
        (the idle-time searches ask again about one simulation with more tensors excluded)."""
        hit = self._scored.get(id(sim))
        if hit is None or hit[0] is not sim:
            if len(self._scored) >= SCORED_MEMO_SIZE:
                del self._scored[next(iter(self._scored))]
            hit = self._scored[id(sim)] = (sim, scored_candidates(self.analysis, sim, self.profile, self.base_config,
                                                                     self.accelerator))
        return hit[1]

    def need(self, sim: SimResult) -> int:
        """Device bytes a simulated step needs: live-bytes peak, or what the BFC allocator model reserves."""
        if self.fit_by == FIT_BY_BFC:
            from tflms.memplan.report import plan_step
            margin = sim.peak_with_margin_bytes - sim.peak_bytes
            return plan_step(sim).bfc_total_bytes + margin
        return sim.peak_with_margin_bytes

    def distance(self, **params: Any) -> Candidate:
        """The TFLMS rules with ``params`` laid over the base config."""
        return self.evaluate(TflmsRules(**params), params)
