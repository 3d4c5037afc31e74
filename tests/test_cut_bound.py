"""The cut bound (tflms.tune.cut_bound): the least overhead of any plan that fits, at the loss's gradient.

Checked: it is 0 where the step fits and infinite where the resident bytes alone do not; it never falls as the budget
shrinks, and swaps can only lower it; a swapped tensor's two copies are both counted; every plan the tuner judges
that fits costs at least the bound (recompute plans at least the recompute-only bound); each re-run's floor is what
the module doc says; the answer is deterministic, where the search closes the gap and where it stops at its node
limit (and the status says which).
"""

from __future__ import annotations

import pytest

from tflms.analysis.cto import analyze_graph
from tflms.sim import SimOptions, get_profile, simulate
from tflms.tune.cut_bound import _status, cut_bound, cut_op
from tflms.tune.rerun_floor import rerun_floor_s, rerun_savings_s
from tflms.testing import GraphBuilder, mlp_training_graph

PROFILE = get_profile("h200-141gb")
XLA = SimOptions(clock="xla")


@pytest.fixture(scope="module")
def mlp():
    graph = mlp_training_graph(4, batch=256, width=512)
    return analyze_graph(graph), simulate(graph, PROFILE, options=XLA)


@pytest.fixture(scope="module")
def cnn(cnn_graph):
    graph = cnn_graph[0]
    return analyze_graph(graph), simulate(graph, PROFILE, options=XLA)


def test_at_most_zero_where_the_step_fits_and_infinite_below_its_resident_bytes(mlp):
    """Where the step fits, doing nothing is a plan: the bound is at most 0, and exactly 0 here, where no re-run
    spares a read or a write (the plain step writes each ReLU for the next product and its gradient reads it, as a
    re-run would read the product's output)."""
    analysis, plain = mlp
    fits = cut_bound(analysis, plain, PROFILE, plain.peak_with_margin_bytes)
    forward = [n for n in analysis.order if analysis.categories[n].value == "forward"]
    assert not any(rerun_savings_s(analysis, PROFILE, forward).values())
    assert fits.status == "optimal" and fits.overhead_s == 0.0 and fits.fits
    assert fits.gradient_ops_after > 0 and fits.needed_bytes > 0
    nothing = cut_bound(analysis, plain, PROFILE, plain.resident_bytes - 1)
    assert nothing.status == "infeasible" and not nothing.fits and nothing.overhead == float("inf")


