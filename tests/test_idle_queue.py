"""Idle-time swap-ins placed with the host-to-device queue in mind, and the zero-overhead link bound.

Swap-ins share one host-to-device stream. Chosen one tensor at a time, each as late
as its own copy allows, they queue at the end of the step and arrive late; the
no-overhead plan packs them backwards from the last one needed
(tflms.policies.idle_time._pack_swap_ins). tflms.sim.bounds.hidden_swap_bound says
how far any zero-overhead swap rewrite can lower the peak on a given link.
"""

from __future__ import annotations

import pytest

import tflms.policies.idle_time as idle
from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.profiles import HardwareProfile, get_profile
from tflms.sim.bounds import hidden_swap_bound
from tflms.testing.graphs import mlp_training_graph
from tflms.tune.evaluator import PlanEvaluator
from tflms.tune.tuner import tune

ACCELERATOR = "/device:GPU:0"


def slow_link(gbps: float) -> HardwareProfile:
    """A V100 whose host link is slow enough that copies take as long as several layers."""
    return HardwareProfile(f"v100-link-{gbps}", 16 * 2**30, 14e12, 900, gbps)


@pytest.fixture(scope="module")
def mlp():
    graph = mlp_training_graph(12, batch=1024, width=2048)
    return graph, analyze_graph(graph)


def _hiding_plan_sims(graph, analysis, profile, pack: bool, monkeypatch):
    ev = PlanEvaluator(graph, profile)
    base = ev.evaluate(None)
    config = LMSConfig().with_rule_defaults()
    chosen = [c for c in idle.idle_candidates(analysis, base, profile, config) if c.hides]
    if not pack:
        monkeypatch.setattr(idle, "_pack_swap_ins", lambda analysis, selected: list(selected))
    plan = idle.plan_idle(analysis, chosen, config, ACCELERATOR, idle.NO_OVERHEAD)
    return base, chosen, plan, ev.evaluate(plan)


@pytest.mark.parametrize("gbps", [1.0, 4.0])
def test_packed_swap_ins_hide_behind_compute(mlp, gbps, monkeypatch):
    graph, analysis = mlp
    base, chosen, plan, sim = _hiding_plan_sims(graph, analysis, slow_link(gbps), True, monkeypatch)
    assert len(chosen) >= 3, "the fixture must offer several candidates that hide alone"
    assert plan.swaps and sim.peak_bytes < base.peak_bytes
    assert sim.step_time_s <= base.step_time_s * 1.001, "packed swap-ins must not slow the step down"
    # every swap-in of the plan is triggered (none synchronous): the copies were given slots
    assert all(g.trigger is not None and not g.sync for s in plan.swaps for g in s.swap_ins)


@pytest.mark.parametrize("gbps", [1.0, 4.0])
def test_without_packing_the_same_tensors_queue_and_stall(mlp, gbps, monkeypatch):
    """Negative control: each tensor's own latest trigger, the copies queue behind each other."""
    graph, analysis = mlp
    base, _, _, packed = _hiding_plan_sims(graph, analysis, slow_link(gbps), True, monkeypatch)
    _, _, _, alone = _hiding_plan_sims(graph, analysis, slow_link(gbps), False, monkeypatch)
    assert alone.step_time_s > base.step_time_s * 1.10
    assert alone.stall_time_s > packed.stall_time_s


