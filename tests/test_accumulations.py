"""Grappler's accumulators: tflms pins the summation order this machine's executor takes, observed in one call.

Grappler's memory optimizer turns a large ``AddN`` into a temporary variable and one ``AssignAdd`` per input,
unordered; on a CPU the executor's order depends on how long each kernel took before, so tflms observes it
(``tflms.measure.accumulations``) and pins it (``tflms.ir.preoptimize.pin_accumulations``). The kit's
``accumulated`` model (three activations of a ReLU map, summed, at 256x256) gets two accumulators.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tflms  # noqa: E402
from tflms.ir import preoptimize  # noqa: E402
from tflms.measure.accumulations import (ObservationError, end_order, end_orders,  # noqa: E402
                                        observe_accumulation_orders)
from tflms.pipeline import rewrite_step  # noqa: E402
from tflms.testing import build_model, make_batches, make_train_step  # noqa: E402

BATCH = 4


def _xspace(events):
    """A serialized XSpace with one plane; ``events``: (line timestamp ns, name, offset ps, duration ps)."""
    from tflms._compat.tf import xplane_pb2
    space = xplane_pb2().XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for stamp, name, offset, duration in events:
        if name not in ids:
            ids[name] = len(ids) + 1
            plane.event_metadata[ids[name]].id = ids[name]
            plane.event_metadata[ids[name]].name = name
        line = plane.lines.add(timestamp_ns=stamp)
        line.events.add(metadata_id=ids[name], offset_ps=offset, duration_ps=duration)
    return space.SerializeToString()


def test_end_order_reads_each_op_by_its_last_end():
    raw = _xspace([(10, "acc/tmp_var_accum_0:AssignAdd", 5_000, 9_000),  # ends at 24 ns
                   (20, "acc/tmp_var_accum_1:AssignAdd", 0, 1_000),  # ends at 21 ns
                   (0, "acc/tmp_var_accum_2:AssignAdd", 30_000, 1),  # ends just after 30 ns
                   (0, "acc/tmp_var_accum_1:AssignAdd", 40_000, 0),  # the same node again, later: 40 ns
                   (0, "other:Mul", 0, 1)])
    names = {f"acc/tmp_var_accum_{i}" for i in range(3)}
    assert end_order(raw, names) == ["acc/tmp_var_accum_0", "acc/tmp_var_accum_2", "acc/tmp_var_accum_1"]
    assert end_order(raw, {"other"}) == ["other"]
    assert end_order(raw, {"missing"}) == []


def _accumulated_step():
    keras.backend.clear_session()
    model = build_model("accumulated", size=256, classes=5)
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    [(x, y)] = make_batches(model, batch_size=BATCH, steps=1, seed=1)
    args = [tf.constant(x), tf.constant(y)]
    return step.get_concrete_function(*args), args, (model, optimizer)


def test_end_orders_split_the_calls_by_each_ops_kth_end():
    # two calls: accum_0 and accum_1 swap places in the second (a race), accum_2 is last in both
    raw = _xspace([(0, "acc/tmp_var_accum_0:AssignAdd", 1_000, 1), (0, "acc/tmp_var_accum_1:AssignAdd", 2_000, 1),
                   (0, "acc/tmp_var_accum_2:AssignAdd", 3_000, 1),
                   (0, "acc/tmp_var_accum_1:AssignAdd", 11_000, 1), (0, "acc/tmp_var_accum_0:AssignAdd", 12_000, 1),
                   (0, "acc/tmp_var_accum_2:AssignAdd", 13_000, 1)])
    names = {f"acc/tmp_var_accum_{i}" for i in range(3)}
    first, second = end_orders(raw, names, 2)
    assert first == ["acc/tmp_var_accum_0", "acc/tmp_var_accum_1", "acc/tmp_var_accum_2"]
    assert second == ["acc/tmp_var_accum_1", "acc/tmp_var_accum_0", "acc/tmp_var_accum_2"]
    assert end_orders(raw, names, 1) == [end_order(raw, names)] != [first]  # one call: each op by its last end


def test_a_racy_observation_pins_the_warm_calls_order_and_is_said(monkeypatch):
    import tflms.measure.accumulations as acc
    raw = _xspace([(0, "a/tmp_var_accum_0:AssignAdd", 1_000, 1), (0, "a/tmp_var_accum_1:AssignAdd", 2_000, 1),
                   (0, "a/tmp_var_accum_1:AssignAdd", 11_000, 1), (0, "a/tmp_var_accum_0:AssignAdd", 12_000, 1),
                   (0, "b/tmp_var_accum_0:AssignAdd", 1_500, 1), (0, "b/tmp_var_accum_1:AssignAdd", 2_500, 1),
                   (0, "b/tmp_var_accum_0:AssignAdd", 11_500, 1), (0, "b/tmp_var_accum_1:AssignAdd", 12_500, 1)])
    monkeypatch.setattr(acc, "_profiled_call", lambda function, args, variables, calls: raw)
    adds = {r: [f"{r}/tmp_var_accum_{i}" for i in range(2)] for r in ("a", "b")}
    orders = acc.observe_accumulation_orders(None, [], adds, variables=[], calls=2)
    # (two calls: the warm one is the second)
    assert orders == {"a": ("a/tmp_var_accum_1", "a/tmp_var_accum_0"), "b": ("b/tmp_var_accum_0", "b/tmp_var_accum_1")}
    assert orders.racy == {"a"}
    # four calls: a cold first order, then 1-0, 0-1, 1-0: the warm calls' most frequent (1, 0) wins
    ends = [(0, f"a/tmp_var_accum_{i}:AssignAdd", 10_000 * call + 1_000 * (k + 1), 1)
            for call, order in enumerate([(0, 1), (1, 0), (0, 1), (1, 0)]) for k, i in enumerate(order)]
    monkeypatch.setattr(acc, "_profiled_call", lambda function, args, variables, calls: _xspace(ends))
    orders = acc.observe_accumulation_orders(None, [], {"a": adds["a"]}, variables=[], calls=4)
    assert orders == {"a": ("a/tmp_var_accum_1", "a/tmp_var_accum_0")} and orders.racy == {"a"}


def test_observing_a_call_reads_every_accumulator_and_leaves_the_variables_as_they_were():
    concrete, args, _keep = _accumulated_step()
    before = [np.array(v.numpy(), copy=True) for v in concrete.graph.variables]
    seen = {}

    def observe(function, adds):
        seen.update(observe_accumulation_orders(function, args, adds, variables=concrete.graph.variables))
        return seen

    rewritten = preoptimize.preoptimize(concrete, observe)
    assert len(seen) == 2, seen
    pins = preoptimize.accumulator_pins(rewritten)
    assert {p.result: p.order for p in pins} == seen and {p.source for p in pins} == {preoptimize.ORDER_OBSERVED}
    for result, order in seen.items():
        assert sorted(order) == [f"{result}/tmp_var_accum_{i}" for i in range(3)], (result, order)
    after = [v.numpy() for v in concrete.graph.variables]
    assert len(before) == len(after) > 3
    for b, a, v in zip(before, after, concrete.graph.variables):
        assert b.tobytes() == a.tobytes(), f"the observing call left {v.name} changed"
    # the control: the call did train (the restore is what undid it)
    concrete(*args)
    assert any(b.tobytes() != v.numpy().tobytes() for b, v in zip(before, concrete.graph.variables))


KINDS = ("AddN", "AssignAdd", "TemporaryVariable", "DestroyTemporaryVariable")


def _kinds(graph_def) -> dict[str, int]:
    return {k: sum(n.op == k for n in graph_def.node) for k in KINDS}


def test_instantiated_accumulators_are_what_tensorflow_ran_and_the_call_restores_the_variables():
    """What the pre-pass asks of the user's own step: the accumulators TensorFlow's instantiation made, with their
    nodes as it ran them; the call leaves the variables as they were."""
    from tflms.measure.accumulations import instantiated_accumulators
    from tflms.testing import record_run_metadata
    concrete, args, _keep = _accumulated_step()
    before = [np.array(v.numpy(), copy=True) for v in concrete.graph.variables]
    made = instantiated_accumulators(concrete, args, variables=concrete.graph.variables)
    assert len(made) == 2, sorted(made)
    for result, nodes in made.items():
        assert [n.op for n in nodes].count("AssignAdd") == 3 and nodes[-1].op == "DestroyTemporaryVariable"
        assert {n.op for n in nodes} == {"TemporaryVariable", "Const", "Assign", "AssignAdd", "DestroyTemporaryVariable"}
    assert all(b.tobytes() == v.numpy().tobytes() for b, v in zip(before, concrete.graph.variables))
    with record_run_metadata() as ran:  # the control: the next call trains, and makes no new graph to read
        concrete(*args)
    assert not ran.function_graphs
    with pytest.raises(ObservationError, match="instantiated before"):
        instantiated_accumulators(concrete, args, variables=concrete.graph.variables)


def test_where_instantiation_makes_accumulators_the_pre_pass_did_not_the_step_takes_them(monkeypatch, caplog):
    """The pre-pass and instantiation can decide differently (keras.applications ResNet50 at 96x96 in fit: an
    accumulator in the user's step, none in the pre-pass's). Made to differ here (the pre-pass without the memory
    optimizer): the step gets the accumulators TensorFlow's own run made, node for node; an accumulator whose AddN
    is not in the pre-optimized step is left out, and said so."""
    from tflms.measure.accumulations import instantiated_accumulators
    from tflms.testing import record_run_metadata
    concrete, args, _keep = _accumulated_step()
    ours = preoptimize.preoptimized_graph_def
    monkeypatch.setattr(preoptimize, "preoptimized_graph_def",
                        lambda function, memory_optimizer=True: ours(function, memory_optimizer=False))
    assert _kinds(preoptimize.preoptimized_graph_def(concrete)[0])["TemporaryVariable"] == 0
    learned = {}

    def ran(function):
        learned.update(instantiated_accumulators(function, args, variables=concrete.graph.variables))
        return learned
    rewritten = preoptimize.preoptimize(concrete, ran=ran)
    assert len(learned) == 2
    graph = rewritten.graph.as_graph_def()
    with record_run_metadata() as plain:
        _accumulated_step()[0](*args)  # the same step, traced again: what TensorFlow runs of it
    assert _kinds(graph) == _kinds(plain.step_graph().post_optimization_graph)
    assert {p.result for p in preoptimize.accumulator_pins(rewritten)} == set(learned)
    # an accumulator whose AddN the pre-optimized step does not have stays out, with a warning
    concrete, args, _keep = _accumulated_step()
    learned.clear()
    with caplog.at_level(logging.WARNING, logger="tflms.ir.preoptimize"):
        def elsewhere(function):
            return {f"not_here/{k}": v for k, v in ran(function).items()}
        rewritten = preoptimize.preoptimize(concrete, ran=elsewhere)
    assert _kinds(rewritten.graph.as_graph_def())["TemporaryVariable"] == 0
    assert "stay AddNs" in caplog.text and "not_here/" in caplog.text


def test_a_captured_resource_that_is_not_a_variable_is_not_observed():
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=0.0)

    @tf.function
    def step(x):
        table.insert(tf.constant([1], tf.int64), x)
        return table.lookup(tf.constant([1], tf.int64))

    concrete = step.get_concrete_function(tf.constant([2.0]))
    with pytest.raises(ObservationError, match="not variables"):
        observe_accumulation_orders(concrete, [tf.constant([2.0])], {}, variables=[])


def test_an_iterator_argument_is_not_observed():
    dataset = tf.data.Dataset.range(10)

    @tf.function
    def step(iterator):
        return next(iterator)

    iterator = iter(dataset)
    concrete = step.get_concrete_function(iterator)
    with pytest.raises(ObservationError, match="iterator"):
        observe_accumulation_orders(concrete, [iterator], {}, variables=[])
    assert int(next(iterator)) == 0, "the refused observation advanced the iterator"


def test_a_busy_profiler_falls_back_to_the_usual_order_and_says_why(tmp_path, caplog):
    concrete, args, _keep = _accumulated_step()
    tf.profiler.experimental.start(str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="tflms"):
            result = rewrite_step(concrete, tflms.LMSConfig(swapout_threshold=1),
                                  example_inputs=args, build=False)
    finally:
        tf.profiler.experimental.stop()
    pins = result.report.accumulations
    assert len(pins) == 2 and {p["source"] for p in pins} == {preoptimize.ORDER_CPU_POOL}, pins
    assert all("profiler did not start" in p["why"] for p in pins), pins
    assert "profiler did not start" in caplog.text and "usual order" in caplog.text
    assert "nothing observed" in result.report.table()


#: One thread each: the executor's order is steady, so a plain step is reproducible and tflms must match it.
_STEADY_RUN = r"""
import hashlib, json, os, sys
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
import keras, tflms
from tflms.ir import preoptimize
from tflms.testing import build_model, make_batches, make_train_step, snapshot

