"""Exception types raised by tflms.

Every error names the node, tensor, file or value at fault and says how to fix
it. They all derive from :class:`TflmsError`, so callers can catch one type.
"""

from __future__ import annotations


class TflmsError(Exception):
    """Base class of every error tflms raises on purpose."""


class ConfigError(TflmsError, ValueError):
    """A configuration value is invalid or contradicts another one."""


class UnitsError(ConfigError):
    """A quantity such as a byte size has missing or unknown units."""


class GraphError(TflmsError, ValueError):
    """The input graph cannot be read or violates an IR invariant."""


class UnsupportedGraphError(GraphError):
    """The graph holds a construct tflms cannot rewrite (e.g. TF1 control flow)."""


class NoTrainingStepError(GraphError):
    """The graph has no gradient computation, so there is nothing to swap."""


class DeviceError(ConfigError):
    """A device string is malformed or names a device that does not exist."""


class BudgetError(TflmsError, ValueError):
    """No configuration fits the memory budget."""


class SavedModelError(TflmsError):
    """A SavedModel cannot be read, selected from, written or verified as asked."""


class UnsupportedModelError(TflmsError, ValueError):
    """The model's training setup is one the LMS callback cannot rewrite (the message says why and what to do)."""


class DistributeError(TflmsError, ValueError):
    """A step cannot run as asked under ``tf.distribute`` (the message says why and what to do)."""


class VariableCreationError(TflmsError, ValueError):
    """The first call creates variables TensorFlow cannot initialize outside the function."""


class UnsupportedVersionError(TflmsError, ImportError):
    """This TensorFlow or Keras lacks an internal tflms relies on (the message names it and the tested versions)."""


class UnknownSizeError(ConfigError):
    """A memory verdict (fits, peak, overhead) was asked for a graph with tensors of unknown size.

    The message names the tensors and the fix: a batch size (``batch_size=`` /
    ``--batch-size``) when the unknown dimension is the batch.
    """


class HostMemoryError(BudgetError):
    """A plan holds more swapped bytes on the host than TensorFlow will pin (``TF_GPU_HOST_MEM_LIMIT_IN_MB``)."""


class KerasFlavourError(UnsupportedModelError):
    """A Keras 3 object where a tf_keras (Keras 2) one is needed, or the reverse (the message names the flavour
    found and what to use instead)."""


class MissingExtraError(TflmsError, ImportError):
    """An optional feature needs a package tflms does not require (the message names the extra that installs it)."""
