"""The device-plus-host footprint bound (tflms.sim.footprint): what a swap-only rewrite holds somewhere."""

from __future__ import annotations

import networkx as nx

from tflms.sim import simulate
from tflms.sim.footprint import footprint_bound
from tflms.testing import forward_backward_chain, mlp_training_graph, two_branch_graph

SMALL = (4, 4)  # 64-byte float32 tensors
BIG = (16, 16)  # 1024-byte float32 tensors


def test_the_saved_activations_and_the_first_gradient_are_live_together_in_every_order():
    g = forward_backward_chain()
    fb = footprint_bound(g)
    # while g3 runs: f1, f2 (read later), f3 and loss (read by g3) and g3's output
    assert fb.op == "g3"
    assert fb.cut_bytes == 3 * 1024 + 64 + 1024
    # a chain has one order: the bound is its simulated peak
    assert fb.bound_bytes == simulate(g, "v100-16gb-pcie3").peak_bytes
    assert fb.fits(device_bytes=fb.bound_bytes - 100, host_bytes=100)
    assert not fb.fits(device_bytes=fb.bound_bytes - 100, host_bytes=99)


def test_the_bound_is_below_every_order_of_two_branches():
    """Not one order's peak: a_big and b_big need not be live together, and the bound does not count them so."""
    g = two_branch_graph(SMALL, BIG)
    fb = footprint_bound(g)
    peaks = [simulate(g, "v100-16gb-pcie3", order=list(o)).peak_bytes
             for o in nx.all_topological_sorts(g.to_networkx())]
    assert fb.bound_bytes <= min(peaks)
    assert fb.cut_bytes == 1024 + 64  # one branch's temporary and its sum; the other's sum may come later
    assert min(peaks) - fb.resident_bytes == 1024 + 64 + 64  # the best order also holds the first sum


def test_the_bound_is_below_every_schedule_of_a_training_step_and_grows_with_the_batch():
    from tflms.schedule import schedule_with_report
    g = mlp_training_graph(4, batch=16, width=32)
    fb = footprint_bound(g)
    result = schedule_with_report(g)
    assert fb.bound_bytes <= min(result.peaks.values())
    assert fb.bound_bytes <= simulate(g, "v100-16gb-pcie3").peak_bytes
    assert fb.ops_examined >= 1
    bigger = footprint_bound(mlp_training_graph(4, batch=64, width=32))
    assert bigger.cut_bytes > fb.cut_bytes
