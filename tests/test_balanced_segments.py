"""Checkpoints chosen by bytes (``tflms.policies.recompute.balanced_segment_ops``, issue 27).

Evenly spaced checkpoints ignore how large each layer's tensors are; the balanced plan keeps the articulations for
which every segment's kept-before, re-run and closing bytes are least. These tests check what it returns, that its
simulated peak is below every evenly spaced plan's on the kit's attention model and within 1% of the best one's on its
residual model, and that a step recomputed by it trains bitwise with its clones in what TensorFlow ran.
"""

from __future__ import annotations

import pytest

from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.ir import tf_io
from tflms.ir.preoptimize import preoptimize
from tflms.passes.swaps import apply_swaps
from tflms.pipeline import _build
from tflms.policies.eligibility import recompute_skip_reason
from tflms.policies.recompute import (_activations, articulations, balanced_segment_ops, plan_recomputes,
                                      segment_ops)
from tflms.policies.swapplan import SwapPlan
from tflms.sim.simulator import simulate
from tflms.testing import assert_bitwise_equal, op_type_counts, record_run_metadata, snapshot

from test_recompute_again import PROFILE, _traced


def _graph(model_name: str, batch_size: int = 32):
    _, _, step, batches = _traced(model_name, batch_size)
    return tf_io.load_graph(preoptimize(step.get_concrete_function(*batches[0])))


def _peak(analysis, ops) -> int:
    decisions, _ = plan_recomputes(analysis, ops)
    plan = SwapPlan(LMSConfig(), "/device:CPU:0", (), (), recomputes=decisions)
    return simulate(apply_swaps(analysis.graph, plan).graph, PROFILE).peak_bytes


#: How far above the best evenly spaced plan's peak the balanced plan may be, by model: below it on the attention
#: block; on the residual model (a fresh install of 2026-12-02: tensorflow-cpu 2.21.0, keras 3.15.1, numpy 2.4.6) the
#: plan of 3 even segments peaks at 1,192,664 bytes, the least of any one to three of its 10 articulations kept
#: (every such set simulated, a scratch script), and the balanced plan 2,272 bytes (0.19%) above it; before, it was
#: below. The balanced plan weighs bytes, not the simulated peak: near the best, not always at it.
ABOVE_BEST_EVEN = {"residual": 0.01, "mha_block": 0.0}


@pytest.mark.parametrize("model_name", ["residual", "mha_block"])
def test_balanced_checkpoints_peak_below_every_evenly_spaced_plan(model_name):
    analysis = analyze_graph(_graph(model_name))
    cuts = articulations(analysis)
    even = {k: _peak(analysis, segment_ops(analysis, k))
            for k in sorted({1, max(1, round(len(cuts) ** 0.5)), len(cuts)})}
    ops, kept = balanced_segment_ops(analysis)
    assert 0 < kept < len(cuts)
    peak = _peak(analysis, ops)
    if ABOVE_BEST_EVEN[model_name]:
        assert peak <= min(even.values()) * (1 + ABOVE_BEST_EVEN[model_name]), (kept, even)
        assert peak < sorted(even.values())[1], (kept, even)  # (below every even plan but the best)
    else:
        assert peak < min(even.values()), (kept, even)


def test_the_plan_recomputes_every_recomputable_activation_but_the_kept_checkpoints():
    analysis = analyze_graph(_graph("mha_block"))
    cuts = set(articulations(analysis))
    recomputable = {n for n in _activations(analysis) if recompute_skip_reason(analysis, n) is None}
    for slack in (1.0, 1.5, 4.0):
        ops, kept = balanced_segment_ops(analysis, slack)
        assert ops <= recomputable and len(recomputable - ops) == kept
        assert recomputable - ops <= cuts  # only articulations are kept
        assert (ops, kept) == balanced_segment_ops(analysis, slack)  # deterministic

    def kept_bytes(slack):
        kept = recomputable - balanced_segment_ops(analysis, slack)[0]
        return sum(info.num_bytes or 0 for name in kept for info in analysis.graph.op(name).outputs)

    assert kept_bytes(4.0) <= kept_bytes(1.5) <= kept_bytes(1.0)  # more room per segment, fewer bytes kept
    with pytest.raises(ValueError, match="slack must be at least 1"):
        balanced_segment_ops(analysis, 0.5)


def _train(model_name: str, balanced: bool):
    model, optimizer, step, batches = _traced(model_name, batch_size=8)
    fn, decisions = step, ()
    if balanced:
        pre = preoptimize(step.get_concrete_function(*batches[0]))
        analysis = analyze_graph(tf_io.load_graph(pre))
        decisions, _ = plan_recomputes(analysis, balanced_segment_ops(analysis)[0])
        result = apply_swaps(analysis.graph, SwapPlan(LMSConfig(), "/device:CPU:0", (), (), recomputes=decisions))
        fn = _build(result.graph, pre, result.report)
    with record_run_metadata() as ran:
        for x, y in batches:
            fn(x, y)
    return snapshot(model, optimizer), decisions, ran


@pytest.mark.parametrize("model_name", ["bert_dropout_bn",
                                        pytest.param("mobilenet", marks=[pytest.mark.slow, pytest.mark.real_model])])
def test_a_step_recomputed_by_balanced_checkpoints_trains_bitwise_and_the_clones_run(model_name):
    plain, _, plain_ran = _train(model_name, False)
    control, _, _ = _train(model_name, False)
    assert_bitwise_equal(plain, control, "plain TensorFlow twice (the control)")
    recomputed, decisions, ran = _train(model_name, True)
    assert decisions, "nothing recomputed"
    assert_bitwise_equal(plain, recomputed, f"{model_name} recomputed by balanced checkpoints")
    inserted = [name for d in decisions for name in d.inserted]
    step = ran.step_graph(inserted)
    assert step is not None, "no function TensorFlow ran holds the clones"
    ran_names = {n.name for n in step.post_optimization_graph.node}
    clones = [c for d in decisions for c in d.clones]
    assert set(clones) <= ran_names, sorted(set(clones) - ran_names)[:5]
    assert op_type_counts(plain_ran.step_graph().post_optimization_graph) == op_type_counts(
        step.post_optimization_graph, exclude_names=inserted)


def test_recompute_only_reaches_a_budget_that_only_balanced_checkpoints_fit(monkeypatch):
    """``recompute="only"`` judges the balanced segment plans beside the others: on the MHA block at 65% of its
    peak only a balanced plan fits (without them the tune raises the BudgetError)."""
    from tflms.errors import BudgetError
    from tflms.tune import recompute_sets
    from tflms.tune.tuner import tune
    graph = _graph("mha_block")
    budget = int(0.65 * simulate(graph, PROFILE).peak_bytes)

    def tuned():
        return tune(analyze_graph(graph), budget=budget, profile=PROFILE, strategies=["recompute"],
                    config=LMSConfig(recompute="only"))

    best = tuned().best
    assert best.fits and best.params.get("balanced") in recompute_sets.BALANCED_SLACKS and not best.plan.swaps
    monkeypatch.setattr(recompute_sets, "BALANCED_SLACKS", ())
    with pytest.raises(BudgetError):
        tuned()
