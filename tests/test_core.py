"""Exact expectations on tiny hand-built graphs: levels, categories, swaps, triggers, names."""

from __future__ import annotations

import pytest

import tflms
from tflms.policies.tflms_rules import plan_swaps
from tflms.policies.swapplan import skip_reason
from tflms.analysis import Category, analyze_graph
from tflms.config import LMSConfig
from tflms.errors import ConfigError, GraphError, NoTrainingStepError, UnitsError, UnsupportedGraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.ir.tf_io import to_graph_def
from tflms.pipeline import rewrite
from tflms.testing import GraphBuilder, mlp_training_graph
from tflms.units import parse_bytes

ACC = "/device:GPU:0"


def _rewrite(graph: Graph, **options):
    """The TFLMS rules (threshold 1 unless given): these tests are about the rules, not the default tuning."""
    options.setdefault("accelerator_device", ACC)
    options.setdefault("swapout_threshold", 1)
    return rewrite(graph, **options)


# ------------------------------------------------------------------ levels and categories
def test_levels_of_two_layer_mlp_are_longest_paths():
    analysis = analyze_graph(mlp_training_graph(2))
    expected = {
        "x": 0, "y": 0, "lr": 0, "var_0": 0, "var_1": 0,
        "fw/ReadVariableOp_0": 1, "fw/MatMul_0": 2, "fw/Relu_0": 3,
        "fw/ReadVariableOp_1": 1, "fw/MatMul_1": 4, "fw/Relu_1": 5,
        "loss/Sub": 6, "loss/Mean": 7,
        "gradient_tape/ReluGrad_1": 7, "gradient_tape/MatMul_1_1": 8, "gradient_tape/MatMul_1": 8,
        "opt/Mul_1": 9, "opt/AssignSubVariableOp_1": 10,
        "gradient_tape/ReluGrad_0": 9, "gradient_tape/MatMul_1_0": 10, "gradient_tape/MatMul_0": 10,
        "opt/Mul_0": 11, "opt/AssignSubVariableOp_0": 12,
    }
    assert dict(analysis.levels) == expected
    assert analysis.num_levels == 13


def test_control_edges_count_for_levels():
    b = GraphBuilder()
    a = b.op("a", "Placeholder")
    c = b.op("c", "Relu", [a])
    d = b.op("d", "Relu", [c])
    b.op("e", "Relu", [a], control=["d"])
    levels = analyze_graph(b.graph).levels
    assert (levels["a"], levels["c"], levels["d"], levels["e"]) == (0, 1, 2, 3)
    del d


def test_categories_of_two_layer_mlp():
    cats = analyze_graph(mlp_training_graph(2)).categories
    by_cat = {c: sorted(n for n, v in cats.items() if v is c) for c in Category}
    assert by_cat[Category.FORWARD] == sorted([
        "fw/ReadVariableOp_0", "fw/MatMul_0", "fw/Relu_0", "fw/ReadVariableOp_1", "fw/MatMul_1", "fw/Relu_1",
        "loss/Sub", "loss/Mean"])
    assert by_cat[Category.BACKWARD] == sorted([
        "gradient_tape/ReluGrad_0", "gradient_tape/ReluGrad_1", "gradient_tape/MatMul_0", "gradient_tape/MatMul_1",
        "gradient_tape/MatMul_1_0", "gradient_tape/MatMul_1_1"])
    assert by_cat[Category.UPDATE] == sorted(
        ["opt/Mul_0", "opt/Mul_1", "opt/AssignSubVariableOp_0", "opt/AssignSubVariableOp_1"])
    assert by_cat[Category.OTHER] == sorted(["x", "y", "lr", "var_0", "var_1"])


def _renamed_without_hints(graph: Graph) -> Graph:
    """The same structure with the gradient_tape/ scope renamed to something meaningless."""
    def rn(name: str) -> str:
        return name.replace("gradient_tape/", "zz/")
    new = Graph()
    for op in graph:
        new.add_op(rn(op.name), op.type, outputs=op.outputs)
    for op in graph:
        for i, ref in enumerate(op.inputs):
            new.op(rn(op.name)).inputs.append(TensorRef(rn(ref.op), ref.index))
            new._consumers.setdefault(TensorRef(rn(ref.op), ref.index), []).append((rn(op.name), i))
        for src in op.control_inputs:
            new.add_control_input(rn(op.name), rn(src))
    new.lint()
    return new


