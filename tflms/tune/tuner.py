"""Budget-driven auto-tuning: pick the rewrite that fits with the least slowdown.

Strategies (each evaluated with the simulator on the same graph):

- ``none``: the original step, if it fits.
- ``tflms-distance`` (TFLMS's search): thresholds from large to small until one
  fits; then the largest ``swapin_ahead`` and ``swapin_groupby`` that still fit;
  ``sync_mode`` is raised only when nothing asynchronous fits. Unlike TFLMS, every
  fitting candidate is compared by simulated step time, not just by fit.
- ``idle-time``: tensors ranked by how long they idle around the memory peak
  (:mod:`tflms.policies.idle_time`), in ``stick-to-limit`` mode.
- ``idle-time-no-overhead``: the same, but only swaps whose copies hide behind
  compute; it fails rather than slow the step down.

The winner is the fitting candidate with the smallest simulated step time (ties:
fewer swapped bytes). When nothing fits, :class:`~tflms.errors.BudgetError`
names the smallest budget any candidate reached.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph, no_training_step_error
from tflms.devices import resolve_accelerator
from tflms.config import LMSConfig
from tflms.errors import BudgetError, ConfigError, UnknownSizeError
from tflms.ir.graph import Graph
from tflms.ir.op_types import SOURCE_OPS
from tflms.ir.tf_io import load_graph
from tflms.passes.swaps import DEFAULT_COPY_OP, apply_swaps
from tflms.policies.base import IdleTime, PlanContext, SwapPolicy, TflmsRules
from tflms.policies.idle_time import NO_OVERHEAD, STICK_TO_LIMIT, majority_order, scored_candidates
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from tflms.tune.evaluator import PlanEvaluator
from tflms.sim.simulator import SimOptions, SimResult, gc_paused, simulate
from tflms.tune.vdnn import search_vdnn
from tflms.units import format_bytes, parse_bytes

logger = logging.getLogger(__name__)

STRATEGIES = ("tflms-distance", "idle-time", "idle-time-no-overhead")
#: Strategies searched only when asked for (vDNN's layer-wise policies, for comparison).
OPT_IN_STRATEGIES = ("vdnn_conv", "vdnn_all")
#: Rounds of re-simulation the idle-time strategy may take (the peak moves after each).
IDLE_MAX_ROUNDS = 12
#: How "fits" is judged: the live-bytes peak, or what TensorFlow's BFC allocator (modelled) would reserve.
FIT_BY_LIVE, FIT_BY_BFC = "live", "bfc"
#: swapin_groupby the distance search falls back to when one swap-in per level fits nothing.
GROUPBY_RESORT_LEVELS = 4
#: Simulations one idle-time search may run in all (rounds plus no-overhead retries).
IDLE_MAX_EVALUATIONS = 16
#: Extra bytes the idle-time strategy asks for per round beyond the overshoot, as a fraction.
IDLE_OVERSHOOT_SLACK = 0.05
#: Largest relative slowdown the no-overhead mode accepts (simulation round-off, not a real cost).
NO_OVERHEAD_TOLERANCE = 0.001
#: The threshold ladder stops after this many fitting thresholds in a row that are no faster than the best.
LADDER_PATIENCE = 2
#: The swapin_ahead scan stops after this many values in a row that fit exactly as fast as the chosen value
#: (ResNet-50's ahead 16..256 all simulate to one step time). Not the groupby scan: its plateaus end in gains
#: (a CNN's groupby 4 and 8 tie, 16 is faster).
AHEAD_PATIENCE = 2
#: The no-overhead search stops after this many rounds in a row whose new tensors all slowed the step down
#: (each costs a simulation; on ResNet-50 at batch 208, eleven rounds in a row did).
NO_OVERHEAD_PATIENCE = 4
#: Simulations whose scored idle-time candidates the tuner keeps (the searches revisit the last one or two).
SCORED_MEMO_SIZE = 4


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One evaluated configuration."""

    strategy: str
    params: dict[str, Any]
    plan: SwapPlan | None
    sim: SimResult
    fits: bool
    why_not: str = ""
    #: the order pass's record when the candidate was judged in the order the pipeline will enforce
    #: (:func:`tflms.passes.order.enforce_order`; ``tune(enforce_order=True)``), else ``None``
    order: dict[str, Any] | None = None
    #: the policy object whose plan this is (:mod:`tflms.policies.base`); ``None`` for the unrewritten step
    policy: SwapPolicy | None = None

    @property
    def swapped_bytes(self) -> int:
        return 0 if self.plan is None else self.plan.swapped_bytes


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The tuner's choice and everything it tried."""

    budget_bytes: int
    profile: str
    baseline: SimResult
    best: Candidate
    candidates: tuple[Candidate, ...]
    graph: Graph  # the rewritten graph of the winner (the input graph if nothing is swapped)
    analysis: Analysis

    @property
    def strategy(self) -> str:
        return self.best.strategy

    @property
    def overhead(self) -> float:
        return self.best.sim.overhead_vs(self.baseline)

    @property
    def config(self) -> LMSConfig | None:
        return None if self.best.plan is None else self.best.plan.config

    def reason(self) -> str:
        unknown = len(self.baseline.unknown_size_tensors)
        left_out = (f"; {unknown} tensors whose size depends on the data are not counted" if unknown else "")
        ordered = "" if self.best.order is None else f" in the enforced order ({self.best.order['edges']} edges)"
        if self.best.strategy == "none":
            return (f"the step fits without swapping{ordered}: predicted peak "
                    f"{format_bytes(self.best.sim.peak_with_margin_bytes)} <= budget {format_bytes(self.budget_bytes)}"
                    + left_out)
        by_strategy = {}
        for c in self.candidates:
            if c.fits and (c.strategy not in by_strategy or c.sim.step_time_s < by_strategy[c.strategy].sim.step_time_s):
                by_strategy[c.strategy] = c
        others = ", ".join(f"{s} {100 * c.sim.overhead_vs(self.baseline):+.1f}%" for s, c in sorted(by_strategy.items())
                           if s != self.best.strategy)
        return (f"{self.best.strategy} fits {format_bytes(self.budget_bytes)} with predicted peak "
                f"{format_bytes(self.best.sim.peak_with_margin_bytes)}{ordered} and the lowest predicted overhead "
                f"({100 * self.overhead:+.1f}%)" + (f"; best of the others: {others}" if others else "")
                + f"; {len(self.candidates)} configurations simulated" + left_out)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "profile": self.profile, "strategy": self.strategy,
                "params": self.best.params, "predicted_peak_bytes": self.best.sim.peak_with_margin_bytes,
                "baseline_peak_bytes": self.baseline.peak_with_margin_bytes,
                "predicted_step_time_s": self.best.sim.step_time_s, "baseline_step_time_s": self.baseline.step_time_s,
                "overhead": self.overhead, "swapped_bytes": self.best.swapped_bytes,
                "host_peak_bytes": self.best.sim.host_peak_bytes, "reason": self.reason(),
                "candidates": [{"strategy": c.strategy, "params": c.params, "peak_bytes": c.sim.peak_with_margin_bytes,
                                "step_time_s": c.sim.step_time_s, "fits": c.fits, "why_not": c.why_not,
                                "order_edges": None if c.order is None else c.order["edges"]}
                               for c in self.candidates]}

    def table(self, *, wide: bool = False) -> str:
        """The verdict and one row per simulated candidate (``wide=True``: parameters never cut short)."""
        width = max([44] + [len(_params_text(c.params)) + 1 for c in self.candidates]) if wide else 44
        lines = [f"budget {format_bytes(self.budget_bytes)} on {self.profile}: {self.reason()}",
                 f"{'strategy':<24}{'params':<{width}}{'peak':>12}{'overhead':>10}  fits"]
        for c in self.candidates:
            params = _params_text(c.params)
            if not wide and len(params) > width - 1:
                params = params[:width - 4] + "..."
            lines.append(f"{c.strategy:<24}{params:<{width}}{format_bytes(c.sim.peak_with_margin_bytes):>12}"
                         f"{100 * c.sim.overhead_vs(self.baseline):>9.1f}%  {'yes' if c.fits else 'no'}")
        lines.append("columns: params = the candidate's swap parameters; peak = its predicted accelerator peak "
                     "(with the simulator's margin); overhead = predicted step time vs. no swapping; fits = peak "
                     "within the budget (and host memory)")
        return "\n".join(lines)


