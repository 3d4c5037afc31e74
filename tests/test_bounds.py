"""Lower bounds on memory (swap-only) and step time at a budget."""

from __future__ import annotations

import math

import pytest

from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.passes.swaps import apply_swaps
from tflms.policies.tflms_rules import plan_swaps
from tflms.sim import HardwareProfile, get_profile, simulate
from tflms.sim.bounds import (across_peak_s, any_order_time_bound, min_swap_bytes, step_time_bound, swap_only_bound,
                               time_bound, time_bound_ratio)
from tflms.testing import GraphBuilder, forward_backward_chain, mlp_training_graph
from tflms.testing import two_branch_graph as two_branches  # x -> (a_big -> a_small, b_big -> b_small) -> out

SMALL, BIG = (4, 4), (16, 16)  # 64 and 1024 bytes of float32


def unit_profile() -> HardwareProfile:
    """A 64-byte copy takes 1 s; a 4x4 element-wise op 1 s."""
    return HardwareProfile("unit", memory_bytes=1 << 20, peak_flops=16, memory_gbps=1e9, link_gbps=64e-9,
                           link_latency_s=0, launch_overhead_s=0, compute_efficiency=1, link_efficiency=1)




def test_swap_only_bound_is_resident_plus_the_largest_working_set():
    bound = swap_only_bound(two_branches())
    # x (64) is resident. Working sets: Pad 1024 (x is resident), Sum 1024 + 64, AddV2 64 + 64 (it may write
    # into an input). The largest is a Sum's; ties go to the first name.
    assert (bound.resident_bytes, bound.working_set_bytes, bound.op) == (64, 1088, "a_small")
    assert bound.bound_bytes == 1152
    # no order of the unswapped graph goes below it
    assert simulate(two_branches(), unit_profile(), order=["x", "a_big", "a_small", "b_big", "b_small",
                                                             "out"]).peak_bytes >= bound.bound_bytes


def test_working_set_counts_an_input_read_twice_once():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SMALL)
    big = b.op("big", "Pad", [x], shape=BIG)
    b.op("sq", "Mul", [big, big], shape=BIG)  # in place: 1024, not 3 * 1024
    b.op("cat", "ConcatV2", [big, big], shape=(32, 16))  # 1024 + 2048
    bound = swap_only_bound(b.graph)
    assert (bound.working_set_bytes, bound.op) == (3072, "cat")


def test_bound_holds_for_swapped_mlp():
    g = mlp_training_graph(6, batch=64, width=64)
    bound = swap_only_bound(g)
    plan = plan_swaps(analyze_graph(g), LMSConfig(swapout_threshold=1, swapin_ahead=1),
                      accelerator_device="/device:GPU:0")
    swapped = simulate(apply_swaps(g, plan).graph, unit_profile())
    assert bound.resident_bytes == swapped.resident_bytes
    assert bound.bound_bytes <= swapped.peak_bytes < simulate(g, unit_profile()).peak_bytes


def test_time_bound_from_figures():
    # transient peak 2112, resident 64, budget 1600: 2112 - (1600 - 64) = 576 bytes must go out and back in.
    assert min_swap_bytes(2112, 64, 1600) == 576
    assert min_swap_bytes(2112, 64, 1 << 20) == 0
    tb = time_bound(compute_s=5.0, transient_peak_bytes=2112, resident_bytes=64, budget_bytes=1600,
                    profile=unit_profile())
    assert tb.min_swap_bytes == 576 and tb.link_s == pytest.approx(9.0)  # 576 B at 64 B/s
    assert tb.bound_s == pytest.approx(9.0) and tb.link_bound
    roomy = time_bound(compute_s=5.0, transient_peak_bytes=2112, resident_bytes=64, budget_bytes=4096,
                       profile=unit_profile())
    assert roomy.bound_s == 5.0 and not roomy.link_bound
    assert time_bound_ratio(11.25, tb.bound_s) == pytest.approx(1.25)


