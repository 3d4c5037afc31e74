"""tools/hybrid_report.py: one plan's step taken apart (copies, link busy time, its overlap with compute, shape-only
swap-ins), worked out by hand on tiny graphs with hand-made swap plans (simulated, like the tool's figures)."""

from __future__ import annotations

import pytest

from tflms.config import LMSConfig
from tflms.ir.graph import TensorRef
from tflms.policies.swapplan import SwapDecision, SwapInGroup, SwapPlan, swap_op_names
from tflms.sim import HardwareProfile, SimOptions
from tflms.testing import GraphBuilder

T = (4, 4)  # 64-byte float32 tensors
GPU = "/device:GPU:0"


@pytest.fixture()
def tool(load_tool):
    return load_tool("hybrid_report")


def bytes_profile() -> HardwareProfile:
    """Free FLOPs, 64 bytes per second of memory traffic and of link: an element-wise op on 64-byte tensors takes
    2 s, an add of two 3 s, a 64-byte copy 1 s; no launches (as tests/test_xla_pricing.py)."""
    return HardwareProfile("bytes", memory_bytes=1 << 20, peak_flops=1e12, memory_gbps=64e-9, link_gbps=64e-9,
                           link_latency_s=0, launch_overhead_s=0, compute_efficiency=1, link_efficiency=1)


def chain(shape_reader: bool = False):
    """x -> r0 -> r1 -> r2 -> d = r2 + r0; with ``shape_reader``, also s = Shape(r0), read by nothing."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("r0", "Relu", ["x"], shape=T)
    b.op("r1", "Relu", ["r0"], shape=T)
    b.op("r2", "Relu", ["r1"], shape=T)
    b.op("d", "AddV2", ["r2", "r0"], shape=T)
    if shape_reader:
        b.op("s", "Shape", ["r0"], shape=(2,), dtype="int32")
    return b.graph


def swap_r0(groups: list[tuple[tuple[str, ...], str]]) -> SwapPlan:
    """r0 swapped out once and back in for each ``(consumers, trigger)`` group."""
    ref = TensorRef("r0", 0)
    out_name, in_base = swap_op_names(ref)
    swap_ins = tuple(SwapInGroup(name=f"{in_base}_{k}", consumers=consumers, consumer_levels=(), trigger=trigger,
                                 trigger_level=None, sync=False) for k, (consumers, trigger) in enumerate(groups))
    return SwapPlan(config=LMSConfig(), accelerator_device=GPU, skipped=(), swaps=(SwapDecision(
        tensor=ref, dtype="float32", num_bytes=64, producer_level=1, swap_out=out_name, sync_out_consumers=(),
        swap_ins=swap_ins),))


def test_one_swap_on_the_clustered_clock(tool):
    # clusters {r0}, {r1}, {r2, d}: r0 0-2; its swap-out waits for its cluster's end and copies 2-3 while r1 runs 2-4;
    # the swap-in (trigger r1) copies 4-5 while nothing computes; {r2, d} (one kernel reading r1 and the swap-in,
    # writing d: 3 s) starts when its inputs exist, 5-8
    got = tool.analyse_plan(chain(), swap_r0([(("d",), "r1")]), bytes_profile(), SimOptions(clock="xla-clusters"))
    assert (got["bytes_out"], got["bytes_in"], got["swaps"], got["swap_ins"]) == (64, 64, 1, 1)
    assert got["step_s"] == pytest.approx(8.0)
    assert got["compute_busy_s"] == pytest.approx(7.0) and got["compute_idle_s"] == pytest.approx(1.0)
    assert (got["d2h_busy_s"], got["d2h_with_compute_s"]) == pytest.approx((1.0, 1.0))
    assert (got["h2d_busy_s"], got["h2d_with_compute_s"]) == pytest.approx((1.0, 0.0))
    assert (got["d2h_copies"], got["h2d_copies"]) == (1, 1)
    assert (got["shape_only_swap_ins"], got["shape_only_bytes"]) == (0, 0)
    # over the whole step XLA fuses r1 and r2 into d: r0 0-2, out 2-3, in 3-4, d 4-7
    assert (got["compare_clock"], got["compare_step_s"]) == ("xla", pytest.approx(7.0))


def test_one_swap_op_by_op(tool):
    # graph clock, one kernel per op: r0 0-2, r1 2-4, r2 4-6, d 6-9; the swap-out copies 2-3 under r1, the swap-in
    # 4-5 under r2: both links hidden, the compute stream never idle
    got = tool.analyse_plan(chain(), swap_r0([(("d",), "r1")]), bytes_profile(), SimOptions(clock="graph"))
    assert got["step_s"] == pytest.approx(9.0) and got["compute_idle_s"] == pytest.approx(0.0)
    assert (got["d2h_busy_s"], got["d2h_with_compute_s"]) == pytest.approx((1.0, 1.0))
    assert (got["h2d_busy_s"], got["h2d_with_compute_s"]) == pytest.approx((1.0, 1.0))


def test_no_plan_is_the_step_as_it_is(tool):
    got = tool.analyse_plan(chain(), None, bytes_profile(), SimOptions(clock="graph"), compare_clock=None)
    assert (got["bytes_out"], got["bytes_in"], got["h2d_busy_s"], got["d2h_busy_s"]) == (0, 0, 0.0, 0.0)
    assert got["step_s"] == pytest.approx(9.0) and got["compare_step_s"] is None


def test_a_swap_in_read_only_by_a_shape_reader_is_found(tool):
    # r0 back in twice: for d (trigger r1) and for s = Shape(r0) alone (no trigger): the second copies 64 bytes back
    # for its metadata
    graph = chain(shape_reader=True)
    plan = swap_r0([(("d",), "r1"), (("s",), None)])
    got = tool.analyse_plan(graph, plan, bytes_profile(), SimOptions(clock="graph"))
    assert (got["bytes_out"], got["bytes_in"], got["swap_ins"], got["h2d_copies"]) == (64, 128, 2, 2)
    assert (got["shape_only_swap_ins"], got["shape_only_bytes"]) == (1, 64)
    found = tool.shape_only_swap_ins(graph, tool.rewritten(graph, plan), plan)
    assert found == [(plan.swaps[0].swap_ins[1].name, 64)]
    # d and s in one group: a reader that needs the data, so not shape-only
    both = tool.analyse_plan(graph, swap_r0([(("d", "s"), "r1")]), bytes_profile(), SimOptions(clock="graph"))
    assert (both["bytes_in"], both["shape_only_swap_ins"], both["shape_only_bytes"]) == (64, 0, 0)


def test_intervals(tool):
    u = tool.union([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0), (2.0, 2.5), (5.0, 5.0)])
    assert u == [(0.0, 2.5), (3.0, 4.0)] and tool.measure(u) == pytest.approx(3.5)
    assert tool.overlap([(1.0, 3.5)], u) == pytest.approx(2.0)  # 1-2.5 and 3-3.5
    assert tool.overlap(u, []) == 0.0
