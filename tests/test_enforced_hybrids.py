"""Hybrids whose swaps the whole swap tuner chooses in the enforced order (tflms.tune.hybrid._enforced_hybrids).

At the largest batches the level-order and order-first hybrids fit none of the plans that re-run little; the swap
tuner run in the enforced order (its finalists judged in the order, swaps across the ordered peak) fits them
(ResNet-50 at batch 1347 on v100-16gb-pcie3: 15.23 s against the swap-only 19.61 s, docs/design.md). These tests
run the stage on the kit's residual step, where it is forced (every fit counted as stalling).
"""

from __future__ import annotations

import pytest

from tflms.passes.order import apply_tuned_order
from tflms.passes.swaps import apply_swaps
from tflms.sim.simulator import simulate
from tflms.testing import assert_bitwise_equal
from tflms.tune import hybrid, per_reader, recompute_sets
from tflms.tune.tuner import tune

from test_recompute import PROFILE, _plain, _residual_bn_32, _search_every_miss, _train_rewritten

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: The budget of these tests: the residual step's resident bytes and this fraction of its transient peak.
FRACTION = 0.5
#: The stage's segment price in these tests: on the kit's small step no op re-runs for 0.05 of its copies (each kernel's
#: fixed cost is large beside a copy of its few bytes), so that plan would re-run nothing.
SEGMENT_PRICE = 0.1


def _tune(graph, monkeypatch, *, stage: bool, stall_fraction: float = -1.0):
    """The tune with every miss searched and every recompute plan simulated, fits counted as stalling past
    ``stall_fraction`` of their step; with ``stage`` False the enforced-order hybrids do not run."""
    monkeypatch.setattr(hybrid, "_while_faster", _search_every_miss)
    monkeypatch.setattr(recompute_sets, "compute_floor_s", lambda *args: 0.0)
    monkeypatch.setattr(hybrid, "ORDERED_STALL_FRACTION", stall_fraction)
    monkeypatch.setattr(hybrid, "ENFORCED_SEGMENT_PRICE", SEGMENT_PRICE)
    # (the stage alone: the clone-per-reader plans of the stage before it, issue 45's, would be its least-compute misses
    # here, and their hybrids fit in level order; tests/test_pick_search.py tests that stage)
    monkeypatch.setattr(hybrid, "reader_split_plans", lambda *args, **kwargs: [])
    if not stage:
        monkeypatch.setattr(hybrid, "_enforced_hybrids", lambda *args: [])
    base = simulate(graph, PROFILE)
    budget = base.resident_bytes + int(FRACTION * base.transient_peak_bytes)
    return tune(graph, budget=budget, profile=PROFILE, strategies=["idle-time", "tflms-distance", "recompute"],
                enforce_order=True), budget


@pytest.fixture(scope="module")
def residual():
    return _residual_bn_32()


def test_the_enforced_hybrids_are_judged_in_the_order_and_never_choose_slower(residual, monkeypatch):
    graph = residual[-1]
    result, budget = _tune(graph, monkeypatch, stage=True)
    enforced = [c for c in result.candidates if c.params.get("enforced")]
    assert enforced, "the stage ran no swap tune"
    for c in enforced:
        assert c.strategy == "hybrid" and c.plan.recomputes and c.plan.swaps
        assert c.order is not None and not c.order.get("before_swaps")  # judged with the order after its swaps
        assert c.plan.config.recompute == "auto"  # the tune's mode, not the nested tune's "off"
    # the segment plan at every articulation, re-running only what is cheap beside its copies
    segment = [c for c in result.candidates if c.strategy == "recompute"
               and c.params.get("price") == hybrid.ENFORCED_SEGMENT_PRICE and "split" not in c.params]
    assert len(segment) == 1
    everything = [c for c in result.candidates if c.strategy == "recompute" and c.params.get("price") == "any"
                  and c.params["segments"] == segment[0].params["segments"] and "split" not in c.params]
    assert everything and segment[0].params["cloned"] < everything[0].params["cloned"]
    # the stage starts from the misses that compute least
    misses = sorted((c for c in result.candidates if c.strategy == "recompute" and not c.fits),
                    key=lambda c: c.sim.compute_time_s)
    cutoff = misses[hybrid.ENFORCED_HYBRIDS - 1].sim.compute_time_s  # (ties broken by need: take them all)
    least = {c.plan.recomputes for c in misses if c.sim.compute_time_s <= cutoff}
    assert {c.plan.recomputes for c in enforced} <= least
    without, _ = _tune(graph, monkeypatch, stage=False)
    assert not any(c.params.get("enforced") for c in without.candidates)
    assert result.best.sim.step_time_s <= without.best.sim.step_time_s  # more candidates, never a slower choice


