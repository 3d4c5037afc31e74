"""Swapping a tensor that waits across the enforced order's peak (tflms.tune.peakswap)."""

from __future__ import annotations

import dataclasses

from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.passes.swaps import apply_swaps
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import get_profile
from tflms.schedule import ordered_ops
from tflms.sim.simulator import simulate
from tflms.testing.graphs import GraphBuilder
from tflms.tune.peakswap import peak_swap

SHAPE = (256, 256)  # 256 KiB: above the order pass's minimum bytes
PROFILE = get_profile("v100-16gb-pcie3")


def _join_graph(fused: bool = False):
    """``d`` is read early by ``m`` and late by ``out``; ``t1``/``t2`` peak beside it (four tensors live).

    The shape of a residual block's backward pass: ``d`` the block's output gradient, ``m``/``t1``/``t2`` the
    main branch's batch-norm backward, ``out`` the identity shortcut's add at the end. ``fused``: ``t1`` is
    a ``MatMul`` whose one consumer is a ``BiasAdd`` (``t1b``), a pair grappler fuses.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    d = b.op("d", "Relu", [x], shape=SHAPE)
    if fused:
        m = b.op("m", "Neg", [d], shape=(SHAPE[0], 16))  # small: only the MatMul's output allocates at the peak
        w, bias = b.op("w", "Placeholder", shape=(16, SHAPE[1])), b.op("bias", "Placeholder", shape=SHAPE[1:])
        t1 = b.op("t1b", "BiasAdd", [b.op("t1", "MatMul", [m, w], shape=SHAPE), bias], shape=SHAPE)
    else:
        m = b.op("m", "Neg", [d], shape=SHAPE)
        t1 = b.op("t1", "Sin", [m], shape=SHAPE)
    t2 = b.op("t2", "Cos", [m], shape=SHAPE)
    s = b.op("s", "AddN", [m, t1, t2], shape=SHAPE)
    c = s
    for k in range(4):
        c = b.op(f"c{k}", "Exp", [c], shape=SHAPE)
    b.op("out", "AddN", [d, c], shape=SHAPE)
    return b.graph


def _empty_plan() -> SwapPlan:
    return SwapPlan(config=LMSConfig(), accelerator_device="/device:GPU:0", swaps=(), skipped=())


def _decide(graph):
    sim = simulate(graph, PROFILE)
    order = [r.name for r in sorted(sim.ops, key=lambda r: (r.start_s, r.end_s)) if r.name in graph]
    ordered = set(ordered_ops(graph, order + [op.name for op in graph if op.name not in set(order)]))
    return sim, peak_swap(graph, sim, _empty_plan(), ordered, PROFILE, analyze_graph(graph))


def test_swapping_the_tensor_waiting_across_the_peak_lowers_it():
    graph = _join_graph()
    sim, decision = _decide(graph)
    size = 256 * 256 * 4
    assert sim.transient_peak_bytes == 4 * size  # d, m, t1, t2
    assert decision is not None and decision.tensor.name == "d:0"
    assert [g.consumers for g in decision.swap_ins] == [("out",)]  # m reads d before the peak: stays on device
    assert {"t1", "t2"} <= set(decision.sync_out_consumers)
    plan = dataclasses.replace(_empty_plan(), swaps=(decision,))
    swapped = apply_swaps(graph, plan).graph
    order = swapped.topological_order()  # the sync and trigger edges close no cycle
    position = {name: k for k, name in enumerate(order)}
    swap_in = decision.swap_ins[0].name
    assert position[swap_in] < position["out"] and position[decision.swap_ins[0].trigger] < position[swap_in]
    after = simulate(swapped, PROFILE)
    assert after.transient_peak_bytes == 3 * size  # d leaves the device before t1 and t2 allocate
    assert after.peak_bytes < sim.peak_bytes


def test_a_peak_swap_obeys_the_never_swap_rules_and_the_users_filters():
    """The tensor waiting across the peak (``d``, a ``Relu``) is not swapped when the plan's config excludes its
    producer's type (``exclude_types``) or its size is under ``min_swap_bytes``: a peak swap asks
    :func:`~tflms.policies.swapplan.skip_reason` like every other swap (the never-swap rules too)."""
    graph = _join_graph()
    analysis = analyze_graph(graph)
    sim = simulate(graph, PROFILE)
    order = [r.name for r in sorted(sim.ops, key=lambda r: (r.start_s, r.end_s)) if r.name in graph]
    ordered = set(ordered_ops(graph, order))
    allowed = peak_swap(graph, sim, _empty_plan(), ordered, PROFILE, analysis)
    assert allowed is not None and allowed.tensor.name == "d:0"  # the control: without the filter it is swapped
    filtered = dataclasses.replace(_empty_plan(), config=LMSConfig(exclude_types=("Relu",)))
    assert peak_swap(graph, sim, filtered, ordered, PROFILE, analysis) is None

    small = dataclasses.replace(_empty_plan(), config=LMSConfig(min_swap_bytes=2 * 256 * 256 * 4))
    assert peak_swap(graph, sim, small, ordered, PROFILE, analysis) is None  # below the user's minimum


def test_peak_swap_is_deterministic():
    assert _decide(_join_graph())[1] == _decide(_join_graph())[1]


def test_nothing_to_swap_when_no_tensor_waits_across_the_peak():
    graph = _join_graph()
    graph.set_input("out", 0, graph.op("c3").output(0))  # out no longer reads d late
    _, decision = _decide(graph)
    assert decision is None


def _ordered(graph, sim):
    order = [r.name for r in sorted(sim.ops, key=lambda r: (r.start_s, r.end_s)) if r.name in graph]
    return set(ordered_ops(graph, order + [op.name for op in graph if op.name not in set(order)]))


def test_a_swap_whose_copy_lags_at_the_peak_makes_the_peak_wait_for_it():
    # d swapped without waits: its copy to the host (tens of microseconds) is still running while m, t1, t2
    # (a microsecond each) peak, so d is still on the device there, as an asynchronous swap-out on a busy
    # link (ResNet-50's pool1_pad at batch 1262 on v100-16gb-nvlink2, sync mode 0)
    graph = _join_graph()
    size = 256 * 256 * 4
    first = _decide(graph)[1]
    plan = dataclasses.replace(_empty_plan(), swaps=(dataclasses.replace(first, sync_out_consumers=()),))
    lagging = apply_swaps(graph, plan).graph
    sim = simulate(lagging, PROFILE)
    assert sim.transient_peak_bytes == 4 * size  # the control: d's buffer outlives the copy's start
    decision = peak_swap(lagging, sim, plan, _ordered(lagging, sim), PROFILE, analyze_graph(graph))
    assert decision is not None and decision.tensor.name == "d:0"
    assert decision.swap_ins == first.swap_ins  # the same swap, now with waits
    assert {"t1", "t2"} <= set(decision.sync_out_consumers)
    waited = apply_swaps(graph, dataclasses.replace(plan, swaps=(decision,))).graph
    waited.topological_order()
    assert simulate(waited, PROFILE).transient_peak_bytes == 3 * size


def test_an_op_the_order_does_not_pin_hands_its_wait_to_its_pinned_producer():
    # t1 becomes a MatMul whose one consumer is a BiasAdd: grappler fuses the pair only without control
    # inputs, so the order leaves t1 alone and the wait goes to m, which t1 cannot start before
    graph = _join_graph(fused=True)
    sim = simulate(graph, PROFILE)
    ordered = _ordered(graph, sim)
    assert "t1" not in ordered
    decision = _decide(graph)[1]
    assert decision is not None and decision.tensor.name == "d:0"
    assert "t1" not in decision.sync_out_consumers and "m" in decision.sync_out_consumers
    waited = apply_swaps(graph, dataclasses.replace(_empty_plan(), swaps=(decision,))).graph
    waited.topological_order()
    assert simulate(waited, PROFILE).transient_peak_bytes < sim.transient_peak_bytes


def test_a_peak_swap_on_a_traced_two_branch_model_trains_bitwise():
    """The swap, its sync and trigger edges and the order pass's edges, run by TensorFlow: same bytes."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from test_schedule import assert_traced_step_trains_like_plain, traced_step_plan
    from tflms.passes.order import enforce_order

    graph, analysis, plan = traced_step_plan(swapout_threshold=42, swapin_ahead=1, swapin_groupby=4)
    swapped = apply_swaps(graph, plan).graph
    ordered = enforce_order(swapped, PROFILE)
    sim = ordered.report.ordered_sim
    names = [r.name for r in sorted(sim.ops, key=lambda r: (r.start_s, r.end_s)) if r.name in swapped]
    pinned = set(ordered_ops(swapped, names + [op.name for op in swapped if op.name not in set(names)]))
    decision = peak_swap(swapped, sim, plan, pinned, PROFILE, analysis)
    assert decision is not None  # the gradient AddN of the two branches, waiting across the short_bn backward
    rewritten = enforce_order(apply_swaps(graph, dataclasses.replace(plan, swaps=plan.swaps + (decision,))).graph,
                              PROFILE)
    assert rewritten.changed and decision.swap_out in rewritten.graph and decision.swap_ins[0].name in rewritten.graph

    assert_traced_step_trains_like_plain(rewritten.graph, "peak-swapped")
