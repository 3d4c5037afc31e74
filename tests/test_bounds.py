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
from tflms.sim.bounds import min_swap_bytes, step_time_bound, swap_only_bound, time_bound, time_bound_ratio
from tflms.testing import GraphBuilder, mlp_training_graph
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
    g = mlp_training_graph(8, batch=256, width=256)
    profile = get_profile("v100-16gb-pcie3")
    if link_gbps:
        profile = dataclasses.replace(profile, link_gbps=link_gbps)
    for threshold in (1, 2, 4):
        plan = plan_swaps(analyze_graph(g), LMSConfig(swapout_threshold=threshold, swapin_ahead=1),
                          accelerator_device="/device:GPU:0")
        swapped = simulate(apply_swaps(g, plan).graph, profile)
        tb = step_time_bound(g, profile, swapped.peak_bytes)
        assert tb.feasible and tb.min_swap_bytes > 0
        assert swapped.step_time_s >= tb.bound_s
        # the copies out and back cannot overlap: on the slow link a tighter bound, still below every plan
        assert tb.across_s > tb.bound_s if link_gbps else tb.across_s >= tb.compute_s
        assert swapped.step_time_s >= tb.across_bound_s
        assert swapped.transfer_time_s / 2 >= tb.link_s  # each direction carries at least min_swap_bytes


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
