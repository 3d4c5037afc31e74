"""Property-based tests (hypothesis): random training steps under random LMSConfigs.

Two families:

- IR-only (no TensorFlow, >= 1000 examples per run): random training-step
  graphs, built like :func:`tflms.testing.mlp_training_graph` but as random DAGs
  (dense, conv, elementwise, add, concat, normalization-like ops; branches and
  residuals), rewritten by :func:`tflms.rewrite` under random configs. The
  rewritten graph is lint-clean and acyclic, the input graph is left untouched,
  and rewriting is deterministic (same graph + config => identical serialized
  output).
- TensorFlow (``TFLMS_FUZZ_EXAMPLES`` examples, default 10): random Keras DAGs
  and optimizers; 2 steps of ``tflms.function`` are bitwise identical to 2 steps
  of ``tf.function``.

Examples are derandomized (same examples every run); TFLMS_FUZZ_SHRINK=1 turns
on shrinking for the TensorFlow property (off by default: each shrink step
trains two models). Every failure hypothesis has found is kept as a named
regression test. The TensorFlow failures it found were issue 10 (swap-outs
changed what grappler fuses and how it sums); the named regressions pin the fix
(the pipeline rewrites the graph grappler already optimized).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

import tflms
from tflms.config import LMSConfig
from tflms.ir.graph import Graph, TensorRef
from tflms.policies.eligibility import is_clone, swapping_clones
from tflms.testing import GraphBuilder

#: TensorFlow examples per run (each trains two small models for two steps).
TF_EXAMPLES = int(os.environ.get("TFLMS_FUZZ_EXAMPLES", "10"))
#: IR-only examples per run (fast: no TensorFlow); never fewer than 1000.
IR_EXAMPLES = max(1000, int(os.environ.get("TFLMS_FUZZ_IR_EXAMPLES", "1000")))

IR_SETTINGS = settings(max_examples=IR_EXAMPLES, derandomize=True, deadline=None, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------ configs
@st.composite
def lms_configs(draw, *, accelerator: str | None = "/device:GPU:0", max_threshold: int = 5,
                min_bytes: tuple[int, ...] = (0, 64, 1024, 16384)) -> LMSConfig:
    return LMSConfig(swapout_threshold=draw(st.integers(1, max_threshold)), swapin_ahead=draw(st.integers(1, 4)),
                     swapin_groupby=draw(st.integers(0, 3)), sync_mode=draw(st.integers(0, 3)),
                     min_swap_bytes=draw(st.sampled_from(min_bytes)), accelerator_device=accelerator)


# ------------------------------------------------------- IR training graphs
#: forward op kinds: (forward op type, number of activation inputs, has a weight).
IR_KINDS = {
    "dense": ("MatMul", 1, True), "conv": ("Conv2D", 1, True), "relu": ("Relu", 1, False),
    "tanh": ("Tanh", 1, False), "mul": ("Mul", 2, False), "add": ("AddV2", 2, False),
    "concat": ("ConcatV2", 2, False), "norm": ("FusedBatchNormV3", 1, True)}
#: backward op type producing the gradient w.r.t. an activation input, and whether it reads the op's output
#: (ReluGrad, TanhGrad) instead of its inputs.
IR_INPUT_GRAD = {"dense": ("MatMul", False), "conv": ("Conv2DBackpropInput", False), "relu": ("ReluGrad", True),
                 "tanh": ("TanhGrad", True), "mul": ("Mul", False), "add": ("Identity", False),
                 "concat": ("Slice", False), "norm": ("FusedBatchNormGradV3", False)}
IR_WEIGHT_GRAD = {"dense": "MatMul", "conv": "Conv2DBackpropFilter", "norm": "FusedBatchNormGradV3"}


@dataclasses.dataclass(frozen=True)
class IRNode:
    kind: str
    inputs: tuple[int, ...]  # indices into the activations so far (0 is the step's input)
    width: int


@dataclasses.dataclass(frozen=True)
class IRRecipe:
    batch: int
    nodes: tuple[IRNode, ...]
    extra_loss_input: int | None  # a second activation the loss reads (a side output)


@st.composite
def ir_recipes(draw) -> IRRecipe:
    nodes = []
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(sorted(IR_KINDS)))
        arity = IR_KINDS[kind][1]
        inputs = tuple(draw(st.integers(0, i)) for _ in range(arity))  # any earlier activation: branches, residuals
        nodes.append(IRNode(kind, inputs, draw(st.sampled_from([4, 16, 64]))))
    extra = draw(st.one_of(st.none(), st.integers(0, len(nodes))))
    return IRRecipe(draw(st.sampled_from([1, 8, 32])), tuple(nodes), extra)


def build_ir_step(recipe: IRRecipe) -> Graph:
    """The training step a recipe describes: forward DAG, loss, mirrored backward with AddN joins, SGD updates."""
    b = GraphBuilder()
    shape = lambda width: (recipe.batch, width)  # noqa: E731
    acts = [b.op("x", "Placeholder", shape=shape(8))]
    lr = b.op("lr", "Const", shape=())
    weights: dict[int, tuple[TensorRef, TensorRef]] = {}
    for i, node in enumerate(recipe.nodes):
        op_type, _, has_weight = IR_KINDS[node.kind]
        ins = [acts[j] for j in node.inputs]
        if has_weight:
            handle = b.op(f"var_{i}", "Placeholder", shape=(), dtype="resource")
            w = b.op(f"fw/ReadVariableOp_{i}", "ReadVariableOp", [handle], shape=(node.width, node.width))
            weights[i] = (handle, w)
            ins.append(w)
        if node.kind == "concat":
            ins.append(b.op(f"fw/axis_{i}", "Const", shape=()))
        num_outputs = 6 if node.kind == "norm" else 1
        acts.append(b.op(f"fw/{op_type}_{i}", op_type, ins, shape=shape(node.width), num_outputs=num_outputs))
    loss_inputs = [acts[-1]] + ([acts[recipe.extra_loss_input]] if recipe.extra_loss_input is not None else [])
    loss = b.op("loss/Sum", "AddN" if len(loss_inputs) > 1 else "Mean", loss_inputs, shape=())
    # Backward: gradient contributions per activation index, joined by AddN where an activation has several.
    contributions: dict[int, list[TensorRef]] = {}
    seed = b.op("gradient_tape/loss_grad", "BroadcastTo", [loss], shape=shape(recipe.nodes[-1].width))
    contributions.setdefault(len(acts) - 1, []).append(seed)
    if recipe.extra_loss_input is not None:
        contributions.setdefault(recipe.extra_loss_input, []).append(seed)
    for i in reversed(range(len(recipe.nodes))):
        node, index = recipe.nodes[i], i + 1
        ups = contributions.get(index)
        if not ups:
            continue  # a dead branch: the loss does not depend on it
        up = ups[0] if len(ups) == 1 else b.op(f"gradient_tape/AddN_{i}", "AddN", ups, shape=shape(node.width))
        grad_type, reads_output = IR_INPUT_GRAD[node.kind]
        for k, j in enumerate(node.inputs):
            saved = [acts[index]] if reads_output else [acts[j2] for j2 in node.inputs if j2 != j] or [acts[j]]
            if i in weights:
                saved = saved + [weights[i][1]]
            g = b.op(f"gradient_tape/{grad_type}_{i}_{k}", grad_type, [up] + saved,
                     shape=shape(recipe.nodes[j - 1].width if j else 8))
            contributions.setdefault(j, []).append(g)
        if i in weights:
            handle, _ = weights[i]
            gw = b.op(f"gradient_tape/{IR_WEIGHT_GRAD[node.kind]}_w_{i}", IR_WEIGHT_GRAD[node.kind],
                      [acts[j] for j in node.inputs] + [up], shape=(node.width, node.width))
            step = b.op(f"opt/Mul_{i}", "Mul", [gw, lr], shape=(node.width, node.width))
            b.op(f"opt/AssignSubVariableOp_{i}", "AssignSubVariableOp", [handle, step], shape=None, num_outputs=0)
    return b.graph


def serialized(graph: Graph) -> tuple:
    """Everything a rewrite decides, in graph order: names, types, devices, inputs, control inputs, outputs."""
    return tuple((op.name, op.type, op.device, tuple(str(r) for r in op.inputs), tuple(op.control_inputs),
                  tuple((o.dtype, o.shape, o.num_bytes) for o in op.outputs)) for op in graph)


def report_dict(result) -> dict[str, Any]:
    out = result.report.to_dict()
    out.pop("timings_s", None)
    return out


def check_rewrite_properties(recipe: IRRecipe, config: LMSConfig) -> None:
    graph = build_ir_step(recipe)
    graph.lint()
    before = serialized(graph)
    result = tflms.rewrite(graph, config)
    assert serialized(graph) == before, "rewrite changed its input graph"
    result.graph.lint()
    assert nx.is_directed_acyclic_graph(result.graph.to_networkx()), "the rewritten graph has a cycle"
    missing = [n for n in result.report.inserted_ops if n not in result.graph]
    assert not missing, f"the report names ops the graph does not have: {missing[:5]}"
    assert len(result.graph) == len(graph) + len(result.report.inserted_ops)
    again = tflms.rewrite(build_ir_step(recipe), config)
    assert serialized(again.graph) == serialized(result.graph), "same graph + config gave another rewrite"
    assert report_dict(again) == report_dict(result), "same graph + config gave another report"
    event("swaps" if result.report.num_swapped else "no swaps")


def test_ir_generator_makes_training_steps_that_swap():
    """The generator is not vacuous: a deep recipe has a backward pass and gets swaps at threshold 1."""
    recipe = IRRecipe(8, (IRNode("dense", (0,), 16), IRNode("relu", (1,), 16), IRNode("dense", (2,), 16),
                          IRNode("add", (3, 1), 16), IRNode("relu", (4,), 16)), None)
    # TFLMS rules at threshold 1 (the default tunes, and these small steps fit any budget)
    result = tflms.rewrite(build_ir_step(recipe), LMSConfig(swapout_threshold=1, accelerator_device="/device:GPU:0"))
    assert result.analysis.has_backward
    assert result.report.num_swapped > 0, result.report.table()
    assert {"fw/MatMul_0", "fw/Relu_1"} <= {s.tensor.op for s in result.report.swaps}


@pytest.mark.slow  # 1000 examples per CI run (the README command runs the slow tier too)
@IR_SETTINGS
@given(recipe=ir_recipes(), config=lms_configs())
def test_ir_rewrite_is_lint_clean_acyclic_and_deterministic(recipe, config):
    check_rewrite_properties(recipe, config)


# ------------------------------------------------------- TensorFlow training


#: Keras node kinds of the random models; every node keeps the channel count, so any two can be added.
TF_KINDS = ("dense", "conv", "relu", "tanh", "gelu", "mul", "add", "concat", "layernorm", "batchnorm")
OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")

TF_SETTINGS = settings(max_examples=TF_EXAMPLES, derandomize=True, deadline=None, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                       # shrinking reruns TensorFlow many times; TFLMS_FUZZ_SHRINK=1 turns it on to minimize a failure
                       phases=tuple(Phase) if os.environ.get("TFLMS_FUZZ_SHRINK") else
                       tuple(p for p in Phase if p is not Phase.shrink))


@dataclasses.dataclass(frozen=True)
class TFNode:
    kind: str
    inputs: tuple[int, ...]  # indices into the activations so far (0 is the model input)
    activation: str | None = None  # dense/conv: None, "relu" or "gelu"
    bias: bool = True  # dense/conv: use_bias
    kernel: int = 1  # conv: kernel size


@dataclasses.dataclass(frozen=True)
class TFRecipe:
    side: int  # 0: vectors (batch, channels), where conv nodes become dense; else images (batch, side, side, channels)
    channels: int
    batch: int
    optimizer: str
    nodes: tuple[TFNode, ...]


@st.composite
def tf_recipes(draw) -> TFRecipe:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(TF_KINDS))
        arity = 2 if kind in ("mul", "add", "concat") else 1
        inputs = tuple(draw(st.integers(0, i)) for _ in range(arity))
        nodes.append(TFNode(kind, inputs, activation=draw(st.sampled_from([None, "relu", "gelu"])),
                            bias=draw(st.booleans()), kernel=draw(st.sampled_from([1, 3]))))
    return TFRecipe(side=draw(st.sampled_from([0, 2, 4])), channels=draw(st.sampled_from([2, 8, 32])),
                    batch=draw(st.sampled_from([1, 2, 4])), optimizer=draw(st.sampled_from(OPTIMIZERS)),
                    nodes=tuple(nodes))


def build_tf_model(recipe: TFRecipe, seed: int = 0):
    import keras
    keras.utils.set_random_seed(seed)
    c = recipe.channels
    inputs = keras.Input((recipe.side, recipe.side, c) if recipe.side else (c,), name="x")
    acts = [inputs]
    for i, node in enumerate(recipe.nodes):
        ins = [acts[j] for j in node.inputs]
        act = node.activation
        if node.kind == "dense" or (node.kind == "conv" and not recipe.side):
            h = keras.layers.Dense(c, activation=act, use_bias=node.bias, name=f"n{i}_dense")(ins[0])
        elif node.kind == "conv":
            h = keras.layers.Conv2D(c, node.kernel, padding="same", activation=act, use_bias=node.bias,
                                    name=f"n{i}_conv")(ins[0])
        elif node.kind in ("relu", "tanh", "gelu"):
            h = keras.layers.Activation(node.kind, name=f"n{i}_{node.kind}")(ins[0])
        elif node.kind == "mul":
            h = keras.layers.Multiply(name=f"n{i}_mul")(ins)
        elif node.kind == "add":
            h = keras.layers.Add(name=f"n{i}_add")(ins)
        elif node.kind == "concat":
            h = keras.layers.Concatenate(name=f"n{i}_concat")(ins)
            h = keras.layers.Dense(c, use_bias=node.bias, name=f"n{i}_project")(h)
        elif node.kind == "layernorm":
            h = keras.layers.LayerNormalization(name=f"n{i}_ln")(ins[0])
        else:
            h = keras.layers.BatchNormalization(name=f"n{i}_bn")(ins[0])
        acts.append(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(acts[-1]) if recipe.side else acts[-1]
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(h))


def _optimizer(kind: str):
    import keras
    return {"sgd": lambda: keras.optimizers.SGD(0.05), "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(0.01), "rmsprop": lambda: keras.optimizers.RMSprop(0.01)}[kind]()


def train_two_steps(recipe: TFRecipe, wrap) -> tuple[list, Any]:
    """A fresh model trained 2 steps by ``wrap(step)``; returns (snapshot with losses, the wrapped function)."""
    import tensorflow as tf

    from tflms.testing import make_train_step, snapshot
    model = build_tf_model(recipe)
    optimizer = _optimizer(recipe.optimizer)
    optimizer.build(model.trainable_variables)
    fn = wrap(make_train_step(model, optimizer))
    rng = np.random.default_rng(7)
    losses = []
    for _ in range(2):
        shape = (recipe.side, recipe.side, recipe.channels) if recipe.side else (recipe.channels,)
        x = rng.standard_normal((recipe.batch, *shape)).astype(np.float32)
        y = rng.integers(0, 3, size=(recipe.batch,)).astype(np.int32)
        losses.append(fn(tf.constant(x), tf.constant(y)))
    return snapshot(model, optimizer, losses=losses), fn


def check_bitwise(recipe: TFRecipe, config: LMSConfig):
    """2 steps of tflms.function are bitwise equal to 2 steps of tf.function; returns the rewrite report."""
    import tensorflow as tf

    from tflms.testing import assert_bitwise_equal
    plain, _ = train_two_steps(recipe, tf.function)
    swapped, fn = train_two_steps(recipe, lambda step: tflms.function(step, config=config))
    if currently_in_test_context():  # hypothesis statistics: how many examples swapped
        event("swaps" if fn.report.num_swapped else "no swaps")
    assert_bitwise_equal(plain, swapped, f"tflms.function ({fn.report.num_swapped} swaps) vs tf.function, "
                                         f"{recipe}, {config}")
    return fn.report


#: what hypothesis found (shrunk) on its first run of the bitwise property: LayerNormalization + Dense on (1, 2)
#: vectors, SGD, swapout_threshold=2. Kept as a named test rather than an @example, so that until issue 10 is
#: fixed the property still runs its generated examples (an explicit example that fails stops it first).
FOUND_LAYERNORM_DENSE = (TFRecipe(side=0, channels=2, batch=1, optimizer="sgd",
                                  nodes=(TFNode("layernorm", (0,), bias=False), TFNode("dense", (1,), bias=False))),
                         LMSConfig(swapout_threshold=2))


@TF_SETTINGS
@pytest.mark.slow
@given(recipe=tf_recipes(), config=lms_configs(accelerator=None, max_threshold=3, min_bytes=(0, 64, 1024)))
def test_two_training_steps_are_bitwise_identical(recipe, config):
    check_bitwise(recipe, config)


# ------------------------------------------------------------- regressions
def test_regression_found_layernorm_dense():
    """The first failure hypothesis found, shrunk (see FOUND_LAYERNORM_DENSE)."""
    check_bitwise(*FOUND_LAYERNORM_DENSE)


def test_regression_layernorm_alone():
    """Minimal failing step (found reducing the kit's layer-norm + gelu model): one LayerNormalization on
    (4, 32) vectors, SGD, threshold 1. What ran (run metadata): AddN 2 -> 1, AddV2 3 -> 4 with tflms: an add
    tree grappler rewrites into AddN only while each partial sum has one consumer, and a swap-out adds one."""
    check_bitwise(TFRecipe(side=0, channels=32, batch=4, optimizer="sgd", nodes=(TFNode("layernorm", (0,)),)),
                  LMSConfig())


def test_regression_dense_residual_add():
    """Minimal failing step: Dense, Dense, Add(first, second) on (4, 32) vectors, SGD, threshold 1. What ran:
    _FusedMatMul 3 -> 2 (+ MatMul, + BiasAdd) and AddV2 1 -> 2: a MatMul + BiasAdd fusion is lost where the
    MatMul's output got a swap-out."""
    nodes = (TFNode("dense", (0,)), TFNode("dense", (1,)), TFNode("add", (1, 2)))
    check_bitwise(TFRecipe(side=0, channels=32, batch=4, optimizer="sgd", nodes=nodes), LMSConfig())


def test_regression_layernorm_without_swaps_is_bitwise():
    """Control for the regressions above: the same step with nothing swapped (threshold above its depth) is equal,
    so the difference comes from the swap ops, not from tflms.function itself."""
    recipe = TFRecipe(side=0, channels=32, batch=4, optimizer="sgd", nodes=(TFNode("layernorm", (0,)),))
    assert check_bitwise(recipe, LMSConfig(swapout_threshold=10_000)).num_swapped == 0


# ------------------------------------------------------------- recompute plans (issue 27)
def _recompute_plan(graph: Graph, picks: list[bool], with_swaps: bool, split: int | None = None,
                    segments: int | None = None, per_reader: bool = False):
    """A recompute plan of ``graph`` from the candidates ``picks`` selects (by rank), or from ``segments``
    checkpointed segments, its chains re-run again past ``split`` levels (``plan_recomputes(split_levels=)``; with
    ``per_reader``, the earliest half of the ops past 0 levels, ``per_reader=``), with TFLMS-rule swaps on the
    recomputed graph when ``with_swaps`` (the hybrid's shape: swaps may serve clones)."""
    from tflms.analysis.cto import analyze_graph
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import plan_recomputes, rank_candidates, segment_ops
    from tflms.policies.swapplan import SwapPlan
    from tflms.policies.tflms_rules import plan_swaps
    from tflms.profiles import get_profile
    from tflms.sim.cost import op_time_s
    profile = get_profile("v100-16gb-pcie3")
    analysis = analyze_graph(graph)
    ranked, _ = rank_candidates(analysis, lambda n: op_time_s(graph, graph.op(n), profile))
    chosen = {op for c, pick in zip(ranked, picks * (len(ranked) // max(1, len(picks)) + 1)) if pick for op in c.chain}
    if segments is not None:
        chosen = segment_ops(analysis, segments)
    early = sorted(chosen, key=lambda n: (analysis.levels[n], n))[: len(chosen) // 2] if per_reader else ()
    decisions, _ = plan_recomputes(analysis, chosen, split_levels=split, per_reader=early)
    config = LMSConfig(swapout_threshold=1, accelerator_device="/device:GPU:0")
    plan = SwapPlan(config, "/device:GPU:0", (), (), recomputes=decisions)
    if with_swaps and decisions:
        recomputed = apply_swaps(graph, plan).graph
        with swapping_clones():  # as the hybrid search ordered first plans them: a clone may be swapped
            swaps = plan_swaps(analyze_graph(recomputed), config, accelerator_device="/device:GPU:0")
        plan = dataclasses.replace(swaps, recomputes=decisions)
    return plan


@pytest.mark.slow  # 1000 examples per CI run
@IR_SETTINGS
@given(recipe=ir_recipes(), picks=st.lists(st.booleans(), min_size=1, max_size=8), with_swaps=st.booleans(),
       split=st.sampled_from([None, 0, 2]), segments=st.sampled_from([None, 1, 2]), per_reader=st.booleans())
def test_ir_recompute_plans_are_lint_clean_acyclic_and_deterministic(recipe, picks, with_swaps, split, segments,
                                                                     per_reader):
    from tflms.passes.swaps import apply_swaps
    graph = build_ir_step(recipe)
    before = serialized(graph)
    plan = _recompute_plan(graph, picks, with_swaps, split, segments, per_reader)
    result = apply_swaps(graph, plan)
    assert serialized(graph) == before, "apply_swaps changed its input graph"
    result.graph.lint()
    assert nx.is_directed_acyclic_graph(result.graph.to_networkx()), "the recomputed graph has a cycle"
    assert len(result.graph) == len(graph) + len(result.report)
    again = apply_swaps(build_ir_step(recipe), _recompute_plan(build_ir_step(recipe), picks, with_swaps, split,
                                                                    segments, per_reader))
    assert serialized(again.graph) == serialized(result.graph), "same graph + picks gave another rewrite"
    event(f"{'recomputes' if plan.recomputes else 'no recomputes'}, {'swaps' if plan.swaps else 'no swaps'}, "
          f"{'re-run again' if any(r.copy for r in plan.recomputes) else 'none re-run again'}")


@TF_SETTINGS
@pytest.mark.slow
@given(recipe=tf_recipes(), picks=st.lists(st.booleans(), min_size=1, max_size=8), with_swaps=st.booleans(),
       split=st.sampled_from([None, 0, 2]), segments=st.sampled_from([None, 1, 2]), per_reader=st.booleans())
def test_recompute_plans_train_bitwise(recipe, picks, with_swaps, split, segments, per_reader):
    """Random Keras DAGs with random recompute plans train 2 steps bitwise like tf.function; with ``with_swaps``,
    the distance rules also swap on the recomputed step (the hybrid's shape: a clone may be swapped too)."""
    import tensorflow as tf

    from tflms.ir import tf_io
    from tflms.ir.preoptimize import preoptimize
    from tflms.passes.swaps import apply_swaps
    from tflms.pipeline import _build
    from tflms.testing import assert_bitwise_equal

    def recomputed(step):
        traced = tf.function(step)
        state = {}

        def call(x, y):
            if "fn" not in state:
                pre = preoptimize(traced.get_concrete_function(x, y))
                graph = tf_io.load_graph(pre)
                plan = _recompute_plan(graph, picks, with_swaps=with_swaps, split=split, segments=segments,
                                       per_reader=per_reader)
                state["plan"] = plan
                result = apply_swaps(graph, plan)
                state["fn"] = _build(result.graph, pre, result.report)
            return state["fn"](x, y)
        call.state = state
        return call

    plain, _ = train_two_steps(recipe, tf.function)
    mine, fn = train_two_steps(recipe, recomputed)
    plan = fn.state["plan"]
    event(f"{'recomputes' if plan.recomputes else 'no recomputes'}, "
          f"{'a clone swapped' if any(is_clone(s.tensor.op) for s in plan.swaps) else 'no clone swapped'}, "
          f"{'re-run again' if any(r.copy for r in plan.recomputes) else 'none re-run again'}")
    assert_bitwise_equal(plain, mine, f"{len(fn.state['plan'].recomputes)} recompute chains vs tf.function, {recipe}")
