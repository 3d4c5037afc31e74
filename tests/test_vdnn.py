"""vDNN's offload policies (vdnn_all, vdnn_conv, vdnn_dyn) as swap plans.

Hand-built graphs with worked-out levels give exact expectations: which feature
maps are offloaded, which backward op of the next layer triggers each prefetch,
which op waits for the offload. A Keras CNN then trains bitwise-identically with
the vDNN rewrite, with and without zvc compression on top.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tflms.analysis.cto import analyze_graph
from tflms.compress.rewrite import compress_rewrite, to_concrete_function
from tflms.config import LMSConfig
from tflms.errors import BudgetError, ConfigError
from tflms.ir import tf_io
from tflms.ir.graph import TensorRef
from tflms.passes.swaps import apply_swaps, inserted_op_names
from tflms.sim import SimOptions, get_profile, simulate
from tflms.sim.simulator import RECV_SUFFIX
from tflms.testing import GraphBuilder, assert_bitwise_equal, make_train_step, mlp_training_graph, snapshot
from tflms.tune.tuner import TuneEvaluator
from tflms.policies.vdnn import VDNN_ALL, VDNN_CONV, plan_vdnn, vdnn_layers
from tflms.tune.vdnn import choose_vdnn, search_vdnn

GPU = "/device:GPU:0"
PROFILE = "v100-16gb-pcie3"


def conv_training_graph():
    """A two-conv CNN step by hand; levels in brackets.

    forward: x[0] -> fw/conv0[2] -> fw/relu0[3] -> fw/pool0[4] -> fw/conv1[5] -> fw/relu1[6] -> fw/flatten[7]
             -> fw/dense[8] -> loss/Sub[9] -> loss/Mean[10]    (weights: fw/w_*[1], ReadVariableOp)
    backward: gradient_tape/dense/MatMul[10] (dflat), gradient_tape/dense/MatMul_1[10] (dW),
              gradient_tape/flatten/Reshape[11], gradient_tape/ReluGrad_1[12],
              gradient_tape/conv1/Conv2DBackpropFilter[13], gradient_tape/conv1/Conv2DBackpropInput[13],
              gradient_tape/pool0/MaxPoolGrad[14], gradient_tape/ReluGrad_0[15],
              gradient_tape/conv0/Conv2DBackpropFilter[16]; then one SGD update per weight.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(8, 16, 16, 3))
    y = b.op("y", "Placeholder", shape=(8, 10))
    lr = b.op("lr", "Const", shape=())
    handles = {k: b.op(f"var_{k}", "Placeholder", shape=(), dtype="resource") for k in ("c0", "c1", "d")}
    w_c0 = b.op("fw/w_c0", "ReadVariableOp", [handles["c0"]], shape=(3, 3, 3, 8))
    w_c1 = b.op("fw/w_c1", "ReadVariableOp", [handles["c1"]], shape=(3, 3, 8, 8))
    w_d = b.op("fw/w_d", "ReadVariableOp", [handles["d"]], shape=(512, 10))
    conv0 = b.op("fw/conv0", "Conv2D", [x, w_c0], shape=(8, 16, 16, 8))
    relu0 = b.op("fw/relu0", "Relu", [conv0], shape=(8, 16, 16, 8))
    pool0 = b.op("fw/pool0", "MaxPool", [relu0], shape=(8, 8, 8, 8))
    conv1 = b.op("fw/conv1", "Conv2D", [pool0, w_c1], shape=(8, 8, 8, 8))
    relu1 = b.op("fw/relu1", "Relu", [conv1], shape=(8, 8, 8, 8))
    flat = b.op("fw/flatten", "Reshape", [relu1], shape=(8, 512))
    logits = b.op("fw/dense", "MatMul", [flat, w_d], shape=(8, 10))
    diff = b.op("loss/Sub", "Sub", [logits, y], shape=(8, 10))
    b.op("loss/Mean", "Mean", [diff], shape=())
    dw_d = b.op("gradient_tape/dense/MatMul_1", "MatMul", [flat, diff], shape=(512, 10))
    dflat = b.op("gradient_tape/dense/MatMul", "MatMul", [diff, w_d], shape=(8, 512))
    drelu1 = b.op("gradient_tape/flatten/Reshape", "Reshape", [dflat], shape=(8, 8, 8, 8))
    dconv1 = b.op("gradient_tape/ReluGrad_1", "ReluGrad", [drelu1, relu1], shape=(8, 8, 8, 8))
    dw_c1 = b.op("gradient_tape/conv1/Conv2DBackpropFilter", "Conv2DBackpropFilter", [pool0, w_c1, dconv1],
                 shape=(3, 3, 8, 8))
    dpool0 = b.op("gradient_tape/conv1/Conv2DBackpropInput", "Conv2DBackpropInput", [w_c1, dconv1],
                  shape=(8, 8, 8, 8))
    drelu0 = b.op("gradient_tape/pool0/MaxPoolGrad", "MaxPoolGrad", [relu0, pool0, dpool0], shape=(8, 16, 16, 8))
    dconv0 = b.op("gradient_tape/ReluGrad_0", "ReluGrad", [drelu0, relu0], shape=(8, 16, 16, 8))
    dw_c0 = b.op("gradient_tape/conv0/Conv2DBackpropFilter", "Conv2DBackpropFilter", [x, w_c0, dconv0],
                 shape=(3, 3, 3, 8))
    for k, grad in (("c0", dw_c0), ("c1", dw_c1), ("d", dw_d)):
        shape = b.graph.tensor(grad).shape
        step = b.op(f"opt/Mul_{k}", "Mul", [grad, lr], shape=shape)
        b.op(f"opt/AssignSubVariableOp_{k}", "AssignSubVariableOp", [handles[k], step], shape=None, num_outputs=0)
    return b.graph


