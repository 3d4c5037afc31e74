"""tf_keras (Keras 2) models in ``tflms.keras.LMS``: finding the step tf_keras's ``fit`` runs.

``tflms.keras.LMS`` serves both Keras flavours with one class: it reads the
flavour of the model it is given in ``on_train_begin``
(:func:`tflms._compat.flavour.keras_flavour`) and, for a ``tf_keras`` model,
finds the training step here; the rest (tracing for the iterator's
``element_spec``, rewriting each trace once, the Python loop over
``steps_per_execution`` batches, putting Keras's train function back in
``on_train_end``) is the Keras 3 path's, unchanged.

How tf_keras trains (``tf_keras/src/engine/training.py``, ``Model.make_train_function``,
tf_keras 2.16 - 2.21): ``fit`` stores in ``model.train_function`` (and
``model.train_tf_function``) a ``tf.function`` of a local ``train_function(iterator)``
that calls a local ``step_function(model, iterator)`` once, or ``steps_per_execution``
times in a ``tf.range`` loop (``steps_per_execution`` is a variable that tf_keras's
data handler lowers for the last, shorter execution of an epoch). ``step_function``
takes ``next(iterator)`` and runs ``model.train_step`` under
``model.distribute_strategy.run``, increments ``model._train_counter`` and reduces the
replicas' outputs. tf_keras has no step ``tf.function`` of its own to rewrite (Keras 3's
``one_step_on_data``), so this module makes one out of tf_keras's own ``step_function``,
found in the closure of ``train_function``: a ``tf.function`` of ``data`` that calls
``step_function(model, iterator)`` with an iterator whose ``next()`` is ``data``. Its
graph is the body of tf_keras's step with ``data`` as an argument instead of an
``IteratorGetNext``: the same ops in the same order (``tests/test_tf_keras.py`` trains
bitwise like ``fit`` without the callback). Taking the batch as an argument, not the
iterator, matters: a trial call may run the step (the accumulation-order observation of
:mod:`tflms.measure.accumulations`), and it could not undo advancing an iterator.

The callback hooks tf_keras's ``CallbackList`` asks every callback about
(``_implements_train_batch_hooks`` and friends, ``_supports_tf_logs``) come from
:class:`TfKerasCallbackHooks`: LMS has no batch hooks, so tf_keras does not turn logs
into numpy values for it after every batch.

Not handled, and said so (:class:`~tflms.errors.UnsupportedModelError` before the first
step): a train function tf_keras did not build (``make_train_function`` overridden; a
``ParameterServerStrategy``'s coordinator, refused with the other strategies), a model
compiled with ``jit_compile=True`` (XLA ignores swap ops; tf_keras's default is no XLA),
``MultiWorkerMirroredStrategy`` (tested with Keras 3 models only). ``run_eagerly=True``:
the callback warns and stands aside, as for Keras 3. ``steps_per_execution="auto"``
(tf_keras's tuner changes the variable between calls) is read at every call as a fixed
value is, and is not tested.
"""

from __future__ import annotations

from typing import Any

from tflms._compat.flavour import TF_KERAS, check_flavour
from tflms.errors import UnsupportedModelError

#: Where ``Model.make_train_function`` defines the function it wraps in ``tf.function`` (tf_keras 2.16 - 2.21).
TRAINER_MODULE = "tf_keras.src.engine.training"
TRAIN_FUNCTION_QUALNAME = "Model.make_train_function.<locals>.train_function"
#: The name of the one-step function in that function's closure.
STEP_NAME = "step_function"


class TfKerasCallbackHooks:
    """What tf_keras's ``CallbackList`` reads from every callback besides the ``on_*`` methods.

    A Keras 3 callback lacks ``_implements_train_batch_hooks`` and its two siblings
    (tf_keras's ``CallbackList`` fails on it with an ``AttributeError``). A callback with
    no batch hooks says so, and takes logs as tensors (``_supports_tf_logs``), so that
    tf_keras does not copy the logs to numpy after every batch on its account.
    """

    _supports_tf_logs = True
    _chief_worker_only = None

    def _implements_train_batch_hooks(self) -> bool:
        return False

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


class _NextBatch:
    """The iterator tf_keras's ``step_function`` reads: ``next()`` gives the batch it was made with."""

    def __init__(self, data: Any):
        self.data = data

    def __iter__(self) -> "_NextBatch":
        return self

    def __next__(self) -> Any:
        return self.data


