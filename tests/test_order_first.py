"""The no-overhead search with the memory-aware order pinned before the swaps (tflms.tune.search.search_order_first).

The order pass normally runs after the swaps; here the order of the unswapped step is pinned first and the
idle-time search picks its swaps in the order that will run. On a slow accelerator (so that copies can hide
behind its compute) and a slow link, the branchy step of ``test_schedule`` fits 60% of its peak at zero
predicted overhead only that way; the tuner's winner is then the ordered graph with its swaps, which
``tflms.function`` runs as it is (no order pass after it) and trains bitwise against a plain-vs-plain
control, with its swap ops in the graph TensorFlow ran; so does keras.applications' ResNet50 (slow tier).
"""

from __future__ import annotations

import numpy as np
import pytest

from tflms.profiles import HardwareProfile
from test_order_pass import BATCH, _train, plain_run, tf_quiet  # noqa: F401 (fixtures)
from test_schedule import _traced_step

#: Compute slow enough (20 GFLOP/s, 20 GB/s) that a 4 GB/s link's copies can hide behind it.
SLOW = HardwareProfile("test-order-first", 16 * 2**30, 2e10, 20, 4.0, link_latency_s=0.0, launch_overhead_s=0.0)
#: The budget as a fraction of the unswapped step's peak (with the simulator's margin).
BUDGET_FRACTION = 0.6


@pytest.fixture(scope="module")
def step_graph():
    from tflms.ir import tf_io
    _, _, _, cf = _traced_step(0)
    graph = tf_io.load_graph(cf, batch_size=BATCH)
    from tflms.sim import simulate
    return graph, int(simulate(graph, SLOW).peak_with_margin_bytes * BUDGET_FRACTION)


def test_the_order_pinned_first_fits_at_no_cost_where_nothing_else_does(step_graph, monkeypatch):
    import tflms.tune.tuner as tuner
    from tflms.ir import tf_io
    from tflms.passes.order import enforce_order
    from tflms.sim import simulate
    graph, budget = step_graph
    result = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    best = result.best
    assert best.strategy == "idle-time-no-overhead" and best.params["order_first"] > 0, best.params
    assert best.order["before_swaps"] and best.order["applied"] and best.fits
    assert result.overhead <= 0.001
    # the winner's graph is the ordered step with the swaps: every order edge is in it, and what the tuner
    # predicted is what that graph simulates to
    ordered = enforce_order(graph, SLOW)
    assert ordered.report.num_edges == best.params["order_first"]
    for before, after in ordered.report.edges:
        assert before in result.graph.op(after).control_inputs, (before, after)
    assert any(op.name.startswith("lms/swap_out") for op in result.graph)
    again = simulate(result.graph, SLOW)
    assert (again.peak_with_margin_bytes, again.step_time_s) == (best.sim.peak_with_margin_bytes, best.sim.step_time_s)
    # deterministic: the same graph and budget give the same rewritten graph, byte for byte
    twice = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    assert (tf_io.to_graph_def(twice.graph).SerializeToString(deterministic=True)
            == tf_io.to_graph_def(result.graph).SerializeToString(deterministic=True))
    # the control: without the search, the best fit at this budget costs time
    monkeypatch.setattr(tuner, "search_order_first", lambda ev, baseline, search: [])
    without = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    assert "order_first" not in without.best.params and without.overhead > 0.01, without.best.params


def test_a_plan_the_order_pinned_first_fits_at_no_cost_spares_the_recompute_search(step_graph, monkeypatch):
    """The order-first search runs before the recompute search: where it fits at no cost, recompute has nothing to
    gain and is not searched; without it (the control) the same tune searches recompute plans."""
    import tflms.tune.tuner as tuner
    graph, budget = step_graph
    result = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    assert result.best.params.get("order_first") and result.overhead <= 0.001, result.best.params
    assert not [c for c in result.candidates if c.strategy in ("recompute", "hybrid")]
    monkeypatch.setattr(tuner, "search_order_first", lambda ev, baseline, search: [])
    # (every recompute plan simulated: here a swap plan fits faster than any of them computes, which skips them)
    from tflms.tune import recompute_sets
    monkeypatch.setattr(recompute_sets, "compute_floor_s", lambda *args: 0.0)
    without = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    assert [c for c in without.candidates if c.strategy == "recompute"], "the control searched no recompute plan"


def test_the_order_pinned_first_is_not_searched_without_the_order_pass_or_the_strategy(step_graph):
    from tflms.errors import BudgetError
    from tflms.tune.tuner import tune
    graph, budget = step_graph
    for kwargs in ({"enforce_order": False}, {"enforce_order": True, "strategies": ["tflms-distance"]}):
        try:
            result = tune(graph, budget=budget, profile=SLOW, **kwargs)
        except BudgetError as err:
            candidates = err.candidates
        else:
            candidates = result.candidates
        assert not any("order_first" in c.params for c in candidates), kwargs


