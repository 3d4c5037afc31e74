"""Copies queue on one stream per direction: worked out by hand on a chain (unit profile: a 4x4 element-wise
op takes 1 s, a 64-byte copy takes 1 s, memory traffic is free)."""

from __future__ import annotations

import pytest

from tflms.ir.graph import TensorRef
from tflms.sim import HardwareProfile, SimOptions, simulate
from tflms.tune.evaluator import PlanEvaluator
from tflms.testing import GraphBuilder

T = (4, 4)  # 64-byte float32 tensors
HOST = "/device:CPU:0"


def unit_profile(copy_s: float = 1.0) -> HardwareProfile:
    return HardwareProfile("unit", memory_bytes=4096, peak_flops=16, memory_gbps=1e9,
                           link_gbps=64 / copy_s / 1e9, link_latency_s=0, launch_overhead_s=0,
                           compute_efficiency=1, link_efficiency=1)


def two_swaps(trigger_a: str = "c", trigger_b: str = "c"):
    """x -> a -> b -> c -> d -> e = AddN(a, b, d); a and b are swapped out and back in for e.

    Compute (1 s each): a 0-1, b 1-2, c 2-3, d 3-4. Swap-outs queue on the device-to-host stream:
    a's 1-2, b's 2-3. Both swap-ins (host Identities triggered by c, ending 3) become host-to-device
    copies (TensorFlow's _Recv) that queue on the other stream: a's 3-4, b's 4-5. e needs both and d
    (4): it waits for b's copy until 5 (1 s of stall) and runs 5-6.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    bb = b.op("b", "Relu", [a], shape=T)
    c = b.op("c", "Relu", [bb], shape=T)
    d = b.op("d", "Relu", [c], shape=T)
    b.op("e", "AddN", [a, bb, d], shape=T)
    g = b.graph
    for name, trigger, index in (("a", trigger_a, 0), ("b", trigger_b, 1)):
        g.add_op(f"out_{name}", "Identity", inputs=[TensorRef(name)], device=HOST, outputs=[g.tensor(f"{name}:0")])
        g.add_op(f"in_{name}", "Identity", inputs=[TensorRef(f"out_{name}")], control_inputs=[trigger], device=HOST,
                 outputs=[g.tensor(f"{name}:0")])
        g.set_input("e", index, TensorRef(f"in_{name}"))
    return g


def spans(result):
    return {r.name: (r.stream, r.start_s, r.end_s) for r in result.ops}


BOTH = pytest.mark.parametrize("transfer_order", ["release", "fifo"])


@BOTH
def test_two_swap_ins_contend_for_the_host_to_device_stream(transfer_order):
    result = simulate(two_swaps(), unit_profile(), options=SimOptions(transfer_order=transfer_order))
    s = spans(result)
    assert s["out_a"] == ("d2h", 1.0, 2.0) and s["out_b"] == ("d2h", 2.0, 3.0)
    assert s["in_a"] == ("host", 3.0, 3.0) and s["in_b"] == ("host", 3.0, 3.0)
    assert s["in_a/_recv"] == ("h2d", 3.0, 4.0)
    assert s["in_b/_recv"] == ("h2d", 4.0, 5.0)  # queued behind a's copy
    assert s["e"] == ("compute", 5.0, 6.0)
    assert result.step_time_s == pytest.approx(6.0)
    assert result.stall_time_s == pytest.approx(1.0)  # the queue shows up as stall
    assert result.transfer_time_s == pytest.approx(4.0)


@BOTH
def test_swap_outs_queue_on_the_device_to_host_stream(transfer_order):
    # With 2 s copies, b's swap-out (ready at 2) waits for a's (1-3) and runs 3-5; the swap-ins are
    # triggered by c (ends 3) but wait for their swap-outs: a's copy back 3-5, b's 5-7; e runs 7-8.
    result = simulate(two_swaps(), unit_profile(copy_s=2.0), options=SimOptions(transfer_order=transfer_order))
    s = spans(result)
    assert s["out_a"][1:] == (1.0, 3.0) and s["out_b"][1:] == (3.0, 5.0)
    assert s["in_a/_recv"][1:] == (3.0, 5.0) and s["in_b/_recv"][1:] == (5.0, 7.0)
    assert s["e"][1:] == (7.0, 8.0)
    assert result.stall_time_s == pytest.approx(3.0)


@BOTH
def test_an_earlier_trigger_takes_the_stream_first(transfer_order):
    # b's swap-in is triggered by c (ends 3), a's by d (ends 4): b's copy runs 3-4, a's 4-5, and e waits 1 s.
    result = simulate(two_swaps(trigger_a="d", trigger_b="c"), unit_profile(),
                      options=SimOptions(transfer_order=transfer_order))
    s = spans(result)
    assert s["in_b/_recv"][1:] == (3.0, 4.0)
    assert s["in_a/_recv"][1:] == (4.0, 5.0)
    assert s["e"][1:] == (5.0, 6.0) and result.stall_time_s == pytest.approx(1.0)


def test_the_evaluator_sees_the_same_queue():
    from tflms.config import LMSConfig
    from tflms.policies.swapplan import SwapDecision, SwapInGroup, SwapPlan
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    bb = b.op("b", "Relu", [a], shape=T)
    c = b.op("c", "Relu", [bb], shape=T)
    d = b.op("d", "Relu", [c], shape=T)
    b.op("e", "AddN", [a, bb, d], shape=T)
    swaps = tuple(SwapDecision(tensor=TensorRef(n), dtype="float32", num_bytes=64, producer_level=lvl,
                               swap_out=f"lms/swap_out_{n}_0", sync_out_consumers=(),
                               swap_ins=(SwapInGroup(f"lms/swap_in_{n}_0_0", ("e",), (5,), "c", 3, False),))
                  for n, lvl in (("a", 1), ("b", 2)))
    plan = SwapPlan(config=LMSConfig(host_device=HOST), accelerator_device="/device:GPU:0", swaps=swaps, skipped=())
    result = PlanEvaluator(b.graph, unit_profile()).evaluate(plan)
    s = spans(result)
    assert s["lms/swap_in_a_0_0/_recv"][1:] == (3.0, 4.0) and s["lms/swap_in_b_0_0/_recv"][1:] == (4.0, 5.0)
    assert result.step_time_s == pytest.approx(6.0) and result.stall_time_s == pytest.approx(1.0)


def parallel_triggers():
    """Two branches x -> a -> c1 and x -> b -> c2 meet in d; e = AddN(a, b, d) reads both swapped tensors.

    Levels: a, b 1; c1, c2 2; d 3; e 4. Compute (1 s each, 0.5 s copies): a 0-1, b 1-2, c1 2-3, c2 3-4,
    d 4-5. Swap-outs: a's 1-1.5, b's 2-2.5. b's swap-in is triggered by c1 (ends 3), a's by c2 (ends 4):
    both host swap-ins are on level 3, a's first in graph order.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    bb = b.op("b", "Relu", [x], shape=T)
    c1 = b.op("c1", "Relu", [a], shape=T)
    c2 = b.op("c2", "Relu", [bb], shape=T)
    d = b.op("d", "AddV2", [c1, c2], shape=T)
    b.op("e", "AddN", [a, bb, d], shape=T)
    g = b.graph
    for name, trigger, index in (("a", "c2", 0), ("b", "c1", 1)):
        g.add_op(f"out_{name}", "Identity", inputs=[TensorRef(name)], device=HOST, outputs=[g.tensor(f"{name}:0")])
        g.add_op(f"in_{name}", "Identity", inputs=[TensorRef(f"out_{name}")], control_inputs=[trigger], device=HOST,
                 outputs=[g.tensor(f"{name}:0")])
        g.set_input("e", index, TensorRef(f"in_{name}"))
    return g


