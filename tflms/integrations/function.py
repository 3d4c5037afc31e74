"""``tflms.function``: a drop-in for ``tf.function`` that swaps activations.

On the first call per input signature the step is traced (as ``tf.function``
would), analyzed and rewritten; the rewritten function then runs on the same
variables. A new signature retraces, exactly as with ``tf.function``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any, Callable

from tflms.config import LMSConfig
from tflms.errors import DeviceError
from tflms.ir import tf_io
from tflms.rewrite.report import RewriteReport

logger = logging.getLogger(__name__)

#: keyword arguments passed through to ``tf.function``.
TF_FUNCTION_OPTIONS = frozenset({"input_signature", "autograph", "jit_compile", "reduce_retracing",
                                 "experimental_implements", "experimental_autograph_options",
                                 "experimental_attributes", "experimental_relax_shapes",
                                 "experimental_compile", "experimental_follow_type_hints"})


@dataclasses.dataclass(frozen=True)
class _Traced:
    original: Any  # the ConcreteFunction tf.function traced
    rewritten: Any  # the ConcreteFunction that runs
    report: RewriteReport


def check_devices_exist(config: LMSConfig) -> None:
    """Raise :class:`DeviceError` if a configured device is not on this machine."""
    import tensorflow as tf
    available = {f"/device:{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in tf.config.list_logical_devices()}
    for field in ("host_device", "accelerator_device"):
        device = getattr(config, field)
        if device is None:
            continue
        local = "/device:" + device.rpartition("/device:")[2]
        if local not in available:
            raise DeviceError(f"{field}={device!r} does not exist here; available devices: {sorted(available)}")


class LMSFunction:
    """A ``tf.function`` whose traced graphs are rewritten by tflms (see module doc)."""

    def __init__(self, fn: Callable, config: LMSConfig, tf_function_options: dict[str, Any]):
        import tensorflow as tf
        self.config = config
        self.original_function = tf.function(fn, **tf_function_options)
        self._traced: dict[int, _Traced] = {}
        self._last: _Traced | None = None
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        functools.update_wrapper(self, fn)
        check_devices_exist(config)

    def _trace(self, *args: Any, **kwargs: Any) -> _Traced:
        concrete = self.original_function.get_concrete_function(*args, **kwargs)
        traced = self._traced.get(id(concrete))
        if traced is None or traced.original is not concrete:
            from tflms.tune.tuner import rewrite_for
            result = rewrite_for(concrete, self.config)
            rewritten = tf_io.to_concrete_function(result.graph, concrete,
                                                   extra_control_outputs=result.report.inserted_ops)
            traced = _Traced(concrete, rewritten, result.report)
            self._traced[id(concrete)] = traced
            logger.info("tflms: rewrote %s: %d tensors swapped (%d bytes)", concrete.graph.name,
                        result.report.num_swapped, result.report.swapped_bytes)
        self._last = traced
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._trace(*args, **kwargs).rewritten(*args, **kwargs)

    def get_concrete_function(self, *args: Any, **kwargs: Any):
        """The rewritten ``ConcreteFunction`` for these arguments."""
        return self._trace(*args, **kwargs).rewritten

    @property
    def report(self) -> RewriteReport | None:
        """The report of the most recently used signature (``None`` before the first call)."""
        return None if self._last is None else self._last.report

    @property
    def reports(self) -> list[RewriteReport]:
        """One report per traced signature, in trace order (for a method: of every bound instance too)."""
        return [t.report for t in self._traced.values()] + [r for b in list(self._bound.values()) for r in b.reports]

    def __get__(self, instance, owner):
        """Bind to ``instance`` like ``tf.function`` does: one traced function per instance."""
        if instance is None:
            return self
        bound = self._bound.get(instance)
        if bound is None:
            bound = LMSFunction.__new__(LMSFunction)
            bound.config = self.config
            bound.original_function = self.original_function.__get__(instance, owner)
            bound._traced, bound._last, bound._bound = {}, None, weakref.WeakKeyDictionary()
            functools.update_wrapper(bound, self.__wrapped__)
            self._bound[instance] = bound
        return bound


def function(fn: Callable | None = None, *, config: LMSConfig | None = None, **options: Any):
    """``tf.function`` with tflms swapping.

    Usable as ``@tflms.function``, ``@tflms.function(swapout_threshold=4)`` or
    ``tflms.function(step, config=cfg)``. Keyword options are
    :class:`~tflms.config.LMSConfig` fields (``budget="12GiB"`` and/or
    ``profile=...`` let the tuner choose the swap parameters), or ``tf.function``
    options (``input_signature``, ``jit_compile``, ``reduce_retracing``, ...).
    """
    tf_options = {k: v for k, v in options.items() if k in TF_FUNCTION_OPTIONS}
    lms_config = LMSConfig.from_kwargs(config, **{k: v for k, v in options.items() if k not in TF_FUNCTION_OPTIONS})

    def wrap(f: Callable) -> LMSFunction:
        return LMSFunction(f, lms_config, tf_options)

    return wrap if fn is None else wrap(fn)