def test_the_cut_is_the_loss_gradient_seed(mlp):
    """The op taken as the backward pass's first: every forward op that feeds the loss precedes it, and it precedes
    every gradient op that reads a forward activation."""
    analysis, plain = mlp
    bound = cut_bound(analysis, plain, PROFILE, plain.transient_peak_bytes // 2 + plain.resident_bytes)
    assert bound.cut_op == cut_op(analysis) and analysis.categories[bound.cut_op].value == "backward"
    assert bound.ops_after_loss <= 2  # (at most the loss's own readers: nothing else runs after it)


def test_it_never_falls_as_the_budget_shrinks_and_swaps_only_lower_it(mlp):
    analysis, plain = mlp
    resident, transient = plain.resident_bytes, plain.transient_peak_bytes
    last_only = last_any = float("-inf")
    for fraction in (0.9, 0.6, 0.4, 0.25, 0.1):
        budget = resident + int(fraction * transient)
        only = cut_bound(analysis, plain, PROFILE, budget, swaps=False)
        any_ = cut_bound(analysis, plain, PROFILE, budget)
        assert only.overhead_s >= last_only - 1e-12 and any_.overhead_s >= last_any - 1e-12, fraction
        assert any_.overhead_s <= only.overhead_s + 1e-12, fraction
        assert only.swapped_bytes == 0 and only.kept_bytes <= only.cap_bytes
        last_only, last_any = only.overhead_s, any_.overhead_s
    assert last_only > 0, "at a tenth of the activations something must be re-run"


def test_no_plan_the_tuner_fits_beats_the_bound(cnn):
    """Every candidate of a full tune (swaps, recomputation, hybrids, priced on the xla-clusters clock) that fits
    adds at least the bound to the plain XLA step; recompute plans at least the recompute-only bound."""
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    from tflms.tune.tuner import DEFAULT_STRATEGIES, tune
    analysis, plain = cnn
    strategies = set()
    for fraction in (0.9, 0.75):
        budget = plain.resident_bytes + int(fraction * plain.transient_peak_bytes)
        result = tune(analysis.graph, budget=budget, profile=PROFILE, strategies=list(DEFAULT_STRATEGIES),
                      sim_options=SimOptions(clock=CLOCK_XLA_CLUSTERS))
        only = cut_bound(analysis, plain, PROFILE, budget, swaps=False)
        any_ = cut_bound(analysis, plain, PROFILE, budget)
        fitting = [c for c in result.candidates if c.fits]
        assert fitting
        for c in fitting:
            strategies.add(c.strategy)
            added = c.sim.step_time_s - plain.step_time_s
            assert added >= any_.overhead_s - 1e-12, (fraction, c.strategy, c.params, added, any_.overhead_s)
            if c.strategy == "recompute":
                assert added >= only.overhead_s - 1e-12, (fraction, c.params, added, only.overhead_s)
        print(f"cnn at {fraction:.0%} of its activations: bound {only.overhead:+.2%} (recompute only), "
              f"{any_.overhead:+.2%} (any); tuner's best {result.best.sim.step_time_s / plain.step_time_s - 1:+.2%}")
    assert {"recompute", "hybrid"} <= strategies, strategies


def test_a_swapped_tensor_crosses_the_link_twice():
    """A tensor that may not be re-run (a stateful random op's) and that the device may not keep at the loss is on
    the host then: it left before the loss and comes back after it, two copies in two windows that do not overlap.
    The bound is both copies' time, not one's."""
    b = GraphBuilder()
    s = (4096, 4096)
    x = b.op("x", "Placeholder", shape=s)
    noise = b.op("fw/noise", "RandomUniform", [b.op("seed", "Placeholder", shape=(2,))], shape=s)
    loss = b.op("loss", "Sum", [b.op("fw/r", "Mul", [x, noise], shape=s)], shape=())
    b.op("gradient_tape/g", "Mul", [loss, noise], shape=s)
    analysis = analyze_graph(b.graph)
    plain = simulate(b.graph, PROFILE, options=XLA)
    bound = cut_bound(analysis, plain, PROFILE, plain.resident_bytes + 1)
    assert bound.status == "optimal" and bound.swapped_bytes == 4096 * 4096 * 4
    both_ways = 2 * bound.swapped_bytes / PROFILE.effective_link_bytes_per_s
    assert bound.plain_step_s + bound.overhead_s == pytest.approx(both_ways) and both_ways > 2 * plain.step_time_s


def test_the_bound_is_deterministic(cnn):
    analysis, plain = cnn
    budget = plain.resident_bytes + int(0.3 * plain.transient_peak_bytes)
    first, second = (cut_bound(analysis, plain, PROFILE, budget) for _ in range(2))
    assert first == second


@pytest.fixture(scope="module")
def small_bert():
    """A three-layer BERT (sequence 128, width 128, dropout) at batch 64 and 18% of its activations: on HiGHS 1.12 the
    search closes its gap after 276 nodes, past :data:`NODE_LIMIT`. (Two layers at 30% took 64 nodes until dropout's
    random numbers fused into their readers on the XLA clocks, and three at 15% 21 until GELU's Erfc did; both now
    close at the root.)"""
    keras = pytest.importorskip("keras")
    import tensorflow as tf

    from tflms.ir.tf_io import load_graph
    from tflms.testing import make_train_step
    from tflms.testing.models import bert
    model = bert(seed=0, length=128, width=128, heads=4, layers=3, dropout=0.1)
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)
    graph = load_graph(tf.function(make_train_step(model, optimizer)), tf.TensorSpec((64, 128), tf.int32),
                       tf.TensorSpec((64,), tf.int32))
    plain = simulate(graph, PROFILE, options=XLA)
    return analyze_graph(graph), plain, plain.resident_bytes + int(0.18 * plain.transient_peak_bytes)


