"""``tflms.function``: a drop-in for ``tf.function`` that swaps activations.

On the first call per input signature the step is traced (as ``tf.function``
would), analyzed and rewritten; the rewritten function then runs on the same
variables. A new signature retraces, exactly as with ``tf.function``.

Under ``tf.distribute`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``)
wrap the step that calls ``strategy.run`` and ``strategy.reduce``, as with
``tf.function``: every local replica's part of the traced graph is rewritten,
and each replica's swaps run on that replica's host (:mod:`tflms.passes.place`).
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
from typing import Any, Callable, Sequence

from tflms.config import LMSConfig, option_names
from tflms.passes.place import Placement
from tflms.errors import DeviceError, DistributeError, VariableCreationError
from tflms.integrations.progress import SILENT, SUMMARY, check_verbose, summary_line, tuner_progress
from tflms.report import RewriteReport

_OPTION_NAMES = frozenset(option_names())
logger = logging.getLogger(__name__)

#: ``tf.function``'s experimental keyword arguments, passed through (its others are named parameters).
TF_FUNCTION_OPTIONS = frozenset({"experimental_implements", "experimental_autograph_options",
                                 "experimental_attributes", "experimental_relax_shapes",
                                 "experimental_compile", "experimental_follow_type_hints"})






@dataclasses.dataclass(frozen=True)
class _Traced:
    original: Any  # the ConcreteFunction tf.function traced
    rewritten: Any  # the ConcreteFunction that runs
    report: RewriteReport
    placement: Placement  # where each replica's swap ops run


def rewrite_concrete(concrete, config: LMSConfig, example_inputs=None, progress=None, xla: bool = False):
    """Rewrite one traced step with :func:`tflms.pipeline.rewrite_step`; returns ``(rewritten, report, placement)``.

    Shared by :class:`LMSFunction` and the Keras callback. ``xla``: keep XLA, in clusters between the copies
    (issue 47; ``concrete`` was traced without ``jit_compile``).
    """
    from tflms.pipeline import rewrite_step
    result = rewrite_step(concrete, config, example_inputs=example_inputs, progress=progress, xla=xla)
    return result.function, result.report, result.placement


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

    def __init__(self, fn: Callable, config: LMSConfig, tf_function_options: dict[str, Any], verbose: int = SILENT,
                 xla: bool = False):
        import tensorflow as tf
        self.config = config
        self.verbose = check_verbose(verbose)
        self.xla = xla  # jit_compile=True: traced without it, rewritten with XLA clusters between the copies
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
        from tflms._compat.tf import unliftable_error
        UnliftableError = unliftable_error()  # noqa: N806
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
            name = getattr(self, "__name__", "step")
            tuning = self.verbose if self.config.auto_tune else SILENT
            with tuner_progress(tuning, f"tflms.function {name!r}", say=print) as progress:
                rewritten, report, placement = rewrite_concrete(concrete, self.config, example_inputs=args,
                                                                progress=progress, xla=self.xla)
            traced = _Traced(concrete, rewritten, report, placement)
            self._traced[id(concrete)] = traced
            logger.info("tflms: rewrote %s: %d tensors swapped (%d bytes)", concrete.graph.name,
                        report.num_swapped, report.swapped_bytes)
            if self.verbose != SILENT:
                text = summary_line(f"tflms.function {name!r}", report, f"rewrote the trace for {_describe(concrete)}")
                print(text if self.verbose == SUMMARY else text + "\n" + report.table())
        self._last = traced
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _check_not_in_replica_context(getattr(self, "__name__", "step"))
        traced = self._trace(*args, **kwargs)
        # the first call of a trace measures its peak on a GPU (RewriteReport.measured), the rest just run
        return traced.report.measured.around(lambda: traced.rewritten(*args, **kwargs))

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
            bound.verbose = self.verbose
            bound.xla = self.xla
            bound.original_function = self.original_function.__get__(instance, owner)
            bound._traced, bound._last, bound._bound = {}, None, weakref.WeakKeyDictionary()
            bound._failed = None
            functools.update_wrapper(bound, self.__wrapped__)
            self._bound[instance] = bound
        return bound


def _describe(concrete) -> str:
    """The trace's input shapes and dtypes, e.g. ``(None, 8) float32, (None,) int32``."""
    import tensorflow as tf
    specs = [s for s in tf.nest.flatten(concrete.structured_input_signature, expand_composites=True)
             if isinstance(s, tf.TensorSpec)]
    return "inputs " + ", ".join(f"{tuple(s.shape.as_list())} {s.dtype.name}" for s in specs) if specs else "no inputs"


