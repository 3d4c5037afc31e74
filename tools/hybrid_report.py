"""Where a hybrid plan's (recomputes and swaps) step time goes: compute, stalls, copies and the links' overlap.

For one bench model at one size on one profile (``tools/benchlib``: the traced plain step, the bench's headroom and
budget), this runs one full tune as the bench's ``tflms-xla`` method does (every default strategy, the enforced order,
pruning; on the ``xla-clusters`` clock, the variables' updates in parts where the plain step does not fit; without
land cuts, or with them for ``--land-cuts``; the recompute clones ordered where they are needed, or by graph order for
``--clones-last``: the bench judges each way, :func:`tflms.tune.xla_cuts.tune_xla`) and
reports the plain step, the best recompute-only candidate and the ``--top`` fastest hybrid candidates, fitting ones
first. For each: the tuner's step (and overhead against the plain step), whether it fits, its peak with the margin;
then, from a re-simulation of its rewritten graph on the same options (in level order: a candidate the tuner judged
in the enforced order was simulated with the order's edges, which the re-simulation lacks; the table says where the
two differ): the compute time, the stall time, the compute stream's idle time, the bytes copied out (each swapped
tensor once) and in (once per swap-in group), how long each link direction is busy and how much of that overlaps
compute, the swap-ins whose readers are all shape readers (``Shape``, ``ShapeN``, ``Size``, ``Rank``: they copy a
tensor back for its metadata), and the step of the same graph on the ``xla`` clock (XLA over the whole step, no
cluster cuts) for comparison. Every figure is simulated (tflms.sim), not measured on a GPU.

    python tools/hybrid_report.py --model resnet50 --profile h200-141gb --size 7392
    python tools/hybrid_report.py --model resnet50 --profile h200-141gb --size 2048 --top 3 --json
    python tools/hybrid_report.py --model bert-base --profile h200-141gb --size 728 --clock graph

The tune's progress goes to stderr; the table (or, with ``--json``, one JSON object) to stdout.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: The clock the hybrid's step is compared on: XLA over the whole step, no cluster cut at the copies.
COMPARE_CLOCK = "xla"
GIB = float(1 << 30)


# ---------------------------------------------------------------- intervals


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint ``(start, end)`` pairs (empty ones dropped; touching ones
    merged)."""
    merged: list[list[float]] = []
    for start, end in sorted((a, b) for a, b in intervals if b > a):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def measure(disjoint: Sequence[tuple[float, float]]) -> float:
    """Seconds that sorted, disjoint intervals cover."""
    return sum(b - a for a, b in disjoint)


def overlap(first: Sequence[tuple[float, float]], second: Sequence[tuple[float, float]]) -> float:
    """Seconds two unions (:func:`union`) cover together."""
    starts = [a for a, _ in second]
    total = 0.0
    for a, b in first:
        k = max(bisect.bisect_right(starts, a) - 1, 0)
        while k < len(second) and second[k][0] < b:
            lo, hi = max(a, second[k][0]), min(b, second[k][1])
            if hi > lo:
                total += hi - lo
            k += 1
    return total


# ---------------------------------------------------------------- one plan


def rewritten(graph: Any, plan: Any) -> Any:
    """``graph`` with ``plan`` applied (its recomputes, then its swaps); ``graph`` itself for no plan."""
    if plan is None or not plan.changed:
        return graph
    from tflms.passes.swaps import apply_swaps
    return apply_swaps(graph, plan).graph


def shape_only_swap_ins(graph: Any, new: Any, plan: Any) -> list[tuple[str, int]]:
    """``(swap-in, bytes)`` of each swap-in group of ``plan`` whose readers in the rewritten graph ``new`` are all
    shape readers (:data:`~tflms.ir.op_types.METADATA_ONLY_TYPES`: it copies a tensor back for its metadata); the
    plan's consumers where the swap-in is not in ``new``."""
    from tflms.ir.graph import TensorRef
    from tflms.ir.op_types import METADATA_ONLY_TYPES
    found = []
    for swap in () if plan is None else plan.swaps:
        for group in swap.swap_ins:
            if group.name in new:
                readers = {name for name, _ in new.consumers(TensorRef(group.name, 0))}
            else:
                readers = set(group.consumers)
            types = {new.op(name).type if name in new else graph.op(name).type if name in graph else None
                     for name in readers}
            if readers and types <= METADATA_ONLY_TYPES:
                found.append((group.name, swap.num_bytes))
    return found


