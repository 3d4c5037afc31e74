"""Where the tuner's chosen rewrite makes compute wait: its stalls, beside the step-time bounds.

For one benchmark model at one size on one profile (the steps of ``tools/bench.py``, its headroom), this
runs the full tune ``tflms-best`` runs at a maximum (every strategy, the enforced order, pruning) and
reads the winner's simulated timeline: the step time against its compute, the step-time bounds
(``tflms.sim.bounds.step_time_bound``: issue 11's ``max(compute, D / L)`` and the tighter one across the
peak; ``any_order_time_bound``: the least any swap-only rewrite reaches in any order), how long each link direction is busy, the compute stream's waits by phase (forward, backward, ...)
with how long each link was busy during them, how long the host-to-device link idled between copies with
and without room for the next copy, and the longest gaps in the compute stream with the op each one
delays (simulated, like every figure here).

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

import numpy as np

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


def _busy_s(records: list[Any], begin: float, end: float) -> float:
    """Seconds of ``[begin, end)`` that ``records`` (one stream's) cover."""
    return sum(max(0.0, min(end, r.end_s) - max(begin, r.start_s)) for r in records)


def waits_by_phase(sim: Any, categories: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``sim``'s compute waits summed by the category of the op that waited (``forward``, ``backward``,
    ``update``, ``other``; :class:`tflms.analysis.cto.Category`), with the seconds each link was busy meanwhile
    (``wait_s``, ``d2h_busy_s``, ``h2d_busy_s``): a wait with its link busy throughout is the link's volume,
    not a late copy."""
    streams = {name: [r for r in sim.ops if r.stream == name] for name in ("d2h", "h2d")}
    out: dict[str, dict[str, float]] = {}
    for gap in stalls(sim):
        row = out.setdefault(str(categories.get(gap["before"], "other")),
                             {"wait_s": 0.0, "d2h_busy_s": 0.0, "h2d_busy_s": 0.0})
        row["wait_s"] += gap["gap_s"]
        for name, records in streams.items():
            row[f"{name}_busy_s"] += _busy_s(records, gap["at_s"], gap["at_s"] + gap["gap_s"])
    return dict(sorted(out.items()))


def h2d_idle(sim: Any, copy_bytes: dict[str, int], limit_bytes: float,
             categories: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Seconds the host-to-device link idles between its first and its last copy, by the phase of the compute
    op last started when it went idle (``categories``, as :func:`waits_by_phase`), split by whether the
    device's live bytes (``sim.timeline``) left room under ``limit_bytes`` for the copy that came next
    (``copy_bytes``: by copy op name) throughout the idle stretch: ``with_room_s`` (a trigger placed earlier
    could have filled it) and ``without_room_s`` (the copy waited for memory)."""
    from tflms.tune.prune import link_idle_since  # what the pruning pass fills (its step 7)
    times = np.array([t for t, _, _ in sim.timeline], dtype=float)
    live = np.array([a for _, a, _ in sim.timeline], dtype=np.int64)
    compute = sorted((r.start_s, r.name) for r in sim.ops if r.stream == "compute")
    starts = np.array([t for t, _ in compute], dtype=float)
    out: dict[str, dict[str, float]] = {}
    copies = sorted((r for r in sim.ops if r.stream == "h2d"), key=lambda r: (r.start_s, r.name))
    idle = link_idle_since(sim, "h2d")
    if copies:
        idle.pop(copies[0].start_s, None)  # the wait for the first copy is not idle time between copies
    for r in copies:
        if r.start_s not in idle:
            continue
        since = idle.pop(r.start_s)  # copies starting together: the first one named counts
        lo = max(0, int(np.searchsorted(times, since, side="right")) - 1)
        hi = max(lo + 1, int(np.searchsorted(times, r.start_s, side="left")))
        room = limit_bytes - int(live[lo:hi].max()) >= copy_bytes.get(r.name, 0)
        k = max(0, int(np.searchsorted(starts, since, side="right")) - 1)
        row = out.setdefault(str(categories.get(compute[k][1], "other")) if compute else "other",
                             {"with_room_s": 0.0, "without_room_s": 0.0})
        row["with_room_s" if room else "without_room_s"] += r.start_s - since
    return dict(sorted(out.items()))


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
    bounds = time_bounds(graph, profile, budget, options)
    gaps = stalls(best.sim)
    copy_bytes = {name: swap.num_bytes for swap in (best.plan.swaps if best.plan is not None else ())
                  for group in swap.swap_ins for name in (group.name, group.name + "/_recv")}
    limit = (budget - options.margin_bytes) / (1 + options.margin_fraction)  # live bytes the budget allows
    return {"model": model, "size": size, "profile": profile.name, "headroom": headroom, "budget_bytes": budget,
            "strategy": best.strategy, "params": best.params, "step_s": best.sim.step_time_s,
            "compute_s": best.sim.compute_time_s, "bound_s": bounds.bound_s,
            "across_s": bounds.across_s, "floor_s": bounds.floor_s,
            "link_busy_s": link_busy_s(best.sim), "stall_s": sum(g["gap_s"] for g in gaps),
            "waits_by_phase": waits_by_phase(best.sim, result.analysis.categories),
            "h2d_idle_s": h2d_idle(best.sim, copy_bytes, limit, result.analysis.categories), "stalls": gaps}


def table(out: dict[str, Any], top: int) -> str:
    lines = [f"{out['model']} at {out['size']} on {out['profile']} (simulated, {out['headroom']:.0%} headroom): "
             f"{out['strategy']} {out['params']}",
             f"step {out['step_s']:.3f} s, compute {out['compute_s']:.3f} s; bound {out['bound_s']:.3f} s "
             f"(time/bound {out['step_s'] / out['bound_s']:.2f}), across the peak {out['across_s']:.3f} s "
             f"(time/across {out['step_s'] / out['across_s']:.2f}), any order {out['floor_s']:.3f} s (floor/bound "
             f"{out['floor_s'] / out['bound_s']:.2f}: no swap-only rewrite goes below)",
             "links busy: " + ", ".join(f"{k} {v:.3f} s" for k, v in out["link_busy_s"].items()),
             "compute waits by the waiting op's phase: " + "; ".join(
                 f"{phase} {row['wait_s']:.3f} s (d2h busy {row['d2h_busy_s']:.3f} s, h2d {row['h2d_busy_s']:.3f} s)"
                 for phase, row in out["waits_by_phase"].items()) + ("none" if not out["waits_by_phase"] else ""),
             "host-to-device link idle between copies, by phase: " + "; ".join(
                 f"{phase} {row['with_room_s']:.3f} s with room for the next copy, {row['without_room_s']:.3f} s "
                 "without" for phase, row in out["h2d_idle_s"].items()) + ("none" if not out["h2d_idle_s"] else ""),
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