def _params_text(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


class _Evaluator:
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
        # Candidates are simulated incrementally (no IR copy per plan, memoized by plan).
        self.plans = PlanEvaluator(analysis.graph, profile, sim_options, copy_op=copy_op)
        #: what the policies are given besides the analysis and the config (``baseline`` set once simulated)
        self.context = PlanContext(accelerator, profile)
        self._scored: dict[int, tuple[SimResult, list]] = {}  # id(sim) -> (sim, its scored idle candidates)

    def graph_of(self, cand: Candidate) -> Graph:
        """The rewritten graph of ``cand`` (built once, on demand: only the winner's is needed)."""
        if id(cand) not in self.graphs:
            with gc_paused():
                self.graphs[id(cand)] = apply_swaps(self.analysis.graph, cand.plan, copy_op=self.copy_op).graph
        return self.graphs[id(cand)]

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
        why = ""
        need = self.need(sim)
        if need > self.budget:
            why = f"{'BFC-model need' if self.fit_by == FIT_BY_BFC else 'peak'} {format_bytes(need)} > budget"
        elif sim.host_peak_bytes > self.host_budget:
            why = f"host peak {format_bytes(sim.host_peak_bytes)} > host budget {format_bytes(self.host_budget)}"
        elif max_overhead is not None and baseline is not None and sim.overhead_vs(baseline) > max_overhead:
            why = f"overhead {100 * sim.overhead_vs(baseline):.2f}% in no-overhead mode"
        cand = Candidate(strategy, params, plan, sim, fits=not why, why_not=why, policy=policy)
        if graph is not None:
            self.graphs[id(cand)] = graph
        self.candidates.append(cand)
        if self.progress:
            self.progress(f"{strategy} {params}: peak {format_bytes(sim.peak_with_margin_bytes)}, "
                          f"step {sim.step_time_s * 1e3:.2f} ms{'' if cand.fits else ' (' + why + ')'}")
        return cand

    def scored(self, sim: SimResult) -> list:
        """:func:`~tflms.policies.idle_time.scored_candidates` of ``sim``, kept for the last few simulations
        (the idle-time searches ask again about one simulation with more tensors excluded)."""
        hit = self._scored.get(id(sim))
        if hit is None or hit[0] is not sim:
            if len(self._scored) >= SCORED_MEMO_SIZE:
                del self._scored[next(iter(self._scored))]
            hit = self._scored[id(sim)] = (sim, scored_candidates(self.analysis, sim, self.profile, self.base_config))
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


#: How many candidates that do not fit in level order :func:`judge_ordered` judges again in the enforced order.
ORDER_FINALISTS = 4
#: ... among those needing at most this fraction more than the budget in level order (a heuristic: the order
#: pass lowered ResNet-50's peak by 1-3% at batch 208 and 600; scheduling one finalist costs about half a
#: second there, and the candidates it skipped needed 2.3x the budget).
ORDER_MAX_OVERSHOOT = 0.5


def judge_ordered(ev: _Evaluator) -> list[Candidate]:
    """Judge the finalists in the order the pipeline will enforce; returns the candidates added.

    Scheduling costs seconds on a large step (docs/design.md, "Enforced order"), so only finalists
    are scheduled, each distinct plan once: the fastest fitting candidate (the order pass may change
    its step time and peak) and the :data:`ORDER_FINALISTS` lowest-peak candidates that do not fit in
    level order (by at most :data:`ORDER_MAX_OVERSHOOT`) and would be faster than it. Each gets the
    rewritten graph through :func:`~tflms.passes.order.enforce_order` (the same pass, deterministic, as the
    pipeline runs) and the pass's simulation of the result; the new candidate keeps the strategy and
    parameters, with ``order`` set. Its rewritten graph is stored without the edges: the pipeline's pass
    adds them.
    """
    from tflms.passes.order import enforce_order
    fitting = [c for c in ev.candidates if c.fits and c.order is None and c.plan is not None]
    best = min(fitting, key=lambda c: c.sim.step_time_s) if fitting else None
    limit = best.sim.step_time_s if best is not None else float("inf")
    over = sorted((c for c in ev.candidates if not c.fits and c.order is None and c.sim.step_time_s < limit
                   and c.sim.host_peak_bytes <= ev.host_budget
                   and ev.need(c.sim) <= ev.budget * (1 + ORDER_MAX_OVERSHOOT)),
                  key=lambda c: (ev.need(c.sim), c.sim.step_time_s))
    finalists, seen = [], set()
    for c in ([best] if best is not None else []) + over:
        key = None if c.plan is None else tuple((s.tensor.name, tuple(g.name for g in s.swap_ins))
                                                 for s in c.plan.swaps)
        if key in seen:
            continue
        seen.add(key)
        finalists.append(c)
        if len(finalists) > ORDER_FINALISTS:
            break
    added = []
    for c in finalists:
        graph = ev.graph_of(c)
        # c.sim is the simulation of ``graph`` in level order (the incremental evaluator's answer is simulate's)
        result = enforce_order(graph, ev.profile, options=ev.sim_options, level_peak_bytes=c.sim.peak_bytes)
        sim = result.report.ordered_sim if result.changed else c.sim
        need = ev.need(sim)
        why = "" if need <= ev.budget and sim.host_peak_bytes <= ev.host_budget else (
            f"peak {format_bytes(need)} > budget with the enforced order")
        cand = Candidate(c.strategy, c.params, c.plan, sim, fits=not why, why_not=why,
                         order=result.report.to_dict(), policy=c.policy)
        ev.graphs[id(cand)] = graph
        ev.candidates.append(cand)
        added.append(cand)
        if ev.progress:
            ev.progress(f"{c.strategy} {c.params} in the enforced order ({result.report.num_edges} edges): peak "
                        f"{format_bytes(sim.peak_with_margin_bytes)}, step {sim.step_time_s * 1e3:.2f} ms"
                        f"{'' if cand.fits else ' (' + why + ')'}")
    return added


def _threshold_ladder(analysis: Analysis) -> list[int]:
    """Thresholds worth trying, largest first: the distinct far distances, thinned geometrically."""
    levels = analysis.levels
    max_distance = 1
    for name in analysis.order:
        for c in analysis.graph.successors(name):
            max_distance = max(max_distance, levels[c] - levels[name])
    ladder, t = [], max_distance - 1
    while t >= 1:
        ladder.append(t)
        t = t * 2 // 3 if t > 3 else t - 1
    return ladder or [1]


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= max(1, limit):
        out.append(v)
        v *= 2
    return out


def search_distance(ev: _Evaluator, first_fit: bool = False) -> None:
    """TFLMS's search, choosing by simulated time among fitting candidates.

    With ``first_fit`` it stops at the first fitting configuration (a yes/no
    answer for the max-batch search).
    """
    ladder = _threshold_ladder(ev.analysis)
    fitting: list[Candidate] = []
    no_better = 0  # fitting thresholds in a row no faster than the best (smaller ones only swap more)
    # One swap-in per consumer level can leave several copies of a tensor on the device
    # (consumers on adjacent levels); grouping them is the next resort before synchronous copies.
    for sync_mode, groupby in [(0, 0), (0, GROUPBY_RESORT_LEVELS), (1, GROUPBY_RESORT_LEVELS),
                               (2, GROUPBY_RESORT_LEVELS), (3, GROUPBY_RESORT_LEVELS)]:
        for threshold in ladder:
            cand = ev.distance(swapout_threshold=threshold, swapin_ahead=1, swapin_groupby=groupby,
                               sync_mode=sync_mode)
            if cand.fits:
                no_better = no_better + 1 if fitting and cand.sim.step_time_s >= min(
                    c.sim.step_time_s for c in fitting) else 0
                fitting.append(cand)
                if first_fit:
                    return
                if no_better >= LADDER_PATIENCE:
                    break
            elif fitting:
                break  # smaller thresholds only swap more: stop once fits have been found and lost
        if fitting:
            break
    if not fitting:
        return
    best = min(fitting, key=lambda c: (c.sim.step_time_s, -c.params["swapout_threshold"]))
    params = dict(best.params)
    for name in ("swapin_ahead", "swapin_groupby"):
        limit = max(1, ev.analysis.num_levels // 4)
        chosen = cand = best
        flat = 0  # fitting values in a row exactly as fast as the chosen one
        for value in _powers(limit)[1:] if name == "swapin_ahead" else [0] + _powers(limit):
            if name == "swapin_groupby" and value == params[name]:
                continue
            if name == "swapin_ahead" and value // 2 >= _useful_ahead(best.plan):
                # Every trigger is already at its earliest level: larger values plan the same swaps. The last
                # value would be chosen exactly when this one was (the same plan: memoized, not simulated).
                if chosen is cand:
                    chosen = ev.distance(**{**params, name: _powers(limit)[-1]})
                break
            cand = ev.distance(**{**params, name: value})
            if cand.fits and cand.sim.step_time_s <= chosen.sim.step_time_s:
                flat = flat + 1 if cand.sim.step_time_s == chosen.sim.step_time_s else 0
                chosen = cand
                if name == "swapin_ahead" and flat >= AHEAD_PATIENCE:
                    break  # a plateau: larger values have moved triggers without changing the step time
            elif not cand.fits:
                break
        params = dict(chosen.params)
        best = chosen


def _copies_can_hide(ev: _Evaluator, baseline: SimResult) -> bool:
    """Whether a swap plan might fit without slowing the step: a cheap necessary condition.

    To fit, the live bytes at the baseline's peak must drop by the overshoot ``D`` (live bytes; the
    margin scales with them), so at least ``D`` bytes must be copied out before that instant, one copy
    stream from the step's start. Without overhead the step keeps its timing (to
    :data:`NO_OVERHEAD_TOLERANCE` of its length), so ``copy_time(D)`` must fit before the peak. On
    ResNet-50 at batch 600 (peak 47.9 GiB for a 16 GiB card) it does not: sixteen no-overhead trials were
    simulated for nothing.
    """
    overshoot = ev.need(baseline) - ev.budget
    live_overshoot = (baseline.peak_with_margin_bytes - ev.budget) / (1 + ev.sim_options.margin_fraction)
    if overshoot <= 0 or live_overshoot <= 0:
        return True
    before_peak = baseline.peak_time_s + NO_OVERHEAD_TOLERANCE * baseline.step_time_s
    return ev.profile.copy_time_s(int(live_overshoot)) <= before_peak


def _useful_ahead(plan: SwapPlan) -> int:
    """The largest ``swapin_ahead`` that can still move a trigger of ``plan`` (``find_trigger`` clamps
    the target level to one above the producer's; synchronous swap-ins ignore ``swapin_ahead``)."""
    if plan.config.sync_swap_in:
        return 0
    return max((g.consumer_levels[0] - s.producer_level - 1 for s in plan.swaps for g in s.swap_ins
                if g.consumer_levels), default=0)


def search_idle(ev: _Evaluator, baseline: SimResult, mode: str) -> None:
    """Greedy idle-time selection, re-simulating as the peak moves.

    Each round adds the best-scoring tensors alive at the current peak until
    their bytes cover the overshoot. In no-overhead mode a round that makes the
    step slower is retried with half as many new tensors; a single tensor that
    still slows it down is dropped for good.
    """
    if mode == NO_OVERHEAD and not _copies_can_hide(ev, baseline):
        return
    selected: dict = {}
    rejected: set = set()
    sim = baseline
    evaluations = 0
    slowed = 0  # no-overhead rounds in a row that added nothing (every trial slowed the step down)
    for round_ in range(IDLE_MAX_ROUNDS):
        need = ev.need(sim) - ev.budget
        if need <= 0:
            return
        excluded = set(selected) | rejected
        cands = majority_order([c for c in ev.scored(sim) if c.tensor not in excluded])  # = idle_candidates
        if mode == NO_OVERHEAD:
            cands = [c for c in cands if c.hides]
        if not cands:
            return
        batch, got = [], 0
        for cand in cands:
            batch.append(cand)
            got += cand.num_bytes
            if got >= need * (1 + IDLE_OVERSHOOT_SLACK):
                break
        while evaluations < IDLE_MAX_EVALUATIONS:
            evaluations += 1
            trial = {**selected, **{c.tensor: c for c in batch}}
            result = ev.evaluate(IdleTime(mode, tuple(trial.values())), {"tensors": len(trial), "round": round_ + 1},
                                 max_overhead=NO_OVERHEAD_TOLERANCE if mode == NO_OVERHEAD else None,
                                 baseline=baseline)
            if mode != NO_OVERHEAD or result.sim.overhead_vs(baseline) <= NO_OVERHEAD_TOLERANCE:
                selected = trial
                break
            if len(batch) == 1:
                rejected.add(batch[0].tensor)
                break
            batch = batch[:len(batch) // 2]
        if result.fits or evaluations >= IDLE_MAX_EVALUATIONS:
            return
        slowed = 0 if selected is trial else slowed + 1
        if mode == NO_OVERHEAD and slowed >= NO_OVERHEAD_PATIENCE:
            return
        sim = result.sim if selected is trial else sim


#: Tensors of unknown size an :class:`~tflms.errors.UnknownSizeError` names.
UNKNOWN_SIZE_EXAMPLES = 3


def check_known_sizes(graph: Graph, sim: SimResult, batch_size: int | None) -> None:
    """Refuse a memory verdict that would count tensors of an unknown batch size as 0 bytes.

    Raises :class:`~tflms.errors.UnknownSizeError` when a tensor's only unknown
    dimension is the leading (batch) one and no batch size was given, naming a
    few of them and the fix: ``batch_size=N`` in the API and the Keras callback,
    ``--batch-size N`` on the command line. Tensors whose size depends on the data
    (e.g. a gradient's ``Reshape`` to a ``tf.shape`` computed at run time, or the
    shape vectors of ``BroadcastGradientArgs`` when every step argument's leading
    dimension is known) do not stop the verdict: :meth:`TuneResult.reason` says how many were left out. A
    rewrite by the TFLMS rules without a budget needs no verdict: it leaves
    tensors of unknown size unswapped (reason ``unknown-shape``) instead.
    """
    if batch_size is not None or not sim.unknown_size_tensors:
        return
    if not any(info.shape and info.shape[0] is None for op in graph.ops if op.type in SOURCE_OPS
               for info in op.outputs):
        return  # every step argument has a known leading dimension: no unknown size is the batch's
    from tflms.ir.graph import TensorRef
    batch_only = []
    for name in sim.unknown_size_tensors:
        ref = TensorRef.parse(name)
        shape = graph.op(ref.op).outputs[ref.index].shape
        if shape and shape[0] is None and all(d is not None for d in shape[1:]):
            batch_only.append((name, shape))
    if not batch_only:
        return
    examples = ", ".join(f"{n} {_shape_text(s)}" for n, s in batch_only[:UNKNOWN_SIZE_EXAMPLES])
    raise UnknownSizeError(
        f"cannot predict the step's memory: {len(batch_only)} tensors have an unknown batch (leading) dimension "
        f"(e.g. {examples}) and would count as 0 bytes. Give the batch size: batch_size=N (--batch-size N)")


def _shape_text(shape) -> str:
    return "(unknown rank)" if shape is None else "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def tune(source: Any, *args: Any, budget: int | str | None = None, profile: str | HardwareProfile = DEFAULT_PROFILE,
         config: LMSConfig | None = None, strategies: Sequence[str] = STRATEGIES, sim_options: SimOptions | None = None,
         host_budget: int | str | None = None, copy_op: str = DEFAULT_COPY_OP, first_fit: bool = False,
         require_backward: bool = True, fit_by: str = FIT_BY_LIVE,
         compress: Callable[[Graph, SwapPlan], Graph] | None = None,
         progress: Callable[[str], None] | None = None, enforce_order: bool = False) -> TuneResult:
    """Find the rewrite of ``source`` that fits ``budget`` (default: the profile's memory) fastest.

    ``config`` supplies the fixed options (filters, devices, ``min_swap_bytes``,
    ``batch_size``); the swap parameters are searched. Raises
    :class:`~tflms.errors.BudgetError` when nothing fits. ``first_fit`` stops at
    the first configuration that fits (answers "does anything fit?" quickly).
    ``fit_by="bfc"`` judges fit by the BFC allocator model (resident bytes plus
    what the allocator reserves for the step's allocation sequence) instead of
    the live-bytes peak: a budget the live bytes meet but the allocator does not
    is not a fit. ``compress`` (e.g. ``tflms.compress.policy.make_compressor``)
    post-processes every candidate's rewritten graph with compressed swaps.
    ``enforce_order``: the pipeline will pin a memory-aware order (:func:`tflms.passes.order.enforce_order`),
    so the finalists (:func:`judge_ordered`) are judged again with the order's edges, and one that fits
    only in that order can win.
    """
    if fit_by not in (FIT_BY_LIVE, FIT_BY_BFC):
        raise ConfigError(f"fit_by must be {FIT_BY_LIVE!r} or {FIT_BY_BFC!r}, got {fit_by!r}")
    # One pause for the whole search: the simulations allocate about a million small objects, none of them
    # cyclic garbage; a collection at the end of each search would scan all that the tune still holds.
    with gc_paused():
        return _tune(source, args, budget, profile, config, strategies, sim_options, host_budget, copy_op, first_fit,
                     require_backward, fit_by, compress, progress, enforce_order)


def _tune(source: Any, args: Sequence[Any], budget: int | str | None, profile: str | HardwareProfile,
          config: LMSConfig | None, strategies: Sequence[str], sim_options: SimOptions | None,
          host_budget: int | str | None, copy_op: str, first_fit: bool, require_backward: bool, fit_by: str,
          compress: Callable[[Graph, SwapPlan], Graph] | None, progress: Callable[[str], None] | None,
          enforce_order: bool) -> TuneResult:
    """:func:`tune`'s body (run with the cyclic collector paused)."""
    profile = get_profile(profile)
    unknown = sorted(set(strategies) - set(STRATEGIES) - set(OPT_IN_STRATEGIES))
    if unknown:
        raise ConfigError(f"unknown tuning strategies {unknown}; choose from {list(STRATEGIES + OPT_IN_STRATEGIES)}")
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    if budget_bytes <= 0:
        raise ConfigError("budget must be positive")
    host_bytes = profile.host_memory_bytes if host_budget is None else parse_bytes(host_budget, what="host_budget")
    config = (config or LMSConfig()).with_rule_defaults()  # the base of every candidate's config
    sim_options = sim_options or SimOptions(host_device=config.host_device)
    analysis = source if isinstance(source, Analysis) else analyze_graph(
        load_graph(source, *args, batch_size=config.batch_size))
    graph = analysis.graph
    if require_backward and not analysis.has_backward:
        raise no_training_step_error(analysis)
    accelerator = config.accelerator_device or resolve_accelerator(config.accelerator_device)[0]
    if accelerator == config.host_device:
        accelerator = "/device:GPU:0"  # planning for a GPU we do not have: the profile is the device
    ev = _Evaluator(analysis, profile, budget_bytes, host_bytes, sim_options, config, accelerator, copy_op, progress)
    baseline = ev.plans.evaluate(None)  # = simulate(graph, profile, options=sim_options)
    ev.context = dataclasses.replace(ev.context, baseline=baseline)
    check_known_sizes(graph, baseline, config.batch_size)
    ev.fit_by = fit_by
    ev.compress = compress
    base_need = ev.need(baseline)
    base = Candidate("none", {}, None, baseline, fits=base_need <= budget_bytes,
                     why_not="" if base_need <= budget_bytes else f"needs {format_bytes(base_need)} > budget")
    ev.candidates.append(base)
    ev.graphs[id(base)] = graph
    searches = [("tflms-distance", lambda: search_distance(ev, first_fit=first_fit)),
                ("idle-time", lambda: search_idle(ev, baseline, STICK_TO_LIMIT)),
                ("idle-time-no-overhead", lambda: search_idle(ev, baseline, NO_OVERHEAD)),
                ("vdnn", lambda: search_vdnn(ev, policies=[s for s in strategies if s in OPT_IN_STRATEGIES]))]
    for name, search in searches:
        if base.fits or (first_fit and any(c.fits for c in ev.candidates)):
            break
        if name in strategies or (name == "vdnn" and set(strategies) & set(OPT_IN_STRATEGIES)):
            search()
    if enforce_order and not base.fits and not (first_fit and any(c.fits for c in ev.candidates)):
        judge_ordered(ev)
    fitting = [c for c in ev.candidates if c.fits]
    if not fitting:
        smallest = min(ev.candidates, key=lambda c: ev.need(c.sim))
        error = BudgetError(
            f"nothing fits the budget {format_bytes(budget_bytes)} on {profile.name}: the step needs "
            f"{format_bytes(base_need)} without swapping and at least "
            f"{format_bytes(ev.need(smallest.sim))} with the best rewrite found "
            f"({smallest.strategy} {smallest.params}); give a budget of at least that, or a smaller batch. "
            f"Resident variables alone take {format_bytes(baseline.resident_bytes)}.")
        error.candidates, error.baseline = tuple(ev.candidates), baseline  # what was tried, for reports
        raise error
    order = ("none",) + STRATEGIES + OPT_IN_STRATEGIES
    best = min(fitting, key=lambda c: (c.sim.step_time_s, c.swapped_bytes, order.index(c.strategy)))
    return TuneResult(budget_bytes=budget_bytes, profile=profile.name, baseline=baseline, best=best,
                      candidates=tuple(ev.candidates), graph=ev.graph_of(best), analysis=analysis)
