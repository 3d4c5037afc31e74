"""The tuner's shortcuts give the answers of the slow paths they replace (issue 12).

- :func:`find_trigger` over integer ids, memoized per analysis, against the string BFS it replaced;
- the numpy Copeland vote against the pairwise loop it replaced, ties included;
- ``idle_candidates`` = vote over ``scored_candidates`` minus the excluded tensors;
- the no-overhead search stops after ``NO_OVERHEAD_PATIENCE`` rounds that only slowed the step;
- ``enforce_order(level_peak_bytes=...)`` and its ``ordered_sim`` equal what simulating again gives.
"""

from __future__ import annotations

import dataclasses
import random

from tflms.analysis.cto import Category, analyze_graph
from tflms.config import LMSConfig
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import IDENTITY_OPS
from tflms.policies import idle_time
from tflms.policies.swapplan import find_trigger
from tflms.profiles import get_profile
from tflms.sim.simulator import SimOptions, simulate
from tflms.testing import mlp_training_graph

PROFILE = get_profile("v100-16gb-pcie3")


def _reference_trigger(analysis, start, producer_level, target_level, exclude=frozenset()):
    """find_trigger as it was before the index: a BFS over names (tflms 3bc8757)."""
    def best_ancestor(floor, lowest):
        levels, cats, preds = analysis.levels, analysis.categories, analysis.predecessors
        seen, frontier, best = {start}, [start], None
        while frontier:
            nxt = []
            for name in frontier:
                for pred in preds[name]:
                    if pred in seen or levels[pred] < floor:
                        continue
                    seen.add(pred)
                    nxt.append(pred)
                    key = (levels[pred] if lowest else -levels[pred],
                           0 if cats[pred] is Category.BACKWARD else 1, pred)
                    if ((best is None or key < best) and pred not in exclude and pred not in analysis.conditional
                            and analysis.graph.op(pred).type not in IDENTITY_OPS):
                        best = key
            frontier = nxt
        return None if best is None else best[2]

    floor = max(target_level, producer_level + 1)
    best = best_ancestor(floor, True)
    if best is None and floor > producer_level + 1:
        best = best_ancestor(producer_level + 1, False)
    return best


def test_find_trigger_index_answers_as_the_name_bfs():
    analysis = analyze_graph(mlp_training_graph(6))
    levels = analysis.levels
    asked = 0
    for name in analysis.order:
        if analysis.categories[name] is not Category.FORWARD:
            continue
        p_level = levels[name]
        for consumer in analysis.graph.successors(name):
            for ahead in (0, 1, 2, 5, 50):
                for exclude in (frozenset(), frozenset(analysis.predecessors[consumer][:1])):
                    want = _reference_trigger(analysis, consumer, p_level, levels[consumer] - ahead, exclude)
                    # twice: the second answer comes from the memo
                    for _ in range(2):
                        assert find_trigger(analysis, consumer, p_level, levels[consumer] - ahead, exclude) == want
                    asked += 1
    assert asked > 100


def test_copeland_wins_with_numpy_equal_the_pairwise_count(monkeypatch):
    rng = random.Random(7)
    rows = [[float(rng.randint(0, 3)) for _ in range(3)] for _ in range(50)]  # many ties
    want = [0] * len(rows)
    for i in range(len(rows)):
        for j in range(len(rows)):
            votes = sum(a > b for a, b in zip(rows[i], rows[j]))
            against = sum(a < b for a, b in zip(rows[i], rows[j]))
            want[i] += votes > against
    assert idle_time._copeland_wins(rows) == want
    monkeypatch.setattr(idle_time, "VOTE_BLOCK_ROWS", 7)  # several blocks, the last one short
    assert idle_time._copeland_wins(rows) == want
    assert idle_time._copeland_wins([]) == [] and idle_time._copeland_wins([[1.0, 2.0, 3.0]]) == [0]


