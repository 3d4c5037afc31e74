"""``import tflms.keras`` gives the Keras callback (``tflms.keras.LMS``); it lives in :mod:`tflms.integrations.keras`."""

from tflms.integrations.keras import LMS, UnsupportedModelError

__all__ = ["LMS", "UnsupportedModelError"]
