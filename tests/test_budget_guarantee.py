"""A budgeted rewrite must fit in TensorFlow's executor, not only in the order it was simulated in (issue 31).

TensorFlow's executor runs every op whose inputs are ready, on several threads, so the order the tuner
judged a plan in holds only where control edges pin it. ``hold_to_budget`` (every budgeted rewrite runs it)
keeps the tuner's pinned order, proves that no order can go over the budget
(:func:`tflms.sim.footprint.any_order_peak_bound`), or pins level order; with ``enforce_order`` off it says
the peak is not guaranteed and how far it could rise.
"""

from __future__ import annotations

import numpy as np
import pytest

import tflms
from tflms.config import LMSConfig
from tflms.ir import tf_io
from tflms.measure import ACCELERATOR_DEVICE, EMULATION_PROFILE, EMULATION_SIM_OPTIONS, HOST_DEVICE
from tflms.passes.order import (GUARANTEE_ANY_ORDER, GUARANTEE_NONE, GUARANTEE_PINNED, hold_to_budget,
                                pin_level_order)
from tflms.schedule.order import HEURISTICS, schedule_with_report
from tflms.sim.footprint import any_order_peak_bound
from tflms.sim.simulator import SimOptions, simulate
from tflms.testing.graphs import forward_backward_chain, mlp_training_graph, two_branch_graph

MIB = 1 << 20
N, M = 1024, 2048  # x is N x N; each product N x M float32: 8 MiB