NODE_LIMIT = 5


def test_a_search_stopped_at_its_node_limit_says_so_and_repeats(small_bert):
    """The project's rule (the same graph and config, the same figure): a search the node limit stops gives the
    same bound and choice each time, whatever the machine's speed, and its status names the limit."""
    analysis, plain, budget = small_bert
    first, second = (cut_bound(analysis, plain, PROFILE, budget, node_limit=NODE_LIMIT) for _ in range(2))
    assert first.status == "node limit" and first.nodes == NODE_LIMIT
    assert first == second
    assert float("-inf") < first.overhead_s < float("inf") and first.recomputed
    closed = cut_bound(analysis, plain, PROFILE, budget, node_limit=None)  # more nodes prove no less
    assert closed.status == "optimal" and closed.nodes > NODE_LIMIT and closed.overhead_s >= first.overhead_s


def test_the_status_names_the_rule_that_stopped_the_search():
    """scipy names HiGHS's node limit no status of its own (its status 4, "solution limit"): the count of nodes
    says so. Its status 1 is the time limit (milp sets no iteration limit)."""
    from types import SimpleNamespace as Result
    assert _status(Result(status=0, mip_node_count=7), 10) == "optimal"
    assert _status(Result(status=2, mip_node_count=0), 10) == "infeasible"
    assert _status(Result(status=1, mip_node_count=3), 10) == "time limit"
    assert _status(Result(status=4, mip_node_count=10), 10) == "node limit"
    assert _status(Result(status=4, mip_node_count=3), 10) is None  # some other end: no answer
    assert _status(Result(status=4, mip_node_count=3), None) is None


def test_rerun_floors():
    """By the module doc: a product costs its price less its launch; an element-wise op a product reads costs its
    output's bytes at memory bandwidth, and nothing where only element-wise gradient ops read it; a reduction costs
    its output's bytes; a view nothing."""
    from tflms.sim.clock import XLA_MIN_KERNEL_S
    from tflms.sim.cost import op_time_s
    b = GraphBuilder()
    s = (2048, 2048)
    x = b.op("x", "Placeholder", shape=s)
    w = b.op("w", "Placeholder", shape=s)
    h = b.op("fw/h", "MatMul", [x, w], shape=s)
    r = b.op("fw/r", "Relu", [h], shape=s)
    v = b.op("fw/v", "Reshape", [r], shape=s)
    m = b.op("fw/m", "Mean", [v], shape=(2048,))
    t = b.op("fw/t", "Tanh", [r], shape=s)
    loss = b.op("loss", "Sum", [t], shape=())
    g = b.op("gradient_tape/g0", "TanhGrad", [t, loss], shape=s)
    g = b.op("gradient_tape/g1", "ReluGrad", [g, r], shape=s)
    b.op("gradient_tape/g2", "MatMul", [g, t], shape=s)  # a product reads t
    b.op("gradient_tape/g3", "Mul", [g, m], shape=s)
    graph = b.graph
    analysis = analyze_graph(graph)
    profile = PROFILE
    bandwidth = profile.effective_memory_bytes_per_s
    product = op_time_s(graph, graph.op("fw/h"), profile) - profile.launch_overhead_s
    assert rerun_floor_s(analysis, "fw/h", profile) == pytest.approx(product)
    assert rerun_floor_s(analysis, "fw/t", profile) == pytest.approx(4 * 2048 * 2048 / bandwidth)
    assert rerun_floor_s(analysis, "fw/r", profile) == 0.0  # only ReluGrad (element-wise) reads it
    assert rerun_floor_s(analysis, "fw/m", profile) == pytest.approx(max(4 * 2048 / bandwidth, XLA_MIN_KERNEL_S))
    assert rerun_floor_s(analysis, "fw/v", profile) == 0.0


