"""Re-running a chain's first ops again (``plan_recomputes(split_levels=...)``, issue 27).

A clone that feeds other clones runs with the earliest of them; in a checkpointed segment of several
layers the first layers' clones then wait through the last layers' backward pass. With
``split_levels`` such an op is cloned again (``.../again1``) for its own readers, from the same kept
tensors. These tests check the plan (every tensor served once, by the copy whose clone its readers
read), the memory it saves in the simulator, and that the step trains bitwise with the copies in
what TensorFlow ran.
"""

from __future__ import annotations

import keras
import networkx as nx
import pytest
import tensorflow as tf

from tflms.analysis.cto import Category, analyze_graph
from tflms.config import LMSConfig
from tflms.ir import tf_io
from tflms.ir.graph import TensorRef
from tflms.ir.preoptimize import preoptimize
from tflms.passes.swaps import apply_swaps
from tflms.pipeline import _build
from tflms.policies.recompute import MAX_COPIES, clone_name, plan_recomputes, segment_ops
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import get_profile
from tflms.report import RewriteReport
from tflms.sim.simulator import simulate
from tflms.testing import (assert_bitwise_equal, build_model, make_batches, make_train_step, op_type_counts,
                           record_run_metadata, snapshot)

PROFILE = get_profile("v100-16gb-pcie3")


def _mobilenet():
    """keras.applications MobileNet (alpha 0.25) at 32x32: depthwise and pointwise convolutions, BatchNorm, ReLU6."""
    keras.utils.set_random_seed(1)
    return keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=3,
                                        classifier_activation=None)


def _traced(model_name: str, batch_size: int):
    model = _mobilenet() if model_name == "mobilenet" else build_model(model_name, seed=1)
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    batches = [(tf.constant(x), tf.constant(y)) for x, y in make_batches(model, batch_size=batch_size, steps=2)]
    return model, optimizer, step, batches


def _plan(graph, split_levels, per_reader: bool = False):
    """One checkpointed segment (every recomputable op the batch flows through re-run), split or not; with
    ``per_reader``, its earliest half re-run for each of their readers (:func:`_first_half`)."""
    analysis = analyze_graph(graph)
    ops = segment_ops(analysis, 1)
    decisions, _ = plan_recomputes(analysis, ops, split_levels=split_levels,
                                   per_reader=_first_half(analysis, ops) if per_reader else ())
    return analysis, SwapPlan(LMSConfig(), "/device:CPU:0", (), (), recomputes=decisions)


