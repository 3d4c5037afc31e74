"""tflms under ``tf.distribute``: MirroredStrategy and MultiWorkerMirroredStrategy.

Logical CPU devices must be configured before TensorFlow initialises and a
``MultiWorkerMirroredStrategy`` must be created at the start of its process, so
every scenario runs in a child process: this file is also the child program
(``python tests/test_distribute.py mirrored LAYOUT OUT.json`` or ``... worker TASK
PORTS OUT_DIR``). Children do the training and the checks that need TensorFlow objects
and write JSON (and ``.npz`` weights); the tests assert on what they wrote.

What is proven (bitwise: ``tobytes()`` equality of every loss, weight and
optimizer variable, every replica's copy included):

- MirroredStrategy, custom loop (``strategy.run`` + ``strategy.reduce`` in the
  step): ``tflms.function`` == ``tf.function``; on the brief's two devices
  (replicas /cpu:0 and /cpu:1, host /cpu:0) and on three (replicas /cpu:1 and
  /cpu:2, host /cpu:0, the layout of a machine with two GPUs);
- MirroredStrategy, Keras ``fit`` with the LMS callback == ``fit`` without it
  (MLP; CNN with BatchNorm, the LMS fit with ``steps_per_execution=2`` against a
  plain fit with 1, because Keras's own multi-step loop fails under the strategy);
- every replica has its own swaps, every swap op survives grappler and runs, on
  the host of its replica's task; consumers run on the producer's replica device
  and are fed by a ``_Recv`` from that host; swap-in triggers belong to the
  same replica (read from the partition graphs TensorFlow ran);
- MultiWorkerMirroredStrategy, two worker processes on loopback: the same for a
  custom loop and for ``fit`` (the latter with two Keras 3.15 bugs patched in the
  workers, for both runs: see ``_patch_keras_multi_worker``), each worker's
  swaps on its own task, both workers ending with identical weights;
- a step that creates variables on its first call fails with a
  ``VariableCreationError`` naming the fix (plain ``tf.function`` fails too), and
  calling a ``tflms.function`` inside ``strategy.run`` with a ``DistributeError``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

import numpy as np
import pytest

from tflms.testing.bitwise import bitwise_diff

HERE = pathlib.Path(__file__).resolve()
SEED = 1234
FEATURES, HIDDEN, OUTPUTS = 8, 16, 4
GLOBAL_BATCH = 16
NUM_BATCHES = 4
#: a small threshold so that the tiny test models do get swaps.
THRESHOLD = 1
#: seconds: one child process with MirroredStrategy scenarios / the two workers together.
MIRRORED_TIMEOUT_S = 240
WORKERS_TIMEOUT_S = 150
#: seconds a worker's collective op may wait for the other worker before failing.
COLLECTIVE_TIMEOUT_S = 60


# =============================================================================================== tests (parent)
def _child_env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    root = str(HERE.parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
    return env


def _run_children(commands: list[list[str]], logs: list[pathlib.Path], timeout_s: float) -> None:
    """Run child processes side by side; every wait is bounded and the children are killed in the end."""
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout_s
    try:
        for command, log in zip(commands, logs):
            with open(log, "w") as handle:
                procs.append(subprocess.Popen([sys.executable, str(HERE), *command], env=_child_env(),
                                              stdout=handle, stderr=subprocess.STDOUT))
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"children did not finish in {timeout_s} s:\n" +
                    "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, f"{log.stem} exited with {proc.returncode}:\n{log.read_text()[-5000:]}"


#: MirroredStrategy layouts (logical CPUs; host /cpu:0): the brief's two devices, and replicas apart from the host.
MIRRORED_LAYOUTS = {"cpu0_cpu1": ("CPU:0", "CPU:1"), "cpu1_cpu2": ("CPU:1", "CPU:2")}


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict[str, Any]:
    """Results of every MirroredStrategy scenario (one child process per layout, run side by side)."""
    tmp = tmp_path_factory.mktemp("mirrored")
    layouts = sorted(MIRRORED_LAYOUTS)
    _run_children([["mirrored", layout, str(tmp / f"{layout}.json")] for layout in layouts],
                  [tmp / f"mirrored_{layout}.log" for layout in layouts], MIRRORED_TIMEOUT_S)
    results: dict[str, Any] = {}
    for layout in layouts:
        results.update(json.loads((tmp / f"{layout}.json").read_text()))
    return results


def _scenario(results: dict[str, Any], name: str) -> dict[str, Any]:
    result = results[name]
    assert result.get("error") is None, f"{name} failed in the child:\n{result['error']}"
    return result


def _assert_equivalent_and_placed(result: dict[str, Any], replicas: list[str], host_of: dict[str, str]) -> None:
    assert result["diffs"] == [], "tflms run differs from the plain run:\n  " + "\n  ".join(result["diffs"])
    assert result["changed"], "training changed no variable: the comparison is vacuous"
    per_replica = result["swaps_per_replica"]
    assert sorted(per_replica) == sorted(replicas), f"swaps by replica device: {per_replica}, replicas {replicas}"
    counts = set(per_replica.values())
    assert len(counts) == 1 and counts.pop() > 0, f"every replica should swap the same tensors: {per_replica}"
    assert result["hosts"] == {r: [host_of[r]] for r in replicas}, f"host per replica: {result['hosts']}"
    assert result["violations"] == [], "placement / survival violations:\n  " + "\n  ".join(result["violations"])


LOCAL = "/job:localhost/replica:0/task:0/device:"


@pytest.mark.slow
def test_custom_loop_on_the_briefs_two_devices(mirrored):
    """MirroredStrategy(["/cpu:0", "/cpu:1"]), accelerator CPU:1: the brief's experiment, variables built first.

    The failure reported for it came from variables created by the first call, which plain tf.function
    cannot run either (see test_variables_created_by_the_first_call_are_refused_with_the_fix).
    """
    result = _scenario(mirrored, "custom_loop_cpu0_cpu1")
    replicas = [LOCAL + "CPU:0", LOCAL + "CPU:1"]
    _assert_equivalent_and_placed(result, replicas, {r: LOCAL + "CPU:0" for r in replicas})


@pytest.mark.slow
def test_custom_loop_replicas_swap_to_their_host_and_back(mirrored):
    """Replicas on CPU:1 and CPU:2, host CPU:0: every swap crosses devices both ways, per replica."""
    result = _scenario(mirrored, "custom_loop_cpu1_cpu2")
    replicas = [LOCAL + "CPU:1", LOCAL + "CPU:2"]
    _assert_equivalent_and_placed(result, replicas, {r: LOCAL + "CPU:0" for r in replicas})
    assert result["recv_from_host"] == result["cross_device_feeds"] > 0, result


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp", "cnn_batchnorm_spe2"])
def test_keras_fit_with_lms_matches_plain_fit(mirrored, case):
    result = _scenario(mirrored, f"keras_fit_{case}")
    assert result["history"] == result["reference_history"], (f"history differs:\n{result['history']}\nvs plain "
                                                              f"fit\n{result['reference_history']}")
    replicas = [LOCAL + "CPU:1", LOCAL + "CPU:2"]
    _assert_equivalent_and_placed(result, replicas, {r: LOCAL + "CPU:0" for r in replicas})


@pytest.mark.slow
def test_variables_created_by_the_first_call_are_refused_with_the_fix(mirrored):
    result = _scenario(mirrored, "variable_creation")
    assert "You must feed a value for placeholder" in result["tf_function_error"], result["tf_function_error"]
    assert result["tflms_error_type"] == "VariableCreationError", result
    assert "optimizer.build(model.trainable_variables)" in result["tflms_error"]
    assert "strategy.run" in result["tflms_error"]
    assert result["second_call_error_type"] == "VariableCreationError", result


@pytest.mark.slow
def test_calling_a_tflms_function_inside_strategy_run_is_refused(mirrored):
    result = _scenario(mirrored, "inside_strategy_run")
    assert result["error_type"] == "DistributeError", result
    assert "Wrap the function that calls strategy.run" in result["message"]


@pytest.mark.slow
def test_iterator_argument(mirrored):
    """``train_step(iterator)`` with ``next(iterator)`` inside (the tf.distribute tutorials' loop)."""
    result = _scenario(mirrored, "iterator_argument")
    replicas = [LOCAL + "CPU:1", LOCAL + "CPU:2"]
    _assert_equivalent_and_placed(result, replicas, {r: LOCAL + "CPU:0" for r in replicas})


# ------------------------------------------------------------ placement on hand-built graphs (no child process)
def test_host_of_a_replica_is_the_host_device_on_the_replicas_own_task():
    from tflms.passes.place import host_for
    assert host_for("/job:worker/replica:0/task:1/device:GPU:0", "/device:CPU:0") == \
        "/job:worker/replica:0/task:1/device:CPU:0"
    assert host_for("/job:localhost/replica:0/task:0/device:GPU:1", "/device:CPU:0") == LOCAL + "CPU:0"
    assert host_for("", "/device:CPU:0") == "/device:CPU:0"  # unplaced graph: the configured host as is
    pinned = "/job:worker/replica:0/task:0/device:CPU:0"
    assert host_for("/job:worker/replica:0/task:1/device:GPU:0", pinned) == pinned  # an explicit task is kept


def _placed_mlp(device: str, copy_op: str = "Identity"):
    import tflms
    from tflms.passes import apply_swaps, place_swaps
    from tflms.testing import mlp_training_graph
    graph = mlp_training_graph(3)
    for op in graph:
        op.device = device  # as a strategy pins a replica's ops
    result = tflms.rewrite(graph, swapout_threshold=1, accelerator_device="/device:GPU:0", copy_op=copy_op)
    # the placement pass on its own, on the graph the swap pass returned (the pipeline ran both)
    swapped = apply_swaps(graph, result.report.plan, copy_op=copy_op).graph
    placed = place_swaps(swapped, result.report.plan)
    assert {op.name: op.device for op in placed.graph} == {op.name: op.device for op in result.graph}
    return dataclasses.replace(result, graph=swapped), placed.graph, placed.report


def test_swaps_of_a_replica_go_to_its_tasks_host_and_its_consumers_stay():
    replica = "/job:worker/replica:0/task:1/device:GPU:1"
    host = "/job:worker/replica:0/task:1/device:CPU:0"
    result, placed, placement = _placed_mlp(replica)
    plan = result.report.plan
    assert plan.swaps and [s.tensor for s in placement.swaps] == [s.tensor.name for s in plan.swaps]
    for swap in plan.swaps:
        assert placed.op(swap.swap_out).device == host, swap.swap_out
        for group in swap.swap_ins:
            assert placed.op(group.name).device == host, group.name
            assert {placed.op(c).device for c in group.consumers} == {replica}
        assert result.graph.op(swap.swap_out).device == "/device:CPU:0", "the input graph must not change"
    assert all(s.stays_on_replica and s.replica_device == replica for s in placement.swaps)
    assert placement.table().splitlines()[1] == f"  {replica} -> {host}: {len(plan.swaps)}"


def test_a_deepcopy_swap_in_goes_to_the_replica_not_to_accelerator_device():
    replica = "/job:localhost/replica:0/task:0/device:GPU:1"
    _, placed, placement = _placed_mlp(replica, copy_op="DeepCopy")
    assert placement.swaps
    for swap in placement.swaps:
        assert placed.op(swap.swap_out).device == LOCAL + "CPU:0"
        assert swap.swap_in_devices == (replica,) * len(swap.swap_ins)
        assert {placed.op(name).device for name in swap.swap_ins} == {replica}


def test_an_unplaced_graph_is_returned_unchanged():
    result, placed, placement = _placed_mlp("")
    assert placed is result.graph  # so the default strategy's rewrite stays byte-identical
    assert {s.host_device for s in placement.swaps} == {"/device:CPU:0"}


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.slow
def test_multi_worker_mirrored_two_local_workers(tmp_path):
    ports = ",".join(map(str, _free_ports(2)))
    _run_children([["worker", str(task), ports, str(tmp_path)] for task in range(2)],
                  [tmp_path / f"worker{task}.log" for task in range(2)], WORKERS_TIMEOUT_S)

    weights = [np.load(tmp_path / f"worker{task}.npz") for task in range(2)]
    results = [json.loads((tmp_path / f"worker{task}.json").read_text()) for task in range(2)]
    for task, (w, result) in enumerate(zip(weights, results)):
        replica = f"/job:worker/replica:0/task:{task}/device:CPU:0"
        host = f"/job:worker/replica:0/task:{task}/device:CPU:1"
        names = result["names"]
        for run, reference in (("lms", "tf"), ("fit_lms", "fit")):
            keys = sorted(k for k in w.files if k.startswith(run + "/"))
            assert keys and len(keys) == len([k for k in w.files if k.startswith(reference + "/")])
            entries = [(names[reference][int(k.split("/")[1])], w[reference + k[len(run):]], w[k]) for k in keys]
            diffs = bitwise_diff([(n, ref) for n, ref, _ in entries], [(n, got) for n, _, got in entries])
            assert not diffs, f"worker {task}: {run} differs from {reference}:\n  " + "\n  ".join(diffs)
        for name in ("custom_loop", "keras_fit"):
            r = result[name]
            assert r["swaps_per_replica"] and set(r["swaps_per_replica"]) == {replica}, (task, name, r)
            assert r["hosts"] == {replica: [host]}, f"worker {task} {name}: swaps must stay on its own task: {r}"
            assert r["violations"] == [], f"worker {task} {name}:\n  " + "\n  ".join(r["violations"])
            assert r["changed"], f"worker {task} {name}: training changed nothing"
        assert results[task]["keras_fit"]["history"] == results[task]["keras_fit"]["reference_history"]
    # Synchronous training: both workers hold the same variables at the end.
    for run in ("tf", "lms", "fit", "fit_lms"):
        keys = sorted(k for k in weights[0].files if k.startswith(run + "/"))
        named = [[(results[0]["names"][run][int(k.split("/")[1])], w[k]) for k in keys] for w in weights]
        diffs = bitwise_diff(*named)
        assert not diffs, f"{run}: workers 0 and 1 differ:\n  " + "\n  ".join(diffs)


# =============================================================================================== child side
def _configure_cpus(count: int) -> None:
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def _data(seed: int = 0, shape: tuple[int, ...] = (FEATURES,), outputs: int = OUTPUTS):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((GLOBAL_BATCH * NUM_BATCHES, *shape)).astype(np.float32)
    y = rng.standard_normal((GLOBAL_BATCH * NUM_BATCHES, outputs)).astype(np.float32)
    return x, y


def _mlp():
    import keras
    return keras.Sequential([keras.Input((FEATURES,)),
                             keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(OUTPUTS)])


def _cnn():
    import keras
    return keras.Sequential([keras.Input((8, 8, 3)),
                             keras.layers.Conv2D(8, 3, padding="same"),
                             keras.layers.BatchNormalization(),
                             keras.layers.ReLU(),
                             keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(OUTPUTS)])


def _state(strategy, variables) -> list[tuple[str, np.ndarray]]:
    """Every replica's copy of every variable (a MirroredVariable has one per local replica)."""
    state = []
    for v in variables:
        for i, component in enumerate(strategy.experimental_local_results(v.value)):
            state.append((f"{v.path}[replica {i}]", np.array(component.numpy())))
    return state


def _custom_loop(strategy, wrap, *, iterator_argument: bool = False):
    """Train the MLP with ``wrap(train_step)``.

    Returns ``(state, initial, final, step)``: losses and every variable after training, the model weights
    before and after training, and the wrapped step.
    """
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = _mlp()
        optimizer = keras.optimizers.Adam(1e-2)
        optimizer.build(model.trainable_variables)  # no variable may be created by the first call (see the tests)
    initial = _state(strategy, model.weights)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            per_example = tf.reduce_sum(tf.square(pred - y), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = _data()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    distributed = strategy.experimental_distribute_dataset(dataset)
    if iterator_argument:
        def train_step(iterator):
            bx, by = next(iterator)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(bx, by)), axis=None)
        step = wrap(train_step)
        iterator = iter(distributed)
        losses = [np.array(step(iterator)) for _ in range(NUM_BATCHES)]
    else:
        def train_step(bx, by):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(bx, by)), axis=None)
        step = wrap(train_step)
        losses = [np.array(step(bx, by)) for bx, by in distributed]
    state = [(f"loss[{i}]", loss) for i, loss in enumerate(losses)]
    state += _state(strategy, model.weights + optimizer.variables)
    return state, initial, _state(strategy, model.weights), step


