"""Compressed swaps: the rewrite pass, training equivalence, profiling, the CSwap+ policy, calibration.

Hand-built IR graphs (``tflms.testing.mlp_training_graph``) check exact op names,
inputs, sizes and simulated copy times; Keras steps check that training with
lossless (zvc) compressed swaps gives bitwise-identical weights, and with fp16
swaps a loss within 1% of plain training. There is no GPU: the accelerator is
/device:CPU:0, so the compressed swaps are real ops that move nothing, which is
enough to prove they compute exactly what the original step does.
"""

from __future__ import annotations

import dataclasses
import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import tflms
from tflms.analysis.cto import analyze_graph
from tflms.compress import calibrate as cal
from tflms.compress.codecs import CODEC_NAMES, BlockInt8Codec, Float16Codec, ZeroValueCodec, encoded_nbytes, get_codec
from tflms.compress.policy import CONTENDED, HIDDEN, WAITED, decide_compression, make_compressor
from tflms.compress.profiling import TensorStats, profile_tensors
from tflms.compress.rewrite import (CompressionChoice, apply_compression, compress_rewrite, inserted_op_names,
                                    to_concrete_function)
from tflms.config import LMSConfig
from tflms.errors import ConfigError, GraphError
from tflms.ir import tf_io
from tflms.ir.graph import TensorInfo, TensorRef
from tflms.passes.swaps import apply_swaps
from tflms.policies.tflms_rules import plan_swaps
from tflms.sim import HardwareProfile, simulate
from tflms.sim.cost import CODEC_TRAFFIC, DECODE, ENCODE, codec_time_s
from tflms.testing import (assert_bitwise_equal, bitwise_diff, make_train_step, mlp_training_graph, serial_clock,
                           snapshot)

SEED = 1234
NUM_STEPS = 3
GPU = "/device:GPU:0"
#: fp16 swaps: the loss after the steps must stay this close to plain training (relative).
FP16_LOSS_TOLERANCE = 0.01


# ================================================================ hand-built graphs
def mlp_plan(num_layers: int = 3, threshold: int = 4):
    """The 3-layer MLP step, its analysis and TFLMS plan: swaps fw/Relu_0:0 and fw/Relu_1:0 (levels 3, 5)."""
    analysis = analyze_graph(mlp_training_graph(num_layers))
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=threshold), accelerator_device=GPU)
    return analysis, plan, apply_swaps(analysis.graph, plan).graph


def test_mlp_plan_is_what_the_tests_below_assume():
    _, plan, _ = mlp_plan()
    assert [s.tensor.name for s in plan.swaps] == ["fw/Relu_0:0", "fw/Relu_1:0"]
    swap = plan.swaps[0]
    assert [g.consumers for g in swap.swap_ins] == [("gradient_tape/MatMul_1_1",), ("gradient_tape/ReluGrad_0",)]


