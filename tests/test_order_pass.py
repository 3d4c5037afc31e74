"""The order pass (``tflms.passes.order.enforce_order``) and its place in the pipeline.

The pass adds the schedule's control edges only when they lower the simulated peak; through
``tflms.function`` with a budget the rewritten step keeps training bitwise (against a plain-vs-plain
control) and the report counts the edges.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.passes.order import enforce_order
from tflms.sim.simulator import simulate
from tflms.testing import GraphBuilder
from test_schedule import EXACT, SMALL, _branchy_model, two_branches, unit_profile

BATCH = 32


def test_two_branches_get_the_edge_that_finishes_one_branch_first():
    g = two_branches()
    profile = unit_profile()
    result = enforce_order(g, profile, **EXACT)
    assert result.changed and result.graph is not g
    report = result.report
    assert report.applied and report.num_edges == len(report.edges) >= 1
    assert report.level_peak_bytes == simulate(g, profile).peak_bytes == 2176
    # The graph with the edges, in its own level order, peaks as the schedule does.
    assert report.ordered_peak_bytes == simulate(result.graph, profile).peak_bytes == 1216
    assert "a_big" not in g.op("b_big").control_inputs  # the input graph is not modified
    assert report.to_dict()["edges"] == report.num_edges


def test_a_chain_gets_no_edges_and_the_same_graph():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SMALL)
    h = b.op("a", "Pad", [x], shape=(4, 64))
    b.op("s", "Sum", [h], shape=SMALL)
    g = b.graph
    result = enforce_order(g, unit_profile(), **EXACT)
    assert not result.changed and result.graph is g
    assert result.report.edges == () and not result.report.applied
    assert "no schedule peaks lower" in result.report.why


def test_enforce_order_defaults_to_tuning_and_is_validated():
    assert LMSConfig().orders is True  # the default tunes (for the accelerator's memory)
    assert LMSConfig(swapout_threshold=1).orders is False  # TFLMS rules given: no tuning, no order
    assert LMSConfig(budget_bytes="1GiB").orders is True
    assert LMSConfig(budget_bytes="1GiB", enforce_order=False).orders is False
    assert LMSConfig(enforce_order=True).orders is True
    with pytest.raises(ConfigError, match="enforce_order"):
        LMSConfig(enforce_order="yes")


@pytest.fixture(scope="module")
def tf_quiet():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _train(wrap, data):
    import keras
    import tensorflow as tf

    from tflms.demo import make_train_step
    model = _branchy_model(0)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    fn = wrap(make_train_step(model, optimizer))
    losses = [fn(x, y).numpy().tobytes() for x, y in data]
    del tf
    return fn, losses, [v.numpy().tobytes() for v in model.weights + optimizer.variables]


@pytest.fixture(scope="module")
def plain_run(tf_quiet):
    import tensorflow as tf
    rng = np.random.RandomState(0)
    data = [(tf.constant(rng.standard_normal((BATCH, 16, 16, 3)).astype("float32")),
             tf.constant(rng.randint(0, 10, size=(BATCH,)).astype("int32"))) for _ in range(3)]
    _, plain_losses, plain = _train(tf.function, data)
    _, again_losses, again = _train(tf.function, data)
    assert (plain_losses, plain) == (again_losses, again)  # the control: plain vs plain is bitwise
    return data, plain_losses, plain


# budget 4.3 MiB: the step needs 4.36 MiB in level order on v100-16gb-pcie3 and fits in the enforced order
# (the tuner judges its finalists in it); swapout_threshold=1 with enforce_order=True: every swap the rules
# allow, then the order on the swapped graph.
@pytest.mark.parametrize("options", [{"budget": "4.3MiB"}, {"swapout_threshold": 1, "enforce_order": True}],
                         ids=["tuned", "rules-with-swaps"])
def test_tflms_function_enforces_the_order_and_trains_bitwise(plain_run, options):
    import tflms
    data, plain_losses, plain = plain_run
    fn, losses, state = _train(lambda s: tflms.function(s, **options), data)
    order = fn.report.order
    assert order is not None and order["applied"] and order["edges"] > 0, order
    assert order["ordered_peak_bytes"] < order["level_peak_bytes"]
    assert f"{order['edges']} order edges" in fn.report.table()
    if "swapout_threshold" in options:
        assert fn.report.num_swapped > 0
    assert losses == plain_losses
    mismatched = [i for i, (a, b) in enumerate(zip(state, plain)) if a != b]
    assert not mismatched, f"{len(mismatched)} variables differ, e.g. index {mismatched[:3]}"


def wide_branches():
    """Like ``two_branches`` with 256 KiB temporaries (above the order pass's 64 KiB threshold)."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(1, 16))
    a_small = b.op("a_small", "Sum", [b.op("a_big", "Pad", [x], shape=(256, 256))], shape=(1, 16))
    b_small = b.op("b_small", "Sum", [b.op("b_big", "Pad", [x], shape=(256, 256))], shape=(1, 16))
    b.op("out", "AddV2", [a_small, b_small], shape=(1, 16))
    return b.graph


def test_the_tuner_accepts_a_step_that_fits_only_in_the_enforced_order():
    from tflms.analysis.cto import analyze_graph
    from tflms.errors import BudgetError
    from tflms.tune.tuner import tune
    g = wide_branches()
    profile = unit_profile()
    level, ordered = simulate(g, profile).peak_bytes, enforce_order(g, profile).report.ordered_peak_bytes
    assert ordered < level
    budget = (level + ordered) // 2
    with pytest.raises(BudgetError):  # in level order nothing fits
        tune(analyze_graph(g), budget=budget, profile=profile, require_backward=False)
    result = tune(analyze_graph(g), budget=budget, profile=profile, require_backward=False, enforce_order=True)
    assert result.best.order is not None and result.best.order["edges"] > 0
    assert result.best.sim.peak_with_margin_bytes == ordered <= budget
    assert "enforced order" in result.reason()
    assert result.to_dict()["candidates"][-1]["order_edges"] == result.best.order["edges"]


def test_a_winner_judged_without_edges_gets_no_order_pass_only_the_budget_guarantee(tf_quiet):
    """A step that fits unswapped in level order: the tuner's winner has no order, so the order pass does not run;
    the budget guarantee (issue 31) pins level order where another order could go over the budget, and adds
    nothing where every order fits."""
    from test_schedule import _traced_step

    from tflms.pipeline import rewrite_step
    _, _, _, cf = _traced_step(0)
    roomy = rewrite_step(cf, LMSConfig(batch_size=BATCH, budget_bytes="10MiB"), build=False)
    assert roomy.report.tuning["strategy"] == "none"
    assert roomy.report.order["guarantee"] == "pinned" and roomy.report.order["heuristic"] == "level"
    assert roomy.report.order["any_order_bound_bytes"] > 10 << 20
    loose = rewrite_step(cf, LMSConfig(batch_size=BATCH, budget_bytes="40MiB"), build=False)
    assert loose.report.order["guarantee"] == "any-order" and not loose.report.order.get("applied")
    assert len(loose.graph.ops) == len(loose.analysis.graph.ops)
    # (on the graph clock idle-time swaps fit 4.3 MiB in level order: the GPU waits for launches, and copies hide)
    tight = rewrite_step(cf, LMSConfig(batch_size=BATCH, budget_bytes="3.8MiB"), build=False)
    assert tight.report.order is not None and tight.report.order["edges"] > 0  # the control: same step, tighter
    assert tight.report.order["heuristic"] != "level"  # the order pass's schedule, which the tuner judged
    off = rewrite_step(cf, LMSConfig(batch_size=BATCH, budget_bytes="3.8MiB", enforce_order=False), build=False)
    assert off.report.order["guarantee"] == "not-guaranteed" and not off.report.order.get("applied")


def test_a_small_op_is_ordered_when_only_it_keeps_an_unordered_big_reader_early():
    """BiasAddGrad is never ordered (oneDNN fuses it): only its small Reshape can pull it, and with it the
    last read of the big gradient d, before e allocates. The edges among 64 KiB ops cannot."""
    from tflms.schedule import add_order_edges, order_edges, schedule_order
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SMALL)
    d = b.op("d", "Pad", [x], shape=(256, 256))  # 256 KiB
    e = b.op("e", "Pad", [x], shape=(256, 256))
    bg = b.op("bg", "BiasAddGrad", [d], shape=(256,))
    b.op("f", "Sum", [e], shape=SMALL)
    b.op("r", "Reshape", [bg], shape=(256,))
    g = b.graph
    profile = unit_profile()
    level = simulate(g, profile).peak_bytes
    order = schedule_order(g, profile=profile)
    assert order.index("bg") < order.index("e")  # the schedule reads d for the last time first
    coarse = add_order_edges(g, order_edges(g, order))
    assert simulate(coarse, profile).peak_bytes == level  # control: the 64 KiB edges alone change nothing
    result = enforce_order(g, profile)
    assert result.changed
    assert ("r", "e") in result.report.edges
    assert result.report.ordered_peak_bytes == simulate(result.graph, profile).peak_bytes < level
    assert simulate(result.graph, profile).peak_bytes <= level - 256 * 256 * 4 + 1024