class _Recorder:
    """Run metadata of what TensorFlow ran while the block executed."""

    def __enter__(self):
        from tensorflow.python.eager import context
        self.ctx = context.context()
        self.ctx.enable_run_metadata()
        self.ctx.export_run_metadata()  # drop graphs stored earlier
        return self

    def __exit__(self, *exc):
        self.metadata = self.ctx.export_run_metadata()
        self.ctx.disable_run_metadata()
        return False


def _placement_facts(report, placement, rewritten, metadata, replicas) -> dict[str, Any]:
    """Where the swap ops and their readers ran, from the partition graphs; violations as sentences.

    ``cross_device_feeds`` counts swap-ins whose replica is not their host; ``recv_from_host`` those of
    them read on the replica device through a ``_Recv`` sent from the host.
    """
    violations: list[str] = []
    inserted = set(report.inserted_ops)
    holders = [fg for fg in metadata.function_graphs if inserted <= {n.name for n in fg.pre_optimization_graph.node}]
    if len(holders) != 1:
        return {"violations": [f"{len(holders)} function graphs that ran hold every swap op (want 1)"]}
    holder = holders[0]
    post = {n.name for n in holder.post_optimization_graph.node}
    violations += [f"grappler removed {name}" for name in sorted(inserted - post)]
    where = {n.name: n.device for pg in holder.partition_graphs for n in pg.node}
    nodes = {n.name: n for pg in holder.partition_graphs for n in pg.node}
    violations += [f"{name} is in no partition graph" for name in sorted(inserted - set(where))]
    recv_from_host = cross_device_feeds = 0
    swap_ins_per_replica: dict[str, int] = {}
    plan = {s.swap_out: s for s in report.plan.swaps}
    for swap in placement.swaps:
        replica, host = swap.replica_device, swap.host_device
        if replica not in replicas:
            violations.append(f"{swap.tensor}: produced on {replica!r}, not a replica device {replicas}")
        if where.get(swap.tensor.split(":")[0]) != replica:
            violations.append(f"{swap.tensor}: producer ran on {where.get(swap.tensor.split(':')[0])}, not {replica}")
        if where.get(swap.swap_out) != host:
            violations.append(f"{swap.swap_out} ran on {where.get(swap.swap_out)}, not {host}")
        swap_ins_per_replica[replica] = swap_ins_per_replica.get(replica, 0) + len(swap.swap_ins)
        for group in plan[swap.swap_out].swap_ins:
            if where.get(group.name) != host:
                violations.append(f"{group.name} ran on {where.get(group.name)}, not {host}")
            if group.trigger and rewritten.graph.get_operation_by_name(group.trigger).device != replica:
                violations.append(f"{group.name}: trigger {group.trigger} is not on {replica}")
            for consumer in group.consumers:
                if consumer in where and where[consumer] != replica:
                    violations.append(f"{consumer} (fed by {group.name}) ran on {where[consumer]}, not {replica}")
            # What reads the swapped-in value after grappler (which may reassociate the consumers' arithmetic):
            # on a replica apart from its host, a _Recv sent from the host; on the host's own device, the swap-in.
            if replica == host:
                sources = [group.name]
            else:
                cross_device_feeds += 1
                sources = [n.name for n in nodes.values() if n.op == "_Recv"
                           and n.attr["tensor_name"].s.decode().endswith("_" + group.name)
                           and n.attr["send_device"].s.decode() == host and n.attr["recv_device"].s.decode() == replica]
            readers = [n.name for n in nodes.values() if where[n.name] == replica
                       and any(i.split(":")[0] in sources for i in n.input)]
            if readers:
                recv_from_host += replica != host
            else:
                violations.append(f"no op on {replica} reads {group.name} ({'from ' + host if sources else 'no _Recv'})")
    return {"violations": violations, "recv_from_host": recv_from_host, "cross_device_feeds": cross_device_feeds,
            "swap_ins_per_replica": swap_ins_per_replica}