def analyse_plan(graph: Any, plan: Any, profile: Any, options: Any, *,
                 compare_clock: str | None = COMPARE_CLOCK) -> dict[str, Any]:
    """Where ``plan``'s step on ``graph`` goes, from a simulation of the rewritten graph (level order) on ``profile``
    with ``options`` (``plan`` ``None``: the step as it is). Seconds and bytes, all simulated:

    ``step_s``, ``compute_s`` and ``stall_s`` (the simulator's), ``kernels``, ``peak_with_margin_bytes``;
    ``compute_busy_s`` (the union of the compute stream's op spans) and ``compute_idle_s`` (the step less it);
    ``bytes_out`` (each swapped tensor once) and ``bytes_in`` (once per swap-in group), ``swaps`` and ``swap_ins``;
    per link direction (``h2d``, ``d2h``) ``<dir>_busy_s`` (the union of its copies' spans), ``<dir>_with_compute_s``
    (the part of it the compute stream is busy) and ``<dir>_copies``; ``shape_only_swap_ins`` and
    ``shape_only_bytes`` (:func:`shape_only_swap_ins`); and ``compare_step_s``, the same graph's step on
    ``compare_clock`` (``None`` when not asked or the same clock).
    """
    from tflms.sim.simulator import simulate
    new = rewritten(graph, plan)
    sim = simulate(new, profile, options=options)
    spans: dict[str, list[tuple[float, float]]] = {"compute": [], "h2d": [], "d2h": []}
    copies = {"h2d": 0, "d2h": 0}
    for record in sim.ops:
        if record.stream in spans:
            spans[record.stream].append((record.start_s, record.end_s))
            if record.stream in copies:
                copies[record.stream] += 1
    busy = {stream: union(found) for stream, found in spans.items()}
    compute_busy = measure(busy["compute"])
    swaps = () if plan is None else plan.swaps
    shapes = shape_only_swap_ins(graph, new, plan)
    row: dict[str, Any] = {
        "clock": sim.clock, "step_s": sim.step_time_s, "compute_s": sim.compute_time_s, "stall_s": sim.stall_time_s,
        "kernels": sim.kernels, "peak_with_margin_bytes": sim.peak_with_margin_bytes,
        "compute_busy_s": compute_busy, "compute_idle_s": max(0.0, sim.step_time_s - compute_busy),
        "swaps": len(swaps), "swap_ins": sum(len(s.swap_ins) for s in swaps),
        "recomputes": 0 if plan is None else len(plan.recomputes),
        "bytes_out": sum(s.num_bytes for s in swaps), "bytes_in": sum(s.num_bytes * len(s.swap_ins) for s in swaps),
        "shape_only_swap_ins": len(shapes), "shape_only_bytes": sum(b for _, b in shapes)}
    for direction in ("h2d", "d2h"):
        row[f"{direction}_busy_s"] = measure(busy[direction])
        row[f"{direction}_with_compute_s"] = overlap(busy[direction], busy["compute"])
        row[f"{direction}_copies"] = copies[direction]
    row["compare_clock"] = row["compare_step_s"] = None
    if compare_clock is not None and compare_clock != sim.clock:
        other = simulate(new, profile, options=dataclasses.replace(options, clock=compare_clock))
        row["compare_clock"], row["compare_step_s"] = other.clock, other.step_time_s
    return row


# ---------------------------------------------------------------- the tune and its candidates


def order_of(candidate: Any) -> dict[str, Any]:
    """How the tuner judged ``candidate``: in the enforced order (with how many edges) or level order, and whether the
    order was pinned before its swaps were chosen."""
    order = candidate.order or {}
    return {"enforced": candidate.order is not None, "edges": int(order.get("edges") or 0) if order.get("applied")
            else 0, "before_swaps": bool(order.get("before_swaps"))}


def candidate_row(label: str, graph: Any, candidate: Any, baseline: Any, profile: Any, options: Any,
                  budget: int) -> dict[str, Any]:
    """The tuner's judgment of ``candidate`` beside :func:`analyse_plan`'s re-simulation of its plan."""
    sim = candidate.sim
    row: dict[str, Any] = {"label": label, "strategy": candidate.strategy,
                           "params": {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                                      for k, v in candidate.params.items()},
                           "fits": bool(candidate.fits), "why_not": candidate.why_not,
                           "tuner_step_s": sim.step_time_s, "overhead": sim.overhead_vs(baseline),
                           "tuner_peak_with_margin_bytes": sim.peak_with_margin_bytes, "budget_bytes": budget,
                           "order": order_of(candidate)}
    analysis = analyse_plan(graph, candidate.plan, profile, options)
    row["resim"] = analysis
    order = row["order"]
    row["resim_differs"] = bool(order["edges"]) and (
        abs(analysis["step_s"] - sim.step_time_s) > 1e-9 * max(sim.step_time_s, 1e-12)
        or analysis["peak_with_margin_bytes"] != sim.peak_with_margin_bytes)
    return row


