"""The order in which TensorFlow's executor adds a grappler accumulator's inputs, observed in calls of the step.

Grappler's memory optimizer turns an ``AddN`` of more than two inputs that is live at
the estimated peak into a temporary variable and one ``AssignAdd`` per input, with
nothing ordering the ``AssignAdd`` s (docs/design.md, "Exceptions to bitwise"): the sum
is taken in the order they take the variable's lock. On a GPU that order follows the
graph (the kernels are inexpensive and run inline). On a CPU the executor sends a
kernel it rates expensive to its thread pool and runs a cheap one inline, rating each
by the cycles it took before, so the order is this machine's. tflms pins the order
with control edges; on a CPU it asks this machine which order that is:
:func:`observe_accumulation_orders` runs the pre-optimized step (not yet rewritten)
:data:`OBSERVED_CALLS` times under TensorFlow's profiler and reads when each ``AssignAdd`` ended. An
``AssignAdd`` holds the lock for its whole update, so the end times are the summation order. The order
pinned is the one the warm calls (all but the first) took most often, the latest on a tie: the executor
rates kernels by the cycles they took before, so the first call runs on cold estimates and the user's
steps on warm ones. Where the calls disagree, the order is a race
of the executor's threads (issue 49: with oneDNN on, one ``AssignAdd`` of DenseNet121's accumulator ran
on another thread than the others in 4 of 6 plain steps), the plain step itself may sum in either order,
and the accumulator is reported as such (:attr:`ObservedOrders.racy`).

The call changes the step's variables; they are read before it and assigned back after it,
so the user's training starts from the same bytes. The step must capture nothing stateful
but variables and take no resource or variant argument (an iterator would advance; neither
could be restored), and the profiler must be free.
"""

from __future__ import annotations

import logging
import pathlib
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tflms.measure.emulation import MeasurementError

logger = logging.getLogger(__name__)

#: The profiler's host tracing only: TensorFlow op events, no Python trace, no device trace.
HOST_TRACER_LEVEL = 2
#: Calls of the step observed (see the module doc): the warm ones' most frequent order is pinned.
OBSERVED_CALLS = 5


class ObservedOrders(dict):
    """``{accumulator: its AssignAdd names in the order the warm observed calls took most often}``; ``racy``: the
    accumulators whose order differed between the observed calls (a race of the executor's threads)."""

    racy: frozenset = frozenset()


class ObservationError(MeasurementError):
    """The summation order could not be observed (says why; the caller falls back to the static order)."""


def observe_accumulation_orders(function: Any, args: Sequence[Any], adds: Mapping[str, Sequence[str]], *,
                                variables: Iterable[Any], calls: int = OBSERVED_CALLS) -> ObservedOrders:
    """``{accumulator: its AssignAdd names in the order they ran}`` in ``calls`` calls ``function(*args)``: the
    order the warm calls (all but the first, where there are others) took most often, the latest on a tie (see the
    module doc; ``racy`` names those whose order varied between the calls).

    ``adds``: each accumulator's ``AssignAdd`` node names (any order).
    ``variables``: the step's variables (``tf.Variable`` s whose handles it
    captures); their values are restored after the calls.
    Raises :class:`ObservationError` saying why when the order cannot be observed.
    """
    start = time.perf_counter()
    wanted = {n for names in adds.values() for n in names}
    per_call = end_orders(_profiled_call(function, args, variables, calls=calls), wanted, calls)
    orders, racy = ObservedOrders(), set()
    for result, names in adds.items():
        seen = [tuple(n for n in ended if n in set(names)) for ended in per_call]
        if sorted(seen[-1]) != sorted(names):
            missing = sorted(set(names) - set(seen[-1]))
            raise ObservationError(f"the trace holds {len(seen[-1])} of the {len(names)} AssignAdds of {result!r} "
                                   f"(missing {missing[:3]})")
        warm = seen[1:] or seen
        orders[result] = max(reversed(warm), key=warm.count)  # (max keeps the first of ties: the latest call's)
        if len(set(seen)) > 1:
            racy.add(result)
    orders.racy = frozenset(racy)
    logger.info("tflms: observed the summation order of %d grappler accumulator(s) in %d calls (%.1f s)",
                len(orders), calls, time.perf_counter() - start)
    if racy:
        logger.warning("tflms: TensorFlow's executor summed %d grappler accumulator(s) in different orders in %d "
                       "calls of the step on this CPU (%s): the order is a race of its threads, which the plain "
                       "step runs too, so training may differ from it in the last bits; tflms pins the order the "
                       "warm calls took most often (docs/design.md, 'Exceptions to bitwise')", len(racy), calls,
                       ", ".join(sorted(racy)))
    return orders


