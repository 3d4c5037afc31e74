"""The rewrite report: what was swapped, what was skipped, and why; the step's memory over time, predicted, and
its peak as measured on a GPU.

:class:`MemoryPicture` keeps a compact copy of the simulator's timelines before and after the rewrite, with the
swaps and recomputes marked (:meth:`RewriteReport.plot` draws it, with matplotlib, the ``plot`` extra).
:class:`MeasuredPeak` is filled after the first step the rewritten function runs: on a GPU, the peak TensorFlow's
allocator saw (``tf.config.experimental.get_memory_info``), set beside the predicted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from typing import Any

from tflms.policies.swapplan import SwapPlan
from tflms.units import format_bytes

from tflms.report.memory import (MEMORY_POINTS, NOT_MEASURED, MeasuredPeak, MemoryPicture, Timeline,  # noqa: F401
                                 memory_picture)


@dataclasses.dataclass(frozen=True)
class RewriteReport:
    """Everything a rewrite did, in a form for people (``table()``) and machines (``to_dict()``)."""

    plan: SwapPlan
    graph_summary: dict[str, Any]
    inserted_ops: tuple[str, ...]
    timings_s: dict[str, float]
    tuning: dict[str, Any] | None = None  # the tuner's summary when a budget chose the parameters
    compression: dict[str, str] = dataclasses.field(default_factory=dict)  # swapped tensor -> codec
    #: the hardware the plan and any prediction are for: ``profile`` (None when nothing was simulated),
    #: ``source`` (given / device / default), ``why``, ``planned_for`` (accelerator), ``runs_on`` (this machine)
    hardware: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the order pass's record (:meth:`tflms.passes.order.OrderReport.to_dict`: ``applied``, ``edges`` (how
    #: many), ``heuristic``, peaks, ``why``); ``None`` when the pass did not run (``LMSConfig.orders`` off, or
    #: the tuner's winner was judged without the order's edges). A budgeted rewrite's record also says how
    #: TensorFlow's executor is held to the budget (:func:`tflms.passes.order.hold_to_budget`): ``guarantee``
    #: (pinned / any-order / not-guaranteed), ``any_order_bound_bytes`` (the most any order can peak; ``None``
    #: when pinned by the tuner) and ``guarantee_why``
    order: dict[str, Any] | None = None
    #: each grappler accumulator's pinned summation order (:meth:`tflms.ir.preoptimize.AccumulatorPin.to_dict`:
    #: ``result``, ``order`` (its AssignAdds, first to last), ``source`` (observed / cpu-pool / gpu-inline), ``why``)
    accumulations: tuple[dict[str, Any], ...] = ()
    #: the step's memory over time before and after, as the tuner simulated it (``None``: nothing was simulated,
    #: the TFLMS rules without a budget or profile); :meth:`plot` draws it
    memory: MemoryPicture | None = None
    #: the XLA clusters a step that keeps XLA runs between tflms's copies (issue 47,
    #: :meth:`tflms.passes.xla_clusters.ClusterReport.to_dict`: ``kept``, ``clusters``, ``segments``, ``why``, ...);
    #: ``None`` when the step runs without XLA. (``xla_cost`` is another thing: what leaving XLA would cost.)
    xla_clusters: dict[str, Any] | None = None
    #: the peak measured over the first step that ran (on a GPU), filled after it; not part of equality
    measured: MeasuredPeak = dataclasses.field(default_factory=MeasuredPeak, compare=False)

    @property
    def swaps(self):
        return self.plan.swaps

    @property
    def skipped(self):
        return self.plan.skipped

    @property
    def warnings(self):
        return self.plan.warnings

    @property
    def num_swapped(self) -> int:
        return len(self.plan.swaps)

    @property
    def swapped_bytes(self) -> int:
        return self.plan.swapped_bytes

    @property
    def changed(self) -> bool:
        """Whether the rewrite inserted anything: swaps or recomputes."""
        return self.plan.changed

    @property
    def recomputes(self):
        return self.plan.recomputes

    @property
    def num_recomputed(self) -> int:
        """Tensors the backward pass reads from a recompute instead of keeping them."""
        return sum(len(r.tensors) for r in self.plan.recomputes)

    @property
    def recomputed_bytes(self) -> int:
        return self.plan.recomputed_bytes

    @property
    def unknown_size_skips(self) -> int:
        """Candidates left unswapped because their size is unknown (reason ``unknown-shape``)."""
        return sum(1 for k in self.plan.skipped if k.reason == "unknown-shape")

    def prediction(self) -> dict[str, Any] | None:
        """The simulator's verdict on this rewrite, or ``None`` when nothing was simulated (no budget/profile).

        Keys: ``profile``, ``budget_bytes``, ``peak_before_bytes`` / ``peak_after_bytes``
        (predicted accelerator peak without and with the swaps, each with the margin), ``step_time_before_s`` /
        ``step_time_after_s``, ``overhead`` (relative step-time increase), ``margin_fraction`` (the margin the
        peaks carry: :data:`tflms.budget.DEFAULT_MARGIN_FRACTION` for a budget tflms chose, 0 for one given).
        """
        t = self.tuning
        if not t:
            return None
        return {"profile": t["profile"], "budget_bytes": t["budget_bytes"],
                "peak_before_bytes": t["baseline_peak_bytes"], "peak_after_bytes": t["predicted_peak_bytes"],
                "step_time_before_s": t["baseline_step_time_s"], "step_time_after_s": t["predicted_step_time_s"],
                "overhead": t["overhead"], "margin_fraction": t.get("margin_fraction", 0.0)}

    @property
    def plan_cache(self) -> dict[str, Any] | None:
        """What the plan cache did (:mod:`tflms.tune.plancache`): ``status`` (``hit``: the plan was reused;
        ``stored``: tuned and stored; ``off``; ``not-used``; ``not-stored``), ``path``, ``why``, and on a hit
        ``tune_s`` (what the tune took when it ran) and ``load_s``; ``None`` when nothing was tuned."""
        return (self.tuning or {}).get("plan_cache")

    @property
    def xla_cost(self) -> dict[str, Any] | None:
        """What running this step without XLA costs on the profile (:func:`tflms.pipeline.hardware.xla_cost`):
        ``graph_step_s`` (TensorFlow's executor, as tflms's rewrite runs), ``xla_step_s`` (XLA:GPU), ``slowdown``, all
        simulated for the unchanged step; ``None`` when nothing was tuned or the profile is a CPU's."""
        return (self.tuning or {}).get("xla")

    def xla_text(self) -> str:
        """One line: the unchanged step's predicted time without XLA against XLA's (``""`` without :attr:`xla_cost`)."""
        x = self.xla_cost
        if not x or not x.get("slowdown"):
            return ""
        return (f"without XLA: the unchanged step is predicted {x['slowdown']:.2f}x XLA's time on {x['profile']} "
                f"({1e3 * x['graph_step_s']:.1f} ms in TensorFlow's executor against {1e3 * x['xla_step_s']:.1f} ms "
                "compiled by XLA; simulated, before any swap)")

    def xla_clusters_text(self) -> str:
        """One line: the XLA clusters the step runs between the copies (``""`` when it runs without XLA)."""
        x = self.xla_clusters
        return "" if not x else f"XLA kept: {x['why']}"

    def plan_cache_text(self) -> str:
        """One line: whether the plan was tuned or reused from the plan cache, and where (``""``: not tuned)."""
        c = self.plan_cache
        if not c:
            return ""
        status = c.get("status")
        if status == "hit":
            tuned = f"tuned in {c['tune_s']:.1f} s when stored; " if c.get("tune_s") is not None else ""
            return (f"plan cache: plan reused from {c['path']} ({tuned}read and rebuilt in "
                    f"{1e3 * c.get('load_s', 0.0):.0f} ms)")
        if status == "stored":
            return f"plan cache: tuned; plan stored at {c['path']}"
        if status == "off":
            return f"plan cache: {c.get('why', 'off')}"
        if status == "not-used":
            return f"plan cache: not used ({c.get('why', '')})"
        return f"plan cache: plan not stored ({c.get('why', '')})"

    def prediction_text(self) -> str:
        """One line: predicted peak before -> after, overhead and the profile (or why there is no prediction)."""
        p = self.prediction()
        if p is None:
            return "no prediction (no budget or profile given: nothing was simulated)"
        margin = f", {p['margin_fraction']:.0%} margin included" if p["margin_fraction"] else ""
        return (f"predicted peak {format_bytes(p['peak_before_bytes'])} -> {format_bytes(p['peak_after_bytes'])} "
                f"(budget {format_bytes(p['budget_bytes'])}{margin}), step time {100 * p['overhead']:+.1f}% "
                f"on {p['profile']}")

    def hardware_text(self) -> str:
        """One line: the hardware profile the plan is for and why, and where the step runs."""
        h = self.hardware
        if not h:
            return f"hardware: accelerator {self.plan.accelerator_device}"
        if h.get("profile") is None:
            return f"hardware: no profile ({h['why']}); swaps planned for {h['planned_for']}"
        where = (f"planned for {h['planned_for']} of that profile" if h["planned_for"] == h["runs_on"] else
                 f"planned for {h['planned_for']} of that profile; this machine runs the step on {h['runs_on']}")
        budget = f"; budget: {h['budget']}" if h.get("budget") else ""
        math = f"; {h['math']}" if h.get("math") else ""
        math += f"; {h['pinned_host']}" if h.get("pinned_host") else ""
        return f"hardware: {h['profile']} ({h['why']}); {where}{budget}{math}"

    def accumulations_text(self) -> str:
        """One line: how the summation order of grappler's accumulators was pinned (``""`` when there are none)."""
        if not self.accumulations:
            return ""
        sources = Counter(a["source"] for a in self.accumulations)
        said = {"observed": "observed in calls of the step on this machine",
                "observed-racy": "observed on this machine, but it varied between calls (a race the plain step "
                                 "runs too: bitwise is not guaranteed)",
                "cpu-pool": "a CPU executor's usual order (reverse graph order), nothing observed",
                "gpu-inline": "a GPU executor's order (graph order)"}
        why = next((a["why"] for a in self.accumulations if a.get("why")), "")
        return (f"accumulators: {len(self.accumulations)} grappler accumulator(s), summation order "
                + "; ".join(f"{n} {said.get(s, s)}" for s, n in sorted(sources.items()))
                + (f" ({why})" if why else ""))

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.plan.config.to_dict(),
            "accelerator_device": self.plan.accelerator_device,
            "graph": self.graph_summary,
            "swapped_bytes": self.swapped_bytes,
            "swaps": [{
                "tensor": s.tensor.name, "dtype": s.dtype, "bytes": s.num_bytes,
                "producer_level": s.producer_level, "swap_out": s.swap_out,
                "sync_out_consumers": list(s.sync_out_consumers),
                "swap_ins": [{
                    "name": g.name, "consumers": list(g.consumers), "consumer_levels": list(g.consumer_levels),
                    "trigger": g.trigger, "trigger_level": g.trigger_level, "sync": g.sync, "note": g.note,
                } for g in s.swap_ins],
            } for s in self.plan.swaps],
            "recomputed_bytes": self.recomputed_bytes,
            "recomputes": [{
                "ops": list(r.ops), "clones": list(r.clones), "tensors": [t.name for t in r.tensors],
                "readers": [list(rs) for rs in r.readers], "bytes": r.num_bytes,
                "sources": [t.name for t in r.sources], "triggers": list(r.triggers), "copy": r.copy,
            } for r in self.plan.recomputes],
            "skipped": [{"tensor": k.tensor.name, "reason": k.reason, "detail": k.detail}
                        for k in self.plan.skipped],
            "warnings": list(self.plan.warnings),
            "inserted_ops": list(self.inserted_ops),
            "timings_s": dict(self.timings_s),
            "tuning": self.tuning,
            "compression": dict(self.compression),
            "hardware": dict(self.hardware),
            "order": self.order,
            "accumulations": [dict(a) for a in self.accumulations],
            "prediction": self.prediction(),
            "memory": None if self.memory is None else self.memory.to_dict(timelines=False),
            "xla_clusters": self.xla_clusters,
            "measured": self.measured.to_dict(),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def plot(self, path: str | os.PathLike | None = None, *, title: str | None = None) -> Any:
        """Draw the step's accelerator memory over one simulated step, without and with the rewrite, and return the
        matplotlib ``Figure``; with ``path``, also save it there (PNG, or as its suffix says).

        The rewritten step's line carries a marker where each copy to the host (swap-out, ``v``) and each copy back
        (swap-in, ``^``) starts, and where each recompute chain starts (``x``); the budget is a dashed line, the
        measured peak (after the first step on a GPU) a dotted one. Needs matplotlib (the ``plot`` extra); raises
        :class:`~tflms.errors.MissingExtraError` without it, and :class:`~tflms.errors.ConfigError` for a rewrite
        nothing was simulated for (the TFLMS rules without a budget or profile).
        """
        from tflms.report.plot import plot_report
        return plot_report(self, path, title=title)

    def table(self, max_rows: int | None = 40, *, wide: bool = False, legend: bool = True) -> str:
        """A readable summary with one row per swapped tensor, skip counts and a legend of the columns.

        ``max_rows`` swapped tensors at most (``None``: all); ``wide=True`` shows
        every row with full tensor names and consumer levels (``to_json()`` always
        has everything).
        """
        if wide:
            max_rows = None
        lines = []
        g = self.graph_summary
        lines.append(f"graph: {g.get('ops')} ops, {g.get('levels')} levels, categories {g.get('categories')}")
        lines.append(self.hardware_text())
        if self.tuning:
            lines.append(f"tuning: {self.tuning['reason']}")
            lines.append(self.prediction_text())
            if self.plan_cache:
                lines.append(self.plan_cache_text())
            if self.xla_text() and not self.xla_clusters:
                lines.append(self.xla_text())
        if self.xla_clusters:
            lines.append(self.xla_clusters_text())
        if self.measured.done:
            lines.append(self.measured.text(None if self.memory is None else self.memory.after.peak_bytes))
        if self.order is not None:
            when = ", pinned before the swaps, which were chosen in it" if self.order.get("before_swaps") else ""
            if "why" in self.order:
                lines.append(f"order: {self.order['why']}{when}")
            if self.order.get("guarantee_why"):
                lines.append(f"budget in TensorFlow's executor: {self.order['guarantee_why']}")
        if self.accumulations:
            lines.append(self.accumulations_text())
        lines.append(f"swapped: {self.num_swapped} tensors, {format_bytes(self.swapped_bytes)} "
                     f"-> accelerator {self.plan.accelerator_device}, host {self.plan.config.host_device}")
        shown = self.plan.swaps if max_rows is None else self.plan.swaps[:max_rows]
        if shown:
            short = (lambda n: n) if wide else _short
            levels = (lambda v: ",".join(str(x) for x in v)) if wide else _levels
            header = ("tensor", "bytes", "lvl", "consumer lvls", "trigger (lvl)", "sync")
            rows = []
            for s in shown:
                for i, grp in enumerate(s.swap_ins):
                    trig = "-" if grp.trigger is None else f"{short(grp.trigger)} ({grp.trigger_level})"
                    rows.append((short(s.tensor.name) if i == 0 else "", format_bytes(s.num_bytes) if i == 0 else "",
                                 str(s.producer_level) if i == 0 else "", levels(grp.consumer_levels), trig,
                                 "yes" if grp.sync else "no"))
            widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines.append(fmt.format(*header))
            lines.append(fmt.format(*("-" * w for w in widths)))
            lines.extend(fmt.format(*r).rstrip() for r in rows)
            if len(shown) < len(self.plan.swaps):
                lines.append(f"... and {len(self.plan.swaps) - len(shown)} more swapped tensors "
                             "(table(wide=True) (--wide) or to_json() (--json) lists all)")
            if legend:
                lines.extend(LEGEND)
        if self.plan.recomputes:
            adds = (self.tuning or {}).get("recompute_time_s")
            lines.append(f"recomputed: {self.num_recomputed} tensors, {format_bytes(self.recomputed_bytes)}, by "
                         f"{sum(len(r.ops) for r in self.plan.recomputes)} cloned ops in "
                         f"{sum(1 for r in self.plan.recomputes if not r.copy)} chains"
                         + (f", and {again} re-runs of a chain's first ops for their own readers"
                            if (again := sum(1 for r in self.plan.recomputes if r.copy)) else "")
                         + (f"; they add {adds * 1e3:.2f} ms of compute (simulated)" if adds is not None else ""))
            shown_r = self.plan.recomputes if max_rows is None else self.plan.recomputes[:max_rows]
            short = (lambda n: n) if wide else _short
            header = ("tensors", "bytes", "ops re-run", "trigger")
            rows = [(short(", ".join(t.name for t in r.tensors)), format_bytes(r.num_bytes),
                     ", ".join(r.ops) if wide else str(len(r.ops)), short(r.triggers[0]))
                    for r in shown_r]
            widths = [max(len(h), *(len(row[c]) for row in rows)) for c, h in enumerate(header)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines.append(fmt.format(*header))
            lines.append(fmt.format(*("-" * w for w in widths)))
            lines.extend(fmt.format(*row).rstrip() for row in rows)
            if len(shown_r) < len(self.plan.recomputes):
                lines.append(f"... and {len(self.plan.recomputes) - len(shown_r)} more recompute chains")
        if self.compression:
            codecs = Counter(self.compression.values())
            lines.append("compressed: " + ", ".join(f"{n} with {c}" for c, n in sorted(codecs.items())))
        if self.plan.skipped:
            counts = Counter(k.reason for k in self.plan.skipped)
            lines.append("skipped candidates: " + ", ".join(f"{r} x{n}" for r, n in sorted(counts.items())))
        if self.unknown_size_skips:
            lines.append(f"note: {self.unknown_size_skips} tensors of unknown size were not swapped"
                         + (" (give batch_size=N (--batch-size N) to size an unknown batch dimension)"
                            if self.plan.config.batch_size is None else ""))
        for w in self.plan.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


#: What the columns of :meth:`RewriteReport.table` mean.
LEGEND = (
    "columns: tensor = the swapped tensor (op:output); bytes = its size; lvl = its producer's level "
    "(longest path from the inputs);",
    "  consumer lvls = levels of the consumers one swap-in feeds (one row per swap-in); trigger (lvl) = the op "
    "whose completion starts that swap-in, and its level;",
    "  sync = yes when the consumer waits for the copy (no trigger found, or sync_mode asks for it).",
)


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]


def _levels(levels) -> str:
    text = ",".join(str(v) for v in levels)
    return text if len(text) <= 24 else text[:21] + "..."