def test_zvc_swap_ops_names_inputs_and_sizes():
    analysis, plan, swapped = mlp_plan()
    ref = TensorRef("fw/Relu_0", 0)
    choice = CompressionChoice(ref, ZeroValueCodec(), nonzero_fraction=0.25)
    new = apply_compression(swapped, plan, [choice]).graph
    enc = new.op("lms/encode_fw/Relu_0_0")
    assert enc.type == "PartitionedCall" and enc.inputs == [ref] and enc.device == GPU
    n = 32 * 64
    # mask: ceil(n / 8) uint8, static; values: data-dependent, predicted 25% of n float32, shape not recorded
    assert enc.outputs == (TensorInfo("uint8", (n // 8,), n // 8), TensorInfo("float32", None, n // 4 * 4))
    out0, out1 = new.op("lms/swap_out_fw/Relu_0_0"), new.op("lms/swap_out_fw/Relu_0_0_part1")
    assert out0.inputs == [TensorRef(enc.name, 0)] and out1.inputs == [TensorRef(enc.name, 1)]
    assert out0.device == out1.device == "/device:CPU:0"
    assert out0.outputs[0].dtype == "uint8" and out1.outputs[0].dtype == "float32"
    for gi, (consumer, trigger) in enumerate([("gradient_tape/MatMul_1_1", "gradient_tape/ReluGrad_1"),
                                              ("gradient_tape/ReluGrad_0", "gradient_tape/MatMul_1")]):
        base = f"lms/swap_in_fw/Relu_0_0_{gi}"
        in0, in1 = new.op(base), new.op(base + "_part1")
        assert in0.inputs == [TensorRef(out0.name, 0)] and in1.inputs == [TensorRef(out1.name, 0)]
        assert in0.control_inputs == in1.control_inputs == [trigger]
        dec = new.op(f"lms/decode_fw/Relu_0_0_{gi}")
        assert dec.inputs == [TensorRef(base, 0), TensorRef(base + "_part1", 0)]
        assert dec.outputs == (swapped.tensor(ref),)
        assert TensorRef(dec.name, 0) in new.op(consumer).inputs
        assert new.consumers(TensorRef(base, 0)) == [(dec.name, 0)]
    # the other swap keeps its plain copies
    assert new.op("lms/swap_out_fw/Relu_1_0").inputs == [TensorRef("fw/Relu_1", 0)]
    names = {f.signature.name for f in new.library.function}
    assert names == {"tflms_encode_zvc_float32_32x64", "tflms_decode_zvc_float32_32x64"}
    assert len(new) == len(swapped) + 1 + 1 + 2 + 2  # encode, part-1 swap-out, 2 part-1 swap-ins, 2 decodes
    new.lint()
    assert set(inserted_op_names(plan, [choice], new)) == {op.name for op in new if op.name.startswith("lms/")}


def test_pass_is_pure_and_deterministic():
    _, plan, swapped = mlp_plan()
    before = tf_io.to_graph_def(swapped).SerializeToString(deterministic=True)
    choices = {"fw/Relu_0:0": "zvc", "fw/Relu_1:0": ZeroValueCodec()}
    first = apply_compression(swapped, plan, choices).graph
    second = apply_compression(swapped, plan, choices).graph
    assert tf_io.to_graph_def(swapped).SerializeToString(deterministic=True) == before
    assert swapped.op("lms/swap_out_fw/Relu_0_0").outputs[0].dtype == "float32"  # the input's records untouched
    assert swapped.library is None
    a, b = (tf_io.to_graph_def(g).SerializeToString(deterministic=True) for g in (first, second))
    assert a == b and a != before


def test_lossy_codecs_need_allow_lossy():
    _, plan, swapped = mlp_plan()
    for codec in ("fp16", "bf16", "int8-block", Float16Codec(saturate=False)):
        with pytest.raises(ConfigError, match="allow_lossy=True"):
            apply_compression(swapped, plan, {"fw/Relu_0:0": codec}).graph
    new = apply_compression(swapped, plan, {"fw/Relu_0:0": "fp16"}, allow_lossy=True).graph
    assert new.op("lms/encode_fw/Relu_0_0").outputs == (TensorInfo("float16", (32, 64), 32 * 64 * 2),)
    assert "lms/swap_out_fw/Relu_0_0_part1" not in new  # one part, one pair of copies


def test_bad_choices_are_refused_with_the_tensor_named():
    analysis, plan, swapped = mlp_plan()
    with pytest.raises(ConfigError, match="fw/MatMul_0:0.*does not swap it"):
        apply_compression(swapped, plan, {"fw/MatMul_0:0": "zvc"}).graph
    with pytest.raises(GraphError, match="apply_swaps"):
        apply_compression(analysis.graph, plan, {"fw/Relu_0:0": "zvc"}).graph
    once = apply_compression(swapped, plan, {"fw/Relu_0:0": "zvc"}).graph
    with pytest.raises(GraphError, match="compressed already"):
        apply_compression(once, plan, {"fw/Relu_0:0": "zvc"}).graph
    with pytest.raises(ConfigError, match="nonzero_fraction"):
        CompressionChoice(TensorRef("fw/Relu_0"), ZeroValueCodec(), 1.5)


def test_every_part_keeps_the_sync_edges_and_deepcopy_swap_ins():
    """sync_mode=1: near consumers wait for every part's swap-out; DeepCopy swap-ins stay DeepCopy per part."""
    analysis = analyze_graph(mlp_training_graph(3))
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=4, sync_mode=1), accelerator_device=GPU)
    swapped = apply_swaps(analysis.graph, plan, copy_op="DeepCopy").graph
    new = apply_compression(swapped, plan, {"fw/Relu_0:0": "zvc"}).graph
    near = plan.swaps[0].sync_out_consumers
    assert near == ("fw/MatMul_1",)
    assert {"lms/swap_out_fw/Relu_0_0", "lms/swap_out_fw/Relu_0_0_part1"} <= set(new.op("fw/MatMul_1").control_inputs)
    part = new.op("lms/swap_in_fw/Relu_0_0_0_part1")
    assert part.type == "DeepCopy" and part.device == GPU  # the emulated accelerator copies explicitly
    new.lint()


def test_simulator_moves_the_encoded_parts_and_costs_the_codec():
    _, plan, swapped = mlp_plan()
    profile = "v100-16gb-pcie3"
    choice = CompressionChoice(TensorRef("fw/Relu_0"), ZeroValueCodec(), nonzero_fraction=0.5)
    new = apply_compression(swapped, plan, [choice]).graph
    sim = simulate(new, profile)
    records = {r.name: r for r in sim.ops}
    p = tflms.sim.get_profile(profile)
    n = 32 * 64
    mask, values = n // 8, n // 2 * 4
    for name, nbytes in (("lms/swap_out_fw/Relu_0_0", mask), ("lms/swap_out_fw/Relu_0_0_part1", values)):
        assert records[name].stream == "d2h"
        assert records[name].end_s - records[name].start_s == pytest.approx(p.copy_time_s(nbytes))
    recv = records["lms/swap_in_fw/Relu_0_0_0_part1/_recv"]  # the implicit host-to-device copy TF inserts
    assert recv.stream == "h2d" and recv.end_s - recv.start_s == pytest.approx(p.copy_time_s(values))
    enc, dec = records["lms/encode_fw/Relu_0_0"], records["lms/decode_fw/Relu_0_0_0"]
    assert enc.stream == dec.stream == "compute"
    # the graph clock (a GPU profile's) launches each of the codec's kernels from the host, ahead of the GPU: the
    # calls keep the GPU busy for their memory passes alone
    assert sim.clock == "graph"
    traffic = CODEC_TRAFFIC["zvc"]
    assert enc.end_s - enc.start_s == pytest.approx(
        codec_time_s("zvc", ENCODE, n * 4, p) - traffic.encode_kernels * p.launch_overhead_s)
    assert dec.end_s - dec.start_s == pytest.approx(
        codec_time_s("zvc", DECODE, n * 4, p) - traffic.decode_kernels * p.launch_overhead_s)
    serial = {r.name: r for r in simulate(new, serial_clock(profile)).ops}["lms/encode_fw/Relu_0_0"]
    assert serial.end_s - serial.start_s == pytest.approx(codec_time_s("zvc", ENCODE, n * 4, p))
    assert dec.start_s >= recv.end_s
    traffic = CODEC_TRAFFIC["zvc"]
    assert codec_time_s("zvc", ENCODE, n * 4, p) == pytest.approx(
        traffic.encode_kernels * p.launch_overhead_s + traffic.encode_passes * n * 4 / p.effective_memory_bytes_per_s)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_part_bytes_match_encoded_parts(name):
    codec = get_codec(name)
    x = np.maximum(np.random.default_rng(3).standard_normal((7, 129)).astype(np.float32), 0)
    parts = codec.encode(tf.constant(x))
    nonzero = np.count_nonzero(x) / x.size
    assert [int(np.asarray(p).nbytes) for p in parts] == list(codec.part_bytes(x.size, "float32", nonzero))
    assert encoded_nbytes(parts) == codec.compressed_bytes(x.size, "float32", nonzero)
    assert codec.cost_key in CODEC_TRAFFIC


def test_codec_traffic_constants_are_the_counted_ones():
    for codec in cal.default_calibration_codecs():
        counted = cal.memory_traffic(codec)
        t = CODEC_TRAFFIC[codec.cost_key]
        assert (t.encode_passes, t.decode_passes) == (round(counted["encode_passes"], 2),
                                                      round(counted["decode_passes"], 2)), codec.cost_key
        assert (t.encode_kernels, t.decode_kernels) == (counted["encode_kernels"], counted["decode_kernels"])


# ================================================================ Keras training
def _batches(shape_x, classes, steps=NUM_STEPS, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape_x).astype(np.float32), rng.integers(0, classes, shape_x[0]).astype(np.int32))
            for _ in range(steps)]


