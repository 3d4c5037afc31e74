"""The budget-driven tuner on hand-built graphs and through tflms.function."""

from __future__ import annotations

import numpy as np
import pytest

import tflms
from tflms.errors import BudgetError, ConfigError, UnitsError
from tflms.sim import HardwareProfile, simulate
from tflms.testing import assert_bitwise_equal, mlp_training_graph, snapshot
from tflms.tune import STRATEGIES, tune

PROFILE = "v100-16gb-pcie3"


@pytest.fixture(scope="module")
def graph():
    return mlp_training_graph(12, batch=1024, width=2048)


@pytest.fixture(scope="module")
def baseline(graph):
    return simulate(graph, PROFILE)


def test_fitting_step_is_left_alone(graph, baseline):
    result = tune(graph, budget=baseline.peak_bytes, profile=PROFILE)
    assert result.strategy == "none" and result.best.plan is None
    assert "fits without swapping" in result.reason()
    assert len(result.candidates) == 1


def test_budget_below_peak_is_met_with_the_fastest_candidate(graph, baseline):
    budget = int(baseline.peak_bytes * 0.8)
    result = tune(graph, budget=budget, profile=PROFILE)
    assert result.best.fits and result.best.sim.peak_with_margin_bytes <= budget
    assert result.strategy in STRATEGIES
    fitting = [c for c in result.candidates if c.fits]
    assert result.best.sim.step_time_s == min(c.sim.step_time_s for c in fitting)
    assert {c.strategy for c in result.candidates} >= {"none", "tflms-distance", "idle-time"}
    # The rewritten graph the tuner returns is the one it simulated.
    assert simulate(result.graph, PROFILE).peak_bytes == result.best.sim.peak_bytes
    assert result.to_dict()["predicted_peak_bytes"] <= budget


def test_distance_search_prefers_large_thresholds_and_stops_after_losing_fit(graph, baseline):
    result = tune(graph, budget=int(baseline.peak_bytes * 0.8), profile=PROFILE, strategies=["tflms-distance"])
    thresholds = [c.params["swapout_threshold"] for c in result.candidates if c.strategy == "tflms-distance"
                  and c.params["swapin_ahead"] == 1 and c.params["swapin_groupby"] == 0
                  and "pruned" not in c.params]  # the ladder's, not the pruned winner's (tflms.tune.prune)
    assert thresholds[0] > thresholds[-1] and thresholds == sorted(thresholds, reverse=True)
    assert all(c.params["sync_mode"] == 0 for c in result.candidates if c.strategy == "tflms-distance")


def test_impossible_budget_names_the_smallest_that_would_fit(graph, baseline):
    with pytest.raises(BudgetError) as err:
        tune(graph, budget=baseline.resident_bytes, profile=PROFILE)
    message = str(err.value)
    assert "nothing fits the budget" in message and "give a budget of at least" in message
    assert "Resident variables alone take 208.00 MiB" in message


def test_slow_link_modes_and_idle_time_beats_distance_rules(graph):
    slow = HardwareProfile("slow-link", "16GiB", 14e12, 900, 8)  # half of PCIe 3.0: not every copy hides
    budget = int(simulate(graph, slow).peak_bytes * 0.8)
    with pytest.raises(BudgetError):
        tune(graph, budget=budget, profile=slow, strategies=["idle-time-no-overhead"])
    # the searches' own choices (the pruning pass rewrites the winner afterwards)
    idle = tune(graph, budget=budget, profile=slow, strategies=["idle-time"], prune=False)
    distance = tune(graph, budget=budget, profile=slow, strategies=["tflms-distance"], prune=False)
    assert idle.best.fits and distance.best.fits
    assert 0 < idle.overhead < distance.overhead  # stick-to-limit pays for the fit, but less than TFLMS rules
    assert tune(graph, budget=budget, profile=slow, prune=False, strategies=STRATEGIES).strategy == "idle-time"
    pruned = tune(graph, budget=budget, profile=slow, strategies=STRATEGIES)
    assert pruned.strategy == "idle-time" and {"pruned", "merged", "earlier"} & set(pruned.best.params)
    assert pruned.best.fits and pruned.overhead < idle.overhead  # the swaps fitting did not need cost the time
    # the default also searches recompute (issue 27): never slower than swapping alone
    assert tune(graph, budget=budget, profile=slow).overhead <= pruned.overhead


