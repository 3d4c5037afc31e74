"""Recomputation inside XLA clusters (issue 47): recompute gates become ``XlaOptimizationBarrier`` s, in what
TensorFlow and XLA ran.

Every forward op the backward pass reads is recomputed on the zoo models, and the step keeps XLA
(tflms/passes/xla_clusters.py, "Recompute gates"). Checked:

- the step runs as few clusters as it would without any recompute, where ``Identity`` gates left out split it;
- it trains bit for bit like the plain ``jit_compile=True`` step (the clones re-run the same kernels); with the
  ``Identity`` gates left out, their boundaries may change XLA's rounding (they did, while clones were ordered last);
- keras.applications ResNet50 in mixed_bfloat16, whose barriers mostly read past Keras's fused float32 casts of the
  incoming gradients, trains bit for bit like plain XLA too;
- in XLA's optimized HLO (``--xla_dump_to``, a fresh process each) the clones are still there, and a control
  without the barriers (the gates left as ``Identity`` s inside the cluster) shows that XLA's CSE merges them away.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from tflms.config import LMSConfig

CPU = "/device:CPU:0"
STEPS = 3


def _data(model, steps: int = STEPS):
    from tflms.testing.models import make_batches
    return [tuple(tf.constant(t) for t in batch) for batch in make_batches(model, batch_size=8, steps=steps)]


def recompute_everything(step, example, *, barriers: bool = True, keep_barrier_gates: bool = True):
    """``step`` rewritten as the pipeline builds a step that keeps XLA, with every recompute candidate taken:
    ``(function, the pass's report)``. ``barriers=False``: XLA is told it has no barrier (the gates stay out);
    ``keep_barrier_gates=False``: the gates join the clusters but stay ``Identity`` s (the CSE control)."""
    from tflms._compat import grappler as compat
    from tflms.analysis.cto import analyze_graph
    from tflms.ir import tf_io
    from tflms.passes import xla_clusters
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import plan_recomputes, rank_candidates
    from tflms.policies.swapplan import SwapPlan
    from tflms.sim.cost import op_time_s
    from tflms.testing import serial_clock

    traced = tf.function(step).get_concrete_function(*example)
    graph = tf_io.load_graph(traced)  # the traced step, as LOAD reads a step that keeps XLA
    analysis = analyze_graph(graph)
    profile = serial_clock("v100-16gb-pcie3")
    ranked, _ = rank_candidates(analysis, lambda n: op_time_s(graph, graph.op(n), profile))
    decisions, _ = plan_recomputes(analysis, {op for c in ranked for op in c.chain})
    assert decisions, "the step must have recompute candidates"
    rewritten = apply_swaps(graph, SwapPlan(LMSConfig(), CPU, (), (), recomputes=decisions)).graph
    kernels = xla_clusters.registered_xla_kernels("XLA_CPU_JIT")
    has = kernels if barriers else (lambda t: t != xla_clusters.BARRIER and kernels(t))
    to_barrier = xla_clusters._to_barrier
    if not keep_barrier_gates:
        xla_clusters._to_barrier = lambda graph, name, on_host, read: None
    try:
        result = xla_clusters.cluster_for_xla(rewritten, accelerator_device=CPU, host_device=CPU, has_xla_kernel=has)
    finally:
        xla_clusters._to_barrier = to_barrier
    function = tf_io.to_concrete_function(result.graph, traced, keep_must_compile=False)
    return compat.mark_grappler_done(function), result.report


def _train(model_name: str, wrap):
    import keras

    from tflms.testing import make_train_step, record_run_metadata, snapshot
    from tflms.testing.models import build_model
    model = build_model(model_name)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    data = _data(model)
    fn, report = wrap(make_train_step(model, optimizer), data[0])
    with record_run_metadata() as ran:
        losses = [fn(x, y) for x, y in data]
    return snapshot(model, optimizer, losses=losses), report, ran


def _xla_runs(ran) -> int:
    """How many clusters the step ran (``_XlaRun`` ops in its graph as TensorFlow ran it)."""
    return sum(1 for n in ran.step_graph().post_optimization_graph.node if n.op == "_XlaRun")


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_recomputed_step_keeps_its_clusters_and_trains_bitwise_like_plain_xla(model_name):
    from tflms.testing import assert_bitwise_equal, largest_relative_difference
    plain, _, plain_ran = _train(model_name, lambda step, ex: (tf.function(step, jit_compile=True), None))
    again, _, _ = _train(model_name, lambda step, ex: (tf.function(step, jit_compile=True), None))
    assert_bitwise_equal(plain, again, "plain XLA vs plain XLA (the control)")
    barriers, report, ran = _train(model_name, recompute_everything)
    gated, gated_report, gated_ran = _train(model_name, lambda s, ex: recompute_everything(s, ex, barriers=False))
    assert report.num_clusters < gated_report.num_clusters, (report.to_dict(), gated_report.to_dict())
    assert not report.boundaries and len(gated_report.boundaries) > 2
    # TensorFlow ran the clusters the pass predicted, the optimizer's resource split included
    ran_clusters, gated_clusters = _xla_runs(ran), _xla_runs(gated_ran)
    assert (ran_clusters, gated_clusters) == (report.num_clusters, gated_report.num_clusters), (
        report.to_dict(), gated_report.to_dict())
    assert_bitwise_equal(plain, barriers, f"{model_name}: every recompute, barrier gates, vs plain jit_compile=True")
    # the Identity gates' boundaries may change how XLA fuses and rounds (up to 1.44e-4 relative on the MLP while the
    # segment rule ordered clones last: 16 and 17 clusters), never by more than rounding
    worst = largest_relative_difference(plain, gated)
    assert worst < 1e-3, f"{model_name}: the step with Identity gates left out trained {worst:.2e} away from plain XLA"
    print(f"{model_name}: {report.num_clusters} cluster(s) with barrier gates, {gated_report.num_clusters} with the "
          f"gates left out (ran {ran_clusters} and {gated_clusters}); Identity gates' largest relative difference to "
          f"plain XLA {worst:.2e}")


_HLO_SCRIPT = textwrap.dedent('''
    import json, sys
    import keras, tensorflow as tf
    sys.path.insert(0, {tests!r})
    from test_xla_recompute import _train, recompute_everything
    keep = {keep!r}
    _, report, _ = _train({model!r}, lambda s, ex: recompute_everything(s, ex, keep_barrier_gates=keep))
    print(json.dumps(report.to_dict()))
''')


def _optimized_clone_ops(tmp_path, model: str, keep: bool) -> tuple[collections.Counter, dict]:
    """The clone op names in XLA's optimized HLO of the recomputed step, from a fresh process (XLA reads its flags
    once), and the pass's report."""
    dump = tmp_path / f"dump_{keep}"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text", TF_CPP_MIN_LOG_LEVEL="2")
    script = _HLO_SCRIPT.format(tests=os.path.dirname(__file__), keep=keep, model=model)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    names: collections.Counter = collections.Counter()
    for path in dump.glob("*after_optimizations.txt"):
        for name in re.findall(r'op_name="(lms/recompute_[^"]*)"', path.read_text()):
            if "recompute_gate_" not in name:
                names[name] += 1
    return names, report