CNN_BATCHES = _batches((8, 16, 16, 3), 4)
MLP_BATCHES = _batches((8, 12), 4)


def build_cnn():
    keras.utils.set_random_seed(SEED)
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])


def build_mlp():
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input((12,))
    h = inputs
    for _ in range(3):
        h = keras.layers.Dense(16, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(4)(h))


def fresh(build, optimizer="sgd"):
    model = build()
    opt = keras.optimizers.SGD(0.05, momentum=0.9) if optimizer == "sgd" else keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    return model, opt, make_train_step(model, opt)


def train_plain(build, batches, optimizer="sgd"):
    model, opt, step = fresh(build, optimizer)
    fn = tf.function(step)
    losses = [float(fn(tf.constant(x), tf.constant(y))) for x, y in batches]
    return losses, snapshot(model, opt)


def train_compressed(build, batches, choose, *, optimizer="sgd", allow_lossy=False, input_signature=None,
                     batch_size=None, threshold=1):
    """Rewrite (TFLMS, ``threshold``), compress the tensors ``choose(plan)`` names, train."""
    model, opt, step = fresh(build, optimizer)
    x0, y0 = (tf.constant(a) for a in batches[0])
    original = tf.function(step, input_signature=input_signature).get_concrete_function(x0, y0) \
        if input_signature is None else tf.function(step, input_signature=input_signature).get_concrete_function()
    result = tflms.rewrite(original, swapout_threshold=threshold, batch_size=batch_size)
    plan = result.report.plan
    compressed = compress_rewrite(result.graph, plan, choose(plan), allow_lossy=allow_lossy)
    fn = to_concrete_function(compressed, original)
    losses = [float(fn(tf.constant(x), tf.constant(y))) for x, y in batches]
    return losses, snapshot(model, opt), compressed, fn


