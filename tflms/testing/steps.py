"""The one GradientTape training step used by tests, tools, examples and the demo."""

from __future__ import annotations

from typing import Any, Callable


def make_train_step(model: Any, optimizer: Any, loss_fn: Any = None, *, forward: Callable | None = None) -> Callable:
    """A custom-loop training step ``step(x, y) -> loss``: forward, ``tape.gradient``, ``apply_gradients``.

    ``loss_fn(y_true, y_pred)`` is any Keras loss or callable; the default is
    sparse categorical cross-entropy on logits (what the model zoo outputs).
    ``x`` may be a tensor or a structure of tensors (as the model takes them).
    ``forward(x, training=True)`` replaces ``model`` in the forward pass (e.g. a
    recomputing wrapper of it); the gradients are still of ``model``'s variables.
    Wrap the result in ``tf.function`` or ``tflms.function``. Build the model and
    the optimizer (``optimizer.build(model.trainable_variables)``) before the
    first call when wrapping it in ``tflms.function`` (see its doc).
    """
    import keras
    import tensorflow as tf
    if loss_fn is None:
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, (forward or model)(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step
