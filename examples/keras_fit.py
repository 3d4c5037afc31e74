"""model.fit with the tflms LMS callback (runs on a CPU in a few seconds).

    python examples/keras_fit.py

Adding ``tflms.keras.LMS(...)`` to ``callbacks`` is the only change to an
ordinary Keras 3 script. The callback rewrites the training step of ``fit``
(evaluation and prediction are untouched) and says what it swapped, once per
traced input signature. On a machine without a GPU, tflms warns that the swaps
save nothing (host and accelerator are the same CPU), but the rewritten step is
what runs, and training is bitwise identical to a plain ``fit``.

On a GPU, Keras's default ``jit_compile="auto"`` turns XLA on, which would compile the
swaps away: the callback trains without XLA for the fits it manages and warns once
(compile with ``jit_compile=False`` to say so yourself).
"""

import numpy as np
import keras

import tflms.keras
from tflms.testing import bitwise_diff


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 3)),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.MaxPooling2D(),
                              keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return model


rng = np.random.default_rng(0)
x = rng.standard_normal((96, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, size=(96,), dtype=np.int32)
x_val, y_val = x[:32], y[:32]

# Swap activations of at least 64 KiB whose consumers are more than 4 levels away.
lms = tflms.keras.LMS(swapout_threshold=4, min_swap_bytes="64KiB", verbose=1)
model = build()
model.fit(x, y, batch_size=32, epochs=2, shuffle=False, validation_data=(x_val, y_val), callbacks=[lms], verbose=2)

print()
print(lms.report.table())

# The same training without the callback gives the same weights, bit for bit.
plain = build()
plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, validation_data=(x_val, y_val), verbose=0)
differ = bitwise_diff(plain, model)  # weights and optimizer state, one line per variable whose bytes differ
print(f"\n{lms.report.num_swapped} tensors swapped; weights identical to a plain fit: {not differ}")
assert lms.report.num_swapped > 0, "nothing was swapped: the comparison would prove nothing"
assert not differ, "fit with LMS differs from a plain fit:\n" + "\n".join(differ)
