"""Reading TF graphs into the IR and writing them back."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tflms
import tflms.ir.tf_io
from tflms.ir.op_types import CALL_OP_TYPES
from tflms.analysis import Category
from tflms.errors import GraphError, NoTrainingStepError
from tflms.ir import tf_io
from tflms.testing import assert_bitwise_equal, snapshot


def _step_and_vars():
    w1 = tf.Variable(tf.random.stateless_normal((8, 16), seed=(1, 2)), name="w1")
    w2 = tf.Variable(tf.random.stateless_normal((16, 4), seed=(3, 4)), name="w2")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w1))
            h2 = tf.nn.relu(tf.matmul(h, tf.ones((16, 16))))
            loss = tf.reduce_mean(tf.square(tf.matmul(h2, w2) - y))
        g1, g2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.1 * g1)
        w2.assign_sub(0.1 * g2)
        return loss

    return step, (w1, w2)


X = tf.constant(np.linspace(-1, 1, 32 * 8, dtype=np.float32).reshape(32, 8))
Y = tf.constant(np.linspace(1, -1, 32 * 4, dtype=np.float32).reshape(32, 4))


def test_graph_def_round_trip_is_exact():
    step, _ = _step_and_vars()
    graph_def = step.get_concrete_function(X, Y).graph.as_graph_def()
    ir = tf_io.from_graph_def(graph_def)
    ir.lint()
    back = tf_io.to_graph_def(ir)
    assert back.SerializeToString(deterministic=True) == graph_def.SerializeToString(deterministic=True)


def test_unmodified_ir_runs_bitwise_identically():
    step_a, vars_a = _step_and_vars()
    step_b, vars_b = _step_and_vars()
    cf_b = step_b.get_concrete_function(X, Y)
    rebuilt = tf_io.to_concrete_function(tf_io.from_concrete_function(cf_b), cf_b)
    losses_a, losses_b = [], []
    for _ in range(3):
        losses_a.append(step_a(X, Y))
        losses_b.append(rebuilt(X, Y))
    assert_bitwise_equal(snapshot(variables=vars_a, losses=losses_a), snapshot(variables=vars_b, losses=losses_b),
                         "rebuilt from the IR vs the original")


def test_tensors_carry_dtype_shape_and_bytes():
    step, _ = _step_and_vars()
    analysis = tflms.analyze(step, X, Y)
    relus = [f for f in analysis.tensors() if analysis.graph.op(f.ref.op).type == "Relu"]
    assert len(relus) == 2
    for facts in relus:
        assert facts.info.dtype == "float32" and facts.info.shape == (32, 16)
        assert facts.num_bytes == 32 * 16 * 4
        assert facts.producer_category is Category.FORWARD
        assert min(facts.distances) >= 1


def test_unknown_batch_dimension_is_resolved_by_batch_size():
    step, _ = _step_and_vars()
    spec = (tf.TensorSpec((None, 8), tf.float32), tf.TensorSpec((None, 4), tf.float32))
    cf = step.get_concrete_function(*spec)
    unsized = tf_io.from_concrete_function(cf)
    sized = tf_io.from_concrete_function(cf, batch_size=64)
    relu = next(op for op in unsized if op.type == "Relu")
    assert relu.outputs[0].shape == (None, 16) and relu.outputs[0].num_bytes is None
    assert sized.op(relu.name).outputs[0].num_bytes == 64 * 16 * 4
    # Without a batch size, the rewrite records a skip naming the fix instead of failing.
    result = tflms.rewrite(cf, accelerator_device="/device:CPU:0", host_device="/device:CPU:1", swapout_threshold=1)
    reasons = {k.tensor.op: (k.reason, k.detail) for k in result.report.skipped}
    assert reasons[relu.name][0] == "unknown-shape" and "batch_size" in reasons[relu.name][1]
    result = tflms.rewrite(cf, batch_size=64, accelerator_device="/device:CPU:0", host_device="/device:CPU:1",
                           swapout_threshold=1)
    assert relu.name + ":0" in {s.tensor.name for s in result.report.swaps}


def test_function_def_source():
    step, _ = _step_and_vars()
    cf = step.get_concrete_function(X, Y)
    ir = tf_io.from_function_def(cf.function_def)
    analysis = tflms.analyze(ir)
    assert analysis.has_backward
    assert sum(1 for op in ir if op.type == "Relu") == 2


def test_tf_function_without_arguments_gets_a_clear_error():
    step, _ = _step_and_vars()
    with pytest.raises(GraphError, match="pass example arguments"):
        tflms.analyze(step)
    with pytest.raises(GraphError, match="cannot read a training step from int"):
        tflms.analyze(3)


def test_inference_function_is_refused():
    w = tf.Variable(tf.ones((8, 8)))

    @tf.function
    def infer(x):
        return tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w))

    with pytest.raises(NoTrainingStepError):
        tflms.rewrite(infer.get_concrete_function(tf.ones((4, 8))), accelerator_device="/device:CPU:0",
                      host_device="/device:CPU:1")


def test_control_flow_ops_are_opaque():
    w = tf.Variable(tf.ones((8, 8)) * 0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w))
            h = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, tf.nn.relu(tf.matmul(a, w))),
                              (tf.constant(0), h))[1]
            loss = tf.reduce_sum(h)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    cf = step.get_concrete_function(tf.ones((16, 8)))
    analysis = tflms.analyze(cf)
    whiles = [op for op in analysis.graph if op.type in ("While", "StatelessWhile")]
    assert whiles, "expected a While op in the traced step"
    result = tflms.rewrite(cf, accelerator_device="/device:CPU:0", host_device="/device:CPU:1", swapout_threshold=1)
    # Nothing inside the loop bodies is touched: the body functions are carried over unchanged.
    assert tf_io.to_graph_def(result.graph).library == cf.graph.as_graph_def().library


def test_unknown_device_is_refused_with_the_available_ones():
    with pytest.raises(tflms.DeviceError, match=r"accelerator_device='/device:GPU:3' does not exist here"):
        tflms.function(lambda x: x, accelerator_device="GPU:3")


def test_a_tf_function_inside_the_step_is_inlined_by_grappler_and_rewritten():
    """Grappler's function optimizer inlines the nested step before tflms reads the graph (the LOAD stage)."""
    step, _ = _step_and_vars()

    @tf.function
    def outer(x, y):
        return step(x, y)  # the real step is another tf.function: a call op in the traced graph

    concrete = outer.get_concrete_function(X, Y)
    assert any(op.type in CALL_OP_TYPES for op in concrete.graph.get_operations())
    result = tflms.rewrite(concrete, accelerator_device="/device:CPU:0", host_device="/device:CPU:1",
                           swapout_threshold=1)
    assert result.report.num_swapped > 0
    assert not any(op.type in CALL_OP_TYPES for op in result.graph)


def test_an_opaque_function_call_is_named_in_the_error():
    """Without grappler's inlining (an IR graph read as it is), the call op is named."""
    step, _ = _step_and_vars()

    @tf.function
    def outer(x, y):
        return step(x, y)

    graph = tflms.ir.tf_io.load_graph(outer.get_concrete_function(X, Y))
    with pytest.raises(NoTrainingStepError, match="calls other functions"):
        tflms.rewrite(graph, accelerator_device="/device:CPU:0", host_device="/device:CPU:1")