def all_zvc(plan):
    return {s.tensor: "zvc" for s in plan.swaps}


@pytest.mark.parametrize("build,batches,optimizer", [(build_cnn, CNN_BATCHES, "sgd"), (build_mlp, MLP_BATCHES, "adam")],
                         ids=["cnn-sgd-momentum", "mlp-adam"])
def test_zvc_swaps_train_bitwise_identically(build, batches, optimizer):
    ref_losses, ref_state = train_plain(build, batches, optimizer)
    losses, got, compressed, _ = train_compressed(build, batches, all_zvc, optimizer=optimizer)
    assert len(compressed.choices) >= 3, "too few compressed swaps for the test to mean anything"
    assert any("Relu" in c.tensor.op for c in compressed.choices)
    assert losses == ref_losses
    assert_bitwise_equal(ref_state, got, "zvc-compressed training vs plain")
    assert bitwise_diff(ref_state, snapshot(*fresh(build, optimizer)[:2])), "training changed nothing: vacuous"


def test_zvc_with_unknown_batch_dimension_decodes_with_the_dynamic_shape():
    signature = [tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32)]
    ref_losses, ref_state = train_plain(build_mlp, MLP_BATCHES)
    losses, got, compressed, _ = train_compressed(build_mlp, MLP_BATCHES, all_zvc, input_signature=signature,
                                                  batch_size=8)
    graph = compressed.graph
    enc = graph.op(tflms.compress.rewrite.encode_op_name(compressed.choices[0].tensor))
    assert enc.outputs[-1].dtype == "int32" and enc.outputs[-1].shape == (2,)  # tf.shape(x), kept on the device
    assert enc.outputs[0].shape is None  # the mask's length depends on the batch: sized by prediction
    assert losses == ref_losses
    assert_bitwise_equal(ref_state, got, "zvc with a dynamic batch vs plain")


