"""Which models :class:`tflms.keras.LMS` can train, and where Keras keeps their step.

Keras's train function is recognised by where ``TensorFlowTrainer._make_function`` defines it, and its step
``tf.function`` found in its closure (:func:`_keras_step`); the distribution strategies the callback supports
(:func:`_supported_strategy`); and whether Keras's ``jit_compile="auto"`` resolves to XLA on this machine
(:func:`_auto_chooses_xla`), which decides whether an XLA model is trained without XLA or refused. See the module doc
of :mod:`tflms.integrations.keras`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflms.errors import UnsupportedModelError

#: Where ``TensorFlowTrainer._make_function`` defines the train function it returns (Keras 3.0 - 3.15).
_KERAS_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_KERAS_TRAIN_FUNCTION_QUALNAME = "TensorFlowTrainer._make_function.<locals>.function"
#: The name of the step ``tf.function`` in that function's closure.
_KERAS_STEP_NAME = "one_step_on_data"


def _supported_strategy(strategy) -> bool:
    """The default strategy, ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` (see the module doc)."""
    supported = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    return _is_default_strategy(strategy) or isinstance(strategy, supported)


def _is_default_strategy(strategy) -> bool:
    from tflms._compat.tf import default_strategy
    return strategy is default_strategy()


def _auto_chooses_xla(model) -> bool:
    """Whether Keras's ``jit_compile="auto"`` resolves to XLA for ``model`` on this machine (a GPU is present)."""
    resolve = getattr(model, "_resolve_auto_jit_compile", None)  # Keras 3's own resolution (private)
    try:
        return bool(resolve()) if resolve is not None else False
    except Exception:  # noqa: BLE001 - a Keras that resolves differently: treat True as explicit
        return False


def _keras_step(model, keras_function):
    """Keras's ``one_step_on_data`` tf.function, found in the closure of ``keras_function``.

    Raises :class:`UnsupportedModelError` naming what was not found.
    """
    name = getattr(model, "name", type(model).__name__)
    if keras_function is None:
        raise UnsupportedModelError(
            f"tflms.keras.LMS: model {name!r} has no train_function yet; LMS replaces it in on_train_begin, which "
            "Keras's fit calls right after make_train_function (call model.make_train_function() first when "
            "driving the callback by hand)")
    module, qualname = getattr(keras_function, "__module__", None), getattr(keras_function, "__qualname__", None)
    if module != _KERAS_TRAINER_MODULE or qualname != _KERAS_TRAIN_FUNCTION_QUALNAME:
        raise UnsupportedModelError(
            f"tflms.keras.LMS: model {name!r} has a train_function {module}.{qualname}, not the one Keras's "
            f"TensorFlow trainer builds ({_KERAS_TRAINER_MODULE}.{_KERAS_TRAIN_FUNCTION_QUALNAME}), so the training "
            "step cannot be found. Do not override make_train_function or set model.train_function when using "
            "LMS (overriding train_step is fine); for a custom training loop use tflms.function")
    from tflms._compat.tf import closure_value
    wrapper = closure_value(keras_function, _KERAS_STEP_NAME)
    step = getattr(wrapper, "__wrapped__", wrapper)  # under keras's _autoconvert_optionals (functools.wraps)
    if step is None or not hasattr(step, "get_concrete_function"):
        raise UnsupportedModelError(
            f"tflms.keras.LMS: no tf.function {_KERAS_STEP_NAME!r} in the closure of model {name!r}'s "
            f"train_function (found {type(step).__name__}; closure names {list(getattr(getattr(keras_function, '__code__', None), 'co_freevars', ()))}). This Keras "
            f"({keras.__version__}) builds its train function differently from the Keras 3 versions tflms knows; "
            "use tflms.function in a custom training loop instead")
    return step