def _summary(report, placement) -> dict[str, Any]:
    by_replica = placement.by_replica()
    return {"swaps_per_replica": {d: len(s) for d, s in by_replica.items()},
            "hosts": {d: sorted({s.host_device for s in swaps}) for d, swaps in by_replica.items()},
            "num_swapped": report.num_swapped}


def _run_scenario(results: dict[str, Any], name: str, fn) -> None:
    t0 = time.monotonic()
    try:
        results[name] = {"error": None, **fn()}
    except Exception:  # reported to the parent, which fails the matching test
        results[name] = {"error": traceback.format_exc()}
    results[name]["seconds"] = round(time.monotonic() - t0, 2)
    print(f"{name}: {'ok' if results[name]['error'] is None else 'FAILED'} ({results[name]['seconds']} s)",
          flush=True)


def _custom_loop_scenario(strategy, replicas, **lms_options):
    import tensorflow as tf
    import tflms

    def run(iterator_argument: bool = False):
        reference, _, _, _ = _custom_loop(strategy, tf.function, iterator_argument=iterator_argument)
        with _Recorder() as rec:
            candidate, initial, final, step = _custom_loop(strategy, lambda f: tflms.function(f, **lms_options),
                                                           iterator_argument=iterator_argument)
        rewritten = step._last.rewritten  # noqa: SLF001 - the ConcreteFunction that ran
        return {"diffs": bitwise_diff(reference, candidate), "changed": bool(bitwise_diff(initial, final)),
                **_summary(step.report, step.placement),
                **_placement_facts(step.report, step.placement, rewritten, rec.metadata, replicas)}
    return run


