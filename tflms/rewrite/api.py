"""``tflms.analyze`` and ``tflms.rewrite``: from any TF graph source to a report."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph
from tflms.config import LMSConfig
from tflms.errors import GraphError, NoTrainingStepError
from tflms.ir import tf_io
from tflms.ir.graph import Graph
from tflms.rewrite.apply import DEFAULT_COPY_OP, apply_plan, inserted_op_names
from tflms.rewrite.plan import plan_swaps
from tflms.rewrite.report import RewriteReport

logger = logging.getLogger(__name__)


def load_graph(source: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> Graph:
    """Read ``source`` into the IR.

    ``source`` may be an IR :class:`Graph`, a ``ConcreteFunction``, a
    ``tf.function`` (traced with ``args``/``kwargs``), a ``GraphDef``, a
    ``FunctionDef`` or a ``tf.Graph``.
    """
    if isinstance(source, Graph):
        return source
    import tensorflow as tf
    from tensorflow.core.framework import function_pb2, graph_pb2
    from tensorflow.python.eager.polymorphic_function import concrete_function as cf_lib

    inner = getattr(source, "original_function", None)  # a tflms.function wrapper
    if inner is not None:
        source = inner
    if isinstance(source, cf_lib.ConcreteFunction):
        return tf_io.from_concrete_function(source, batch_size=batch_size)
    if isinstance(source, graph_pb2.GraphDef):
        return tf_io.from_graph_def(source, batch_size=batch_size)
    if isinstance(source, function_pb2.FunctionDef):
        return tf_io.from_function_def(source, batch_size=batch_size)
    if isinstance(source, tf.Graph):
        return tf_io.from_tf_graph(source, batch_size=batch_size)
    if hasattr(source, "get_concrete_function"):
        if not args and not kwargs:
            raise GraphError(f"{getattr(source, '__name__', source)!r} is a tf.function: pass example arguments "
                             "(tensors or tf.TensorSpec) so it can be traced, e.g. analyze(step, x, y)")
        return tf_io.from_concrete_function(source.get_concrete_function(*args, **kwargs), batch_size=batch_size)
    raise GraphError(f"cannot read a training step from {type(source).__name__}; give a tf.function with example "
                     "arguments, a ConcreteFunction, a GraphDef or a FunctionDef")


def analyze(source: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> Analysis:
    """Categorized topological ordering of a training step.

    Returns an :class:`~tflms.analysis.cto.Analysis`: ``levels`` and
    ``categories`` per op, and ``tensor(name)`` / ``tensors()`` giving each
    tensor's producer, consumers, level distances and bytes.
    """
    return analyze_graph(load_graph(source, *args, batch_size=batch_size, **kwargs))


#: Op types that call another function (opaque to tflms: their bodies are not rewritten).
CALL_OP_TYPES = frozenset({"StatefulPartitionedCall", "PartitionedCall"})


def no_training_step_error(analysis: Analysis) -> NoTrainingStepError:
    """The error for a graph without gradient ops, naming nested function calls if that is why."""
    calls = [op.name for op in analysis.graph if op.type in CALL_OP_TYPES]
    if calls:
        return NoTrainingStepError(
            f"the graph has no gradient ops of its own but calls other functions ({calls[:3]}), which tflms treats "
            "as opaque: the training step is probably a tf.function inside the function given to tflms. Give "
            "tflms the plain Python step (do not decorate it with tf.function as well)")
    return NoTrainingStepError(
        "the graph has no gradient ops (no op of a gradient type such as ReluGrad or MatMul under "
        "gradient_tape/): tflms swaps activations kept from the forward pass for the backward pass, so "
        "give it a training step (forward + tape.gradient + optimizer update)")


def resolve_accelerator(config: LMSConfig) -> tuple[str, list[str]]:
    """The accelerator device to use and any warning about it."""
    if config.accelerator_device is not None:
        return config.accelerator_device, []
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


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """The rewritten IR graph, its analysis (of the input) and the report."""

    graph: Graph
    analysis: Analysis
    report: RewriteReport


def rewrite(source: Any, config: LMSConfig | None = None, *args: Any, copy_op: str = DEFAULT_COPY_OP,
            require_backward: bool = True, **options: Any) -> RewriteResult:
    """Analyze ``source`` and insert swap ops as ``config`` says.

    ``options`` override fields of ``config`` (e.g. ``swapout_threshold=4``).
    ``args`` are example arguments when ``source`` is a ``tf.function``.
    Raises :class:`~tflms.errors.NoTrainingStepError` if the graph has no
    gradient ops (unless ``require_backward=False``).
    """
    config = LMSConfig.from_kwargs(config, **options)
    with _gc_paused():
        return _rewrite(source, config, args, copy_op, require_backward)


@contextlib.contextmanager
def _gc_paused():
    """Pause CPython's cyclic collector while rewriting (and restore its state).

    A rewrite of a 100k-op graph allocates about a million small objects, none of
    them cyclic garbage; full collections then cost up to a second each and make
    the rewrite time grow faster than the graph.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _rewrite(source: Any, config: LMSConfig, args: tuple, copy_op: str, require_backward: bool) -> RewriteResult:
    t0 = time.perf_counter()
    graph = load_graph(source, *args, batch_size=config.batch_size)
    t1 = time.perf_counter()
    analysis = analyze_graph(graph)
    t2 = time.perf_counter()
    if require_backward and not analysis.has_backward:
        raise no_training_step_error(analysis)
    accelerator, device_warnings = resolve_accelerator(config)
    plan = plan_swaps(analysis, config, accelerator_device=accelerator)
    if device_warnings:
        plan = dataclasses.replace(plan, warnings=tuple(device_warnings) + plan.warnings)
    t3 = time.perf_counter()
    new_graph = apply_plan(graph, plan, copy_op=copy_op)
    t4 = time.perf_counter()
    report = RewriteReport(plan=plan, graph_summary=analysis.summary(), inserted_ops=tuple(inserted_op_names(plan)),
                           timings_s={"load": t1 - t0, "analyze": t2 - t1, "plan": t3 - t2, "apply": t4 - t3})
    for w in plan.warnings:
        logger.warning("tflms: %s", w)
    return RewriteResult(graph=new_graph, analysis=analysis, report=report)
