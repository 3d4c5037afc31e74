"""Memory planning for a simulated step: lower bound, planned pool, allocator models.

:func:`plan_step` takes a :class:`~tflms.sim.simulator.SimResult` (its
accelerator buffer lifetimes, in the simulated schedule) and reports, for the
step's activations:

- the lower bound (most bytes alive at once);
- the best static plan (one pool, fixed offsets; Zhang et al. / TFLite heuristics);
- what TensorFlow's BFC allocator and a size-class caching allocator would reserve
  for the same allocate/free sequence.

Resident bytes (variables, optimizer slots, arguments) are allocated before the
step and stay; they are added to every figure's *device total*.

TensorFlow's allocator cannot be replaced from Python: these figures predict and
explain what the device needs; they do not change how TensorFlow allocates.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tflms.memplan.allocators import BFCAllocatorModel, CachingAllocatorModel, replay
from tflms.memplan.lifetimes import Lifetime, lower_bound
from tflms.memplan.offsets import STRATEGIES
from tflms.units import format_bytes


@dataclasses.dataclass(frozen=True)
class StepPlanReport:
    """Every figure of :func:`plan_step` (bytes are the step's activations unless named ``total``)."""

    resident_bytes: int
    lower_bound_bytes: int
    planned_pool_bytes: int
    planned_strategy: str
    strategy_pools: dict[str, int]
    bfc_peak_reserved_bytes: int
    caching_peak_reserved_bytes: int
    offsets: dict[str, int]
    num_tensors: int

    @property
    def bfc_total_bytes(self) -> int:
        """What the device needs under TensorFlow's BFC allocator (resident + reserved)."""
        return self.resident_bytes + self.bfc_peak_reserved_bytes

    def fragmentation(self, figure: str) -> float:
        value = {"planned": self.planned_pool_bytes, "bfc": self.bfc_peak_reserved_bytes,
                 "caching": self.caching_peak_reserved_bytes}[figure]
        return value / self.lower_bound_bytes - 1.0 if self.lower_bound_bytes else 0.0

    def to_dict(self, with_offsets: bool = True) -> dict[str, Any]:
        out = {"resident_bytes": self.resident_bytes, "lower_bound_bytes": self.lower_bound_bytes,
               "planned_pool_bytes": self.planned_pool_bytes, "planned_strategy": self.planned_strategy,
               "strategy_pools": dict(self.strategy_pools), "bfc_peak_reserved_bytes": self.bfc_peak_reserved_bytes,
               "caching_peak_reserved_bytes": self.caching_peak_reserved_bytes, "num_tensors": self.num_tensors,
               "bfc_total_bytes": self.bfc_total_bytes}
        if with_offsets:
            out["offsets"] = dict(sorted(self.offsets.items()))
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self) -> str:
        rows = [("lower bound (max live)", self.lower_bound_bytes, 0.0),
                (f"planned pool ({self.planned_strategy})", self.planned_pool_bytes, self.fragmentation("planned")),
                ("BFC allocator model", self.bfc_peak_reserved_bytes, self.fragmentation("bfc")),
                ("caching allocator model", self.caching_peak_reserved_bytes, self.fragmentation("caching"))]
        lines = [f"{self.num_tensors} activation buffers; resident (variables, inputs) {format_bytes(self.resident_bytes)}",
                 f"{'figure':<34}{'activations':>14}{'+ resident':>14}{'vs bound':>10}"]
        for name, value, frag in rows:
            lines.append(f"{name:<34}{format_bytes(value):>14}{format_bytes(value + self.resident_bytes):>14}"
                         f"{100 * frag:>9.1f}%")
        return "\n".join(lines)


def lifetimes_of(sim) -> list[Lifetime]:
    """The accelerator buffers of a simulation as planner lifetimes."""
    return [Lifetime(name, size, first, last) for name, size, first, last in sim.buffer_lifetimes]


def plan_step(sim) -> StepPlanReport:
    """Plan the activations of a simulated step (see module doc)."""
    lifetimes = lifetimes_of(sim)
    plans = [fn(lifetimes) for fn in STRATEGIES.values()] if lifetimes else []
    pools = {plan.strategy: plan.pool_bytes for plan in plans}
    best = min(plans, key=lambda p: p.pool_bytes) if plans else None  # first listed wins ties, as best_plan
    bfc = replay(BFCAllocatorModel(), lifetimes) if lifetimes else None
    caching = replay(CachingAllocatorModel(), lifetimes) if lifetimes else None
    return StepPlanReport(
        resident_bytes=sim.resident_bytes, lower_bound_bytes=lower_bound(lifetimes) if lifetimes else 0,
        planned_pool_bytes=best.pool_bytes if best else 0, planned_strategy=best.strategy if best else "-",
        strategy_pools=pools, bfc_peak_reserved_bytes=bfc.peak_reserved_bytes if bfc else 0,
        caching_peak_reserved_bytes=caching.peak_reserved_bytes if caching else 0,
        offsets=dict(best.offsets) if best else {}, num_tensors=len(lifetimes))
