"""Rewrite the step TensorFlow will run: grappler's optimizers first, tflms's swaps after.

TensorFlow optimizes a function with grappler when it instantiates it (first
call). Several of grappler's rewrites depend on how many consumers a tensor has
(the remapper fuses Conv2D/MatMul + BiasAdd (+ activation) into ``_FusedConv2D``
/ ``_FusedMatMul`` only when the intermediate has one consumer; the arithmetic
optimizer turns add trees into ``AddN`` only through single-consumer adds), and
some on node names (commutative inputs are sorted by name; leaves of product
trees are grouped by name). A swap-out adds a consumer and a swap-in renames an
input, so grappler would otherwise treat the rewritten step differently from the
original, and training would not be bitwise identical (docs/design.md, "Bitwise
under grappler").

So the pipeline runs grappler itself, as function instantiation would, before
the rewrite (:func:`preoptimize`, the LOAD point), rewrites the optimized graph,
and runs the result with grappler off (:func:`run_preoptimized`, the BUILD
point): grappler's decisions are made once, on the user's unmodified graph.

What makes the Python run of grappler match instantiation (each checked against
the post-optimization graphs TensorFlow reports, ``tests/test_grappler_bitwise.py``):

- resource arguments are ``_Arg`` nodes carrying ``_handle_dtypes`` /
  ``_handle_shapes`` (the variable's shape), as at instantiation
  (``SetArgShape`` in ``optimize_function_graph_utils.cc``): shape-dependent
  rewrites need them, and the remapper reads them for bias shapes;
- data arguments stay ``Placeholder`` s (grappler's item builder erases
  ``_output_shapes``, so an ``_Arg`` would lose its shape) but are read through an
  ``EnsureShape`` under the argument's own name: grappler treats placeholders as
  feeds of unknown shape, and the ``EnsureShape`` restores the static shape
  without changing any name grappler sorts by;
- constants the function captured by value (small eager tensors, e.g. Keras's
  ``Normalization`` mean and variance: a ``Const`` in the traced graph that is
  also a function input) are arguments like the data ones: the FunctionDef
  drops the ``Const`` and each call feeds the eager value to an ``_Arg``, so
  grappler may not fold them;
- outputs are fetched through ``_Retval`` nodes (so the producers are not
  "preserved" nodes, as at instantiation) and control outputs are fetched;
- every unplaced node is put on the function's default device for the run (the
  remapper fuses only nodes it sees on a CPU or GPU), then unplaced again so that
  TensorFlow's placer decides as before;
- the ``ConfigProto`` is the one an eager call passes to instantiation.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tflms._compat import grappler as compat
from tflms.errors import GraphError, TflmsError
from tflms.ir import tf_io
from tflms.ir.op_types import LOOP_TYPES

logger = logging.getLogger(__name__)

#: Suffix of the renamed data placeholder while grappler runs (its name goes to an ``EnsureShape``).
FEED_SUFFIX = "/_tflms_feed"
#: What grappler's function optimizer lowers a ``While`` into (tflms cannot rewrite loops; lowered ``If`` s,
#: Switch/Merge, it can: the analysis keeps swaps and triggers out of their branches).
LOWERED_CONTROL_FLOW_TYPES = LOOP_TYPES
#: What grappler's memory optimizer turns an ``AddN`` it accumulates into (see :func:`pin_accumulations`).
ACCUMULATOR_RESULT_TYPE = "DestroyTemporaryVariable"
#: Prefix of the ``_Retval`` nodes added while grappler runs.
RETVAL_PREFIX = "_tflms_retval_"


class NonPlaceholderInputError(GraphError):
    """A function input that is neither a placeholder nor a captured ``Const``: the pre-pass cannot mimic it."""


def _copy(node):
    from tensorflow.core.framework import node_def_pb2
    new = node_def_pb2.NodeDef()
    new.CopyFrom(node)
    return new


def _const_as_placeholder(node, tensor) -> None:
    """Turn a captured-by-value ``Const`` input into a placeholder of its dtype and shape (in place).

    A small eager tensor a function captures (``capture_container``: at most
    128 elements, e.g. Keras's ``Normalization`` mean and variance) becomes a
    ``Const`` in the traced graph *and* one of its inputs. The FunctionDef drops
    the ``Const`` node: the input is an ``_Arg`` like any other (its
    ``_output_shapes`` give the shape), and each call feeds the eager value
    (``captured_inputs``). So grappler at instantiation sees an argument, not a
    constant it could fold, and neither may the pre-pass.
    """
    dtype = node.attr["dtype"].type
    node.op = "Placeholder"
    node.ClearField("attr")
    node.attr["dtype"].type = dtype
    node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())


def _instantiation_like(func_graph, device: str):
    """The function's GraphDef as grappler sees it at instantiation; returns (graph_def, fetch, undo info)."""
    import tensorflow as tf
    graph_def = func_graph.as_graph_def()
    by_name = {n.name: n for n in graph_def.node}
    originals = {}
    feeds = {}  # renamed placeholder -> argument name
    for index, tensor in enumerate(func_graph.inputs):
        node = by_name.get(tensor.op.name)
        if node is None or node.op not in ("Placeholder", "Const"):
            raise NonPlaceholderInputError(
                f"input {index} of {func_graph.name!r} is {tensor.op.name!r} of type {getattr(node, 'op', None)!r}, "
                "not a Placeholder or a captured Const: grappler cannot be run on it as TensorFlow's instantiation "
                "would")
        originals[node.name] = _copy(node)
        if node.op == "Const":
            _const_as_placeholder(node, tensor)
        if tensor.dtype == tf.resource:
            handle = compat.resource_handle_shape(tensor)
            dtype = node.attr["dtype"].type
            node.op = "_Arg"
            node.ClearField("attr")
            node.attr["T"].type = dtype
            node.attr["index"].i = index
            if handle is not None:
                node.attr["_handle_dtypes"].list.type.extend(handle[0])
                for shape in handle[1]:
                    node.attr["_handle_shapes"].list.shape.add().CopyFrom(shape)
        elif not node.attr["shape"].shape.unknown_rank:
            feed = node.name + FEED_SUFFIX
            ensure = graph_def.node.add()
            ensure.name, ensure.op = node.name, "EnsureShape"
            ensure.input.append(feed)
            ensure.attr["T"].type = node.attr["dtype"].type
            ensure.attr["shape"].shape.CopyFrom(node.attr["shape"].shape)
            node.name = feed
            feeds[feed] = ensure.name
    fetch = []
    for index, tensor in enumerate(func_graph.outputs):
        ret = graph_def.node.add()
        ret.name, ret.op = f"{RETVAL_PREFIX}{index}", "_Retval"
        ret.input.append(tensor.op.name if tensor.value_index == 0 else tensor.name)
        ret.attr["T"].type = tensor.dtype.as_datatype_enum
        ret.attr["index"].i = index
        fetch.append(ret.name)
    fetch.extend(op.name for op in func_graph.control_outputs)
    unplaced = set()
    for node in graph_def.node:
        if not node.device:
            node.device = device
            unplaced.add(node.name)
    return graph_def, fetch, originals, feeds, unplaced


def _restore(optimized, func_graph, originals, feeds, unplaced, device: str):
    """Undo the instantiation-like changes; returns (graph_def, output tensor names)."""
    from tensorflow.core.framework import graph_pb2
    known = {op.name for op in func_graph.get_operations()}
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(optimized.versions)
    graph_def.library.CopyFrom(optimized.library)
    outputs: dict[int, str] = {}
    ensured = set(feeds.values())
    for node in optimized.node:
        if node.op == "_Retval" and node.name.startswith(RETVAL_PREFIX):
            source = node.input[0]
            outputs[int(node.name[len(RETVAL_PREFIX):])] = source if ":" in source else source + ":0"
            continue
        if node.name in ensured:
            if node.op != "EnsureShape" or list(node.input) != [node.name + FEED_SUFFIX]:
                raise GraphError(f"grappler rewrote the shape marker {node.name!r} into {node.op!r}; tflms cannot "
                                 "restore the argument (please report this with your TensorFlow version)")
            continue
        new = graph_def.node.add()
        if node.name in feeds:
            new.CopyFrom(originals[feeds[node.name]])
        elif node.name in originals:  # a resource argument (_Arg)
            new.CopyFrom(originals[node.name])
        else:
            new.CopyFrom(node)
            if new.device == device and (new.name in unplaced or new.name not in known):
                new.device = ""
    missing = [i for i in range(len(func_graph.outputs)) if i not in outputs]
    if missing:
        raise GraphError(f"grappler dropped output(s) {missing} of {func_graph.name!r}")
    return graph_def, tuple(outputs[i] for i in range(len(func_graph.outputs)))


def preoptimized_graph_def(concrete_function, *, memory_optimizer: bool = True):
    """Grappler's optimization of ``concrete_function``'s graph, as TensorFlow would do at instantiation.

    Returns ``(graph_def, output_names)``: the optimized graph with the original
    argument placeholders, and the tensors that now produce each output.
    ``memory_optimizer=False`` leaves grappler's memory optimizer out (it makes no
    accumulator), for a step whose instantiation made none (:func:`preoptimize`).
    """
    func_graph = concrete_function.graph
    device = compat.default_device()
    graph_def, fetch, originals, feeds, unplaced = _instantiation_like(func_graph, device)
    config = compat.function_call_config()
    if not memory_optimizer:
        from tensorflow.core.protobuf import rewriter_config_pb2
        config.graph_options.rewrite_options.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    optimized = compat.run_grappler(graph_def, fetch, config)
    return _restore(optimized, func_graph, originals, feeds, unplaced, device)


def _xla_compiled(concrete_function) -> bool:
    fdef = concrete_function.function_def
    attr = fdef.attr.get("_XlaMustCompile") if fdef is not None else None
    return bool(attr is not None and attr.b)


#: One pre-optimized function per traced function: grappler's run costs seconds on a large step, and its result
#: gets new names for the captured variables each time it is built, so reusing it keeps a second rewrite of the
#: same step byte-identical to the first (rewrites are deterministic). Each entry: (function, whether an
#: observation of the summation orders could still change it).
_PREOPTIMIZED: "weakref.WeakKeyDictionary[object, tuple[object, bool]]" = weakref.WeakKeyDictionary()
#: How each pre-optimized function's accumulators were pinned (:func:`accumulator_pins`).
_PINS: "weakref.WeakKeyDictionary[object, tuple[AccumulatorPin, ...]]" = weakref.WeakKeyDictionary()

#: Where an accumulator's summation order came from (:attr:`AccumulatorPin.source`).
ORDER_OBSERVED = "observed"      # this machine's executor, profiled calls of the step (on a CPU)
ORDER_OBSERVED_RACY = "observed-racy"  # the same, but the calls summed in different orders: a race of its threads
ORDER_CPU_POOL = "cpu-pool"      # a CPU's executor as it usually runs: the last inline, the rest LIFO from its pool
ORDER_GPU_INLINE = "gpu-inline"  # a GPU's executor: inexpensive kernels inline, in graph order

#: ``observe(unpinned function, {accumulator: its AssignAdd names}) -> {accumulator: AssignAdd names in the
#: order they ran}``; raises :class:`~tflms.errors.TflmsError` saying why it could not observe.
Observer = Callable[[Any, Mapping[str, Sequence[str]]], Mapping[str, Sequence[str]]]
#: ``ran(the user's function) -> {accumulator (the AddN's name): its nodes}`` that TensorFlow's own instantiation
#: made, from one call of it (:func:`tflms.measure.accumulations.instantiated_accumulators`); raises
#: :class:`~tflms.errors.TflmsError` saying why not.
RanCheck = Callable[[Any], Mapping[str, Sequence[Any]]]


@dataclasses.dataclass(frozen=True)
class AccumulatorPin:
    """One grappler accumulator's summation order, pinned by control edges between its ``AssignAdd`` s."""

    result: str  # its DestroyTemporaryVariable (the AddN's name)
    order: tuple[str, ...]  # its AssignAdds, first to last
    source: str  # ORDER_OBSERVED, ORDER_OBSERVED_RACY, ORDER_CPU_POOL or ORDER_GPU_INLINE
    why: str = ""  # on a CPU without an observation: why there is none; a racy one: that it is

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "order": list(self.order), "source": self.source, "why": self.why}


