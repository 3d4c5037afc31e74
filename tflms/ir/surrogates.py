"""Nodes TensorFlow runs but its Python importer refuses, carried through an import (issue 45).

Grappler's remapper on a oneDNN CPU fuses bfloat16 ops (``_FusedConv2D`` with ``T=bfloat16``, and others) that the
op's registered definition does not allow: the step runs because the runtime never checks a node's attribute
against its allowed values (oneDNN's layout pass then rewrites the node to its own op, which takes bfloat16), but
``import_graph_def`` does check, and tflms imports the grappler-optimized graph twice: into a scratch graph to read
its shapes (LOAD), and into the function it builds (BUILD).

So each such node is imported as a *surrogate*: the attribute set to an allowed type (float32 where allowed), each
input of that type cast to it and each output cast back, under names no user op has (``<node>/_tflms_cast_in_<k>``,
``<node>/_tflms_cast_out_<k>``). Shapes come out as the real node's. LOAD then records the real dtypes
(:func:`real_dtypes`); BUILD imports the surrogates and, before the function first runs, puts the real node back in
its ``FunctionDef`` and removes the casts (:func:`restore_function_def`): what runs is the grappler-optimized node
exactly as TensorFlow made it, so training stays bitwise.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

#: The suffixes of the casts a surrogate adds (see the module doc).
CAST_IN = "/_tflms_cast_in_"
CAST_OUT = "/_tflms_cast_out_"
_FLOAT = 1  # DT_FLOAT


@dataclasses.dataclass(frozen=True)
class Surrogate:
    """One node imported as a surrogate: ``attrs`` ``{attr: its real type enum}``, ``outputs`` the flat output
    indices cast back, each ``(index, its output arg name, the index within it, its real type)``."""

    node: str
    attrs: dict[str, int]
    proxy: int
    inputs: tuple[int, ...]
    outputs: tuple[tuple[int, str, int, int], ...]


def _op_def(op_type: str):
    from tflms._compat.tf import op_def
    return op_def(op_type)


def _arg_length(arg, node) -> int:
    if arg.number_attr:
        return node.attr[arg.number_attr].i
    if arg.type_list_attr:
        return len(node.attr[arg.type_list_attr].list.type)
    return 1


def refused_attrs(node) -> tuple[Any, dict[str, int], int] | None:
    """``(op def, {type attr: its value}, proxy type)`` for a node whose type attributes its op def does not allow,
    else ``None``."""
    op_def = _op_def(node.op)
    if op_def is None:
        return None
    bad: dict[str, int] = {}
    allowed_all = None
    for attr in op_def.attr:
        if attr.type != "type" or not attr.allowed_values.list.type or attr.name not in node.attr:
            continue
        allowed = list(attr.allowed_values.list.type)
        if node.attr[attr.name].type not in allowed:
            bad[attr.name] = node.attr[attr.name].type
            allowed_all = allowed if allowed_all is None else [t for t in allowed_all if t in allowed]
    if not bad or not allowed_all:
        return None
    return op_def, bad, (_FLOAT if _FLOAT in allowed_all else allowed_all[0])


def importable(graph_def) -> tuple[Any, list[Surrogate]]:
    """``(a copy of graph_def the importer accepts, the surrogates in it)``; ``graph_def`` itself when none."""
    refused = [(node, found) for node in graph_def.node if (found := refused_attrs(node)) is not None]
    if not refused:
        return graph_def, []
    from tensorflow.core.framework import graph_pb2
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    by_name = {n.name: n for n in new.node}
    renamed: dict[str, str] = {}
    surrogates = []
    for original, (op_def, bad, proxy) in refused:
        node = by_name[original.name]
        data = [k for k, i in enumerate(node.input) if not i.startswith("^")]
        inputs, pos = [], 0  # (data input index, its real type)
        for arg in op_def.input_arg:
            n = _arg_length(arg, node)
            if arg.type_attr in bad:
                inputs.extend((pos + j, bad[arg.type_attr]) for j in range(n))
            pos += n
        for k, real in inputs:
            cast = new.node.add()
            cast.name, cast.op, cast.device = f"{node.name}{CAST_IN}{k}", "Cast", node.device
            cast.input.append(node.input[data[k]])
            cast.attr["SrcT"].type, cast.attr["DstT"].type = real, proxy
            node.input[data[k]] = cast.name
        outputs, pos = [], 0
        for arg in op_def.output_arg:
            n = _arg_length(arg, node)
            if arg.type_attr in bad:
                outputs.extend((pos + j, arg.name, j, bad[arg.type_attr]) for j in range(n))
            pos += n
        for index, _, _, real in outputs:
            cast = new.node.add()
            cast.name, cast.op, cast.device = f"{node.name}{CAST_OUT}{index}", "Cast", node.device
            cast.input.append(node.name if index == 0 else f"{node.name}:{index}")
            cast.attr["SrcT"].type, cast.attr["DstT"].type = proxy, real
            renamed[node.name if index == 0 else f"{node.name}:{index}"] = cast.name
            if index == 0:
                renamed[f"{node.name}:0"] = cast.name
        for attr in bad:
            node.attr[attr].type = proxy
        surrogates.append(Surrogate(node.name, dict(bad), proxy, tuple(k for k, _ in inputs), tuple(outputs)))
    cast_outs = set(renamed.values())
    for node in new.node:
        if node.name in cast_outs:  # (reads the surrogate itself; a cast into another surrogate reads the cast)
            continue
        for k, inp in enumerate(node.input):
            if not inp.startswith("^") and inp in renamed:
                node.input[k] = renamed[inp]
    return new, surrogates


def real_dtypes(surrogates: list[Surrogate]) -> dict[tuple[str, int], str]:
    """``{(node, output index): the real dtype name}`` of each surrogate's cast outputs."""
    import tensorflow as tf
    out = {}
    for s in surrogates:
        for index, _, _, real in s.outputs:
            out[(s.node, index)] = tf.as_dtype(real).name
    return out


