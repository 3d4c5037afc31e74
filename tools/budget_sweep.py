"""The budget sweep of issue 45: every model kind x precision x entry point x oneDNN setting, at several budgets.

Each case (:func:`tflms.testing.sweep.run_case`) trains the plain step twice (control) and tflms at budgets between the
best rewrite's simulated peak and the unchanged step's; every run must end in a bitwise fit (inserted ops alive in what
TensorFlow ran) or a BudgetError. One subprocess per oneDNN setting (TensorFlow reads ``TF_ENABLE_ONEDNN_OPTS`` when it
starts). Progress on stderr, a table on stdout, ``--json`` for machines; exit status 1 when any run ends otherwise.

    python tools/budget_sweep.py                                  # everything (about 10 minutes on 2 cores)
    python tools/budget_sweep.py --kinds conv --precisions mixed_bfloat16 --onednn 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tflms.testing.sweep import ALLOWED, ENTRIES, FRACTIONS, KINDS, PRECISIONS  # noqa: E402


def _worker(cases: list[list[str]], fractions: list[float], recompute: str | None) -> None:
    import logging
    logging.getLogger("tflms").setLevel(logging.ERROR)
    from tflms.testing.sweep import run_case
    for kind, precision, entry in cases:
        result = run_case(kind, precision, entry, fractions=fractions, recompute=recompute)
        print(json.dumps(result), flush=True)


def sweep(kinds, precisions, entries, onednn, fractions, recompute=None) -> list[dict]:
    """Run every case in one subprocess per oneDNN setting; the results, each with ``onednn``."""
    out = []
    for setting in onednn:
        cases = [[k, p, e] for k in kinds for p in precisions for e in entries]
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "2"}
        code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                f"import budget_sweep; budget_sweep._worker({cases!r}, {list(fractions)!r}, {recompute!r})")
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith("{"):
                result = {**json.loads(line), "onednn": setting}
                out.append(result)
                print(f"oneDNN {setting} {result['kind']} {result['precision']} {result['entry']}: "
                      + ", ".join(r["outcome"] for r in result["runs"]), file=sys.stderr, flush=True)
        if proc.wait() != 0:
            out.append({"onednn": setting, "crashed": proc.returncode})
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'oneDNN':<7}{'kind':<13}{'precision':<16}{'entry':<10}{'control':<9}outcomes (budget in MiB: outcome)"]
    for r in results:
        if "crashed" in r:
            lines.append(f"{r['onednn']:<7}worker crashed with status {r['crashed']}")
            continue
        runs = ", ".join(f"{run['budget_bytes'] / 2**20:.2f}: {run['outcome']}" for run in r["runs"])
        lines.append(f"{r['onednn']:<7}{r['kind']:<13}{r['precision']:<16}{r['entry']:<10}"
                     f"{'same' if r['control'] else 'DIFFERS':<9}{runs}")
    bad = [(r, run) for r in results if "runs" in r for run in r["runs"] if run["outcome"] not in ALLOWED]
    lines.append(f"{sum(len(r.get('runs', ())) for r in results)} runs, {len(bad)} ending otherwise than a bitwise "
                 "fit or a BudgetError" + "".join(f"\n  {r['onednn']} {r['kind']} {r['precision']} {r['entry']} "
                                                  f"{run['budget_bytes']}: {run['outcome']} {run['detail']}"
                                                  for r, run in bad))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--entries", default=",".join(ENTRIES))
    ap.add_argument("--onednn", default="1,0", help="TF_ENABLE_ONEDNN_OPTS settings to run, comma-separated")
    ap.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                    help="where each budget lies between the best rewrite's peak (0) and the unchanged peak (1)")
    ap.add_argument("--recompute", default=None, help="LMSConfig.recompute for every run (default: the default)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    results = sweep(args.kinds.split(","), args.precisions.split(","), args.entries.split(","),
                    args.onednn.split(","), [float(f) for f in args.fractions.split(",")], args.recompute)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = any("crashed" in r or any(run["outcome"] not in ALLOWED for run in r["runs"]) for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
