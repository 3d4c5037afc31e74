"""The step's memory over time, predicted, and its peak as measured on a GPU (parts of :mod:`tflms.report`).

:class:`MemoryPicture` keeps a compact copy of the simulator's timelines before and after the rewrite, with the
swaps and recomputes marked (:meth:`tflms.report.RewriteReport.plot` draws it, with matplotlib, the ``plot`` extra).
:class:`MeasuredPeak` is filled after the first step the rewritten function runs: on a GPU, the peak TensorFlow's
allocator saw (``tf.config.experimental.get_memory_info``), set beside the predicted one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tflms import devices
from tflms.units import format_bytes


#: At most this many points of each simulated timeline are kept in a report; where a step has more, each kept point
#: stands for a run of consecutive ones, with their highest memory, so the peak is kept exactly.
MEMORY_POINTS = 4096


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Accelerator memory over one simulated step: ``accelerator_bytes[i]`` from ``times_s[i]`` to the next time."""

    times_s: tuple[float, ...]
    accelerator_bytes: tuple[int, ...]
    peak_bytes: int  # the simulator's peak (live bytes, no margin)
    step_time_s: float

    @classmethod
    def of(cls, sim: Any, points: int = MEMORY_POINTS) -> "Timeline":
        """The timeline of a :class:`~tflms.sim.simulator.SimResult`, at most ``points`` points (see
        :data:`MEMORY_POINTS`)."""
        rows = list(sim.timeline) or [(0.0, sim.peak_bytes, 0)]
        if len(rows) > points:
            size = -(-len(rows) // points)  # ceil: runs of this many points become one
            rows = [(rows[i][0], max(r[1] for r in rows[i:i + size])) for i in range(0, len(rows), size)]
        return cls(tuple(float(r[0]) for r in rows), tuple(int(r[1]) for r in rows), int(sim.peak_bytes),
                   float(sim.step_time_s))

    def bytes_at(self, time_s: float) -> int:
        """The accelerator bytes the timeline holds at ``time_s``."""
        import bisect
        i = bisect.bisect_right(self.times_s, time_s) - 1
        return self.accelerator_bytes[max(i, 0)]

    def to_dict(self) -> dict[str, Any]:
        return {"times_s": list(self.times_s), "accelerator_bytes": list(self.accelerator_bytes),
                "peak_bytes": self.peak_bytes, "step_time_s": self.step_time_s}


@dataclasses.dataclass(frozen=True)
class MemoryPicture:
    """The step's memory over time before and after the rewrite, as the tuner simulated them, with when each copy
    to the host (swap-out), copy back (swap-in) and recompute chain starts in the rewritten step."""

    profile: str
    budget_bytes: int
    margin_fraction: float
    before: Timeline
    after: Timeline
    swap_outs_s: tuple[float, ...] = ()
    swap_ins_s: tuple[float, ...] = ()
    recomputes_s: tuple[float, ...] = ()

    def to_dict(self, *, timelines: bool = True) -> dict[str, Any]:
        """Everything, JSON-ready; ``timelines=False`` leaves the two timelines' points out (the report's
        ``to_dict`` does: they are large)."""
        out = {"profile": self.profile, "budget_bytes": self.budget_bytes, "margin_fraction": self.margin_fraction,
               "peak_before_bytes": self.before.peak_bytes, "peak_after_bytes": self.after.peak_bytes,
               "swap_outs": len(self.swap_outs_s), "swap_ins": len(self.swap_ins_s),
               "recomputes": len(self.recomputes_s)}
        if timelines:
            out.update(before=self.before.to_dict(), after=self.after.to_dict(), swap_outs_s=list(self.swap_outs_s),
                       swap_ins_s=list(self.swap_ins_s), recomputes_s=list(self.recomputes_s))
        return out


def memory_picture(tuned: Any, margin_fraction: float = 0.0) -> MemoryPicture | None:
    """The :class:`MemoryPicture` of a tune (:class:`tflms.tune.result.TuneResult`): its baseline and its winner
    (``None`` for a plan reused from the plan cache, which keeps no timelines).

    Copies come from the winner's simulated ops by stream (``d2h``: swap-outs, ``h2d``: swap-ins); a recompute chain
    starts when the first of its clones does.
    """
    after = tuned.best.sim
    if not hasattr(after, "ops"):  # a plan reused from the plan cache keeps no timelines (report.plot says so)
        return None
    ops = list(after.ops)
    plan = tuned.best.plan
    starts = {o.name: o.start_s for o in ops}
    chains = [] if plan is None else [min((starts[c] for c in r.clones if c in starts), default=None)
                                      for r in plan.recomputes]
    return MemoryPicture(
        profile=tuned.profile, budget_bytes=int(tuned.budget_bytes), margin_fraction=float(margin_fraction),
        before=Timeline.of(tuned.baseline), after=Timeline.of(after),
        swap_outs_s=tuple(sorted(o.start_s for o in ops if o.stream == "d2h")),
        swap_ins_s=tuple(sorted(o.start_s for o in ops if o.stream == "h2d")),
        recomputes_s=tuple(sorted(t for t in chains if t is not None)))


#: What :class:`MeasuredPeak` says before any step has run through the report's function.
NOT_MEASURED = ("not measured: no step has run through tflms (the SavedModel commands and tflms.rewrite do not run "
                "it; tflms.function and the Keras callback measure their first step)")


@dataclasses.dataclass
class MeasuredPeak:
    """The accelerator memory TensorFlow's allocator measured over the first step the rewritten function ran.

    Filled once, by :meth:`around` (``tflms.function`` and the Keras callback call it for the first step of each
    trace). On a GPU: the peak of ``tf.config.experimental.get_memory_info`` over that step, summed over this
    machine's GPUs (the prediction sums the local replicas too), each GPU's in ``per_device``. Without a GPU, or
    before the first step, ``peak_bytes`` is ``None`` and ``why`` says why: no figure is made up.
    """

    peak_bytes: int | None = None
    per_device: dict[str, int] = dataclasses.field(default_factory=dict)
    why: str = NOT_MEASURED
    done: bool = False

    def around(self, step: Callable[[], Any]) -> Any:
        """Run ``step()`` and, the first time, measure its peak (:func:`tflms.devices.reset_gpu_peaks` before it,
        :func:`tflms.devices.gpu_peaks` after it); returns what ``step()`` returns."""
        if self.done:
            return step()
        names = devices.reset_gpu_peaks()
        out = step()
        if not names:
            self.why = ("unavailable: this machine has no GPU (TensorFlow measures a GPU's peak only, "
                        "tf.config.experimental.get_memory_info)")
        else:
            try:
                self.per_device = dict(devices.gpu_peaks(names))
                self.peak_bytes = sum(self.per_device.values())
                self.why = "TensorFlow's allocator over the first step"
            except (ValueError, RuntimeError) as err:
                self.why = f"unavailable: TensorFlow gave no memory statistics for {', '.join(names)} ({err})"
        self.done = True
        return out

    def text(self, predicted_bytes: int | None = None) -> str:
        """One line: the measured peak beside ``predicted_bytes``, or why there is none."""
        if self.peak_bytes is None:
            return f"measured peak: {self.why}"
        where = ", ".join(f"{d} {format_bytes(b)}" for d, b in sorted(self.per_device.items()))
        beside = "" if predicted_bytes is None else f"; predicted {format_bytes(predicted_bytes)}"
        return f"measured peak: {format_bytes(self.peak_bytes)} ({where}; {self.why}){beside}"

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "per_device": dict(self.per_device), "why": self.why}