def test_fp16_swaps_keep_the_loss_within_one_percent():
    batches = _batches((8, 16, 16, 3), 4, steps=5, seed=2)
    ref_losses, ref_state = train_plain(build_cnn, batches)
    with pytest.raises(ConfigError, match="lossy"):
        train_compressed(build_cnn, batches, lambda plan: {s.tensor: "fp16" for s in plan.swaps})
    losses, got, compressed, _ = train_compressed(build_cnn, batches,
                                                  lambda plan: {s.tensor: "fp16" for s in plan.swaps},
                                                  allow_lossy=True)
    assert len(compressed.choices) >= 3
    assert bitwise_diff(ref_state, got), "fp16 swaps changed nothing: is the codec really in the graph?"
    assert abs(losses[-1] - ref_losses[-1]) <= FP16_LOSS_TOLERANCE * abs(ref_losses[-1]), (losses, ref_losses)


def test_compressed_swap_ops_survive_grappler():
    model, opt, step = fresh(build_cnn)
    x, y = (tf.constant(a) for a in CNN_BATCHES[0])
    original = tf.function(step).get_concrete_function(x, y)
    result = tflms.rewrite(original, swapout_threshold=1)
    compressed = compress_rewrite(result.graph, result.report.plan, all_zvc(result.report.plan))
    fn = to_concrete_function(compressed, original)
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        ctx.export_run_metadata()
        fn(x, y)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    body = {node.name for node in fn.function_def.node_def}
    graphs = [fg for fg in metadata.function_graphs if body <= {n.name for n in fg.pre_optimization_graph.node}]
    assert len(graphs) == 1
    ran = {n.name for n in graphs[0].post_optimization_graph.node}
    copies = [n for n in compressed.inserted_ops if "/swap_" in n]
    assert not [n for n in copies if n not in ran], "grappler removed swap copies of encoded parts"
    for choice in compressed.choices:  # the codec calls ran, inlined or not
        encode = tflms.compress.rewrite.encode_op_name(choice.tensor)
        assert any(n == encode or n.startswith(encode + "/") for n in ran), encode


# ================================================================ profiling
def test_profiling_measures_real_values_and_leaves_variables_alone():
    model, opt, step = fresh(build_mlp)
    x, y = (tf.constant(a) for a in MLP_BATCHES[0])
    concrete = tf.function(step).get_concrete_function(x, y)
    graph = tf_io.from_concrete_function(concrete)
    matmul = next(op.name for op in graph if op.type == "MatMul" and "gradient" not in op.name)
    relu = next(op.name for op in graph if op.type == "Relu")
    before = snapshot(model, opt)
    report = profile_tensors(concrete, (x, y), [f"{matmul}:0", f"{relu}:0"], graph=graph)
    assert_bitwise_equal(before, snapshot(model, opt), "variables after profiling")
    assert report.pruned_ops > report.kept_ops and not report.restored_variables
    first = (MLP_BATCHES[0][0] @ model.weights[0].numpy())  # the first Dense's MatMul, by hand
    stats = report[f"{matmul}:0"]
    assert stats.num_elements == first.size and stats.shape == first.shape
    assert stats.value_min == pytest.approx(first.min(), rel=1e-5) and stats.value_max == pytest.approx(first.max(),
                                                                                                       rel=1e-5)
    relu_stats = report[f"{relu}:0"]
    assert relu_stats.value_min == 0.0 and 0.2 < relu_stats.sparsity < 0.8
    assert relu_stats.zvc_ratio() > 1.0 and dict(relu_stats.out_of_range)["fp16"] == 0.0
    assert "sparsity" in report.table() and report.to_dict()["tensors"][1]["zvc_ratio"] == relu_stats.zvc_ratio()


def test_profiling_restores_state_written_before_a_candidate():
    counter = tf.Variable(0.0)
    w = tf.Variable(np.ones((4, 4), np.float32))

    def step(x):
        counter.assign_add(1.0)
        h = tf.nn.relu(tf.matmul(x, w) * counter.read_value())
        return tf.reduce_sum(h)

    x = tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4) - 4)
    concrete = tf.function(step).get_concrete_function(x)
    graph = tf_io.from_concrete_function(concrete)
    relu = next(op.name for op in graph if op.type == "Relu")
    report = profile_tensors(concrete, (x,), [f"{relu}:0"], graph=graph)
    assert float(counter.numpy()) == 0.0
    assert len(report.restored_variables) == 1
    assert report[f"{relu}:0"].value_max == float(np.max(np.maximum(x.numpy() @ w.numpy(), 0)))  # counter was 1


