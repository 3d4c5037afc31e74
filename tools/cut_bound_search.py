"""The cut bound's exact search on one bench step, solved as often as asked: its nodes, seconds and figure each time.

The cut bound (:mod:`tflms.tune.cut_bound`) stops its search at a node limit, so that its figure is a function of the
step and the budget alone. This tool measures what that limit should be and checks that it does what it says: it
traces a bench model at one size (``tools/benchlib``, as ``bench.py --xla-targets --at MODEL=SIZE`` does), simulates
the plain XLA step with the bench's headroom and budget, and solves the bound (recompute only, any plan, or both)
``--repeat`` times, each at ``--node-limit`` nodes (``none``: until the gap closes) and ``--time-limit`` seconds.
Each solve prints one JSON line: the bound, its status (which rule stopped the search), the nodes explored and the
wall seconds; a last line says whether the repeats gave the same answer, field for field (seconds aside).

    python tools/cut_bound_search.py --model bert-base --profile h200-141gb --size 728 --node-limit none \\
        --time-limit 1800 --log              # how many nodes the search needs (HiGHS's log on stdout)
    python tools/cut_bound_search.py --model bert-base --profile h200-141gb --size 728 --repeat 2   # the default limit

Figures are simulated (tflms.sim), not measured on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = {"recompute": (False,), "any": (True,), "both": (False, True)}


def bench_step(model: str, profile_name: str, size: int, headroom: float):
    """``(analysis, plain, profile, budget, options)``: the plain step of ``model`` at ``size`` and its simulation on
    the ``xla`` clock, taken from the bench's own evaluator, as ``benchlib.xla.cut_bounds`` takes them."""
    from benchlib.models import Steps
    from benchlib.xla import _evaluator, _sim

    from tflms.analysis.cto import analyze_graph
    ev = _evaluator(Steps(), model, profile_name, None, None, headroom)
    graph, _ = ev.steps.graph(model, "plain", size)
    return analyze_graph(graph), _sim(ev, "none", size), ev.profile, ev.budget, ev.options


def solve(step, swaps: bool, node_limit: int | None, time_limit_s: float, log: bool) -> tuple[dict, float]:
    """One solve of the bound: its record (:meth:`CutBound.to_dict`) and its wall seconds."""
    from tflms.tune.cut_bound import cut_bound
    analysis, plain, profile, budget, options = step
    t0 = time.perf_counter()
    bound = cut_bound(analysis, plain, profile, budget, margin_fraction=options.margin_fraction,
                      margin_bytes=options.margin_bytes, swaps=swaps, node_limit=node_limit,
                      time_limit_s=time_limit_s, log=log)
    seconds = time.perf_counter() - t0
    record = bound.to_dict()
    record["recomputed_ops"] = list(bound.recomputed)  # (to_dict counts them; the repeats compare the names)
    return record, seconds


def main(argv=None) -> int:
    from benchlib.common import HEADROOM

    from tflms.tune.cut_bound import DEFAULT_NODE_LIMIT, SAFETY_TIME_LIMIT_S
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--size", type=int, required=True, help="the batch (bench.py's size)")
    parser.add_argument("--kind", choices=sorted(KINDS), default="both",
                        help="recompute-only plans, any plan, or both (the bench's two figures)")
    parser.add_argument("--node-limit", default=str(DEFAULT_NODE_LIMIT),
                        help=f"nodes, or 'none' (default {DEFAULT_NODE_LIMIT}, cut_bound's)")
    parser.add_argument("--time-limit", type=float, default=SAFETY_TIME_LIMIT_S, help="seconds (a safety net)")
    parser.add_argument("--repeat", type=int, default=1, help="solves of each kind, compared")
    parser.add_argument("--headroom", type=float, default=HEADROOM)
    parser.add_argument("--log", action="store_true", help="HiGHS's progress log on stdout")
    args = parser.parse_args(argv)
    node_limit = None if args.node_limit == "none" else int(args.node_limit)
    step = bench_step(args.model, args.profile, args.size, args.headroom)
    same = True
    for swaps in KINDS[args.kind]:
        records = []
        for k in range(args.repeat):
            record, seconds = solve(step, swaps, node_limit, args.time_limit, args.log)
            records.append(record)
            print(json.dumps({"model": args.model, "profile": args.profile, "size": args.size,
                              "kind": "any" if swaps else "recompute", "node_limit": node_limit,
                              "time_limit_s": args.time_limit, "solve": k + 1, "seconds": round(seconds, 1),
                              **{f: record[f] for f in ("overhead", "overhead_s", "status", "nodes", "recomputed",
                                                        "swapped_bytes", "kept_bytes")}}), flush=True)
        same = same and all(r == records[0] for r in records)
    print(json.dumps({"repeats_identical": same}), flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
