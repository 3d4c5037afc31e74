"""Simulator: worked-out peaks and step times on tiny graphs."""

from __future__ import annotations

import pytest

import tflms
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import TensorRef
from tflms.sim import HardwareProfile, SimOptions, get_profile, profile_names, simulate
from tflms.testing import GraphBuilder, mlp_training_graph

T = (4, 4)  # 64-byte float32 tensors


def unit_profile(copy_s: float = 0.5) -> HardwareProfile:
    """16 FLOP/s (a 4x4 element-wise op takes 1 s), free memory traffic, 64 B copies take ``copy_s``."""
    return HardwareProfile("unit", memory_bytes=1024, peak_flops=16, memory_gbps=1e9,
                           link_gbps=64 / copy_s / 1e9, link_latency_s=0, launch_overhead_s=0,
                           compute_efficiency=1, link_efficiency=1)


def chain():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    bb = b.op("b", "Relu", [a], shape=T)
    c = b.op("c", "Relu", [bb], shape=T)
    b.op("d", "AddV2", [a, c], shape=T)
    return b


def test_chain_peak_with_buffer_forwarding():
    # x is resident (64). a: +64. b: +64 (a is still needed by d). c reuses b's buffer, d reuses a's.
    result = simulate(chain().graph, unit_profile())
    assert (result.resident_bytes, result.peak_bytes, result.transient_peak_bytes) == (64, 192, 128)
    assert result.step_time_s == pytest.approx(4.0)
    assert result.live_at_peak == (("a:0", 64), ("b:0", 64))


def test_chain_peak_without_forwarding():
    # a, b, c all alive while c runs: 64 (x) + 3 * 64.
    result = simulate(chain().graph, unit_profile(), options=SimOptions(model_forwarding=False))
    assert result.peak_bytes == 256
    assert result.live_at_peak == (("a:0", 64), ("b:0", 64), ("c:0", 64))


@pytest.mark.parametrize("reduced, expected_peak", [((4, 4), 64 + 64 + 64), ((4, 1), 64 + 64 + 16 + 64)])
def test_a_reduction_that_reduces_nothing_shares_its_input_buffer(reduced, expected_peak):
    """TensorFlow's ReductionOp hands back its input's buffer when it reduces nothing (a broadcasting Add's
    gradient Sum over run-time axes); a real reduction allocates. Simulator and scheduler agree."""
    from tflms.schedule import replay_peak
    from tflms.schedule.memory import buffer_model
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    axes = b.op("axes", "Const", shape=(1,), dtype="int32")
    s = b.op("s", "Sum", [a, axes], shape=reduced)
    b.op("out", "Mul", [a, s], shape=T)  # a stays alive past the Sum
    result = simulate(b.graph, unit_profile(), options=SimOptions(model_forwarding=False))
    assert result.peak_bytes - 4 == expected_peak  # the Const axes (4 bytes) are resident
    order = [op.name for op in b.graph.ops]
    assert replay_peak(buffer_model(b.graph, SimOptions(model_forwarding=False)), order) == result.peak_bytes


