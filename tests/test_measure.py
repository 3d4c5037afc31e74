"""Tests of tflms.measure: the executor measurement (real TF executor in a subprocess,
accelerator = logical CPU:1) and grappler's virtual-cluster estimate.

The ground-truth graph is a chain of 6 MatMuls on 1024x1024 float32 (4 MiB per
tensor)::

    x -> m1 -> m2 -> m3 -> m4 -> m5 -> r = reduce_sum(m5, axis 0) -> m6 = matmul(r, m1)

``m1`` is consumed early (by m2) and again at the end (by m6). The real executor
frees an op's inputs right after it runs, so without swapping three 4 MiB tensors
are live at once (m1, m_{k-1}, m_k: 12 MiB); swapping m1 out after m2 and back in
after m5 leaves two (8 MiB). The weight ``w`` is a Const (persistent, not in the
step's records).
"""

from __future__ import annotations

import numpy as np
import pytest

from tflms.errors import ConfigError, GraphError
from tflms.measure import (ExecutorRequest, GrapplerEstimateError, MeasurementError, grappler_estimate,
                           grappler_peak, measure_executor_peak, measure_executor_peaks)
from tflms.measure.executor import device_memory_from_records
from tflms.testing import assert_bitwise_equal, make_train_step

#: Runs TensorFlow's executor on emulated devices: the slow tier (pytest -m slow).
pytestmark = pytest.mark.slow

tf = pytest.importorskip("tensorflow")

MiB = 2**20
TENSOR = 4 * MiB  # one 1024x1024 float32 tensor
REDUCTION_INDICES = 4  # the int32 Const of reduce_sum
TOLERANCE = MiB // 2  # allowed deviation of a measured peak from the worked-out one


def chain_graph(*, swap: bool, copy_op: str = "DeepCopy", accelerator: str = "/device:CPU:1",
                host: str = "/device:CPU:0", swap_in_device: str | None = None) -> tf.compat.v1.GraphDef:
    """The 6-MatMul chain; with ``swap``, m1 goes through swap_out (on ``host``) and swap_in.

    swap_in (default on ``accelerator``) is control-dependent on m5, the last op before
    m1's reuse; m3 is control-dependent on swap_out so that m1 is provably dead before
    m3 allocates (the measured peak then does not depend on thread timing).
    """
    def copy(tensor, name):
        return tf.raw_ops.DeepCopy(x=tensor, name=name) if copy_op == "DeepCopy" else tf.identity(tensor, name=name)

    graph = tf.Graph()
    with graph.as_default(), tf.device(accelerator):
        x = tf.compat.v1.placeholder(tf.float32, [1024, 1024], name="x")
        w = tf.constant(np.eye(1024, dtype=np.float32) * 0.5, name="w")
        m1 = tf.matmul(x, w, name="m1")
        m2 = tf.matmul(m1, w, name="m2")
        reuse = m1
        dependencies = []
        if swap:
            with tf.device(host):
                swap_out = copy(m1, "swap_out")
            dependencies = [swap_out.op]
        with tf.control_dependencies(dependencies):
            m3 = tf.matmul(m2, w, name="m3")
        m4 = tf.matmul(m3, w, name="m4")
        m5 = tf.matmul(m4, w, name="m5")
        if swap:
            with tf.device(swap_in_device or accelerator), tf.control_dependencies([m5.op]):
                reuse = copy(swap_out, "swap_in")
        r = tf.reduce_sum(m5, axis=0, keepdims=True, name="r")
        tf.matmul(r, reuse, name="m6")
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def chain_input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)


@pytest.fixture(scope="module")
def mlp_step():
    """A Keras MLP + SGD training step traced by tf.function (batch 64), and its GraphDef."""
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu", name="dense"),
                              keras.layers.Dense(10, name="dense_1")])
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))

    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    concrete = step.get_concrete_function(tf.TensorSpec((64, 32), tf.float32), tf.TensorSpec((64,), tf.int32))
    variables_by_handle = {id(v.value.handle): v for v in model.variables + optimizer.variables}
    # captures: (eager handle, resource placeholder); the placeholders are the last graph inputs.
    variable_of = {internal.op.name: variables_by_handle[id(external)]
                   for external, internal in concrete.graph.captures}
    assert len(variable_of) == 6, sorted(variable_of)  # 2 kernels, 2 biases, learning rate, iterations
    initial = {name: variable.numpy() for name, variable in variable_of.items()}
    return {
        "step": step, "x": x, "y": y, "graph_def": concrete.graph.as_graph_def(), "variable_of": variable_of,
        "initial": initial, "loss": concrete.graph.outputs[0].name,
        "targets": [op.name for op in concrete.graph.control_outputs],
    }