def preoptimize(concrete_function, observe: Observer | None = None, ran: RanCheck | None = None):
    """LOAD: a ``ConcreteFunction`` running grappler's optimization of ``concrete_function``'s graph.

    It captures the same variables and has the same signature; rewrite it (its
    graph is what TensorFlow would have run) and hand the rewrite to
    :func:`run_preoptimized`. Functions compiled with XLA are returned unchanged
    (XLA, not grappler, decides what runs). ``observe``: how to learn the order in
    which this machine's executor sums each grappler accumulator on a CPU
    (:func:`pin_accumulations`); without it a CPU's usual order is assumed.

    ``ran``: how to learn which accumulators TensorFlow's own instantiation of ``concrete_function`` makes on a
    CPU (one call of the user's step, its variables restored), asked where the pre-pass made one or could have
    (an ``AddN`` of more than two inputs). The memory optimizer's choice follows a schedule grappler's cost model
    predicts, and differences between the pre-pass and instantiation can tip it either way (docs/design.md,
    "Exceptions to bitwise"; keras.applications ResNet50 at 64x64, batch 4, and at 96x96 in ``fit``). Where
    they differ, the pre-pass runs again without the memory optimizer and takes instantiation's accumulators
    (:func:`_with_accumulators`).
    """
    if _xla_compiled(concrete_function) or compat.is_grappler_done(concrete_function):
        return concrete_function
    cached, observable = _PREOPTIMIZED.get(concrete_function, (None, False))
    if cached is not None and not (observable and observe is not None):
        return cached
    new, observable = _preoptimize(concrete_function, observe, ran)
    _PREOPTIMIZED[concrete_function] = (new, observable)
    return new


