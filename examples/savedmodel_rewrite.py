"""Rewrite a saved training module offline, then load it and train.

    python examples/savedmodel_rewrite.py            # works on a CPU-only machine

1. A ``tf.Module`` holding a Keras model, its optimizer and a ``train``
   ``tf.function`` (with an input signature) is saved with ``tf.saved_model.save``.
2. ``tflms rewrite IN_DIR OUT_DIR`` (called here through ``tflms.cli.main``, the
   same entry point as the ``tflms`` command) writes a SavedModel whose ``train``
   swaps activations to host memory; ``--verify`` runs one step in both models
   before writing and checks the results bit for bit.
3. The rewritten model is loaded with plain ``tf.saved_model.load`` (no tflms
   needed at this point) and trained for a few steps, next to the original.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tflms.cli  # noqa: E402

BATCH = 32
STEPS = 3


class Trainer(tf.Module):
    """What gets saved: the model, the optimizer and one training step."""

    def __init__(self):
        super().__init__()
        keras.utils.set_random_seed(0)
        self.model = keras.Sequential([keras.Input((64,))] + [
            keras.layers.Dense(256, activation="relu", name=f"dense_{i}") for i in range(4)
        ] + [keras.layers.Dense(10, name="logits")])
        self.optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        self.optimizer.build(self.model.trainable_variables)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.int32, name="y")])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self.model(x, training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        in_dir, out_dir = os.path.join(work, "trainer"), os.path.join(work, "trainer_lms")
        tf.saved_model.save(Trainer(), in_dir)
        print(f"saved {in_dir}")

        code = tflms.cli.main(["rewrite", in_dir, out_dir, "--function", "train", "--batch-size", str(BATCH),
                               "--swapout-threshold", "4", "--verify"])
        if code != 0:
            return code

        original, rewritten = tf.saved_model.load(in_dir), tf.saved_model.load(out_dir)
        (step,) = rewritten.train.concrete_functions
        swaps = [op.name for op in step.graph.get_operations() if op.name.startswith("lms/")]
        print(f"\nloaded {out_dir}: train has {len(swaps)} swap ops, e.g. {swaps[:2]}")
        if not swaps:
            print("NO SWAP OPS: the comparison below would prove nothing")
            return 1
        rng = np.random.default_rng(0)
        for i in range(STEPS):
            x = tf.constant(rng.standard_normal((BATCH, 64)), tf.float32)
            y = tf.constant(rng.integers(0, 10, BATCH), tf.int32)
            a, b = original.train(x, y), rewritten.train(x, y)
            print(f"step {i + 1}: loss original {a.numpy():.9g}   rewritten {b.numpy():.9g}")
            if a.numpy().tobytes() != b.numpy().tobytes():
                print("MISMATCH")
                return 1
    print("OK: the rewritten SavedModel trains exactly like the original")
    return 0


if __name__ == "__main__":
    sys.exit(main())