def test_idle_candidates_are_the_vote_over_the_scored_ones_minus_the_excluded():
    analysis = analyze_graph(mlp_training_graph(8, batch=256, width=512))
    sim = simulate(analysis.graph, PROFILE)
    scored = idle_time.scored_candidates(analysis, sim, PROFILE, LMSConfig())
    assert len(scored) > 4
    exclude = {c.tensor for c in scored[::3]}
    got = idle_time.idle_candidates(analysis, sim, PROFILE, LMSConfig(), exclude=exclude)
    assert got == idle_time.majority_order([c for c in scored if c.tensor not in exclude])
    assert not exclude & {c.tensor for c in got}


class _AlwaysSlower:
    """A tuner evaluator stand-in whose every idle-time trial slows the step down by 10% and does not fit."""

    def __init__(self, candidates, baseline):
        self.budget, self.candidates, self._cands, self.rounds = baseline.peak_with_margin_bytes - 1, [], candidates, []
        self._baseline = baseline
        self.profile, self.sim_options = PROFILE, SimOptions()

    def need(self, sim):
        return self.budget + 1  # one byte over, whatever the trial

    def scored(self, sim):
        return self._cands

    def evaluate(self, policy, params, *, max_overhead=None, baseline=None):
        from tflms.tune.tuner import Candidate
        self.rounds.append(params["round"])
        slow = dataclasses.replace(self._baseline, step_time_s=self._baseline.step_time_s * 1.1)
        cand = Candidate(policy.name, params, None, slow, fits=False, why_not="slower")
        self.candidates.append(cand)
        return cand


def test_no_overhead_search_gives_up_after_rounds_that_only_slow_the_step():
    from tflms.tune import search
    baseline = simulate(mlp_training_graph(2), PROFILE)
    cands = [idle_time.IdleCandidate(TensorRef(f"t{k}"), 100, 0.0, 1.0, 0.0, (), ("c",)) for k in range(40)]
    ev = _AlwaysSlower(cands, baseline)
    search.search_idle(ev, baseline, idle_time.NO_OVERHEAD)
    assert sorted(set(ev.rounds)) == list(range(1, search.NO_OVERHEAD_PATIENCE + 1))
    assert len(ev.candidates) == search.NO_OVERHEAD_PATIENCE  # one tensor each (need 1 byte): rejected
    # The control: stick-to-limit mode keeps selecting (slower is allowed) until its round limit.
    ev = _AlwaysSlower(cands, baseline)
    search.search_idle(ev, baseline, idle_time.STICK_TO_LIMIT)
    assert len(set(ev.rounds)) == search.IDLE_MAX_ROUNDS


def test_enforce_order_with_a_known_level_peak_and_its_simulation():
    from tflms.passes.order import enforce_order
    from test_order_pass import wide_branches
    from test_schedule import unit_profile
    g, profile = wide_branches(), unit_profile()
    options = SimOptions()
    full = enforce_order(g, profile, options=options)
    known = enforce_order(g, profile, options=options, level_peak_bytes=simulate(g, profile).peak_bytes)
    assert full.changed and known.changed
    assert known.report.to_dict() == full.report.to_dict()
    assert known.report.ordered_sim == simulate(known.graph, profile, options=options)
    assert known.report.ordered_peak_bytes == known.report.ordered_sim.peak_bytes


def test_no_overhead_search_is_skipped_when_the_overshoot_cannot_be_copied_out_before_the_peak():
    from tflms.tune import search
    baseline = simulate(mlp_training_graph(2), PROFILE)
    cands = [idle_time.IdleCandidate(TensorRef(f"t{k}"), 100, 0.0, 1.0, 0.0, (), ("c",)) for k in range(4)]
    ev = _AlwaysSlower(cands, baseline)
    # one byte over: its copy fits before the peak, the search runs (the control)
    assert search._copies_can_hide(ev, baseline)
    # an overshoot whose copy alone outlasts the time before the peak: no plan fits without overhead
    before_peak = baseline.peak_time_s + search.NO_OVERHEAD_TOLERANCE * baseline.step_time_s
    too_many = int(before_peak * PROFILE.effective_link_bytes_per_s) + (1 << 20)
    ev.budget = baseline.peak_with_margin_bytes - too_many
    assert not search._copies_can_hide(ev, baseline)
    search.search_idle(ev, baseline, idle_time.NO_OVERHEAD)
    assert ev.rounds == []