@pytest.mark.slow
def test_xla_keeps_the_clones_behind_barriers_and_merges_them_without(tmp_path):
    """The zoo MLP, recomputed, runs in the same clusters either way (its forward and backward passes in one). With
    barrier gates XLA's optimized HLO still computes the clones; with the gates left ``Identity`` s in the cluster, its
    CSE merges every clone with its original."""
    kept, report = _optimized_clone_ops(tmp_path, "mlp", keep=True)
    merged, control = _optimized_clone_ops(tmp_path, "mlp", keep=False)
    assert report["clusters"] == control["clusters"]
    assert report["cluster_ops"] == control["cluster_ops"]
    assert len(kept) >= 2, kept
    assert not merged, f"without barriers XLA was expected to merge the clones away: {merged}"


def train_application(build, batch: int, wrap):
    """``STEPS`` steps of the keras.applications model ``build()`` makes (32x32 inputs, 10 classes, SGD with momentum,
    seed 0, stateless data of ``batch``), its train step wrapped by ``wrap(step, first inputs)``, which returns the
    function to run and a report: ``(snapshot, report)``."""
    import keras

    from tflms.testing import make_train_step, snapshot
    keras.utils.set_random_seed(0)
    model = build()
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    data = [(tf.random.stateless_uniform((batch, 32, 32, 3), (s, 1)),
             tf.random.stateless_uniform((batch,), (s, 2), maxval=10, dtype=tf.int32)) for s in range(STEPS)]
    fn, report = wrap(make_train_step(model, optimizer), data[0])
    losses = [fn(x, y) for x, y in data]
    return snapshot(model, optimizer, losses=losses), report


@pytest.mark.slow
@pytest.mark.real_model
def test_a_keras_applications_model_recomputed_inside_its_clusters_trains_bitwise_like_plain_xla():
    """keras.applications MobileNetV2 (32x32, alpha 0.35, batch 4), every recompute candidate taken, its gates barriers
    inside the clusters: three steps equal the plain ``jit_compile=True`` steps byte for byte (against a plain-vs-plain
    control), and no gate splits a cluster."""
    import keras

    from tflms.testing import assert_bitwise_equal

    def train(wrap):
        return train_application(lambda: keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None,
                                                                        classes=10, alpha=0.35), 4, wrap)

    plain, _ = train(lambda step, ex: (tf.function(step, jit_compile=True), None))
    again, _ = train(lambda step, ex: (tf.function(step, jit_compile=True), None))
    assert_bitwise_equal(plain, again, "plain XLA vs plain XLA (the control)")
    recomputed, report = train(recompute_everything)
    assert report.num_clusters >= 1 and not report.boundaries
    assert_bitwise_equal(plain, recomputed, "MobileNetV2, every recompute, barrier gates, vs plain jit_compile=True")


@pytest.mark.slow
@pytest.mark.real_model
def test_resnet50_in_mixed_bfloat16_its_barriers_read_past_fused_casts_and_it_trains_bitwise_like_plain_xla(
        monkeypatch):
    """keras.applications ResNet50 (32x32, batch 2) under mixed_bfloat16, every recompute candidate taken: Keras's
    batch norm casts each incoming bf16 gradient to float32, a trigger XLA fuses away, so most barriers read the
    tensor the cast's fused chain reads instead (tflms.ir.xla_gates.barrier_read). Three steps equal the plain
    ``jit_compile=True`` steps byte for byte, against a plain-vs-plain control."""
    import keras

    from tflms.passes import xla_clusters
    from tflms.testing import assert_bitwise_equal

    moved = []
    to_barrier = xla_clusters._to_barrier

    def spy(graph, name, on_host, read):
        trigger = graph.op(name).control_inputs[0]
        to_barrier(graph, name, on_host, read)
        moved.append(graph.op(name).inputs[1].op != trigger)
    monkeypatch.setattr(xla_clusters, "_to_barrier", spy)

    def train(wrap):
        return train_application(lambda: keras.applications.ResNet50(input_shape=(32, 32, 3), weights=None,
                                                                     classes=10), 2, wrap)

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        plain, _ = train(lambda step, ex: (tf.function(step, jit_compile=True), None))
        again, _ = train(lambda step, ex: (tf.function(step, jit_compile=True), None))
        recomputed, report = train(recompute_everything)
    finally:
        keras.config.set_dtype_policy(policy)
    assert_bitwise_equal(plain, again, "plain XLA vs plain XLA (the control)")
    print(f"ResNet50 mixed_bfloat16: {sum(moved)} of {len(moved)} barriers read past their trigger")
    assert moved and sum(moved) > len(moved) // 2, (sum(moved), len(moved))
    assert not report.boundaries
    assert_bitwise_equal(plain, recomputed, "ResNet50 mixed_bfloat16, every recompute, barriers, vs plain XLA")
