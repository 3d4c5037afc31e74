"""Will it fit? The predicted peak, fit and largest batch of a Keras model's training step, with and without tflms.

:func:`estimate` traces the model's training step once, with an unknown batch dimension, and answers from the
simulator (no training, no GPU): at ``batch_size``, the predicted peak and step time without tflms and with the
rewrite the tuner picks for the budget, whether each fits, and the largest batch each way (doubling, then bisection:
:func:`tflms.tune.maxbatch.max_batch`). Figures are simulated on a hardware profile (default: the local GPU's, else
:data:`~tflms.profiles.DEFAULT_PROFILE`), not measured. ``tflms estimate MODEL.keras --batch N`` is the command.

The step is what ``model.fit`` runs: forward, loss, gradients, the optimizer's update. A compiled model (or a
``.keras`` file saved after ``compile``) brings its optimizer and loss; otherwise Adam and sparse categorical
cross-entropy on logits are assumed, and the result says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from tflms.errors import ConfigError, TflmsError
from tflms.units import format_bytes, parse_bytes


#: How close the largest batch with tflms is searched: the smallest batch found not to fit is within this fraction
#: above it (the bench's quick mode bisects to the same step, tools/benchlib/common.py QUICK_BISECT_STEPS). Each probe
#: is a tune (seconds to half a minute on ResNet-50); an exact search took minutes.
MAX_BATCH_TOLERANCE = 0.125


class EstimateError(TflmsError, ValueError):
    """The model cannot be estimated (unreadable file, no input shape, a loss whose labels cannot be inferred)."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What :func:`estimate` predicts (simulated) for one model, batch and budget."""

    model: str
    batch_size: int
    profile: str
    budget_bytes: int
    peak_bytes_without: int
    peak_bytes_with: int | None  # None: nothing fits with tflms either
    step_time_s_without: float
    step_time_s_with: float | None
    strategy: str | None  # the tuner's pick at batch_size (None: the step fits unchanged, or nothing fits)
    max_batch_without: int | None  # None: not searched
    max_batch_with: int | None
    assumed: tuple[str, ...] = ()  # what the model did not say (optimizer, loss)
    seconds: float = 0.0
    #: the margin every peak above carries (tflms/budget.py: 5% on the profile's memory, none on a budget given)
    margin_fraction: float = 0.0

    @property
    def fits_without(self) -> bool:
        return self.peak_bytes_without <= self.budget_bytes

    @property
    def fits_with(self) -> bool:
        return self.peak_bytes_with is not None and self.peak_bytes_with <= self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["assumed"] = list(self.assumed)
        out.update(fits_without=self.fits_without, fits_with=self.fits_with, simulated=True,
                   samples_per_s_without=self.batch_size / self.step_time_s_without,
                   samples_per_s_with=None if not self.step_time_s_with else self.batch_size / self.step_time_s_with)
        return out

    def table(self) -> str:
        def cell(peak, seconds, fits):
            if peak is None:
                return "does not fit", "-", "-"
            return (f"{format_bytes(peak)} ({'fits' if fits else 'does not fit'})", f"{1e3 * seconds:.1f} ms",
                    f"{self.batch_size / seconds:.1f}")
        rows = [("without tflms", *cell(self.peak_bytes_without, self.step_time_s_without, self.fits_without),
                 self.max_batch_without),
                ("with tflms", *cell(self.peak_bytes_with, self.step_time_s_with, self.fits_with), self.max_batch_with)]
        margin = f", peaks with a {self.margin_fraction:.0%} margin" if self.margin_fraction else ""
        lines = [f"{self.model} at batch {self.batch_size} on {self.profile}, budget {format_bytes(self.budget_bytes)} "
                 f"(simulated, no training{margin}; {self.seconds:.1f} s)",
                 f"{'':<15}{'predicted peak':<32}{'step':>10}{'samples/s':>11}{'largest batch':>15}"]
        for name, peak, step, rate, largest in rows:
            lines.append(f"{name:<15}{peak:<32}{step:>10}{rate:>11}{'-' if largest is None else largest:>15}")
        if self.strategy:
            lines.append(f"with tflms: {self.strategy}")
        if self.assumed:
            lines.append("assumed: " + "; ".join(self.assumed))
        return "\n".join(lines)


def load_keras_model(path: str):
    """A Keras model from a ``.keras`` file; :class:`EstimateError` names the file and why not."""
    import os

    import keras
    if not os.path.exists(path):
        raise EstimateError(f"{path}: no such file; give a .keras file written by model.save('model.keras')")
    try:
        return keras.saving.load_model(path)
    except Exception as err:  # noqa: BLE001 - Keras raises many types for unreadable files
        raise EstimateError(f"{path}: Keras cannot load it ({type(err).__name__}: {str(err)[:200]}); give a .keras "
                            "file written by model.save('model.keras')") from err


