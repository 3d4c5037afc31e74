"""The simulator against TensorFlow's executor on the emulated accelerator (logical CPU:1).

End to end, on a small CNN with BatchNorm (2 stages of 2 x Conv2D+BN+ReLU then MaxPool, SGD
with momentum, batch 16), in one executor subprocess, each graph run ``RUNS`` times:

- ``original``: the traced step;
- ``tuned``: the tuner's rewrite for a budget of resident + ``BUDGET_FRACTION`` x the
  simulated transient peak (``copy_op="DeepCopy"``, swap-ins on CPU:1);
- ``large`` / ``small``: plain rewrites with a large and a smaller ``swapout_threshold``,
  picked so that each simulated peak is at least ``SEPARATION`` below the previous one.

The executor runs ready ops on two inter-op threads, so its peak varies from run to run
(when two readers of a buffer happen to overlap, neither can reuse it in place): runs of
the same graph differ by one activation at times, about 10% here. The simulator is
deterministic and sequential, so it is compared with the *median* run; the replay of
each run's observed op times (the memory model alone) must match every run within 1%.

A profile calibrated from the original's measured node times (``tflms.measure.calibrate``) must
time the step like the executor and keep every simulated peak within the target.

Then tiny hand-built graphs pin down each rule of the memory model that the comparison
with the executor established (see the module doc of ``tflms.sim.simulator``).
"""

from __future__ import annotations

import numpy as np
import pytest

import tflms
from tflms.errors import ConfigError
from tflms.ir.tf_io import FunctionSignature
from tflms.sim.simulator import SimOptions, order_from_start_times, simulate
from tflms.testing import GraphBuilder, Snapshot, assert_bitwise_equal, make_train_step

#: Runs TensorFlow's executor on emulated devices: the slow tier (pytest -m slow).
pytestmark = pytest.mark.slow

MiB = 2**20
RUNS = 3
#: Tuner budget: resident + this fraction of the original's simulated transient peak.
BUDGET_FRACTION = 0.6
#: The executor may exceed the tuner's budget by this fraction (run-to-run variation).
BUDGET_MARGIN = 0.10
#: Largest accepted |simulated / measured - 1| (the issue's target).
TOLERANCE = 0.10
#: The memory model alone (replaying the executor's own op times) must be this close.
REPLAY_TOLERANCE = 0.01
#: A profile calibrated from measured runs spends this close to what the measured ops were busy for (summed shares).
BUSY_TOLERANCE = 0.05
#: Configurations compared for ranking differ by at least this much in simulated peak:
#: more than the executor's run-to-run variation, so the ranking is well defined.
SEPARATION = 0.12
BATCH = 16

T = (4, 4)  # 64-byte float32 tensors in the hand-built graphs


# ------------------------------------------------------------------------------------------------ end to end

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def cnn():
    """The CNN training step (tf.function traced with get_concrete_function), its IR and one batch."""
    keras = pytest.importorskip("keras")
    from tflms.ir import tf_io

    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((32, 32, 3))
    h = inputs
    for stage, filters in enumerate((16, 32)):
        for j in range(2):
            h = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"s{stage}_conv{j}")(h)
            h = layers.ReLU(name=f"s{stage}_relu{j}")(layers.BatchNormalization(name=f"s{stage}_bn{j}")(h))
        h = layers.MaxPooling2D(name=f"s{stage}_pool")(h)
    outputs = layers.Dense(10, name="logits")(layers.GlobalAveragePooling2D(name="gap")(h))
    model = keras.Model(inputs, outputs, name="validation_cnn")
    optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    train_step = tf.function(make_train_step(model, optimizer))

    concrete = train_step.get_concrete_function(tf.TensorSpec((BATCH, 32, 32, 3), tf.float32),
                                                tf.TensorSpec((BATCH,), tf.int32))
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((BATCH, 32, 32, 3)).astype(np.float32),
            rng.integers(0, 10, BATCH).astype(np.int32))
    # model and optimizer stay referenced: the traced function holds its variables weakly.
    return {"concrete": concrete, "graph": tf_io.from_concrete_function(concrete), "args": args,
            "keep": (model, optimizer)}


def _config(**params):
    from tflms.measure import ACCELERATOR_DEVICE, HOST_DEVICE
    return tflms.LMSConfig(accelerator_device=ACCELERATOR_DEVICE, host_device=HOST_DEVICE, **params)


def _sim(graph, **kwargs):
    from tflms.measure import EMULATION_PROFILE, EMULATION_SIM_OPTIONS
    return simulate(graph, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS, **kwargs)


def _sim_options():
    from tflms.measure import EMULATION_SIM_OPTIONS
    return EMULATION_SIM_OPTIONS


