"""Swaps must not change what grappler does to the user's computation (issue 10, docs/design.md).

Grappler fuses Conv2D/MatMul + BiasAdd (+ activation), turns add trees into
``AddN`` and reorders commutative inputs by name; a swap-out adds a consumer and
a swap-in renames an input, which changed its decisions and broke bitwise
training. tflms now runs grappler before the rewrite and runs the rewrite with
grappler off (:mod:`tflms.ir.preoptimize`). Each model below holds one pattern;
for each we check, with swapout_threshold=1:

1. weights and optimizer state after 2 steps are bitwise those of plain TF (and
   plain TF equals itself: the control);
2. from the run metadata, the op-type counts of what TF ran equal the plain run's
   (swap ops aside), node for node the graph is the plain one (a swap-in read as
   the tensor it brings back), the partition graphs (after oneDNN's graph pass)
   hold the same op types, and every swap op is alive in it;
3. the old path (no grappler first) does change the counts on the Conv2D+BiasAdd
   pattern: the test can fail.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import tflms
import tflms.keras
from tflms.errors import GraphError
from tflms.ir import preoptimize
from tflms.testing import Snapshot, assert_bitwise_equal, make_train_step, snapshot

BATCH = 4
STEPS = 2
#: Ops that exist only on one side for reasons other than the rewrite: function plumbing, and the iterator ops
#: of Keras's multi_step_on_iterator (the plain fit runs the step inlined there; LMS calls it directly).
PLUMBING = frozenset({"_Arg", "_Retval", "NoOp", "IteratorGetNext", "OptionalFromValue", "OptionalNone"})


# --------------------------------------------------------------------- models, one grappler pattern each
def _conv_bias_relu():
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)  # remapper: _FusedConv2D
    h = keras.layers.Conv2D(4, 3, padding="same")(h)  # Conv2D + BiasAdd
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (8, 8, 3)


def _matmul_bias():
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inp)  # remapper: _FusedMatMul (BiasAdd, Relu)
    h = keras.layers.Dense(32)(h)  # _FusedMatMul (BiasAdd)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Activation("tanh")(h))), (16,)


def _add_tree():
    inp = keras.Input((16,))
    branches = [keras.layers.Dense(16, activation="tanh")(inp) for _ in range(4)]
    h = keras.layers.Add()(branches)  # arithmetic optimizer: an add tree becomes AddN
    return keras.Model(inp, keras.layers.Dense(5)(h)), (16,)


def _residual():
    inp = keras.Input((16,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    for _ in range(2):
        h = keras.layers.Add()([h, keras.layers.Dense(16, activation="relu")(h)])  # residual: AddN of gradients
    return keras.Model(inp, keras.layers.Dense(5)(h)), (16,)


def _layer_norm():
    inp = keras.Input((6, 16))
    h = keras.layers.LayerNormalization()(keras.layers.Dense(16)(inp))
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (6, 16)


def _gelu_dense():
    inp = keras.Input((6, 16))
    h = keras.layers.Dense(32, activation="gelu")(inp)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (6, 16)


def _mha_block():
    inp = keras.Input((6, 16))
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([inp, a]))
    h = keras.layers.Dense(32, activation="gelu")(h)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (6, 16)


def _normalized_swish():
    inp = keras.Input((8, 8, 3))
    # Normalization's mean and variance are small eager tensors: the step captures them by value, as Const
    # function inputs (EfficientNet*, ConvNeXt*); the swish activations become oneDNN's _MklSwish.
    h = keras.layers.Normalization(mean=[0.5, 0.4, 0.3], variance=[0.2, 0.3, 0.4])(inp)
    h = keras.layers.Conv2D(4, 3, padding="same", activation="swish")(h)
    h = keras.layers.Conv2D(4, 3, padding="same", activation="swish")(h)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (8, 8, 3)


def _max_pool():
    inp = keras.Input((12, 12, 3))
    # Overlapping max pools after relu (ties): oneDNN's MaxPoolGrad uses the forward op's workspace, TensorFlow's
    # own kernel does not, and they differ in the last bits (NASNetMobile's reduction cells).
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    h = keras.layers.MaxPooling2D(3, strides=2, padding="same")(h)
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D(3, strides=2, padding="same")(h)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h))), (12, 12, 3)


MODELS = {"conv_bias_relu": _conv_bias_relu, "matmul_bias": _matmul_bias, "add_tree": _add_tree,
          "residual": _residual, "layer_norm": _layer_norm, "gelu_dense": _gelu_dense, "mha_block": _mha_block,
          "normalized_swish": _normalized_swish, "max_pool": _max_pool}


def build(kind: str):
    keras.backend.clear_session()  # the same layer names in every run (grappler sorts by name)
    keras.utils.set_random_seed(0)
    model, shape = MODELS[kind]()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH * STEPS,) + shape).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, BATCH * STEPS)]
    return model, x, y


# --------------------------------------------------------------------- what TF ran
@contextlib.contextmanager
def run_metadata():
    """Collects the function graphs TF reports (at instantiation, so over every call) into the yielded list."""
    ctx = context.context()
    ctx.enable_run_metadata()
    ctx.export_run_metadata()  # drop graphs of earlier tests
    graphs: list = []
    try:
        yield graphs
    finally:
        graphs.extend(ctx.export_run_metadata().function_graphs)
        ctx.disable_run_metadata()


def step_graph(graphs):
    """The post-optimization graph of the training step: the largest function TF instantiated."""
    assert graphs, "TensorFlow reported no function graphs"
    return max((g.post_optimization_graph for g in graphs), key=lambda g: len(g.node))


def op_counts(graph_def, swap_ops=()) -> collections.Counter:
    """Op types TF ran, without plumbing, swap ops and the Identity ops that return the function's outputs
    (Keras's plain fit inlines the step into multi_step_on_iterator, where they disappear)."""
    skip = set(swap_ops)
    nodes = {n.name: n for n in graph_def.node}
    for n in graph_def.node:
        if n.op == "_Retval" and n.input and nodes.get(n.input[0].split(":")[0], n).op == "Identity":
            skip.add(n.input[0].split(":")[0])
    return collections.Counter(n.op for n in graph_def.node if n.op not in PLUMBING and n.name not in skip)


def assert_same_counts(plain: collections.Counter, lms: collections.Counter, what: str) -> None:
    diff = {op: (plain[op], lms[op]) for op in sorted(set(plain) | set(lms)) if plain[op] != lms[op]}
    assert not diff, f"{what}: op types TF ran differ (plain, with swaps): {diff}"


def assert_same_graph(plain, lms, swap_ops) -> None:
    """Every node of what TF ran with swaps is the plain run's node: op, data inputs (a swap-in read as the tensor it
    brings back), attributes and device. Arguments are matched by index (the rewritten function names its captured
    inputs differently); control inputs aside (the swaps add some)."""
    swaps = set(swap_ops)
    lms_nodes = {n.name: n for n in lms.node}

    def args(graph):
        return {n.name: f"<arg {n.attr['index'].i}>" for n in graph.node if n.op == "_Arg"}

    plain_args, lms_args = args(plain), args(lms)

    def source(ref: str, arg_names, follow_swaps: bool) -> str:
        name, _, index = ref.partition(":")
        while follow_swaps and name in swaps:  # swap-in -> swap-out -> the swapped tensor
            name, _, index = lms_nodes[name].input[0].partition(":")
        return arg_names.get(name, name) + (":" + index if index else "")

    def key(node, arg_names, follow_swaps):
        data = tuple(source(i, arg_names, follow_swaps) for i in node.input if not i.startswith("^"))
        attrs = {k: v.SerializeToString() for k, v in node.attr.items()}
        return node.op, data, attrs, node.device

    plain_nodes = {n.name: key(n, plain_args, False) for n in plain.node if n.op not in ("_Arg", "_Retval")}
    lms_keys = {n.name: key(n, lms_args, True) for n in lms.node
                if n.op not in ("_Arg", "_Retval") and n.name not in swaps}
    assert sorted(plain_nodes) == sorted(lms_keys), (sorted(set(plain_nodes) ^ set(lms_keys)))[:10]
    differ = [name for name in plain_nodes if plain_nodes[name] != lms_keys[name]]
    assert not differ, [(name, plain_nodes[name][:2], lms_keys[name][:2]) for name in differ[:3]]


def assert_swaps_alive(graph_def, report) -> None:
    assert report.num_swapped > 0, f"nothing was swapped, the test proves nothing:\n{report.table()}"
    names = {n.name for n in graph_def.node}
    missing = [n for n in report.inserted_ops if n not in names]
    assert not missing, f"{len(missing)} of {len(report.inserted_ops)} swap ops are not in what TF ran: {missing[:5]}"


def state(model) -> Snapshot:
    """Every variable of the model (seed states too) and of its optimizer, named."""
    return snapshot(variables=[*model.variables, *model.optimizer.variables])


# --------------------------------------------------------------------- tflms.function
def _tape_run(kind: str, wrap: Callable):
    """2 GradientTape steps of ``kind`` with rmsprop; returns (state, function graphs, wrapped step)."""
    model, x, y = build(kind)
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    model.optimizer = optimizer
    fn = wrap(make_train_step(model, optimizer, keras.losses.CategoricalCrossentropy(from_logits=True)))
    with run_metadata() as graphs:
        for i in range(STEPS):
            fn(tf.constant(x[i * BATCH:(i + 1) * BATCH]), tf.constant(y[i * BATCH:(i + 1) * BATCH]))
    return state(model), graphs, fn


def _lms(step):
    return tflms.function(step, swapout_threshold=1, swapin_ahead=1)


# matmul_bias and layer_norm are also inside gelu_dense and mha_block: the quick tier runs the larger ones
# (normalized_swish and max_pool have their own quick tests below: captured constants, the oneDNN workspace)
QUICK = {"conv_bias_relu", "add_tree", "residual", "gelu_dense", "mha_block"}


@pytest.mark.parametrize("kind", [k if k in QUICK else pytest.param(k, marks=pytest.mark.slow) for k in sorted(MODELS)])
def test_function_is_bitwise_and_runs_the_same_ops(kind, caplog):
    plain, plain_graphs, _ = _tape_run(kind, tf.function)
    again, _, _ = _tape_run(kind, tf.function)
    assert_bitwise_equal(plain, again, f"{kind}: plain tf.function vs itself (the control)")
    with caplog.at_level(logging.WARNING, logger=preoptimize.__name__):
        lms, lms_graphs, fn = _tape_run(kind, _lms)
    fallbacks = [r.getMessage() for r in caplog.records if r.name == preoptimize.__name__]
    assert not fallbacks, f"{kind}: the grappler pre-pass fell back: {fallbacks}"
    ran = step_graph(lms_graphs)
    assert_swaps_alive(ran, fn.report)
    assert_same_counts(op_counts(step_graph(plain_graphs)), op_counts(ran, fn.report.inserted_ops), kind)
    assert_same_graph(step_graph(plain_graphs), ran, fn.report.inserted_ops)
    assert_same_counts(_partition_counts(plain_graphs), _partition_counts(lms_graphs), f"{kind} after oneDNN's pass")
    assert_bitwise_equal(plain, lms, f"{kind}: tflms.function(swapout_threshold=1) vs tf.function")


@pytest.fixture
def old_path(monkeypatch):
    """The rewrite as it was before issue 10: swaps on the traced graph, grappler at instantiation."""
    monkeypatch.setattr(preoptimize, "preoptimize", lambda concrete, observe=None, ran=None: concrete)


def test_old_path_changes_what_grappler_does(old_path):
    """Negative control: without grappler first, a swap-out blocks the remapper's Conv2D + BiasAdd fusion."""
    kind = "conv_bias_relu"
    plain, plain_graphs, _ = _tape_run(kind, tf.function)
    _, lms_graphs, fn = _tape_run(kind, _lms)
    plain_counts = op_counts(step_graph(plain_graphs))
    old_counts = op_counts(step_graph(lms_graphs), fn.report.inserted_ops)
    assert fn.report.num_swapped > 0
    assert plain_counts["_FusedConv2D"] > old_counts["_FusedConv2D"], (plain_counts, old_counts)
    with pytest.raises(AssertionError, match="op types TF ran differ"):
        assert_same_counts(plain_counts, old_counts, kind)
    with pytest.raises(AssertionError):
        assert_same_graph(step_graph(plain_graphs), step_graph(lms_graphs), fn.report.inserted_ops)


def test_captured_constants_are_arguments_for_the_pre_pass(old_path):
    """The Const-input case is real in ``normalized_swish``, and without the pre-pass its swaps break bitwise.

    (With the pre-pass it is bitwise with the same ops and no fallback:
    ``test_function_is_bitwise_and_runs_the_same_ops[normalized_swish]``.)
    """
    model, x, y = build("normalized_swish")
    step = tf.function(make_train_step(model, keras.optimizers.RMSprop(0.01),
                                       keras.losses.CategoricalCrossentropy(from_logits=True)))
    concrete = step.get_concrete_function(tf.constant(x[:BATCH]), tf.constant(y[:BATCH]))
    assert "Const" in {t.op.type for t in concrete.graph.inputs}, [t.op.type for t in concrete.graph.inputs]
    _, plain_graphs, _ = _tape_run("normalized_swish", tf.function)
    _, lms_graphs, fn = _tape_run("normalized_swish", _lms)
    plain_counts = op_counts(step_graph(plain_graphs))
    old_counts = op_counts(step_graph(lms_graphs), fn.report.inserted_ops)
    assert fn.report.num_swapped > 0
    assert plain_counts != old_counts, plain_counts  # with oneDNN: _MklSwish 2 -> 0, Sigmoid 2 -> 4


def _partition_counts(graphs) -> collections.Counter:
    """Op types of the step after oneDNN's graph pass (partition graphs), swap ops aside."""
    step = max(graphs, key=lambda g: len(g.post_optimization_graph.node))
    return collections.Counter(n.op for g in step.partition_graphs for n in g.node
                               if not n.name.startswith("lms/") and n.op not in PLUMBING)


def test_max_pool_gradients_keep_the_onednn_workspace(monkeypatch):
    """A MaxPool output its MaxPoolGrad reads is never swapped on a oneDNN CPU, and the swap would break bitwise.

    oneDNN's graph pass rewrites ``MaxPoolGrad`` to ``_MklNativeMaxPoolGrad`` (with the forward op's workspace)
    only when it reads the ``MaxPool`` output directly. The positive case (bitwise, same ops, swaps alive) is
    ``test_function_is_bitwise_and_runs_the_same_ops[max_pool]``; here the partition graphs and the control.
    """
    from tflms._compat.tf import onednn_enabled
    from tflms.policies import swapplan
    if not onednn_enabled():
        pytest.skip("oneDNN is off in this TensorFlow (TF_ENABLE_ONEDNN_OPTS=0 or a non-x86 build)")
    plain, plain_graphs, _ = _tape_run("max_pool", tf.function)
    lms, lms_graphs, fn = _tape_run("max_pool", _lms)
    reasons = {str(s.tensor): s.reason for s in fn.report.plan.skipped}
    assert sorted(r for r in reasons.values() if r == "onednn-workspace") == ["onednn-workspace"] * 2, reasons
    plain_parts, lms_parts = _partition_counts(plain_graphs), _partition_counts(lms_graphs)
    assert plain_parts["_MklNativeMaxPoolGrad"] == 2 and lms_parts == plain_parts, (plain_parts, lms_parts)
    # a plan that swaps them anyway (as one made for a profile's GPU does): the build rewires the gradients to the
    # MaxPool outputs on this oneDNN CPU (tflms.passes.workspace), and the step trains bitwise
    monkeypatch.setattr(swapplan, "_onednn_workspace_reader", lambda *args: None)
    rewired, rewired_graphs, fn = _tape_run("max_pool", _lms)
    assert not any(s.reason == "onednn-workspace" for s in fn.report.plan.skipped)
    assert _partition_counts(rewired_graphs) == plain_parts and any("workspace" in w for w in fn.report.plan.warnings)
    assert_bitwise_equal(plain, rewired, "max_pool with the MaxPool outputs swapped and the gradients rewired")
    # the control: without the rewiring, TensorFlow's MaxPoolGrad runs, and the weights differ
    import tflms.pipeline
    from tflms.passes.result import PassResult
    monkeypatch.setattr(tflms.pipeline, "keep_workspace_edges", lambda graph, runs: PassResult(graph, False, ()))
    swapped, swapped_graphs, fn = _tape_run("max_pool", _lms)
    assert _partition_counts(swapped_graphs)["MaxPoolGrad"] == 2
    with pytest.raises(AssertionError):
        assert_bitwise_equal(plain, swapped, "max_pool with the MaxPool outputs swapped")


def _accumulated():
    """The kit's accumulated model (tflms.testing.models): its sum and the gradient of its ReLU map are AddNs of three
    64 MiB tensors at batch 4, which grappler's memory optimizer turns into TemporaryVariable accumulators."""
    from tflms.testing import build_model
    return build_model("accumulated", classes=5), (256, 256, 3)


def _accumulators(graph_def) -> dict[str, list]:
    """Each accumulator's result name -> its AssignAdd nodes."""
    nodes = [n for n in graph_def.node if n.op == "AssignAdd" and "/tmp_var_accum_" in n.name]
    return {r.name: [n for n in nodes if n.name.startswith(r.name + "/")]
            for r in graph_def.node if r.op == preoptimize.ACCUMULATOR_RESULT_TYPE}


def test_the_pre_pass_takes_the_accumulators_tensorflow_makes(caplog, monkeypatch):
    """Grappler's choice of an accumulator follows a schedule its cost model predicts, and differences between the
    pre-pass and instantiation can tip it either way (keras.applications ResNet50 at 64x64, batch 4: the pre-pass
    made one, TensorFlow none; at 96x96 in fit, on another machine, the reverse). Told which accumulators
    TensorFlow's own run of the step made, the pre-pass keeps its own where they are the same, and otherwise takes
    TensorFlow's (none, or some of them); where it cannot tell, it keeps its own and says so."""
    from tflms.errors import TflmsError
    from tflms.measure.accumulations import ObservationError, instantiated_accumulators
    caplog.set_level(logging.INFO, logger="tflms")
    monkeypatch.setitem(MODELS, "accumulated", _accumulated)
    model, x, y = build("accumulated")
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    args = (tf.constant(x[:BATCH]), tf.constant(y[:BATCH]))
    step = tf.function(make_train_step(model, optimizer, keras.losses.CategoricalCrossentropy(from_logits=True)))
    concrete = step.get_concrete_function(*args)
    made = instantiated_accumulators(concrete, args, variables=concrete.graph.variables)
    assert len(made) == 2

    def pre(ran):  # a new trace each time: the pre-pass keeps one result per traced function
        step = tf.function(make_train_step(model, optimizer, keras.losses.CategoricalCrossentropy(from_logits=True)))
        return _accumulators(preoptimize.preoptimize(step.get_concrete_function(*args), ran=ran).graph.as_graph_def())

    assert len(pre(None)) == 2  # the control: unchecked, the pre-pass makes them (as TensorFlow does for this step)
    assert len(pre(lambda function: made)) == 2
    assert "as TensorFlow's own run of the step made them" not in caplog.text  # the same: nothing to take
    assert not pre(lambda function: {})
    assert "as TensorFlow's own run of the step made them: none" in caplog.text
    first = sorted(made)[0]
    assert len(pre(lambda function: {first: made[first]})) == 1  # TensorFlow made one of them: that one

    def busy(function):
        raise ObservationError("the trial call failed")

    assert issubclass(ObservationError, TflmsError) and len(pre(busy)) == 2
    said = [r for r in caplog.records if "could not learn which grappler accumulators" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]  # its own accumulators' order is a guess: a warning
    caplog.clear()
    monkeypatch.setattr(preoptimize.compat, "CPU_DEVICE_MEMORY_LIMIT", 0)  # the pre-pass makes none
    assert not pre(busy)
    said = [r for r in caplog.records if "could not learn which grappler accumulators" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]  # most such steps get none: said, not warned


def test_pre_pass_makes_grappler_accumulators_and_pins_their_order(monkeypatch):
    """The pre-pass gives grappler the device memory instantiation gives it, so the memory optimizer makes the
    same accumulators as in the user's step, and tflms orders their AssignAdds as this machine's executor ran them
    in one observed call (what TF ran says all three).

    Not bitwise here: with default threads this model's own step sums racily (docs/design.md, "Exceptions to
    bitwise"); with one thread it is steady and tflms matches it (tests/test_accumulations.py).
    """
    monkeypatch.setitem(MODELS, "accumulated", _accumulated)
    _, plain_graphs, _ = _tape_run("accumulated", tf.function)
    plain = step_graph(plain_graphs)
    assert len(_accumulators(plain)) == 2, "grappler made no accumulator: the test proves nothing"
    _, lms_graphs, fn = _tape_run("accumulated", _lms)
    ran = step_graph(lms_graphs)
    assert_swaps_alive(ran, fn.report)
    assert_same_counts(op_counts(plain), op_counts(ran, fn.report.inserted_ops), "accumulated")
    pins = {p["result"]: p for p in fn.report.accumulations}
    assert sorted(pins) == sorted(_accumulators(ran)), (sorted(pins), sorted(_accumulators(ran)))
    for result, adds in _accumulators(ran).items():
        assert pins[result]["source"] == preoptimize.ORDER_OBSERVED, pins[result]
        order = pins[result]["order"]
        assert sorted(order) == sorted(a.name for a in adds) and len(order) == 3, (result, order)
        nodes = {a.name: a for a in adds}
        for earlier, later in zip(order, order[1:]):  # each AssignAdd waits for the one observed before it
            assert "^" + earlier in nodes[later].input, (later, list(nodes[later].input))
    assert "accumulators: 2 grappler accumulator(s), summation order 2 observed" in fn.report.table()
    # a device of unknown memory (what the pre-pass gave grappler before): the pre-pass makes no accumulator, and
    # the step still gets TensorFlow's two, taken from its own run of the step
    monkeypatch.setattr(preoptimize.compat, "CPU_DEVICE_MEMORY_LIMIT", 0)
    model, x, y = build("accumulated")
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer, keras.losses.CategoricalCrossentropy(from_logits=True)))
    assert not _accumulators(preoptimize.preoptimized_graph_def(
        step.get_concrete_function(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])))[0])
    _, unknown_graphs, fn = _tape_run("accumulated", _lms)
    assert sorted(_accumulators(step_graph(unknown_graphs))) == sorted(_accumulators(plain))
    assert len(fn.report.accumulations) == 2


