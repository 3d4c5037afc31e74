"""Small integer constants the IR folds without TensorFlow, and the transposes they show to be views (issue 46).

Keras's ``Dense`` on a rank-3 input runs ``tf.tensordot``, which transposes its operands by a permutation it builds
with ``ConcatV2`` of constants; for the usual axes that permutation is the identity. TensorFlow's ``TransposeOp``
hands back its input for a 0-D, 1-D or identity transpose, and shares the input's buffer where the dimensions of size
other than 1 keep their order (``NonSingletonDimensionsAlign``, tensorflow/core/kernels/transpose_op.cc); XLA's
algebraic simplifier turns the same transposes into bitcasts. Either way no kernel runs and no buffer is made: the
simulator prices such a transpose as the view it is (:func:`is_view_transpose`): 72 of BERT-base's 264.
"""

from __future__ import annotations

import math

import numpy as np

from tflms.ir.graph import Graph, Op, TensorRef

#: How many ops deep :func:`int_values` folds.
MAX_DEPTH = 8
#: TensorFlow's ``DataType`` numbers of the integer types folded.
_DT_INT32, _DT_INT64 = 3, 9


def int_values(graph: Graph, ref: TensorRef, depth: int = MAX_DEPTH) -> tuple[int, ...] | None:
    """The values of the integer vector (or scalar) ``ref``, where ``Const`` s joined by ``ConcatV2``, ``Pack`` and
    ``Identity`` make it; ``None`` otherwise."""
    op = graph.op(ref.op)
    if depth < 0:
        return None
    if op.type == "Const":
        return _const_ints(op)
    if op.type == "Identity" and op.inputs:
        return int_values(graph, op.inputs[0], depth - 1)
    if op.type in ("ConcatV2", "Pack") and op.inputs:
        parts = op.inputs[:-1] if op.type == "ConcatV2" else op.inputs
        values: list[int] = []
        for part in parts:
            got = int_values(graph, part, depth - 1)
            if got is None:
                return None
            values.extend(got)
        return tuple(values)
    return None


def _const_ints(op: Op) -> tuple[int, ...] | None:
    attrs = op.attrs
    if attrs is None or "value" not in attrs:
        return None
    tensor = attrs["value"].tensor
    if tensor.dtype not in (_DT_INT32, _DT_INT64):
        return None
    count = math.prod(d.size for d in tensor.tensor_shape.dim)
    if tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype=np.int32 if tensor.dtype == _DT_INT32 else np.int64)
        return tuple(int(v) for v in values)
    listed = list(tensor.int_val if tensor.dtype == _DT_INT32 else tensor.int64_val)
    if len(listed) == 1 and count > 1:  # (a splat: one value for every element)
        listed *= count
    return tuple(listed) if len(listed) == count else None


def is_view_transpose(graph: Graph, op: Op) -> bool:
    """Whether ``op`` is a ``Transpose`` that moves no data (module doc): of rank 0 or 1, by the identity, or moving
    only dimensions of size 1, its permutation folded by :func:`int_values`."""
    if op.type != "Transpose" or len(op.inputs) != 2:
        return False
    perm = int_values(graph, op.inputs[1])
    if perm is None:
        return False
    shape = graph.tensor(op.inputs[0]).shape
    if shape is not None and len(shape) != len(perm):
        return False
    rank = len(perm)
    perm = tuple(p + rank if p < 0 else p for p in perm)
    if rank <= 1 or perm == tuple(range(rank)):
        return True
    if shape is None:
        return False
    moved = [p for p in perm if shape[p] != 1]  # (an unknown dimension counts as one that is not 1)
    return moved == sorted(moved)