# ================================================================ the policy
def _stats(ref: str, sparsity: float, *, value_max: float = 3.0, num_elements: int = 32 * 64) -> TensorStats:
    return TensorStats(ref, "float32", (32, 64), num_elements, 1 - sparsity, 0.0, value_max, 0.0,
                       (("fp16", 1.0 if value_max > 65504 else 0.0),))


SLOW_LINK = HardwareProfile("test-slow-link", "16GiB", 14e12, 900, 0.05, link_latency_s=0.0,
                            launch_overhead_s=0.0)
FAST_LINK = HardwareProfile("test-fast-link", "16GiB", 14e12, 900, 5000, link_latency_s=0.0, launch_overhead_s=0.0)


def test_policy_compresses_exposed_copies_on_a_slow_link():
    _, plan, swapped = mlp_plan()
    stats = {"fw/Relu_0:0": _stats("fw/Relu_0:0", 0.75), "fw/Relu_1:0": _stats("fw/Relu_1:0", 0.5)}
    result = decide_compression(swapped, plan, stats, SLOW_LINK)
    assert [d.codec for d in result.decisions] == ["zvc", "zvc"]
    assert all(d.exposure in (WAITED, CONTENDED) and d.exposed_s > 0 for d in result.decisions)
    first = result.decisions[0].chosen
    n = 32 * 64
    assert first.compressed_bytes == n // 8 + n // 4 * 4  # mask + 25% of the values
    assert first.faster and first.gain_s > 0
    assert [c.tensor.name for c in result.choices] == ["fw/Relu_0:0", "fw/Relu_1:0"]
    assert result.compressed_step_time_s < result.plain_step_time_s and result.simulations == 2
    assert "zvc saves" in result.table() and json.dumps(result.to_dict())


def test_policy_leaves_hidden_or_unprofiled_copies_alone():
    _, plan, swapped = mlp_plan()
    fast = decide_compression(swapped, plan, {"fw/Relu_0:0": _stats("fw/Relu_0:0", 0.75)}, FAST_LINK)
    assert [d.codec for d in fast.decisions] == [None, None] and not fast.choices
    assert fast.decisions[0].exposure == HIDDEN or "not faster" in fast.decisions[0].reason
    assert fast.decisions[1].reason.startswith("not profiled")
    dense = decide_compression(swapped, plan, {"fw/Relu_0:0": _stats("fw/Relu_0:0", 0.0)}, SLOW_LINK)
    # zvc on dense data only adds the mask
    assert dense.decisions[0].codec is None and "zvc: round trip not faster" in dense.decisions[0].reason


def test_policy_lossy_codecs_need_consent_and_values_in_range():
    _, plan, swapped = mlp_plan()
    stats = {"fw/Relu_0:0": _stats("fw/Relu_0:0", 0.0), "fw/Relu_1:0": _stats("fw/Relu_1:0", 0.0, value_max=1e6)}
    with pytest.raises(ConfigError, match="allow_lossy"):
        decide_compression(swapped, plan, stats, SLOW_LINK, codecs=["fp16"])
    lossless = decide_compression(swapped, plan, stats, SLOW_LINK)
    assert not lossless.choices
    lossy = decide_compression(swapped, plan, stats, SLOW_LINK, codecs=["zvc", "fp16"], allow_lossy=True)
    assert lossy.decisions[0].codec == "fp16"
    assert lossy.decisions[1].codec is None and "exceed its range" in lossy.decisions[1].reason