@pytest.mark.slow
@pytest.mark.real_model
def test_pre_pass_takes_instantiations_accumulators_where_the_cost_model_tips_otherwise(monkeypatch):
    """Issue 30: grappler's memory optimizer decides on an accumulator from a schedule its cost model predicts with
    the CPU's cores x frequency. The pre-pass read the frequency from /proc/cpuinfo's 'cpu MHz' line, TensorFlow
    reads half the bogomips: where they differed, tflms's step summed an AddN in an accumulator the user's did not
    have (ResNet50 at 96x96: 319 of 320 weights differed). Now the pre-pass describes each CPU with TensorFlow's own
    figures (tests/test_compat.py). Those alone do not make its decision instantiation's: the decision is not
    monotonic in the figures (this model here: an accumulator at 2300 and 4000 MHz, none at 2596 and 3600), and
    small differences between the pre-pass's graph and instantiation's tip it (CI's machine, 2026-12-01:
    TensorFlow made one, the unchecked pre-pass none). So the step tflms rewrites takes the accumulators
    TensorFlow's own run made (the ``ran`` check): here at the real figures, and at a frequency where the
    unchecked pre-pass decides otherwise."""
    from tflms._compat import grappler as compat_grappler
    from tflms.measure.accumulations import instantiated_accumulators
    from tflms.testing import record_run_metadata
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(96, 96, 3), classes=5,
                                        classifier_activation=None)
    optimizer = keras.optimizers.RMSprop()
    optimizer.build(model.trainable_variables)
    x, y = tf.random.normal([2, 96, 96, 3], seed=1), tf.zeros([2], tf.int32)

    fn = tf.function(make_train_step(model, optimizer))
    with record_run_metadata() as ran:
        fn(x, y)
    kinds = ("AddN", "AssignAdd", "TemporaryVariable", "DestroyTemporaryVariable")

    def counts(graph_def):
        return {k: sum(n.op == k for n in graph_def.node) for k in kinds}

    plain = counts(ran.step_graph().post_optimization_graph)
    concrete = tf.function(make_train_step(model, optimizer)).get_concrete_function(x, y)
    made = instantiated_accumulators(concrete, (x, y), variables=concrete.graph.variables)
    assert len(made) == plain["DestroyTemporaryVariable"], (sorted(made), plain)

    def rewritten():
        preoptimize._PREOPTIMIZED.pop(concrete, None)  # the pre-pass keeps one result per traced function
        return counts(preoptimize.preoptimize(concrete, ran=lambda function: made).graph.as_graph_def())

    unchecked = counts(preoptimize.preoptimized_graph_def(concrete)[0])
    assert rewritten() == plain, f"unchecked pre-pass {unchecked}"
    tensorflows_properties = compat_grappler._tf_properties
    for mhz in (1000, 4000, 8000):
        def at(device_type, index, mhz=mhz):
            props = tensorflows_properties(device_type, index)
            if props is not None and device_type == "CPU":
                props.frequency = mhz
            return props
        monkeypatch.setattr(compat_grappler, "_tf_properties", at)
        decided = counts(preoptimize.preoptimized_graph_def(concrete)[0])
        if decided != unchecked:  # the control: the figures move the decision
            assert rewritten() == plain, (mhz, decided)
            break
    else:
        pytest.fail(f"no frequency changed grappler's accumulators (unchecked {unchecked}): the control proves nothing")


