"""tflms: train TensorFlow 2 models that do not fit in accelerator memory.

tflms rewrites a training step so that activations the accelerator will not need
for a while are copied to host memory and copied back before their consumers
run. Public API:

- :func:`function`: drop-in for ``tf.function`` in custom training loops;
- ``tflms.keras.LMS``: a Keras callback for ``model.fit``;
- the ``tflms`` command: ``demo``, ``rewrite``/``analyze`` for SavedModels;
- :func:`analyze`: categorized topological ordering of a training step;
- :func:`rewrite`: insert swap ops as a :class:`LMSConfig` says, with a report;
- :func:`rewrite_step`: the pipeline all of the above run (load, analyze, tune or plan, passes, build).
"""

from tflms._compat.versions import check_installed as _check_versions

_check_versions()  # an unsupported TensorFlow or Keras fails here, naming both and the supported range

from tflms.config import LMSConfig  # noqa: E402 - after the version check
from tflms.errors import (BudgetError, ConfigError, DeviceError, DistributeError, GraphError,  # noqa: E402
                          KerasFlavourError, NoTrainingStepError, SavedModelError, TflmsError, UnitsError,
                          UnsupportedGraphError, UnsupportedModelError, VariableCreationError)
from tflms.integrations.function import function
from tflms.pipeline import StepRewrite, analyze, rewrite, rewrite_step

__version__ = "0.1.0"

__all__ = ["BudgetError", "ConfigError", "DeviceError", "DistributeError", "GraphError", "KerasFlavourError",
           "LMSConfig", "NoTrainingStepError", "SavedModelError", "TflmsError", "UnitsError", "UnsupportedGraphError",
           "UnsupportedModelError", "analyze", "StepRewrite", "VariableCreationError", "function", "rewrite",
           "rewrite_step"]
