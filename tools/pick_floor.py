"""Is the tuner's pick the fastest plan that fits? A floor for every recompute set, against the pick (issue 45, item 4).

For a step and a budget, the tuner picks a plan (swaps, recomputes, an order). This tool enumerates every set of
recomputed forward ops among the ``--ops`` largest recomputable ones (all of them on a small step), and for each
computes the least step time *any* swap plan on that recomputed step can reach while fitting the budget, in any
execution order (:func:`tflms.sim.bounds.any_order_time_bound`: the cut of bytes over the budget at each op must
leave before it and come back after it, over the host link; docs/design.md, "Bounds"). A set whose floor is above the
pick's simulated step time cannot beat the pick, whatever its swaps, triggers or order. The sets whose floor is below
are listed: where a faster plan is not ruled out. Then the pick's parts are judged alone (:func:`pick_parts`: no swap,
each swap alone, one swap-in per tensor, the largest swap recomputed instead). Figures are simulated, on the profile
the tuner used.

Default step: issue 45's Keras CNN (three 3x3 convolutions of 32, 64 and 64 filters on 64x64x3 inputs, batch 32,
Adam) at 90 MiB and 70 MiB.

    python tools/pick_floor.py                        # issue 45's CNN at 90 and 70 MiB
    python tools/pick_floor.py --budgets 80MiB --ops 8 --json floor.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def issue45_step():
    """The ConcreteFunction of issue 45's Keras CNN training step, traced by ``fit`` (and the model it reads)."""
    import tflms.keras
    from tflms.testing.sweep import issue45_fit
    lms = tflms.keras.LMS(budget="1TiB", verbose=0)  # fits unchanged: traces the step and trains it plainly
    model, _ = issue45_fit([lms])
    return lms._order[0].original, model  # noqa: SLF001 - the traced step (tool-only use)


def floors(graph, budget: int, *, max_ops: int, progress=None) -> dict:
    """The tuner's pick at ``budget`` and the any-order swap floor of every recompute set (see the module doc)."""
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.errors import BudgetError
    from tflms.passes import apply_swaps
    from tflms.policies.recompute import _recomputable, output_bytes, recompute_plan
    from tflms.profiles import DEFAULT_PROFILE, get_profile
    from tflms.sim.bounds import any_order_time_bound
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.tune.tuner import tune
    from tflms.units import format_bytes
    config = LMSConfig(batch_size=None)
    profile = get_profile(DEFAULT_PROFILE)
    options = SimOptions(host_device=config.host_device)
    analysis = analyze_graph(graph)
    base = simulate(graph, profile, options=options)
    parts = []
    try:
        pick = tune(analysis, budget=budget, profile=profile, config=config, enforce_order=True)
        pick_s, pick_what = pick.best.sim.step_time_s, f"{pick.best.strategy} {pick.best.params}"
        parts = pick_parts(graph, pick.best.plan, profile, options)
    except BudgetError as err:
        pick_s, pick_what = float("inf"), f"nothing fits ({str(err)[:120]})"
    ops = sorted(_recomputable(analysis), key=lambda n: (-output_bytes(graph, n), n))[:max_ops]
    live = budget - options.margin_bytes
    rows = []
    for k in range(len(ops) + 1):
        for subset in itertools.combinations(ops, k):
            if subset:
                plan = recompute_plan(analysis, subset, config)
                if not plan.recomputes:
                    continue
                rgraph = apply_swaps(graph, plan).graph
            else:
                rgraph = graph
            sim = simulate(rgraph, profile, options=options)
            floor = any_order_time_bound(rgraph, profile, max(1, live), options=options, sim=sim).floor_s
            rows.append({"recomputed": list(subset), "compute_s": sim.compute_time_s, "floor_s": floor,
                         "below_pick": floor < pick_s})
        if progress:
            progress(f"  {format_bytes(budget)}: sets of {k} of {len(ops)} ops done ({len(rows)} floors)")
    return {"budget_bytes": budget, "profile": profile.name, "baseline_s": base.step_time_s,
            "pick": pick_what, "pick_s": pick_s, "ops": ops, "rows": rows, "parts": parts}