def test_pin_accumulations_follows_the_executors_order_per_device():
    """GPU: inline in graph order; CPU: the order observed, else the last inline and the rest LIFO from the pool
    (reverse graph order)."""
    from tflms.testing.graphs import GraphBuilder

    def accumulator(device: str):
        b = GraphBuilder()
        grads = [b.op(f"g{i}", "Mul") for i in range(3)]
        b.op("acc/tmp_var", "TemporaryVariable", control=["g1"])
        init = b.op("acc/tmp_var_initializer", "Assign", ["acc/tmp_var:0", "g0"])
        adds = [b.op(f"acc/tmp_var_accum_{i}", "AssignAdd", [init, g]).op for i, g in enumerate(grads)]
        b.op("acc", preoptimize.ACCUMULATOR_RESULT_TYPE, [init], control=adds)
        b.op("other", "AddN", grads)  # an AddN left alone
        b.graph.op("acc").device = device
        return b.graph

    def edges(graph):
        return sorted((int(src[-1]), int(op.name[-1])) for op in graph.ops if op.type == "AssignAdd"
                      for src in op.control_inputs)

    cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
    observed = {"acc": ["acc/tmp_var_accum_2", "acc/tmp_var_accum_0", "acc/tmp_var_accum_1"]}
    for device, seen, expected, source in [
            ("/device:GPU:0", None, [(0, 1), (1, 2)], preoptimize.ORDER_GPU_INLINE),
            ("/device:GPU:0", observed, [(0, 1), (1, 2)], preoptimize.ORDER_GPU_INLINE),  # a GPU is not observed
            ("/device:CPU:0", None, [(2, 1), (1, 0)], preoptimize.ORDER_CPU_POOL),
            ("", None, [(2, 1), (1, 0)], preoptimize.ORDER_CPU_POOL),
            ("/device:CPU:0", observed, [(2, 0), (0, 1)], preoptimize.ORDER_OBSERVED)]:
        graph = accumulator(device)
        [pin] = preoptimize.pin_accumulations(graph, cpu, seen, why="no call")
        assert edges(graph) == sorted(expected), (device, seen, edges(graph))
        assert pin.result == "acc" and pin.source == source, pin
        assert pin.why == ("no call" if source == preoptimize.ORDER_CPU_POOL else ""), pin
        assert graph.op("other").control_inputs == []
    assert preoptimize.pin_accumulations(accumulator("/device:GPU:0"), "")[0].source == preoptimize.ORDER_GPU_INLINE
    # an order that varied between the observed calls is pinned as observed (the last call's) and said to race
    from tflms.measure.accumulations import ObservedOrders
    racy = ObservedOrders(observed)
    racy.racy = frozenset({"acc"})
    graph = accumulator("/device:CPU:0")
    [pin] = preoptimize.pin_accumulations(graph, cpu, racy)
    assert edges(graph) == [(0, 1), (2, 0)] and pin.source == preoptimize.ORDER_OBSERVED_RACY and "race" in pin.why
    with pytest.raises(GraphError, match="acc/tmp_var_accum_9"):
        preoptimize.pin_accumulations(accumulator("/device:CPU:0"), cpu, {"acc": ["acc/tmp_var_accum_9"]})


