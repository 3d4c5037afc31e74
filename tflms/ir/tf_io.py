"""Reading TensorFlow graphs into the IR and writing them back.

Sources: a ``tf.function`` (with example arguments), a ``ConcreteFunction``, a
``GraphDef`` or a ``FunctionDef``. Dtypes and static shapes come from
TensorFlow's own shape inference (the graph is imported into a scratch
``tf.Graph`` when it does not come from one).

Writing back an unmodified IR reproduces every ``NodeDef`` (type, device,
inputs, control inputs, attributes) and the function library, so the graph runs
bitwise-identically to the original.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorInfo, TensorRef

logger = logging.getLogger(__name__)

#: NodeDef attributes that mark ops grappler must keep (TF1's protection).
DO_NOT_REMOVE_ATTR = "_grappler_do_not_remove"


@dataclasses.dataclass(frozen=True)
class FunctionSignature:
    """How a traced function's graph meets its caller.

    ``input_names``: placeholder op names in the order of ``FuncGraph.inputs``
    (arguments first, then one per captured tensor); ``num_captures`` of them
    are captures. ``output_names``: tensor names of ``FuncGraph.outputs``.
    ``control_output_names``: ops the function must run (stateful updates).
    """

    input_names: tuple[str, ...]
    num_captures: int
    output_names: tuple[str, ...]
    control_output_names: tuple[str, ...]


def _tf():
    import tensorflow as tf  # imported lazily: tflms.ir.graph must not need TF
    return tf


def _tensor_info(tf_tensor, batch_size: int | None, real_dtype: str | None = None) -> TensorInfo:
    """``real_dtype``: the dtype of a surrogate's output (:mod:`tflms.ir.surrogates`), else the tensor's own."""
    tf = _tf()
    dtype = tf_tensor.dtype if real_dtype is None else tf.as_dtype(real_dtype)
    shape = tf_tensor.shape
    dims = None if shape.rank is None else tuple(shape.as_list())
    num_bytes = None
    if dims is not None and dtype not in (tf.resource, tf.variant, tf.string):
        num_bytes = dtype.size
        for d in dims:
            num_bytes = None if d is None or num_bytes is None else num_bytes * d
    info = TensorInfo(dtype=dtype.name, shape=dims, num_bytes=num_bytes)
    return info.with_batch_size(batch_size) if batch_size is not None else info


def _split_input(name: str) -> tuple[bool, str]:
    return (True, name[1:]) if name.startswith("^") else (False, name)


def from_tf_graph(tf_graph, graph_def=None, *, batch_size: int | None = None,
                  real_dtypes: Mapping[tuple[str, int], str] | None = None) -> Graph:
    """Read ``tf_graph`` (a ``tf.Graph``) into the IR.

    ``graph_def`` (default ``tf_graph.as_graph_def()``) supplies the NodeDefs in
    order; ``tf_graph`` supplies dtypes and static shapes. An unknown leading
    dimension counts as ``batch_size`` when computing byte sizes.
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise GraphError(f"batch_size must be a positive int, got {batch_size!r}")
    if graph_def is None:
        graph_def = tf_graph.as_graph_def()
    graph = Graph(library=graph_def.library if graph_def.HasField("library") else None,
                  versions=graph_def.versions if graph_def.HasField("versions") else None)
    pending_ctrl: list[tuple[str, str]] = []
    # NodeDefs may list inputs before their producers: add ops first, then wire.
    wiring: list[tuple[str, list[str]]] = []
    for node in graph_def.node:
        try:
            tf_op = tf_graph.get_operation_by_name(node.name)
        except KeyError:
            raise GraphError(f"node {node.name!r} is in the GraphDef but not in the TF graph") from None
        outputs = tuple(_tensor_info(t, batch_size, (real_dtypes or {}).get((node.name, k)))
                        for k, t in enumerate(tf_op.outputs))
        graph.add_op(node.name, node.op, device=node.device, attrs=node.attr, outputs=outputs, node_def=node)
        wiring.append((node.name, list(node.input)))
    for name, inputs in wiring:
        for raw in inputs:
            is_ctrl, src = _split_input(raw)
            if is_ctrl:
                pending_ctrl.append((name, src))
            else:
                graph.append_input(name, TensorRef.parse(src))
    for name, src in pending_ctrl:
        graph.add_control_input(name, src)
    graph.fill_alias_bytes()
    return graph


