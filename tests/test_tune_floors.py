"""The tuner leaves out what cannot win, by three lower bounds, and chooses what the whole search chooses (issue 27).

- the swap floor (:meth:`TuneEvaluator.swap_floor_above`, the any-order bound): where it is slower than the unswapped
  step, the recompute search runs first, and the swap searches only where the floor does not rule out beating its fit;
- a recompute plan's compute floor (:func:`tflms.tune.recompute_sets.compute_floor_s`): not simulated where it is
  slower than the fastest fit so far;
- pruning: a plan whose step lasts its compute time gets no trial that could only make it faster.
"""

from __future__ import annotations

import dataclasses

import pytest

from test_recompute import PROFILE, _residual_bn_32
from tflms.sim.simulator import SimResult, simulate
from tflms.tune import prune, recompute_sets, search
from tflms.tune.tuner import tune

#: A link fast enough that every copy hides (1 TB/s).
FAST_LINK = dataclasses.replace(PROFILE, name="v100-fast-link", link_gbps=1000.0)
#: A link slow enough that on the kit's residual step swap copies cannot hide (0.25 GB/s).
SLOW_LINK = dataclasses.replace(PROFILE, name="v100-slow-link", link_gbps=0.25)


@pytest.fixture(scope="module")
def residual_step():
    *_, graph = _residual_bn_32()
    return graph, simulate(graph, SLOW_LINK)


def _plan_key(cand):
    plan = cand.plan
    return None if plan is None else (plan.swaps, plan.recomputes)


def _whole(monkeypatch, graph, budget, profile=SLOW_LINK):
    """The tune with none of the three floors (the search they shorten)."""
    with monkeypatch.context() as m:
        m.setattr(search.TuneEvaluator, "swap_floor_above", lambda self, limit: False)
        m.setattr(recompute_sets, "compute_floor_s", lambda *args: 0.0)
        m.setattr(SimResult, "compute_bound", property(lambda self: False))
        return tune(graph, budget=budget, profile=profile, enforce_order=True)


@pytest.mark.parametrize("fraction", [0.8, 0.5])
def test_swap_searches_the_floor_rules_out_are_skipped_and_the_choice_is_the_same(residual_step, monkeypatch,
                                                                                   fraction):
    graph, base = residual_step
    budget = base.resident_bytes + int(fraction * base.transient_peak_bytes)
    lines = []
    fast = tune(graph, budget=budget, profile=SLOW_LINK, enforce_order=True, progress=lines.append)
    whole = _whole(monkeypatch, graph, budget)
    assert fast.best.strategy in ("recompute", "hybrid")
    assert (fast.best.strategy, fast.best.params, _plan_key(fast.best), fast.best.sim.step_time_s) == (
        whole.best.strategy, whole.best.params, _plan_key(whole.best), whole.best.sim.step_time_s)
    # what made the skip: the floor is slower than the unswapped step and than the fit found
    assert fast.swap_searches_skipped and not whole.swap_searches_skipped and whole.swap_floor_s is None
    assert fast.swap_floor_s > max(base.step_time_s, fast.best.sim.step_time_s)
    assert not [c for c in fast.candidates if c.strategy in ("tflms-distance", "idle-time", "idle-time-no-overhead")]
    assert len(fast.candidates) < len(whole.candidates)
    assert any(line.startswith("swap searches skipped") for line in lines)
    assert "swap-only plans not searched" in fast.reason() and fast.to_dict()["swap_searches_skipped"]
    # the bound holds for what the whole search found: no swap plan that fits beats it, in either order
    swaps_only = [c for c in whole.candidates if c.fits and c.strategy not in ("recompute", "hybrid")]
    assert swaps_only
    assert all(c.sim.step_time_s >= fast.swap_floor_s for c in swaps_only)


def test_where_a_swap_plan_may_win_the_swap_searches_run(residual_step, monkeypatch):
    """On the card's own link the copies hide: the floor is the unswapped step, every search runs, and the choice is
    the whole search's."""
    graph, _ = residual_step
    base = simulate(graph, PROFILE)
    budget = base.resident_bytes + int(0.5 * base.transient_peak_bytes)
    fast = tune(graph, budget=budget, profile=PROFILE, enforce_order=True)
    assert not fast.swap_searches_skipped and fast.swap_floor_s == pytest.approx(base.compute_time_s)
    assert [c for c in fast.candidates if c.strategy == "idle-time"]
    whole = _whole(monkeypatch, graph, budget, PROFILE)
    assert (fast.best.strategy, fast.best.params, _plan_key(fast.best)) == (
        whole.best.strategy, whole.best.params, _plan_key(whole.best))