def test_categories_come_from_structure_not_names():
    plain = analyze_graph(_renamed_without_hints(mlp_training_graph(3)))
    hinted = analyze_graph(mlp_training_graph(3))
    forward = sorted(n for n, c in plain.categories.items() if c is Category.FORWARD)
    assert forward == sorted(n for n, c in hinted.categories.items() if c is Category.FORWARD)
    # Without the name hint, input-gradient ops are still backward (descendants of ReluGrad).
    assert plain.categories["zz/MatMul_1"] is Category.BACKWARD
    assert plain.categories["zz/ReluGrad_0"] is Category.BACKWARD
    # ... and the swap decisions are identical.
    names = lambda r: [s.tensor.name for s in r.report.swaps]  # noqa: E731
    assert names(_rewrite(_renamed_without_hints(mlp_training_graph(3)))) == names(
        _rewrite(mlp_training_graph(3)))


def test_tensor_facts_report_consumers_distances_and_bytes():
    analysis = analyze_graph(mlp_training_graph(2))
    facts = analysis.tensor("fw/Relu_0:0")
    assert facts.producer_level == 3
    assert facts.consumers == ("fw/MatMul_1", "gradient_tape/MatMul_1_1", "gradient_tape/ReluGrad_0")
    assert facts.consumer_levels == (4, 8, 9)
    assert facts.distances == (1, 5, 6)
    assert facts.num_bytes == 32 * 64 * 4
    assert facts.producer_category is Category.FORWARD