def from_graph_def(graph_def, *, batch_size: int | None = None) -> Graph:
    """Read a ``GraphDef``; it is imported into a scratch graph for shapes."""
    from tflms.ir.surrogates import importable, real_dtypes
    tf = _tf()
    scratch = tf.Graph()
    # nodes grappler made that the importer refuses (oneDNN's bfloat16 fusions) are read through surrogates
    imported, surrogates = importable(graph_def)
    with scratch.as_default():
        try:
            tf.graph_util.import_graph_def(imported, name="")
        except (ValueError, tf.errors.OpError) as err:
            raise GraphError(f"TensorFlow cannot import this GraphDef: {err}. Check that every op is "
                             "registered in this TensorFlow build and that inputs name existing nodes") from err
    return from_tf_graph(scratch, graph_def, batch_size=batch_size, real_dtypes=real_dtypes(surrogates))


def from_function_def(function_def, *, batch_size: int | None = None,
                      input_shapes: Sequence[Any] | None = None) -> Graph:
    """Read a ``FunctionDef``; its arguments become placeholders.

    ``input_shapes`` (one ``TensorShape``-like per argument) fills in argument
    shapes the FunctionDef does not record.
    """
    from tflms._compat.tf import function_def_to_graph
    try:
        func_graph = function_def_to_graph(function_def, input_shapes=input_shapes)
    except Exception as err:  # TF raises several types here
        raise GraphError(f"cannot read FunctionDef {function_def.signature.name!r}: {err}") from err
    graph = from_tf_graph(func_graph, batch_size=batch_size)
    graph.signature = _signature_of(func_graph, num_captures=0)
    return graph


def _signature_of(func_graph, num_captures: int) -> FunctionSignature:
    return FunctionSignature(
        input_names=tuple(t.op.name for t in func_graph.inputs),
        num_captures=num_captures,
        output_names=tuple(t.name for t in func_graph.outputs),
        control_output_names=tuple(op.name for op in func_graph.control_outputs),
    )


def signature_of(concrete_function) -> FunctionSignature:
    """The :class:`FunctionSignature` of a ``ConcreteFunction``."""
    return _signature_of(concrete_function.graph, num_captures=len(concrete_function.captured_inputs))


def from_concrete_function(concrete_function, *, batch_size: int | None = None) -> Graph:
    """Read a ``ConcreteFunction``'s graph and remember its signature."""
    from tflms.ir.surrogates import BUILT, real_dtypes, restore_ir
    func_graph = concrete_function.graph
    surrogates = BUILT.get(concrete_function)  # built by tflms with surrogates (tflms.ir.surrogates): the real nodes
    graph = from_tf_graph(func_graph, batch_size=batch_size, real_dtypes=real_dtypes(surrogates or []))
    graph.signature = _signature_of(func_graph, num_captures=len(concrete_function.captured_inputs))
    if surrogates:
        renamed = restore_ir(graph, surrogates)
        graph.signature = dataclasses.replace(graph.signature, output_names=tuple(
            renamed.get(n, n) for n in graph.signature.output_names))
    graph.resource_bytes = _variable_bytes(concrete_function)
    return graph


def _variable_bytes(concrete_function) -> dict[str, int]:
    """Bytes of each captured variable, keyed by its placeholder's tensor name."""
    by_handle = {}
    try:
        variables = concrete_function.graph.variables
    except AssertionError as err:  # TF's message for variables that were garbage-collected
        raise GraphError(f"the variables of {concrete_function.graph.name!r} have been deleted: keep a reference "
                         "to the model and optimizer while tflms reads the step") from err
    for var in variables:
        handle = getattr(var, "handle", None)
        if handle is not None and var.shape.is_fully_defined():
            by_handle[id(handle)] = var.shape.num_elements() * var.dtype.size
    sizes = {}
    for external, internal in concrete_function.graph.captures:
        if id(external) in by_handle:
            sizes[internal.name] = by_handle[id(external)]
    return sizes


def to_graph_def(graph: Graph):
    """Write the IR as a ``GraphDef`` (NodeDefs in IR order)."""
    from tensorflow.core.framework import graph_pb2
    graph_def = graph_pb2.GraphDef()
    if graph.versions is not None:
        graph_def.versions.CopyFrom(graph.versions)
    if graph.library is not None:
        graph_def.library.CopyFrom(graph.library)
    for op in graph:
        node = graph_def.node.add()
        if op.node_def is not None:
            node.CopyFrom(op.node_def)
            del node.input[:]
        else:
            for key, value in op.attrs.items():
                node.attr[key].CopyFrom(value)
        node.name, node.op, node.device = op.name, op.type, op.device
        node.input.extend(ref.op if ref.index == 0 else ref.name for ref in op.inputs)
        node.input.extend("^" + src for src in op.control_inputs)
    return graph_def