def _mlp_evaluator():
    """The tuner's evaluator for a 6-layer MLP step with a budget nothing fits in level order."""
    from tflms.analysis.cto import analyze_graph
    from tflms.passes.swaps import DEFAULT_COPY_OP
    from tflms.sim import SimOptions, get_profile
    from tflms.testing import mlp_training_graph
    from tflms.tune.search import TuneEvaluator
    g = mlp_training_graph(6, batch=64, width=256)
    profile = get_profile("v100-16gb-pcie3")
    base = simulate(g, profile)
    budget = base.resident_bytes + (base.peak_bytes - base.resident_bytes) // 4
    return TuneEvaluator(analyze_graph(g), profile, budget, profile.host_memory_bytes, SimOptions(),
                      LMSConfig().with_rule_defaults(), "/device:GPU:0", DEFAULT_COPY_OP, None)


def test_the_tuner_also_judges_the_ungrouped_twin_of_a_grouped_finalist_in_the_enforced_order():
    """A grouped swap-in keeps its tensor from the group's first consumer to its last in every order; the
    twin with one swap-in per consumer level (never made by the ladder with a sync mode) is judged too."""
    from tflms.tune.search import ORDER_UNGROUPED_TWINS, judge_ordered
    ev = _mlp_evaluator()
    grouped = ev.distance(swapout_threshold=1, swapin_ahead=1, swapin_groupby=4, sync_mode=1)
    assert not grouped.fits and ORDER_UNGROUPED_TWINS >= 1
    added = judge_ordered(ev)
    twin = {"swapout_threshold": 1, "swapin_ahead": 1, "swapin_groupby": 0, "sync_mode": 1}
    assert [c.params for c in ev.candidates if c.order is None][1] == twin  # simulated in level order
    judged = {tuple(sorted(c.params.items())) for c in added}
    assert tuple(sorted(twin.items())) in judged and tuple(sorted(grouped.params.items())) in judged
    assert all(c.order is not None for c in added)