def _pinned(graph):
    """``graph`` with its execution order pinned by control edges, as the pipeline's order pass pins it."""
    from tflms.measure import EMULATION_PROFILE, EMULATION_SIM_OPTIONS
    from tflms.passes.order import enforce_order
    from tflms.schedule import add_order_edges, order_edges
    from tflms.schedule.order import schedule_with_report
    ordered = enforce_order(graph, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS)
    if ordered.changed:
        return ordered.graph
    level = schedule_with_report(graph, options=EMULATION_SIM_OPTIONS, heuristics=("level",)).order
    return add_order_edges(graph, order_edges(graph, list(level), options=EMULATION_SIM_OPTIONS))


@pytest.fixture(scope="module")
def configs(cnn):
    """name -> (graph, budget or None), in the order original, tuned, large, small, planned for the emulated
    accelerator's kernels (oneDNN's, whatever this process runs)."""
    from tflms.measure import planning_for_emulation
    with planning_for_emulation():
        return _configs(cnn)


def _configs(cnn):
    from tflms.measure import EMULATION_PROFILE, EMULATION_SIM_OPTIONS
    from tflms.tune import tune

    graph = cnn["graph"]
    base = _sim(graph)
    budget = int(base.resident_bytes + BUDGET_FRACTION * base.transient_peak_bytes)
    # Every strategy, judged in the enforced order; the winner's order is pinned with edges (the order pass's,
    # or level order's where that is the lowest): the emulated machine's two inter-op threads would otherwise
    # run the idle-time winner's short-window swaps in another order from run to run.
    tuned = tune(graph, budget=budget, profile=EMULATION_PROFILE, config=_config(), copy_op="DeepCopy",
                 sim_options=EMULATION_SIM_OPTIONS, enforce_order=True)
    assert tuned.best.plan is not None, "the budget is below the original peak: the tuner must swap"
    out = {"original": (graph, None), "tuned": (_pinned(tuned.graph), budget)}
    levels = tflms.analyze(graph).levels
    longest = max(levels[c] - levels[op.name] for op in graph for c in graph.successors(op.name))
    last_peak = base.transient_peak_bytes
    for threshold in range(longest, 0, -max(1, longest // 30)):
        rewritten = tflms.rewrite(graph, _config(swapout_threshold=threshold), copy_op="DeepCopy").graph
        peak = _sim(rewritten).transient_peak_bytes
        if peak <= last_peak * (1 - SEPARATION):
            out["large" if "large" not in out else "small"] = (rewritten, None)
            last_peak = peak
            if "small" in out:
                break
    assert "small" in out, f"no two thresholds give peaks {SEPARATION:.0%} apart (longest distance {longest})"
    return out


@pytest.fixture(scope="module")
def measured(cnn, configs):
    """name -> list of RUNS executor measurements (all in one subprocess)."""
    from tflms.ir import tf_io
    from tflms.measure import measure_executor_peaks, step_request

    names = list(configs)
    requests = [step_request(cnn["concrete"], cnn["args"], graph_def=tf_io.to_graph_def(configs[n][0]))
                for n in names]
    flat = measure_executor_peaks(requests * RUNS)
    return {name: flat[i::len(names)] for i, name in enumerate(names)}


def _median(measurements) -> int:
    return int(np.median([m.peak() for m in measurements]))


def _median_run(measurements):
    peaks = [m.peak() for m in measurements]
    return measurements[sorted(range(len(peaks)), key=lambda i: (peaks[i], i))[(len(peaks) - 1) // 2]]


def test_tuned_rewrite_lowers_the_executor_peak_within_the_budget(configs, measured):
    graph, budget = configs["tuned"]
    original, tuned = _median(measured["original"]), _median(measured["tuned"])
    resident = _sim(graph).resident_bytes  # variables, constants and fed inputs: outside the step's records
    assert tuned < original, f"executor peak with the tuned rewrite {tuned} B, without {original} B"
    assert max(m.peak("host") for m in measured["tuned"]) > 0, "the swapped tensors should wait on the host"
    assert tuned + resident <= budget * (1 + BUDGET_MARGIN), (
        f"executor peak {tuned + resident} B (transient {tuned} + resident {resident}) exceeds the budget "
        f"{budget} B by more than {BUDGET_MARGIN:.0%}")


def test_rewritten_steps_train_bitwise_identically(measured):
    reference = measured["original"][0]
    assert len(reference.variables_after) > 10
    variables, fetches = sorted(reference.variables_after), sorted(reference.fetch_values)

    def state(m) -> Snapshot:
        return ([(f"variable {v}", m.variables_after[v]) for v in variables]
                + [(f"fetch {f}", m.fetch_values[f]) for f in fetches])

    for name, runs in measured.items():
        for run, measurement in enumerate(runs):
            assert set(measurement.variables_after) == set(reference.variables_after)
            assert_bitwise_equal(state(reference), state(measurement), f"{name} run {run} vs original run 0")


@pytest.mark.parametrize("name", ["original", "tuned", "large", "small"])
def test_simulator_within_10_percent_of_executor_median_in_level_and_executor_order(configs, measured, name):
    graph = configs[name][0]
    executor = _median(measured[name])
    level = _sim(graph).transient_peak_bytes
    spans = _median_run(measured[name]).spans_s()
    in_exec_order = _sim(graph, order=order_from_start_times(graph, {n: s[0] for n, s in spans.items()}))
    for label, peak in (("level order", level), ("executor order", in_exec_order.transient_peak_bytes)):
        assert abs(peak / executor - 1) <= TOLERANCE, (
            f"{name}: simulated peak in {label} {peak} B vs executor median {executor} B "
            f"(runs {[m.peak() for m in measured[name]]})")


@pytest.mark.parametrize("name", ["original", "tuned", "large", "small"])
def test_memory_model_replays_every_executor_run_within_1_percent(configs, measured, name):
    graph = configs[name][0]
    for run, measurement in enumerate(measured[name]):
        replay = _sim(graph, observed=measurement.spans_s())
        assert abs(replay.transient_peak_bytes / measurement.peak() - 1) <= REPLAY_TOLERANCE, (
            f"{name} run {run}: replayed peak {replay.transient_peak_bytes} B vs executor {measurement.peak()} B; "
            f"alive at the replayed peak: {replay.live_at_peak[:6]}")
        assert replay.host_peak_bytes == measurement.peak("host"), f"{name} run {run}: host peak"


def test_simulator_ranks_configurations_like_the_executor(configs, measured):
    names = ["original", "large", "small"]
    simulated = {n: _sim(configs[n][0]).transient_peak_bytes for n in names}
    executor = {n: _median(measured[n]) for n in names}
    assert sorted(names, key=simulated.get) == sorted(names, key=executor.get) == ["small", "large", "original"], (
        f"simulated {simulated}, executor medians {executor}")


def test_profile_calibrated_from_the_measured_step_times_it_and_keeps_every_peak(configs, measured):
    # tflms.measure.calibrate on the executor's real node times: they map to the IR's ops, the
    # calibrated (sequential) step spends what the measured ops were busy for (their shares, summed), and
    # every configuration's simulated peak stays within the target with the calibrated timing. The step's
    # wall time is not compared: on a shared machine it varies from run to run by more than any tolerance
    # (15, 23 and 24 ms for one graph in one suite run), and time targets belong to benchmarks
    # (tools/validate_memory.py --calibrate prints it).
    from tflms.measure.calibrate import calibrate_profile

    graph = configs["original"][0]
    calibration = calibrate_profile([(graph, measured["original"])])
    factors = dict(calibration.profile.op_time_factors)
    assert {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"} <= factors.keys(), calibration.table()
    simulated = simulate(graph, calibration.profile, options=_sim_options()).compute_time_s
    assert abs(simulated / calibration.measured_s - 1) <= BUSY_TOLERANCE, (
        f"calibrated compute {simulated:.4f} s vs measured busy time {calibration.measured_s:.4f} s\n"
        f"{calibration.table()}")
    assert abs(calibration.roofline_s / calibration.measured_s - 1) > BUSY_TOLERANCE, (
        "the control: the roofline alone already times these ops, so the calibration proves nothing")
    for name, (config_graph, _) in configs.items():
        peak = simulate(config_graph, calibration.profile, options=_sim_options()).transient_peak_bytes
        executor = _median(measured[name])
        assert abs(peak / executor - 1) <= TOLERANCE, f"{name}: calibrated {peak} B vs executor median {executor} B"


def test_a_copied_max_pool_3d_output_changes_which_tie_gets_the_gradient():
    # Why plans for the emulated accelerator never swap a MaxPool3D output its MaxPool3DGrad reads (the
    # onednn-workspace rule, planning_for_emulation): with oneDNN's kernels (EMULATION_ENV), MaxPool3DGrad given
    # the forward MaxPool3D's output straight routes a window's gradient to one maximum; given a copy of it (a
    # swapped-in MaxPool3D output) it routes it to every tied maximum (a window of ReLU zeros). The U-Net's TFLMS
    # rewrite at validate_memory's --budget-fraction 0.75, planned with this process's oneDNN (off on AMD EPYC),
    # swapped two MaxPool3D outputs and trained differently (docs/design.md, "Real models").
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"oneDNN's pooling kernels are the x86 build's; this machine is {platform.machine()}")
    from tflms.measure import measure_executor_peaks
    from tflms.measure.executor import ExecutorRequest

    def graph(copied: bool):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, (1, 4, 4, 4, 2), name="x")
            dy = tf.compat.v1.placeholder(tf.float32, (1, 2, 2, 2, 2), name="dy")
            relu = tf.nn.relu(x)
            window = dict(ksize=[1, 2, 2, 2, 1], strides=[1, 2, 2, 2, 1], padding="VALID")
            pooled = tf.raw_ops.MaxPool3D(input=relu, **window)
            if copied:  # a swap: out to the host, back to the accelerator
                with tf.device("/device:CPU:0"):
                    pooled = tf.raw_ops.DeepCopy(x=pooled)
                with tf.device("/device:CPU:1"):
                    pooled = tf.raw_ops.DeepCopy(x=pooled)
            tf.raw_ops.MaxPool3DGrad(orig_input=relu, orig_output=pooled, grad=dy, name="grad", **window)
        return g.as_graph_def()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 4, 4, 2)).astype(np.float32)
    x[0, :2, :2, :2, :] = -1.0  # one window of ReLU zeros per channel: eight tied maxima
    feeds = {"x": x, "dy": rng.standard_normal((1, 2, 2, 2, 2)).astype(np.float32) + 3.0}
    direct, copied = measure_executor_peaks([ExecutorRequest(graph_def=graph(c), feeds=feeds, fetches=["grad:0"])
                                             for c in (False, True)])
    windows = 2 * 2 * 2 * 2
    assert np.count_nonzero(direct.fetch_values["grad:0"]) == windows
    assert np.count_nonzero(copied.fetch_values["grad:0"]) == windows - 2 + 2 * 8, (
        "MaxPool3DGrad fed a copy of the forward output no longer routes ties differently: the exception in "
        "docs/design.md ('Real models') may be gone")


def test_plans_for_the_emulated_accelerator_follow_its_kernels_not_this_process():
    """The emulated accelerator runs oneDNN's kernels whatever this process runs, so a plan made for it keeps the
    MaxPool3D output its MaxPool3DGrad reads (oneDNN's workspace edge); a plan for a machine without oneDNN's
    kernels swaps it (the control)."""
    from tflms.devices import onednn_kernels
    from tflms.measure import ACCELERATOR_DEVICE, planning_for_emulation

    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(1, 8, 8, 8, 2))
    relu = b.op("relu", "Relu", [x], shape=(1, 8, 8, 8, 2))
    pool = b.op("pool", "MaxPool3D", [relu], shape=(1, 4, 4, 4, 2))
    h = pool
    for i in range(4):  # forward ops between the pool and the loss: the pool's output idles across them
        h = b.op(f"f{i}", "Tanh", [h], shape=(1, 4, 4, 4, 2))
    grad = b.op("gradient_tape/f_grad", "TanhGrad", [h, h], shape=(1, 4, 4, 4, 2))
    for i in range(3):
        grad = b.op(f"gradient_tape/g{i}", "TanhGrad", [grad, h], shape=(1, 4, 4, 4, 2))
    b.op("gradient_tape/pool_grad", "MaxPool3DGrad", [relu, pool, grad], shape=(1, 8, 8, 8, 2))
    for op in b.graph:
        op.device = ACCELERATOR_DEVICE
    config = _config(swapout_threshold=1, min_swap_bytes=0)

    def pool_swapped() -> bool:
        plan = tflms.rewrite(b.graph, config, require_backward=False).report.plan
        return any(s.tensor.op == "pool" for s in plan.swaps)

    with planning_for_emulation():
        assert not pool_swapped()
        plan = tflms.rewrite(b.graph, config, require_backward=False).report.plan
        assert [s.reason for s in plan.skipped if s.tensor.op == "pool"] == ["onednn-workspace"]
    with onednn_kernels(False):
        assert pool_swapped(), "the control: without oneDNN's kernels the pool's output is swapped"