def tf_keras_version() -> str:
    try:
        import tf_keras
        return tf_keras.__version__
    except (ImportError, AttributeError):  # pragma: no cover - a tf_keras model implies an importable tf_keras
        return "unknown"


def train_step_function(model, keras_function) -> Any:
    """A ``tf.function(data)`` running tf_keras's own ``step_function`` for ``model`` on ``data`` (see the module doc).

    ``keras_function``: ``model.train_function`` as tf_keras's ``fit`` set it. Raises
    :class:`UnsupportedModelError` naming what was not found.
    """
    import tensorflow as tf

    check_flavour(model, TF_KERAS, "tflms.integrations.tf_keras.train_step_function",
                  "tflms.keras.LMS finds a Keras 3 model's step itself (tflms.integrations.keras._keras_step)")
    name = getattr(model, "name", type(model).__name__)
    if keras_function is None:
        raise UnsupportedModelError(
            f"tflms.keras.LMS: tf_keras model {name!r} has no train_function yet; LMS replaces it in on_train_begin, "
            "which tf_keras's fit calls right after make_train_function (call model.make_train_function() first when "
            "driving the callback by hand)")
    python_function = getattr(keras_function, "python_function", None)
    module = getattr(python_function, "__module__", None)
    qualname = getattr(python_function, "__qualname__", None)
    if module != TRAINER_MODULE or qualname != TRAIN_FUNCTION_QUALNAME:
        found = (f"{module}.{qualname}" if python_function is not None else
                 f"{getattr(keras_function, '__module__', None)}.{getattr(keras_function, '__qualname__', None)}")
        raise UnsupportedModelError(
            f"tflms.keras.LMS: tf_keras model {name!r} has a train_function {found}, not the tf.function of "
            f"{TRAINER_MODULE}.{TRAIN_FUNCTION_QUALNAME} that tf_keras's make_train_function builds, so the training "
            "step cannot be found. Do not override make_train_function or set model.train_function when using LMS "
            "(overriding train_step is fine); for a custom training loop use tflms.function")
    from tflms._compat.tf import closure_value
    step_function = closure_value(python_function, STEP_NAME)
    if not callable(step_function):
        raise UnsupportedModelError(
            f"tflms.keras.LMS: no {STEP_NAME!r} in the closure of tf_keras model {name!r}'s train_function (closure "
            f"names {list(getattr(getattr(python_function, '__code__', None), 'co_freevars', ()))}). This tf_keras ({tf_keras_version()}) builds its train function "
            "differently from the versions tflms knows (2.16 - 2.21); use tflms.function in a custom training loop")

    def one_step_on_data(data):
        """One step of tf_keras's ``fit`` on ``data`` (tf_keras's ``step_function``, fed ``data`` by ``next()``)."""
        return step_function(model, _NextBatch(data))

    # As tf_keras wraps train_function (autograph on, reduce_retracing), so the step traces as it does there.
    return tf.function(one_step_on_data, reduce_retracing=True)


def check_supported(model) -> None:
    """What tflms.keras.LMS refuses for a tf_keras model before the strategy check both flavours share.

    ``jit_compile=True``: XLA compiles the whole step as one cluster and ignores swap ops (tf_keras has no
    ``"auto"``; its default is no XLA). ``MultiWorkerMirroredStrategy``: allowed for Keras 3 models, not yet tested
    with tf_keras, so refused with the ones that are untested.
    """
    import tensorflow as tf

    if getattr(model, "jit_compile", False) and not model.run_eagerly:
        raise UnsupportedModelError(
            f"tflms.keras.LMS: tf_keras model {model.name!r} is compiled with jit_compile=True: XLA compiles the "
            "whole step as one cluster and does its own memory planning, so swap ops would be ignored. Compile with "
            "model.compile(..., jit_compile=False) (tf_keras's default)")
    if isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise UnsupportedModelError(
            f"tflms.keras.LMS: tf_keras model {model.name!r} trains under MultiWorkerMirroredStrategy, which tflms "
            "has not tested with tf_keras (it has with Keras 3 models). Use MirroredStrategy on one machine, a "
            "Keras 3 model, or tflms.function in a custom training loop")