@pytest.fixture(scope="module")
def measured(chain_input, mlp_step):
    """All successful executor measurements, in one subprocess (TF start-up costs seconds)."""
    no_swap, swap, mlp = measure_executor_peaks([
        ExecutorRequest(chain_graph(swap=False), feeds={"x": chain_input}, fetches=["m6:0"]),
        ExecutorRequest(chain_graph(swap=True), feeds={"x": chain_input}, fetches=["m6:0"]),
        ExecutorRequest(mlp_step["graph_def"], feeds={"x": mlp_step["x"], "y": mlp_step["y"]},
                        variables=mlp_step["initial"], fetches=[mlp_step["loss"]], targets=mlp_step["targets"],
                        warmup_runs=1),
    ])
    return {"no_swap": no_swap, "swap": swap, "mlp": mlp}


# ------------------------------------------------------------------------------------------- executor


def test_chain_without_swap_peaks_at_three_live_tensors(measured):
    m = measured["no_swap"]
    accelerator = m.devices["accelerator"]
    assert accelerator.device.endswith("/device:CPU:1")
    assert accelerator.allocators, "no allocator recorded any allocation on the accelerator"
    assert abs(m.peak() - 3 * TENSOR) <= TOLERANCE, f"accelerator peak {m.peak()} B, expected ~12 MiB"
    assert m.peak("host") == 0
    # w (4 MiB) and the reduction indices are Consts: persistent, outside the step's records.
    assert accelerator.persistent_bytes == TENSOR + REDUCTION_INDICES
    assert m.peak(include_persistent=True) == m.peak() + TENSOR + REDUCTION_INDICES
    assert "w" not in {node for _, _, node in accelerator.records}


def test_chain_swap_lowers_accelerator_peak_and_raises_host_peak(measured):
    no_swap, swap = measured["no_swap"], measured["swap"]
    assert abs(swap.peak() - 2 * TENSOR) <= TOLERANCE, f"accelerator peak with swap {swap.peak()} B, expected ~8 MiB"
    assert swap.peak() <= no_swap.peak() - TENSOR + TOLERANCE
    assert abs(swap.peak("host") - TENSOR) <= TOLERANCE, f"host peak {swap.peak('host')} B, expected ~4 MiB"
    assert swap.devices["host"].device.endswith("/device:CPU:0")
    host_nodes = {node for _, _, node in swap.devices["host"].records}
    assert host_nodes == {"swap_out"}
    # Swapping moves bytes, it does not change results.
    np.testing.assert_array_equal(swap.fetch_values["m6:0"], no_swap.fetch_values["m6:0"])


def test_chain_timeline_follows_records_and_control_dependencies(measured):
    accelerator = measured["swap"].devices["accelerator"]
    live = 0
    for (micros, delta, _), (timeline_micros, timeline_live) in zip(accelerator.records, accelerator.timeline):
        live += delta
        assert (micros, live) == (timeline_micros, timeline_live)
    assert [t for t, _ in accelerator.timeline] == sorted(t for t, _ in accelerator.timeline)
    assert accelerator.peak_bytes == max(live for _, live in accelerator.timeline)
    # Only the fetched m6 (1x1024 float32) outlives the step: it is handed to the client.
    assert accelerator.end_bytes == 1024 * 4
    first_alloc = {}
    for micros, delta, node in accelerator.records:
        if delta > 0:
            first_alloc.setdefault(node, micros)
    assert first_alloc["swap_in"] >= first_alloc["m5"], "swap_in ran before its control input m5"