def test_the_tuner_judges_plans_that_differ_only_in_their_waits_each_in_the_enforced_order():
    """Two sync modes swap the same tensors with the same swap-ins; only their sync edges differ, and so
    can their peaks once ordered (ResNet-50 at batch 1347 on v100-16gb-pcie3 fits only with waits). Both
    are judged: a sync mode is a family of its own among the finalists."""
    from tflms.tune.search import judge_ordered
    ev = _mlp_evaluator()
    free = ev.distance(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0, sync_mode=0)
    waits = ev.distance(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0, sync_mode=1)
    assert not free.fits and not waits.fits
    assert [s.tensor for s in free.plan.swaps] == [s.tensor for s in waits.plan.swaps]  # the same swaps
    assert free.plan.swaps != waits.plan.swaps  # but not the same waits
    judged = [c.params for c in judge_ordered(ev)]
    assert free.params in judged and waits.params in judged


def test_the_closest_families_leave_out_one_that_judged_exactly_as_another():
    """ResNet-50 at batch 1347 (v100-16gb-pcie3): sync modes 0 and 2 add the same waits to a threshold-8
    plan and judge alike; walking both would leave sync mode 1 (threshold 492, the faster fit) unwalked."""
    import types

    from tflms.tune.result import Candidate
    from tflms.tune.search import _closest_families

    def cand(mode, threshold, need, step):
        return Candidate("tflms-distance", {"swapout_threshold": threshold, "sync_mode": mode}, None,
                         types.SimpleNamespace(need=need, step_time_s=step), fits=False)

    ev = types.SimpleNamespace(need=lambda sim: sim.need)
    judged = [cand(0, 8, 18.1, 36.9), cand(2, 8, 18.1, 36.9), cand(1, 738, 22.3, 26.1), cand(1, 492, 18.1, 28.7),
              cand(0, 738, 20.9, 9.3)]
    closest = _closest_families(ev, judged)
    assert [(c.params["sync_mode"], c.params["swapout_threshold"]) for c in closest] == [(1, 492), (0, 8)]


