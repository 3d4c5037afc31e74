"""``tflms.function``: a drop-in for ``tf.function`` that swaps activations.

On the first call per input signature the step is traced (as ``tf.function``
would), analyzed and rewritten; the rewritten function then runs on the same
variables. A new signature retraces, exactly as with ``tf.function``.

Under ``tf.distribute`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``)
wrap the step that calls ``strategy.run`` and ``strategy.reduce``, as with
``tf.function``: every local replica's part of the traced graph is rewritten,
and each replica's swaps run on that replica's host (:mod:`tflms.distribute`).
Two things fail with an error naming the fix, where TensorFlow would fail
obscurely or run one trace per replica thread:

- :class:`VariableCreationError`: variables created by the first call that
  TensorFlow cannot initialize outside the function (under a strategy: any
  variable created inside ``strategy.run``, such as optimizer slots or a model
  built by its first call). Plain ``tf.function`` fails on that step too (``You
  must feed a value for placeholder tensor 'cond/else/_1/cond/Placeholder_1'``,
  from its ``fn_with_cond`` fallback);
- :class:`DistributeError`: calling a ``tflms.function`` eagerly inside
  ``strategy.run`` (replica context).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any, Callable

from tflms.config import LMSConfig
from tflms.distribute import Placement, place_swaps
from tflms.errors import DeviceError, DistributeError, VariableCreationError
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
    placement: Placement  # where each replica's swap ops run


def rewrite_concrete(concrete, config: LMSConfig):
    """Rewrite one traced step and build the ``ConcreteFunction`` that runs in its place.

    Returns ``(rewritten, report, placement)``. Shared by :class:`LMSFunction`
    and the Keras callback.
    """
    from tflms.ir import preoptimize
    from tflms.tune.tuner import rewrite_for
    step = preoptimize.preoptimize(concrete)  # LOAD: grappler first (docs/design.md, "Bitwise under grappler")
    result = rewrite_for(step, config)
    graph, placement = place_swaps(result.graph, result.report.plan)
    rewritten = tf_io.to_concrete_function(graph, step, extra_control_outputs=result.report.inserted_ops)
    return preoptimize.run_preoptimized(rewritten, step), result.report, placement  # BUILD: grappler off


def _created_distributed_variables(tf_function) -> bool:
    """Whether the first trace of ``tf_function`` created variables of a strategy (best effort)."""
    import tensorflow as tf
    created = getattr(tf_function, "_created_variables", None) or ()  # private: weakrefs to the variables
    variables = [ref() for ref in created] if all(callable(r) for r in created) else []
    # Under a strategy these are the per-replica components; their container is the MirroredVariable.
    containers = [getattr(v, "_distributed_container", lambda: None)() for v in variables if v is not None]
    return any(isinstance(v, tf.distribute.DistributedValues) for v in variables + containers)


def variable_creation_error(name: str, err: Exception, distributed: bool) -> VariableCreationError:
    """The error for a first call whose variables TensorFlow cannot initialize outside the function."""
    cause = str(err).splitlines()[0] if str(err) else type(err).__name__
    if distributed:
        why = ("Under a tf.distribute strategy this happens to variables created inside strategy.run (optimizer "
               "slots created by the first apply_gradients, layers built by their first call): the copies on the "
               "other replicas are initialized from the first replica's value inside the function. Plain "
               "tf.function fails on the same step (\"You must feed a value for placeholder tensor "
               "'cond/else/_1/cond/Placeholder_1'\" from its fn_with_cond fallback). ")
    else:
        why = ("tf.function would fall back to initializing them with a tf.cond inside every call (fn_with_cond), a "
               "graph in which the step is an opaque function call that tflms cannot rewrite. ")
    return VariableCreationError(
        f"tflms.function: {name!r} creates variables on its first call and TensorFlow cannot initialize them "
        f"outside the function ({cause}). {why}Create every variable before the first call (under "
        "strategy.scope() when there is a strategy): build the model (keras.Input(...) or model.build(shape)) and "
        "the optimizer (optimizer.build(model.trainable_variables))")


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
        self._failed: VariableCreationError | None = None
        functools.update_wrapper(self, fn)
        check_devices_exist(config)

    def _concrete(self, *args: Any, **kwargs: Any):
        """``get_concrete_function``, with the first call's variable initialization checked."""
        if self._failed is not None:  # the tf.function's variables were created but never initialized
            raise self._failed
        try:
            from tensorflow.python.ops.op_selector import UnliftableError
        except ImportError:  # pragma: no cover - a TF that moved it
            UnliftableError = ()  # noqa: N806
        try:
            return self.original_function.get_concrete_function(*args, **kwargs)
        except UnliftableError as err:
            name = getattr(self, "__name__", "step")
            self._failed = variable_creation_error(name, err, _created_distributed_variables(self.original_function))
            raise self._failed from err

    def _trace(self, *args: Any, **kwargs: Any) -> _Traced:
        concrete = self._concrete(*args, **kwargs)
        traced = self._traced.get(id(concrete))
        if traced is None or traced.original is not concrete:
            rewritten, report, placement = rewrite_concrete(concrete, self.config)
            traced = _Traced(concrete, rewritten, report, placement)
            self._traced[id(concrete)] = traced
            logger.info("tflms: rewrote %s: %d tensors swapped (%d bytes)", concrete.graph.name,
                        report.num_swapped, report.swapped_bytes)
        self._last = traced
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _check_not_in_replica_context(getattr(self, "__name__", "step"))
        return self._trace(*args, **kwargs).rewritten(*args, **kwargs)

    def get_concrete_function(self, *args: Any, **kwargs: Any):
        """The rewritten ``ConcreteFunction`` for these arguments."""
        return self._trace(*args, **kwargs).rewritten

    @property
    def report(self) -> RewriteReport | None:
        """The report of the most recently used signature (``None`` before the first call)."""
        return None if self._last is None else self._last.report

    @property
    def placement(self) -> Placement | None:
        """Where the swap ops of the most recently used signature run (per replica under a strategy)."""
        return None if self._last is None else self._last.placement

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
            bound._failed = None
            functools.update_wrapper(bound, self.__wrapped__)
            self._bound[instance] = bound
        return bound


def _check_not_in_replica_context(name: str) -> None:
    """Refuse an eager call from inside ``strategy.run`` (each replica thread would trace its own copy)."""
    import tensorflow as tf
    if tf.executing_eagerly() and tf.distribute.has_strategy() and tf.distribute.get_replica_context() is not None:
        strategy = type(tf.distribute.get_strategy()).__name__
        raise DistributeError(
            f"tflms.function {name!r} is called inside {strategy}.run: each replica would trace and rewrite its own "
            "copy of the step in its own thread. Wrap the function that calls strategy.run instead: "
            "tflms.function(lambda x, y: strategy.reduce('SUM', strategy.run(step_fn, args=(x, y)), axis=None))")


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
