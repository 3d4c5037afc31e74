"""A 3D U-Net (Cicek et al., 2016) and its training step, with tflms (runs on a CPU in seconds).

    python examples/unet3d.py

:func:`tflms.models.build_unet3d` defines the network the TFLMS paper scaled to
larger image resolutions: ``depth`` levels of two 3x3x3 convolutions (BatchNorm +
ReLU) with 2x2x2 max-pooling on the way down, transposed convolutions and skip
connections (concatenation) on the way up, and a 1x1x1 convolution to per-voxel
class probabilities. Spatial dimensions are left unknown, so one model serves every
resolution (a multiple of ``2 ** depth``); ``tools/bench.py`` traces the same network
at many resolutions. :func:`make_train_step` is the ``tf.GradientTape`` step.

Run as a script, it trains a small U-Net at 32^3 for a few steps with
``tf.function`` and with ``tflms.function`` and checks that the weights are
bit-identical (the swaps save nothing on a CPU, but the rewrite runs), with or
without TensorFlow's oneDNN CPU kernels (``TF_ENABLE_ONEDNN_OPTS``). With oneDNN,
tflms leaves the ``MaxPool3D`` outputs that ``MaxPool3DGrad`` reads unswapped: oneDNN
hands the pooling workspace to the gradient only over that direct edge (skip reason
``onednn-workspace``, docs/design.md).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tflms.models import build_unet3d


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, *,
                    forward=None, function=tf.function):
    """``step(volume, labels) -> loss``: per-voxel cross-entropy, one optimizer update.

    ``forward`` replaces ``model(x, training=True)`` (e.g. a gradient-checkpointed
    model from :mod:`tflms.baselines.recompute`); ``function`` wraps the step
    (``tf.function`` or ``tflms.function``). Keep ``model`` and ``optimizer`` alive
    while the step is used: a traced step only holds weak references to them.
    """
    optimizer = optimizer or keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    forward = forward or model

    def step(volume, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, forward(volume, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return function(step)


def input_specs(resolution: int, *, channels: int = 4, batch: int | None = None):
    """``tf.TensorSpec``s of a cubic ``resolution``^3 volume and its labels (batch unknown by default)."""
    return (tf.TensorSpec((batch, resolution, resolution, resolution, channels), tf.float32),
            tf.TensorSpec((batch, resolution, resolution, resolution), tf.int32))


def main() -> None:
    import os

    import tflms
    from tflms.testing import bitwise_diff, snapshot

    resolution, batch = 32, 2
    rng = np.random.default_rng(0)
    volume = rng.standard_normal((batch, resolution, resolution, resolution, 4), dtype=np.float32)
    labels = rng.integers(0, 4, size=(batch, resolution, resolution, resolution), dtype=np.int32)
    weights, losses = [], []
    for wrap in (tf.function, tflms.function(swapout_threshold=8, min_swap_bytes="256KiB")):
        keras.utils.set_random_seed(0)
        model = build_unet3d(base_filters=8, depth=3)
        optimizer = keras.optimizers.Adam(1e-3)
        step = make_train_step(model, optimizer, function=wrap)
        for i in range(3):
            loss = float(step(volume, labels))
        print(f"{'tflms' if wrap is not tf.function else 'plain'}: loss after 3 steps {loss:.5f}")
        weights.append(snapshot(variables=model.variables))
        losses.append(loss)
    diff = max(float(np.max(np.abs(a - b))) for (_, a), (_, b) in zip(*weights))
    differ = bitwise_diff(*weights)  # one line per weight whose bytes differ
    print(f"{model.count_params()} parameters; largest weight difference with and without tflms: {diff:.3g}")
    print(step.report.table().splitlines()[0])
    assert step.report.num_swapped > 0, "nothing was swapped: the comparison would prove nothing"
    onednn = "off" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "default"
    assert not differ and losses[0] == losses[1], (f"training must be bit-identical (oneDNN {onednn}):\n"
                                                   + "\n".join(differ))
    print(f"{step.report.num_swapped} tensors swapped; weights bit-identical to tf.function's (oneDNN {onednn})")


if __name__ == "__main__":
    main()
