"""Device names: checking them, and choosing the accelerator a rewrite plans for (a leaf module)."""

from __future__ import annotations

import re

from tflms.errors import DeviceError

_DEVICE = re.compile(r"^(/job:[^/]+)?(/replica:\d+)?(/task:\d+)?/device:(CPU|GPU|TPU|XLA_GPU|XLA_CPU):\d+$",
                     re.IGNORECASE)


def normalize_device(value: str, *, field: str) -> str:
    """Check a device string and return it in ``/device:TYPE:N`` form."""
    if not isinstance(value, str):
        raise DeviceError(f"{field}: expected a device string such as '/device:GPU:0', got {value!r}")
    text = value.strip()
    short = re.match(r"^(CPU|GPU|TPU):(\d+)$", text, re.IGNORECASE)
    if short:
        text = f"/device:{short.group(1).upper()}:{short.group(2)}"
    if not _DEVICE.match(text):
        raise DeviceError(f"{field}: {value!r} is not a device name; write e.g. '/device:GPU:0' or 'GPU:0'")
    head, _, tail = text.rpartition("/device:")
    kind, _, index = tail.partition(":")
    return f"{head}/device:{kind.upper()}:{index}"


def resolve_accelerator(accelerator_device: str | None) -> tuple[str, list[str]]:
    """The accelerator to plan for and any warning about it: the one given, else the first GPU, else the CPU."""
    if accelerator_device is not None:
        return accelerator_device, []
    try:
        import tensorflow as tf
        gpus = tf.config.list_logical_devices("GPU")
    except ImportError:  # pragma: no cover
        gpus = []
    if gpus:
        return "/device:GPU:0", []
    device = "/device:CPU:0"
    warning = ("no GPU found: swapping between host and the CPU accelerator (/device:CPU:0) saves no memory; "
               "the rewrite still runs, which is useful for testing")
    return device, [warning]