def pick_parts(graph, plan, profile, options) -> list[dict]:
    """The pick's parts judged alone: its recomputes with the order pinned first (as the order-first hybrids do),
    then each of its swaps alone, none, one swap-in per swapped tensor, and its largest swap recomputed instead
    (in level order and with the order pass after). Each ``{"variant", "peak_bytes", "step_time_s"}``, simulated."""
    import dataclasses

    from tflms.analysis.cto import analyze_graph
    from tflms.passes import apply_swaps
    from tflms.passes.order import enforce_order
    from tflms.policies.recompute import recompute_plan
    from tflms.sim.simulator import simulate
    out = []

    def judge(variant, g):
        sim = simulate(g, profile, options=options)
        out.append({"variant": variant, "peak_bytes": sim.peak_with_margin_bytes, "step_time_s": sim.step_time_s})

    def with_plan(g, swaps=(), recomputes=()):
        return apply_swaps(g, dataclasses.replace(plan, swaps=tuple(swaps), recomputes=tuple(recomputes))).graph

    ordered = enforce_order(with_plan(graph, recomputes=plan.recomputes), profile, options=options).graph
    judge("the pick's swaps", with_plan(ordered, plan.swaps))
    judge("no swap", ordered)
    for swap in plan.swaps:
        judge(f"only {swap.tensor} swapped", with_plan(ordered, [swap]))
    merged = [dataclasses.replace(w, swap_ins=(dataclasses.replace(
        w.swap_ins[0], consumers=sum((g.consumers for g in w.swap_ins), ()),
        consumer_levels=sum((g.consumer_levels for g in w.swap_ins), ())),)) for w in plan.swaps]
    judge("one swap-in per swapped tensor", with_plan(ordered, merged))
    if plan.swaps:
        big = max(plan.swaps, key=lambda w: w.num_bytes)
        ops = sorted({op for d in plan.recomputes for op in d.ops} | {big.tensor.op})
        recomputed = with_plan(graph, recomputes=recompute_plan(analyze_graph(graph), ops, plan.config).recomputes)
        judge(f"{big.tensor} recomputed instead, level order", recomputed)
        judge(f"{big.tensor} recomputed instead, order pass", enforce_order(recomputed, profile, options=options).graph)
    return out


def table(result: dict) -> str:
    from tflms.units import format_bytes
    base = result["baseline_s"]
    below = [r for r in result["rows"] if r["below_pick"]]
    best = min(result["rows"], key=lambda r: r["floor_s"])
    lines = [f"budget {format_bytes(result['budget_bytes'])} on {result['profile']} (simulated): the tuner picks "
             f"{result['pick']} at {100 * (result['pick_s'] / base - 1):+.1f}%",
             f"{len(result['rows'])} recompute sets of the {len(result['ops'])} largest recomputable ops; lowest floor "
             f"{100 * (best['floor_s'] / base - 1):+.1f}% (recomputing {best['recomputed'] or 'nothing'})",
             f"{'recomputed ops':<70}{'compute':>10}{'floor':>10}"]
    for r in sorted(result["rows"], key=lambda r: r["floor_s"])[:12]:
        names = ", ".join(n.rsplit("/", 2)[-2] + "/" + n.rsplit("/", 1)[-1] for n in r["recomputed"]) or "(none)"
        lines.append(f"{names[:69]:<70}{100 * (r['compute_s'] / base - 1):>+9.1f}%{100 * (r['floor_s'] / base - 1):>+9.1f}%")
    lines.append(f"sets whose floor is below the pick (a faster plan not ruled out): {len(below)}"
                 if below else "no recompute set can beat the pick: every floor is at or above its step time")
    lines.append("columns: compute = the recomputed step's compute time over the unchanged step's; floor = the least "
                 "step time any swap plan of it that fits can reach, in any order (both simulated)")
    if result["parts"]:
        lines.append("the pick's parts alone (its recomputes, the order pinned first; simulated):")
        for part in result["parts"]:
            lines.append(f"  {part['variant'][:70]:<72}{format_bytes(part['peak_bytes']):>12}"
                         f"{100 * (part['step_time_s'] / base - 1):>+9.1f}%")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="90MiB,70MiB")
    ap.add_argument("--ops", type=int, default=12, help="recompute sets of at most this many largest ops")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tflms.ir.tf_io import load_graph
    from tflms.pipeline import _preoptimized
    from tflms.units import parse_bytes
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    start = time.perf_counter()
    step, _model = issue45_step()
    graph = load_graph(_preoptimized(step, ()), batch_size=32)
    results = []
    for text in args.budgets.split(","):
        results.append(floors(graph, parse_bytes(text, what="budget"), max_ops=args.ops, progress=say))
        print(table(results[-1]), flush=True)
    say(f"done in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
