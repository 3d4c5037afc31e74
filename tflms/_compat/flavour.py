"""Which Keras an object comes from: Keras 3 (the ``keras`` package) or Keras 2 (the ``tf_keras`` package).

Both can live in one process (``TF_USE_LEGACY_KERAS=1`` only routes ``tf.keras``
to ``tf_keras``), and their models, layers and callbacks look alike but are built
differently, so code that reads Keras internals must know which one it holds. The
flavour is read from the modules of the object's classes (its own class first,
then its bases), so a user's subclass of either is recognised and nothing is
imported: asking about a Keras 3 model does not import ``tf_keras``.
"""

from __future__ import annotations

from typing import Any

from tflms.errors import KerasFlavourError

#: The flavours, as error messages name them.
KERAS_3 = "Keras 3"
TF_KERAS = "tf_keras (Keras 2)"
#: The top-level package of each flavour's classes (tf.keras classes are Keras 3's ``keras.src`` ones, or
#: ``tf_keras`` ones under TF_USE_LEGACY_KERAS=1).
_PACKAGES = {"keras": KERAS_3, "tf_keras": TF_KERAS}
#: How a user builds a model of each flavour.
_HOW = {KERAS_3: "import keras (or tf.keras without TF_USE_LEGACY_KERAS)",
        TF_KERAS: "import tf_keras (or tf.keras with TF_USE_LEGACY_KERAS=1)"}


def keras_flavour(obj: Any) -> str | None:
    """:data:`KERAS_3`, :data:`TF_KERAS`, or ``None`` when no class of ``obj`` comes from either package."""
    for cls in type(obj).__mro__:
        flavour = _PACKAGES.get((getattr(cls, "__module__", None) or "").partition(".")[0])
        if flavour is not None:
            return flavour
    return None


def check_flavour(obj: Any, expected: str, where: str, instead: str) -> None:
    """Raise :class:`KerasFlavourError` if ``obj`` comes from the other Keras than ``expected``.

    ``where``: the code path that needs an ``expected`` object (``"tflms.baselines.recompute.checkpointed"``);
    ``instead``: what to do with the flavour found, a sentence. An object of neither flavour passes (duck typing:
    the code path says what it lacks).
    """
    found = keras_flavour(obj)
    if found is None or found == expected:
        return
    name = getattr(obj, "name", None) or type(obj).__name__
    raise KerasFlavourError(
        f"{where}: {name!r} is a {found} object ({type(obj).__module__}.{type(obj).__qualname__}), and this code "
        f"path takes {expected} models only ({_HOW[expected]}). {instead}")
