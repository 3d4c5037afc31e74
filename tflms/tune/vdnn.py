"""vDNN's dynamic choice and the tuner's vDNN strategies: :func:`choose_vdnn`, :func:`search_vdnn`.

The plans come from :mod:`tflms.policies.vdnn`; this module judges them with the
simulator (``vdnn_dyn`` picks the first of none / ``vdnn_conv`` / ``vdnn_all``
whose simulated peak fits the budget).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tflms.analysis.cto import Analysis
from tflms.config import LMSConfig
from tflms.errors import BudgetError
from tflms.ir.graph import Graph
from tflms.passes.swaps import DEFAULT_COPY_OP, apply_swaps
from tflms.policies.base import Vdnn
from tflms.policies.swapplan import SwapPlan
from tflms.policies.vdnn import VDNN_NONE, VDNN_POLICIES, plan_vdnn
from tflms.profiles import HardwareProfile, get_profile
from tflms.sim.simulator import SimOptions, SimResult, simulate
from tflms.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from tflms.tune.search import TuneEvaluator


@dataclasses.dataclass(frozen=True)
class VdnnCandidate:
    policy: str
    plan: SwapPlan | None
    sim: SimResult
    fits: bool


@dataclasses.dataclass(frozen=True)
class VdnnChoice:
    """``vdnn_dyn``'s answer: the first policy that fits, everything it simulated, and the rewritten graph."""

    budget_bytes: int
    profile: str
    chosen: VdnnCandidate
    candidates: tuple[VdnnCandidate, ...]
    graph: Graph

    @property
    def policy(self) -> str:
        return self.chosen.policy

    def table(self) -> str:
        lines = [f"vdnn_dyn on {self.profile}, budget {format_bytes(self.budget_bytes)}: chose {self.policy}",
                 f"{'policy':<12}{'swaps':>7}{'swapped':>12}{'peak':>12}{'step ms':>10}  fits"]
        for c in self.candidates:
            n = 0 if c.plan is None else len(c.plan.swaps)
            swapped = 0 if c.plan is None else c.plan.swapped_bytes
            lines.append(f"{c.policy:<12}{n:>7}{format_bytes(swapped):>12}"
                         f"{format_bytes(c.sim.peak_with_margin_bytes):>12}{c.sim.step_time_s * 1e3:>10.3f}  "
                         f"{'yes' if c.fits else 'no'}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "profile": self.profile, "policy": self.policy,
                "candidates": [{"policy": c.policy, "swaps": 0 if c.plan is None else len(c.plan.swaps),
                                "swapped_bytes": 0 if c.plan is None else c.plan.swapped_bytes,
                                "peak_bytes": c.sim.peak_with_margin_bytes, "step_time_s": c.sim.step_time_s,
                                "fits": c.fits} for c in self.candidates]}


def choose_vdnn(analysis: Analysis, profile: str | HardwareProfile, budget: int | str | None = None,
                config: LMSConfig | None = None, *, accelerator_device: str = "/device:GPU:0",
                sim_options: SimOptions | None = None, copy_op: str = DEFAULT_COPY_OP,
                sync_offload: bool = True) -> VdnnChoice:
    """``vdnn_dyn``: the first of none / ``vdnn_conv`` / ``vdnn_all`` whose simulated peak fits ``budget``.

    ``budget`` defaults to the profile's memory. Raises :class:`BudgetError`
    naming the smallest peak reached when none fits.
    """
    profile = get_profile(profile)
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    config = config or LMSConfig()
    options = sim_options or SimOptions(host_device=config.host_device)
    candidates = []
    for policy in (VDNN_NONE,) + VDNN_POLICIES:
        plan = None if policy == VDNN_NONE else plan_vdnn(analysis, policy, config,
                                                           accelerator_device=accelerator_device,
                                                           sync_offload=sync_offload)
        graph = analysis.graph if plan is None else apply_swaps(analysis.graph, plan, copy_op=copy_op).graph
        sim = simulate(graph, profile, options=options)
        cand = VdnnCandidate(policy, plan, sim, sim.peak_with_margin_bytes <= budget_bytes)
        candidates.append(cand)
        if cand.fits:
            return VdnnChoice(budget_bytes, profile.name, cand, tuple(candidates), graph)
    best = min(candidates, key=lambda c: c.sim.peak_with_margin_bytes)
    raise BudgetError(f"vdnn_dyn: nothing fits {format_bytes(budget_bytes)} on {profile.name}; the smallest peak is "
                      f"{format_bytes(best.sim.peak_with_margin_bytes)} with {best.policy}: give a budget of at least "
                      "that, a smaller batch, or try the tflms-distance strategy")


def search_vdnn(ev: TuneEvaluator, sync_offload: bool = True, policies: Sequence[str] = VDNN_POLICIES) -> None:
    """Tuner hook: evaluate ``policies`` (default ``vdnn_conv`` and ``vdnn_all``) with the tuner's evaluator.

    The tuner then keeps the fastest fitting candidate, as for its other
    strategies (``vdnn_dyn``'s first-fit order is :func:`choose_vdnn`).
    """
    for policy in policies:
        ev.evaluate(Vdnn(policy, sync_offload), {"sync_offload": sync_offload})
