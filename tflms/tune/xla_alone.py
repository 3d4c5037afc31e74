"""XLA alone first (issue 47, item 3): does the user's plain XLA step fit, with XLA's own rematerialization?

A Keras 3 user on a GPU, or a ``jit_compile=True`` step, already runs XLA, and XLA:GPU already saves some memory:
it fuses element-wise chains (fused tensors never reach memory: the ``xla`` clock, :mod:`tflms.sim.fusion`) and
runs ``HloRematerialization`` after scheduling, always, with a memory limit of about
``0.95 x (0.8 x device memory - the module's parameter and output bytes)`` when ``device_memory_size`` is unset, as
under TensorFlow (xla/service/gpu/gpu_compiler.cc; gpu_hlo_schedule.cc ``GetSchedulerMemoryLimit``, flag
``xla_gpu_memory_limit_slop_factor``; ../shared/docs/tf-facts.md). tflms steps in only where that is not enough,
or where its own plan is faster than XLA's rematerialization.

The model (every figure simulated):

- **The plain XLA step**: the unchanged step on the ``xla`` clock, its peak with the budget's margin.
- **XLA's limit**: :data:`XLA_SLOP` x (:data:`XLA_DEVICE_FRACTION` x the profile's memory - the step's resident
  bytes: variables, optimizer slots, arguments and constants are the module's parameters, and the updated variables
  its outputs, which alias them).
- **XLA's rematerialization** acts only where the step's transient bytes exceed the limit. It is modelled by the
  tuner's recompute-only search (``recompute="only"``: the cheapest re-runs per byte first, as XLA's greedy pass
  picks them) on the ``xla`` clock, held to the limit. Where that finds nothing, XLA keeps the plain step (its pass
  gives up and the module runs as scheduled).
- **XLA alone fits** where what XLA runs (the plain step, or its rematerialization) needs no more than the budget.

Deterministic: the same graph, profile, budget and options give the same verdict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tflms.errors import BudgetError
from tflms.units import format_bytes

#: XLA:GPU's scheduler memory limit is this fraction of device memory (gpu_hlo_schedule.cc), ...
XLA_DEVICE_FRACTION = 0.8
#: ... less the module's parameters and outputs, times this slop factor (``xla_gpu_memory_limit_slop_factor``: 95).
XLA_SLOP = 0.95


@dataclasses.dataclass(frozen=True)
class XlaAlone:
    """What the user's plain XLA step needs, and whether XLA alone fits the budget (simulated)."""

    profile: str
    budget_bytes: int
    limit_bytes: int  # XLA's rematerialization limit on the step's transient bytes
    plain_peak_bytes: int  # the plain XLA step's peak, with the budget's margin
    plain_step_s: float
    remat: bool  # XLA rematerializes (the plain step's transient bytes exceed its limit)
    remat_peak_bytes: int | None  # after XLA's rematerialization (None: it finds nothing under the limit)
    remat_step_s: float | None
    fits: bool

    @property
    def peak_bytes(self) -> int:
        """What XLA alone runs with: its rematerialization where it found one, else the plain step."""
        return self.remat_peak_bytes if self.remat_peak_bytes is not None else self.plain_peak_bytes

    @property
    def step_s(self) -> float:
        return self.remat_step_s if self.remat_step_s is not None else self.plain_step_s

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes, "step_s": self.step_s, "simulated": True,
                "text": self.text()}

    def text(self) -> str:
        """One sentence for the report."""
        if not self.remat:
            how = (f"the plain XLA step peaks at {format_bytes(self.plain_peak_bytes)} "
                   f"({1e3 * self.plain_step_s:.2f} ms), under XLA's rematerialization limit")
        elif self.remat_peak_bytes is None:
            how = (f"the plain XLA step peaks at {format_bytes(self.plain_peak_bytes)}; XLA's rematerialization "
                   f"finds nothing that brings it under its limit ({format_bytes(self.limit_bytes)} transient)")
        else:
            how = (f"XLA rematerializes the step ({format_bytes(self.plain_peak_bytes)} plain) to "
                   f"{format_bytes(self.remat_peak_bytes)}, {1e3 * self.remat_step_s:.2f} ms against "
                   f"{1e3 * self.plain_step_s:.2f} ms")
        verdict = "fits" if self.fits else "does not fit"
        return (f"XLA alone {verdict} the budget {format_bytes(self.budget_bytes)} on {self.profile} (simulated): "
                f"{how}")


def xla_limit_bytes(memory_bytes: int, resident_bytes: int) -> int:
    """XLA:GPU's rematerialization limit on a step's transient bytes (see the module doc)."""
    return max(0, int(XLA_SLOP * (XLA_DEVICE_FRACTION * memory_bytes - resident_bytes)))


def price_xla_alone(analysis: Any, profile: Any, budget_bytes: int, sim_options: Any, config: Any) -> XlaAlone:
    """The verdict on ``analysis``'s step compiled whole by XLA on ``profile`` (see the module doc).

    ``sim_options``: the budget's (its margin applies); the clock is set to ``xla`` here. ``config``: the user's,
    whose recompute-only search models XLA's rematerialization."""
    from tflms.config import RECOMPUTE_ONLY
    from tflms.sim.clock import CLOCK_XLA
    from tflms.sim.simulator import simulate
    from tflms.tune.tuner import tune
    options = dataclasses.replace(sim_options, clock=CLOCK_XLA)
    plain = simulate(analysis.graph, profile, options=options)
    limit = xla_limit_bytes(profile.memory_bytes, plain.resident_bytes)
    remat = plain.transient_peak_bytes > limit
    remat_peak = remat_step = None
    if remat:
        held = plain.peak_with_margin_bytes - plain.transient_peak_bytes + limit  # the limit, with the margin
        try:
            found = tune(analysis, budget=max(1, held), profile=profile, sim_options=options,
                         config=config.replace(recompute=RECOMPUTE_ONLY), strategies=("recompute",))
            remat_peak, remat_step = found.best.sim.peak_with_margin_bytes, found.best.sim.step_time_s
        except BudgetError:
            pass
    peak = remat_peak if remat_peak is not None else plain.peak_with_margin_bytes
    return XlaAlone(profile=profile.name, budget_bytes=budget_bytes, limit_bytes=limit,
                    plain_peak_bytes=plain.peak_with_margin_bytes, plain_step_s=plain.step_time_s, remat=remat,
                    remat_peak_bytes=remat_peak, remat_step_s=remat_step, fits=peak <= budget_bytes)


def xla_alone_tuning(alone: XlaAlone, tuned: Any = None) -> dict[str, Any]:
    """The report's ``tuning`` record of a step left to XLA (``tuned``: the tuner's result where it ran, its plan
    no faster than XLA's rematerialization): the keys :meth:`tflms.report.RewriteReport.prediction` reads."""
    why = (f"{alone.text()}; the step is left to XLA, compiled whole" if tuned is None else
           f"{alone.text()}; the step is left to XLA, compiled whole: tflms's fastest plan "
           f"({tuned.best.strategy}, {1e3 * tuned.best.sim.step_time_s:.2f} ms) is no faster")
    return {"strategy": "xla-alone", "reason": why, "profile": alone.profile, "budget_bytes": alone.budget_bytes,
            "baseline_peak_bytes": alone.plain_peak_bytes, "predicted_peak_bytes": alone.peak_bytes,
            "baseline_step_time_s": alone.plain_step_s, "predicted_step_time_s": alone.step_s,
            "overhead": alone.step_s / alone.plain_step_s - 1 if alone.plain_step_s else 0.0,
            "xla_alone": alone.to_dict()}