def _first_half(analysis, ops):
    """The earliest half of ``ops`` by level: in one segment, the clones that feed the rest."""
    return frozenset(sorted(ops, key=lambda n: (analysis.levels[n], n))[: len(ops) // 2])


@pytest.fixture(scope="module")
def mha():
    _, _, step, batches = _traced("mha_block", batch_size=32)
    return tf_io.load_graph(preoptimize(step.get_concrete_function(*batches[0])))


def test_each_tensor_is_served_once_by_the_copy_its_readers_read(mha):
    analysis, whole = _plan(mha, None)
    _, split = _plan(mha, 3)
    assert not any(d.copy for d in whole.recomputes)
    copies = {d.copy for d in split.recomputes}
    assert copies == set(range(max(copies) + 1)) and 1 <= max(copies) < MAX_COPIES
    # the same tensors and readers as one clone each would serve, each now from exactly one copy
    served = [(ref, rs) for d in split.recomputes for ref, rs in zip(d.tensors, d.readers)]
    assert sorted(served) == sorted((ref, rs) for d in whole.recomputes for ref, rs in zip(d.tensors, d.readers))
    rewritten = apply_swaps(mha, split).graph
    rewritten.lint()
    assert nx.is_directed_acyclic_graph(rewritten.to_networkx())
    for d in split.recomputes:
        assert d.clones == tuple(clone_name(op, d.copy) for op in d.ops)
        top = max(analysis.levels[n] for n in d.ops)
        assert all(analysis.categories[t] is not Category.FORWARD or analysis.levels[t] > top for t in d.triggers)
        assert all(c.endswith(f"/again{d.copy}") == (d.copy > 0) for c in d.clones)
        for ref, readers in zip(d.tensors, d.readers):
            for reader in readers:
                assert TensorRef(clone_name(ref.op, d.copy), ref.index) in rewritten.op(reader).inputs
        for clone in d.clones:  # a copy reads its own chain's clones, never another copy's
            for ref in rewritten.op(clone).inputs:
                if ref.op.startswith("lms/recompute_") and not ref.op.startswith("lms/recompute_gate_"):
                    assert ref.op in d.clones, (clone, ref.op)
    # a later copy re-runs only ops an earlier copy of the chain clones too
    first = {op for d in split.recomputes if d.copy == 0 for op in d.ops}
    assert {op for d in split.recomputes if d.copy for op in d.ops} <= first
    # the report says so
    report = RewriteReport(plan=split, graph_summary={}, inserted_ops=tuple(apply_swaps(mha, split).report),
                           timings_s={})
    again = sum(1 for d in split.recomputes if d.copy)
    assert f"{len(split.recomputes) - again} chains, and {again} re-runs of a chain's first ops" in report.table()
    assert [r["copy"] for r in report.to_dict()["recomputes"]] == [d.copy for d in split.recomputes]
    # deterministic
    again = apply_swaps(mha, _plan(mha, 3)[1]).graph
    assert tf_io.to_graph_def(rewritten).SerializeToString(deterministic=True) == tf_io.to_graph_def(
        again).SerializeToString(deterministic=True)


def test_re_running_again_trades_time_for_memory(mha):
    whole = simulate(apply_swaps(mha, _plan(mha, None)[1]).graph, PROFILE)
    split = simulate(apply_swaps(mha, _plan(mha, 3)[1]).graph, PROFILE)
    assert split.peak_bytes < 0.9 * whole.peak_bytes
    assert split.step_time_s > whole.step_time_s  # (the first ops run once more)
    # no split level this far apart: the same plan
    assert not any(d.copy for d in _plan(mha, 10**6)[1].recomputes)


def _train(model_name, split_levels, per_reader: bool = False):
    model, optimizer, step, batches = _traced(model_name, batch_size=8)
    fn, plan = step, None
    if split_levels != "plain":
        pre = preoptimize(step.get_concrete_function(*batches[0]))
        graph = tf_io.load_graph(pre)
        _, plan = _plan(graph, split_levels, per_reader)
        result = apply_swaps(graph, plan)
        fn = _build(result.graph, pre, result.report)
    with record_run_metadata() as ran:
        for x, y in batches:
            fn(x, y)
    return snapshot(model, optimizer), plan, ran


@pytest.mark.parametrize("model_name", ["mha_block", "layernorm_gelu",
                                        pytest.param("mobilenet",
                                                     marks=[pytest.mark.slow, pytest.mark.real_model])])
def test_a_step_with_chains_re_run_again_trains_bitwise_and_the_copies_run(model_name):
    plain, _, plain_ran = _train(model_name, "plain")
    control, _, _ = _train(model_name, "plain")
    assert_bitwise_equal(plain, control, "plain TensorFlow twice (the control)")
    split, plan, ran = _train(model_name, 3)
    assert any(d.copy for d in plan.recomputes), f"{model_name}: nothing re-run again"
    assert_bitwise_equal(plain, split, f"{model_name} with chains re-run again")
    inserted = [name for d in plan.recomputes for name in d.inserted]
    step = ran.step_graph(inserted)
    assert step is not None, "no function TensorFlow ran holds the clones"
    ran_names = {n.name for n in step.post_optimization_graph.node}
    again = [c for d in plan.recomputes if d.copy for c in d.clones]
    assert set(again) <= ran_names, sorted(set(again) - ran_names)[:5]
    assert op_type_counts(plain_ran.step_graph().post_optimization_graph) == op_type_counts(
        step.post_optimization_graph, exclude_names=inserted)


def test_ops_re_run_per_reader_are_split_at_zero_levels_alone(mha):
    """``plan_recomputes(per_reader=)``: those ops are re-run again wherever their own readers come later than the
    clones they feed (a split at 0 levels for them alone); the rest keep ``split_levels``."""
    analysis = analyze_graph(mha)
    ops = segment_ops(analysis, 1)
    everything, _ = plan_recomputes(analysis, ops, per_reader=ops)
    assert everything == plan_recomputes(analysis, ops, split_levels=0)[0]
    whole = plan_recomputes(analysis, ops)[0]
    assert plan_recomputes(analysis, ops, per_reader=())[0] == whole
    # the earliest half of the segment: only they serve their readers from a re-run
    part = _first_half(analysis, ops)
    mixed = _plan(mha, None, per_reader=True)[1].recomputes
    again = {ref.op for d in mixed if d.copy for ref in d.tensors}
    assert again and again <= part
    assert mixed != whole and mixed != everything
    # every tensor still served once
    served = sorted((ref, rs) for d in mixed for ref, rs in zip(d.tensors, d.readers))
    assert served == sorted((ref, rs) for d in whole for ref, rs in zip(d.tensors, d.readers))
    # a split level for the rest adds re-runs of its own
    both, _ = plan_recomputes(analysis, ops, split_levels=3, per_reader=part)
    assert {ref.op for d in both if d.copy for ref in d.tensors} > again
    rewritten = apply_swaps(mha, SwapPlan(LMSConfig(), "/device:CPU:0", (), (), recomputes=mixed)).graph
    rewritten.lint()
    assert nx.is_directed_acyclic_graph(rewritten.to_networkx())
    # decisions kept with the analysis under their own key: a fresh analysis decides the same
    assert plan_recomputes(analysis, ops)[0] == plan_recomputes(analyze_graph(mha), ops)[0]
    assert plan_recomputes(analyze_graph(mha), ops, per_reader=part)[0] == mixed


def test_a_step_with_ops_re_run_per_reader_trains_bitwise_and_the_copies_run():
    plain, _, _ = _train("mha_block", "plain")
    control, _, _ = _train("mha_block", "plain")
    assert_bitwise_equal(plain, control, "plain TensorFlow twice (the control)")
    mine, plan, ran = _train("mha_block", None, per_reader=True)
    assert any(d.copy for d in plan.recomputes)
    assert_bitwise_equal(plain, mine, "mha_block with ops re-run per reader")
    inserted = [name for d in plan.recomputes for name in d.inserted]
    names = {n.name for n in ran.step_graph(inserted).post_optimization_graph.node}
    assert {c for d in plan.recomputes if d.copy for c in d.clones} <= names