def test_no_overhead_mode_on_a_fast_link(graph):
    budget = int(simulate(graph, PROFILE).peak_bytes * 0.8)
    result = tune(graph, budget=budget, profile=PROFILE, strategies=["idle-time-no-overhead"])
    assert result.overhead <= 0.001 and result.best.fits


@pytest.mark.parametrize("budget, error", [("12 parsecs", UnitsError), ("12", UnitsError), (-5, UnitsError),
                                           (1.5e9, UnitsError)])
def test_bad_budget_units(graph, budget, error):
    with pytest.raises(error):
        tune(graph, budget=budget, profile=PROFILE)


def test_budget_in_config():
    config = tflms.LMSConfig.from_kwargs(budget="12GiB")
    assert config.budget_bytes == 12 * 2**30 and config.auto_tune
    assert tflms.LMSConfig().auto_tune and tflms.LMSConfig().default_tuning  # the default tunes
    rules = tflms.LMSConfig(swapin_ahead=2)
    assert not rules.auto_tune and rules.with_rule_defaults().swapout_threshold == 1
    assert tflms.LMSConfig(swapout_threshold=1, budget="1GiB").auto_tune
    with pytest.raises(ConfigError, match="unknown hardware profile"):
        tflms.LMSConfig(profile="tpu-v9")
    with pytest.raises(ConfigError, match="not both"):
        tflms.LMSConfig.from_kwargs(budget="1GiB", budget_bytes=5)


def test_tflms_function_with_a_budget_trains_identically():
    import keras
    import tensorflow as tf

    from tflms.ir import tf_io

    def make():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
                                                          for _ in range(4)] + [keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.01, momentum=0.9)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return model, step

    x = tf.constant(np.linspace(-1, 1, 1024 * 64, dtype=np.float32).reshape(1024, 64))
    y = tf.constant(np.linspace(0, 1, 1024, dtype=np.float32).reshape(1024, 1))
    model_a, step_a = make()
    plain = tf.function(step_a)
    base = simulate(tf_io.from_concrete_function(plain.get_concrete_function(x, y)), PROFILE)
    budget = base.peak_bytes - 2**18
    model_b, step_b = make()
    fn = tflms.function(step_b, budget=budget, profile=PROFILE)
    losses_a = [plain(x, y) for _ in range(3)]
    losses_b = [fn(x, y) for _ in range(3)]
    assert fn.report.tuning is not None and fn.report.tuning["predicted_peak_bytes"] <= budget
    assert fn.report.num_swapped > 0
    assert_bitwise_equal(snapshot(model_a, losses=losses_a), snapshot(model_b, losses=losses_b),
                         "tflms.function(budget=...) vs tf.function")