def test_the_stage_runs_only_where_no_hybrid_fits_or_the_fastest_stalls(residual, monkeypatch):
    result, _ = _tune(residual[-1], monkeypatch, stage=True, stall_fraction=10.0)  # no fit stalls for ten steps
    assert any(c.strategy == "hybrid" and c.fits for c in result.candidates)
    assert not any(c.params.get("enforced") for c in result.candidates)


def test_an_enforced_hybrid_runs_as_judged_and_trains_bitwise(monkeypatch):
    runs = [_residual_bn_32() for _ in range(2)]
    model, optimizer, step, batches, _, _ = runs[0]
    plain = _plain(model, optimizer, step, batches)
    model, optimizer, _, batches, pre, graph = runs[1]
    result, budget = _tune(graph, monkeypatch, stage=True)
    fits = [c for c in result.candidates if c.params.get("enforced") and c.fits]
    assert fits, "no enforced-order hybrid fits"
    cand = min(fits, key=lambda c: c.sim.step_time_s)
    rewritten = apply_swaps(graph, cand.plan).graph
    ran_graph, order = apply_tuned_order(rewritten, cand.order, PROFILE)  # what the pipeline runs
    assert order is not None and order["edges"] > 0
    again = simulate(ran_graph, PROFILE)
    assert again.peak_bytes == cand.sim.peak_bytes and again.peak_with_margin_bytes <= budget
    assert again.step_time_s == pytest.approx(cand.sim.step_time_s, rel=1e-9)
    assert {c for r in cand.plan.recomputes for c in r.clones} <= {op.name for op in ran_graph}
    inserted = [op.name for op in ran_graph if op.name.startswith("lms/")]
    trained, ran = _train_rewritten(model, optimizer, pre, ran_graph, inserted, batches)
    assert_bitwise_equal(plain, trained, "an enforced-order hybrid")
    names = {n.name for n in ran.step_graph(inserted).post_optimization_graph.node}
    assert {s.swap_out for s in cand.plan.swaps} <= names  # its copies ran


def test_not_with_compressed_swaps():
    """A compressed swap moves other bytes than the order was judged with: the stage searches nothing."""
    import types
    calls = []
    ev = types.SimpleNamespace(compress=lambda graph, plan: graph)
    assert hybrid._enforced_hybrids(ev, {}, (), [], lambda analysis: calls.append(analysis) or []) == []
    assert not calls


def test_a_plan_whose_swap_floor_is_slower_than_the_fastest_fit_gets_no_swap_tune(residual, monkeypatch):
    """No swap-only rewrite of a recomputed step is faster than its floor in any order, so a plan whose floor is
    slower than a fit found gets no nested tune (DenseNet-121 at batch 1143: its price-0.05 plan, 15.76 s against a
    fit of 11.78 s)."""
    from tflms.tune.search import TuneEvaluator
    asked = []

    def floor_above(self, graph, sim, limit):
        asked.append(limit)
        return True
    monkeypatch.setattr(TuneEvaluator, "floor_above", floor_above)
    result, _ = _tune(residual[-1], monkeypatch, stage=True)
    # asked with the fastest fit found by then (the tune's choice can only be as fast or faster)
    assert asked and all(result.best.sim.step_time_s <= limit < float("inf") for limit in asked)
    assert not any(c.params.get("enforced") for c in result.candidates)