def test_step_time_bound_of_a_graph_and_infeasible_budgets():
    g = two_branches()
    profile = unit_profile()
    plain = simulate(g, profile)
    tb = step_time_bound(g, profile, 1600)
    assert tb.compute_s == pytest.approx(plain.compute_time_s)
    assert tb.min_swap_bytes == plain.transient_peak_bytes - (1600 - 64)
    assert tb.bound_s == pytest.approx(max(plain.compute_time_s, tb.min_swap_bytes / 64))
    too_small = step_time_bound(g, profile, 1000)  # below the swap-only bound (1152)
    assert not too_small.feasible and math.isinf(too_small.bound_s)
    with pytest.raises(ConfigError, match="positive and finite"):
        time_bound_ratio(1.0, too_small.bound_s)
    with pytest.raises(ConfigError, match="budget_bytes must be positive"):
        time_bound(compute_s=1.0, transient_peak_bytes=1, resident_bytes=0, budget_bytes=0, profile=profile)


@pytest.mark.parametrize("link_gbps", [None, 0.5])  # the profile's (compute-bound here), a slow link
def test_a_real_swap_plan_is_never_faster_than_the_bound(link_gbps):
    import dataclasses

    from tflms.passes.order import enforce_order
    g = mlp_training_graph(8, batch=256, width=256)
    profile = get_profile("v100-16gb-pcie3")
    if link_gbps:
        profile = dataclasses.replace(profile, link_gbps=link_gbps)
    above_compute = 0
    for threshold in (1, 2, 4):
        for sync_mode in (0, 1):
            plan = plan_swaps(analyze_graph(g), LMSConfig(swapout_threshold=threshold, swapin_ahead=1,
                                                          sync_mode=sync_mode), accelerator_device="/device:GPU:0")
            swapped = apply_swaps(g, plan).graph
            sim = simulate(swapped, profile)
            tb = step_time_bound(g, profile, sim.peak_bytes)
            assert tb.feasible and tb.min_swap_bytes > 0
            assert sim.step_time_s >= tb.bound_s
            # the copies out and back cannot overlap: on the slow link a tighter bound, still below every plan
            assert tb.across_s > tb.bound_s if link_gbps else tb.across_s >= tb.compute_s
            assert sim.step_time_s >= tb.across_bound_s
            assert sim.transfer_time_s / 2 >= tb.link_s  # each direction carries at least min_swap_bytes
            # in any order: the same plan in level order and with the order pass's edges
            for ran in (sim, simulate(enforce_order(swapped, profile).graph, profile)):
                floor = any_order_time_bound(g, profile, ran.peak_bytes)
                assert ran.step_time_s >= floor.floor_s >= floor.compute_s
                above_compute += floor.floor_s > floor.compute_s
    if link_gbps:
        assert above_compute  # on the slow link some copies cannot hide in any order


def test_v100_nvlink2_profile():
    p = get_profile("v100-16gb-nvlink2")
    assert p.memory_bytes == 16 * 2**30 and p.link_gbps == 75 and p.peak_flops == 15.7e12
    assert p.effective_link_bytes_per_s > get_profile("v100-16gb-pcie3").effective_link_bytes_per_s


def test_the_bound_across_the_peak_by_hand():
    """Two compute ops of 1 s; 192 bytes live over a 64-byte budget between them, at 64 B/s: 128 bytes leave
    (2 s) before that instant and come back (2 s) after it, each beside 1 s of compute: 2 + 2 = 4 s, where
    ``max(compute, D / bandwidth)`` says 2 s."""
    import types

    from tflms.sim.bounds import across_peak_s
    op = types.SimpleNamespace
    sim = op(ops=[op(stream="compute", start_s=0.0, end_s=1.0), op(stream="d2h", start_s=0.0, end_s=5.0),
                  op(stream="compute", start_s=1.0, end_s=2.0)],
             timeline=((0.0, 96, 0), (1.0, 192, 0), (2.0, 16, 0)))
    assert across_peak_s(sim, 64, unit_profile()) == pytest.approx(4.0)
    assert across_peak_s(sim, 192, unit_profile()) == 0.0  # nothing has to leave
    assert across_peak_s(sim, 128, unit_profile()) == pytest.approx(2.0)  # 1 s each way hides behind compute
    assert across_peak_s(sim, 0, unit_profile()) == pytest.approx(2 + 2 * (192 / 64 - 1))  # 3 s each way


