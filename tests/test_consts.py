"""Integer constants folded in the IR, and the transposes they show to be views (tflms.ir.consts)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from tflms.ir.consts import int_values, is_view_transpose  # noqa: E402
from tflms.ir.graph import TensorRef  # noqa: E402
from tflms.ir.tf_io import load_graph  # noqa: E402


def _graph():
    @tf.function
    def step(x, w, y, z):
        # Keras Dense on a rank-3 input of unknown batch: tensordot transposes x and w by identity permutations
        dense = tf.tensordot(x, w, [[2], [0]])
        heads = tf.transpose(tf.reshape(dense, (-1, 16, 4, 8)), [0, 2, 1, 3])  # attention heads: data moves
        moved = tf.transpose(y, [2, 1, 0, 3])  # (1, 4, 1, 5): only dimensions of size 1 move
        kept = tf.transpose(z, [1, 0])  # (3, 2): a true transpose
        return heads, moved, kept

    return load_graph(step.get_concrete_function(
        tf.TensorSpec((None, 16, 32)), tf.TensorSpec((32, 32)), tf.TensorSpec((1, 4, 1, 5)), tf.TensorSpec((3, 2))),
        batch_size=8)


def test_view_transposes():
    graph = _graph()
    transposes = {op.name: is_view_transpose(graph, op) for op in graph if op.type == "Transpose"}
    views = {name for name, view in transposes.items() if view}
    assert any("Tensordot" in name for name in views), transposes
    assert sum(1 for name in transposes if "Tensordot" not in name and transposes[name]) == 1, transposes  # moved
    assert len(transposes) - len(views) == 2, transposes  # the heads and the 2-D transpose move data
    for name in views:
        perm = int_values(graph, graph.op(name).inputs[1])
        assert perm is not None and len(perm) in (2, 3, 4)


def test_a_view_transpose_is_priced_as_the_view_it_is():
    """No time and no buffer of its own, on every clock; a true transpose keeps both."""
    from tflms.sim import SimOptions, get_profile, simulate
    graph = _graph()
    views = [op.name for op in graph if is_view_transpose(graph, op)]
    moving = [op.name for op in graph if op.type == "Transpose" and op.name not in views]
    for clock in ("serial", "graph", "xla"):
        result = simulate(graph, get_profile("h200-141gb"), options=SimOptions(clock=clock))
        took = {r.name: r.end_s - r.start_s for r in result.ops}
        assert all(took.get(v, 0.0) == 0.0 for v in views), (clock, {v: took.get(v) for v in views})
        for v in views:
            assert result.buffer_owner.get(f"{v}:0") is not None, (clock, v)  # shares its input's buffer
        assert all(f"{m}:0" not in result.buffer_owner and took[m] > 0 for m in moving), clock


def test_int_values_folds_consts_concat_pack_and_identity():
    @tf.function
    def f():
        a = tf.constant([0, 1], tf.int32)
        b = tf.constant([2], tf.int32)
        c = tf.identity(tf.concat([a, b], 0))
        d = tf.stack([tf.constant(3, tf.int64), tf.constant(4, tf.int64)])
        e = tf.fill([3], 7)
        return c, d, e

    graph = load_graph(f.get_concrete_function())
    outputs = {op.type: op for op in graph}
    concat = next(op for op in graph if op.type == "ConcatV2")
    assert int_values(graph, TensorRef(concat.name, 0)) == (0, 1, 2)
    pack = next(op for op in graph if op.type == "Pack")
    assert int_values(graph, TensorRef(pack.name, 0)) == (3, 4)
    fill = next(op for op in graph if op.type == "Fill")  # computed at run time: not folded
    assert int_values(graph, TensorRef(fill.name, 0)) is None
    assert outputs
