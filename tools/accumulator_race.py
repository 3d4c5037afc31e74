"""Is plain TensorFlow deterministic when grappler accumulates an AddN? (no tflms involved)

Grappler's memory optimizer turns an ``AddN`` of more than two inputs that is live at
the estimated peak into a ``TemporaryVariable`` accumulator when that peak passes 80%
of the device's memory (a CPU device has 256 MiB): one ``AssignAdd`` per input,
nothing ordering them (docs/design.md, "Exceptions to bitwise"). This trains the
kit's ``accumulated`` model ``--runs`` times with plain ``tf.function`` (a 1x1 Conv2D + ReLU read
by three activations that are summed, batch 4 at 256x256: the sum and its gradient
are AddNs of three 64 MiB tensors) and counts the distinct results (weights, RMSprop
slots and losses, by bytes), beside the same model with two activations (no AddN of
three, so no accumulator) as the control. Thread counts are set before TensorFlow
starts.

    python tools/accumulator_race.py [--runs 6] [--inter 1] [--intra 1] [--json out.json]

Run with ``TF_ENABLE_ONEDNN_OPTS=0`` to rule out oneDNN's kernels.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH, STEPS, SIDE = 4, 2, 256


def train_once(activations) -> tuple[str, int]:
    """(digest of the state after STEPS plain steps, number of accumulators TensorFlow ran)."""
    import keras
    import tensorflow as tf

    from tflms.testing import build_model, make_batches, make_train_step, record_run_metadata, snapshot
    keras.backend.clear_session()
    model = build_model("accumulated", size=SIDE, activations=tuple(activations))
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    with record_run_metadata() as ran:
        losses = [step(tf.constant(x), tf.constant(y))
                  for x, y in make_batches(model, batch_size=BATCH, steps=STEPS, seed=1)]
    digest = hashlib.sha256()
    for name, value in snapshot(model, optimizer, losses=losses):
        digest.update(name.encode() + value.tobytes())
    graph = ran.step_graph().post_optimization_graph
    return digest.hexdigest()[:12], sum(n.op == "DestroyTemporaryVariable" for n in graph.node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="plain trainings per model (default 6)")
    parser.add_argument("--inter", type=int, default=0, help="inter-op threads (0: TensorFlow's default)")
    parser.add_argument("--intra", type=int, default=0, help="intra-op threads (0: TensorFlow's default)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs {args.runs}: at least 2 runs are needed to see a difference")
    import tensorflow as tf
    if args.inter:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter)
    if args.intra:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)
    rows = []
    for label, activations in [("3 activations (AddN of 3)", ("tanh", "sigmoid", "softplus")),
                               ("2 activations (control)", ("tanh", "sigmoid"))]:
        digests, accumulators = collections.Counter(), set()
        for run in range(args.runs):
            digest, count = train_once(activations)
            digests[digest] += 1
            accumulators.add(count)
            print(f"[{label}] run {run + 1}/{args.runs}: {digest}, {count} accumulator(s)", file=sys.stderr)
        rows.append({"model": label, "runs": args.runs, "distinct_results": len(digests),
                     "accumulators": sorted(accumulators), "results": dict(digests)})
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")
    print(f"plain tf.function, {STEPS} steps at batch {BATCH}, {SIDE}x{SIDE}; inter-op threads "
          f"{args.inter or 'default'}, intra-op {args.intra or 'default'}, TF_ENABLE_ONEDNN_OPTS={onednn}")
    print(f"{'model':<28}{'runs':>6}{'distinct results':>18}{'accumulators ran':>18}")
    for r in rows:
        print(f"{r['model']:<28}{r['runs']:>6}{r['distinct_results']:>18}{'/'.join(map(str, r['accumulators'])):>18}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inter": args.inter, "intra": args.intra, "onednn": onednn, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