def _batch_norm_step(*, rerun: bool):
    """A product, a batch-norm-like chain (centre, scale) and a ReLU that another product reads, and in the backward
    pass the ReLU's gradient feeding a product of the gradient with the first product's output (as batch norm's
    gradient reads the convolution's output). ``rerun``: the ReLU's gradient reads the chain re-run from the first
    product's output instead of the ReLU's (a recompute plan, by hand)."""
    b = GraphBuilder()
    s, row = (2048, 2048), (2048,)
    x = b.op("x", "Placeholder", shape=s)
    w = b.op("w", "Placeholder", shape=s)
    scale = b.op("scale", "Placeholder", shape=row)
    h = b.op("fw/h", "MatMul", [x, w], shape=s)
    mean = b.op("fw/mean", "Mean", [h], shape=row)
    r = b.op("fw/r", "Relu", [b.op("fw/n", "Mul", [b.op("fw/c", "Sub", [h, mean], shape=s), scale], shape=s)],
             shape=s)
    o = b.op("fw/o", "MatMul", [r, w], shape=s)
    dr = b.op("gradient_tape/dr", "MatMul", [o, w], shape=s)
    if rerun:
        r = b.op("gradient_tape/r_clone", "Relu", [b.op("gradient_tape/n_clone", "Mul", [
            b.op("gradient_tape/c_clone", "Sub", [h, mean], shape=s), scale], shape=s)], shape=s)
    g = b.op("gradient_tape/relu_grad", "ReluGrad", [dr, r], shape=s)
    g = b.op("gradient_tape/bn_grad", "Mul", [g, h], shape=s)
    b.op("gradient_tape/dscale", "Sum", [g], shape=row)
    return b.graph


def test_a_fused_re_run_that_spares_a_read_is_counted():
    """A ReLU re-run inside its gradient's fusion, which reads the product's output anyway, spares the read of the
    ReLU's output: the xla clock prices that plan below the plain step, and the bound lies below it (it did not
    while it took every fused re-run as free, docs/design.md, "The cut bound")."""
    graph = _batch_norm_step(rerun=False)
    analysis = analyze_graph(graph)
    plain = simulate(graph, PROFILE, options=XLA)
    rerun = simulate(_batch_norm_step(rerun=True), PROFILE, options=XLA)
    saved = rerun.step_time_s - plain.step_time_s
    read = 2048 * 2048 * 4 / PROFILE.effective_memory_bytes_per_s
    assert saved < -0.5 * read, (saved, read)
    bound = cut_bound(analysis, plain, PROFILE, plain.peak_with_margin_bytes)
    assert bound.overhead_s <= saved + 1e-12, (bound.overhead_s, saved)
    savings = rerun_savings_s(analysis, PROFILE, ["fw/r", "fw/n", "fw/c", "fw/h", "fw/mean"])
    # the read of the ReLU's output, less the two rows the re-run reads that the fusion did not (the mean, the scale)
    assert savings["fw/r"] * PROFILE.effective_memory_bytes_per_s == pytest.approx(2048 * 2048 * 4 - 2 * 2048 * 4)
    assert savings["fw/n"] == savings["fw/c"] == 0.0  # no gradient op reads them
    assert savings["fw/h"] == savings["fw/mean"] == 0.0  # a product, a reduction: their outputs are written