# ------------------------------------------------------------------ rewriting
def test_swaps_triggers_and_names_exact():
    result = _rewrite(mlp_training_graph(2), swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    swaps = {s.tensor.name: s for s in result.report.swaps}
    assert sorted(swaps) == ["fw/Relu_0:0", "fw/Relu_1:0"]
    r0 = swaps["fw/Relu_0:0"]
    assert r0.swap_out == "lms/swap_out_fw/Relu_0_0"
    assert [(g.name, g.consumers, g.trigger, g.trigger_level) for g in r0.swap_ins] == [
        ("lms/swap_in_fw/Relu_0_0_0", ("gradient_tape/MatMul_1_1",), "gradient_tape/ReluGrad_1", 7),
        ("lms/swap_in_fw/Relu_0_0_1", ("gradient_tape/ReluGrad_0",), "gradient_tape/MatMul_1", 8),
    ]
    r1 = swaps["fw/Relu_1:0"]
    assert [(g.consumers, g.trigger) for g in r1.swap_ins] == [(("gradient_tape/ReluGrad_1",), "loss/Sub")]

    g = result.graph
    g.lint()
    out = g.op("lms/swap_out_fw/Relu_0_0")
    assert (out.type, out.device, out.inputs) == ("Identity", "/device:CPU:0", [TensorRef("fw/Relu_0")])
    sin = g.op("lms/swap_in_fw/Relu_0_0_1")
    # The swap-in runs on the host so that its trigger really delays the copy (see tflms/passes/swaps.py).
    assert (sin.type, sin.device, sin.inputs, sin.control_inputs) == (
        "Identity", "/device:CPU:0", [TensorRef("lms/swap_out_fw/Relu_0_0")], ["gradient_tape/MatMul_1"])
    # Consumers read the swap-in; the near consumer still reads the original.
    assert g.op("gradient_tape/ReluGrad_0").inputs[1] == TensorRef("lms/swap_in_fw/Relu_0_0_1")
    assert g.op("gradient_tape/MatMul_1_1").inputs[0] == TensorRef("lms/swap_in_fw/Relu_0_0_0")
    assert g.op("fw/MatMul_1").inputs[0] == TensorRef("fw/Relu_0")
    assert result.report.inserted_ops == (
        "lms/swap_out_fw/Relu_0_0", "lms/swap_in_fw/Relu_0_0_0", "lms/swap_in_fw/Relu_0_0_1",
        "lms/swap_out_fw/Relu_1_0", "lms/swap_in_fw/Relu_1_0_0")
    # The input graph is untouched.
    assert "lms/swap_out_fw/Relu_0_0" not in result.analysis.graph


def test_threshold_selects_by_distance():
    # Relu_0's far consumers are 5 and 6 levels away, Relu_1's is 2 away.
    result = _rewrite(mlp_training_graph(2), swapout_threshold=4)
    assert [s.tensor.name for s in result.report.swaps] == ["fw/Relu_0:0"]
    result = _rewrite(mlp_training_graph(2), swapout_threshold=5)
    assert [(s.tensor.name, [g.consumers for g in s.swap_ins]) for s in result.report.swaps] == [
        ("fw/Relu_0:0", [("gradient_tape/ReluGrad_0",)])]


def test_groupby_shares_one_swap_in():
    result = _rewrite(mlp_training_graph(2), swapin_groupby=1)
    r0 = next(s for s in result.report.swaps if s.tensor.op == "fw/Relu_0")
    assert [(g.name, g.consumers, g.trigger) for g in r0.swap_ins] == [
        ("lms/swap_in_fw/Relu_0_0_0", ("gradient_tape/MatMul_1_1", "gradient_tape/ReluGrad_0"),
         "gradient_tape/ReluGrad_1")]


def test_swapin_ahead_moves_trigger_earlier_but_after_producer():
    result = _rewrite(mlp_training_graph(2), swapin_ahead=3)
    r0 = next(s for s in result.report.swaps if s.tensor.op == "fw/Relu_0")
    # MatMul_1_1 (level 8): target 5 -> fw/Relu_1; ReluGrad_0 (level 9): target 6 -> loss/Sub.
    assert [(g.trigger, g.trigger_level) for g in r0.swap_ins] == [("fw/Relu_1", 5), ("loss/Sub", 6)]
    # A huge ahead is clamped to just after the producer (level 3): fw/MatMul_1 at level 4.
    result = _rewrite(mlp_training_graph(2), swapin_ahead=50)
    r0 = next(s for s in result.report.swaps if s.tensor.op == "fw/Relu_0")
    assert [(g.trigger, g.trigger_level) for g in r0.swap_ins] == [("fw/MatMul_1", 4), ("fw/MatMul_1", 4)]


def test_sync_modes():
    out_sync = _rewrite(mlp_training_graph(2), sync_mode=1)
    r0 = next(s for s in out_sync.report.swaps if s.tensor.op == "fw/Relu_0")
    assert r0.sync_out_consumers == ("fw/MatMul_1",)
    assert "lms/swap_out_fw/Relu_0_0" in out_sync.graph.op("fw/MatMul_1").control_inputs
    assert not any(g.sync for g in r0.swap_ins)
    in_sync = _rewrite(mlp_training_graph(2), sync_mode=2, swapin_ahead=3)
    r0 = next(s for s in in_sync.report.swaps if s.tensor.op == "fw/Relu_0")
    assert r0.sync_out_consumers == ()
    # Synchronous swap-in ignores swapin_ahead: triggered one level before the consumer.
    assert [(g.trigger_level, g.sync) for g in r0.swap_ins] == [(7, True), (8, True)]
    both = _rewrite(mlp_training_graph(2), sync_mode=3)
    assert all(g.sync for s in both.report.swaps for g in s.swap_ins)
    assert all(s.sync_out_consumers for s in both.report.swaps)


def test_no_op_rewrite_leaves_graph_unchanged():
    graph = mlp_training_graph(2)
    result = _rewrite(graph, swapout_threshold=100)
    assert result.report.num_swapped == 0 and not result.report.changed
    assert [(o.name, o.type, o.inputs, o.control_inputs) for o in result.graph] == [
        (o.name, o.type, o.inputs, o.control_inputs) for o in graph]


def test_rewrite_is_deterministic_bytewise():
    a = to_graph_def(_rewrite(mlp_training_graph(4), swapin_groupby=1).graph)
    b = to_graph_def(_rewrite(mlp_training_graph(4), swapin_groupby=1).graph)
    assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


def test_rewriting_a_rewritten_graph_is_refused():
    once = _rewrite(mlp_training_graph(2)).graph
    with pytest.raises(GraphError, match="already holds tflms swap ops"):
        _rewrite(once)


def test_rewritten_graph_has_no_cycle_and_levels_grow():
    result = _rewrite(mlp_training_graph(6), swapin_ahead=4, swapin_groupby=2)
    result.graph.lint()
    levels = analyze_graph(result.graph).levels
    for swap in result.report.swaps:
        for group in swap.swap_ins:
            assert levels[group.name] > levels[group.trigger]
            assert all(levels[c] > levels[group.name] for c in group.consumers)


# ------------------------------------------------------------------ never swap
def _graph_with_odd_tensors():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(8, 8))
    big = b.op("fw/big", "Relu", [x], shape=(8, 8))
    vec = b.op("fw/vec", "Relu", [x], shape=(8,))
    idx = b.op("fw/idx", "Cast", [x], shape=(8, 8), dtype="int32")
    unk = b.op("fw/unk", "Relu", [x], shape=(None, 8))
    rank = b.op("fw/rank", "Relu", [x], shape=None)
    small = b.op("fw/small", "Relu", [x], shape=(2, 2))
    chain = big
    for i in range(4):
        chain = b.op(f"fw/chain_{i}", "Relu", [chain], shape=(8, 8))
    g = b.op("gradient_tape/g", "ReluGrad", [chain, big, vec, idx, unk, rank, small], shape=(8, 8))
    del g
    return b.graph