# ------------------------------------------------------------------------------------------------ the rules


def _sig(outputs=(), control_outputs=()):
    return FunctionSignature(input_names=("x",), num_captures=0, output_names=tuple(outputs),
                             control_output_names=tuple(control_outputs))


def test_ops_nothing_needs_do_not_run():
    # TensorFlow prunes a function body to the fan-in of its outputs and control outputs:
    # the input gradient of a first layer (no consumer) never runs.
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    a = b.op("a", "Relu", [x], shape=T)
    b.op("unused", "Tanh", [a], shape=(64, 64))
    b.op("loss", "Sum", [a], shape=())
    graph = b.graph
    graph.signature = _sig(outputs=["loss:0"])
    assert simulate(graph, "v100-16gb-pcie3").transient_peak_bytes == 64 + 4
    assert simulate(graph, "v100-16gb-pcie3", options=SimOptions(prune_unused=False)).transient_peak_bytes > 16384
    # An order may still list the pruned op.
    assert simulate(graph, "v100-16gb-pcie3", order=["x", "a", "unused", "loss"]).transient_peak_bytes == 68


def test_forwarding_follows_chains_of_element_wise_ops():
    # x -> a = Relu -> b = Mul(a, 2) -> c = Add(b, 1): one buffer for a, b and c.
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    two = b.op("two", "Const", shape=())
    a = b.op("a", "Relu", [x], shape=T)
    m = b.op("b", "Mul", [a, two], shape=T)
    b.op("c", "AddV2", [m, two], shape=T)
    result = simulate(b.graph, "v100-16gb-pcie3")
    assert result.transient_peak_bytes == 64
    assert result.tensors_sharing("a:0") == ["b:0", "c:0"]