def test_conv_graph_levels_are_the_documented_ones():
    levels = analyze_graph(conv_training_graph()).levels
    assert [levels[n] for n in ("fw/conv0", "fw/pool0", "fw/conv1", "fw/flatten", "fw/dense", "loss/Sub")] == \
        [2, 4, 5, 7, 8, 9]
    assert [levels[n] for n in ("gradient_tape/dense/MatMul", "gradient_tape/conv1/Conv2DBackpropFilter",
                                "gradient_tape/pool0/MaxPoolGrad", "gradient_tape/conv0/Conv2DBackpropFilter")] == \
        [10, 13, 14, 16]


def test_layers_are_the_compute_heavy_forward_ops_in_order():
    layers = vdnn_layers(analyze_graph(conv_training_graph()))
    assert [(layer.op, layer.type, layer.level) for layer in layers] == [
        ("fw/conv0", "Conv2D", 2), ("fw/conv1", "Conv2D", 5), ("fw/dense", "MatMul", 8)]


def test_vdnn_conv_offloads_the_input_of_each_convolution():
    plan = plan_vdnn(analyze_graph(conv_training_graph()), VDNN_CONV, accelerator_device=GPU)
    assert [s.tensor.name for s in plan.swaps] == ["fw/pool0:0"]  # conv0 reads x, an input of the step
    swap = plan.swaps[0]
    (group,) = swap.swap_ins
    assert group.name == "lms/swap_in_fw/pool0_0_0" and swap.swap_out == "lms/swap_out_fw/pool0_0"
    assert group.consumers == ("gradient_tape/conv1/Conv2DBackpropFilter", "gradient_tape/pool0/MaxPoolGrad")
    # the backward op of the next layer (fw/dense) that precedes the consumers: its input gradient
    assert (group.trigger, group.trigger_level, group.sync, group.note) == ("gradient_tape/dense/MatMul", 10, False, "")
    assert swap.sync_out_consumers == ("fw/dense",)  # the next layer waits for the offload
    assert {(s.tensor.name, s.reason) for s in plan.skipped} == {
        ("x:0", "function-input"), ("fw/w_c0:0", "variable-read"), ("fw/w_c1:0", "variable-read")}