def test_skip_reasons_are_recorded():
    result = _rewrite(_graph_with_odd_tensors(), min_swap_bytes=64)
    assert [s.tensor.name for s in result.report.swaps] == ["fw/big:0"]
    reasons = {k.tensor.name: k.reason for k in result.report.skipped}
    assert reasons == {"fw/vec:0": "rank<=1", "fw/idx:0": "host-memory", "fw/unk:0": "unknown-shape",
                       "fw/rank:0": "unknown-shape", "fw/small:0": "small"}


def test_variable_reads_are_never_swapped():
    result = _rewrite(mlp_training_graph(3))
    reasons = {k.tensor.name: k.reason for k in result.report.skipped}
    assert reasons["fw/ReadVariableOp_0:0"] == "variable-read"


def test_include_and_exclude_filters():
    g = mlp_training_graph(3)
    only_matmul = _rewrite(g, include_types=["MatMul"], swapout_threshold=1)
    assert {s.tensor.op.split("/")[1].split("_")[0] for s in only_matmul.report.swaps} <= {"MatMul"}
    no_relu = _rewrite(g, exclude_types=["Relu"])
    assert all("Relu" not in s.tensor.op for s in no_relu.report.swaps)
    scoped = _rewrite(g, exclude_scopes=["fw"])
    assert scoped.report.num_swapped == 0


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("options, match", [
    ({"swapout_threshold": 0}, "swapout_threshold must be >= 1"),
    ({"swapin_ahead": 1.5}, "swapin_ahead must be an int"),
    ({"sync_mode": 4}, "sync_mode must be 0"),
    ({"include_types": ["Relu"], "exclude_types": ["Relu"]}, "both included and excluded"),
    ({"host_device": "/device:GPU:0", "accelerator_device": "GPU:0"}, "saves nothing"),
    ({"host_device": "CPU-0"}, "not a device name"),
    ({"swapout_treshold": 3}, "did you mean 'swapout_threshold'"),
    ({"min_swap_bytes": "12 parsecs"}, "unknown unit"),
    ({"min_swap_bytes": 1.5}, "float"),
    ({"batch_size": 0}, "batch_size must be a positive int"),
])
def test_contradictory_or_bad_config_is_refused(options, match):
    with pytest.raises(ConfigError, match=match):
        LMSConfig.from_kwargs(**options)


def test_unknown_op_type_and_scope_are_errors_with_hints():
    g = mlp_training_graph(2)
    with pytest.raises(ConfigError, match=r"'Matmul' is not a TensorFlow op type; did you mean \['MatMul', 'Mul'\]"):
        _rewrite(g, include_types=["Matmul"])
    with pytest.raises(ConfigError, match=r"no op is under the scope 'fww'; did you mean \['fw'\]"):
        _rewrite(g, exclude_scopes=["fww"])
    # A real op type that is merely absent from this graph only warns.
    result = _rewrite(g, exclude_types=["Conv2D"])
    assert any("Conv2D" in w for w in result.report.warnings)


