"""Is the tuner's pick the fastest plan that fits? A broader search than the tuner's on a small step (issue 45, item 4).

For a step and a budget this tool runs the tuner as the pipeline does (``enforce_order=True``), then searches a space
that contains the tuner's families and more, and prints the fastest plan it finds that fits beside the pick (both
simulated, on the profile the tuner used). The space (:func:`broad_search`):

- **recompute sets**: every union of units, a unit being one of the step's recomputable forward ops (``--ops``: the
  largest that many; all of them on issue 45's CNN, 8 ops) or one chain of the tuner's ranking (an op with the
  reshapes that rebuild its tensor; 5 there): 2^13 sets, each with one clone per tensor (the tuner's price sets and
  segment plans are among them) and with a clone per reader (``split_readers``); plans that recompute the same
  decisions count once;
- **orders**: each recomputed step in level order, and with the memory-aware order pinned before the swaps (as
  the order-first searches do);
- **swaps** on each of those: none, then every set of at most ``--swaps`` (2) tensors among the forward tensors a
  backward op reads (clones' outputs included), each with one swap-in for all its backward readers or one per
  reader level, triggered 1 or 3 levels ahead; in level order, a plan within ``--overshoot`` of the budget that is
  faster than the best fit found is also judged with the order pass after its swaps (as the tuner's finalists).

Plans that compute longer than the best fit so far are not simulated (a step lasts at least its compute). What the
space leaves out: more than ``--swaps`` swaps, other triggers, waits for swap-outs (sync modes), and orders other
than level order and the order pass's.

Default step: issue 45's Keras CNN (three 3x3 convolutions of 32, 64 and 64 filters on 64x64x3 inputs, batch 32,
Adam) at 90 MiB and 70 MiB. Prints a table; ``--json FILE`` writes the results.

    python tools/pick_search.py                       # issue 45's CNN at 90 and 70 MiB (about a minute)
    python tools/pick_search.py --budgets 80MiB --swaps 1 --json search.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: Swap-in triggers tried, in levels ahead of the first reader of a group.
AHEADS = (1, 3)


def issue45_analysis():
    """The analysis of issue 45's Keras CNN training step as the callback's pipeline tunes it (traced by ``fit``,
    preoptimized by grappler), and the tune's keyword arguments (budget aside)."""
    import tflms.keras
    from tflms.testing.sweep import issue45_fit
    from tflms.tune import plancache
    seen = []
    original = plancache.cached_tune

    def spy(source, *args, **kwargs):
        seen.append((source, kwargs))
        return original(source, *args, **kwargs)
    plancache.cached_tune = spy
    try:
        issue45_fit([tflms.keras.LMS(budget="1TiB", verbose=0)])  # traces the step; fits unchanged
    finally:
        plancache.cached_tune = original
    analysis, kwargs = seen[-1]
    return analysis, {k: v for k, v in kwargs.items() if k not in ("budget", "progress")}


def _swap_choices(analysis, config, accelerator: str) -> list[list]:
    """Per swappable tensor, the :class:`~tflms.policies.swapplan.SwapDecision` s tried (groupings x triggers)."""
    from tflms.analysis.cto import Category
    from tflms.ir.graph import TensorRef
    from tflms.policies.swapplan import (
        SwapDecision,
        SwapInGroup,
        find_trigger,
        skip_reason,
        swap_op_names,
    )
    graph, levels, cats = analysis.graph, analysis.levels, analysis.categories
    out = []
    for name in analysis.order:
        if cats[name] is not Category.FORWARD:
            continue
        op = graph.op(name)
        for index, info in enumerate(op.outputs):
            ref = TensorRef(name, index)
            readers = sorted({c for c, _ in graph.consumers(ref) if cats[c] is not Category.FORWARD},
                             key=lambda n: (levels[n], n))
            if not readers or not info.num_bytes or skip_reason(analysis, ref, config, accelerator) is not None:
                continue
            near = tuple(c for c, _ in graph.consumers(ref) if c not in readers)
            by_level = [list(g) for _, g in itertools.groupby(readers, key=lambda n: levels[n])]
            out_name, in_base = swap_op_names(ref)
            choices = []
            for groups in ([readers], by_level) if len(by_level) > 1 else ([readers],):
                for ahead in AHEADS:
                    made = []
                    for gi, members in enumerate(groups):
                        trigger = find_trigger(analysis, members[0], levels[name], levels[members[0]] - ahead)
                        made.append(SwapInGroup(name=f"{in_base}_{gi}", consumers=tuple(members),
                                                consumer_levels=tuple(levels[m] for m in members), trigger=trigger,
                                                trigger_level=None if trigger is None else levels[trigger],
                                                sync=trigger is None))
                    choices.append(SwapDecision(tensor=ref, dtype=info.dtype, num_bytes=info.num_bytes,
                                                producer_level=levels[name], swap_out=out_name,
                                                sync_out_consumers=(), swap_ins=tuple(made)))
            out.append(list(dict.fromkeys(choices)))
            del near
    return out


