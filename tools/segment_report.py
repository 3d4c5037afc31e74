"""Checkpoint choices side by side: evenly spaced against chosen by bytes, simulated peaks and step times.

For a bench model at a size (tools/benchlib: the traced training step, the bench's 5% headroom), every
recomputable op of each segment is re-run (no swaps), with the kept articulations chosen two ways:
evenly spaced (:func:`tflms.policies.checkpoints.segment_ops`: one segment, sqrt(n), every articulation) and
by bytes (:func:`tflms.policies.checkpoints.balanced_segment_ops` at each of
:data:`tflms.tune.recompute_sets.BALANCED_SLACKS`). Each plan's peak (with headroom) in level order and with the
memory-aware order pinned (:func:`tflms.passes.order.enforce_order`, as the pipeline runs it), and its step
time. Figures are simulated (tflms.sim), not measured on a GPU.

    python tools/segment_report.py --point resnet50:1347 --point densenet121:1143 --point bert-base:324
    python tools/segment_report.py --point mlp-tiny:64 --profile v100-16gb-nvlink2 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def plans_at(steps: Any, model: str, size: int, profile_name: str) -> list[dict[str, Any]]:
    """One row per checkpoint choice at ``model``'s ``size`` on ``profile_name``."""
    from benchlib.common import HEADROOM

    from tflms.analysis.cto import analyze_graph
    from tflms.passes.order import enforce_order
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import articulations, balanced_segment_ops, recompute_plan, segment_ops
    from tflms.profiles import get_profile
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.tune.hybrid import BALANCED_SLACKS
    profile, options = get_profile(profile_name), SimOptions(margin_fraction=HEADROOM)
    graph, _ = steps.graph(model, "plain", size)
    analysis = analyze_graph(graph)
    cuts = articulations(analysis)
    choices = [(f"evenly spaced, segments: {k}", segment_ops(analysis, k))
               for k in sorted({1, max(1, round(math.sqrt(len(cuts)))), len(cuts)})]
    choices += [(f"by bytes, slack {slack:g}", balanced_segment_ops(analysis, slack)[0]) for slack in BALANCED_SLACKS]
    plain = simulate(graph, profile, options=options)
    rows = [{"model": model, "size": size, "profile": profile.name, "plan": "none", "kept": None,
             "level_peak_bytes": plain.peak_with_margin_bytes, "ordered_peak_bytes": None,
             "step_s": plain.step_time_s}]
    for label, ops in choices:
        kept = sum(1 for c in cuts if c not in ops)
        rewritten = apply_swaps(graph, recompute_plan(analysis, ops)).graph
        level = simulate(rewritten, profile, options=options)
        ordered = enforce_order(rewritten, profile, options=options, level_peak_bytes=level.peak_bytes)
        in_order = simulate(ordered.graph, profile, options=options) if ordered.changed else level
        rows.append({"model": model, "size": size, "profile": profile.name, "plan": label, "kept": kept,
                     "level_peak_bytes": level.peak_with_margin_bytes,
                     "ordered_peak_bytes": in_order.peak_with_margin_bytes, "step_s": level.step_time_s})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    from tflms.units import format_bytes
    lines = ["| model | size | plan | articulations kept | peak, level order | peak, order pinned | step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ordered = "-" if r["ordered_peak_bytes"] is None else format_bytes(r["ordered_peak_bytes"])
        lines.append(f"| {r['model']} | {r['size']} | {r['plan']} | {'-' if r['kept'] is None else r['kept']} | "
                     f"{format_bytes(r['level_peak_bytes'])} | {ordered} | {r['step_s']:.2f} s |")
    return "\n".join(lines)


def parse_point(text: str) -> tuple[str, int]:
    from benchlib.models import MODELS
    model, _, size = text.partition(":")
    if model not in MODELS or MODELS[model].kind != "batch" or not size.isdigit() or int(size) < 1:
        raise ValueError(f"--point {text!r}: give MODEL:BATCH with a batch-sized bench model "
                         f"({', '.join(sorted(m for m in MODELS if MODELS[m].kind == 'batch'))}), e.g. resnet50:1347")
    return model, int(size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--point", action="append", required=True, help="MODEL:BATCH (repeatable)")
    parser.add_argument("--profile", default="v100-16gb-pcie3")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    try:
        points = [parse_point(p) for p in args.point]
    except ValueError as err:
        parser.error(str(err))
    from benchlib.models import Steps
    steps = Steps()
    rows = [row for model, size in points for row in plans_at(steps, model, size, args.profile)]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