def test_variable_reads_are_never_forwarded():
    # Sqrt(ReadVariableOp(v)): the read aliases the variable, which keeps a reference.
    b = GraphBuilder()
    v = b.op("v", "Placeholder", shape=(), dtype="resource")
    read = b.op("read", "ReadVariableOp", [v], shape=T)
    b.op("sqrt", "Sqrt", [read], shape=T)
    result = simulate(b.graph, "v100-16gb-pcie3")
    assert result.transient_peak_bytes == 64 and result.buffer_owner == {}


def test_a_reader_still_running_blocks_forwarding():
    # g is read by s (a reduction) and by m (element-wise, last in the order). Sequentially
    # s has ended when m starts: m reuses g. Replaying a run where s still runs while m
    # starts (two inter-op threads): m needs its own buffer.
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    g = b.op("g", "Relu", [x], shape=T)
    b.op("s", "Sum", [g], shape=())
    b.op("m", "Mul", [g, g], shape=T)
    graph = b.graph
    assert simulate(graph, "v100-16gb-pcie3").transient_peak_bytes == 64 + 4
    overlapping = {"g": (0.0, 1.0), "s": (1.0, 3.0), "m": (2.0, 4.0)}
    replay = simulate(graph, "v100-16gb-pcie3", observed=overlapping)
    assert replay.transient_peak_bytes == 64 + 4 + 64
    assert [r.name for r in replay.ops if r.name != "x"] == ["g", "s", "m"]
    assert {r.name: (r.start_s, r.end_s) for r in replay.ops}["m"] == (2.0, 4.0)
    in_turn = simulate(graph, "v100-16gb-pcie3", observed={"g": (0.0, 1.0), "s": (1.0, 2.0), "m": (2.0, 3.0)})
    assert in_turn.transient_peak_bytes == 64 + 4


