"""Multi-worker training with tflms: MultiWorkerMirroredStrategy and tflms.function.

Run it as is and it starts two workers on this machine (loopback ports) and
checks that they end with the same weights (a few seconds on a CPU):

    python examples/multi_worker.py

On a real cluster, start one worker per machine with ``--worker`` and a
``TF_CONFIG`` that lists every worker and says which one this is (same list,
in the same order, on every machine; only ``index`` differs):

    TF_CONFIG='{"cluster": {"worker": ["node0:12345", "node1:12345"]},
                "task": {"type": "worker", "index": 0}}' python examples/multi_worker.py --worker

Each worker trains its own local replicas (all its GPUs; the CPU when it has
none) on its shard of the data; gradients are all-reduced across workers. The
step that calls ``strategy.run`` and ``strategy.reduce`` is wrapped in
``tflms.function`` instead of ``tf.function``: every local replica's part of the
step is rewritten, and each replica's activations are swapped to the host
memory of its own machine (``/job:worker/replica:0/task:N/device:CPU:0``), never
to another worker's. Create the strategy first (before anything else touches
TensorFlow), build the model and the optimizer under ``strategy.scope()`` before
the first step, and pass ``batch_size`` (the per-replica batch) when the
distributed dataset leaves the batch dimension unknown.

Without a GPU (this demo), each worker splits its CPU into two logical devices
and swaps from CPU:0 (the replica) to CPU:1 (the "host"): the copies are real
cross-device copies, but they save no memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

NUM_WORKERS = 2
PER_REPLICA_BATCH = 16
STEPS = 4
#: seconds the launcher waits for both workers, and a collective op for the other worker.
LAUNCH_TIMEOUT_S = 120
COLLECTIVE_TIMEOUT_S = 60


def worker() -> None:
    import numpy as np
    import tensorflow as tf

    demo = not tf.config.list_physical_devices("GPU")
    if demo:  # two logical CPUs: the replica on CPU:0, swapped tensors on CPU:1
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_S))
    task = strategy.cluster_resolver.task_id

    import keras

    import tflms

    keras.utils.set_random_seed(0)  # the same initial weights on every worker
    with strategy.scope():
        model = keras.Sequential([keras.Input((16, 16, 3)),
                                  keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                                  keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)  # no variable may be created by the first step
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    lms = {"swapout_threshold": 2, "batch_size": PER_REPLICA_BATCH}
    if demo:
        lms.update(host_device="/device:CPU:1", accelerator_device="/device:CPU:0")

    @tflms.function(**lms)
    def train_step(x, y):
        per_replica_loss = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    rng = np.random.default_rng(0)  # every worker builds the same data; the strategy shards it
    x = rng.standard_normal((global_batch * STEPS, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, size=(global_batch * STEPS,), dtype=np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    for step, (bx, by) in enumerate(strategy.experimental_distribute_dataset(dataset.with_options(options))):
        print(f"worker {task} step {step}: loss {float(train_step(bx, by)):.6f}", flush=True)
    if not train_step.report.num_swapped:
        raise SystemExit(f"worker {task}: nothing was swapped, so identical weights would prove nothing")
    if task == 0:
        print(train_step.report.table(max_rows=8))
    print(f"worker {task}: {train_step.placement.table()}")
    weights = np.concatenate([np.asarray(v.numpy()).ravel() for v in model.weights])
    digest = hashlib.sha256(weights.tobytes()).hexdigest()
    print("RESULT " + json.dumps({"task": task, "weights_sha256": digest}), flush=True)


def launch() -> int:
    """Start NUM_WORKERS workers on 127.0.0.1 and check that they agree."""
    sockets = [socket.socket() for _ in range(NUM_WORKERS)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    t0 = time.monotonic()
    try:
        for index in range(NUM_WORKERS):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = dict(os.environ, TF_CONFIG=json.dumps(tf_config),
                       TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, LAUNCH_TIMEOUT_S - (time.monotonic() - t0)))
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    results = []
    for index, (proc, out) in enumerate(zip(procs, outputs)):
        lines = [line for line in out.splitlines() if not line.startswith(("WARNING", "I0000", "W0000", "E0000"))]
        print(f"----- worker {index} (exit {proc.returncode})")
        print("\n".join(line for line in lines if not line.startswith("RESULT ")))
        if proc.returncode != 0:
            return 1
        results += [json.loads(line[len("RESULT "):]) for line in lines if line.startswith("RESULT ")]
    same = len({r["weights_sha256"] for r in results}) == 1
    print(f"----- {NUM_WORKERS} workers in {time.monotonic() - t0:.1f} s; identical final weights: {same}")
    return 0 if same and len(results) == NUM_WORKERS else 1


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        worker()
    else:
        sys.exit(launch())