def test_vdnn_all_also_offloads_the_dense_input_and_the_last_layer_uses_the_tflms_rule():
    plan = plan_vdnn(analyze_graph(conv_training_graph()), VDNN_ALL, accelerator_device=GPU)
    assert [s.tensor.name for s in plan.swaps] == ["fw/pool0:0", "fw/flatten:0"]
    flat = plan.swaps[1]
    (group,) = flat.swap_ins
    assert group.consumers == ("gradient_tape/dense/MatMul_1",)
    assert (group.trigger, group.trigger_level) == ("loss/Sub", 9)  # one level before the consumer (level 10)
    assert group.note.startswith("last layer") and flat.sync_out_consumers == ()


def test_vdnn_on_the_mlp_chain():
    """3 layers: fw/Relu_0 and fw/Relu_1 feed fw/MatMul_1 and fw/MatMul_2; x is an input, weights are reads."""
    plan = plan_vdnn(analyze_graph(mlp_training_graph(3)), VDNN_ALL, accelerator_device=GPU)
    assert [(s.tensor.name, s.swap_ins[0].consumers, s.swap_ins[0].trigger, s.sync_out_consumers)
            for s in plan.swaps] == [
        ("fw/Relu_0:0", ("gradient_tape/MatMul_1_1", "gradient_tape/ReluGrad_0"), "gradient_tape/MatMul_2",
         ("fw/MatMul_2",)),
        ("fw/Relu_1:0", ("gradient_tape/MatMul_1_2", "gradient_tape/ReluGrad_1"), "gradient_tape/ReluGrad_2", ()),
    ]
    conv = plan_vdnn(analyze_graph(mlp_training_graph(3)), VDNN_CONV, accelerator_device=GPU)
    assert conv.swaps == () and "no forward op of types" in conv.warnings[0]
    with pytest.raises(ConfigError, match="unknown vDNN policy"):
        plan_vdnn(analyze_graph(mlp_training_graph(3)), "vdnn_dyn", accelerator_device=GPU)


def test_shape_reads_neither_pull_the_map_back_nor_trigger_prefetches():
    """TF's conv gradient reads its input's shape with ShapeN early on: that must stay a near consumer."""
    graph = conv_training_graph()
    graph.add_op("gradient_tape/conv1/ShapeN", "ShapeN", inputs=[TensorRef("fw/pool0"), TensorRef("fw/w_c1")],
                 outputs=[graph.tensor("fw/pool0:0")])
    graph.add_control_input("gradient_tape/conv1/Conv2DBackpropInput", "gradient_tape/conv1/ShapeN")
    plan = plan_vdnn(analyze_graph(graph), VDNN_CONV, accelerator_device=GPU)
    (group,) = plan.swaps[0].swap_ins
    assert "gradient_tape/conv1/ShapeN" not in group.consumers
    assert group.trigger == "gradient_tape/dense/MatMul"


def test_applied_vdnn_plan_simulates_with_prefetch_and_offload_sync():
    analysis = analyze_graph(conv_training_graph())
    plan = plan_vdnn(analysis, VDNN_ALL, accelerator_device=GPU)
    graph = apply_swaps(analysis.graph, plan).graph
    graph.lint()
    assert set(inserted_op_names(plan)) == {op.name for op in graph if op.name.startswith("lms/")}
    sim = simulate(graph, PROFILE, options=SimOptions())
    records = {r.name: r for r in sim.ops}
    out, recv = records["lms/swap_out_fw/pool0_0"], records["lms/swap_in_fw/pool0_0_0" + RECV_SUFFIX]
    assert out.stream == "d2h" and recv.stream == "h2d"
    assert records["fw/dense"].start_s >= out.end_s  # vDNN: the next layer waits for the offload
    assert recv.start_s >= records["gradient_tape/dense/MatMul"].end_s  # prefetched once the trigger ran
    assert records["gradient_tape/conv1/Conv2DBackpropFilter"].start_s >= recv.end_s
    p = get_profile(PROFILE)
    assert out.end_s - out.start_s == pytest.approx(p.copy_time_s(8 * 8 * 8 * 8 * 4))


