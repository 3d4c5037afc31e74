"""Static shapes as constants where grappler is off (the XLA path, issue 47): a shape's reader stops reading the tensor.

Traced without grappler, as a step that keeps XLA is (:mod:`tflms.pipeline`), the training step keeps every
``Shape``, ``ShapeN``, ``Size`` and ``Rank`` its gradients take of forward activations (ResNet-50: 462, BERT-base:
708). XLA folds them inside a cluster, but TensorFlow still hands the cluster the tensor whose shape it reads, so
the tensor lives until that cluster runs; and a swap policy sees a reader in the backward pass and copies the whole
tensor back from the host, with no trigger, for its shape (66-133 GiB of each ResNet-50 hybrid's copies at batch
7392 on the H200: docs/design.md, "Readers of a shape").

:func:`materialize_shapes` makes each such op whose input's shape is fully known a ``Const`` of the value it would
compute: what grappler's constant folding does on the path without XLA (``ConstantFolding::MaterializeShapes``,
tensorflow/core/grappler/optimizers/constant_folding.cc: a ``Shape``, ``Size`` or ``Rank`` becomes a ``Const`` in
place, name and device kept; each output of a ``ShapeN`` a ``Const`` of its own), and what XLA does inside a
cluster. The values are exact integers, so the step computes the same bits. Unlike grappler, no control edge from
the tensor's producer is kept: the step has no control flow (tflms refuses it), so every constant runs where the
reader ran.

Only shapes known when the step was traced are materialized (``TensorInfo.shape``): a step traced with an unknown
batch runs at every batch, and a constant would be wrong at all but one. A caller that prices one batch
(``resolved=True``: the benchmarks) materializes the batch it prices too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tflms.ir.graph import Graph, TensorInfo, TensorRef
from tflms.ir.op_types import METADATA_ONLY_TYPES
from tflms.passes.result import PassResult


def _value(op_type: str, info: TensorInfo, resolved: bool) -> list[int] | int | None:
    """What ``op_type`` (a :data:`~tflms.ir.op_types.METADATA_ONLY_TYPES`) computes of a tensor with ``info``, or
    ``None`` where its shape is not known."""
    shape = info.resolved_shape if resolved else info.shape
    if shape is None:
        return None
    if op_type == "Rank":
        return len(shape)
    if any(d is None for d in shape):
        return None
    if op_type == "Size":
        return math.prod(shape)
    return list(shape)


def _const_attrs(value: list[int] | int, dtype: str) -> dict:
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    dt = tf.as_dtype(dtype)
    return {"dtype": attr_value_pb2.AttrValue(type=dt.as_datatype_enum),
            "value": attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(np.asarray(value, dt.as_numpy_dtype)))}


def materialize_shapes(graph: Graph, *, resolved: bool = False,
                       only: Callable[[str], bool] | None = None) -> PassResult:
    """A copy of ``graph`` whose shape readers of known shapes are constants (module doc); the report is the names
    of the ops that became constants (a ``ShapeN``'s name where any of its outputs did). ``resolved``: take an
    unknown leading dimension as the batch the graph is sized for (``TensorInfo.batch_size``); ``only(name)``: which
    readers may become constants (default: all)."""
    readers = [op.name for op in graph if op.type in METADATA_ONLY_TYPES and (only is None or only(op.name))]
    if not readers:
        return PassResult(graph, changed=False, report=())
    new = graph.copy()
    done: list[str] = []
    for name in readers:
        op = new.op(name)
        values = [_value(op.type, new.tensor(ref), resolved) for ref in op.inputs]
        if op.type != "ShapeN":
            if len(values) != 1 or values[0] is None:
                continue
            new.drop_inputs(name)
            op.type, op.attrs, op.node_def = "Const", _const_attrs(values[0], op.outputs[0].dtype), None
            done.append(name)
            continue
        for k, value in enumerate(values):
            out = TensorRef(name, k)
            readers_k = new.consumers(out)
            if value is None or not readers_k:
                continue
            const = new.add_op(f"{name}/materialized_{k}", "Const", device=op.device,
                               control_inputs=op.control_inputs, attrs=_const_attrs(value, op.outputs[k].dtype),
                               outputs=[op.outputs[k]])
            for reader, index in readers_k:
                new.set_input(reader, index, const.output(0))
            if name not in done:
                done.append(name)
        if name in done and not any(new.consumers(TensorRef(name, k)) for k in range(len(op.outputs))) \
                and not new.control_consumers(name):
            new.remove_op(name)
    if not done:
        return PassResult(graph, changed=False, report=())
    new.lint()
    return PassResult(new, changed=True, report=tuple(done))


def materialize_gradient_shapes(graph: Graph, *, resolved: bool = False) -> PassResult:
    """:func:`materialize_shapes` of the backward pass's shape readers only (the gradient code's: ResNet-50 460 of
    462, BERT-base 597 of 708), what the XLA path runs. A forward shape reader (Keras's reshapes of the attention
    heads) runs beside its tensor in the forward pass and brings nothing back; but the levels TFLMS's distance rules
    count run through its chain. Made constants too, BERT-base's levels shrink from 2353 to 2052, and the distance
    rule's plan for it in mixed_bfloat16 at 3360 on the H200 (threshold 26) peaks at 1376 GiB instead of 137, its
    forward pass far ahead of its swap-outs; the bench's tflms-xla maximum there fell from 4950 to 2730 (why that
    plan fails was not analysed further; scratch figures, docs/design.md, "Readers of a shape")."""
    from tflms.analysis.cto import Category, analyze_graph
    if not any(op.type in METADATA_ONLY_TYPES for op in graph):
        return PassResult(graph, changed=False, report=())
    categories = analyze_graph(graph).categories
    return materialize_shapes(graph, resolved=resolved, only=lambda name: categories[name] is Category.BACKWARD)
