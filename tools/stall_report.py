"""Where the tuner's chosen rewrite makes compute wait: its stalls, beside the step-time bounds.

For one benchmark model at one size on one profile (the steps of ``tools/bench.py``, its headroom), this
runs the full tune ``tflms-best`` runs at a maximum (every strategy, the enforced order, pruning) and
reads the winner's simulated timeline: the step time against its compute, the two step-time bounds
(``tflms.sim.bounds.step_time_bound``: issue 11's ``max(compute, D / L)`` and the tighter one across the
peak), how long each link direction is busy, and the longest gaps in the compute stream with the op
each one delays (simulated, like every figure here).

    python tools/stall_report.py --model vgg16 --size 432 --profile v100-16gb-pcie3
    python tools/stall_report.py --model bert-base --size 477 --profile v100-16gb-nvlink2 --top 20 --json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: A gap in the compute stream shorter than this is scheduling noise, not a stall.
MIN_STALL_S = 1e-4


def stalls(sim: Any, *, min_gap_s: float = MIN_STALL_S) -> list[dict[str, Any]]:
    """The gaps in ``sim``'s compute stream, longest first: ``{"gap_s", "at_s", "before"}`` each.

    ``at_s`` is when the compute stream went idle; ``before`` the op that then waited to start.
    """
    ops = sorted((r for r in sim.ops if r.stream == "compute"), key=lambda r: (r.start_s, r.name))
    found, idle_from = [], 0.0
    for record in ops:
        gap = record.start_s - idle_from
        if gap > min_gap_s:
            found.append({"gap_s": gap, "at_s": idle_from, "before": record.name})
        idle_from = max(idle_from, record.end_s)
    return sorted(found, key=lambda s: (-s["gap_s"], s["at_s"]))


def link_busy_s(sim: Any) -> dict[str, float]:
    """Seconds each non-compute stream of ``sim`` is busy (``d2h``, ``h2d``, ...)."""
    busy: dict[str, float] = collections.defaultdict(float)
    for record in sim.ops:
        if record.stream != "compute":
            busy[record.stream] += record.end_s - record.start_s
    return dict(sorted(busy.items()))


def report(model: str, size: int, profile_name: str, headroom: float) -> dict[str, Any]:
    from benchlib.models import Steps
    from benchlib.search import budget_for, time_bounds
    from tflms.profiles import get_profile
    from tflms.sim import SimOptions
    from tflms.tune.tuner import STRATEGIES, tune

    profile = get_profile(profile_name)
    budget = budget_for(model, profile, None)
    graph, _ = Steps().graph(model, "plain", size)
    options = SimOptions(margin_fraction=headroom)
    result = tune(graph, budget=budget, profile=profile, sim_options=options, enforce_order=True,
                  strategies=list(STRATEGIES))
    best = result.best
    bound_s, across_s = time_bounds(graph, profile, budget, options)
    gaps = stalls(best.sim)
    return {"model": model, "size": size, "profile": profile.name, "headroom": headroom, "budget_bytes": budget,
            "strategy": best.strategy, "params": best.params, "step_s": best.sim.step_time_s,
            "compute_s": best.sim.compute_time_s, "bound_s": bound_s, "across_s": across_s,
            "link_busy_s": link_busy_s(best.sim), "stall_s": sum(g["gap_s"] for g in gaps), "stalls": gaps}


def table(out: dict[str, Any], top: int) -> str:
    lines = [f"{out['model']} at {out['size']} on {out['profile']} (simulated, {out['headroom']:.0%} headroom): "
             f"{out['strategy']} {out['params']}",
             f"step {out['step_s']:.3f} s, compute {out['compute_s']:.3f} s; bound {out['bound_s']:.3f} s "
             f"(time/bound {out['step_s'] / out['bound_s']:.2f}), across the peak {out['across_s']:.3f} s "
             f"(time/across {out['step_s'] / out['across_s']:.2f})",
             "links busy: " + ", ".join(f"{k} {v:.3f} s" for k, v in out["link_busy_s"].items()),
             f"compute waits {out['stall_s']:.3f} s in {len(out['stalls'])} gaps; the longest:",
             f"{'gap ms':>9}  {'at s':>8}  waiting op"]
    lines += [f"{g['gap_s'] * 1000:>9.1f}  {g['at_s']:>8.3f}  {g['before']}" for g in out["stalls"][:top]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from benchlib.common import HEADROOM
    from benchlib.models import MODELS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help=f"one of {sorted(MODELS)}")
    parser.add_argument("--size", type=int, required=True, help="the batch (unet3d: the size index of bench.py)")
    parser.add_argument("--profile", default="v100-16gb-pcie3", help="hardware profile (default v100-16gb-pcie3)")
    parser.add_argument("--headroom", type=float, default=HEADROOM, help=f"default {HEADROOM} (bench.py's)")
    parser.add_argument("--top", type=int, default=15, help="stalls to list (default 15)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.model not in MODELS:
        parser.error(f"--model {args.model}: choose one of {sorted(MODELS)}")
    if args.size < 1:
        parser.error(f"--size {args.size}: must be at least 1")
    from tflms.errors import BudgetError
    try:
        out = report(args.model, args.size, args.profile, args.headroom)
    except BudgetError as err:
        print(f"stall_report: nothing fits {args.model} at {args.size} on {args.profile}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1) if args.json else table(out, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