def training_step(model: Any) -> tuple[Any, tuple[str, ...], Any]:
    """``(the ConcreteFunction of model's training step with an unknown batch dimension, what was assumed, the
    optimizer)``: keep the optimizer while the function is read (it captures the optimizer's variables)."""
    import keras
    import tensorflow as tf

    from tflms.testing.steps import make_train_step
    assumed = []
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise EstimateError(f"model {model.name!r} has {len(model.inputs)} inputs and {len(model.outputs)} "
                            "outputs; the estimate supports one of each (trace a tf.function step yourself and use "
                            "tflms.tune.maxbatch.max_batch)")
    shape = tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise EstimateError(f"model {model.name!r} has input shape {shape} with unknown dimensions beside the "
                            "batch: build it with a fixed keras.Input shape")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        optimizer = keras.optimizers.Adam()
        assumed.append("optimizer Adam (the model is not compiled)")
    loss = getattr(model, "loss", None)
    if loss is None:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        assumed.append("loss sparse categorical cross-entropy on logits (the model is not compiled)")
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    out = tuple(model.outputs[0].shape[1:])
    name = getattr(loss, "name", None) or getattr(loss, "__name__", "")
    sparse = "sparse" in str(name).lower()
    labels = tf.TensorSpec((None,), tf.int32) if sparse else tf.TensorSpec((None, *out), tf.float32)
    step = tf.function(make_train_step(model, optimizer, loss))
    x = tf.TensorSpec((None, *shape), model.inputs[0].dtype)
    return step.get_concrete_function(x, labels), tuple(assumed), optimizer


def _is_training_trace(concrete: Any) -> bool:
    """Whether a traced function computes gradients (a training step), by its ops."""
    from tflms.ir.op_types import GRADIENT_OP_TYPES
    graph = concrete.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return any(n.op in GRADIENT_OP_TYPES for n in nodes)


def saved_model_step(path: str, function: str | None = None) -> tuple[Any, str, Any]:
    """``(the training trace, its name, the loaded SavedModel to keep alive)`` of a SavedModel directory: the first
    trace that computes gradients, of ``function`` (an attribute path such as ``train_step``) or of any function."""
    from tflms.integrations.savedmodel.read import (_load, _resolve, _traces, check_input_dir, describe_trace,
                                                    keras_export_message, read_saved_model, select_functions)
    in_path = check_input_dir(path, role="MODEL")
    info = read_saved_model(in_path)
    selected, _ = select_functions(info, [function] if function else None)
    loaded = _load(in_path)
    seen = []
    for finfo in selected:
        for concrete in _traces(_resolve(loaded, finfo.path), finfo):
            seen.append(f"{finfo.path}({describe_trace(concrete)})")
            if _is_training_trace(concrete):
                return concrete, f"{in_path.name}:{finfo.path}", loaded
    if info.keras_export:
        raise EstimateError(keras_export_message(info))
    raise EstimateError(f"no function of the SavedModel {in_path} computes gradients (looked at {', '.join(seen)}): "
                        "the estimate needs the training step. Save the tf.Module with its tf.function train step "
                        "(docs/guide.md, \"The SavedModel command\"), or estimate the Keras model (.keras file)")


def _step_of(model: Any, function: str | None) -> tuple[Any, str, tuple[str, ...], Any]:
    """``(ConcreteFunction, name, assumed, what to keep alive)`` of what :func:`estimate` was given."""
    import os

    import tensorflow as tf
    if isinstance(model, (str, os.PathLike)) and os.path.isdir(model):
        concrete, name, keep = saved_model_step(os.fspath(model), function)
        return concrete, name, (), keep
    if isinstance(model, (str, os.PathLike)):
        model = load_keras_model(os.fspath(model))
    if isinstance(model, tf.types.experimental.ConcreteFunction):
        return model, getattr(model, "name", "step"), (), None
    if isinstance(model, tf.types.experimental.PolymorphicFunction):
        if model.input_signature is None:
            raise EstimateError(f"tf.function {model.__name__!r} has no input_signature: give it one with the batch "
                                "dimension None (tf.TensorSpec((None, ...))), or pass its ConcreteFunction "
                                "(step.get_concrete_function(...))")
        return model.get_concrete_function(), model.__name__, (), None
    step, assumed, optimizer = training_step(model)
    return step, model.name, assumed, (model, optimizer)  # both own variables the step captures


def estimate(model: Any, *, batch_size: int, profile: str | None = None, budget: int | str | None = None,
             search_max_batch: bool = True, progress: Callable[[str], None] | None = None,
             function: str | None = None) -> Estimate:
    """Predict the model's training step at ``batch_size`` without and with tflms (see the module doc).

    ``model``: a Keras model, the path of a ``.keras`` file, a training step (a ``tf.function`` with an
    ``input_signature`` whose batch dimension is ``None``, or a ``ConcreteFunction`` traced so), or the directory of a
    SavedModel holding one (``function``: its attribute path, default the first that computes gradients).
    ``profile``: a profile name (``tflms estimate --help`` lists them; default: the local GPU's, else the default
    profile). ``budget``: bytes or a string such as ``"12GiB"`` (default: the profile's memory).
    ``search_max_batch``: also find the largest batch each way.
    """
    return estimate_batches(model, batch_sizes=[batch_size], profile=profile, budget=budget,
                            search_max_batch=search_max_batch, progress=progress, function=function)[0]