def run_tune(graph: Any, ev: Any, options: Any, say) -> tuple[Any, list[Any]]:
    """The bench's full ``tflms-xla`` tune of ``graph``: ``(baseline, every candidate)`` (also where nothing fits)."""
    from tflms.errors import BudgetError
    from tflms.tune.tuner import DEFAULT_STRATEGIES, tune
    try:
        result = tune(graph, budget=ev.budget, profile=ev.profile, strategies=list(DEFAULT_STRATEGIES),
                      first_fit=False, sim_options=options, enforce_order=True, progress=say)
    except BudgetError as err:
        say(f"nothing fits: {str(err)[:300]}")
        return err.baseline, list(err.candidates)
    return result.baseline, list(result.candidates)


def chosen(candidates: Sequence[Any], top: int) -> tuple[Any, list[Any]]:
    """The best recompute-only candidate (fitting first, then fastest; ``None`` if none) and the ``top`` fastest
    hybrids, fitting ones first."""
    rank = lambda c: (not c.fits, c.sim.step_time_s)  # noqa: E731
    recomputes = sorted((c for c in candidates if c.strategy == "recompute" and c.plan is not None), key=rank)
    hybrids = sorted((c for c in candidates if c.strategy == "hybrid" and c.plan is not None), key=rank)
    return (recomputes[0] if recomputes else None), hybrids[:top]


def report(model: str, profile_name: str, size: int, clock: str | None, top: int, say,
           land_cuts: bool = False, clones_last: bool = False) -> dict[str, Any]:
    """The report's record (module doc): the plain step, the best recompute-only plan, the ``top`` hybrids."""
    from benchlib.common import HEADROOM
    from benchlib.models import Steps
    from benchlib.xla import _evaluator, xla_options

    from tflms.passes.shapes import materialize_gradient_shapes
    from tflms.pipeline.hardware import update_parts_for
    steps = Steps()
    ev = _evaluator(steps, model, profile_name, None, None, HEADROOM)
    graph, _ = steps.graph(model, "plain", size)
    graph = materialize_gradient_shapes(graph, resolved=True).graph  # as the bench tunes (benchlib.xla.tune_xla)
    options = update_parts_for(xla_options(ev.options), graph, ev.profile, ev.budget)
    if clock is not None:
        options = dataclasses.replace(options, clock=clock)
    options = dataclasses.replace(options, xla_land_cuts=land_cuts, xla_clones_last=clones_last)
    say(f"{model} at {size} on {ev.profile.name}: {len(graph)} ops, budget {ev.budget / GIB:.2f} GiB, clock "
        f"{options.clock}, update parts {options.xla_update_parts}, land cuts {'on' if land_cuts else 'off'}, clones "
        f"{'last' if clones_last else 'where needed'}; tuning")
    t0 = time.perf_counter()
    baseline, candidates = run_tune(graph, ev, options, say)
    tune_s = time.perf_counter() - t0
    recompute, hybrids = chosen(candidates, top)
    say(f"tuned in {tune_s:.0f} s: {len(candidates)} candidates, "
        f"{sum(c.strategy == 'hybrid' for c in candidates)} hybrids; re-simulating {len(hybrids)} hybrids")
    plain = analyse_plan(graph, None, ev.profile, options)
    rows = []
    if recompute is not None:
        rows.append(candidate_row("recompute", graph, recompute, baseline, ev.profile, options, ev.budget))
    for k, c in enumerate(hybrids):
        say(f"re-simulating hybrid {k + 1} of {len(hybrids)}")
        rows.append(candidate_row(f"hybrid {k + 1}", graph, c, baseline, ev.profile, options, ev.budget))
    return {"model": model, "profile": ev.profile.name, "size": size, "clock": options.clock,
            "xla_update_parts": options.xla_update_parts, "xla_land_cuts": land_cuts, "xla_clones_last": clones_last,
            "budget_bytes": ev.budget,
            "headroom": HEADROOM,
            "tune_s": tune_s, "candidates": len(candidates),
            "hybrids": sum(c.strategy == "hybrid" for c in candidates),
            "plain": {"step_s": baseline.step_time_s, "peak_with_margin_bytes": baseline.peak_with_margin_bytes,
                      "fits": baseline.peak_with_margin_bytes <= ev.budget, "resim": plain},
            "rows": rows, "simulated": True}


# ---------------------------------------------------------------- output


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f}"


