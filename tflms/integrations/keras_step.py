"""The training step :class:`tflms.keras.LMS` runs instead of Keras's, and the train function that calls it.

:class:`_RewrittenStep` traces Keras's ``one_step_on_data`` as Keras does (for the iterator's ``element_spec``),
rewrites each trace once (:func:`tflms.integrations.function.rewrite_concrete`, the pipeline), sizes a trace with an
unknown batch dimension by the batches it runs on, and calls the rewritten ``ConcreteFunction`` from Python;
:class:`_LMSTrainFunction` stands in ``model.train_function``: Keras's loop over ``steps_per_execution`` batches, in
Python. Why from Python, and what Keras does around them: the module doc of :mod:`tflms.integrations.keras`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tflms.config import LMSConfig
from tflms.passes.place import Placement
from tflms.integrations.function import rewrite_concrete
from tflms.integrations.progress import SILENT, tuner_progress
from tflms.report import RewriteReport

if TYPE_CHECKING:
    from tflms.integrations.keras import LMS

@dataclasses.dataclass(frozen=True)
class _Trace:
    original: Any  # the ConcreteFunction Keras's one_step_on_data traced
    rewritten: Any  # the ConcreteFunction that runs instead
    report: RewriteReport
    placement: Placement  # where each replica's swap ops run
    sized_batch: int | None = None  # the batch size an unknown batch dimension was sized for (None: not needed)


def _none_for_optionals(data: Any) -> Any:
    """What Keras's ``_autoconvert_optionals`` does before calling the step: ``tf.experimental.Optional`` -> None.

    Applied to a batch and to its ``element_spec`` (where an Optional is an ``OptionalSpec``).
    """
    optional = (tf.experimental.Optional, tf.OptionalSpec)
    return keras.tree.map_structure(lambda t: None if isinstance(t, optional) else t, data)


def _leading_dim(data: Any) -> int:
    """The largest leading dimension of the batch's tensors (0 if none has one; per replica when distributed)."""
    dims = [t.shape[0] for t in tf.nest.flatten(data, expand_composites=True) if hasattr(t, "shape") and t.shape.rank]
    return max([int(d) for d in dims if d is not None], default=0)


def _input_specs(concrete) -> list[tf.TensorSpec]:
    """The tensor specs of the step's inputs (a distributed step's per-replica specs give one per replica)."""
    return [s for s in tf.nest.flatten(concrete.structured_input_signature, expand_composites=True)
            if isinstance(s, tf.TensorSpec)]


def _describe_inputs(concrete) -> str:
    return ", ".join(f"{tuple(s.shape.as_list())} {s.dtype.name}" for s in _input_specs(concrete))


class _RewrittenStep:
    """Keras's ``one_step_on_data`` tf.function, run as tflms rewrites of its traces.

    A step is traced as Keras traces it: for the iterator's ``element_spec``
    (Keras calls the step inside ``multi_step_on_iterator`` on the symbolic
    output of ``get_next``), so the graph that runs is the graph Keras would have
    run, and a short last batch needs no new trace. A trace with an unknown batch
    dimension is sized (for swap planning and the tuner) by the batches it runs
    on: it is rewritten again, once, when a larger batch than it was sized for
    arrives (a later ``fit`` with a larger ``batch_size``).
    """

    def __init__(self, tf_function, config: LMSConfig, on_trace, verbose: int = SILENT, xla: bool = False):
        self.tf_function = tf_function
        self.config = config
        self.xla = xla  # keep XLA: clusters between the copies (the step was built without jit_compile)
        self.on_trace = on_trace
        self.verbose = verbose
        self.traces: dict[int, _Trace] = {}  # by id of the original ConcreteFunction (kept alive in the _Trace)
        self.last: _Trace | None = None

    def __call__(self, data: Any, element_spec: Any = None) -> Any:
        data = _none_for_optionals(data)
        signature = data if element_spec is None else _none_for_optionals(element_spec)
        concrete = self.tf_function.get_concrete_function(signature)
        trace = self.traces.get(id(concrete))
        if trace is None or trace.original is not concrete or _needs_resizing(trace, data):
            trace = self._rewrite(concrete, data)
            self.traces[id(concrete)] = trace
            self.on_trace(trace, self)
        self.last = trace
        return trace.report.measured.around(lambda: trace.rewritten(data))  # issue 48: the first step's measured peak

    def _rewrite(self, concrete, data: Any) -> _Trace:
        config = self.config
        unknown = any(s.shape.rank and s.shape[0] is None for s in _input_specs(concrete))
        sized = None
        if unknown and config.batch_size is None:
            sized = _leading_dim(data) or None
            config = config.replace(batch_size=sized)
        with tuner_progress(self.verbose if config.auto_tune else SILENT, "tflms.keras.LMS") as progress:
            rewritten, report, placement = rewrite_concrete(concrete, config, example_inputs=[data],
                                                            progress=progress, xla=self.xla)
        return _Trace(concrete, rewritten, report, placement, sized)


def _needs_resizing(trace: _Trace, data: Any) -> bool:
    return trace.sized_batch is not None and _leading_dim(data) > trace.sized_batch


class _LMSTrainFunction:
    """Stands in ``model.train_function``: Keras's loop over ``steps_per_execution`` batches, in Python.

    Mirrors ``function`` in ``TensorFlowTrainer._make_function``: at most
    ``steps_per_execution`` batches are taken from the iterator (no extra
    ``get_next``), the outputs of the last step are returned, and
    ``StopIteration`` is raised when the iterator had nothing left.

    ``tf_keras=True``: where the data ends (a dataset of unknown length ends its
    first epoch so; ``steps_per_epoch`` may ask for more than there is), tf_keras's
    own ``train_function`` is called on the exhausted iterator, as tf_keras's
    ``fit`` would have called it. Its ``next(iterator)`` in the graph raises
    ``OutOfRangeError``, also after some steps of an execution ran (fit reports no
    batch end for them), and the ops of the step that do not wait for the data run
    before it fails: the optimizer's ``iterations.assign_add`` does, so tf_keras's
    own fit counts one step more than it trained, and Adam's bias correction sees
    it in every later step. Calling tf_keras's function there makes the fit with
    LMS do what the fit without it does (tf_keras's step is then traced once more,
    with no swaps; it trains nothing).
    """

    def __init__(self, owner: "LMS", model, keras_function, step: _RewrittenStep, *, tf_keras: bool = False):
        self.owner, self.model, self.keras_function, self.step = owner, model, keras_function, step
        self.tf_keras = tf_keras

    def __call__(self, iterator):
        steps = _steps_per_execution(self.model)
        outputs = None
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            for _ in range(steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    if self.tf_keras:
                        return self.keras_function(iterator)  # raises OutOfRangeError, as without LMS
                    break
                outputs = self.step(optional.get_value(), iterator.element_spec)
            if outputs is None:
                raise StopIteration
            return outputs
        for _, data in zip(range(steps), iterator):
            outputs = self.step(data)
        return outputs


def _steps_per_execution(model) -> int:
    """``model.steps_per_execution`` now: an int in Keras 3, a variable in tf_keras (mirrored under a strategy; its
    data handler lowers it for the last, shorter execution of an epoch)."""
    value = model.steps_per_execution
    return int(value.numpy() if hasattr(value, "numpy") else value)