@dataclasses.dataclass
class Best:
    """The fastest fit found so far."""

    step_time_s: float = float("inf")
    peak_bytes: int = 0
    what: str = ""


def broad_search(analysis, budget: int, profile, options, config, *, max_ops: int = 12, max_swaps: int = 2,
                 overshoot: float = 0.25, progress=None) -> dict:
    """The broad search of the module doc: ``{"best": {...}, "judged": n, "space": {...}}``."""
    from tflms.analysis.cto import analyze_graph
    from tflms.passes import apply_swaps
    from tflms.passes.order import enforce_order
    from tflms.policies.recompute import (
        _recomputable,
        output_bytes,
        rank_candidates,
        recompute_plan,
    )
    from tflms.policies.swapplan import SwapPlan
    from tflms.sim.cost import op_time_s
    from tflms.sim.simulator import simulate
    graph = analysis.graph
    accelerator = "/device:GPU:0"
    best = Best()
    judged = 0
    live = budget - options.margin_bytes

    def judge(g, what: str, sim=None):
        nonlocal judged
        judged += 1
        sim = sim or simulate(g, profile, options=options)
        if sim.peak_with_margin_bytes <= budget and sim.step_time_s < best.step_time_s:
            best.step_time_s, best.peak_bytes, best.what = sim.step_time_s, sim.peak_with_margin_bytes, what
        return sim

    ops = sorted(_recomputable(analysis), key=lambda n: (-output_bytes(graph, n), n))[:max_ops]
    # the units: each recomputable op alone, and each chain the tuner's ranking re-runs (an op with the reshapes
    # around it that rebuild its tensor)
    times = {op.name: op_time_s(graph, op, profile) for op in graph}
    ranked, _ = rank_candidates(analysis, times.__getitem__, min_bytes=config.min_swap_bytes)
    units = list(dict.fromkeys([frozenset([op]) for op in ops] + [frozenset(c.chain) for c in ranked]))
    plans, seen = [], set()
    for k in range(len(units) + 1):
        for chosen in itertools.combinations(units, k):
            subset = tuple(sorted(frozenset().union(*chosen), key=lambda n: (-output_bytes(graph, n), n)))
            for split in (False, True):
                plan = (recompute_plan(analysis, subset, config, split_readers=split) if subset
                        else SwapPlan(config=config, accelerator_device=accelerator, swaps=(), skipped=()))
                if (subset and not plan.recomputes) or plan.recomputes in seen:
                    continue
                seen.add(plan.recomputes)
                plans.append((subset, split, plan))
    baseline = simulate(graph, profile, options=options)
    for n, (subset, split, plan) in enumerate(plans):
        rgraph = apply_swaps(graph, plan).graph if plan.recomputes else graph
        names = ", ".join(dict.fromkeys(o.rsplit("/", 2)[-2] for o in subset if o in ops)) or "nothing"
        names += " (with their chains)" if any(o not in ops for o in subset) else ""
        rwhat = f"recompute {{{names}}}{' a clone per reader' if split else ''}"
        level_sim = judge(rgraph, rwhat + ", level order")
        if level_sim.compute_time_s >= best.step_time_s:
            continue
        ordered = enforce_order(rgraph, profile, options=options, level_peak_bytes=level_sim.peak_bytes)
        variants = [(rgraph, level_sim, "level order", True)]
        if ordered.changed:
            variants.append((ordered.graph, judge(ordered.graph, rwhat + ", order pinned first",
                                                  ordered.report.ordered_sim), "order pinned first", False))
        for vgraph, vsim, how, order_after in variants:
            if vsim.peak_with_margin_bytes <= budget:
                continue  # (swaps never shorten the compute: this step is its own best)
            van = analyze_graph(vgraph)
            choices = _swap_choices(van, config, accelerator)
            for count in range(1, max_swaps + 1):
                for tensors in itertools.combinations(choices, count):
                    for decisions in itertools.product(*tensors):
                        splan = SwapPlan(config=config, accelerator_device=accelerator, swaps=tuple(decisions),
                                         skipped=())
                        sgraph = apply_swaps(vgraph, splan).graph
                        swhat = (f"{rwhat}, {how}, swaps " + "; ".join(
                            f"{d.tensor.op.rsplit('/', 2)[-2]} ({len(d.swap_ins)} in, ahead "
                            f"{d.swap_ins[0].consumer_levels[0] - (d.swap_ins[0].trigger_level or 0)})"
                            for d in decisions))
                        sim = judge(sgraph, swhat)
                        if (order_after and sim.peak_with_margin_bytes > budget
                                and sim.peak_with_margin_bytes <= budget * (1 + overshoot)
                                and sim.step_time_s < best.step_time_s):
                            after = enforce_order(sgraph, profile, options=options, level_peak_bytes=sim.peak_bytes)
                            if after.changed:
                                judge(after.graph, swhat + ", order pass after", after.report.ordered_sim)
        if progress and (n + 1) % 16 == 0:
            progress(f"  {(n + 1)}/{len(plans)} recompute plans, {judged} judged; best "
                     f"{100 * (best.step_time_s / baseline.step_time_s - 1):+.1f}%")
    del live
    return {"best": dataclasses.asdict(best), "judged": judged, "baseline_s": baseline.step_time_s,
            "space": {"recomputable_ops": list(ops), "units": len(units), "recompute_plans": len(plans),
                      "max_swaps": max_swaps, "aheads": list(AHEADS), "overshoot": overshoot}}


