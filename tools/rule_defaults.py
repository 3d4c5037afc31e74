"""How TFLMS rule settings compare on a keras.applications model (the measurement behind tflms's default).

Traces the model's training step (``tflms.testing.make_train_step``, SGD with momentum), then simulates the step
unchanged and rewritten by the TFLMS rules at several (swapout_threshold, min_swap_bytes) settings: swaps, peak
and step time on a hardware profile. Every figure is simulated.

    python tools/rule_defaults.py --model MobileNetV2 --batch 32
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="MobileNetV2", help="a keras.applications model (default %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default %(default)s)")
    parser.add_argument("--size", type=int, default=224, help="input side (default %(default)s)")
    parser.add_argument("--profile", default="v100-16gb-pcie3", help="hardware profile (default %(default)s)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import tflms
    from tflms.ir.tf_io import load_graph
    from tflms.sim.simulator import simulate
    from tflms.testing import make_train_step

    model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.size, args.size, 3),
                                                    classes=1000)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    graph = load_graph(step.get_concrete_function(tf.TensorSpec((args.batch, args.size, args.size, 3)),
                                                  tf.TensorSpec((args.batch,), tf.int32)))
    base = simulate(graph, args.profile)
    print(f"{args.model}, batch {args.batch}, {args.size}x{args.size}, {args.profile} (simulated)")
    print(f"{'setting':<28}{'swaps':>7}{'peak GiB':>10}{'step ms':>10}")
    print(f"{'no swaps':<28}{0:>7}{base.peak_bytes / 2**30:>10.2f}{base.step_time_s * 1e3:>10.1f}")
    for threshold, min_bytes in [(1, 0), (4, 0), (8, "64KiB"), (8, "1MiB"), (16, "1MiB"), (32, "1MiB")]:
        result = tflms.rewrite(graph, swapout_threshold=threshold, min_swap_bytes=min_bytes,
                               accelerator_device="/device:GPU:0")
        sim = simulate(result.graph, args.profile)
        label = f"threshold {threshold}, min {min_bytes}"
        print(f"{label:<28}{result.report.num_swapped:>7}{sim.peak_bytes / 2**30:>10.2f}"
              f"{sim.step_time_s * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