def accumulator_pins(function) -> tuple[AccumulatorPin, ...]:
    """How :func:`preoptimize` pinned the accumulators of ``function`` (one of its results); ``()`` if none."""
    return _PINS.get(function, ())


def _preoptimize(concrete_function, observe: Observer | None, ran: RanCheck | None = None):
    try:
        graph_def, outputs = preoptimized_graph_def(concrete_function)
    except NonPlaceholderInputError as err:
        logger.warning("tflms: %s; this step is rewritten before grappler instead, so grappler may treat it "
                       "differently from the original (docs/design.md, 'Bitwise under grappler')", err)
        return concrete_function, False
    lowered = sorted({n.op for n in graph_def.node} & LOWERED_CONTROL_FLOW_TYPES)
    if lowered:
        logger.warning("tflms: grappler lowered the control flow of %s into %s, which tflms cannot rewrite; this "
                       "step is rewritten before grappler instead, so grappler may treat it differently from the "
                       "original (docs/design.md, 'Bitwise under grappler')", concrete_function.graph.name,
                       "/".join(lowered))
        return concrete_function, False
    graph = _graph_of(concrete_function, graph_def, outputs)
    name = f"{concrete_function.graph.name}_optimized"
    default_device = compat.default_device()
    on_cpu = _cpu_accumulations(graph, default_device)
    if ran is not None and (on_cpu or _may_accumulate(graph, default_device)):
        made = _made_by_instantiation(concrete_function, ran, bool(on_cpu))
        if made is not None and set(made) != set(on_cpu):
            graph_def, outputs = preoptimized_graph_def(concrete_function, memory_optimizer=False)
            graph_def = _with_accumulators(graph_def, made, sorted(on_cpu))
            graph = _graph_of(concrete_function, graph_def, outputs)
            on_cpu = _cpu_accumulations(graph, default_device)
    observed, why = None, ("no call of the step to observe (tflms.function and the Keras callback observe their "
                           "first call)")
    if on_cpu and observe is not None:
        unpinned = compat.mark_grappler_done(tf_io.to_concrete_function(graph, concrete_function, name=name))
        try:
            observed = dict(observe(unpinned, on_cpu))
        except TflmsError as err:
            why = f"not observed: {err}"
            logger.warning("tflms: could not observe the order in which TensorFlow's executor sums %d grappler "
                           "accumulator(s) on this CPU (%s); assuming its usual order, so training may differ from the "
                           "original in the last bits (docs/design.md, 'Exceptions to bitwise')", len(on_cpu), err)
    pins = pin_accumulations(graph, default_device, observed, why=why)
    if pins:
        logger.debug("tflms: pinned the summation order of %d grappler accumulator(s): %s", len(pins),
                     ", ".join(f"{p.result} ({p.source})" for p in pins))
    new = compat.mark_grappler_done(tf_io.to_concrete_function(graph, concrete_function, name=name))
    _PINS[new] = pins
    logger.debug("tflms: grappler took %s from %d to %d nodes", concrete_function.graph.name,
                 len(concrete_function.graph.get_operations()), len(graph_def.node))
    return new, bool(on_cpu) and observe is None  # a failed observation is not tried again


