"""How long `tflms estimate` takes on ResNet-50, and how close its largest batch with tflms is to the bench's (issue 48).

The target: for Keras ResNet-50 at 224x224 (``weights=None``, 1000 classes, SGD with momentum, compiled and saved as a
``.keras`` file), ``tflms estimate FILE --batch N --profile P --json`` answers in under 60 s, and its largest batch
with tflms equals tools/bench.py's (``tflms-best`` in docs/results.json) within the bench's quick bisection step
(1/8). Each run is a fresh process, as a user runs the command, timed from its start (imports, loading the file and
tracing included). Every figure the command prints is simulated; the seconds are measured on this machine.

    python tools/bench_estimate.py                  # a table; PASS/FAIL per target
    python tools/bench_estimate.py --json           # one record per run on stdout
    python tools/bench_estimate.py --check --repeat 3

Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
#: Target: seconds for the whole command, on the project's 2-core CPU machines.
TARGET_SECONDS = 60.0
#: Target: the largest batch with tflms within this fraction of the bench's (its quick bisection step).
BENCH_STEP = 0.125


def _say(message: str) -> None:
    print(f"[bench_estimate] {message}", file=sys.stderr, flush=True)


def save_resnet50(path: Path) -> None:
    """The model a user would estimate: ResNet-50 as the bench builds it, compiled, saved as ``.keras``."""
    import keras
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy())
    model.save(path)


def bench_max(profile: str, results: Path) -> int | None:
    """tools/bench.py's largest ResNet-50 batch with tflms (``tflms-best``) on ``profile``, from its committed JSON."""
    for record in json.loads(results.read_text()):
        if (record.get("model"), record.get("profile"), record.get("method")) == ("resnet50", profile, "tflms-best"):
            return record["max_batch"]
    return None


def run_estimate(path: Path, batch: int, profile: str) -> tuple[dict, float]:
    """``(the command's JSON, its wall seconds)``."""
    cmd = [sys.executable, "-m", "tflms.cli", "estimate", str(path), "--batch", str(batch), "--profile", profile,
           "--json"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="v100-16gb-pcie3")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=1, help="runs of the command (the median time is judged)")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results.json",
                        help="the bench's JSON (default: docs/results.json)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit non-zero when a target fails")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    reference = bench_max(args.profile, args.results)
    if reference is None:
        parser.error(f"{args.results} has no resnet50 tflms-best record on {args.profile}: run tools/bench.py there")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet50.keras"
        _say(f"saving ResNet-50 to {path}")
        save_resnet50(path)
        runs = []
        for k in range(args.repeat):
            _say(f"run {k + 1}/{args.repeat}: tflms estimate {path.name} --batch {args.batch} --profile {args.profile}")
            out, seconds = run_estimate(path, args.batch, args.profile)
            runs.append({**{key: out[key] for key in ("max_batch_without", "max_batch_with", "fits_without",
                                                       "fits_with", "peak_bytes_with", "seconds")},
                         "wall_s": round(seconds, 1), "bench_max_batch": reference})
            _say(f"{seconds:.1f} s: largest batch {out['max_batch_without']} without tflms, "
                 f"{out['max_batch_with']} with")
    median = statistics.median(r["wall_s"] for r in runs)
    found = runs[-1]["max_batch_with"]
    ratio = found / reference
    checks = {"time": median < TARGET_SECONDS,
              "bench": 1 / (1 + BENCH_STEP) <= ratio <= 1 + BENCH_STEP}
    if args.json:
        for r in runs:
            print(json.dumps({**r, "simulated": True, "profile": args.profile, "batch": args.batch}))
    else:
        print(f"tflms estimate resnet50.keras --batch {args.batch} --profile {args.profile} (figures simulated; "
              "seconds measured here)")
        print(f"{'run':>4}{'wall s':>9}{'largest without':>17}{'largest with':>14}{'bench':>7}")
        for k, r in enumerate(runs, 1):
            print(f"{k:>4}{r['wall_s']:>9.1f}{r['max_batch_without']:>17}{r['max_batch_with']:>14}{reference:>7}")
        print(f"time: median {median:.1f} s against {TARGET_SECONDS:.0f} s: {'PASS' if checks['time'] else 'FAIL'}")
        print(f"largest with tflms: {found} = {ratio:.3f}x the bench's {reference} (within 1/{1 / BENCH_STEP:.0f}): "
              f"{'PASS' if checks['bench'] else 'FAIL'}")
    return 1 if args.check and not all(checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