def _keras_fit_scenario(strategy, replicas, case: str, steps_per_execution: int = 1):
    """Plain ``fit`` against ``fit`` with LMS; the LMS fit may use ``steps_per_execution`` > 1.

    The reference always uses ``steps_per_execution=1``: under MirroredStrategy, Keras 3.15's own
    multi-step loop (``tf.while_loop`` in one ``tf.function``) fails on its first call ("You must feed a
    value for placeholder tensor 'while/body/.../while/cond/Placeholder_1'"), with or without tflms,
    while LMS runs Keras's one-step function from Python and is unaffected. Both train the same steps.
    """
    import keras
    import tflms.keras

    def build(spe: int):
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = _mlp() if case == "mlp" else _cnn()
            model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False,
                          steps_per_execution=spe)
        return model

    x, y = _data() if case == "mlp" else _data(shape=(8, 8, 3))
    fit = {"batch_size": GLOBAL_BATCH, "epochs": 2, "shuffle": False, "verbose": 0}

    def run():
        reference = build(1)
        ref_history = reference.fit(x, y, **fit).history
        model = build(steps_per_execution)
        initial = _state(strategy, model.weights)
        lms = tflms.keras.LMS(swapout_threshold=THRESHOLD, accelerator_device="/device:CPU:1", verbose=0)
        with _Recorder() as rec:
            history = model.fit(x, y, callbacks=[lms], **fit).history
        variables = lambda m: list(m.weights) + list(m.optimizer.variables)  # noqa: E731
        trace = lms._last_step.last  # noqa: SLF001 - the trace that ran (its rewritten ConcreteFunction)
        return {"history": history, "reference_history": ref_history,
                "diffs": bitwise_diff(_state(strategy, variables(reference)), _state(strategy, variables(model))),
                "changed": bool(bitwise_diff(initial, _state(strategy, model.weights))),
                **_summary(lms.report, lms.placement),
                **_placement_facts(lms.report, lms.placement, trace.rewritten, rec.metadata, replicas)}
    return run