def test_preoptimized_step_keeps_fused_ops_and_the_simulator_costs_them():
    """The graph tflms rewrites holds grappler's fused ops, with shapes; the cost model gives them FLOPs."""
    from tflms.ir import tf_io
    from tflms.sim.cost import op_flops
    model, x, y = build("conv_bias_relu")
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    concrete = step.get_concrete_function(tf.constant(x[:BATCH]), tf.constant(y[:BATCH]))
    graph = tf_io.from_concrete_function(preoptimize.preoptimize(concrete))
    fused = [op for op in graph if op.type == "_FusedConv2D"]
    assert fused, sorted({op.type for op in graph})
    conv = fused[0]
    assert conv.outputs[0].shape == (BATCH, 8, 8, 4)
    # 2 * output elements * (3*3*3 or 3*3*4 multiply-adds) + one pass per fused op (BiasAdd, Relu...)
    kernel = graph.tensor(conv.inputs[1]).shape
    expected = 2.0 * BATCH * 8 * 8 * 4 * kernel[0] * kernel[1] * kernel[2]
    assert op_flops(graph, conv) >= expected + BATCH * 8 * 8 * 4


# --------------------------------------------------------------------- Keras fit + LMS
def _fit(kind: str, callbacks):
    model, x, y = build(kind)
    model.compile(optimizer="rmsprop", loss="categorical_crossentropy")
    with run_metadata() as graphs:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return state(model), graphs