def train(wrap):
    keras.backend.clear_session()
    model = build_model("accumulated", size=256, classes=5)
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    step = wrap(make_train_step(model, optimizer))
    losses = [step(tf.constant(x), tf.constant(y)) for x, y in make_batches(model, batch_size=4, steps=2, seed=1)]
    digest = hashlib.sha256()
    for name, value in snapshot(model, optimizer, losses=losses):
        digest.update(name.encode() + value.tobytes())
    return digest.hexdigest(), getattr(step, "report", None)

out = {"plain": train(tf.function)[0], "control": train(tf.function)[0]}
out["tflms"], report = train(lambda s: tflms.function(s, swapout_threshold=1))
out["swaps"] = len(report.swaps)
out["pins"] = [dict(p) for p in report.accumulations]
# A wrong order: each observed one with its last AssignAdd moved first (a sum of three differs only in which
# input is added last).
pin = preoptimize.pin_accumulations
def moved(graph, device, observed=None, why=""):
    return pin(graph, device, {k: [v[-1], *v[:-1]] for k, v in (observed or {}).items()}, why=why)
preoptimize.pin_accumulations = moved
out["wrong_order"] = train(lambda s: tflms.function(s, swapout_threshold=1))[0]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_steady_plain_step_with_accumulators_trains_bitwise_with_swaps():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", _STEADY_RUN], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["plain"] == out["control"], "the single-threaded plain step differs from itself: the test proves nothing"
    assert out["swaps"] > 0 and len(out["pins"]) == 2, out
    assert {p["source"] for p in out["pins"]} == {"observed"}, out["pins"]
    assert out["tflms"] == out["plain"], "tflms with swaps and the observed summation order differs from plain TF"
    # the control: the same rewrite summing in another order differs, so the comparison can fail
    assert out["wrong_order"] != out["plain"], "another summation order gave the same bits: the test proves nothing"