def test_fifo_serves_the_copy_that_was_ready_first():
    # b's swap-in runs at 3 (c1 ended), a's at 4 (c2 ended). First come, first served: b's copy 3-3.5,
    # a's 4-4.5; e runs after d, 5-6.
    result = simulate(parallel_triggers(), unit_profile(0.5), options=SimOptions(transfer_order="fifo"))
    s = spans(result)
    assert s["in_b"][1:] == (3.0, 3.0) and s["in_a"][1:] == (4.0, 4.0)
    assert s["in_b/_recv"][1:] == (3.0, 3.5)
    assert s["in_a/_recv"][1:] == (4.0, 4.5)
    assert s["e"][1:] == (5.0, 6.0) and result.stall_time_s == 0


def test_release_order_queues_by_position_in_the_order():
    # The level order runs in_a (level 3, first in graph order) before in_b: in_a's copy is released first
    # (at 4) and in_b's copy, ready at 3, waits behind it: 4.5-5.0 (the "release" model's inaccuracy).
    s = spans(simulate(parallel_triggers(), unit_profile(0.5)))
    assert s["in_a/_recv"][1:] == (4.0, 4.5)
    assert s["in_b/_recv"][1:] == (4.5, 5.0)


@pytest.mark.parametrize("seed", range(6))
def test_fifo_evaluator_equals_fifo_simulate_of_the_rewritten_graph(seed):
    import random

    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.tflms_rules import plan_swaps
    from tflms.testing import mlp_training_graph
    rng = random.Random(seed)
    graph = mlp_training_graph(6, batch=64, width=128)
    analysis = analyze_graph(graph)
    options = SimOptions(transfer_order="fifo")
    evaluator = PlanEvaluator(graph, "v100-16gb-pcie3", options)
    config = LMSConfig(swapout_threshold=rng.randint(1, 20), swapin_ahead=rng.randint(1, 8),
                       swapin_groupby=rng.randint(0, 4), sync_mode=rng.randint(0, 3))
    plan = plan_swaps(analysis, config, accelerator_device="/device:GPU:0")
    got = evaluator.evaluate(plan)
    want = simulate(apply_swaps(graph, plan).graph, "v100-16gb-pcie3", options=options)
    assert (got.peak_bytes, got.step_time_s, got.timeline, got.ops, got.live_at_peak) == \
        (want.peak_bytes, want.step_time_s, want.timeline, want.ops, want.live_at_peak)


