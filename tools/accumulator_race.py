"""Is plain TensorFlow deterministic when grappler accumulates an AddN? And does tflms match it?

Grappler's memory optimizer turns an ``AddN`` of more than two inputs that is live at
the estimated peak into a ``TemporaryVariable`` accumulator when that peak passes 80%
of the device's memory (a CPU device has 256 MiB): one ``AssignAdd`` per input,
nothing ordering them (docs/design.md, "Exceptions to bitwise"). This trains a model
``--runs`` times with plain ``tf.function`` and counts the distinct results (weights,
RMSprop slots and losses, by bytes). The default model is the kit's ``accumulated`` (a
1x1 Conv2D + ReLU read by three activations that are summed, batch 4 at 256x256: the
sum and its gradient are AddNs of three 64 MiB tensors), beside the same model with two
activations (no AddN of three, so no accumulator) as the control; ``--model NAME`` trains
a keras.applications model instead (``weights=None``, its minimum input, 3 classes,
batch 2). With ``--tflms`` each model is also trained with
``tflms.function(swapout_threshold=1)``, which observes the summation order in one call
and pins it (``tflms.measure.accumulations``), and the table says how many plain runs it
matched; ``--static-order`` adds a run that pins a CPU's usual order without observing.
Thread counts are set before TensorFlow starts.

    python tools/accumulator_race.py [--runs 6] [--inter 1] [--intra 1] [--tflms] [--json out.json]
    python tools/accumulator_race.py --model InceptionResNetV2 --runs 4 --tflms --static-order

Run with ``TF_ENABLE_ONEDNN_OPTS=0`` (or 1) to choose oneDNN's kernels.
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
#: keras.applications models: batch, and the inputs larger than Keras's minimum of 32.
APPLICATION_BATCH = 2
APPLICATION_MIN_INPUT = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}


def _kit_model(activations):
    from tflms.testing import build_model
    return build_model("accumulated", size=SIDE, activations=tuple(activations)), BATCH


def _application(name):
    import keras
    keras.utils.set_random_seed(0)
    side = APPLICATION_MIN_INPUT.get(name, 32)
    return getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3), classes=3,
                                              classifier_activation=None), APPLICATION_BATCH


def _not_observed(*_args, **_kwargs):
    from tflms.measure.accumulations import ObservationError
    raise ObservationError("turned off by --static-order")


def train_once(activations=(), *, application: str | None = None, lms: bool = False, observe: bool = True) -> dict:
    """One training of STEPS steps: the digest of its state, the accumulators TensorFlow ran and, with ``lms``
    (tflms.function(swapout_threshold=1)), how tflms pinned their order (``observe=False``: without observing it,
    as a CPU's executor usually sums, reverse graph order)."""
    import unittest.mock

    import keras
    import tensorflow as tf

    import tflms
    import tflms.measure.accumulations
    from tflms.testing import make_batches, make_train_step, record_run_metadata, snapshot
    if not observe:
        with unittest.mock.patch.object(tflms.measure.accumulations, "observe_accumulation_orders", _not_observed):
            return train_once(activations, application=application, lms=lms)
    keras.backend.clear_session()
    model, batch = _application(application) if application else _kit_model(activations)
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    fn = make_train_step(model, optimizer)
    step = tflms.function(fn, swapout_threshold=1) if lms else tf.function(fn)
    with record_run_metadata() as ran:
        losses = [step(tf.constant(x), tf.constant(y))
                  for x, y in make_batches(model, batch_size=batch, steps=STEPS, seed=1)]
    digest = hashlib.sha256()
    for name, value in snapshot(model, optimizer, losses=losses):
        digest.update(name.encode() + value.tobytes())
    graph = ran.step_graph().post_optimization_graph
    return {"digest": digest.hexdigest()[:12],
            "accumulators": sum(n.op == "DestroyTemporaryVariable" for n in graph.node),
            "pins": [dict(p) for p in step.report.accumulations] if lms else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="plain trainings per model (default 6)")
    parser.add_argument("--inter", type=int, default=0, help="inter-op threads (0: TensorFlow's default)")
    parser.add_argument("--intra", type=int, default=0, help="intra-op threads (0: TensorFlow's default)")
    parser.add_argument("--model", help="a keras.applications model (default: the kit's accumulated model and its "
                        "control)")
    parser.add_argument("--tflms", action="store_true", help="also train each model once with "
                        "tflms.function(swapout_threshold=1) and say which plain result it matched")
    parser.add_argument("--static-order", action="store_true", help="with --tflms, also train once without "
                        "observing the order (a CPU's usual order is pinned: what tflms did before it observed)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs {args.runs}: at least 2 runs are needed to see a difference")
    import tensorflow as tf
    if args.inter:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter)
    if args.intra:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)
    if args.model:
        import keras
        if not callable(getattr(keras.applications, args.model, None)):
            parser.error(f"--model {args.model}: not a keras.applications model (e.g. InceptionResNetV2)")
        models = [(f"{args.model} (batch {APPLICATION_BATCH})", {"application": args.model})]
    else:
        models = [("3 activations (AddN of 3)", {"activations": ("tanh", "sigmoid", "softplus")}),
                  ("2 activations (control)", {"activations": ("tanh", "sigmoid")})]
    rows = []
    for label, how in models:
        digests, accumulators = collections.Counter(), set()
        for run in range(args.runs):
            out = train_once(**how)
            digests[out["digest"]] += 1
            accumulators.add(out["accumulators"])
            print(f"[{label}] run {run + 1}/{args.runs}: {out['digest']}, {out['accumulators']} accumulator(s)",
                  file=sys.stderr)
        row = {"model": label, "runs": args.runs, "distinct_results": len(digests),
               "accumulators": sorted(accumulators), "results": dict(digests)}
        for key, observe in (("tflms", True), ("tflms_static", False)):
            if not args.tflms or (key == "tflms_static" and not args.static_order):
                continue
            out = train_once(**how, lms=True, observe=observe)
            row[key] = {"digest": out["digest"], "pins": out["pins"],
                        "matches_plain_runs": digests.get(out["digest"], 0)}
            print(f"[{label}] {key}: {out['digest']}, orders "
                  f"{[(p['source'], [n.rsplit('_', 1)[-1] for n in p['order']]) for p in out['pins']]}",
                  file=sys.stderr)
        rows.append(row)
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")
    print(f"plain tf.function, {STEPS} steps; inter-op threads {args.inter or 'default'}, intra-op "
          f"{args.intra or 'default'}, TF_ENABLE_ONEDNN_OPTS={onednn}")
    columns = [(key, title) for key, title in (("tflms", "tflms = plain in"), ("tflms_static", "static order = in"))
               if any(key in r for r in rows)]
    print(f"{'model':<30}{'runs':>6}{'distinct results':>18}{'accumulators ran':>18}"
          + "".join(f"{title:>20}" for _, title in columns))
    for r in rows:
        print(f"{r['model']:<30}{r['runs']:>6}{r['distinct_results']:>18}{'/'.join(map(str, r['accumulators'])):>18}"
              + "".join(f"{r[key]['matches_plain_runs']:>11} of {r['runs']:<6}" for key, _ in columns))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inter": args.inter, "intra": args.intra, "onednn": onednn, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