def instantiated_accumulators(function: Any, args: Sequence[Any], *, variables: Iterable[Any]) -> dict[str, list]:
    """The accumulators TensorFlow's own instantiation of ``function`` made, from one call ``function(*args)``:
    ``{result (the AddN's name): its nodes (``NodeDef`` copies, in the order of the graph TensorFlow ran)}``.

    Read from the post-optimization graph TensorFlow reports for the call (run metadata), so it is grappler's
    decision at instantiation whatever made it (device descriptions, names, the schedule its cost model
    predicts). ``variables`` are restored after the call, as :func:`observe_accumulation_orders` does. Raises
    :class:`ObservationError` saying why when the call cannot be made, or TensorFlow reports no graph for it (the
    function ran before: its instantiation is not repeated).
    """
    from tflms._compat.tf import recorded_function_graphs
    from tflms.ir.preoptimize import ACCUMULATOR_RESULT_TYPE
    saved = _restorable(function, args, variables)
    try:
        with recorded_function_graphs() as graphs:
            function(*args)
    except Exception as err:  # noqa: BLE001 - any failure of the trial call means: not learned
        raise ObservationError(f"the trial call failed ({type(err).__name__}: {str(err)[:200]})") from err
    finally:
        _restore(saved)
    if not graphs:
        raise ObservationError("TensorFlow reported no graph for the call (the step was instantiated before)")
    ran = max((g.post_optimization_graph for g in graphs), key=lambda g: len(g.node))  # the step: the largest
    made: dict[str, list] = {}
    for node in ran.node:
        if node.op == ACCUMULATOR_RESULT_TYPE:
            made[node.name] = []
    for node in ran.node:  # grappler names them <AddN>/tmp_var, _zeros, _initializer and _accum_<i>
        owner = node.name if node.name in made else node.name.rpartition("/")[0]
        if owner in made and (node.name == owner or node.name.startswith(f"{owner}/tmp_var")):
            made[owner].append(type(node).FromString(node.SerializeToString()))
    return made


def _restorable(function: Any, args: Sequence[Any], variables: Iterable[Any]) -> list:
    """The ``(variable, value)`` s to assign back after a trial call ``function(*args)``; raises
    :class:`ObservationError` when the call could change state that cannot be restored."""
    import numpy as np
    import tensorflow as tf

    try:
        variables = list(variables)
        restorable = {id(v.handle) for v in variables}
        saved = [(v, np.array(v.numpy(), copy=True)) for v in variables]
    except Exception as err:  # noqa: BLE001 - e.g. a distributed variable read outside its replica context
        raise ObservationError(f"the step's variables could not be read ({type(err).__name__}: {err})") from err
    stateful = [i for i, h in enumerate(function.captured_inputs)
                if h.dtype == tf.resource and id(h) not in restorable]
    if stateful:
        raise ObservationError(f"the step captures {len(stateful)} resource(s) that are not variables (capture "
                               f"{stateful[0]}), which a trial call could change for good")
    flat = tf.nest.flatten(list(args), expand_composites=True)
    handles = [i for i, a in enumerate(flat) if getattr(a, "dtype", None) in (tf.resource, tf.variant)]
    if handles:
        raise ObservationError(f"the step takes a resource or variant argument (flattened argument {handles[0]}, "
                               "e.g. an iterator), which a trial call would advance")
    return saved


def _restore(saved: list) -> None:
    for variable, value in saved:
        variable.assign(value)


def _profiled_call(function: Any, args: Sequence[Any], variables: Iterable[Any], *, calls: int = 1) -> bytes:
    """The serialized ``XSpace`` of ``calls`` calls ``function(*args)`` under TensorFlow's profiler (host ops only);
    the ``variables`` are read before the calls and assigned back after them (each call starts from the same bytes)."""
    import tensorflow as tf

    saved = _restorable(function, args, variables)
    with tempfile.TemporaryDirectory(prefix="tflms_observe_") as logdir:
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=HOST_TRACER_LEVEL,
                                                           python_tracer_level=0, device_tracer_level=0)
        try:
            tf.profiler.experimental.start(logdir, options=options)
        except Exception as err:  # noqa: BLE001 - e.g. another profiling session is running
            raise ObservationError(f"TensorFlow's profiler did not start ({type(err).__name__}: {err})") from err
        try:
            for k in range(calls):
                if k:
                    _restore(saved)
                function(*args)
        except Exception as err:  # noqa: BLE001 - any failure of the trial call means: not observed
            raise ObservationError(f"the trial call failed ({type(err).__name__}: {str(err)[:200]})") from err
        finally:
            tf.profiler.experimental.stop()
            _restore(saved)
        paths = sorted(pathlib.Path(logdir).rglob("*.xplane.pb"))
        if not paths:
            raise ObservationError("the profiler wrote no trace")
        return paths[0].read_bytes()


def end_orders(xspace_bytes: bytes, names: Iterable[str], calls: int) -> list[list[str]]:
    """The op events named ``names`` in a serialized ``XSpace`` of ``calls`` calls, one list per call, each by the
    time the ops ended in that call (an op's ``k``-th end is its end in call ``k``). A node that ran other than once
    per call is placed, in every list, by its last end."""
    ends = _ends(xspace_bytes, names)
    out = []
    for k in range(calls):
        at = {n: (e[k] if len(e) == calls else e[-1]) for n, e in ends.items()}
        out.append(sorted(at, key=lambda n: (at[n], n)))
    return out


def _ends(xspace_bytes: bytes, names: Iterable[str]) -> dict[str, list[int]]:
    """``{node: its end times (ps), sorted}`` for the op events named ``names`` in a serialized ``XSpace``."""
    from tflms._compat.tf import xplane_pb2
    wanted = set(names)
    space = xplane_pb2().XSpace.FromString(xspace_bytes)
    ends: dict[str, list[int]] = {}
    for plane in space.planes:
        metadata = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                node = metadata[event.metadata_id].name.rpartition(":")[0]
                if node in wanted:
                    ends.setdefault(node, []).append(line.timestamp_ns * 1000 + event.offset_ps + event.duration_ps)
    return {n: sorted(e) for n, e in ends.items()}


def end_order(xspace_bytes: bytes, names: Iterable[str]) -> list[str]:
    """The op events named ``names`` in a serialized ``XSpace``, by the time each one ended.

    TensorFlow's profiler names a host op event ``node_name:OpType``; a node that ran more
    than once is placed by its last end.
    """
    ends = {n: e[-1] for n, e in _ends(xspace_bytes, names).items()}
    return sorted(ends, key=lambda n: (ends[n], n))