def test_vdnn_dyn_picks_the_first_policy_that_fits():
    analysis = analyze_graph(mlp_training_graph(6, batch=256, width=512))
    peaks = {}
    for policy in ("none", VDNN_CONV, VDNN_ALL):
        graph = analysis.graph if policy == "none" else apply_swaps(
            analysis.graph, plan_vdnn(analysis, policy, accelerator_device=GPU)).graph
        peaks[policy] = simulate(graph, PROFILE).peak_with_margin_bytes
    assert peaks[VDNN_ALL] < peaks["none"] == peaks[VDNN_CONV]  # an MLP has no convolution
    assert choose_vdnn(analysis, PROFILE, budget=peaks["none"]).policy == "none"
    chosen = choose_vdnn(analysis, PROFILE, budget=peaks[VDNN_ALL])
    assert chosen.policy == VDNN_ALL and [c.policy for c in chosen.candidates] == ["none", VDNN_CONV, VDNN_ALL]
    assert chosen.graph.op("lms/swap_out_fw/Relu_0_0") and "chose vdnn_all" in chosen.table()
    with pytest.raises(BudgetError, match="smallest peak"):
        choose_vdnn(analysis, PROFILE, budget=peaks[VDNN_ALL] - 1)


def test_search_vdnn_runs_through_the_tuners_evaluator():
    analysis = analyze_graph(mlp_training_graph(4))
    profile = get_profile(PROFILE)
    ev = TuneEvaluator(analysis, profile, profile.memory_bytes, profile.host_memory_bytes, SimOptions(), LMSConfig(),
                    GPU, "Identity", None)
    search_vdnn(ev)
    assert [(c.strategy, len(c.plan.swaps), c.fits) for c in ev.candidates] == [(VDNN_CONV, 0, True),
                                                                                (VDNN_ALL, 3, True)]


# ---------------------------------------------------------------- Keras training
def _cnn():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(4)])


def _train(rewrite, batches):
    model = _cnn()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    opt.build(model.trainable_variables)
    original = tf.function(make_train_step(model, opt)).get_concrete_function(*(tf.constant(a) for a in batches[0]))
    fn, info = rewrite(original) if rewrite else (original, None)
    losses = [float(fn(tf.constant(x), tf.constant(y))) for x, y in batches]
    return losses, snapshot(model, opt), info


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zvc"])
def test_vdnn_rewrite_trains_bitwise_identically(compress):
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 16, 16, 3)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32))
               for _ in range(3)]

    def rewrite(original):
        graph = tf_io.from_concrete_function(original)
        plan = plan_vdnn(analyze_graph(graph), VDNN_ALL, accelerator_device="/device:CPU:0")
        swapped = apply_swaps(graph, plan).graph
        choices = {s.tensor: "zvc" for s in plan.swaps} if compress else {}
        compressed = compress_rewrite(swapped, plan, choices)
        return to_concrete_function(compressed, original), plan

    ref_losses, ref_state, _ = _train(None, batches)
    assert_bitwise_equal(ref_state, _train(None, batches)[1], "plain twice (the control)")
    losses, got, plan = _train(rewrite, batches)
    # the first conv reads the step's input: offloaded are the second conv's input and the dense layer's, but on
    # a oneDNN CPU the second conv's input (a MaxPool output) stays: its MaxPoolGrad needs it for the workspace
    from tflms._compat.tf import onednn_enabled
    kept = ["MaxPool2d"] if onednn_enabled() else []
    assert [s.tensor.op.rsplit("/", 1)[-1] for s in plan.swaps] == [n for n in ["MaxPool2d", "Reshape"]
                                                                    if n not in kept]
    assert [s.tensor.op.rsplit("/", 1)[-1] for s in plan.skipped if s.reason == "onednn-workspace"][:1] == kept
    assert all(s.swap_ins[0].trigger for s in plan.swaps)
    assert losses == ref_losses
    assert_bitwise_equal(ref_state, got, "vDNN rewrite vs plain")