@pytest.mark.parametrize("kind", ["conv_bias_relu"])  # the MHA block runs through tflms.function above
def test_keras_fit_is_bitwise_and_runs_the_same_ops(kind):
    plain, plain_graphs = _fit(kind, [])
    again, _ = _fit(kind, [])
    assert_bitwise_equal(plain, again, f"{kind}: plain fit vs itself (the control)")
    callback = tflms.keras.LMS(swapout_threshold=1, swapin_ahead=1, verbose=0)
    lms, lms_graphs = _fit(kind, [callback])
    ran = step_graph(lms_graphs)
    assert_swaps_alive(ran, callback.report)
    assert_same_counts(op_counts(step_graph(plain_graphs)), op_counts(ran, callback.report.inserted_ops), kind)
    assert_bitwise_equal(plain, lms, f"{kind}: fit + LMS(swapout_threshold=1) vs fit")


# --------------------------------------------------------------------- SavedModel
class _ConvTrainer(tf.Module):
    def __init__(self):
        super().__init__()
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        self.model, _ = _conv_bias_relu()
        self.optimizer = keras.optimizers.RMSprop(0.01)
        self.optimizer.build(self.model.trainable_variables)
        self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([BATCH, 8, 8, 3], tf.float32),
                                  tf.TensorSpec([BATCH, 5], tf.float32)])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self.model(x, training=True))
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss


def test_saved_model_keeps_fused_ops_and_trains_bitwise(tmp_path):
    """The saved rewrite holds grappler's fused ops, reloads, and trains like the original SavedModel."""
    from tflms.integrations import savedmodel
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    tf.saved_model.save(_ConvTrainer(), str(in_dir))
    result = savedmodel.rewrite_saved_model(in_dir, out_dir, tflms.LMSConfig(swapout_threshold=1, swapin_ahead=1))
    assert result.rewritten, result
    original, rewritten = tf.saved_model.load(str(in_dir)), tf.saved_model.load(str(out_dir))
    (cf,) = rewritten.train.concrete_functions
    types = collections.Counter(op.type for op in cf.graph.get_operations())
    assert types["_FusedConv2D"] >= 1 and any(op.name.startswith("lms/") for op in cf.graph.get_operations())
    _, x, y = build("conv_bias_relu")
    losses_a, losses_b = [], []
    for i in range(STEPS):
        xb, yb = tf.constant(x[i * BATCH:(i + 1) * BATCH]), tf.constant(y[i * BATCH:(i + 1) * BATCH])
        losses_a.append(original.train(xb, yb))
        losses_b.append(rewritten.train(xb, yb))
    vars_a, vars_b = savedmodel._variables(original), savedmodel._variables(rewritten)  # noqa: SLF001
    assert sorted(vars_a) == sorted(vars_b)
    assert_bitwise_equal(snapshot(variables=[vars_a[p] for p in sorted(vars_a)], losses=losses_a),
                         snapshot(variables=[vars_b[p] for p in sorted(vars_a)], losses=losses_b),
                         f"rewritten SavedModel vs original after {STEPS} steps")


