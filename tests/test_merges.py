"""oneDNN's merged nodes (tflms.ir.merges): the cycle they close, lint's refusal, the scheduler's merge units."""

import pytest

from tflms.errors import GraphError
from tflms.ir.merges import merge_cycle, merge_groups, merge_unit_edges
from tflms.schedule.memory import buffer_model
from tflms.testing import GraphBuilder


def _backward(*, path_through_update: bool):
    """dy feeds a BiasAddGrad and a Conv2DBackpropFilter (whose input x comes from ``late``); with
    ``path_through_update`` the bias gradient's update reaches ``late`` by a control edge (as an order edge would)."""
    b = GraphBuilder()
    b.op("x", "Placeholder")
    b.op("dy", "Placeholder")
    b.op("shape", "Const", shape=(4,), dtype="int32")
    b.op("bias_grad", "BiasAddGrad", ["dy"], shape=(64,))
    b.op("update", "AssignSubVariableOp", ["bias_grad"], shape=())
    b.op("late", "Identity", ["x"], control=["update"] if path_through_update else ())
    b.op("filter_grad", "Conv2DBackpropFilter", ["late", "shape", "dy"])
    return b.graph


def test_the_filter_and_bias_gradients_of_one_output_gradient_merge():
    assert merge_groups(_backward(path_through_update=False)) == [("filter_grad", "bias_grad")]


def test_a_path_from_one_merged_op_to_the_other_is_a_cycle_and_lint_names_it():
    ok = _backward(path_through_update=False)
    assert merge_cycle(ok) is None
    ok.lint()
    bad = _backward(path_through_update=True)
    bad.topological_order()  # acyclic as an IR ...
    why = merge_cycle(bad)  # ... but not once oneDNN merges the pair
    assert why is not None and "bias_grad" in why and "update" in why and "late" in why
    with pytest.raises(GraphError, match="TensorFlow would refuse"):
        bad.lint()


def test_no_merge_when_the_control_inputs_differ():
    graph = _backward(path_through_update=True)
    graph.add_control_input("bias_grad", "shape")  # oneDNN merges only ops with the same control inputs
    assert merge_groups(graph) == []
    assert merge_cycle(graph) is None


def test_the_scheduler_makes_each_merged_op_wait_for_the_others_inputs():
    graph = _backward(path_through_update=False)
    edges = merge_unit_edges(graph)
    assert ("late", "bias_grad") in edges and ("shape", "bias_grad") in edges
    m = buffer_model(graph)
    assert m.index["late"] in m.preds[m.index["bias_grad"]]
    # a graph that already closes the cycle is left as it is (lint names it), not made cyclic for the scheduler
    bad = buffer_model(_backward(path_through_update=True))
    assert bad.index["late"] not in bad.preds[bad.index["bias_grad"]]


def test_a_conv_and_its_only_bias_add_merge_but_not_with_a_second_reader():
    b = GraphBuilder()
    b.op("x", "Placeholder")
    b.op("w", "Placeholder")
    b.op("bias", "Placeholder", shape=(64,))
    b.op("conv", "Conv2D", ["x", "w"])
    b.op("add", "BiasAdd", ["conv", "bias"])
    assert merge_groups(b.graph) == [("conv", "add")]
    b.op("other", "Relu", ["conv"])
    assert merge_groups(b.graph) == []


def test_the_tuner_leaves_out_a_fitting_candidate_tensorflow_would_refuse_and_says_so():
    import types

    from tflms.tune.result import Candidate
    from tflms.tune.tuner import UNRUNNABLE, _runnable
    refused = Candidate("hybrid", {"order_first": 1}, None, sim=None, fits=True)
    runs = Candidate("tflms-distance", {"swapout_threshold": 4}, None, sim=None, fits=True)
    graphs = {id(refused): _backward(path_through_update=True), id(runs): _backward(path_through_update=False)}
    ev = types.SimpleNamespace(candidates=[refused, runs], graphs=dict(graphs), graph_of=lambda c: graphs[id(c)],
                               known_runnable=lambda c: False)
    said = []
    assert _runnable(ev, [refused, runs], said.append) == [runs]
    assert ev.candidates[1] is runs and not ev.candidates[0].fits
    assert ev.candidates[0].why_not.startswith(UNRUNNABLE) and "bias_grad" in ev.candidates[0].why_not
    assert len(said) == 1 and "left out" in said[0] and "order_first" in said[0]
    # none left: the caller's BudgetError names it (an empty list)
    assert _runnable(ev, [refused], None) == []


def test_a_workspace_gradient_reads_the_forward_output_again_where_the_step_runs_on_onednn():
    from tflms.passes.workspace import keep_workspace_edges
    b = GraphBuilder()
    b.op("x", "Placeholder")
    b.op("pool", "MaxPool", ["x"])
    b.op("lms/swap_out_pool_0", "Identity", ["pool"], )
    b.op("lms/swap_in_pool_0", "Identity", ["lms/swap_out_pool_0"])
    b.op("dy", "Placeholder")
    b.op("pool_grad", "MaxPoolGrad", ["x", "lms/swap_in_pool_0", "dy"])
    b.op("other", "Relu", ["lms/swap_in_pool_0"])
    graph = b.graph
    assert keep_workspace_edges(graph, False).graph is graph  # a GPU, or oneDNN off: the plan as it is
    kept = keep_workspace_edges(graph, True)
    assert kept.changed and kept.report == (("pool_grad", 1),)
    assert kept.graph.op("pool_grad").inputs[1].op == "pool"
    assert kept.graph.op("other").inputs[0].op == "lms/swap_in_pool_0"  # other readers keep the copy
    assert graph.op("pool_grad").inputs[1].op == "lms/swap_in_pool_0"  # the input graph is left alone
    kept.graph.lint()


def test_order_edges_never_start_at_an_op_a_conditional_branch_may_leave_dead():
    # Keras's mixed_float16 fit applies the update in the taken branch of the loss scale's lowered cond; an order edge
    # from an op of the other branch made the next ordered op, and all after it, dead: updates skipped (the sweep)
    from tflms.schedule.edges import order_edges, ordered_ops
    b = GraphBuilder()
    big = (256, 256)
    b.op("x", "Placeholder", shape=big)
    b.op("pred", "Placeholder", shape=(), dtype="bool")
    b.op("a", "Relu", ["x"], shape=big)
    b.op("switch", "Switch", ["a", "pred"], shape=big, num_outputs=2)
    b.op("skip", "Relu", ["switch:0"], shape=big)  # the branch taken when pred is false
    b.op("apply", "Tanh", ["switch:1"], shape=big)  # the branch taken when pred is true
    b.op("merge", "Merge", ["skip", "apply"], shape=big, num_outputs=2)
    b.op("after", "Sigmoid", ["merge"], shape=big)
    b.op("other", "Exp", ["x"], shape=big)
    graph = b.graph
    order = ["x", "pred", "a", "switch", "skip", "other", "apply", "merge", "after"]
    chained = ordered_ops(graph, order, min_bytes=1)
    assert "skip" not in chained and "apply" not in chained and {"a", "other", "after"} <= set(chained)
    assert all(src not in ("skip", "apply") for src, _ in order_edges(graph, order, min_bytes=1))