def test_max_batch_with_and_without_tflms():
    import tensorflow as tf

    from tflms.ir import tf_io
    from tflms.tune.maxbatch import max_batch

    ws = [tf.Variable(tf.random.stateless_normal((256, 256), seed=(i, 0)) * 0.05) for i in range(6)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for w in ws:
                h = tf.nn.relu(tf.matmul(h, w))
            loss = tf.reduce_mean(h)
        for w, g in zip(ws, tape.gradient(loss, ws)):
            w.assign_sub(0.1 * g)
        return loss

    cf = step.get_concrete_function(tf.TensorSpec((None, 256), tf.float32))
    profile = HardwareProfile("tiny", "8MiB", 14e12, 900, 15.75)
    plain = max_batch(cf, profile=profile, with_tflms=False)
    assert plain.batch_size > 0
    graph = tf_io.from_concrete_function(cf)
    assert simulate(graph.with_batch_size(plain.batch_size), profile).peak_bytes <= profile.memory_bytes
    assert simulate(graph.with_batch_size(plain.batch_size + 1), profile).peak_bytes > profile.memory_bytes
    lms = max_batch(cf, profile=profile, with_tflms=True)
    assert lms.batch_size > plain.batch_size
    assert lms.tuned.best.sim.peak_with_margin_bytes <= profile.memory_bytes
    # the estimate's search: from a known fit, to within 1/8, the first fit kept (no fastest-rewrite tune)
    quick = max_batch(cf, profile=profile, with_tflms=True, start=plain.batch_size, tolerance=0.125, fastest=False)
    assert lms.batch_size / 1.125 <= quick.batch_size <= lms.batch_size
    assert len(quick.evaluated) < len(lms.evaluated) and quick.evaluated[0] == (plain.batch_size, True)
    # the smallest batch found not to fit, by a tune or by the swap-only bound, is within 1/8 above it
    assert quick.upper is not None and quick.batch_size < quick.upper <= quick.batch_size * 1.125
    failed = [b for b, ok in quick.evaluated if not ok] + list(quick.bound_rejected)
    assert quick.upper == min(failed)
    # a batch the swap-only bound rejects is never tuned, and nothing the bound allows is rejected by it
    assert not set(quick.bound_rejected) & {b for b, _ in quick.evaluated}
    for rejected in lms.bound_rejected:
        assert rejected > lms.batch_size
    with pytest.raises(tflms.ConfigError, match="tolerance must be >= 0"):
        max_batch(cf, profile=profile, tolerance=-1)
    with pytest.raises(tflms.GraphError, match="unknown leading"):
        fixed = tf.function(step.python_function).get_concrete_function(tf.ones((4, 256)))
        max_batch(tf_io.from_concrete_function(fixed), profile=profile)


def test_majority_vote_of_saving_aoa_wdoa():
    from tflms.ir.graph import TensorRef
    from tflms.policies.idle_time import IdleCandidate, majority_order

    def cand(name, size, idle, load):
        # copy_s 0: saving = size, AOA = idle * size, WDOA = load.
        return IdleCandidate(TensorRef(name), size, 0.0, idle, 0.0, (), ("c",), load_byte_s=load)

    a = cand("a", 100, 1.0, 50.0)   # saving 100, AOA 100, WDOA 50
    b = cand("b", 10, 5.0, 80.0)    # saving 10, AOA 50, WDOA 80 -> loses to a on 2 of 3
    c = cand("c", 1000, 0.5, 10.0)  # saving 1000, AOA 500, WDOA 10 -> beats a and b on 2 of 3
    assert [x.tensor.op for x in majority_order([a, b, c])] == ["c", "a", "b"]


def test_a_large_activation_outvotes_a_small_vector_that_idles_longer(monkeypatch):
    """The saving score grows with bytes: DOA did not, and 1 KiB vectors won (issue 11)."""
    from tflms.ir.graph import TensorRef
    from tflms.policies import idle_time
    from tflms.policies.idle_time import IdleCandidate, majority_order

    big = IdleCandidate(TensorRef("big"), 100 << 20, 0.0, 0.1, 0.01, (), ("c",), load_byte_s=5e8)
    small = IdleCandidate(TensorRef("small"), 1 << 10, 0.0, 1.0, 1e-7, (), ("c",), load_byte_s=1e9)
    assert big.saving == 100 << 20 and small.saving == 1 << 10
    assert [x.tensor.op for x in majority_order([small, big])] == ["big", "small"]
    # The control: with DOA in the vote instead (Zhang et al.'s scores), the small vector wins.
    monkeypatch.setattr(idle_time, "SCORES", (("doa", lambda c: c.doa_s),) + idle_time.SCORES[1:])
    assert [x.tensor.op for x in majority_order([small, big])] == ["small", "big"]


def test_backward_tensors_idle_across_the_peak_are_candidates(monkeypatch):
    from tflms.analysis.cto import Category, analyze_graph
    from tflms.config import LMSConfig
    from tflms.policies import idle_time
    from tflms.profiles import get_profile
    from tflms.sim.simulator import simulate
    from tflms.testing import mlp_training_graph

    analysis = analyze_graph(mlp_training_graph(8, batch=256, width=512))
    profile = get_profile("v100-16gb-pcie3")
    sim = simulate(analysis.graph, profile)
    found = idle_time.idle_candidates(analysis, sim, profile, LMSConfig())
    categories = {analysis.categories[c.tensor.op] for c in found}
    assert categories == {Category.FORWARD, Category.BACKWARD}
    monkeypatch.setattr(idle_time, "CANDIDATE_CATEGORIES", frozenset({Category.FORWARD}))
    forward_only = idle_time.idle_candidates(analysis, sim, profile, LMSConfig())
    assert len(forward_only) < len(found)
    assert {analysis.categories[c.tensor.op] for c in forward_only} == {Category.FORWARD}


def test_load_integral_over_absence_windows():
    from tflms.policies.idle_time import _load_integrals

    timeline = [(0.0, 10, 0), (1.0, 30, 0), (3.0, 5, 0)]
    assert _load_integrals(timeline, [(0.5, 2.0), (2.5, 4.0), (1.0, 1.0)]) == [0.5 * 10 + 1.0 * 30,
                                                                              0.5 * 30 + 1.0 * 5, 0.0]


def test_step_plan_figures_and_fit_by_allocator_model(graph, baseline):
    from tflms.memplan import validate
    from tflms.memplan.offsets import Plan
    from tflms.memplan.report import lifetimes_of, plan_step

    report = plan_step(baseline)
    # The planner's lower bound is the simulator's transient peak: the same lifetimes.
    assert report.lower_bound_bytes == baseline.transient_peak_bytes
    assert report.lower_bound_bytes <= report.planned_pool_bytes <= report.bfc_peak_reserved_bytes
    assert report.planned_pool_bytes == min(report.strategy_pools.values())
    validate(Plan(report.planned_strategy, report.planned_pool_bytes, report.offsets, report.lower_bound_bytes),
             lifetimes_of(baseline))
    assert "BFC allocator model" in report.table()
    # A budget the live bytes meet but the allocator model does not is not a fit.
    budget = baseline.peak_bytes
    assert report.bfc_total_bytes > budget
    assert tune(graph, budget=budget, profile=PROFILE).strategy == "none"
    by_bfc = tune(graph, budget=budget, profile=PROFILE, fit_by="bfc")
    assert by_bfc.strategy != "none"
    assert plan_step(by_bfc.best.sim).bfc_total_bytes <= budget


def test_vdnn_policies_are_opt_in_strategies(graph, baseline):
    budget = int(baseline.peak_bytes * 0.8)
    default = tune(graph, budget=budget, profile=PROFILE)
    assert not {c.strategy for c in default.candidates} & {"vdnn_conv", "vdnn_all"}
    with_vdnn = tune(graph, budget=int(baseline.peak_bytes * 0.85), profile=PROFILE, strategies=["vdnn_all"])
    assert {c.strategy for c in with_vdnn.candidates} == {"none", "vdnn_all"}
    assert with_vdnn.strategy == "vdnn_all" and with_vdnn.best.sim.peak_bytes < baseline.peak_bytes
    with pytest.raises(ConfigError, match="unknown tuning strategies"):
        tune(graph, budget=budget, profile=PROFILE, strategies=["vdnn_some"])


def test_fit_by_reaches_the_tuner_through_the_config(graph, baseline):
    from tflms.memplan.report import plan_step
    from tflms.pipeline import rewrite_step

    config = tflms.LMSConfig(budget_bytes=baseline.peak_bytes, profile=PROFILE, fit_by="bfc",
                             accelerator_device="/device:GPU:0")
    result = rewrite_step(graph, config)
    assert result.report.tuning["strategy"] != "none"
    assert plan_step(simulate(result.graph, PROFILE)).bfc_total_bytes <= baseline.peak_bytes
    with pytest.raises(ConfigError, match="fit_by must be"):
        tflms.LMSConfig(fit_by="roughly")


def _momentum_mlp(num_layers: int = 6, batch: int = 256, width: int = 512):
    """An MLP step whose optimizer multiplies each momentum slot by its factor as soon as the slot is read (at
    the start, as TensorFlow runs it: the read is ready then) and uses the product only in the update."""
    from tflms.testing.graphs import GraphBuilder
    b = GraphBuilder()
    act, w_shape = (batch, width), (width, width)
    x = b.op("x", "Placeholder", shape=act)
    mu = b.op("mu", "Const", shape=())
    h, acts, weights = x, [x], []
    for i in range(num_layers):
        handle = b.op(f"var_{i}", "Placeholder", shape=(), dtype="resource")
        slot = b.op(f"slot_{i}", "Placeholder", shape=(), dtype="resource")
        w = b.op(f"fw/ReadVariableOp_{i}", "ReadVariableOp", [handle], shape=w_shape)
        h = b.op(f"fw/Relu_{i}", "Relu", [b.op(f"fw/MatMul_{i}", "MatMul", [h, w], shape=act)], shape=act)
        acts.append(h)
        weights.append((handle, slot, w))
    grad = b.op("loss/Sub", "Sub", [h, x], shape=act)
    for i in reversed(range(num_layers)):
        handle, slot, w = weights[i]
        g = b.op(f"gradient_tape/ReluGrad_{i}", "ReluGrad", [grad, acts[i + 1]], shape=act)
        gw = b.op(f"gradient_tape/MatMul_1_{i}", "MatMul", [acts[i], g], shape=w_shape)
        grad = b.op(f"gradient_tape/MatMul_{i}", "MatMul", [g, w], shape=act)
        m = b.op(f"opt/ReadVariableOp_{i}", "ReadVariableOp", [slot], shape=w_shape)
        decayed = b.op(f"opt/Mul_{i}", "Mul", [m, mu], shape=w_shape)
        new = b.op(f"opt/Sub_{i}", "Sub", [decayed, gw], shape=w_shape)
        b.op(f"opt/AssignVariableOp_{i}", "AssignVariableOp", [slot, new], shape=None, num_outputs=0)
        b.op(f"opt/AssignAddVariableOp_{i}", "AssignAddVariableOp", [handle, new], shape=None, num_outputs=0)
    return b.graph


def test_optimizer_products_idle_across_the_peak_are_candidates(monkeypatch):
    """VGG-16's 392 MiB ``fc1`` momentum product (``sgd/Mul_52``) is made at the start and read at the
    update: idle the whole step, and live at every peak. It is a plain tensor (not a variable), so a
    candidate; with update-category tensors left out (the rule before) it is not."""
    from tflms.analysis.cto import Category, analyze_graph
    from tflms.config import LMSConfig
    from tflms.policies import idle_time
    from tflms.profiles import get_profile
    from tflms.sim.simulator import simulate

    analysis = analyze_graph(_momentum_mlp())
    assert analysis.categories["opt/Mul_0"] is Category.UPDATE
    profile = get_profile("v100-16gb-pcie3")
    sim = simulate(analysis.graph, profile)
    found = idle_time.idle_candidates(analysis, sim, profile, LMSConfig())
    products = {c.tensor.op for c in found if analysis.categories[c.tensor.op] is Category.UPDATE}
    assert products and products <= {f"opt/Mul_{i}" for i in range(6)}
    monkeypatch.setattr(idle_time, "CANDIDATE_CATEGORIES", frozenset({Category.FORWARD, Category.BACKWARD}))
    assert not {c.tensor.op for c in idle_time.idle_candidates(analysis, sim, profile, LMSConfig())} & products


def test_a_swapped_momentum_product_trains_bitwise():
    """The traced two-branch model (SGD with momentum) through the pre-pass: every optimizer product the
    idle-time rule finds live across the peak swapped (no size floor), run by TensorFlow with grappler off:
    the same bytes as the plain step."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from test_schedule import assert_traced_step_trains_like_plain, traced_step_plan
    from tflms.analysis.cto import Category
    from tflms.config import LMSConfig
    from tflms.passes.swaps import apply_swaps
    from tflms.policies import idle_time
    from tflms.profiles import get_profile
    from tflms.sim.simulator import simulate

    graph, analysis, _ = traced_step_plan(preoptimized=True)
    profile = get_profile("v100-16gb-pcie3")
    config = LMSConfig(min_swap_bytes=0)
    found = idle_time.idle_candidates(analysis, simulate(graph, profile), profile, config)
    products = [c for c in found if analysis.categories[c.tensor.op] is Category.UPDATE]
    assert products, sorted({analysis.categories[c.tensor.op] for c in found})
    plan = idle_time.plan_idle(analysis, products, config, "/device:GPU:0")
    rewritten = apply_swaps(graph, plan).graph
    assert sum(op.name.startswith("lms/swap_out") for op in rewritten) == len(products)
    assert_traced_step_trains_like_plain(rewritten, "momentum swapped", preoptimized=True)


def test_idle_time_candidates_follow_the_device_planned_for_not_this_machines_onednn():
    """The tuner plans for a profile's GPU on a machine without one; the never-swap rule that follows oneDNN's CPU
    kernels (a MaxPool output its MaxPoolGrad reads) must then not apply, whatever this machine's oneDNN setting
    (it did for idle-time candidates, whose unplaced ops counted as this machine's CPU: DenseNet-121's plans
    differed between two machines). Planning for the CPU with oneDNN's kernels leaves the output out."""
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.devices import onednn_kernels
    from tflms.policies.idle_time import scored_candidates
    from tflms.profiles import get_profile
    from tflms.testing.graphs import GraphBuilder
    b = GraphBuilder()
    big, half = (8, 64, 64, 32), (8, 32, 32, 32)
    x = b.op("x", "Placeholder", shape=big)
    relu = b.op("relu", "Relu", [x], shape=big)
    h = pool = b.op("pool", "MaxPool", [relu], shape=half)
    for i in range(4):  # the pool's output idles across these and their gradients, where the peak is
        h = b.op(f"f{i}", "Tanh", [h], shape=big if i == 1 else half)
    grad = b.op("gradient_tape/f_grad", "TanhGrad", [h, h], shape=half)
    for i in range(3):
        grad = b.op(f"gradient_tape/g{i}", "TanhGrad", [grad, h], shape=half)
    b.op("gradient_tape/pool_grad", "MaxPoolGrad", [relu, pool, grad], shape=big)
    analysis = analyze_graph(b.graph)
    profile = get_profile(PROFILE)
    sim = simulate(b.graph, profile)
    config = LMSConfig(min_swap_bytes=0).with_rule_defaults()

    def candidates(device):
        return {c.tensor.op for c in scored_candidates(analysis, sim, profile, config, device)}

    def tuners_candidates(device):
        from tflms.passes.swaps import DEFAULT_COPY_OP
        from tflms.sim import SimOptions
        from tflms.tune.search import TuneEvaluator
        ev = TuneEvaluator(analysis, profile, sim.peak_bytes, profile.host_memory_bytes, SimOptions(), config, device,
                        DEFAULT_COPY_OP, None)
        return {c.tensor.op for c in ev.scored(sim)}

    with onednn_kernels(True):  # as on a machine whose TensorFlow runs oneDNN's kernels
        assert "pool" in candidates("/device:GPU:0") and "pool" in tuners_candidates("/device:GPU:0")
        assert "pool" not in candidates("/device:CPU:0")  # the control: there the rule holds
        assert "pool" not in tuners_candidates("/device:CPU:0")
    with onednn_kernels(False):
        assert "pool" in candidates("/device:CPU:0")
