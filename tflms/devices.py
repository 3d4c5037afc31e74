"""Device names: checking them, and choosing the accelerator a rewrite plans for (a leaf module)."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator

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


def local_gpu() -> tuple[str, int | None] | None:
    """This machine's first GPU as ``(device name, memory bytes or None)``, or ``None`` without one.

    The name is CUDA's (``tf.config.experimental.get_device_details``, e.g.
    ``"NVIDIA A100-SXM4-80GB"``). The memory is the limit configured for its
    logical device if one was set (``tf.config.set_logical_device_configuration``),
    else what TensorFlow's allocator may use on it (its device attributes), else
    ``None`` (:func:`tflms.profiles.profile_for_device` then reads it from the name).
    """
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover
        return None
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    gpu = gpus[0]
    try:
        name = tf.config.experimental.get_device_details(gpu).get("device_name") or gpu.name
    except (ValueError, RuntimeError):  # pragma: no cover - a build without device details
        name = gpu.name
    memory = None
    try:
        limits = [c.memory_limit for c in tf.config.get_logical_device_configuration(gpu) or ()]
        memory = int(limits[0]) * 2**20 if limits and limits[0] else None
    except (ValueError, RuntimeError, AttributeError):  # pragma: no cover
        memory = None
    if memory is None:
        try:
            from tflms._compat.tf import local_device_protos  # noqa: PLC0415 - the allocator's limit per device
            local = [d for d in local_device_protos() if d.device_type == "GPU"]
            memory = int(local[0].memory_limit) if local and local[0].memory_limit else None
        except Exception:  # noqa: BLE001 - best effort: the name still gives the family and often the memory
            memory = None
    return name, memory


def reset_gpu_peaks() -> tuple[str, ...]:
    """Reset TensorFlow's peak-memory statistic of every local GPU; returns their names (``GPU:0``, ...; empty: no
    GPU, or none whose statistics TensorFlow keeps). :func:`gpu_peaks` reads them after a step."""
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover
        return ()
    names = []
    for index, _ in enumerate(tf.config.list_logical_devices("GPU")):
        try:
            tf.config.experimental.reset_memory_stats(f"GPU:{index}")
        except (ValueError, RuntimeError):  # a GPU whose allocator keeps no statistics: not measured
            continue
        names.append(f"GPU:{index}")
    return tuple(names)


def gpu_peaks(devices: tuple[str, ...]) -> dict[str, int]:
    """The most bytes TensorFlow's allocator held on each of ``devices`` since :func:`reset_gpu_peaks`
    (``tf.config.experimental.get_memory_info(device)["peak"]``)."""
    import tensorflow as tf
    return {device: int(tf.config.experimental.get_memory_info(device)["peak"]) for device in devices}


#: What :func:`onednn_kernels` declared, innermost last (empty: this process's TensorFlow decides).
_DECLARED_ONEDNN: list[bool] = []


@contextlib.contextmanager
def onednn_kernels(enabled: bool) -> Iterator[None]:
    """Plan for a machine whose CPU ops run oneDNN's kernels (``enabled``) or not, whatever this process runs.

    For a step that another process will run with its own setting: the emulated
    accelerator of :mod:`tflms.measure` always runs oneDNN's kernels (``EMULATION_ENV``),
    also where this process's TensorFlow has them off (by default on AMD CPUs), and the
    swap rules that depend on them (oneDNN's workspace edges) must follow the machine
    that runs the step.
    """
    _DECLARED_ONEDNN.append(bool(enabled))
    try:
        yield
    finally:
        _DECLARED_ONEDNN.pop()


def runs_onednn_cpu_kernels(device: str) -> bool:
    """Whether an op placed on ``device`` runs oneDNN's CPU kernels (after oneDNN's graph pass).

    ``device`` is an op's device string; ``""`` (unplaced) means the first GPU,
    else the CPU, as TensorFlow's placer does for a function's ops. Whether oneDNN is
    on is this process's TensorFlow's setting unless :func:`onednn_kernels` declares it.
    """
    return _runs_onednn_cpu_kernels(device, _DECLARED_ONEDNN[-1] if _DECLARED_ONEDNN else None)


@functools.lru_cache(maxsize=None)
def _runs_onednn_cpu_kernels(device: str, declared: bool | None) -> bool:
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover
        return False
    from tflms._compat.tf import onednn_enabled
    if not (onednn_enabled() if declared is None else declared):
        return False
    if not device:
        return not tf.config.list_logical_devices("GPU")
    kind = re.search(r"(?:^|[/:])(CPU|GPU|TPU|XLA_CPU|XLA_GPU):\d+$", device, re.IGNORECASE)
    return kind is not None and kind.group(1).upper() == "CPU"
