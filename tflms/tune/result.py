"""What the tuner returns: each evaluated candidate and the choice (:func:`tflms.tune.tuner.tune`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tflms.analysis.cto import Analysis
from tflms.config import LMSConfig
from tflms.ir.graph import Graph
from tflms.policies.base import SwapPolicy
from tflms.policies.eligibility import is_clone
from tflms.policies.swapplan import SwapPlan
from tflms.sim.simulator import SimResult
from tflms.units import format_bytes



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
    #: a floor on the step time of every swap-only plan that fits, in any order (simulated;
    #: :func:`~tflms.sim.bounds.any_order_time_bound`, its scan stopped once it answered the tune's question), where
    #: the tune computed it (it does where the recompute search runs), else ``None``
    swap_floor_s: float | None = None
    #: whether the swap searches were left out because that floor is slower than a plan already found
    swap_searches_skipped: bool = False
    #: what the plan cache did with this tune (:func:`tflms.tune.plancache.cached_tune`: ``status``, ``path``,
    #: ``why``, ...); ``None`` when the tune did not go through it
    plan_cache: dict[str, Any] | None = None

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
                + (f"; swap-only plans not searched: none can beat "
                   f"{100 * (self.swap_floor_s / self.baseline.step_time_s - 1):+.1f}% (their floor in any order)"
                   if self.swap_searches_skipped else "")
                + f"; {len(self.candidates)} configurations simulated" + left_out)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "profile": self.profile, "strategy": self.strategy,
                "params": self.best.params, "predicted_peak_bytes": self.best.sim.peak_with_margin_bytes,
                "baseline_peak_bytes": self.baseline.peak_with_margin_bytes,
                "predicted_step_time_s": self.best.sim.step_time_s, "baseline_step_time_s": self.baseline.step_time_s,
                "overhead": self.overhead, "swapped_bytes": self.best.swapped_bytes,
                "recomputed_bytes": 0 if self.best.plan is None else self.best.plan.recomputed_bytes,
                "recompute_time_s": recompute_time_s(self.best.sim),
                "host_peak_bytes": self.best.sim.host_peak_bytes, "reason": self.reason(),
                "swap_floor_s": self.swap_floor_s, "swap_searches_skipped": self.swap_searches_skipped,
                "candidates": [{"strategy": c.strategy, "params": c.params, "peak_bytes": c.sim.peak_with_margin_bytes,
                                "step_time_s": c.sim.step_time_s, "fits": c.fits, "why_not": c.why_not,
                                "order_edges": None if c.order is None else c.order["edges"]}
                               for c in self.candidates],
                **({} if self.plan_cache is None else {"plan_cache": dict(self.plan_cache)})}

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


def recompute_time_s(sim: SimResult) -> float:
    """The compute time the recompute clones take in ``sim`` (simulated)."""
    return sum(r.end_s - r.start_s for r in sim.ops if is_clone(r.name))


def _params_text(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())