def to_concrete_function(graph: Graph, original, *, extra_control_outputs: Sequence[str] = (),
                         name: str | None = None, keep_must_compile: bool = True, must_compile: bool = False):
    """Build a ``ConcreteFunction`` that runs ``graph`` in place of ``original``.

    ``graph`` must come from :func:`from_concrete_function` of ``original`` (or a
    rewrite of it). The new function captures the same variables, so running it
    updates the caller's model. ``extra_control_outputs`` (e.g. swap nodes) are
    made control outputs so that grappler keeps them. ``keep_must_compile=False``
    leaves ``original``'s ``_XlaMustCompile`` out (a step whose ops carry their own
    XLA clusters, :mod:`tflms.passes.xla_clusters`, must not be compiled whole); ``must_compile=True`` sets it (the
    function compiled whole by XLA, as ``jit_compile=True`` compiles it).
    """
    tf = _tf()
    from tensorflow.core.framework import attr_value_pb2

    from tflms._compat import tf as compat
    handle_data_util = compat.handle_data_util()

    sig: FunctionSignature | None = graph.signature
    if sig is None:
        raise GraphError("this IR graph was not read from a ConcreteFunction; use to_graph_def instead")
    old_graph = original.graph
    from tflms.ir.surrogates import BUILT, CAST_OUT, importable, restore_function_def
    graph_def, surrogates = importable(to_graph_def(graph))  # see tflms.ir.surrogates
    _register_library(graph_def)
    new_graph = compat.func_graph_class()(name or f"{old_graph.name}_lms")
    num_args = len(sig.input_names) - sig.num_captures
    with new_graph.as_default():
        args = [tf.compat.v1.placeholder(t.dtype, t.shape, name=t.op.name)
                for t in old_graph.inputs[:num_args]]
        for new_t, old_t in zip(args, old_graph.inputs[:num_args]):
            if old_t.dtype == tf.resource:  # the variable's dtype/shape, for shape inference during the import
                handle_data_util.copy_handle_data(old_t, new_t)
        captures = [new_graph.capture(h) for h in original.captured_inputs]
        # The argument placeholders are not imported (a copy under an input_map would stay in the function as an
        # unused op, which runs when grappler is off); references to them are mapped to the new ones.
        input_names = set(sig.input_names)
        refs = [_split_input(i) for n in graph_def.node for i in n.input]
        used = {src.split(":")[0] for is_ctrl, src in refs if not is_ctrl}
        used_as_control = {src for is_ctrl, src in refs if is_ctrl}  # e.g. grappler's constant folding adds some
        kept = [n for n in graph_def.node if n.name not in input_names]
        # Colocation with an argument becomes colocation with its new placeholder, set after the import (the
        # importer only accepts colocation with nodes of the imported GraphDef).
        renamed = {name: t.op.name for name, t in zip(sig.input_names, args + captures)}
        colocations = {}
        for node in kept:
            groups = list(node.attr["_class"].list.s) if "_class" in node.attr else []
            if any(g.startswith(b"loc:@") and g[5:].decode() in renamed for g in groups):
                colocations[node.name] = [_colocated_with(g, renamed) for g in groups]
                del node.attr["_class"]
        del graph_def.node[:]
        graph_def.node.extend(kept)
        input_map = {name + ":0": t for name, t in zip(sig.input_names, args + captures) if name in used}
        input_map.update({"^" + name: t for name, t in zip(sig.input_names, args + captures)
                          if name in used_as_control})
        # a surrogate's output the function returns is returned through its cast back (its real dtype)
        outputs_of = {f"{o.node}:{index}": f"{o.node}{CAST_OUT}{index}:0" for o in surrogates for index, *_ in o.outputs}
        wanted = ([outputs_of.get(n if ":" in n else n + ":0", n) for n in sig.output_names]
                  + list(sig.control_output_names) + list(extra_control_outputs))
        own = {name + ":0": t for name, t in zip(sig.input_names, args + captures)}  # returned arguments
        to_import = [w for w in wanted if w.split(":")[0] not in input_names]
        try:
            found = tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=to_import,
                                                   name="")
        except (ValueError, tf.errors.OpError) as err:
            raise GraphError(f"TensorFlow rejected the rewritten graph: {err}") from err
        by_wanted = dict(zip(to_import, found))
        for op_name, groups in colocations.items():
            new_graph.get_operation_by_name(op_name)._set_attr(  # noqa: SLF001 - no public setter
                "_class", attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=groups)))
        imported = [by_wanted[w] if w in by_wanted else own[w if ":" in w else w + ":0"] for w in wanted]
    outputs = imported[:len(sig.output_names)]
    control_outputs = imported[len(sig.output_names):]
    # By position: a pre-optimized graph (tflms.grappler) may return other tensors than the traced graph did.
    by_name = dict(zip((t.name for t in old_graph.outputs), outputs))

    def _swap(t):
        if isinstance(t, (tf.Tensor,)) and t.name in by_name:
            return by_name[t.name]
        return t

    new_graph.inputs = args + captures
    new_graph.outputs = list(outputs)
    new_graph.control_outputs = list(control_outputs)
    new_graph.structured_input_signature = old_graph.structured_input_signature
    new_graph.structured_outputs = tf.nest.map_structure(_swap, old_graph.structured_outputs, expand_composites=True)
    new_graph.variables = old_graph.variables
    attrs = {k: v for k, v in _function_attrs(original).items() if keep_must_compile or k != "_XlaMustCompile"}
    if must_compile:
        attrs["_XlaMustCompile"] = attr_value_pb2.AttrValue(b=True)
    new = compat.concrete_function_from_func_graph(new_graph, original.function_type, attrs)
    if surrogates:  # the real nodes back in the FunctionDef the runtime instantiates at the first call
        compat.replace_function_def(new, restore_function_def(new.function_def, surrogates))
        BUILT[new] = surrogates
    # Signatures (e.g. tf.saved_model.save(signatures=...)) call by keyword: keep the keyword names.
    new._arg_keywords = getattr(original, "_arg_keywords", None)  # noqa: SLF001
    new._num_positional_args = getattr(original, "_num_positional_args", None)  # noqa: SLF001
    return new