def swapped_chain(copy_s: float, swapin_device: str = "/device:CPU:0"):
    """a is swapped out after it is made and back in (triggered by b) for its last consumer e."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    bb = b.op("b", "Relu", [a], shape=T)
    c = b.op("c", "Relu", [bb], shape=T)
    e = b.op("e", "AddV2", [a, c], shape=T)
    del e
    g = b.graph
    g.add_op("out", "Identity", inputs=[TensorRef("a")], device="/device:CPU:0", outputs=[g.tensor("a:0")])
    g.add_op("in", "Identity", inputs=[TensorRef("out")], control_inputs=["b"], device=swapin_device,
             outputs=[g.tensor("a:0")])
    g.set_input("e", 0, TensorRef("in"))
    return g, unit_profile(copy_s)


def test_swap_that_hides_behind_compute():
    g, profile = swapped_chain(copy_s=0.5)
    result = simulate(g, profile)
    spans = {r.name: (r.stream, r.start_s, r.end_s) for r in result.ops}
    assert spans["out"] == ("d2h", 1.0, 1.5)
    assert spans["in"] == ("host", 2.0, 2.0)  # the host-side swap-in waits for its trigger b
    assert spans["in/_recv"] == ("h2d", 2.0, 2.5)  # TensorFlow's _Recv copies it back then
    assert spans["e"] == ("compute", 3.0, 4.0)
    assert result.step_time_s == pytest.approx(4.0) and result.stall_time_s == 0
    assert result.host_peak_bytes == 64
    assert result.peak_bytes == 192


def test_accelerator_side_swap_in_is_copied_back_at_once():
    # TensorFlow's _Recv has no control inputs: the trigger only delays the Identity, not the copy.
    g, profile = swapped_chain(copy_s=0.5, swapin_device="/device:GPU:0")
    spans = {r.name: (r.stream, r.start_s, r.end_s) for r in simulate(g, profile).ops}
    assert spans["out/_recv"] == ("h2d", 1.5, 2.0)


def test_deep_copy_swap_in_is_the_copy_itself():
    # The two-logical-CPU emulation: cross-device edges share buffers and DeepCopy allocates.
    g, profile = swapped_chain(copy_s=0.5, swapin_device="/device:GPU:0")
    g.op("in").type = "DeepCopy"
    spans = {r.name: (r.stream, r.start_s, r.end_s) for r in simulate(g, profile).ops}
    assert spans["in"] == ("h2d", 2.0, 2.5)


def test_swap_that_stalls_the_consumer():
    g, profile = swapped_chain(copy_s=2.0)
    result = simulate(g, profile)
    spans = {r.name: (r.start_s, r.end_s) for r in result.ops}
    assert spans["out"] == (1.0, 3.0)
    assert spans["in/_recv"] == (3.0, 5.0)
    assert spans["e"] == (5.0, 6.0)
    assert result.step_time_s == pytest.approx(6.0)
    assert result.stall_time_s == pytest.approx(2.0)
    assert result.transfer_time_s == pytest.approx(4.0)


def test_diamond_peak():
    # x -> a -> (b, c) -> d: both branches alive together, then joined.
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    left = b.op("b", "Relu", [a], shape=T)
    right = b.op("c", "Tanh", [a], shape=T)  # c is a's last reader: reuses a's buffer
    b.op("d", "AddV2", [left, right], shape=T)  # reuses b's buffer
    result = simulate(b.graph, unit_profile())
    assert result.peak_bytes == 64 + 128
    assert result.step_time_s == pytest.approx(1 + 1 + 4 + 1)  # Tanh is 4 FLOPs per element


def test_swapping_lowers_the_simulated_peak_of_an_mlp_step():
    graph = mlp_training_graph(8, batch=256, width=1024)
    profile = get_profile("v100-16gb-pcie3")
    before = simulate(graph, profile)
    result = tflms.rewrite(graph, accelerator_device="/device:GPU:0", swapout_threshold=4)
    after = simulate(result.graph, profile)
    assert result.report.num_swapped == 7
    assert after.peak_bytes < before.peak_bytes
    assert after.host_peak_bytes > 0 == before.host_peak_bytes
    assert after.step_time_s >= before.step_time_s
    assert after.resident_bytes == before.resident_bytes == 8 * 1024 * 1024 * 4 + 2 * 256 * 1024 * 4 + 4


def test_margin_and_fit():
    result = simulate(chain().graph, unit_profile(), options=SimOptions(margin_fraction=0.5, margin_bytes=8))
    assert result.peak_with_margin_bytes == 192 + 96 + 8
    assert result.fits(296) and not result.fits(295)


def test_given_order_is_checked():
    g = chain().graph
    with pytest.raises(GraphError, match="runs 'a' before its input 'x'"):
        simulate(g, unit_profile(), order=["a", "x", "b", "c", "d"])
    with pytest.raises(GraphError, match="every op exactly once"):
        simulate(g, unit_profile(), order=["x", "a"])


def test_profiles():
    assert {"v100-16gb-pcie3", "v100-32gb-nvlink2", "a100-80gb-pcie4", "h100-80gb-pcie5", "gh200"} <= set(
        profile_names())
    v100 = get_profile("v100-16gb-pcie3")
    assert v100.memory_bytes == 16 * 2**30
    assert v100.copy_time_s(2**30) == pytest.approx(10e-6 + 2**30 / (15.75e9 * 0.8))
    with pytest.raises(ConfigError, match="unknown hardware profile 'p100'"):
        get_profile("p100")
    with pytest.raises(ConfigError, match="link_efficiency must be in"):
        HardwareProfile("bad", "1GiB", 1e12, 100, 10, link_efficiency=1.5)


def test_einsum_flops_from_its_equation():
    import tensorflow as tf

    from tflms.ir import tf_io
    from tflms.sim.cost import op_flops

    @tf.function
    def attention_scores(q, k):
        return tf.einsum("bqhd,bkhd->bhqk", q, k)

    graph = tf_io.from_concrete_function(attention_scores.get_concrete_function(
        tf.TensorSpec((2, 8, 4, 16)), tf.TensorSpec((2, 8, 4, 16))))
    (einsum,) = [op for op in graph if op.type == "Einsum"]
    assert op_flops(graph, einsum) == 2.0 * 2 * 8 * 4 * 16 * 8  # b q h d k
