"""Largest batch that fits a budget with and without tflms, and the predicted overhead.

Default: Keras ResNet-50 (weights=None, 224x224x3, 1000 classes, SGD momentum) on the
V100-16GB / PCIe 3.0 profile. Prints a table; --json prints records.

    python tools/max_batch.py                       # ResNet-50 at the V100-16GB budget
    python tools/max_batch.py --model mlp --profile h100-80gb-pcie5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _say(msg: str) -> None:
    print(f"[max_batch] {msg}", file=sys.stderr, flush=True)


def build_step(model_name: str):
    """A custom training step traced once with an unknown batch dimension."""
    import keras
    import tensorflow as tf

    from tflms.demo import make_train_step

    keras.utils.set_random_seed(0)
    if model_name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
        x_spec = tf.TensorSpec((None, 224, 224, 3), tf.float32)
    elif model_name == "mlp":
        model = keras.Sequential([keras.Input((1024,))] + [keras.layers.Dense(4096, activation="relu")
                                                            for _ in range(8)] + [keras.layers.Dense(1000)])
        x_spec = tf.TensorSpec((None, 1024), tf.float32)
    else:
        raise SystemExit(f"unknown model {model_name!r}")
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    step = tf.function(make_train_step(model, optimizer, from_logits=False))

    # The model and optimizer must outlive the trace: the function only holds weak references.
    return step.get_concrete_function(x_spec, tf.TensorSpec((None,), tf.int32)), (model, optimizer)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=("resnet50", "mlp"))
    parser.add_argument("--profile", default="v100-16gb-pcie3")
    parser.add_argument("--budget", default=None, help="default: the profile's memory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from tflms.budget import margin_fraction
    from tflms.ir import tf_io
    from tflms.sim import SimOptions, get_profile
    from tflms.tune.maxbatch import max_batch
    from tflms.units import format_bytes

    profile = get_profile(args.profile)
    _say(f"tracing {args.model} once with an unknown batch dimension")
    t0 = time.perf_counter()
    concrete, keep_alive = build_step(args.model)
    graph = tf_io.from_concrete_function(concrete)
    _say(f"traced {len(graph)} ops in {time.perf_counter() - t0:.1f} s")
    records = []
    for with_tflms in (False, True):
        t0 = time.perf_counter()
        margin = margin_fraction(args.budget)  # 5% on the profile's memory, as the library and tools/bench.py
        result = max_batch(graph, budget=args.budget, profile=profile, with_tflms=with_tflms, progress=_say,
                           sim_options=SimOptions(margin_fraction=margin))
        record = {"model": args.model, "profile": profile.name, "budget_bytes": args.budget or profile.memory_bytes,
                  "margin_fraction": margin,
                  "method": "tflms" if with_tflms else "none", "search_s": time.perf_counter() - t0,
                  **result.to_dict()}
        records.append(record)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    base, lms = records
    margin = f", peaks with a {base['margin_fraction']:.0%} margin" if base["margin_fraction"] else ""
    print(f"{args.model} on {profile.name} (budget {format_bytes(base['budget_bytes'])}{margin}), simulated")
    print(f"{'method':<8}{'max batch':>10}{'peak':>14}{'step ms':>10}{'overhead':>10}  strategy")
    for r in records:
        overhead = f"{100 * r['overhead']:+.1f}%" if "overhead" in r else "-"
        print(f"{r['method']:<8}{r['batch_size']:>10}{format_bytes(r.get('peak_bytes', 0)):>14}"
              f"{1e3 * r.get('step_time_s', 0):>10.1f}{overhead:>10}  {r.get('strategy', '-')}")
    if base["batch_size"]:
        print(f"tflms: {lms['batch_size'] / base['batch_size']:.2f}x larger batch "
              f"(TFLMS paper, ResNet-50 on POWER9+V100: 4.9x reported, not measured here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