def restore_function_def(fdef, surrogates: list[Surrogate]):
    """A copy of ``fdef`` (the built function) with each surrogate's real node back and its casts gone."""
    from tensorflow.core.framework import function_pb2
    new = function_pb2.FunctionDef()
    new.CopyFrom(fdef)
    by_node = {s.node: s for s in surrogates}
    cast_in: dict[str, str] = {}  # a cast's tensor name -> the tensor it casts
    cast_out: dict[str, str] = {}
    for node in new.node_def:
        owner, sep, tail = node.name.rpartition("/")
        if node.op != "Cast" or owner not in by_node or not sep:
            continue
        if ("/" + tail).startswith(CAST_IN):
            cast_in[f"{node.name}:y:0"] = node.input[0]
        elif ("/" + tail).startswith(CAST_OUT):
            index = int(tail[len(CAST_OUT) - 1:])
            arg, j = next((a, j) for i, a, j, _ in by_node[owner].outputs if i == index)
            cast_out[f"{node.name}:y:0"] = f"{owner}:{arg}:{j}"
    kept = [n for n in new.node_def if f"{n.name}:y:0" not in cast_in and f"{n.name}:y:0" not in cast_out]
    for node in kept:
        for k, inp in enumerate(node.input):
            inp = cast_in.get(inp, inp)  # (a surrogate reading another surrogate: through both casts)
            node.input[k] = cast_out.get(inp, inp)
        if node.name in by_node:
            for attr, real in by_node[node.name].attrs.items():
                node.attr[attr].type = real
    del new.node_def[:]
    new.node_def.extend(kept)
    for key, value in list(new.ret.items()):
        new.ret[key] = cast_out.get(value, value)
    return new


#: ``{ConcreteFunction: its surrogates}`` for functions built with some (:func:`tflms.ir.tf_io.to_concrete_function`):
#: their FuncGraph holds the surrogates, which reading it back must undo (:func:`restore_ir`).
BUILT: "weakref.WeakKeyDictionary[Any, list[Surrogate]]" = weakref.WeakKeyDictionary()


def restore_ir(graph, surrogates: list[Surrogate]) -> dict[str, str]:
    """Undo the surrogates in an IR read from a FuncGraph built with them, its outputs' dtypes read with
    :func:`real_dtypes` (in place): the real types back on each node's attributes, its inputs read without the casts,
    its readers reading it, the casts gone. Returns ``{a cast's tensor name: the node's}`` for the function's outputs."""
    from tflms.ir.graph import TensorRef
    renamed = {}
    for s in surrogates:
        op = graph.op(s.node)
        for k, inp in enumerate(list(op.inputs)):
            if inp.op.rpartition(CAST_IN)[0] == s.node:
                graph.set_input(s.node, k, graph.op(inp.op).inputs[0])
        for index, *_ in s.outputs:
            cast = f"{s.node}{CAST_OUT}{index}"
            renamed[f"{cast}:0"] = f"{s.node}:{index}"
            for reader, slot in list(graph.consumers(TensorRef(cast, 0))):
                graph.set_input(reader, slot, TensorRef(s.node, index))
        for attr, real in s.attrs.items():
            for holder in (op.attrs, getattr(op.node_def, "attr", None)):
                if holder is not None and attr in holder:
                    holder[attr].type = real
        for name in [o.name for o in graph if o.name.startswith((s.node + CAST_IN, s.node + CAST_OUT))]:
            graph.remove_op(name)
    return renamed