def race_graph_def():
    """Two 8 MiB products of x. ``a1`` is slow; ``b1`` waits (a control edge) for a short chain of scalar ops,
    so level order runs it after ``a1``'s reduction (one product live at a time: 8 MiB), while TensorFlow's
    executor starts it as soon as the chain is done, beside ``a1`` on its second thread (16 MiB)."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [N, N], name="x")
        a1 = tf.matmul(x, tf.constant(np.full((N, M), 1e-3, np.float32), name="w1"), name="a1")
        a2 = tf.reduce_sum(a1, name="a2")
        c2 = tf.multiply(tf.reduce_sum(x, name="c"), 2.0, name="c2")
        with tf.control_dependencies([c2]):
            b1 = tf.matmul(x, tf.constant(np.full((N, M), 2e-3, np.float32), name="w2"), name="b1")
        tf.add(a2, tf.reduce_sum(b1, name="b2"), name="out")
    return graph.as_graph_def()


def test_the_any_order_bound_is_above_every_schedule_and_exact_on_the_race():
    options = SimOptions()
    for graph in (mlp_training_graph(4), forward_backward_chain(), two_branch_graph()):
        bound = any_order_peak_bound(graph, options)
        peaks = schedule_with_report(graph, options=options, heuristics=HEURISTICS).peaks
        assert bound.bound_bytes >= max(peaks.values())
        assert bound.bound_bytes >= simulate(graph, "v100-16gb-pcie3", options=options).peak_bytes
    race = tf_io.from_graph_def(race_graph_def())
    bound = any_order_peak_bound(race, EMULATION_SIM_OPTIONS)
    level = simulate(race, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS)
    # a1's and b1's products together (+ scalars), against one at a time in level order
    assert bound.transient_bytes - 2 * N * M * 4 in range(0, 64)
    assert level.transient_peak_bytes - N * M * 4 in range(0, 64)


def test_hold_to_budget_proves_pins_or_says_so():
    race = tf_io.from_graph_def(race_graph_def())
    level = simulate(race, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS)
    bound = any_order_peak_bound(race, EMULATION_SIM_OPTIONS).bound_bytes
    # a budget every order fits: nothing added
    same, record = hold_to_budget(race, None, budget_bytes=bound, options=EMULATION_SIM_OPTIONS)
    assert same is race and record["guarantee"] == GUARANTEE_ANY_ORDER and record["any_order_bound_bytes"] == bound
    # between level order's peak and the bound: level order pinned, b1 after a1's reduction
    budget = level.peak_bytes + 4 * MIB
    pinned, record = hold_to_budget(race, None, budget_bytes=budget, options=EMULATION_SIM_OPTIONS)
    assert record["guarantee"] == GUARANTEE_PINNED and record["applied"] and ("a2", "b1") in [
        tuple(e) for e in pin_level_order(race, options=EMULATION_SIM_OPTIONS).report.edges]
    assert "^a2" in {n.name: n for n in tf_io.to_graph_def(pinned).node}["b1"].input
    assert simulate(pinned, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS).peak_bytes == level.peak_bytes
    assert any_order_peak_bound(pinned, EMULATION_SIM_OPTIONS).bound_bytes <= budget  # now every order fits
    # enforce_order off: nothing pinned, and the record says by how much the peak could rise
    free, record = hold_to_budget(race, None, budget_bytes=budget, options=EMULATION_SIM_OPTIONS, pin=False)
    assert free is race and record["guarantee"] == GUARANTEE_NONE
    assert "not guaranteed" in record["guarantee_why"] and "36.00 MiB" in record["guarantee_why"]
    # an order the tuner already pinned is kept as it is
    kept, record = hold_to_budget(race, {"applied": True, "why": "x"}, budget_bytes=budget)
    assert kept is race and record["guarantee"] == GUARANTEE_PINNED


def _rewrite(budget: int, **options):
    config = LMSConfig(accelerator_device=ACCELERATOR_DEVICE, host_device=HOST_DEVICE, budget=budget, **options)
    return tflms.rewrite(tf_io.from_graph_def(race_graph_def()), config, copy_op="DeepCopy",
                         require_backward=False)


def test_the_report_says_how_the_budget_is_held():
    race = tf_io.from_graph_def(race_graph_def())
    budget = simulate(race, "v100-16gb-pcie3", options=SimOptions(host_device=HOST_DEVICE)).peak_bytes + 4 * MIB
    result = _rewrite(budget)
    assert result.report.order["guarantee"] == GUARANTEE_PINNED
    assert "budget in TensorFlow's executor: level order pinned (1 edges)" in result.report.table()
    unpinned = _rewrite(budget, enforce_order=False)
    assert unpinned.report.order["guarantee"] == GUARANTEE_NONE
    assert any("not guaranteed" in w for w in unpinned.report.warnings)
    roomy = _rewrite(budget + 8 * MIB)
    assert roomy.report.order["guarantee"] == GUARANTEE_ANY_ORDER and not roomy.report.order.get("applied")


@pytest.mark.slow
def test_a_step_that_fits_in_level_order_stays_under_its_budget_in_tensorflows_executor():
    """The tuner leaves the race graph alone (it fits in level order), and TensorFlow's executor, free, runs
    both products at once, over the budget (the control: what tflms returned before issue 31). Pinned, every
    run stays under it."""
    from tflms.measure.executor import ExecutorRequest, measure_executor_peaks
    race = tf_io.from_graph_def(race_graph_def())
    level = simulate(race, "v100-16gb-pcie3", options=SimOptions(host_device=HOST_DEVICE))
    budget = level.peak_bytes + 4 * MIB
    result = _rewrite(budget)
    assert result.report.num_swapped == 0 and result.report.order["guarantee"] == GUARANTEE_PINNED
    feeds = {"x": np.random.default_rng(0).random((N, N), dtype=np.float32)}
    runs = 3
    requests = [ExecutorRequest(graph_def=g, feeds=feeds, fetches=["out:0"])
                for g in [race_graph_def()] * runs + [tf_io.to_graph_def(result.graph)] * runs]
    measured = [m.peak("accelerator") for m in measure_executor_peaks(requests)]
    transient_budget = budget - level.resident_bytes
    free, pinned = measured[:runs], measured[runs:]
    assert max(free) > transient_budget, f"the free executor stayed under the budget: the test proves nothing {free}"
    assert max(pinned) <= transient_budget, (pinned, transient_budget)
    assert abs(max(pinned) - level.transient_peak_bytes) <= 0.05 * level.transient_peak_bytes