def compare(analysis, tune_kwargs: dict, budget: int, **search) -> dict:
    """The tuner's pick at ``budget`` (``{"pick": ...}``, ``None`` where nothing fits) beside the broad search."""
    from tflms.errors import BudgetError
    from tflms.tune.tuner import tune
    start = time.perf_counter()
    try:
        result = tune(analysis, budget=budget, **tune_kwargs)
        pick = {"step_time_s": result.best.sim.step_time_s, "peak_bytes": result.best.sim.peak_with_margin_bytes,
                "what": f"{result.best.strategy} {result.best.params}"}
    except BudgetError:
        pick = None
    tune_s = time.perf_counter() - start
    found = broad_search(analysis, budget, tune_kwargs["profile"], tune_kwargs["sim_options"],
                         tune_kwargs["config"], **search)
    return {"budget_bytes": budget, "pick": pick, "tune_s": tune_s, **found}


def table(results: list[dict]) -> str:
    from tflms.units import format_bytes
    lines = [f"{'budget':>10} {'':6} {'step':>9} {'peak':>11}  plan"]
    for r in results:
        base = r["baseline_s"]
        rows = [("pick", r["pick"]), ("broad", r["best"] if r["best"]["what"] else None)]
        for label, row in rows:
            if row is None:
                lines.append(f"{format_bytes(r['budget_bytes']):>10} {label:6} {'':>9} {'':>11}  nothing fits")
            else:
                lines.append(f"{format_bytes(r['budget_bytes']):>10} {label:6} "
                             f"{100 * (row['step_time_s'] / base - 1):>+8.1f}% {format_bytes(row['peak_bytes']):>11}  "
                             f"{row['what']}")
        lines.append(f"{'':>10} {len(r['space']['recomputable_ops'])} recomputable ops, "
                     f"{r['space']['recompute_plans']} recompute plans, {r['judged']} plans judged; tune "
                     f"{r['tune_s']:.2f} s")
    lines.append("step: over the unchanged step (simulated); broad: the fastest fit the broad search found "
                 "(tools/pick_search.py's doc says what it searches)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="90MiB,70MiB")
    ap.add_argument("--ops", type=int, default=12, help="recompute subsets of at most this many largest ops")
    ap.add_argument("--swaps", type=int, default=2, help="at most this many swapped tensors per plan")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tflms.units import parse_bytes

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)
    start = time.perf_counter()
    analysis, kwargs = issue45_analysis()
    results = []
    for text in args.budgets.split(","):
        results.append(compare(analysis, kwargs, parse_bytes(text, what="budget"), max_ops=args.ops,
                               max_swaps=args.swaps, progress=say))
    print(table(results), flush=True)
    say(f"done in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
