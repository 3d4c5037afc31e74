"""Drawing a report's memory picture (:meth:`tflms.report.RewriteReport.plot`), with matplotlib (the ``plot`` extra),
kept apart from the report's records."""

from __future__ import annotations

import os
from typing import Any

from tflms.errors import ConfigError, MissingExtraError
from tflms.units import format_bytes


def plot_report(report: Any, path: str | os.PathLike | None = None, *, title: str | None = None) -> Any:
    """:meth:`tflms.report.RewriteReport.plot` (its doc says what is drawn and what is raised)."""
    picture = report.memory
    if picture is None and (report.plan_cache or {}).get("status") == "hit":
        raise ConfigError("report.plot(): this plan was reused from the plan cache "
                          f"({report.plan_cache.get('path')}), which keeps the plan, not the simulated timelines. "
                          "Rewrite with plan_cache=False (or TFLMS_PLAN_CACHE=0) to tune again and draw it")
    if picture is None:
        raise ConfigError("report.plot(): nothing was simulated for this rewrite (TFLMS rule parameters without "
                          "budget= or profile= place the swaps without the simulator). Give budget= or profile=, "
                          "or leave the rule parameters out (the default tunes), to get the memory picture")
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingExtraError(
            "report.plot() needs matplotlib, which tflms does not require: install the plot extra "
            "(pip install -e \".[plot]\" in your clone of tflms) or pip install matplotlib") from err
    unit, gib = next((u, b) for u, b in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
                     if max(picture.before.peak_bytes, picture.budget_bytes) >= b or b == 1)
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    for name, line, color, width in (("without tflms", picture.before, "black", 1.6),
                                      ("with tflms", picture.after, "tab:blue", 1.2)):
        ax.step([1e3 * t for t in line.times_s], [b / gib for b in line.accelerator_bytes], where="post",
                color=color, linewidth=width,
                label=f"{name} (peak {format_bytes(line.peak_bytes)}, step {1e3 * line.step_time_s:.1f} ms)")
    for label, times, marker, color in (("swap-out", picture.swap_outs_s, "v", "tab:orange"),
                                        ("swap-in", picture.swap_ins_s, "^", "tab:green"),
                                        ("recompute", picture.recomputes_s, "x", "tab:purple")):
        if times:
            ax.plot([1e3 * t for t in times], [picture.after.bytes_at(t) / gib for t in times], linestyle="none",
                    marker=marker, markersize=6, color=color, label=f"{label} ({len(times)})")
    margin = f" (peak + {picture.margin_fraction:.0%} must fit)" if picture.margin_fraction else ""
    ax.axhline(picture.budget_bytes / gib, color="red", linestyle="--", linewidth=1,
               label=f"budget {format_bytes(picture.budget_bytes)}{margin}")
    if report.measured.peak_bytes is not None:
        ax.axhline(report.measured.peak_bytes / gib, color="tab:gray", linestyle=":", linewidth=1.2,
                   label=f"measured peak {format_bytes(report.measured.peak_bytes)} (first step)")
    ax.set_xlabel("simulated time in the step (ms)")
    ax.set_ylabel(f"accelerator memory ({unit})")
    ax.set_title(title or f"memory over one training step on {picture.profile} (simulated)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig
