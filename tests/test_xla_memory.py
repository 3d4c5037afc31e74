"""Executor memory of a step whose ops run as XLA clusters (issue 47, item 5).

What reads an XLA cluster's memory on the CPU machines (docs/design.md, "Keeping XLA: clusters between swap
points", "Measuring a clustered step"): the allocation records of a ``FULL_TRACE`` step miss XLA's buffers (an
``_XlaRun`` hands XLA the device allocator itself); the allocator's own events under TensorFlow's profiler
(``ExecutorRequest(allocator_trace=True)``) see them, and give the records' peak where no cluster runs. Clusters run
on the emulated accelerator only when it is CPU:0 (``accelerator_cpu=0``). The last test holds the zoo CNN's
clustered step, planned for the emulated machine (``planning_for_emulation``: the max-pool and filter gradients, which
XLA:CPU lowers into buffers XLA:GPU does not have, run outside the clusters), within issue 47's 10% of its simulation;
the target on the rewrites (within the budget in every run) is the benchmark's, ``tools/validate_xla_memory.py``
(it holds on a quiet machine, not beside other work: docs/design.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from tflms.measure import ExecutorRequest, MeasurementError, measure_executor_peaks

pytestmark = pytest.mark.slow

tf = pytest.importorskip("tensorflow")

MiB = 2**20
N = 1024  # 4 MiB float32 matrices
TOLERANCE = MiB // 2


def _two_clusters(accelerator: str, host: str) -> tf.compat.v1.GraphDef:
    """Cluster A: ``a = x @ x``, ``c = tanh(a) @ tanh(a) + 1`` (outputs ``a`` and ``c``, ``tanh(a)`` an XLA temporary);
    ``c`` is swapped out (DeepCopy on ``host``) and in; cluster B: ``sum(exp(c_in @ c_in) * a)``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [N, N], name="x")
        with tf.device(accelerator):
            with tf.xla.experimental.jit_scope():
                a = tf.matmul(x, x, name="a")
                t = tf.tanh(a, name="t")
                c = tf.add(tf.matmul(t, t), 1.0, name="c")
            with tf.device(host):
                out = tf.raw_ops.DeepCopy(x=c, name="swap_out")
            back = tf.raw_ops.DeepCopy(x=out, name="swap_in")
            with tf.xla.experimental.jit_scope():
                tf.reduce_sum(tf.exp(tf.matmul(back, back)) * a, name="loss")
    return graph.as_graph_def()


def _constant_cluster(accelerator: str) -> tf.compat.v1.GraphDef:
    """A cluster with no input: the product of two constants, read outside it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8], name="x")
        with tf.device(accelerator):
            with tf.xla.experimental.jit_scope():
                p = tf.raw_ops.Prod(input=tf.constant([2, 3]), axis=tf.constant([0]))
            tf.multiply(x, tf.cast(p, tf.float32), name="y")
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def clustered():
    x = (np.random.default_rng(0).standard_normal((N, N)) * 0.01).astype(np.float32)
    graph = _two_clusters("/device:CPU:0", "/device:CPU:1")
    return measure_executor_peaks([ExecutorRequest(graph, feeds={"x": x}, fetches=["loss:0"], allocator_trace=True,
                                                   accelerator_cpu=0)])[0]


def test_xla_buffers_leave_no_allocation_record_but_allocator_events(clustered):
    """Cluster A allocates its two outputs and its temporary (12 MiB) inside ``_XlaRun``: the records see only the
    copies (the swap-in, 4 MiB), the allocator's events see all of it."""
    runs = [n for n in clustered.node_times if n.endswith("xla_run")]
    assert len(runs) == 2, sorted(clustered.node_times)
    recorded = {node for _, b, node in clustered.devices["accelerator"].records if b > 0}
    assert not any(node.endswith("xla_run") for node in recorded), recorded
    assert clustered.peak("accelerator") <= 4 * MiB + TOLERANCE
    events = {node for _, b, node in clustered.allocator_devices["accelerator"].records if b > 0}
    assert any(node.endswith("xla_run") for node in events), events
    assert clustered.allocator_peak("accelerator") >= 12 * MiB - TOLERANCE
    assert clustered.allocator_peak("host") == pytest.approx(4 * MiB, abs=TOLERANCE)  # the swapped c


def test_allocator_events_give_the_records_peak_without_xla():
    """Where no cluster runs, both readings agree (the swapped chain: requested bytes)."""
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:CPU:1"):
        x = tf.compat.v1.placeholder(tf.float32, [N, N], name="x")
        m1 = tf.matmul(x, x, name="m1")
        m2 = tf.matmul(m1, m1, name="m2")
        with tf.device("/device:CPU:0"):
            out = tf.raw_ops.DeepCopy(x=m1, name="swap_out")
        m3 = tf.matmul(m2, m2, name="m3")
        back = tf.raw_ops.DeepCopy(x=out, name="swap_in")
        tf.reduce_sum(tf.matmul(m3, back), name="loss")
    x = (np.random.default_rng(0).standard_normal((N, N)) * 0.01).astype(np.float32)
    runs = measure_executor_peaks([ExecutorRequest(graph.as_graph_def(), feeds={"x": x}, fetches=["loss:0"],
                                                   allocator_trace=True)] * 2)
    for m in runs:
        assert m.allocator_peak("accelerator") == pytest.approx(m.peak("accelerator"), abs=64 * 1024)
        assert m.allocator_peak("host") == pytest.approx(m.peak("host"), abs=64 * 1024)


def test_a_cluster_runs_on_the_emulated_accelerator_only_as_cpu0():
    """TensorFlow 2.21: a cluster on CPU:1 with no input (or a computed compile-time constant) fails with "Multiple
    CPU devices"; the same cluster on CPU:0 runs. So clustered steps are measured with ``accelerator_cpu=0``."""
    feeds = {"x": np.ones(8, np.float32)}
    with pytest.raises(MeasurementError, match="Multiple CPU devices"):
        measure_executor_peaks([ExecutorRequest(_constant_cluster("/device:CPU:1"), feeds=feeds, fetches=["y:0"])])
    m = measure_executor_peaks([ExecutorRequest(_constant_cluster("/device:CPU:0"), feeds=feeds, fetches=["y:0"],
                                                accelerator_cpu=0)])[0]
    np.testing.assert_array_equal(m.fetch_values["y:0"], np.full(8, 6, np.float32))


def _tool():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import validate_xla_memory as tool
    return tool


def test_the_clustered_step_is_measured_as_simulated():
    """The zoo CNN (batch 32) clustered as the pass clusters it, planned for the emulated machine (its max-pool and
    filter gradients outside XLA:CPU, the weights' reads outside the clusters): the executor's peak, XLA's buffers
    included, is within issue 47's 10% of the xla-clusters clock's (15.76 MiB against 15.51 when written; 29.2 with
    XLA:CPU's own lowerings inside, ``validate_xla_memory.py --all-in-xla``; docs/design.md)."""
    tool = _tool()
    (original,) = tool.run_model("cnn", fractions=(), repeat=2, at_peak=True)
    assert original.variant == "original" and original.xla_runs >= 2
    for measured in original.measured_runs:
        assert abs(original.sim_transient_bytes / measured - 1) <= tool.TARGET_RELATIVE_ERROR, original
    # --at-peak: the largest run's live allocations at its peak, an XLA cluster's results the largest of them
    at = original.at_peak
    assert at["measured"][0][0].endswith("/xla_run") and at["simulated"], at
    assert 0 < sum(size for _, size in at["measured"]) <= max(original.measured_runs)
    assert "(measured, by allocating node)" in tool.at_peak_table([original])


def _wide(keras, batch):
    """Three Dense(1024) layers on 256 features, SGD with momentum: 9 MiB of weights against 0.1 MiB activations at
    batch 32, so the variables' update is the step's peak."""
    inputs = keras.Input((256,))
    h = inputs
    for k in range(3):
        h = keras.layers.Dense(1024, activation="relu", name=f"dense_{k}")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    return (keras.Model(inputs, outputs, name="wide"), keras.optimizers.SGD(0.05, momentum=0.9), (batch, 256),
            (batch,), 10)


def test_the_updates_in_parts_run_as_their_own_clusters_and_train_bit_for_bit_alike(monkeypatch):
    """A cluster updates no variable in place, so the one that updates every momentum holds every gradient and every
    new momentum; in parts (each a cluster, joined by a NoOp and chained) each part holds only its own new values.
    Checked here: TensorFlow runs the parts as clusters of their own, and the step trains the same weights and
    momenta as with one cluster, bit for bit. What the parts save is the benchmark's to show
    (``tools/validate_xla_memory.py --update-parts``): on this model the parted step measured 14.1-14.7 MiB in 6 of 8
    runs and 19.0 in 2, the one cluster 18.1-19.0 (docs/design.md, "Update parts")."""
    tool = _tool()
    monkeypatch.setitem(tool.vm._BUILDERS, "wide", (_wide, 32))
    one, parts = tool.run_model("wide", fractions=(), repeat=1, update_parts=16)
    assert (one.variant, parts.variant) == ("original", "original, 16 parts")
    assert parts.xla_runs > one.xla_runs
    assert parts.variables_digest == one.variables_digest  # the same weights and momenta, bit for bit
    assert one.variables_digest != tool._digest({})  # (the runs read variables back)
