"""How close to issue 11's step-time bound any swap-only rewrite can come, in any execution order.

Issue 11 asks that tflms-best's predicted step time at each maximum be within 1.25 of the bound
``max(compute, D / L)`` (``tflms.sim.bounds.step_time_bound``). That bound lets the copies out and the
copies back overlap, and it holds for one order. For each point (a model at a size on a profile) this
prints, beside it, the least step time any swap-only rewrite can reach in *any* order
(``tflms.sim.bounds.any_order_time_bound``: while an op runs, the bytes of its cut over the budget are
away; they left while only work that may precede the op ran and come back while only work that may
follow it runs; docs/design.md, "Bounds"). ``floor/bound`` is then the lowest ``time_bound_ratio`` any
swap-only rewrite can have there: above 1.25, no swap plan in any order meets the target.

The points are the tflms-best maxima of a ``tools/bench.py --json`` run (``--bench-json``; its
``time/bound`` is printed beside) or given one by one (``--point MODEL:SIZE:PROFILE``; for ``unet3d`` the
size is the volume, ``208x208x208`` or ``208^3``). Budget and headroom are bench.py's. Figures are
simulated (tflms.sim), not measured on a GPU. No tuning runs: a point takes the time to trace the step
and simulate it a few times.

    python tools/bench.py --full --json > bench.json
    python tools/time_floor.py --bench-json bench.json
    python tools/time_floor.py --point vgg16:432:v100-16gb-pcie3 --point unet3d:208^3:v100-16gb-nvlink2 --json
    python tools/time_floor.py --point resnet50:1347:v100-16gb-pcie3 --recompute 0.05,0.25

``--recompute`` adds, for each price, the floor of the step with the tuner's recompute set of that price in it
(``tflms.tune.recompute_sets.priced``): a bound on the swaps such a hybrid still needs, the clones' compute included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: Issue 11's target for tflms-best's predicted step time over the bound at each maximum.
TIME_BOUND_TARGET = 1.25
#: The bench method whose maxima are read from a bench.py JSON run.
METHOD = "tflms-best"


def parse_point(text: str) -> tuple[str, int, str]:
    """``MODEL:SIZE:PROFILE`` -> (model, bench size, profile); a unet3d size is a volume or a size index."""
    from benchlib.common import unet_index
    from benchlib.models import MODELS
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"--point {text!r}: give MODEL:SIZE:PROFILE, e.g. vgg16:432:v100-16gb-pcie3")
    model, size, profile = parts
    if model not in MODELS:
        raise ValueError(f"--point {text!r}: unknown model {model!r}; choose from {', '.join(sorted(MODELS))}")
    if MODELS[model].kind == "resolution" and not size.isdigit():
        sides = [int(size[:-2])] * 3 if size.endswith("^3") else [int(s) for s in size.split("x")]
        return model, unet_index(sides), profile
    if not size.isdigit() or int(size) < 1:
        raise ValueError(f"--point {text!r}: the size must be a positive batch (unet3d: a volume such as 208^3)")
    return model, int(size), profile


def points_from_bench(path: str) -> list[tuple[str, int, str, dict]]:
    """The tflms-best maxima of a bench.py JSON run, each with its record."""
    from benchlib.common import read_records, unet_index
    records = read_records(path)  # an earlier run's method names mapped to today's
    out = []
    for r in records:
        if r.get("method") != METHOD or not r.get("max_batch"):
            continue
        size = unet_index(r["max_shape"]) if r.get("max_shape") else int(r["max_batch"])
        out.append((r["model"], size, r["profile"], r))
    if not out:
        raise ValueError(f"{path}: no {METHOD} maxima (is it the JSON of tools/bench.py --json?)")
    return out


def recomputed(graph: Any, profile: Any, price: float) -> tuple[Any, int]:
    """``(graph with the tuner's recompute set of that price in it, how many tensors it recomputes)``: the forward
    tensors whose chain rebuilds them for at most ``price`` times the two copies a swap of them takes
    (:func:`tflms.tune.recompute_sets.priced`, the tuner's recompute plans without swaps)."""
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import rank_candidates, recompute_plan, select
    from tflms.sim.cost import op_time_s
    from tflms.tune.hybrid import priced
    analysis = analyze_graph(graph)
    ranked, _ = rank_candidates(analysis, lambda name: op_time_s(graph, graph.op(name), profile),
                                min_bytes=LMSConfig().min_swap_bytes)
    plan = recompute_plan(analysis, select(analysis, ranked[:priced(ranked, profile, price)]))
    return apply_swaps(graph, plan).graph, sum(len(r.tensors) for r in plan.recomputes)


def floor_at(steps: Any, model: str, size: int, profile_name: str, headroom: float,
             price: float | None = None) -> dict[str, Any]:
    """The bounds at one point: the issue's and across the peak (bench.py's), and the any-order floor; with
    ``price``, of the step with that price's recompute set in it (:func:`recomputed`)."""
    from benchlib.common import shape_label, unet_shape
    from benchlib.models import MODELS
    from benchlib.search import budget_for, time_bounds
    from tflms.profiles import get_profile
    from tflms.sim.simulator import SimOptions
    profile = get_profile(profile_name)
    graph, _ = steps.graph(model, "plain", size)
    recomputes = 0
    if price is not None:
        graph, recomputes = recomputed(graph, profile, price)
    budget = budget_for(model, profile, None)
    bounds = time_bounds(graph, profile, budget, SimOptions(margin_fraction=headroom))
    bound_s, across_s, floor = bounds.bound_s, bounds.across_s, bounds.floor
    label = shape_label(unet_shape(size)) if MODELS[model].kind == "resolution" else str(size)
    return {"model": model, "size": label, "profile": profile.name, "headroom": headroom, "budget_bytes": budget,
            "price": price, "recomputed": recomputes,
            "compute_s": floor.compute_s, "bound_s": bound_s, "across_s": across_s, "floor_s": floor.floor_s,
            "floor_over_bound": floor.floor_s / bound_s, "reachable": floor.floor_s / bound_s <= TIME_BOUND_TARGET,
            "floor": floor.to_dict()}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("model", "profile", "size", "recompute", "compute s", "bound s", "across s", "floor s", "floor/bound",
            "tflms-best time/bound", f"<= {TIME_BOUND_TARGET} possible")
    body = [(r["model"], r["profile"], r["size"],
             "-" if r.get("price") is None else f"price {r['price']:g}: {r['recomputed']} tensors",
             f"{r['compute_s']:.2f}", f"{r['bound_s']:.2f}",
             f"{r['across_s']:.2f}", f"{r['floor_s']:.2f}", f"{r['floor_over_bound']:.2f}",
             "-" if r.get("time_bound_ratio") is None else f"{r['time_bound_ratio']:.2f}",
             "yes" if r["reachable"] else "no") for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    lines = ["Least step time of any swap-only rewrite in any order (simulated; floor: "
             "tflms.sim.bounds.any_order_time_bound), beside issue 11's bound max(compute, D / L) and the bound "
             "across the peak (both the smaller of level order's and the schedule's, as tools/bench.py)",
             "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in body]
    lines.append(f"floor/bound is the lowest time/bound any swap-only rewrite can have at that point; issue 11's "
                 f"target is {TIME_BOUND_TARGET}.")
    if any(r.get("price") is not None for r in rows):
        lines.append("A recompute row bounds the swaps for what that recompute set leaves (its clones' compute "
                     "included): hybrids with that set, not every hybrid.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from benchlib.common import HEADROOM
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-json", help="the JSON of tools/bench.py --json: every tflms-best maximum")
    parser.add_argument("--point", action="append", default=[], metavar="MODEL:SIZE:PROFILE",
                        help="a point to bound (repeatable), e.g. resnet50:1347:v100-16gb-pcie3")
    parser.add_argument("--headroom", type=float, default=HEADROOM, help=f"default {HEADROOM} (bench.py's)")
    parser.add_argument("--recompute", metavar="PRICE[,PRICE...]", default="",
                        help="also bound each point with the tuner's recompute set of each price in the step "
                             "(tflms.tune.hybrid.PRICES: 0.05, 0.25, 1, 4)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if not args.bench_json and not args.point:
        parser.error("give --bench-json FILE (a tools/bench.py --json run) or at least one --point")
    try:
        prices = [float(p) for p in args.recompute.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--recompute {args.recompute!r}: give prices as numbers, e.g. 0.05,0.25")
    if any(not p > 0 for p in prices):
        parser.error(f"--recompute {args.recompute!r}: a price is a positive number (a multiple of a swap's two "
                     "copies), e.g. 0.05")
    try:
        points = points_from_bench(args.bench_json) if args.bench_json else []
        points += [(*parse_point(p), None) for p in args.point]
    except (OSError, ValueError, KeyError) as err:
        parser.error(str(err))
    from benchlib.common import say
    from benchlib.models import Steps
    from tflms.profiles import get_profile
    for _, _, profile, _ in points:
        get_profile(profile)  # an unknown profile is refused before any tracing
    steps, rows = Steps(), []
    for model, size, profile, record in points:
        say(f"time_floor: {model} at {size} on {profile}")
        row = floor_at(steps, model, size, profile, args.headroom)
        if record is not None:
            row["time_bound_ratio"] = record.get("time_bound_ratio_at_max")
            row["step_ms_at_max"] = record.get("step_ms_at_max")
        rows.append(row)
        for price in prices:
            say(f"time_floor: {model} at {size} on {profile}, recompute price {price:g}")
            rows.append(floor_at(steps, model, size, profile, args.headroom, price))
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
