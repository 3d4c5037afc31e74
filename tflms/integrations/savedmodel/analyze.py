"""Analysis without writing: ordering summary, swap report and simulated memory of every trace."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.config import LMSConfig
from tflms.errors import TflmsError
from tflms.integrations.savedmodel.read import (_load, _resolve, _traces, check_input_dir, describe_trace,
                                                keras_export_message, read_saved_model, select_functions)
from tflms.report import RewriteReport
from tflms.units import format_bytes


@dataclasses.dataclass(frozen=True)
class TraceAnalysis:
    """Ordering summary, swap report and simulated memory of one trace."""

    function: str
    trace: int
    signature: str
    summary: Mapping[str, Any]
    report: RewriteReport | None
    original_memory: Any  # tflms.sim.SimResult
    rewritten_memory: Any  # tflms.sim.SimResult, or None when nothing was rewritten
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        def memory(sim):
            if sim is None:
                return None
            return {**sim.summary(), "unknown_size_tensors": len(sim.unknown_size_tensors),
                    "live_at_peak": [{"tensor": t, "bytes": b} for t, b in sim.live_at_peak],
                    "live_at_peak_count": len(sim.live_at_peak)}
        return {"function": self.function, "trace": self.trace, "signature": self.signature,
                "graph": dict(self.summary), "report": None if self.report is None else self.report.to_dict(),
                "memory": {"original": memory(self.original_memory), "rewritten": memory(self.rewritten_memory)},
                "note": self.note}

    def table(self, top: int = 8, *, wide: bool = False) -> str:
        """Readable summary; ``top`` tensors alive at the peak (``wide=True``: all, and every swap row)."""
        s = self.summary
        cats = ", ".join(f"{k} {v}" for k, v in s["categories"].items())
        lines = [f"{self.function} ({self.signature})",
                 f"  ordering: {s['ops']} ops, {s['levels']} levels; {cats}"]
        if self.report is not None:  # its first line repeats the ordering summary
            lines.extend("  " + line for line in self.report.table(wide=wide).splitlines()
                         if not line.startswith("graph:"))
        if self.note:
            lines.append(f"  note: {self.note}")
        for label, sim in (("original", self.original_memory), ("rewritten", self.rewritten_memory)):
            if sim is None:
                continue
            lines.append(f"  memory ({label}, {sim.profile}): peak {format_bytes(sim.peak_bytes)} = resident "
                         f"{format_bytes(sim.resident_bytes)} + activations {format_bytes(sim.transient_peak_bytes)}"
                         f"; host peak {format_bytes(sim.host_peak_bytes)}; step {sim.step_time_s * 1e3:.3f} ms"
                         + (f"; {len(sim.unknown_size_tensors)} tensors of unknown size counted as 0"
                            if sim.unknown_size_tensors else ""))
            if sim.live_at_peak:
                lines.append(f"    alive at the peak ({len(sim.live_at_peak)} tensors), largest first:")
                shown = sim.live_at_peak if wide else sim.live_at_peak[:top]
                lines.extend(f"      {format_bytes(b):>12}  {t}" for t, b in shown)
        return "\n".join(lines)


def analyze_saved_model(in_dir: str | os.PathLike, config: LMSConfig | None = None, *,
                        functions: Sequence[str] | None = None, **options: Any) -> list[TraceAnalysis]:
    """Analyze the functions of a SavedModel without writing anything (see :class:`TraceAnalysis`).

    Every trace of the selected functions (default: all) gets its ordering
    summary and simulated memory; traces with a training step also get the swap
    report for ``config`` and the simulated memory after the rewrite. The
    simulation uses ``config.profile``, else the profile closest to this
    machine's GPU, else ``v100-16gb-pcie3`` (:func:`~tflms.profiles.select_profile`).
    A budget nothing fits is reported in the trace's ``note``. Raises
    :class:`~tflms.errors.UnknownSizeError` when tensors of an unknown batch
    dimension would count as 0 bytes in a verdict (give ``batch_size``).
    """
    from tflms.analysis.cto import analyze_graph
    from tflms.errors import BudgetError, NoTrainingStepError
    from tflms.ir import preoptimize
    from tflms.ir.tf_io import load_graph
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.devices import local_gpu
    from tflms.pipeline import rewrite_step
    from tflms.profiles import select_profile
    from tflms.tune.tuner import check_known_sizes

    config = LMSConfig.from_kwargs(config, **options)
    functions = [functions] if isinstance(functions, str) else functions
    in_path = check_input_dir(in_dir)
    info = read_saved_model(in_path)
    selected, _ = select_functions(info, functions)
    loaded = _load(in_path)
    profile = select_profile(config.profile, local_gpu()).name
    sim_options = SimOptions(host_device=config.host_device)
    out = []
    for finfo in selected:
        for i, cf in enumerate(_traces(_resolve(loaded, finfo.path), finfo)):
            signature = describe_trace(cf)
            try:
                cf = preoptimize.preoptimize(cf)  # the graph `tflms rewrite` rewrites: after grappler
                graph = load_graph(cf, batch_size=config.batch_size)
                analysis = analyze_graph(graph)
            except TflmsError as err:
                raise type(err)(f"function {finfo.path!r} ({signature}) of {info.path}: {err}") from err
            if info.keras_export and not analysis.has_backward:
                continue  # an inference endpoint of model.export(): said below when nothing else is there
            original = simulate(graph, profile, options=sim_options)
            try:
                check_known_sizes(graph, original, config.batch_size)
            except TflmsError as err:
                raise type(err)(f"function {finfo.path!r} ({signature}) of {info.path}: {err}") from err
            report, rewritten, note = None, None, ""
            if not analysis.has_backward:
                note = "no training step (no gradient ops): nothing to swap; it is kept as is by tflms rewrite"
            else:
                try:
                    result = rewrite_step(cf, config, build=False)
                    report = result.report
                    rewritten = simulate(result.graph, profile, options=sim_options)
                except BudgetError as err:
                    note = str(err)
            out.append(TraceAnalysis(finfo.path, i, signature, analysis.summary(), report, original, rewritten, note))
    if info.keras_export and not out:
        raise NoTrainingStepError(keras_export_message(info))
    return out