def test_the_floor_of_a_recomputed_step(residual):
    """``TuneEvaluator.floor_above``: never with nothing to beat, never where fit is judged by the allocator's model,
    and a step is never faster than its compute."""
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.sim.simulator import SimOptions
    from tflms.tune.search import FIT_BY_BFC, TuneEvaluator
    graph = residual[-1]
    sim = simulate(graph, PROFILE)
    ev = TuneEvaluator(analyze_graph(graph), PROFILE, sim.resident_bytes + int(FRACTION * sim.transient_peak_bytes),
                       1 << 40, SimOptions(), LMSConfig(), "/device:GPU:0", "Identity", None)
    assert not ev.floor_above(graph, sim, float("inf"))
    assert ev.floor_above(graph, sim, 0.5 * sim.compute_time_s)  # below its compute: no rewrite is that fast
    floor = ev.floor_of(graph, sim)
    assert floor.floor_s >= sim.compute_time_s
    assert not ev.floor_above(graph, sim, floor.floor_s)  # the floor itself is not above itself
    ev.fit_by = FIT_BY_BFC
    assert not ev.floor_above(graph, sim, 0.5 * sim.compute_time_s)


def _refined(result):
    return [c for c in result.candidates if "per_reader" in c.params]


def test_what_a_fitting_hybrid_waits_for_is_re_run_per_reader_and_never_chosen_slower(residual, monkeypatch):
    """Where an enforced hybrid fits, its pick re-running the chains of ``stalling_chains`` once per reader is judged
    too (ResNet-50 at batch 1347: the stem's copies, 15.23 s to 13.49 s), and the choice is never slower for it."""
    graph = residual[-1]
    result, _ = _tune(graph, monkeypatch, stage=True)
    refined = _refined(result)
    assert refined, "no plan re-run per reader"
    assert any(c.params.get("enforced") and c.fits for c in result.candidates)
    for c in refined:
        assert c.strategy == "recompute" and c.params["per_reader"] > 0
        assert c.params["split"] == hybrid.SEGMENT_SPLITS[0]
        assert any(d.copy for d in c.plan.recomputes)  # something serves its readers from a re-run
    monkeypatch.setattr(hybrid, "per_reader_plan", lambda *args: None)
    without, _ = _tune(graph, monkeypatch, stage=True)
    assert not _refined(without)
    assert result.best.sim.step_time_s <= without.best.sim.step_time_s


def test_stalling_chains_follow_the_idle_time_of_the_copies(residual, monkeypatch):
    """A copy that hides behind compute gives no chain; one that overlaps idle time gives the chain of its tensor
    where re-running it costs less; each part chosen reads fewer swapped bytes than it rebuilds."""
    import types

    import networkx as nx

    from tflms.analysis.cto import Category, analyze_graph
    from tflms.policies.eligibility import recompute_skip_reason
    from tflms.sim.cost import op_time_s
    graph = residual[-1]
    result, _ = _tune(graph, monkeypatch, stage=True)
    fit = min((c for c in result.candidates if c.params.get("enforced") and c.fits), key=lambda c: c.sim.step_time_s)
    analysis = analyze_graph(graph)
    times = {op.name: op_time_s(graph, op, PROFILE) for op in graph}
    copies = [r for r in fit.sim.ops if r.stream != "compute"]
    end = max(r.end_s for r in fit.sim.ops)

    def timeline(compute):
        return types.SimpleNamespace(ops=[*compute, *copies])
    busy = types.SimpleNamespace(name="busy", stream="compute", start_s=0.0, end_s=2 * end)
    assert per_reader.stalling_chains(analysis, times, fit.plan, timeline([busy])) == frozenset()
    idle = per_reader.stalling_chains(analysis, times, fit.plan, timeline([]))  # every copy fully exposed
    assert idle, "no swapped tensor of the fit can be re-run"
    assert per_reader.stalling_chains(analysis, times, fit.plan, fit.sim) <= idle
    assert per_reader.stalling_chains(analysis, {op: 1e9 for op in times}, fit.plan, timeline([])) == frozenset()
    swapped = {s.tensor: s.num_bytes for s in fit.plan.swaps}
    for op in idle:
        assert analysis.categories[op] is Category.FORWARD and recompute_skip_reason(analysis, op) is None
    parts = nx.Graph()
    parts.add_nodes_from(idle)
    parts.add_edges_from((ref.op, op) for op in idle for ref in graph.op(op).inputs if ref.op in idle)
    for part in nx.connected_components(parts):
        reads = {ref for op in part for ref in graph.op(op).inputs if ref.op not in part and ref in swapped}
        rebuilt = sum(n for ref, n in swapped.items() if ref.op in part)
        assert rebuilt > 0 and sum(swapped[ref] for ref in reads) < rebuilt