def _cpu_accumulations(graph, default_device: str) -> dict[str, list[str]]:
    """``{accumulator: its AssignAdd names}`` of the accumulators in ``graph`` that are not on a GPU."""
    return {result.name: [a.name for a in adds] for result, adds in _accumulations(graph)
            if not _on_gpu(result, default_device)}


def _graph_of(concrete_function, graph_def, outputs):
    """The IR of a pre-optimized ``graph_def`` of ``concrete_function``, with its signature."""
    graph = tf_io.from_graph_def(graph_def)
    graph.signature = dataclasses.replace(tf_io.signature_of(concrete_function), output_names=outputs)
    return graph


def _may_accumulate(graph, default_device: str) -> bool:
    """Whether ``graph`` has an ``AddN`` off the GPU that grappler's memory optimizer could turn into an
    accumulator (one of more than two inputs)."""
    return any(op.type == "AddN" and len(op.inputs) > 2 and not _on_gpu(op, default_device) for op in graph.ops)


def _made_by_instantiation(concrete_function, ran: RanCheck, pre_pass_made: bool) -> Mapping[str, Sequence[Any]] | None:
    """The accumulators TensorFlow's own instantiation of ``concrete_function`` makes (``{result: its nodes}``), or
    ``None`` when that cannot be learned: logged as a warning where the pre-pass made one (its summation order is
    then a guess), else as information (most such steps get none)."""
    try:
        return ran(concrete_function)
    except TflmsError as err:
        logger.log(logging.WARNING if pre_pass_made else logging.INFO,
                   "tflms: could not learn which grappler accumulators TensorFlow itself makes of this step (%s); "
                   "keeping the pre-pass's (%s), so training may not be bitwise like the original's (an accumulator "
                   "sums in another order; docs/design.md, 'Exceptions to bitwise')", err,
                   "some" if pre_pass_made else "none")
        return None