def test_training_step_graph_matches_eager_step_bitwise(measured, mlp_step):
    m = measured["mlp"]
    for name, value in mlp_step["initial"].items():
        mlp_step["variable_of"][name].assign(value)
    eager_loss = mlp_step["step"](mlp_step["x"], mlp_step["y"]).numpy()
    assert set(m.variables_after) == set(mlp_step["initial"])
    names = sorted(mlp_step["variable_of"])
    assert_bitwise_equal([(n, mlp_step["variable_of"][n].numpy()) for n in names],
                         [(n, m.variables_after[n]) for n in names], "executor's graph step vs the eager step")
    changed = sum(not np.array_equal(m.variables_after[n], mlp_step["initial"][n]) for n in names)
    assert changed == 5, "expected kernels, biases and the iteration counter to change (not the learning rate)"
    # One step, although a warm-up ran: variables are reset before the traced step.
    assert 1 in {int(v) for v in m.variables_after.values() if v.dtype == np.int64}
    assert_bitwise_equal([("loss", eager_loss)], [("loss", m.fetch_values[mlp_step["loss"]])], "loss")


def test_training_step_memory_accounting(measured, mlp_step):
    m = measured["mlp"]
    activation = 64 * 64 * 4  # the hidden layer's output, the largest step tensor
    assert activation <= m.peak() < 10 * activation
    assert m.peak("host") == 0
    variable_bytes = sum(value.nbytes for value in mlp_step["initial"].values())
    assert variable_bytes <= m.devices["accelerator"].persistent_bytes < variable_bytes + 1024
    assert m.peak(include_persistent=True) == m.peak() + m.devices["accelerator"].persistent_bytes


def test_tf_failure_names_the_node():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        tf.debugging.check_numerics(x * 2.0, "boom", name="check")
    with pytest.raises(MeasurementError, match=r"(?s)at node 'check'.*boom"):
        measure_executor_peak(graph.as_graph_def(), feeds={"x": np.array([1, np.nan, 2, 3], np.float32)},
                              fetches=["check:0"], warmup_runs=0)


def _resource_graph():
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.compat.v1.placeholder(tf.resource, [], name="v")
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        tf.add(tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32), x, name="y")
    return graph.as_graph_def()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(feeds={"nope": np.zeros(2, np.float32)}, variables={"v": np.zeros(2, np.float32)}, fetches=["y:0"]),
     GraphError, r"feed 'nope' names no node"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, fetches=["y:0"]),
     GraphError, r"resource placeholder 'v' has no initial value"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, variables={"x": np.zeros(2, np.float32)}, fetches=["y:0"]),
     GraphError, r"variable 'x' must name a Placeholder of dtype resource"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, variables={"v": [0.0, 0.0]}, fetches=["y:0"]),
     GraphError, r"initial value of variable 'v' must be a numpy array"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, variables={"v": np.zeros(2, np.float32)}, targets=["y:0"]),
     GraphError, r"target 'y:0' must be an op name"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, variables={"v": np.zeros(2, np.float32)}),
     ConfigError, r"nothing to run"),
    (dict(feeds={"x": np.zeros(2, np.float32)}, variables={"v": np.zeros(2, np.float32)}, fetches=["y:0"],
          warmup_runs=-1), ConfigError, r"warmup_runs must be an int >= 0"),
])
def test_bad_requests_fail_before_starting_tensorflow(kwargs, error, message):
    with pytest.raises(error, match=message):
        measure_executor_peak(_resource_graph(), **kwargs)


def test_unknown_device_is_rejected_with_node_name():
    graph_def = chain_graph(swap=False, accelerator="/device:GPU:0")
    with pytest.raises(GraphError, match=r"node 'x' has device '/device:GPU:0'"):
        measure_executor_peak(graph_def, feeds={"x": np.zeros((1024, 1024), np.float32)}, fetches=["m6:0"])


def test_device_memory_from_records_sums_in_time_order():
    records = [(30, -100, "a"), (10, 100, "a"), (20, 50, "b"), (40, 8, "c")]
    memory = device_memory_from_records("/device:CPU:1", records, origin_micros=10, persistent_bytes=7,
                                        allocators=["cpu", "cpu"])
    assert memory.timeline == ((0, 100), (10, 150), (20, 50), (30, 58))
    assert memory.records == ((0, 100, "a"), (10, 50, "b"), (20, -100, "a"), (30, 8, "c"))
    assert (memory.peak_bytes, memory.end_bytes, memory.persistent_bytes) == (150, 58, 7)
    assert memory.allocators == ("cpu",)
    empty = device_memory_from_records("/device:CPU:0", [])
    assert (empty.peak_bytes, empty.end_bytes, empty.timeline) == (0, 0, ())


