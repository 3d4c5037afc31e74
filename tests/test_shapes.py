"""Static shapes as constants on the XLA path (tflms/passes/shapes.py): a shape's reader stops reading the tensor,
so no tensor is held or copied back for its shape."""

from __future__ import annotations

import numpy as np
import pytest

from tflms.ir.graph import TensorRef
from tflms.ir.op_types import METADATA_ONLY_TYPES
from tflms.passes.shapes import materialize_shapes
from tflms.testing import GraphBuilder, tensor_info

tf = pytest.importorskip("tensorflow")


def _readers():
    """x (8, 4, 3) read by Shape, Size, Rank and ShapeN(x, u) with u of unknown batch; each result read by an op."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=(8, 4, 3))
    b.op("u", "Placeholder", shape=(None, 5))
    b.op("shape", "Shape", ["x"], shape=(3,), dtype="int32")
    b.op("size", "Size", ["x"], shape=(), dtype="int64")
    b.op("rank", "Rank", ["u"], shape=(), dtype="int32")
    b.op("shape_n", "ShapeN", ["x", "u"], shape=(3,), dtype="int32", num_outputs=2)
    for name, ref in (("r0", "shape"), ("r1", "size"), ("r2", "rank"), ("r3", "shape_n"), ("r4", "shape_n:1")):
        b.op(name, "Identity", [ref], shape=None, dtype="int32")
    g = b.graph
    g.op("shape_n").outputs = (g.op("shape_n").outputs[0], tensor_info((2,), "int32"))
    return g


def _value(graph, name):
    op = graph.op(name)
    assert op.type == "Const" and not op.inputs
    return tf.make_ndarray(op.attrs["value"].tensor)


def test_known_shapes_become_constants_of_what_the_readers_would_compute():
    g = _readers()
    result = materialize_shapes(g)
    new = result.graph
    assert result.changed and result.report == ("shape", "size", "rank", "shape_n")
    np.testing.assert_array_equal(_value(new, "shape"), [8, 4, 3])
    assert _value(new, "shape").dtype == np.int32 and _value(new, "size").dtype == np.int64
    assert _value(new, "size") == 96 and _value(new, "rank") == 2  # a rank is known with an unknown batch
    # the ShapeN's known output is a constant of its own; the unknown one stays with the ShapeN
    assert new.op("r3").inputs == [TensorRef("shape_n/materialized_0", 0)]
    np.testing.assert_array_equal(_value(new, "shape_n/materialized_0"), [8, 4, 3])
    assert new.op("r4").inputs == [TensorRef("shape_n", 1)] and new.op("shape_n").type == "ShapeN"
    assert {c for c, _ in new.consumers(TensorRef("x", 0))} == {"shape_n"}  # Shape and Size read it no more
    assert [op.type for op in g if op.name == "shape"] == ["Shape"]  # the input graph is untouched


def test_resolved_takes_the_batch_the_graph_is_sized_for_and_a_shapen_with_no_reader_left_goes():
    g = _readers().with_batch_size(16)
    assert materialize_shapes(g).graph.op("shape_n").type == "ShapeN"  # traced with an unknown batch: kept
    new = materialize_shapes(g, resolved=True).graph
    assert "shape_n" not in new  # both outputs constants, nothing reads it
    np.testing.assert_array_equal(_value(new, "shape_n/materialized_1"), [16, 5])
    assert not new.consumers(TensorRef("u", 0)) and not new.consumers(TensorRef("x", 0))


def test_a_graph_without_shape_reads_is_returned_as_it_is():
    b = GraphBuilder()
    b.op("x", "Placeholder")
    b.op("y", "Relu", ["x"])
    result = materialize_shapes(b.graph)
    assert result.graph is b.graph and not result.changed


def _traced_cnn():
    """The zoo CNN's training step (batch 8, SGD), traced, and its model and optimizer (keep them alive while the step
    is read: the traced function holds its variables weakly)."""
    import keras

    from tflms.testing import make_train_step
    from tflms.testing.models import build_model, make_batches
    model = build_model("cnn")
    optimizer = keras.optimizers.SGD(0.05)
    optimizer.build(model.trainable_variables)
    (x, y), = make_batches(model, batch_size=8, steps=1)
    step = tf.function(make_train_step(model, optimizer))
    return step.get_concrete_function(tf.constant(x), tf.constant(y)), (model, optimizer)


def test_the_xla_path_keeps_no_shape_reader_and_says_how_many_it_made_constants():
    """The zoo CNN's convolution gradients take a ShapeN of the layer's input (traced without grappler, as the XLA
    path is: 2 of them). In a backward cluster such a reader made TensorFlow hand the cluster the whole input; where a
    swap policy counted it a far reader, a swap-in copied the tensor back for it. Now none is left, and the report
    counts the constants."""
    from tflms.config import LMSConfig
    from tflms.pipeline import rewrite_step
    traced, _alive = _traced_cnn()
    out = rewrite_step(traced, LMSConfig(swapout_threshold=1, swapin_ahead=1), xla=True, build=False)
    graph = out.graph
    assert out.report.num_swapped > 0 and out.report.xla_clusters["shapes_materialized"] >= 2
    assert "shape read(s) of known shapes are constants" in out.report.xla_clusters["why"]
    assert not any(op.type in METADATA_ONLY_TYPES for op in graph)
    plain = rewrite_step(traced, LMSConfig(swapout_threshold=1, swapin_ahead=1), build=False)
    assert "shapes_materialized" not in (plain.report.xla_clusters or {})  # the path without XLA: grappler's


def test_a_step_left_to_xla_is_left_as_it_was_traced():
    """Where XLA alone fits, nothing is inserted and the step is compiled whole as traced: its shape readers stay."""
    from tflms.config import LMSConfig
    from tflms.pipeline import rewrite_step
    traced, _alive = _traced_cnn()
    out = rewrite_step(traced, LMSConfig(profile="h100-80gb-pcie5", budget_bytes=2**30), xla=True, build=False)
    assert out.report.tuning["strategy"] == "xla-alone" and not out.report.inserted_ops
    assert sum(op.type == "ShapeN" for op in out.graph) == 2