def test_a_fused_re_run_that_reads_as_much_saves_nothing():
    """A ReLU whose gradient reads nothing else of its chain: re-run, the fusion reads the product's output instead
    of the ReLU's, as many bytes."""
    b = GraphBuilder()
    s = (1024, 1024)
    x = b.op("x", "Placeholder", shape=s)
    w = b.op("w", "Placeholder", shape=s)
    r = b.op("fw/r", "Relu", [b.op("fw/h", "MatMul", [x, w], shape=s)], shape=s)
    o = b.op("fw/o", "MatMul", [r, w], shape=s)
    b.op("gradient_tape/relu_grad", "ReluGrad", [b.op("gradient_tape/dr", "MatMul", [o, w], shape=s), r], shape=s)
    assert rerun_savings_s(analyze_graph(b.graph), PROFILE, ["fw/r"]) == {"fw/r": 0.0}


def test_what_the_solver_prints_to_standard_output_goes_to_standard_error(capfd):
    """HiGHS prints some lines from C++ to file descriptor 1, where tools/bench.py --json prints its records: the
    search points that descriptor at standard error while it runs, and back after."""
    import os

    from tflms.tune.cut_bound import solver_prints_to_stderr
    with solver_prints_to_stderr():
        os.write(1, b"from the solver\n")
    os.write(1, b"a record\n")
    out, err = capfd.readouterr()
    assert "from the solver" in err and "from the solver" not in out
    assert out == "a record\n"


@pytest.mark.parametrize("clock", ["graph", "xla-clusters"])
def test_no_order_peaks_below_the_bytes_live_at_the_loss(cnn_graph, clock):
    """:func:`live_at_cut` is a floor under every order's peak: the plain step and the tuner's plans (recompute,
    swaps, both), each in level order, in the order pass's schedule and in random topological orders. And it is
    not the resident bytes alone: the plain step holds its activations at the loss."""
    import random

    from tflms.errors import BudgetError
    from tflms.ir.topo import priority_order
    from tflms.passes.order import enforce_order
    from tflms.passes.swaps import apply_swaps
    from tflms.tune.cut_bound import live_at_cut
    from tflms.tune.tuner import tune
    graph = cnn_graph[0]
    options = SimOptions(clock=clock)
    plain = simulate(graph, PROFILE, options=options)
    cut = cut_op(analyze_graph(graph))
    try:
        candidates = tune(graph, budget=plain.resident_bytes + int(0.3 * plain.transient_peak_bytes),
                          profile=PROFILE, sim_options=options).candidates
    except BudgetError as error:
        candidates = error.candidates
    plans = {c.plan for c in candidates if c.plan is not None and c.plan.changed}
    kinds = {(bool(p.recomputes), bool(p.swaps)) for p in plans}
    picked = [None] + [min((p for p in plans if (bool(p.recomputes), bool(p.swaps)) == kind),
                           key=lambda p: (len(p.swaps), len(p.recomputes))) for kind in sorted(kinds)]
    assert len(picked) >= 3, kinds
    for plan in picked:
        rewritten = graph if plan is None else apply_swaps(graph, plan).graph
        level = simulate(rewritten, PROFILE, options=options)
        bound = live_at_cut(rewritten, level, cut)
        peaks = [level.peak_bytes]
        ordered = enforce_order(rewritten, PROFILE, options=options, level_peak_bytes=level.peak_bytes)
        peaks.append(ordered.report.ordered_sim.peak_bytes if ordered.changed else level.peak_bytes)
        preds, succs = rewritten.adjacency()
        for seed in range(3):
            rng = random.Random(seed)
            keys = {name: (rng.random(), name) for name in preds}
            order = priority_order({name: len(p) for name, p in preds.items()}, succs, keys.__getitem__)
            peaks.append(simulate(rewritten, PROFILE, options=options, order=order).peak_bytes)
        assert min(peaks) >= bound, (clock, plan, peaks, bound)
        if plan is None:
            assert bound > plain.resident_bytes + plain.transient_peak_bytes // 2, (bound, plain.peak_bytes)