def table(record: dict[str, Any]) -> str:
    """The record as two markdown tables (the tuner's judgment, then the re-simulation) and notes."""
    plain = record["plain"]
    lines = [f"{record['model']} at {record['size']} on {record['profile']}, clock {record['clock']}"
             f"{' with land cuts' if record['xla_land_cuts'] else ''}"
             f"{', clones last' if record.get('xla_clones_last') else ''}, budget "
             f"{_gib(record['budget_bytes'])} GiB (headroom {record['headroom']:g}); {record['candidates']} candidates "
             f"({record['hybrids']} hybrids) tuned in {record['tune_s']:.0f} s. All figures simulated (tflms.sim).", "",
             "| plan | strategy | step ms (sim) | overhead | fits | peak+margin GiB (sim) | tuner's order |",
             "|---|---|---|---|---|---|---|",
             f"| plain | none | {_ms(plain['step_s'])} | - | {'yes' if plain['fits'] else 'no'} | "
             f"{_gib(plain['peak_with_margin_bytes'])} | level |"]
    for r in record["rows"]:
        o = r["order"]
        order = ("level" if not o["enforced"] else f"enforced, {o['edges']} edges"
                 + (", pinned before the swaps" if o["before_swaps"] else ""))
        lines.append(f"| {r['label']} | {r['strategy']} | {_ms(r['tuner_step_s'])} | {100 * r['overhead']:+.1f}% | "
                     f"{'yes' if r['fits'] else 'no'} | {_gib(r['tuner_peak_with_margin_bytes'])} | {order} |")
    compare = next((r["resim"]["compare_clock"] for r in [plain] + record["rows"] if r["resim"]["compare_clock"]),
                   COMPARE_CLOCK)
    lines += ["", f"Re-simulated in level order on {record['clock']} (simulated):", "",
              "| plan | step ms | compute ms | stall ms | compute idle ms | out GiB | in GiB | "
              "h2d busy ms (with compute) | d2h busy ms (with compute) | shape-only swap-ins (GiB) | "
              f"step on {compare} ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, a in [("plain", plain["resim"])] + [(r["label"], r["resim"]) for r in record["rows"]]:
        lines.append(f"| {label} | {_ms(a['step_s'])} | {_ms(a['compute_s'])} | {_ms(a['stall_s'])} | "
                     f"{_ms(a['compute_idle_s'])} | {_gib(a['bytes_out'])} | {_gib(a['bytes_in'])} | "
                     f"{_ms(a['h2d_busy_s'])} ({_ms(a['h2d_with_compute_s'])}) | "
                     f"{_ms(a['d2h_busy_s'])} ({_ms(a['d2h_with_compute_s'])}) | "
                     f"{a['shape_only_swap_ins']} ({_gib(a['shape_only_bytes'])}) | {_ms(a['compare_step_s'])} |")
    lines.append("")
    if not any(r["strategy"] == "hybrid" for r in record["rows"]):
        lines.append("No hybrid candidate: the tune tried none (the plain step or a swap plan fits at no cost, or the "
                     "recompute search found nothing to pair with swaps).")
    for r in record["rows"]:
        a = r["resim"]
        note = (f"{r['label']}: {a['recomputes']} recomputes, {a['swaps']} swaps, {a['swap_ins']} swap-ins; "
                f"{', '.join(f'{k}={v}' for k, v in r['params'].items())}")
        if r["resim_differs"]:
            note += (f". The tuner judged it in the enforced order ({r['order']['edges']} edges); the re-simulation is "
                     f"in level order: step {_ms(a['step_s'])} ms against {_ms(r['tuner_step_s'])} ms, peak+margin "
                     f"{_gib(a['peak_with_margin_bytes'])} against {_gib(r['tuner_peak_with_margin_bytes'])} GiB")
        if r["order"]["before_swaps"]:
            note += ". Its swaps were chosen with the order pinned first: its graph keeps edges its plan does not say"
        if not r["fits"] and r["why_not"]:
            note += f". Not a fit: {r['why_not']}"
        lines.append("- " + note)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from tflms.sim.clock import CLOCKS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--size", type=int, required=True, help="the batch (bench.py's size)")
    parser.add_argument("--clock", choices=CLOCKS, default=None,
                        help="the simulator's clock (default: the bench's tflms-xla options', xla-clusters)")
    parser.add_argument("--land-cuts", action="store_true",
                        help="tune and re-simulate with each swap-in's reader starting a cluster of its own")
    parser.add_argument("--clones-last", action="store_true",
                        help="tune and re-simulate with the recompute clones ordered by graph position (last)")
    parser.add_argument("--top", type=int, default=5, help="hybrid candidates reported (fitting ones first)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error("--top must be 0 or more")
    t0 = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr, flush=True)

    record = report(args.model, args.profile, args.size, args.clock, args.top, say, land_cuts=args.land_cuts,
                    clones_last=args.clones_last)
    print(json.dumps(record, indent=2, default=str) if args.json else table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