def test_tflms_function_runs_the_order_pinned_first_and_trains_bitwise(step_graph, plain_run, monkeypatch):  # noqa: F811
    import tflms
    import tflms.profiles as profiles
    from tflms.testing import record_run_metadata
    _, budget = step_graph
    data, plain_losses, plain = plain_run  # trained twice with tf.function, bitwise (the control)
    monkeypatch.setitem(profiles._PROFILES, SLOW.name, SLOW)
    with record_run_metadata() as ran:
        fn, losses, state = _train(lambda s: tflms.function(s, budget=budget, profile=SLOW.name), data)
    report = fn.report
    assert report.tuning["params"].get("order_first"), report.tuning["params"]
    assert report.order is not None and report.order["before_swaps"] and report.order["edges"] > 0
    assert report.num_swapped > 0 and "pinned before the swaps" in report.table()
    missing = ran.missing_after_optimization(report.inserted_ops)
    assert not missing, f"grappler removed swap ops: {missing[:5]}"
    assert losses == plain_losses
    mismatched = [i for i, (a, b) in enumerate(zip(state, plain)) if a != b]
    assert not mismatched, f"{len(mismatched)} variables differ, e.g. index {mismatched[:3]}"


@pytest.mark.slow
@pytest.mark.real_model
def test_a_keras_applications_resnet_trains_bitwise_with_the_order_pinned_first(monkeypatch):
    """ResNet50 (keras.applications, 64x64, batch 8) on the slow profile at 55% of its peak: the tuner picks the
    no-overhead plan with the order pinned first; two steps through tflms.function equal plain's bytes."""
    import keras
    import tensorflow as tf

    import tflms
    import tflms.profiles as profiles
    from tflms.ir import tf_io
    from tflms.sim import simulate
    from tflms.testing import assert_bitwise_equal, make_train_step, record_run_metadata, snapshot
    monkeypatch.setitem(profiles._PROFILES, SLOW.name, SLOW)
    rng = np.random.RandomState(0)
    data = [(tf.constant(rng.standard_normal((8, 64, 64, 3)).astype("float32")),
             tf.constant(rng.randint(0, 10, size=(8,)).astype("int32"))) for _ in range(2)]

    def run(wrap):
        keras.utils.set_random_seed(0)
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)
        fn = wrap(make_train_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy()))
        with record_run_metadata() as ran:
            losses = [fn(x, y) for x, y in data]
        return fn, snapshot(model, optimizer, losses=losses), ran

    plain_fn, plain, _ = run(tf.function)
    _, again, _ = run(tf.function)
    assert_bitwise_equal(plain, again, "plain vs plain (the control)")
    graph = tf_io.from_concrete_function(plain_fn.get_concrete_function(*data[0]))
    budget = int(simulate(graph, SLOW).peak_with_margin_bytes * 0.55)
    fn, state, ran = run(lambda s: tflms.function(s, budget=budget, profile=SLOW.name))
    report = fn.report
    assert report.tuning["params"].get("order_first") and report.tuning["overhead"] <= 0.001, report.tuning["params"]
    assert report.order["before_swaps"] and report.num_swapped > 0
    assert not ran.missing_after_optimization(report.inserted_ops)
    assert_bitwise_equal(plain, state, "tflms (order pinned first) vs plain")


def test_the_unswapped_step_goes_through_the_order_pass_once_per_tune(step_graph, monkeypatch):
    """The order-first search orders the unswapped step, and the finalists judged in the enforced order include it
    (the unswapped step, or a plan that swaps nothing): one pass serves both, half a second on ResNet-50."""
    import tflms.passes.order as order_pass
    import tflms.tune.tuner as tuner
    graph, budget = step_graph
    unswapped = {op.name: tuple(op.control_inputs) for op in graph}
    calls = []
    original = order_pass.enforce_order

    def counted(g, *args, **kwargs):
        calls.append({op.name: tuple(op.control_inputs) for op in g} == unswapped)
        return original(g, *args, **kwargs)
    monkeypatch.setattr(order_pass, "enforce_order", counted)
    result = tuner.tune(graph, budget=budget, profile=SLOW, enforce_order=True)
    assert result.best.params["order_first"] > 0  # the order-first search ran
    judged = [c for c in result.candidates
              if c.order is not None and not (c.plan and (c.plan.swaps or c.plan.recomputes))]
    assert judged  # and the unswapped step was judged in the enforced order too
    assert calls.count(True) == 1 and len(judged) == 1
