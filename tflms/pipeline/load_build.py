"""The pipeline's first and last stages: the step TensorFlow would run (LOAD) and the function that runs the rewrite
(BUILD).

A ``ConcreteFunction`` is optimized by grappler before it is read, as TensorFlow does at its first call
(:func:`tflms.ir.preoptimize.preoptimize`), with the summation order of grappler's accumulators observed in one call
where example inputs are given (:mod:`tflms.measure.accumulations`); the rewritten function then runs with grappler
off (:func:`tflms.ir.preoptimize.run_preoptimized`). Anything else is read as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tflms.ir import tf_io
from tflms.ir.graph import Graph

def _preoptimized(source: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> Any:
    """LOAD: a ConcreteFunction after grappler (as TensorFlow would run it), else ``source`` as it is."""
    return _traced_and_preoptimized(source, args, kwargs)[1]


def _traced_and_preoptimized(source: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
                             example_inputs: Sequence[Any] | None = None, *, grappler: bool = True):
    """``(the ConcreteFunction of source or None, what LOAD reads)``.

    With ``example_inputs`` (a call's positional arguments) the order in which this
    machine's executor sums each grappler accumulator on a CPU is observed in one
    call of the step (:mod:`tflms.measure.accumulations`), only when there is one.
    ``grappler=False``: the traced step as it is, for a step that keeps XLA (:func:`_build_xla` says why).
    """
    concrete = tf_io.concrete_function_of(source, *args, **(kwargs or {}))
    if concrete is None:
        return None, source
    if not grappler:
        return concrete, concrete
    from tflms.ir import preoptimize
    return concrete, preoptimize.preoptimize(concrete, _observer(concrete, example_inputs),
                                             _ran_check(concrete, example_inputs))


def _observer(concrete: Any, example_inputs: Sequence[Any] | None) -> Callable[[Any, Any], Any] | None:
    """How LOAD observes the summation orders of ``concrete``'s accumulators: one call with ``example_inputs``."""
    if example_inputs is None:
        return None
    from tflms.measure.accumulations import observe_accumulation_orders
    return lambda function, adds: observe_accumulation_orders(function, list(example_inputs), adds,
                                                              variables=concrete.graph.variables)


def _ran_check(concrete: Any, example_inputs: Sequence[Any] | None) -> Callable[[Any], Any] | None:
    """How LOAD learns which accumulators TensorFlow's own run of ``concrete`` makes: one call with
    ``example_inputs``."""
    if example_inputs is None:
        return None
    from tflms.measure.accumulations import instantiated_accumulators
    return lambda function: instantiated_accumulators(function, list(example_inputs),
                                                      variables=concrete.graph.variables)


def _grappler_done_before(step: Any, original: Any) -> bool:
    """Whether grappler ran before the rewrite (LOAD's pre-pass), so that none runs after it; ``True`` for a
    graph that is no ``ConcreteFunction`` (nothing of it is instantiated here)."""
    if original is None or not tf_io.is_concrete_function(step):
        return True
    from tflms._compat import grappler as compat
    return compat.is_grappler_done(step)


def _accumulator_pins(step: Any) -> tuple[dict[str, Any], ...]:
    """How LOAD pinned the summation order of each grappler accumulator in ``step`` (the report's record)."""
    if not tf_io.is_concrete_function(step):
        return ()
    from tflms.ir import preoptimize
    return tuple(p.to_dict() for p in preoptimize.accumulator_pins(step))


def _build(graph: Graph, step: Any, inserted: Sequence[str]):
    """BUILD: the rewritten function, on ``step``'s variables, run with grappler off when ``step`` went through it."""
    from tflms.compress.rewrite import register_functions
    from tflms.ir import preoptimize
    register_functions(graph)
    rewritten = tf_io.to_concrete_function(graph, step, extra_control_outputs=inserted)
    return preoptimize.run_preoptimized(rewritten, step)


def _build_xla(graph: Graph, step: Any, inserted: Sequence[str], whole: bool = False):
    """BUILD for a step that keeps XLA (issue 47): the rewritten function, never compiled whole, run with grappler off.

    Its ops carry their XLA clusters (:mod:`tflms.passes.xla_clusters`), and TensorFlow's clustering runs when
    the function is instantiated, after grappler. Grappler stays off, as it is for a ``jit_compile=True`` step:
    XLA optimizes inside the clusters, and grappler's remapper would fuse ops into kernels XLA has none for
    (``_FusedMatMul`` on a CPU), which would then fall out of their clusters. LOAD read the traced step, not
    grappler's optimization of it, for the same reason.

    ``whole``: the step is left to XLA (it fits with XLA alone, :mod:`tflms.tune.xla_alone`): compiled whole, as
    ``jit_compile=True`` compiles it (``_XlaMustCompile``), with nothing inserted.
    """
    from tflms._compat import grappler as compat
    from tflms.compress.rewrite import register_functions
    register_functions(graph)
    rewritten = tf_io.to_concrete_function(graph, step, extra_control_outputs=inserted, keep_must_compile=False,
                                           must_compile=whole)
    return compat.mark_grappler_done(rewritten)