def _colocated_with(group: bytes, renamed: Mapping[str, str]) -> bytes:
    """A ``_class`` entry (``b"loc:@name"``) with ``name`` renamed as ``renamed`` says."""
    prefix = b"loc:@"
    if group.startswith(prefix):
        name = group[len(prefix):].decode()
        if name in renamed:
            return prefix + renamed[name].encode()
    return group


def _register_library(graph_def) -> None:
    """Make the graph's library functions known to the eager runtime (e.g. codec functions tflms added)."""
    from tflms._compat.tf import eager_context
    ctx = eager_context()
    for fdef in graph_def.library.function:
        if not ctx.has_function(fdef.signature.name):
            ctx.add_function_def(fdef)


def _function_attrs(original) -> Mapping[str, Any]:
    """Function attributes worth keeping (e.g. ``_XlaMustCompile`` for jit_compile)."""
    kept = {}
    for key in ("_XlaMustCompile", "_noinline"):
        value = original.function_def.attr.get(key) if original.function_def is not None else None
        if value is not None:
            kept[key] = value
    return kept


def is_concrete_function(value: Any) -> bool:
    """Whether ``value`` is a TensorFlow ``ConcreteFunction`` (False without importing TF for IR graphs)."""
    if isinstance(value, Graph):
        return False
    import tensorflow as tf
    return isinstance(value, tf.types.experimental.ConcreteFunction)


def concrete_function_of(source: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``ConcreteFunction`` ``source`` stands for, or ``None`` if it is a graph (IR, GraphDef, FunctionDef...).

    A ``tf.function`` (or a ``tflms.function``) is traced with ``args``/``kwargs``.
    """
    if isinstance(source, Graph):
        return None
    inner = getattr(source, "original_function", None)  # a tflms.function wrapper
    if inner is not None:
        source = inner
    if is_concrete_function(source):
        return source
    if hasattr(source, "get_concrete_function"):
        if not args and not kwargs:
            raise GraphError(f"{getattr(source, '__name__', source)!r} is a tf.function: pass example arguments "
                             "(tensors or tf.TensorSpec) so it can be traced, e.g. analyze(step, x, y)")
        return source.get_concrete_function(*args, **kwargs)
    return None


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

    concrete = concrete_function_of(source, *args, **kwargs)
    if concrete is not None:
        return from_concrete_function(concrete, batch_size=batch_size)
    if isinstance(source, graph_pb2.GraphDef):
        return from_graph_def(source, batch_size=batch_size)
    if isinstance(source, function_pb2.FunctionDef):
        return from_function_def(source, batch_size=batch_size)
    if isinstance(source, tf.Graph):
        return from_tf_graph(source, batch_size=batch_size)
    raise GraphError(f"cannot read a training step from {type(source).__name__}; give a tf.function with example "
                     "arguments, a ConcreteFunction, a GraphDef or a FunctionDef")