def test_policy_gains_agree_with_the_simulator_on_a_keras_cnn():
    """Decide on a real CNN's measured activations, then check every kept choice by simulation."""
    model, opt, step = fresh(build_cnn)
    x, y = (tf.constant(a) for a in CNN_BATCHES[0])
    concrete = tf.function(step).get_concrete_function(x, y)
    graph = tf_io.from_concrete_function(concrete)
    analysis = analyze_graph(graph)
    plan = plan_swaps(analysis, LMSConfig(), accelerator_device=GPU)
    swapped = apply_swaps(graph, plan).graph
    stats = profile_tensors(concrete, (x, y), [s.tensor for s in plan.swaps], graph=graph)
    profile = dataclasses.replace(tflms.sim.get_profile("v100-16gb-pcie3"), name="v100-slow-link", link_gbps=0.5,
                                  launch_overhead_s=0.0)
    result = decide_compression(swapped, plan, stats, profile)
    assert result.choices, result.table()
    plain = simulate(swapped, profile)
    compressed = simulate(apply_compression(swapped, plan, result.choices).graph, profile)
    assert compressed.step_time_s == pytest.approx(result.compressed_step_time_s)
    assert compressed.step_time_s < plain.step_time_s
    assert compressed.transfer_time_s < plain.transfer_time_s
    compress = make_compressor(stats, profile)  # the same, as one step for the tuner's evaluator
    again = compress(swapped, plan)
    assert tf_io.to_graph_def(again).SerializeToString(deterministic=True) == \
        tf_io.to_graph_def(apply_compression(swapped, plan, result.choices).graph).SerializeToString(deterministic=True)


# ================================================================ calibration
def test_calibrate_measures_saves_and_loads(tmp_path):
    result = cal.calibrate(sizes=(0.0625,), codecs=["zvc", Float16Codec(saturate=False)], repeats=1)
    assert [e.cost_key for e in result.entries] == ["zvc", "fp16-nosat"]
    assert all(e.encode_gbps > 0 and e.decode_gbps > 0 for e in result.entries)
    assert result.get("zvc").ratio == pytest.approx(1 / (0.5 + 1 / 32), rel=0.05)  # ReLU data: half zeros
    path = tmp_path / "codecs.json"
    result.save(str(path))
    loaded = cal.CodecThroughputs.load(str(path))
    assert sorted(loaded.entries, key=lambda e: e.cost_key) == sorted(result.entries, key=lambda e: e.cost_key)
    assert loaded.device == "/device:CPU:0"
    with pytest.raises(ConfigError, match="does not exist"):
        cal.calibrate("/device:GPU:7", sizes=(0.0625,), codecs=["zvc"], repeats=1)


def test_calibrated_profile_costs_codec_calls_with_the_measured_speed():
    _, plan, swapped = mlp_plan()
    new = apply_compression(swapped, plan, {"fw/Relu_0:0": "zvc"}).graph
    profile = cal.with_throughputs("v100-16gb-pcie3", cal.CPU_DEFAULTS)
    records = {r.name: r for r in simulate(new, profile).ops}
    enc = records["lms/encode_fw/Relu_0_0"]
    nbytes = 32 * 64 * 4
    assert enc.end_s - enc.start_s == pytest.approx(nbytes / (0.494e9))  # its one launch on the host (graph clock)
    serial = {r.name: r for r in simulate(new, serial_clock(profile)).ops}["lms/encode_fw/Relu_0_0"]
    assert serial.end_s - serial.start_s == pytest.approx(profile.launch_overhead_s + nbytes / (0.494e9))
    roofline = cal.assumed_for("v100-16gb-pcie3").get("zvc")
    assert roofline.encode_gbps == pytest.approx(900 * 0.6 / CODEC_TRAFFIC["zvc"].encode_passes)


def test_calibrate_main_shows_defaults_and_writes_json(tmp_path, capsys):
    out = tmp_path / "defaults.json"
    assert cal.calibrate_main(["--show-defaults", "--json", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["codecs"]["zvc"]["encode_gbps"] == 0.494 and json.loads(out.read_text()) == printed
    assert cal.calibrate_main(["--show-defaults", "--profile", "h100-80gb-pcie5"]) == 0
    assert "h100-80gb-pcie5 (assumed)" in capsys.readouterr().out
    # the `tflms calibrate` wiring: one subparser, as the other commands
    import argparse
    parser = argparse.ArgumentParser(prog="tflms")
    sub = parser.add_subparsers(dest="command")
    cal.add_calibrate_arguments(sub.add_parser("calibrate", help=cal.CLI_HELP)).set_defaults(func=cal.cmd_calibrate)
    args = parser.parse_args(["calibrate", "--show-defaults"])
    assert args.func(args) == 0 and "zvc" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        cal.CodecThroughputs.from_dict({"nothing": 1})
    assert math.isfinite(BlockInt8Codec().compressed_bytes(100, "float32"))