def test_live_at_peak_lists_the_allocations_open_at_the_peak_by_node():
    """What ``validate_xla_memory.py --at-peak`` prints: at the first time the device reaches its peak, each node's
    allocations not yet freed (a free is matched to its own node's allocation of that size, the earliest first), and
    a free of a buffer allocated before the step under its own heading."""
    records = [(0, 100, "a"), (1, 100, "a"), (2, 40, "b"), (3, -100, "a"), (4, 300, "c"), (5, -7, "d"),
               (6, -300, "c"), (7, 300, "c")]
    memory = device_memory_from_records("/device:CPU:0", records)
    assert memory.peak_bytes == 440
    micros, live = memory.live_at_peak()
    assert micros == 4  # the first time it reaches 440 (the second, at 7, is 433: d's free came between)
    assert live == [("c", 300), ("a", 100), ("b", 40)]
    micros, live = device_memory_from_records("/device:CPU:0", records[:6] + [(6, 10, "e")]).live_at_peak()
    assert (micros, live) == (6, [("c", 300), ("a", 100), ("b", 40), ("e", 10), ("(before the step)", -7)])
    freed_first = device_memory_from_records("/device:CPU:0", [(0, -5, "w"), (1, 20, "x")]).live_at_peak()
    assert freed_first == (1, [("x", 20), ("(before the step)", -5)])
    assert device_memory_from_records("/device:CPU:0", []).live_at_peak() == (0, [])


def test_the_measuring_subprocess_compiles_every_xla_cluster_when_it_first_runs():
    """Lazy compilation (TensorFlow's default) keeps each cluster's TensorFlow ops beside its ``_XlaRun`` and may run
    them instead: the zoo CNN's pinned 0.8 rewrite peaked 3.9 MiB higher in alternate runs. The subprocess turns it
    off after whatever ``TF_XLA_FLAGS`` the caller set, and keeps oneDNN's kernels and the BFC allocator's trace."""
    from tflms.measure.emulation import ALLOCATOR_TRACE_ENV, EMULATION_ENV, EMULATION_XLA_FLAGS
    from tflms.measure.executor import subprocess_env
    assert EMULATION_XLA_FLAGS == "--tf_xla_enable_lazy_compilation=false"
    env = subprocess_env({"PATH": "/bin"})
    assert env["TF_XLA_FLAGS"] == EMULATION_XLA_FLAGS and env["PATH"] == "/bin"
    assert all(env[k] == v for k, v in EMULATION_ENV.items()) and "TF_CPU_ALLOCATOR_USE_BFC" not in env
    given = subprocess_env({"TF_XLA_FLAGS": "--tf_xla_min_cluster_size=4"}, allocator_trace=True)
    assert given["TF_XLA_FLAGS"] == "--tf_xla_min_cluster_size=4 " + EMULATION_XLA_FLAGS
    assert all(given[k] == v for k, v in ALLOCATOR_TRACE_ENV.items())


# ------------------------------------------------------------------------------------------- grappler
# grappler's virtual scheduler allocates an output when its producer starts and frees it
# one tick after its last consumer ends, and counts Consts and Identity outputs: at each
# op boundary of the chain three chain tensors + w are live (16 MiB), plus m1 without swap.

GPU = "/device:GPU:0"


def test_grappler_sees_host_side_swap():
    no_swap = grappler_peak(chain_graph(swap=False, accelerator=GPU), fetches=["m6"])
    swap = grappler_peak(chain_graph(swap=True, copy_op="Identity", accelerator=GPU, swap_in_device="/device:CPU:0"),
                         fetches=["m6"])
    assert no_swap == {"accelerator": 5 * TENSOR + REDUCTION_INDICES, "host": 0}
    assert swap["accelerator"] == 4 * TENSOR + REDUCTION_INDICES < no_swap["accelerator"]
    assert swap["host"] == 2 * TENSOR  # the _Recv of m1 and the swap_out Identity both count