def _finalist_world(monkeypatch, ordered_need: dict[str, float]):
    """An evaluator whose level-order candidates are given and whose order pass is replaced by a table:
    ``ordered_need`` maps a candidate's name to its need once ordered (the budget is 16). Returns the
    evaluator and the list the peak swaps' starting candidates are appended to."""
    import types

    import tflms.passes.order
    import tflms.tune.finalists as finalists
    import tflms.tune.peakswap
    from tflms.tune.result import Candidate

    budget = 16.0
    ev = types.SimpleNamespace(candidates=[], budget=budget, host_budget=1e9, profile=None, sim_options=None,
                               need=lambda sim: sim.need, graph_of=lambda c: c.params["name"],
                               cannot_beat=lambda c, limit: False)

    def sim(need):
        return types.SimpleNamespace(need=need, step_time_s=1.0, host_peak_bytes=0, peak_bytes=need)

    def level(strategy, mode, name, need):
        plan = types.SimpleNamespace(swaps=(name,), recomputes=(), swapped_bytes=1)
        ev.candidates.append(Candidate(strategy, {"sync_mode": mode, "name": name}, plan, sim(need), fits=False))

    def record(ev_, strategy, params, plan, _sim, report, graph, policy, what):
        need = ordered_need[params["name"]]
        c = Candidate(strategy, params, plan, sim(need), fits=need <= budget, order={})
        ev.candidates.append(c)
        return c

    started = []
    monkeypatch.setattr(tflms.passes.order, "enforce_order", lambda graph, *a, **k: types.SimpleNamespace(
        changed=False, report=types.SimpleNamespace(num_edges=0)))
    monkeypatch.setattr(finalists, "record_ordered", record)
    monkeypatch.setattr(tflms.tune.peakswap, "swap_across_peak", lambda ev_, c: started.append(c.params["name"]) or [])
    # level order: family (distance, 0) has the two lowest peaks; four more families one plan each
    level("tflms-distance", 0, "a0", 30)
    level("tflms-distance", 0, "a1", 31)
    for i, mode in enumerate((1, 2, 3)):
        level("tflms-distance", mode, "bcd"[i], 32 + i)
    level("idle-time", None, "e", 36)
    return ev, started


def test_the_lowest_level_order_peaks_are_judged_whatever_their_family(monkeypatch):
    """BERT-base at batch 450 on v100-16gb-nvlink2 fits through the second-lowest level-order peak, the
    second plan of a family whose first ordered far from fitting (so no walk reaches it)."""
    from tflms.tune.search import judge_ordered
    ev, started = _finalist_world(monkeypatch, {"a0": 25, "a1": 15, "b": 17, "c": 17.5, "d": 25, "e": 25})
    added = judge_ordered(ev)
    assert [c.params["name"] for c in added if c.fits] == ["a1"]
    assert started == []  # something fits: no peak swaps


def test_the_peak_swaps_start_from_the_families_walked_not_from_the_lowest_peaks(monkeypatch):
    """When nothing fits, the peak swaps start from the closest judged families' firsts and walks, even when a
    plan judged only as one of the lowest level-order peaks came closer (ResNet-50 at batch 1347 on
    v100-16gb-nvlink2 fitted only 1303 when the peak swaps started there)."""
    from tflms.tune.search import judge_ordered
    ev, started = _finalist_world(monkeypatch, {"a0": 25, "a1": 16.5, "b": 17, "c": 17.5, "d": 25, "e": 25})
    judged = [c.params["name"] for c in judge_ordered(ev)]
    assert "a1" in judged
    assert started == ["b", "c"]