def _variable_creation_scenario(strategy):
    import keras
    import tensorflow as tf
    import tflms

    def make(wrap):
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = keras.Sequential([keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(OUTPUTS)])
            optimizer = keras.optimizers.SGD(1e-2)  # neither is built: the first call creates the variables

        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return wrap(lambda bx, by: strategy.reduce("SUM", strategy.run(step_fn, args=(bx, by)), axis=None))

    def run():
        x, y = _data()
        batch = next(iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))))
        out: dict[str, Any] = {}
        try:
            make(tf.function)(*batch)
            out["tf_function_error"] = ""
        except Exception as err:  # noqa: BLE001 - recorded for the parent
            out["tf_function_error"] = str(err)
        step = make(lambda f: tflms.function(f, swapout_threshold=THRESHOLD))
        for key in ("tflms", "second_call"):
            try:
                step(*batch)
                out[f"{key}_error_type"], out[f"{key}_error"] = None, ""
            except Exception as err:  # noqa: BLE001
                out[f"{key}_error_type"], out[f"{key}_error"] = type(err).__name__, str(err)
        return out
    return run


def _inside_run_scenario(strategy):
    import keras
    import tensorflow as tf
    import tflms

    def run():
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = _mlp()
        step = tflms.function(lambda x: tf.reduce_sum(model(x)))
        x, _ = _data()
        batch = next(iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH))))
        try:
            strategy.run(step, args=(batch,))
        except Exception as err:  # noqa: BLE001
            return {"error_type": type(err).__name__, "message": str(err)}
        return {"error_type": None, "message": ""}
    return run