def slow_unit_profile() -> HardwareProfile:
    """:func:`unit_profile` with a link of 2 bytes/s: a 1024-byte buffer takes 512 s each way."""
    import dataclasses
    return dataclasses.replace(unit_profile(), name="unit-slow-link", link_gbps=2e-9)


def _compute_times(g, profile) -> dict[str, float]:
    return {r.name: r.end_s - r.start_s for r in simulate(g, profile).ops if r.stream == "compute"}


def test_the_any_order_bound_by_hand():
    """While g3 runs, f1, f2, f3, loss and g3's output are held (4160 bytes); at 1024 bytes under that, 1024
    leave (512 s) before g3 while only its 64 s of ancestors run, and come back after it beside 1040 s."""
    g, profile = forward_backward_chain(), slow_unit_profile()
    took = _compute_times(g, profile)
    total = sum(took.values())
    sim = simulate(g, profile)
    assert sim.peak_bytes == 64 + 4160  # x is resident
    bound = any_order_time_bound(g, profile, sim.peak_bytes - 1024)
    before = took["f1"] + took["f2"] + took["f3"] + took["loss"]
    after = took["g2"] + took["g1"] + took["out"]
    assert (bound.op, bound.away_bytes, bound.before_s, bound.after_s, bound.free_s) == ("g3", 1024, before, after, 0)
    assert bound.floor_s == pytest.approx(total + max(0, 512 - before) + max(0, 512 - after))
    assert bound.floor_s > total and bound.compute_s == pytest.approx(total)
    # a chain has one order: the bound across its peak says the same
    assert across_peak_s(sim, sim.peak_bytes - 1024, profile) == pytest.approx(bound.floor_s)
    # nothing has to leave at the peak itself: the bound is the compute
    fits = any_order_time_bound(g, profile, sim.peak_bytes)
    assert (fits.floor_s, fits.op, fits.away_bytes) == (pytest.approx(total), "", 0)
    with pytest.raises(ConfigError, match="budget_bytes"):
        any_order_time_bound(g, profile, 0)


def side_branch_graph():
    """x -> big -> s1 -> t -> u(t, big) -> su -> out, and h1 -> h2 -> h3 -> out beside: h runs on either side."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SMALL)
    big = b.op("big", "Pad", [x], shape=BIG)
    s1 = b.op("s1", "Sum", [big], shape=SMALL)
    h1 = b.op("h1", "MatMul", [x, x], shape=SMALL)
    h2 = b.op("h2", "MatMul", [h1, x], shape=SMALL)
    h3 = b.op("h3", "MatMul", [h2, x], shape=SMALL)
    t = b.op("t", "Pad", [s1], shape=BIG)
    u = b.op("u", "Mul", [t, big], shape=BIG)
    b.op("out", "AddN", [b.op("su", "Sum", [u], shape=SMALL), h3], shape=SMALL)
    return b.graph


def test_work_in_no_order_with_the_op_hides_either_copy_as_the_order_likes():
    g, profile = side_branch_graph(), slow_unit_profile()
    took = _compute_times(g, profile)
    total = sum(took.values())
    sim = simulate(g, profile)
    budget = sim.peak_bytes - 1024
    bound = any_order_time_bound(g, profile, budget)
    # while t runs: big (read by u), s1 (read by t) and t's output; the h chain is neither before nor after t
    assert (bound.op, bound.away_bytes) == ("t", 64 + 2 * 1024 + 64 - budget)
    assert bound.free_s == pytest.approx(took["h1"] + took["h2"] + took["h3"])
    link = bound.away_bytes / 2
    assert bound.floor_s == pytest.approx(total + (link - bound.before_s) + (link - bound.after_s) - bound.free_s)
    # level order runs the h chain where it hides less than it could: its bound across the peak is higher
    assert across_peak_s(sim, budget, profile) > bound.floor_s