def test_an_op_whose_input_copy_never_starts_is_named():
    """A compute op reading a copy that nothing ever releases (its own inputs not run before it: no valid order has
    one) is refused with both names, not timed from a missing end."""
    from tflms.errors import GraphError
    from tflms.sim.clock import Kernels
    from tflms.sim import get_profile
    from tflms.sim.engine import _time_release
    from tflms.sim.indexed import ACCEL, IndexedGraph

    net = IndexedGraph()
    net.add_op("early", "NoOp", ACCEL, [], [], [])
    net.add_op("copy", "Identity", ACCEL, [], [], [])  # (a copy with no input: never released)
    net.add_op("reader", "NoOp", ACCEL, [], [0, 1], [])
    kernels = Kernels("serial", [1.0, 0.0, 1.0], [0.0] * 3, 2)
    with pytest.raises(GraphError, match="'reader' depends on 'copy', which the schedule cannot run before it"):
        _time_release(net, [0, 1, 2], [0, 1, 2], [False, True, False], kernels, get_profile("v100-16gb-pcie3"))
    net.preds[2] = [1]  # (the copy alone)
    with pytest.raises(GraphError, match="'reader' depends on 'copy'"):
        _time_release(net, [0, 1, 2], [0, 1, 2], [False, True, False], kernels, get_profile("v100-16gb-pcie3"))