def test_graph_without_gradient_ops_is_refused():
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    h = x
    for i in range(5):
        h = b.op(f"dense_{i}", "Relu", [h])
    with pytest.raises(NoTrainingStepError, match="no gradient ops"):
        _rewrite(b.graph)


def test_tf1_control_flow_is_refused_with_the_node_name():
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    b.op("while/Enter", "Enter", [x])
    with pytest.raises(UnsupportedGraphError, match="'while/Enter' is TF1 loop control flow"):
        analyze_graph(b.graph)


def test_lowered_conditionals_are_read_and_their_branches_never_swap_or_trigger():
    """A lowered If (Switch/Merge): ops between them may be dead, so they neither swap nor trigger."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    pred = b.op("pred", "Placeholder", shape=(), dtype="bool")
    w = b.op("fw/w", "Placeholder")
    h = b.op("fw/MatMul", "MatMul", [x, w])
    sw = b.op("cond/Switch", "Switch", [h, pred], num_outputs=2)
    branch = b.op("cond/then/Relu", "Relu", [TensorRef("cond/Switch", 1)])
    other = b.op("cond/else/Identity", "Identity", [sw])
    merged = b.op("cond/Merge", "Merge", [branch, other], num_outputs=2)
    act = b.op("fw/Relu", "Relu", [merged])
    grads = [b.op(f"gradient_tape/ReluGrad_{i}", "ReluGrad", [act if i == 0 else TensorRef(f"gradient_tape/ReluGrad_{i - 1}"), h])
             for i in range(4)]
    b.op("gradient_tape/use_branch", "ReluGrad", [grads[-1], branch])
    analysis = analyze_graph(b.graph)
    # a reader of the branch that bypasses the Merge is dead with it
    assert analysis.conditional == {"cond/then/Relu", "cond/else/Identity", "gradient_tape/use_branch"}
    config = LMSConfig(swapout_threshold=1)
    assert skip_reason(analysis, TensorRef("cond/then/Relu"), config)[0] == "conditional"
    assert skip_reason(analysis, TensorRef("cond/Merge"), config)[0] == "conditional"
    assert skip_reason(analysis, TensorRef("fw/MatMul"), config) is None
    plan = plan_swaps(analysis, config, accelerator_device="/device:GPU:0")
    assert "cond/then/Relu:0" not in {s.tensor.name for s in plan.swaps}
    triggers = {g.trigger for s in plan.swaps for g in s.swap_ins}
    assert triggers and not triggers & analysis.conditional


def test_lint_catches_broken_invariants():
    g = mlp_training_graph(1)
    g.lint()
    with pytest.raises(GraphError, match="already exists"):
        g.add_op("x", "Placeholder")
    with pytest.raises(GraphError, match="names no op"):
        g.add_op("bad", "Relu", inputs=[TensorRef("nope")])
    with pytest.raises(GraphError, match="still has consumers"):
        g.remove_op("fw/Relu_0")
    g.op("fw/MatMul_0").inputs.append(TensorRef("fw/Relu_0"))  # bypassing the IR methods
    with pytest.raises(GraphError, match="consumer index is stale"):
        g.lint()
    g2 = mlp_training_graph(1)
    g2.add_control_input("fw/MatMul_0", "fw/Relu_0")  # closes a cycle
    with pytest.raises(GraphError, match="cycle"):
        g2.lint()


def test_append_input_keeps_the_consumer_index_current():
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    b.op("add", "AddV2", [x])
    g = b.graph
    assert g.append_input("add", TensorRef("x")) == 1
    assert sorted(g.consumers(TensorRef("x"))) == [("add", 0), ("add", 1)]
    g.lint()
    with pytest.raises(GraphError, match="names no op"):
        g.append_input("add", TensorRef("missing"))


def test_no_module_edits_edges_behind_the_irs_back():
    """Only tflms/ir/graph.py touches Op.inputs / control_inputs and the consumer indexes."""
    import pathlib
    import re
    root = pathlib.Path(tflms.__file__).parent
    # IR objects by their conventional names (an Op ``op``, a Graph ``graph``/``g``/``new``/``placed``...): other
    # structures (the simulator's IndexedGraph) have fields of the same names and are not the IR.
    ir = r"\b(op|\w*graph|g|new|placed|swapped)"
    pattern = re.compile(ir + r"\.(inputs|control_inputs)\s*(\[[^\]]*\]\s*)?=[^=]|" + ir
                         + r"\.(inputs|control_inputs)\.(append|insert|remove|extend|pop)\(|" + ir
                         + r"\._(control_)?consumers\b")
    #: TensorFlow objects with attributes of the same names (not the IR).
    allowed = {"new_graph.inputs = args + captures"}  # a tf FuncGraph's inputs, in tf_io.to_concrete_function
    offenders = [f"{path.relative_to(root)}:{n}: {line.strip()}" for path in sorted(root.rglob("*.py"))
                 if path.name != "graph.py" or path.parent.name != "ir"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line) and line.strip() not in allowed]
    assert offenders == [], offenders


def test_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("1.5 kb") == 1500
    assert parse_bytes(7) == 7
    with pytest.raises(UnitsError, match="has no unit"):
        parse_bytes("12")


def test_public_api_surface():
    assert callable(tflms.function) and callable(tflms.analyze) and callable(tflms.rewrite)
    assert issubclass(tflms.ConfigError, tflms.TflmsError)


def test_reshapes_of_run_time_shapes_take_their_input_size():
    """Graph.fill_alias_bytes: a Reshape/IdentityN holds its input's elements, whatever shape it was traced with."""
    from tflms.ir.graph import TensorInfo
    g = Graph()
    g.add_op("x", "Placeholder", outputs=[TensorInfo("float32", (None, 6, 4), None)])
    g.add_op("y", "Placeholder", outputs=[TensorInfo("int32", (None, 2), None)])
    g.add_op("flat", "Reshape", inputs=[TensorRef("x")], outputs=[TensorInfo("float32", (None, None), None)])
    g.add_op("pair", "IdentityN", inputs=[TensorRef("flat"), TensorRef("y")],
             outputs=[TensorInfo("float32", (None, None), None), TensorInfo("int32", (None, None), None)])
    g.add_op("cast", "Cast", inputs=[TensorRef("flat")], outputs=[TensorInfo("float16", (None, None), None)])
    sized = g.with_batch_size(5)
    assert sized.tensor(TensorRef("flat")).num_bytes == 5 * 6 * 4 * 4  # from x, through the alias
    assert sized.tensor(TensorRef("pair", 0)).num_bytes == 5 * 6 * 4 * 4
    assert sized.tensor(TensorRef("pair", 1)).num_bytes == 5 * 2 * 4  # IdentityN: output k from input k
    assert sized.tensor(TensorRef("cast")).num_bytes is None  # not an alias: its shape is really unknown
    assert sized.tensor(TensorRef("flat")).shape == (None, None)  # sizes only; shapes stay as traced
    assert g.tensor(TensorRef("flat")).num_bytes is None  # the original is untouched