def test_groups_of_one_tensor_too_close_for_two_copies_share_one_swap_in(mlp):
    """Two consumer groups whose second could not get its own copy in time behind the first share a swap-in."""
    graph, analysis = mlp
    profile = slow_link(1.0)
    base = PlanEvaluator(graph, profile).evaluate(None)
    spans = {r.name: (r.start_s, r.end_s) for r in base.ops}
    cands = idle.idle_candidates(analysis, base, profile, LMSConfig(swapin_groupby=0).with_rule_defaults())
    cand = next(c for c in cands if len(c.far) >= 2)
    starts = sorted(spans[f][0] for f in cand.far)
    # give the two consumers far less time apart than a copy takes: one swap-in must serve both
    choices = idle._swap_in_choices(analysis, cand.tensor.op, cand.far, spans, copy_s=(starts[1] - starts[0]) * 2,
                                    peak_s=base.peak_time_s, groupby=0)
    assert len(choices) == 1 and set(choices[0].consumers) == set(cand.far)
    # with copies far shorter than the gap, each group keeps its own swap-in
    choices = idle._swap_in_choices(analysis, cand.tensor.op, cand.far, spans, copy_s=(starts[1] - starts[0]) / 100,
                                    peak_s=base.peak_time_s, groupby=0)
    assert len(choices) == len(idle.group_consumers(cand.far, analysis.levels, 0)) >= 2


@pytest.mark.parametrize("profile", ["v100-16gb-pcie3", slow_link(1.0), slow_link(4.0)],
                         ids=["pcie3", "link-1", "link-4"])
def test_no_zero_overhead_rewrite_beats_the_link_bound(mlp, profile):
    graph, _ = mlp
    profile = get_profile(profile)
    base = PlanEvaluator(graph, profile).evaluate(None)
    bound = hidden_swap_bound(base, profile)
    tight = hidden_swap_bound(base, profile, graph)  # knowing when each buffer is made and read
    assert base.resident_bytes <= bound.lowest_peak_bytes <= tight.lowest_peak_bytes <= base.peak_bytes
    result = tune(graph, budget=base.peak_bytes - 1, profile=profile, strategies=["idle-time-no-overhead"])
    zero = [c for c in result.candidates if c.sim.overhead_vs(base) <= 0.0 and c.plan is not None]
    assert zero, "the search must find some zero-overhead rewrite that lowers the peak"
    assert all(c.sim.peak_bytes >= tight.lowest_peak_bytes for c in zero)


def test_link_bound_grows_with_the_link():
    graph = mlp_training_graph(12, batch=1024, width=2048)
    savings = []
    for gbps in (0.25, 1.0, 4.0, 1000.0):
        profile = slow_link(gbps)
        savings.append(hidden_swap_bound(PlanEvaluator(graph, profile).evaluate(None), profile).max_saving)
    assert savings == sorted(savings) and savings[0] < 0.05 < savings[-1]


def test_away_at_most_counts_only_buffers_made_before_and_back_before_their_next_read():
    """One 100-byte buffer made at 1 s, read at [1.5, 2) and at 5 s, on a 10 B/s link (step ends at 10 s)."""
    from tflms.sim.bounds import _away_at_most, _Buffer
    buf = _Buffer(size=100, first=0, last=9, ready_s=1.0, reads=((1.5, 2.0), (5.0, 5.5)))
    # at 3 s: out since 1 s (20 B), back by 5 s (20 B)
    assert _away_at_most([buf], 3, 3.0, 10.0, 10.0) == 20
    # read at 1.7 s: nothing away; before it is made (0.5 s): nothing
    assert _away_at_most([buf], 3, 1.7, 10.0, 10.0) == 0
    assert _away_at_most([buf], 3, 0.5, 10.0, 10.0) == 0
    # a fast link: the whole buffer; outside its lifetime (entry 10): nothing
    assert _away_at_most([buf], 3, 3.0, 10.0, 1e9) == 100
    assert _away_at_most([buf], 10, 3.0, 10.0, 1e9) == 0
    # two buffers: the one made at 2.9 s can barely leave by 3 s: at most 10 * 0.1 = 1 B of it
    late = _Buffer(size=100, first=0, last=9, ready_s=2.9, reads=((9.0, 9.5),))
    assert _away_at_most([buf, late], 3, 3.0, 10.0, 10.0) == 20  # the out link (20 B since 1 s) limits both
    assert _away_at_most([late], 3, 3.0, 10.0, 10.0) == 1