def mirrored_main(layout: str, out: str) -> None:
    """Scenarios on one MirroredStrategy per process (two in one process clash on collective group keys)."""
    _configure_cpus(3)
    import tensorflow as tf
    results: dict[str, Any] = {}
    replicas = [LOCAL + d for d in MIRRORED_LAYOUTS[layout]]
    strategy = tf.distribute.MirroredStrategy(replicas)
    lms = {"swapout_threshold": THRESHOLD, "accelerator_device": "/device:CPU:1"}
    _run_scenario(results, f"custom_loop_{layout}", _custom_loop_scenario(strategy, replicas, **lms))
    if layout == "cpu0_cpu1":
        _run_scenario(results, "variable_creation", _variable_creation_scenario(strategy))
        _run_scenario(results, "inside_strategy_run", _inside_run_scenario(strategy))
    else:
        _run_scenario(results, "keras_fit_mlp", _keras_fit_scenario(strategy, replicas, "mlp"))
        _run_scenario(results, "keras_fit_cnn_batchnorm_spe2", _keras_fit_scenario(strategy, replicas, "cnn", 2))
        iterator_run = _custom_loop_scenario(strategy, replicas, batch_size=GLOBAL_BATCH // 2, **lms)
        _run_scenario(results, "iterator_argument", lambda: iterator_run(iterator_argument=True))
    pathlib.Path(out).write_text(json.dumps(results, indent=1, default=str))


def _patch_keras_multi_worker() -> None:
    """Work around two Keras 3.15 bugs that break ``fit`` under MultiWorkerMirroredStrategy (with or without tflms).

    1. ``TensorFlowTrainer._maybe_symbolic_build`` calls ``strategy.reduce("MEAN", batch)`` on the whole
       ``(x, y)`` structure; the multi-worker strategy reduces one value at a time ("Attempt to convert a
       value (PerReplica...) to a Tensor"). The test models are built before ``fit``, so it is skipped.
    2. ``reduce_per_replica`` reduces a multi-worker "mean" with ``axis=0``, which fails on the scalar loss
       ("Invalid reduction dimension 0 for input with 0 dimensions"); scalars are reduced with ``axis=None``.
    Applied in the worker process for the plain and the LMS fit alike.
    """
    from keras.src.backend.tensorflow import trainer

    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if trainer._collective_all_reduce_multi_worker(strategy) and reduction in ("auto", "mean"):  # noqa: SLF001
            import tensorflow as tf
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None if v.shape.rank == 0 else 0), values)
        return original(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = lambda self, iterator=None, data_batch=None: None


def worker_main(task: int, ports: str, out_dir: str) -> None:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
        "task": {"type": "worker", "index": task}})
    _configure_cpus(2)
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_S))
    import keras
    import tflms
    import tflms.keras
    _patch_keras_multi_worker()
    replica = f"/job:worker/replica:0/task:{task}/device:CPU:0"
    # Each worker swaps its replica's tensors (CPU:0) to its own second CPU device: a real cross-device copy.
    lms_options = {"swapout_threshold": THRESHOLD, "host_device": "/device:CPU:1",
                   "accelerator_device": "/device:CPU:0", "batch_size": GLOBAL_BATCH // 2}
    arrays: dict[str, np.ndarray] = {}
    results: dict[str, Any] = {}

    t0 = time.monotonic()
    reference, _, _, _ = _custom_loop(strategy, tf.function)
    with _Recorder() as rec:
        candidate, initial, final, step = _custom_loop(strategy, lambda f: tflms.function(f, **lms_options))
    results["names"] = {"tf": [n for n, _ in reference], "lms": [n for n, _ in candidate]}
    arrays.update({f"tf/{i:03d}": a for i, (_, a) in enumerate(reference)})  # by position: names differ per model
    arrays.update({f"lms/{i:03d}": a for i, (_, a) in enumerate(candidate)})
    rewritten = step._last.rewritten  # noqa: SLF001 - the ConcreteFunction that ran
    results["custom_loop"] = {
        "changed": bool(bitwise_diff(initial, final)), **_summary(step.report, step.placement),
        **_placement_facts(step.report, step.placement, rewritten, rec.metadata, [replica])}

    x, y = _data()
    fit = {"batch_size": GLOBAL_BATCH, "epochs": 2, "shuffle": False, "verbose": 0}

    def build():
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = _mlp()
            model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False)
            model._symbolic_build(data_batch=(x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]))  # noqa: SLF001 - see the patch
        return model

    plain = build()
    ref_history = plain.fit(x, y, **fit).history
    model = build()
    initial = _state(strategy, model.weights)
    lms = tflms.keras.LMS(verbose=0, **lms_options)
    with _Recorder() as rec:
        history = model.fit(x, y, callbacks=[lms], **fit).history
    for run, m in (("fit", plain), ("fit_lms", model)):
        state = _state(strategy, list(m.weights) + list(m.optimizer.variables))
        arrays.update({f"{run}/{i:03d}": a for i, (_, a) in enumerate(state)})
        results.setdefault("names", {})[run] = [n for n, _ in state]
    trace = lms._last_step.last  # noqa: SLF001
    results["keras_fit"] = {"history": history, "reference_history": ref_history,
                            "changed": bool(bitwise_diff(initial, _state(strategy, model.weights))),
                            **_summary(lms.report, lms.placement),
                            **_placement_facts(lms.report, lms.placement, trace.rewritten, rec.metadata, [replica])}
    results["seconds"] = round(time.monotonic() - t0, 2)
    np.savez(pathlib.Path(out_dir) / f"worker{task}.npz", **arrays)
    (pathlib.Path(out_dir) / f"worker{task}.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"worker {task}: done in {results['seconds']} s", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "mirrored":
        mirrored_main(sys.argv[2], sys.argv[3])
    elif mode == "worker":
        worker_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}: use 'mirrored LAYOUT OUT.json' or 'worker TASK PORTS OUT_DIR'")