def test_kernel_workspace_lives_with_its_output():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(8, 8))
    b.op("pool", "MaxPool", [x], shape=(4, 4))
    plain = simulate(b.graph, "v100-16gb-pcie3")
    onednn = simulate(b.graph, "v100-16gb-pcie3", options=SimOptions(workspace_bytes_per_element={"MaxPool": 1}))
    assert (plain.transient_peak_bytes, onednn.transient_peak_bytes) == (64, 64 + 16)
    with pytest.raises(ConfigError, match=r"workspace_bytes_per_element\['MaxPool'\] must be a number >= 0"):
        SimOptions(workspace_bytes_per_element={"MaxPool": -1})


def test_order_from_start_times_is_topological_and_follows_observations():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=T)
    left = b.op("left", "Relu", [x], shape=T)
    right = b.op("right", "Tanh", [x], shape=T)
    b.op("join", "AddV2", [left, right], shape=T)
    graph = b.graph
    # right started first; x (fed) was never observed; "_SOURCE" is not in the graph.
    order = order_from_start_times(graph, {"_SOURCE": 0.0, "right": 1.0, "left": 2.0, "join": 3.0})
    assert order == ["x", "right", "left", "join"]
    # A start time that contradicts an edge cannot break the order.
    assert order_from_start_times(graph, {"join": 0.0, "left": 5.0, "right": 6.0}) == ["x", "left", "right", "join"]
    assert simulate(graph, "v100-16gb-pcie3", order=order).transient_peak_bytes == 128
    assert order_from_start_times(graph, {}) == ["x", "left", "right", "join"]