def estimate_batches(model: Any, *, batch_sizes: Sequence[int], profile: str | None = None,
                     budget: int | str | None = None, search_max_batch: bool = True,
                     progress: Callable[[str], None] | None = None, function: str | None = None) -> list[Estimate]:
    """:func:`estimate` at each of ``batch_sizes`` (a range of batches), the step traced once and the largest batches
    searched once (every estimate carries them)."""
    from tflms.budget import margin_fraction
    from tflms.config import LMSConfig
    from tflms.devices import local_gpu
    from tflms.ir.tf_io import load_graph
    from tflms.pipeline import _preoptimized, priced_profile
    from tflms.profiles import select_profile
    from tflms.sim.simulator import SimOptions
    from tflms.tune.maxbatch import max_batch
    start = time.perf_counter()
    batch_sizes = list(batch_sizes)
    bad = [b for b in batch_sizes if not isinstance(b, int) or isinstance(b, bool) or b < 1]
    if not batch_sizes or bad:
        raise ConfigError(f"batch_size must be a positive int, got {bad[0] if bad else batch_sizes!r}")
    step, name, assumed, _keep = _step_of(model, function)  # (_keep: alive while the step is read)
    fixed = sorted({t.shape[0] for t in step.inputs if t.dtype != "resource" and t.shape.rank and t.shape[0] is not None})
    if fixed and any(b != fixed[0] for b in batch_sizes):
        other = next(b for b in batch_sizes if b != fixed[0])
        raise EstimateError(f"{name} was traced for batch {fixed[0]}, not {other}: trace it with the batch "
                            "dimension None (tf.TensorSpec((None, ...))) to estimate other batches")
    choice = select_profile(profile, local_gpu())
    priced = priced_profile(choice.name)
    budget_bytes = priced.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    config = LMSConfig()
    options = SimOptions(host_device=config.host_device, margin_fraction=margin_fraction(budget))  # tflms/budget.py
    graph = load_graph(_preoptimized(step, ()))
    say = progress or (lambda _m: None)
    largest = {}
    if search_max_batch:
        say("searching the largest batch without tflms")
        largest[False] = max_batch(graph, budget=budget_bytes, profile=priced, with_tflms=False, config=config,
                                   sim_options=options, progress=say).batch_size
        say("searching the largest batch with tflms")
        # from the unchanged step's largest (it fits with tflms too), each probe a tune, to within the bench's quick
        # bisection step (MAX_BATCH_TOLERANCE), without tuning the batch found again for its fastest rewrite
        largest[True] = max_batch(graph, budget=budget_bytes, profile=priced, with_tflms=True, config=config,
                                  sim_options=options, progress=say, start=max(1, largest[False]),
                                  tolerance=MAX_BATCH_TOLERANCE, fastest=False).batch_size
    out = []
    for batch_size in batch_sizes:
        t0 = time.perf_counter()
        plain, peak_with, time_with, strategy = _at(graph, batch_size, priced, budget_bytes, config, options, say,
                                                    f"simulating {name} at batch {batch_size} on {choice.name}")
        seconds = time.perf_counter() - (start if not out else t0)
        out.append(Estimate(model=name, batch_size=batch_size, profile=choice.name, budget_bytes=budget_bytes,
                            peak_bytes_without=plain.peak_with_margin_bytes, peak_bytes_with=peak_with,
                            step_time_s_without=plain.step_time_s, step_time_s_with=time_with, strategy=strategy,
                            max_batch_without=largest.get(False), max_batch_with=largest.get(True), assumed=assumed,
                            seconds=seconds, margin_fraction=options.margin_fraction))
    return out


def _at(graph: Any, batch_size: int, priced: Any, budget_bytes: int, config: Any, options: Any,
        say: Callable[[str], None], what: str) -> tuple[Any, int | None, float | None, str | None]:
    """``(the unchanged step's simulation, peak and step time with tflms, the tuner's pick)`` at one batch."""
    from tflms.errors import BudgetError
    from tflms.sim.simulator import simulate
    from tflms.tune.tuner import tune
    at = graph.with_batch_size(batch_size)
    say(what)
    plain = simulate(at, priced, options=options)
    if plain.peak_with_margin_bytes <= budget_bytes:
        return plain, plain.peak_with_margin_bytes, plain.step_time_s, None
    say("tuning a rewrite for the budget")
    try:
        tuned = tune(at, budget=budget_bytes, profile=priced, config=config.replace(batch_size=batch_size),
                     sim_options=options, enforce_order=True)
    except BudgetError:
        return plain, None, None, None
    return plain, tuned.best.sim.peak_with_margin_bytes, tuned.best.sim.step_time_s, tuned.reason()