def test_a_recompute_plan_never_computes_less_than_its_compute_floor(residual_step, monkeypatch):
    """The floor that spares a recompute plan's simulation is below every plan's simulated compute time; and plans
    are spared: fewer recompute plans are simulated than without it."""
    graph, base = residual_step
    budget = base.resident_bytes + int(0.8 * base.transient_peak_bytes)
    floors = {}
    real = recompute_sets.compute_floor_s

    def spy(baseline, times, decisions, launch_s=0.0):
        decisions = tuple(decisions)
        floors[tuple(r.ops for r in decisions)] = value = real(baseline, times, decisions, launch_s)
        return value
    whole = _whole(monkeypatch, graph, budget)
    with monkeypatch.context() as m:  # (the other two floors as in the whole search)
        m.setattr(search.TuneEvaluator, "swap_floor_above", lambda self, limit: False)
        m.setattr(SimResult, "compute_bound", property(lambda self: False))
        m.setattr(recompute_sets, "compute_floor_s", spy)
        spied = tune(graph, budget=budget, profile=SLOW_LINK, enforce_order=True)
    assert (spied.best.params, _plan_key(spied.best)) == (whole.best.params, _plan_key(whole.best))
    recomputes = [c for c in whole.candidates if c.strategy == "recompute"]
    checked = 0
    for c in recomputes:
        floor = floors.get(tuple(r.ops for r in c.plan.recomputes))
        if floor is not None:
            checked += 1
            assert c.sim.compute_time_s >= floor and c.sim.step_time_s >= floor
    assert checked
    assert len([c for c in spied.candidates if c.strategy == "recompute"]) < len(recomputes)


def test_pruning_a_plan_at_its_compute_floor_tries_drops_only(residual_step, monkeypatch):
    """A step that lasts its compute time cannot get faster: of pruning's trials only drops (kept at the same time)
    are simulated, and the result is what every trial gives."""
    graph, base = residual_step
    budget = base.resident_bytes + int(0.65 * base.transient_peak_bytes)
    ev_box = {}
    real_init = search.TuneEvaluator.__init__

    def keep(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        ev_box.setdefault("ev", self)
    monkeypatch.setattr(search.TuneEvaluator, "__init__", keep)
    result = tune(graph, budget=budget, profile=FAST_LINK, strategies=["idle-time"], prune=False)
    monkeypatch.undo()
    ev, cand = ev_box["ev"], result.best
    assert cand.plan.swaps and cand.sim.compute_bound, "the test needs a fit at its compute floor"
    trials = []
    real_call = prune._Judge.__call__

    def counted(self, swaps):
        trials.append(swaps)
        return real_call(self, swaps)
    with monkeypatch.context() as m:
        m.setattr(prune._Judge, "__call__", counted)
        fast = prune.prune_swaps(ev, cand)
        fast_trials = len(trials)
        trials.clear()
        m.setattr(SimResult, "compute_bound", property(lambda self: False))
        every = prune.prune_swaps(ev, cand)
    assert fast_trials < len(trials)
    assert (fast is None) == (every is None)
    if fast is not None:
        assert (fast.params, fast.plan.swaps, fast.sim.step_time_s) == (every.params, every.plan.swaps,
                                                                       every.sim.step_time_s)


def test_a_fit_that_lasts_its_compute_time_is_not_judged_again_in_the_enforced_order(residual_step, monkeypatch):
    """Ordered, such a fit can be no faster (the order adds no compute and the step cannot be shorter than it), and of
    two plans as fast the tuner keeps the first: the order pass would not change the choice."""
    graph, _ = residual_step
    base = simulate(graph, FAST_LINK)
    budget = base.resident_bytes + int(0.8 * base.transient_peak_bytes)
    fast = tune(graph, budget=budget, profile=FAST_LINK, enforce_order=True)
    assert fast.best.plan.swaps and fast.best.sim.compute_bound and fast.best.order is None
    assert not [c for c in fast.candidates if c.order is not None and _plan_key(c) == _plan_key(fast.best)]
    with monkeypatch.context() as m:
        m.setattr(SimResult, "compute_bound", property(lambda self: False))
        whole = tune(graph, budget=budget, profile=FAST_LINK, enforce_order=True)
    ordered = [c for c in whole.candidates if c.order is not None and _plan_key(c) == _plan_key(whole.best)]
    assert ordered and ordered[0].sim.step_time_s >= whole.best.sim.step_time_s
    assert (fast.best.strategy, fast.best.params, _plan_key(fast.best), fast.best.order) == (
        whole.best.strategy, whole.best.params, _plan_key(whole.best), whole.best.order)