def _with_accumulators(graph_def, made: Mapping[str, Sequence[Any]], pre_pass: Sequence[str]):
    """``graph_def`` (pre-optimized without the memory optimizer) with the accumulators TensorFlow's instantiation
    made (``made``: ``{result: its nodes}``) in place of their ``AddN`` s.

    The memory optimizer decides from a schedule grappler's cost model predicts, and differences too small to
    remove between the pre-pass and instantiation (argument names, the feeds' costs) move that schedule's peak: on
    one machine the pre-pass made an accumulator that instantiation did not (issue 30), on another instantiation
    made one the pre-pass did not (keras.applications ResNet50 at 96x96 in ``fit``). So where they differ, the
    step is pre-optimized without the memory optimizer and given instantiation's own nodes (their names, attributes
    and inputs as TensorFlow ran them; each placed where its ``AddN`` was). An accumulator whose ``AddN`` is not
    there with the same inputs is left out (logged): that step may not train bitwise like the original.
    """
    from tensorflow.core.framework import graph_pb2
    nodes = {n.name: n for n in graph_def.node}
    grafts, refused = {}, []
    for result, group in made.items():
        addn = nodes.get(result)
        adds = [n for n in group if n.op == "AssignAdd"]
        inputs = sorted(i for i in addn.input if not i.startswith("^")) if addn is not None else None
        outside = {i.lstrip("^").split(":")[0] for n in group for i in n.input} - {n.name for n in group}
        if (addn is None or addn.op != "AddN" or inputs != sorted(n.input[1] for n in adds)
                or not outside <= set(nodes)):
            refused.append(result)
            continue
        grafts[result] = group
    if refused:
        logger.warning("tflms: TensorFlow's own run of this step sums %d AddN(s) in a grappler accumulator that the "
                       "pre-optimized step does not have with the same inputs (%s); they stay AddNs, so training may "
                       "not be bitwise like the original's (docs/design.md, 'Exceptions to bitwise')", len(refused),
                       ", ".join(sorted(refused)[:3]))
    logger.info("tflms: grappler's accumulators as TensorFlow's own run of the step made them: %s (the pre-pass "
                "made %s)", ", ".join(sorted(grafts)) or "none", ", ".join(pre_pass) or "none")
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)  # (versions, library and the rest as they were)
    del out.node[:]
    for node in graph_def.node:
        for copy in grafts.get(node.name, (node,)):
            added = out.node.add()
            added.CopyFrom(copy)
            if copy is not node:
                added.device = node.device
                added.attr.pop("_XlaHasReferenceVars", None)  # (instantiation marks every node it runs so)
    return out