def test_grappler_gpu_side_swap_in_does_not_delay_the_copy_back():
    """A swap-in placed on the GPU waits for its control input, but the _Recv feeding it
    runs as soon as swap_out has: m1 is back on the GPU right away, so the peak does not drop."""
    estimate = grappler_estimate(chain_graph(swap=True, copy_op="Identity", accelerator=GPU), fetches=["m6"],
                                 measure_time=True)
    assert estimate.peaks == {"accelerator": 5 * TENSOR + REDUCTION_INDICES, "host": 2 * TENSOR}
    early_recvs = [entry for entry in estimate.live_at_peak["accelerator"] if entry[0].startswith("Recv_swap_out")]
    assert [size for _, _, size in early_recvs] == [TENSOR]
    assert estimate.run_time_s is not None and estimate.run_time_s > 0


def test_grappler_reads_executor_style_graphs():
    """The same graph can be estimated by grappler and measured by the executor."""
    executor_style = grappler_peak(chain_graph(swap=False), fetches=["m6"], accelerator="/device:CPU:1")
    assert executor_style == grappler_peak(chain_graph(swap=False, accelerator=GPU), fetches=["m6"])


def test_grappler_refuses_graph_larger_than_accelerator_memory():
    with pytest.raises(GrapplerEstimateError, match=r"requires \d+ bytes of memory on device .*GPU:0"):
        grappler_peak(chain_graph(swap=False, accelerator=GPU), fetches=["m6"], accelerator_memory_bytes="1MiB")


def test_grappler_rejects_unmapped_device():
    with pytest.raises(GraphError, match=r"node 'x' is on '/device:CPU:1'"):
        grappler_peak(chain_graph(swap=False), fetches=["m6"])


def test_grappler_training_step_needs_variable_shapes(mlp_step):
    graph_def, fetches = mlp_step["graph_def"], [mlp_step["loss"], *mlp_step["targets"]]
    with pytest.raises(GraphError, match=r"resource placeholder '.*' has no variables entry"):
        grappler_peak(graph_def, fetches=fetches)
    estimate = grappler_estimate(graph_def, fetches=fetches, variables=mlp_step["initial"])
    live = {node: size for node, _, size in estimate.live_at_peak["accelerator"]}
    kernel_read = next(name for name in live if name.endswith("dense_1/Cast/ReadVariableOp"))
    assert live[kernel_read] == 32 * 64 * 4, "the kernel read should be sized from the variable's shape"
    assert estimate.peaks["accelerator"] >= 32 * 64 * 4 and estimate.peaks["host"] == 0


def test_allocator_events_count_a_variables_old_buffer_an_xla_cluster_frees():
    """An XLA cluster updates no variable in place: it allocates the new value and, handing it to the variable, frees
    the old one, allocated before the step. That free counts (as the simulator has it); a free of a buffer from before
    the step by any other op (the client's feeds) does not, and an allocation outside every op is unattributed."""
    from tflms.measure.allocator_events import device_records

    us = 1_000_000  # picoseconds per microsecond
    ops = [(0, 10 * us, "cluster_0_1/xla_run", 1), (20 * us, 30 * us, "loss", 1)]
    memory = [
        (1 * us, "MemoryAllocation", 1, {"addr": 100, "requested_bytes": 400}),  # the new value
        (9 * us, "MemoryDeallocation", 1, {"addr": 7, "requested_bytes": 400}),  # the old one, from before the step
        (21 * us, "MemoryDeallocation", 1, {"addr": 8, "requested_bytes": 64}),  # a feed, from before the step
        (40 * us, "MemoryAllocation", 2, {"addr": 200, "requested_bytes": 32}),  # outside every op
    ]
    trace = device_records(ops, memory, {"cluster_0_1/xla_run": "accelerator", "loss": "accelerator"})
    assert trace.records["accelerator"] == [(1, 400, "cluster_0_1/xla_run"), (9, -400, "cluster_0_1/xla_run")]
    assert (trace.replaced_bytes, trace.unattributed, trace.unattributed_bytes) == (400, 1, 32)
