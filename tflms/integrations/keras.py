"""``tflms.keras.LMS``: a Keras callback that trains ``model.fit`` with swapping (Keras 3, and tf_keras).

::

    import tflms.keras
    model.fit(x, y, callbacks=[tflms.keras.LMS()])                 # the default: tuned for the accelerator's memory
    model.fit(x, y, callbacks=[tflms.keras.LMS(swapout_threshold=8, swapin_ahead=2)])
    lms = tflms.keras.LMS(budget="12GiB", profile="v100-16gb-pcie3")  # let the tuner choose
    model.fit(x, y, callbacks=[lms]); print(lms.report.table())

How it hooks into Keras 3 (TensorFlow backend, ``keras/src/backend/tensorflow/trainer.py``):
``fit`` calls ``make_train_function()`` and then ``callbacks.on_train_begin()``.
``make_train_function`` stores in ``model.train_function`` a plain Python
function built by ``TensorFlowTrainer._make_function``; it closes over
``one_step_on_data``, the ``tf.function`` that is the real step (forward,
backward, optimizer update; wrapped by ``_autoconvert_optionals``), and over
``multi_step_on_iterator``, an outer ``tf.function`` that pulls batches from the
iterator and calls the step (in a ``tf.while_loop`` when ``steps_per_execution``
> 1). In ``on_train_begin`` this callback finds ``one_step_on_data`` in that
closure and replaces ``model.train_function`` by a function that

- pulls each batch from the iterator eagerly (``get_next_as_optional``, at most
  ``steps_per_execution`` of them per call, as Keras's loop does);
- traces ``one_step_on_data`` as Keras does, for the iterator's ``element_spec``
  (``get_concrete_function``; Keras calls the step on the symbolic output of
  ``get_next``, so a short last batch shares the trace), rewrites each trace once
  (:func:`tflms.pipeline.rewrite_step`) and calls the rewritten
  ``ConcreteFunction`` directly from Python.

The rewritten step is never called from inside another ``tf.function``: there it
would be inlined into the caller and optimized together with it, so whether the
swaps survive would depend on what grappler does to the caller (a quick test lost
them; ``_noinline`` keeps the function whole but hides its optimized graph from
run metadata, so survival could not be checked). Called from Python it is
optimized as a function of its own, whose control outputs (the swap ops) grappler
must keep: the same path :func:`tflms.function` uses, and ``tests/test_keras.py``
reads the graphs TensorFlow ran during ``fit`` to check every swap op is there.
The price is one Python round trip per step instead of one per
``steps_per_execution`` steps (about 1 ms per step on a CPU), small next to the
step of a model that needs swapping.

``on_train_end`` puts Keras's own train function back, so ``evaluate``,
``predict``, a later ``fit`` without the callback, and saving see an untouched
model (only ``model.train_function`` is ever replaced; ``test_function`` and
``predict_function`` are not touched, so validation is not rewritten). Traces are
kept by the callback: a second ``fit`` with the same callback and batch shapes
reuses them; a new signature is traced and rewritten once more; a trace with an
unknown batch dimension is sized by the first batch it runs on and rewritten
again, once, if a larger batch comes (a later ``fit`` with a larger batch size).
A ``compile()`` makes Keras build a new step, which gets its own rewrites.

Distribution: under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy``
(model built and compiled under ``strategy.scope()``) Keras's step calls
``strategy.run`` and reduces the replicas' outputs; it is traced for the
distributed iterator's ``element_spec`` (per-replica specs), every local
replica's part of it is rewritten, and each replica's swaps run on the host of
that replica's own task (:mod:`tflms.passes.place`). Training is bitwise identical
to ``fit`` without the callback under the same strategy (``tests/test_distribute.py``).
Two Keras 3.15 limits are Keras's, not the callback's: under
``MultiWorkerMirroredStrategy`` Keras's own ``fit`` fails with or without LMS
(``_maybe_symbolic_build`` hands a whole ``(x, y)`` batch to ``strategy.reduce``;
``reduce_per_replica`` reduces the scalar loss with ``axis=0``), and under
``MirroredStrategy`` its multi-step loop (``steps_per_execution`` > 1) fails on
its first call, where LMS, which runs one step per Python call, trains.

XLA (issue 47): a Keras 3 model compiled with XLA (``jit_compile=True``, or Keras's default ``"auto"``, which
chooses XLA where a GPU is present and no strategy is set) keeps it. XLA compiles a ``jit_compile`` step as one
cluster and would compile the swap ops away, so the fits this callback manages run a train function Keras builds
with ``jit_compile=False``, and the rewrite marks the step's compute ops for XLA in clusters between the copies
(:mod:`tflms.passes.xla_clusters`; ``report.xla_clusters`` says how many); Keras's XLA train function is put back
after them. Under another strategy (where Keras's ``"auto"`` never chooses XLA) LMS does not keep XLA: an explicit
``jit_compile=True`` there is refused, and a Keras that chose XLA there would train without it, with a warning
that says what it costs.

Not handled, and said so: ``jit_compile=True`` under a strategy (see above) and distribution strategies other than
the default, ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` (not tested with tflms:
``OneDeviceStrategy``, ``CentralStorageStrategy``, ``TPUStrategy``, whose steps
XLA compiles, and ``ParameterServerStrategy``, whose steps a coordinator
schedules on remote workers) raise :class:`UnsupportedModelError` before the
first step; a train function that
is not the one Keras builds (``make_train_function`` overridden, another backend,
a Keras whose trainer has changed) raises it too; ``run_eagerly=True`` has no
graph to rewrite, so the callback warns and stands aside.

tf_keras (Keras 2, ``import tf_keras`` or ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``):
the same class is a tf_keras callback too. ``on_train_begin`` reads the model's
flavour (:mod:`tflms._compat.flavour`); for a tf_keras model the step is found
by :mod:`tflms.integrations.tf_keras` (tf_keras's trainer has no step
``tf.function`` of its own) and everything after that is the path above, but for
the end of the data: there tf_keras's own train function runs, as without LMS
(see :class:`_LMSTrainFunction`). tf_keras has no ``jit_compile="auto"``: its
default is no XLA, and ``jit_compile=True`` is refused.

This module is the callback: its hooks, the XLA switch around its fits, and its reports. The step it runs and the
train function that calls it are :mod:`tflms.integrations.keras_step`; which models it takes and where it finds
their step, :mod:`tflms.integrations.keras_support`. Their names stay importable from here.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

import keras

from tflms._compat.flavour import TF_KERAS, keras_flavour
from tflms.config import LMSConfig, option_names
from tflms.passes.place import Placement
from tflms.errors import UnsupportedModelError
from tflms.integrations import tf_keras as tf_keras_integration
from tflms.integrations.function import check_devices_exist
from tflms.integrations.progress import SILENT, SUMMARY, check_verbose, summary_line
from tflms.integrations.progress import default_print as _print
from tflms.report import RewriteReport
# the step the callback runs, and what it supports: the names stay importable from here
from tflms.integrations.keras_step import (_describe_inputs, _input_specs, _leading_dim,  # noqa: F401
                                           _LMSTrainFunction, _needs_resizing, _none_for_optionals,
                                           _RewrittenStep, _steps_per_execution, _Trace)
from tflms.integrations.keras_support import (_KERAS_STEP_NAME, _KERAS_TRAIN_FUNCTION_QUALNAME,  # noqa: F401
                                              _KERAS_TRAINER_MODULE, _auto_chooses_xla, _is_default_strategy,
                                              _keras_step, _supported_strategy)

_OPTION_NAMES = frozenset(option_names())
logger = logging.getLogger(__name__)

__all__ = ["LMS", "UnsupportedModelError"]


class LMS(keras.callbacks.Callback, tf_keras_integration.TfKerasCallbackHooks):
    """Train with tflms swapping: rewrites the training step of ``model.fit`` (see the module doc).

    One class for both Keras flavours: a Keras 3 model's ``fit`` and a tf_keras
    (Keras 2) model's ``fit`` take it alike.

    Args:
      budget: accelerator memory budget (``"12GiB"`` or bytes); the tuner fits the step in it
        (with ``profile``'s costs if given). Without it and without a rule parameter: the
        accelerator's own memory.
      verbose: 0 silent; 1 a progress bar while the tuner simulates candidates
        (with a budget or profile), then one summary line per traced signature:
        what was swapped, the predicted peak before -> after and the step-time
        overhead (when tuned), and the hardware profile; 2 one line per tuner
        candidate (parameters, predicted peak, step time), the summary and the
        report's table per trace.
      config: a base :class:`~tflms.LMSConfig`; the keyword arguments below override it.

    The keyword arguments are :class:`~tflms.LMSConfig`'s fields (docs/guide.md, "Parameter
    reference"); ``None``, their default here, means "not given": ``config``'s value, or
    LMSConfig's default. A misspelt name is refused with the closest parameter's name.

      swapout_threshold / swapin_ahead / swapin_groupby / sync_mode: the TFLMS rule
        parameters (levels; sync 0-3). Giving any selects the TFLMS rules instead of tuning.
      include_types / exclude_types: only / never swap outputs of these op types.
      include_scopes / exclude_scopes: only / never swap outputs of ops under these name scopes.
      min_swap_bytes: never swap smaller tensors (bytes or ``"1MiB"``; default 0).
      host_device: where swapped tensors wait (default ``"/device:CPU:0"``).
      accelerator_device: where swap-ins go (default: the first GPU).
      batch_size: the size of an unknown leading dimension.
      profile: the hardware profile to simulate (``tflms.profiles.profile_names()``).
      fit_by: ``"live"`` (default) or ``"bfc"``: how the tuner judges that a step fits.
      compress: ``"zvc"``, ``"auto"`` or a lossy codec (``"fp16"``, ``"bf16"``, ``"int8"``).
      enforce_order: pin a memory-aware order (default: when tuning).
      recompute: ``"auto"`` (default: swap or recompute per tensor), ``"off"`` (swap only) or ``"only"``.
      tf32: price float32 contractions at TF32 (``True``) or FP32 (``False``); default: as TensorFlow runs them.
      plan_cache: reuse tuned plans from disk (issue 48): ``False`` off, a directory, or the default cache dir.

    Attributes:
      config: the :class:`~tflms.LMSConfig` in use.
      report: the :class:`~tflms.report.RewriteReport` of the step that
        ran last (``None`` before the first step).
      placement: the :class:`~tflms.passes.place.Placement` of that step's swap
        ops (which replica device swaps to which host).
      reports: every report, one per traced signature, in trace order.

    XLA: a Keras 3 model compiled with XLA (``jit_compile=True``, or ``"auto"`` on a
    machine with a GPU) keeps it under the default strategy: its step runs as XLA
    clusters between the copies (issue 47; ``report.xla_clusters``).

    Raises:
      UnsupportedModelError: in ``on_train_begin``, for a model compiled with an
        explicit ``jit_compile=True`` under a distribution strategy,
        trained under a distribution strategy other than
        ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``, or whose train
        function is not the one Keras builds.
    """

    def __init__(self, budget: int | str | None = None, verbose: int = SUMMARY, *, config: LMSConfig | None = None,
                 swapout_threshold: int | None = None, swapin_ahead: int | None = None,
                 swapin_groupby: int | None = None, sync_mode: int | None = None,
                 include_types: Sequence[str] | None = None, exclude_types: Sequence[str] | None = None,
                 include_scopes: Sequence[str] | None = None, exclude_scopes: Sequence[str] | None = None,
                 min_swap_bytes: int | str | None = None, host_device: str | None = None,
                 accelerator_device: str | None = None, batch_size: int | None = None, profile: str | None = None,
                 fit_by: str | None = None, compress: str | None = None, enforce_order: bool | None = None,
                 recompute: str | None = None, tf32: bool | None = None,
                 plan_cache: bool | str | None = None,  # plan cache option (issue 48): an LMSConfig field
                 **misspelt: Any):
        super().__init__()
        options = {name: value for name, value in locals().items() if name in _OPTION_NAMES}
        self.config = LMSConfig.from_options(config, options, misspelt)
        check_devices_exist(self.config)
        self.verbose = check_verbose(verbose)
        self._steps: dict[int, _RewrittenStep] = {}  # by id of Keras's one_step_on_data tf.function
        self._order: list[_Trace] = []
        self._last_step: _RewrittenStep | None = None
        self._installed: _LMSTrainFunction | None = None
        #: Keras's XLA train functions and the ones rebuilt without XLA: id(xla) -> (xla, rebuilt)
        self._without_xla: dict[int, tuple[Any, Any]] = {}
        self._xla_restore: tuple[Any, Any] | None = None  # (model, its XLA train function) to put back
        self._xla_said = False
        #: tf_keras train functions and the one-step tf.function made of each: id(keras) -> (keras, step)
        self._tf_keras_steps: dict[int, tuple[Any, Any]] = {}

    # ------------------------------------------------------------------ reports
    @property
    def report(self) -> RewriteReport | None:
        """The report of the trace that ran last (``None`` before the first step)."""
        step = self._last_step
        return None if step is None or step.last is None else step.last.report

    @property
    def placement(self) -> Placement | None:
        """Where the swap ops of the trace that ran last run (per replica under a strategy)."""
        step = self._last_step
        return None if step is None or step.last is None else step.last.placement

    @property
    def reports(self) -> list[RewriteReport]:
        """One report per traced signature, in trace order (over every ``fit`` this callback was in)."""
        return [t.report for t in self._order]

    # ------------------------------------------------------------ Keras hooks
    def on_train_begin(self, logs=None):
        model = self.model
        current = model.train_function
        if isinstance(current, _LMSTrainFunction):
            if current.owner is not self:
                raise UnsupportedModelError(
                    f"tflms.keras.LMS: model {model.name!r} is already trained through another LMS callback; pass "
                    "only one (if an earlier fit with another LMS callback was interrupted, call "
                    "model.make_train_function(force=True) first)")
            current = current.keras_function  # an earlier fit with this callback ended without on_train_end
        self._check_supported(model)
        if model.run_eagerly:
            warnings.warn(f"tflms.keras.LMS: model {model.name!r} runs eagerly (run_eagerly=True): there is no "
                          "graph to rewrite, so LMS stands aside and this fit runs without swapping", stacklevel=2)
            self._installed = None
            return
        keep_xla = self._keeps_xla(model)
        if keras_flavour(model) == TF_KERAS:
            keras_step = self._tf_keras_step(model, current)
        else:
            current = self._xla_off(model, current, warn=not keep_xla)
            keras_step = _keras_step(model, current)
        if getattr(keras_step, "_jit_compile", False):
            raise self._jit_error(model)
        step = self._steps.get(id(keras_step))
        if step is None or step.tf_function is not keras_step or step.xla != keep_xla:
            step = _RewrittenStep(keras_step, self.config, self._on_trace, self.verbose, xla=keep_xla)
            self._steps[id(keras_step)] = step
        self._installed = _LMSTrainFunction(self, model, current, step, tf_keras=keras_flavour(model) == TF_KERAS)
        model.train_function = self._installed
        self._last_step = step

    def on_train_end(self, logs=None):
        self._restore()

    def _restore(self) -> None:
        installed, self._installed = self._installed, None
        xla, self._xla_restore = self._xla_restore, None
        if installed is not None and installed.model.train_function is installed:
            installed.model.train_function = installed.keras_function if xla is None else xla[1]

    def _tf_keras_step(self, model, current):
        """The one-step tf.function made of tf_keras's train function ``current`` (made once per train function)."""
        entry = self._tf_keras_steps.get(id(current))
        if entry is None or entry[0] is not current:
            entry = (current, tf_keras_integration.train_step_function(model, current))
            self._tf_keras_steps[id(current)] = entry
        return entry[1]

    @staticmethod
    def _keeps_xla(model) -> bool:
        """Whether this fit keeps the model's XLA as clusters between the copies (issue 47): a Keras 3 model
        compiled with XLA (``jit_compile=True``, or ``"auto"`` on a GPU) under the default strategy. Under
        another strategy the step runs without XLA (a replica's step holds collectives, and clusters across
        replicas are untested)."""
        return (keras_flavour(model) != TF_KERAS and bool(getattr(model, "jit_compile", False))
                and not model.run_eagerly and _is_default_strategy(model.distribute_strategy))

    def _xla_off(self, model, current, *, warn: bool = True):
        """Keras's train function built without XLA, for a model compiled with it.

        XLA compiles a ``jit_compile`` step as one cluster and would compile the
        swap ops away. The fits this callback manages run a train function Keras
        builds with ``jit_compile=False`` (built once per XLA train function);
        ``on_train_end`` puts the XLA one back, and ``model.jit_compile`` is left
        as it was. Under the default strategy the rewrite then keeps XLA in
        clusters between the copies (:meth:`_keeps_xla`, ``warn=False``); otherwise
        the fit trains without XLA, said once per callback with what it costs
        (``warn=True``).
        """
        if model.run_eagerly or not getattr(model, "jit_compile", False):
            return current
        for xla, rebuilt in self._without_xla.values():
            if current is rebuilt:  # an interrupted fit left the rebuilt one in place
                current = xla
        entry = self._without_xla.get(id(current))
        if entry is None or entry[0] is not current:
            try:
                model.jit_compile = False
                model.make_train_function(force=True)
                entry = (current, model.train_function)
            finally:
                model.jit_compile = True
                model.train_function = current
            self._without_xla[id(current)] = entry
        self._xla_restore = (model, current)
        if warn and not self._xla_said:
            self._xla_said = True
            warnings.warn(
                f"tflms.keras.LMS: model {model.name!r} is compiled with jit_compile='auto' (Keras's default), which "
                "turns XLA on when a GPU is present (Keras records no difference from an explicit True). LMS keeps "
                "XLA, in clusters between its copies, for a Keras 3 model under the default strategy; this one trains "
                f"under {type(model.distribute_strategy).__name__}. XLA compiles the step as one cluster and would "
                "ignore the swap ops, so the fits LMS manages train without XLA; "
                "it is back on after them (evaluate, predict and fits without LMS keep it). The cost is XLA's "
                "kernel fusion: once the step is traced, a second warning gives its predicted slowdown on the profile "
                "(the report's 'without XLA' line). Compile with jit_compile=False to train without XLA and silence "
                "these warnings", stacklevel=3)
        return entry[1]

    # ----------------------------------------------------------------- checks
    @staticmethod
    def _jit_error(model) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"tflms.keras.LMS: model {model.name!r} is compiled with jit_compile=True and trains under "
            f"{type(model.distribute_strategy).__name__}, where LMS does not keep XLA in clusters between its copies "
            "(it does under the default strategy); on this machine Keras's default 'auto' would not choose XLA, so "
            "it was asked for explicitly: XLA compiles the whole step as one cluster, so swap ops would be ignored. "
            "Compile with model.compile(..., jit_compile=False) (or leave the default, which LMS turns off for its "
            "fits)")

    def _check_supported(self, model) -> None:
        if keras_flavour(model) == TF_KERAS:
            tf_keras_integration.check_supported(model)
        elif keras.backend.backend() != "tensorflow":
            raise UnsupportedModelError(f"tflms.keras.LMS rewrites TensorFlow graphs; the Keras backend is "
                                        f"{keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow")
        if (getattr(model, "jit_compile", False) and not model.run_eagerly and not _auto_chooses_xla(model)
                and not self._keeps_xla(model)):
            raise self._jit_error(model)
        strategy = model.distribute_strategy
        if not _supported_strategy(strategy):
            raise UnsupportedModelError(
                f"tflms.keras.LMS: model {model.name!r} trains under {type(strategy).__name__}; this strategy is not "
                "supported (LMS supports the default strategy, MirroredStrategy and MultiWorkerMirroredStrategy; "
                "TPUStrategy compiles the step with XLA, ParameterServerStrategy runs it on remote workers, the others "
                "are untested). Use MirroredStrategy (one machine) or MultiWorkerMirroredStrategy (several), or "
                "tflms.function in a custom loop")

    # ----------------------------------------------------------------- output
    def _on_trace(self, trace: _Trace, step: _RewrittenStep) -> None:
        self._order.append(trace)
        self._last_step = step
        report = trace.report
        if self._xla_restore is not None and report.xla_text() and not report.xla_clusters:  # runs without XLA
            warnings.warn(f"tflms.keras.LMS: {report.xla_text()}. LMS keeps XLA (clusters between its copies) under "
                          "the default strategy only; here, a step that fits without tflms trains faster with XLA and "
                          "without LMS", stacklevel=2)
        logger.info("tflms.keras: rewrote %s for %s: %d tensors swapped (%d bytes)", trace.original.name,
                    _describe_inputs(trace.original), report.num_swapped, report.swapped_bytes)
        if self.verbose == SILENT:
            return
        line = self._summary_line(trace)
        text = line if self.verbose == SUMMARY else line + "\n" + report.table()
        _print(text)

    @staticmethod
    def _summary_line(trace: _Trace) -> str:
        sized = "" if trace.sized_batch is None else f", sized for batch {trace.sized_batch}"
        return summary_line("tflms.keras.LMS", trace.report,
                            f"training step for inputs {_describe_inputs(trace.original)}{sized}")
