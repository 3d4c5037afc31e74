"""Nodes TensorFlow runs but its importer refuses (grappler's bfloat16 fusions on oneDNN CPUs): tflms.ir.surrogates."""

import pytest
import tensorflow as tf

from tflms.ir import tf_io
from tflms.ir.surrogates import CAST_IN, CAST_OUT, importable, restore_function_def

BF16 = tf.bfloat16.as_datatype_enum


def _graph_def(*, fused_type=BF16):
    """x, w, b -> _FusedConv2D(BiasAdd, Relu) with T=bfloat16 (as grappler's remapper makes it under oneDNN) ->
    a second surrogate reading the first -> Relu."""
    g = tf.compat.v1.GraphDef()

    def placeholder(name, shape):
        n = g.node.add(name=name, op="Placeholder")
        n.attr["dtype"].type = BF16
        n.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())

    placeholder("x", [2, 8, 8, 3])
    placeholder("w", [3, 3, 3, 4])
    placeholder("w2", [3, 3, 4, 4])
    placeholder("b", [4])
    for name, inputs in (("fused", ["x", "w", "b"]), ("fused2", ["fused", "w2", "b"])):
        n = g.node.add(name=name, op="_FusedConv2D", input=inputs)
        n.attr["T"].type = fused_type
        n.attr["TArgs"].list.type.append(BF16)
        n.attr["num_args"].i = 1
        n.attr["strides"].list.i.extend([1, 1, 1, 1])
        n.attr["padding"].s = b"SAME"
        n.attr["fused_ops"].list.s.extend([b"BiasAdd", b"Relu"])
    g.node.add(name="out", op="Relu", input=["fused2"]).attr["T"].type = BF16
    return g


def _needs_surrogates():
    if not importable(_graph_def())[1]:
        pytest.skip("this TensorFlow's _FusedConv2D definition allows bfloat16: nothing to carry through an import")


def test_the_importer_refuses_the_node_and_the_surrogate_reads_its_real_shapes_and_dtypes():
    _needs_surrogates()
    with pytest.raises(ValueError, match="bfloat16"):  # the control: TensorFlow's importer refuses it
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(_graph_def(), name="")
    imported, surrogates = importable(_graph_def())
    assert [s.node for s in surrogates] == ["fused", "fused2"]
    assert {n.name for n in imported.node} >= {f"fused{CAST_IN}0", f"fused{CAST_OUT}0", f"fused2{CAST_IN}0"}
    graph = tf_io.from_graph_def(_graph_def())  # no error, and no cast in the IR
    assert not any("_tflms_cast" in op.name for op in graph)
    for name, channels in (("fused", 4), ("fused2", 4)):
        info = graph.op(name).outputs[0]
        assert (info.dtype, info.shape, info.num_bytes) == ("bfloat16", (2, 8, 8, channels), 2 * 8 * 8 * channels * 2)
        assert graph.op(name).node_def.attr["T"].type == BF16
    assert graph.op("fused2").inputs[0].op == "fused" and graph.op("out").inputs[0].op == "fused2"
    # nothing refused, nothing changed
    plain = _graph_def(fused_type=tf.float32.as_datatype_enum)
    assert importable(plain) == (plain, [])


def test_the_function_def_gets_the_real_nodes_back_and_no_cast():
    _needs_surrogates()
    imported, surrogates = importable(_graph_def())
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(imported, name="")
        from tensorflow.python.framework import graph_to_function_def  # (test-only: a FunctionDef to restore)
        ops = [op for op in g.get_operations() if op.type != "Placeholder"]
        fdef = graph_to_function_def.graph_to_function_def(
            g, ops, [g.get_tensor_by_name(n + ":0") for n in ("x", "w", "w2", "b")], [g.get_tensor_by_name("out:0")])
    restored = restore_function_def(fdef, surrogates)
    nodes = {n.name: n for n in restored.node_def}
    assert not any("_tflms_cast" in name for name in nodes)
    assert nodes["fused"].attr["T"].type == nodes["fused2"].attr["T"].type == BF16
    assert nodes["fused2"].input[0].startswith("fused:") and nodes["out"].input[0].startswith("fused2:")
    assert [i for i in nodes["fused"].input] == ["x", "w", "b"]


def test_a_step_with_grapplers_bfloat16_fusions_trains_bitwise():
    # on a oneDNN CPU grappler fuses the mixed_bfloat16 convolutions; elsewhere nothing is refused and this checks
    # only that the rewrite stays bitwise
    from tflms._compat.tf import onednn_enabled
    from tflms.ir import surrogates
    from tflms.testing import differences
    from tflms.testing.sweep import _Case
    case = _Case("conv", "mixed_bfloat16", "function", size=16, batch=4, steps=2, seed=0)
    built = []
    real_importable = surrogates.importable
    surrogates.importable = lambda gd: (lambda out: (built.extend(out[1]), out)[1])(real_importable(gd))
    try:
        plain = case.train(None)[0]
        state, _, reports, _ = case.train({"swapout_threshold": 1})
    finally:
        surrogates.importable = real_importable
    assert reports[-1].inserted_ops
    assert not differences(plain, state)
    if onednn_enabled():  # the surrogates were used: grappler fused the convolutions in bfloat16
        assert built and all(s.attrs == {"T": BF16} for s in built), built