# --------------------------------------------------------------------- loops: the documented fallback
def _loop_step():
    """A step whose forward pass runs a Dense layer in a tf.while_loop, its model and its optimizer."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    dense, head = keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(5)
    inp = keras.Input((16,))
    model = keras.Model(inp, head(dense(inp)))
    optimizer = keras.optimizers.RMSprop(0.01)
    optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, dense(h) + h), (tf.constant(0), x))[1]
            loss = tf.reduce_mean(tf.square(head(h) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return model, optimizer, step


def _loop_run(wrap) -> Snapshot:
    model, optimizer, step = _loop_step()
    fn = wrap(step)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH * STEPS, 16)).astype("float32")
    y = rng.standard_normal((BATCH * STEPS, 5)).astype("float32")
    losses = [fn(tf.constant(x[i:i + BATCH]), tf.constant(y[i:i + BATCH])) for i in range(0, BATCH * STEPS, BATCH)]
    return snapshot(variables=[*model.variables, *optimizer.variables], losses=losses)


@pytest.mark.slow
def test_while_loop_steps_fall_back_because_tflms_cannot_read_lowered_loops(caplog):
    """docs/design.md, "Exceptions to bitwise": why a step with a loop is rewritten before grappler.

    Grappler lowers the ``While`` into Enter/Exit/NextIteration frames, and that lowered graph is what TF runs:
    built into a function and run with grappler off it trains bitwise like plain TF (so the pre-pass itself
    matches instantiation). What is missing is tflms's side: its analysis needs a DAG and refuses the frames.
    """
    from tflms.analysis.cto import analyze_graph
    from tflms.errors import GraphError, UnsupportedGraphError
    from tflms.ir import tf_io
    from tflms._compat import grappler as compat_grappler

    with caplog.at_level(logging.WARNING, logger=preoptimize.__name__):
        _loop_run(_lms)
    assert any("lowered the control flow" in r.getMessage() for r in caplog.records), caplog.records

    def preoptimized(step):
        traced, built = tf.function(step), {}

        def call(x, y):
            if not built:
                concrete = traced.get_concrete_function(x, y)
                graph_def, outputs = preoptimize.preoptimized_graph_def(concrete)
                assert {n.op for n in graph_def.node} & preoptimize.LOWERED_CONTROL_FLOW_TYPES
                assert not {n.op for n in graph_def.node} & {"While", "StatelessWhile"}
                graph = tf_io.from_graph_def(graph_def)
                with pytest.raises(UnsupportedGraphError, match="Enter"):
                    analyze_graph(graph)
                with pytest.raises(GraphError, match="cycle"):
                    graph.topological_order()
                graph.signature = dataclasses.replace(tf_io.signature_of(concrete), output_names=outputs)
                built["fn"] = compat_grappler.mark_grappler_done(tf_io.to_concrete_function(graph, concrete))
            return built["fn"](x, y)

        return call

    plain = _loop_run(tf.function)
    assert_bitwise_equal(plain, _loop_run(tf.function), "loop step: plain vs itself (the control)")
    assert_bitwise_equal(plain, _loop_run(preoptimized), "loop step: grappler's lowered graph run with grappler off")