def _check_not_in_replica_context(name: str) -> None:
    """Refuse an eager call from inside ``strategy.run`` (each replica thread would trace its own copy)."""
    import tensorflow as tf
    if tf.executing_eagerly() and tf.distribute.has_strategy() and tf.distribute.get_replica_context() is not None:
        strategy = type(tf.distribute.get_strategy()).__name__
        raise DistributeError(
            f"tflms.function {name!r} is called inside {strategy}.run: each replica would trace and rewrite its own "
            "copy of the step in its own thread. Wrap the function that calls strategy.run instead: "
            "tflms.function(lambda x, y: strategy.reduce('SUM', strategy.run(step_fn, args=(x, y)), axis=None))")


def function(fn: Callable | None = None, *, config: LMSConfig | None = None, verbose: int = SILENT,
             budget: int | str | None = None, swapout_threshold: int | None = None, swapin_ahead: int | None = None,
             swapin_groupby: int | None = None, sync_mode: int | None = None,
             include_types: Sequence[str] | None = None, exclude_types: Sequence[str] | None = None,
             include_scopes: Sequence[str] | None = None, exclude_scopes: Sequence[str] | None = None,
             min_swap_bytes: int | str | None = None, host_device: str | None = None,
             accelerator_device: str | None = None, batch_size: int | None = None, profile: str | None = None,
             fit_by: str | None = None, compress: str | None = None, enforce_order: bool | None = None,
             recompute: str | None = None, tf32: bool | None = None, plan_cache: bool | str | None = None,
             input_signature: Sequence[Any] | None = None, autograph: bool = True, jit_compile: bool | None = None,
             reduce_retracing: bool = False, **tf_function_options: Any):
    """``tf.function`` with tflms swapping.

    Usable as ``@tflms.function``, ``@tflms.function(swapout_threshold=4)`` or
    ``tflms.function(step, config=cfg)``.

    Args:
      fn: the step (``None`` when used as ``@tflms.function(...)``).
      config: a base :class:`~tflms.LMSConfig`; the keyword arguments below override it.
      verbose: printed to stdout when a signature is first traced and rewritten:
        ``0`` (the default: a decorator stays quiet, like ``tf.function``; the
        ``tflms`` loggers log at INFO, and warnings such as "no GPU found" still go to
        the ``tflms`` loggers); ``1`` a progress bar while the tuner simulates
        candidates (with a budget or profile), then one summary line per trace: what
        was swapped, the predicted peak before -> after and overhead (when tuned),
        and the hardware profile; ``2`` one line per tuner candidate, the summary
        and the report's table.
      budget ... plan_cache: :class:`~tflms.LMSConfig`'s fields, as ``tflms.keras.LMS``
        takes them (docs/guide.md, "Parameter reference"); ``None``, their default here,
        means "not given": ``config``'s value or LMSConfig's default. With none of the TFLMS
        rule parameters (the default), the tuner fits the step in the accelerator's memory,
        or in ``budget="12GiB"``; any rule parameter selects the TFLMS rules.
      input_signature, autograph, reduce_retracing: ``tf.function``'s own, with its defaults.
      jit_compile: ``True`` keeps XLA (issue 47): the step is traced without it (a function compiled whole would
        compile the swaps to pass-throughs, tensorflow issue 124880), rewritten, and its compute ops are marked
        for XLA in clusters between tflms's copies (:mod:`tflms.passes.xla_clusters`); the report's
        ``xla_clusters`` says how many. ``False``/``None``: as ``tf.function``.
      **tf_function_options: ``tf.function``'s experimental options
        (``experimental_attributes``, ...). Any other name is refused with the closest
        parameter's name.

    A step traced with an unknown batch dimension (an ``input_signature`` with
    ``None``) is sized by the arguments of its first call when ``batch_size`` is
    not given.
    """
    options = {name: value for name, value in locals().items() if name in _OPTION_NAMES}
    misspelt = {k: v for k, v in tf_function_options.items() if k not in TF_FUNCTION_OPTIONS}
    lms_config = LMSConfig.from_options(config, options, misspelt)
    tf_options = {k: v for k, v in tf_function_options.items() if k in TF_FUNCTION_OPTIONS}
    # jit_compile=True (or its old name experimental_compile) is kept as XLA clusters between the copies, not by
    # compiling the traced step whole
    xla = bool(jit_compile or tf_options.pop("experimental_compile", None))
    tf_options.update(autograph=autograph, jit_compile=None if xla else jit_compile, reduce_retracing=reduce_retracing)
    if input_signature is not None:
        tf_options["input_signature"] = input_signature

    check_verbose(verbose)

    def wrap(f: Callable) -> LMSFunction:
        return LMSFunction(f, lms_config, tf_options, verbose, xla=xla)

    return wrap if fn is None else wrap(fn)