def test_a_reduction_reshaped_to_a_known_shape_takes_that_size():
    """Graph.fill_alias_bytes backwards: the gradient of a broadcasting Add sums over axes known only at run time
    (BroadcastGradientArgs) and reshapes the sum to the operand's shape, so the sum holds that many elements;
    it was 0 bytes in the simulator, and so was the upstream gradient it forwards."""
    from tflms.ir.graph import TensorInfo
    g = Graph()
    g.add_op("grad", "Placeholder", outputs=[TensorInfo("float32", (8, 6, 4), 8 * 6 * 4 * 4)])
    g.add_op("axes", "Placeholder", outputs=[TensorInfo("int32", (None,), None)])
    g.add_op("sum", "Sum", inputs=[TensorRef("grad"), TensorRef("axes")],
             outputs=[TensorInfo("float32", None, None)])
    g.add_op("shaped", "Reshape", inputs=[TensorRef("sum")], outputs=[TensorInfo("float32", (8, 6, 4), 768)])
    g.add_op("cast", "Cast", inputs=[TensorRef("axes")], outputs=[TensorInfo("int64", (None,), None)])
    assert g.fill_alias_bytes() == 1
    assert g.tensor(TensorRef("sum")).num_bytes == 768
    assert g.tensor(TensorRef("axes")).num_bytes is None  # not reshaped into anything known
    assert g.tensor(TensorRef("sum")).shape is None  # sizes only