def test_compressed_swaps_follow_their_replica():
    import tflms
    from tflms.compress.codecs import ZeroValueCodec
    from tflms.compress.rewrite import CompressionChoice, apply_compression
    from tflms.ir.graph import TensorRef
    from tflms.passes import apply_swaps, place_swaps
    from tflms.testing import mlp_training_graph

    replica = "/job:worker/replica:0/task:1/device:GPU:1"
    host = "/job:worker/replica:0/task:1/device:CPU:0"
    graph = mlp_training_graph(3)
    for op in graph:
        op.device = replica
    result = tflms.rewrite(graph, swapout_threshold=4, accelerator_device="/device:GPU:0")
    ref = TensorRef("fw/Relu_0", 0)
    swapped = apply_swaps(graph, result.report.plan).graph
    compressed = apply_compression(swapped, result.report.plan,
                                   [CompressionChoice(ref, ZeroValueCodec(), nonzero_fraction=0.5)]).graph
    placed = place_swaps(compressed, result.report.plan).graph
    assert placed.op("lms/encode_fw/Relu_0_0").device == replica
    assert placed.op("lms/swap_out_fw/Relu_0_0_part1").device == host
    assert placed.op("lms/swap_in_fw/Relu_0_0_0_part1").device == host
    assert placed.op("lms/decode_fw/Relu_0_0_0").device == replica
