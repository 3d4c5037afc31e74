"""A custom training loop with tflms.function (runs on a CPU in a few seconds).

    python examples/custom_loop.py

The step is an ordinary tf.GradientTape step; swapping tflms.function for
tf.function is the only change. On a machine without a GPU, tflms warns that
the swaps save nothing (host and accelerator are the same CPU), but the rewrite
runs and training is bitwise identical: the script trains the same model from
the same seed with tf.function and with tflms.function and checks it.
"""

import numpy as np
import tensorflow as tf
import keras

import tflms
from tflms.testing import bitwise_diff, snapshot


def train(wrap, steps: int = 3):
    """Train a fresh model from a fixed seed with ``wrap(step)``; the step function and the final weights."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 3)),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @wrap
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(0)
    for step in range(steps):
        x = rng.standard_normal((32, 32, 32, 3), dtype=np.float32)
        y = rng.integers(0, 10, size=(32,), dtype=np.int32)
        print(f"step {step}: loss {float(train_step(x, y)):.4f}")
    return train_step, snapshot(variables=model.variables)


_, plain = train(tf.function)
train_step, swapped = train(tflms.function(swapout_threshold=4, min_swap_bytes="64KiB"))
print(train_step.report.table())

differ = bitwise_diff(plain, swapped)  # one line per weight whose bytes differ
print(f"\n{train_step.report.num_swapped} tensors swapped; weights identical to tf.function's: {not differ}")
assert train_step.report.num_swapped > 0, "nothing was swapped: the comparison would prove nothing"
assert not differ, "training with tflms.function differs from tf.function:\n" + "\n".join(differ)