def _accumulations(graph):
    """Grappler's ``AddN`` accumulators: ``(DestroyTemporaryVariable op, its AssignAdd ops)``.

    The ``AssignAdd`` s come in graph order, which is the order of the zeroing
    ``Assign``'s out-edges when TensorFlow builds the graph it runs.
    """
    position = {op.name: i for i, op in enumerate(graph.ops)}
    for op in graph.ops:
        if op.type != ACCUMULATOR_RESULT_TYPE or not op.inputs:
            continue
        adds = [graph.op(c) for c in op.control_inputs if graph.op(c).type == "AssignAdd"]
        if adds and all(a.inputs and a.inputs[0] == op.inputs[0] for a in adds):
            yield op, sorted(adds, key=lambda a: position[a.name])


def _on_gpu(result, default_device: str) -> bool:
    return "GPU" in (result.device or default_device).upper()


def pin_accumulations(graph, default_device: str, observed: Mapping[str, Sequence[str]] | None = None, *,
                      why: str = "") -> tuple[AccumulatorPin, ...]:
    """Fix the order in which each grappler accumulator adds its inputs (in place); returns how each was pinned.

    When an ``AddN`` of more than two inputs is live at the device's estimated peak
    and that peak passes 80% of the device's memory, grappler's memory optimizer
    (``SchedulingPass`` in ``memory_optimizer.cc``) turns it into a temporary
    variable, a zeroing ``Assign`` and one ``AssignAdd`` per input (use_locking),
    with nothing ordering the ``AssignAdd`` s: the sum is taken in the order they
    run, which TensorFlow's executor (``ScheduleReady``) decides. Swaps change when
    the inputs are ready, so the rewritten step would sum in another order
    (different bits); control edges make it sum in the user's order whatever the
    swaps do. On a GPU the kernels are inexpensive and run inline in graph order
    (the order of the ``Assign``'s out-edges). On a CPU the executor rates each
    kernel by the cycles it took before and sends the expensive ones to its thread
    pool, so the order is the machine's: ``observed`` (``{accumulator: AssignAdd
    names in the order they ran}``, :mod:`tflms.measure.accumulations`) gives it;
    without it the usual one is assumed (all expensive and ready together: the last
    runs inline, the pool's worker takes the rest last-in first-out, so reverse
    graph order), ``why`` saying why nothing was observed. With more inter-op
    threads the user's own step may race (docs/design.md, "Exceptions to bitwise").
    """
    pins = []
    for result, adds in _accumulations(graph):
        names = [a.name for a in adds]
        seen = list((observed or {}).get(result.name, ()))
        if _on_gpu(result, default_device):
            pin = AccumulatorPin(result.name, tuple(names), ORDER_GPU_INLINE)
        elif seen:
            if sorted(seen) != sorted(names):
                raise GraphError(f"the observed order of accumulator {result.name!r} names {sorted(seen)}, but its "
                                 f"AssignAdds are {sorted(names)}")
            racy = result.name in getattr(observed, "racy", ())
            pin = AccumulatorPin(result.name, tuple(seen), ORDER_OBSERVED_RACY if racy else ORDER_OBSERVED,
                                 "the observed calls summed in different orders: the plain step races too"
                                 if racy else "")
        else:
            pin = AccumulatorPin(result.name, tuple(names[::-1]), ORDER_CPU_POOL, why)
        for earlier, later in zip(pin.order, pin.order[1:]):
            graph.add_control_input(later, earlier)
        pins.append(pin)
    return tuple(pins)


def run_preoptimized(rewritten, source):
    """BUILD: make ``rewritten`` (built from :func:`preoptimize`'s ``source``) run with grappler off.

    Returns ``rewritten``. When ``source`` was not pre-optimized (XLA), nothing changes.
    """
    if compat.is_grappler_done(source):
        compat.mark_grappler_done(rewritten)
    return rewritten