def test_a_finalist_no_order_fits_is_not_scheduled_once_a_plan_fits(monkeypatch):
    """Where a plan fits already, the peak swaps do not run, and a finalist whose bytes live at the loss exceed the
    budget (``cannot_fit_ordered``: none of its orders fits) is not scheduled: half a second each on ResNet-50 at
    batch 32. Where nothing fits, it still is: the peak swaps start from such plans."""
    import types

    from tflms.tune.result import Candidate
    from tflms.tune.search import judge_ordered
    needs = {"a0": 25, "a1": 15, "b": 17, "c": 17.5, "d": 25, "e": 25}
    ruled_out = {"a0", "b", "d"}
    ev, started = _finalist_world(monkeypatch, needs)
    ev.cannot_fit_ordered = lambda c: c.params["name"] in ruled_out
    judged = {c.params["name"] for c in judge_ordered(ev)}
    assert ruled_out <= judged  # the control: nothing fitted before, so they were scheduled

    ev, started = _finalist_world(monkeypatch, needs)
    ev.cannot_fit_ordered = lambda c: c.params["name"] in ruled_out
    plan = types.SimpleNamespace(swaps=("f",), recomputes=(), swapped_bytes=1)
    slower = types.SimpleNamespace(need=10, step_time_s=2.0, host_peak_bytes=0, peak_bytes=10, compute_bound=True)
    ev.candidates.append(Candidate("idle-time", {"sync_mode": None, "name": "f"}, plan, slower, fits=True))
    added = judge_ordered(ev)
    judged = [c.params["name"] for c in added]
    assert not ruled_out & set(judged) and "a1" in judged and "c" in judged
    assert [c.params["name"] for c in added if c.fits] == ["a1"] and started == []


def test_cannot_fit_ordered_rules_out_only_plans_no_order_fits():
    """The evaluator's answer on a real step: a plan whose bytes at the loss exceed the budget is ruled out, and the
    order pass indeed finds no order that fits it; a plan that fits is not; nor is any plan where fit is judged by
    the BFC model (the bound is one on live bytes)."""
    import dataclasses

    from tflms.analysis.cto import analyze_graph
    from tflms.passes.swaps import DEFAULT_COPY_OP
    from tflms.sim import SimOptions, get_profile
    from tflms.testing import mlp_training_graph
    from tflms.tune.search import FIT_BY_BFC, TuneEvaluator
    g = mlp_training_graph(6, batch=64, width=256)
    profile = get_profile("v100-16gb-pcie3")
    base = simulate(g, profile)

    def evaluator(budget):
        ev = TuneEvaluator(analyze_graph(g), profile, budget, profile.host_memory_bytes, SimOptions(),
                           LMSConfig().with_rule_defaults(), "/device:GPU:0", DEFAULT_COPY_OP, None)
        ev.context = dataclasses.replace(ev.context, baseline=base)
        return ev

    ev = evaluator(base.resident_bytes + (base.peak_bytes - base.resident_bytes) // 2)
    weak = ev.distance(swapout_threshold=20, swapin_ahead=1, swapin_groupby=0, sync_mode=0)
    strong = ev.distance(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0, sync_mode=0)
    assert weak.plan.changed and not weak.fits and ev.cannot_fit_ordered(weak)
    ordered = enforce_order(ev.graph_of(weak), profile, options=ev.sim_options, level_peak_bytes=weak.sim.peak_bytes)
    assert ev.need(ordered.report.ordered_sim if ordered.changed else weak.sim) > ev.budget
    assert not ev.cannot_fit_ordered(strong)  # (it misses in level order, but not by its bytes at the loss)
    roomy = evaluator(base.peak_with_margin_bytes)
    assert not roomy.cannot_fit_ordered(roomy.distance(swapout_threshold=20, swapin_ahead=1, swapin_groupby=0,
                                                       sync_mode=0))
    ev.fit_by = FIT_BY_BFC
    assert not ev.cannot_fit_ordered(weak)
