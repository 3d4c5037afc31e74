"""Keeping XLA (issue 47): the step's compute ops run as XLA clusters between tflms's copies.

Hand-built graphs check the segment rule exactly (tflms/passes/xla_clusters.py).
"""

from __future__ import annotations

import networkx as nx
import pytest

from tflms.config import LMSConfig
from tflms.ir.graph import Graph, TensorRef
from tflms.ir.tf_io import to_graph_def
from tflms.passes.xla_clusters import (HOST_OP, NEVER_COMPILED, NO_XLA_KERNEL, SCOPE_PREFIX, TFLMS_COPY,
                                       XLA_COMPILE_ATTR, XLA_INTERNAL_SCOPE_ATTR, XLA_SCOPE_ATTR, cluster_for_xla)
from tflms.pipeline import rewrite
from tflms.testing import GraphBuilder, mlp_training_graph

CPU = "/device:CPU:0"
RULES = dict(swapout_threshold=1, swapin_ahead=1)


def _anything_compiles(op_type: str) -> bool:
    return True


def _attr(graph: Graph, name: str, key: str):
    node = next(n for n in to_graph_def(graph).node if n.name == name)
    if key not in node.attr:
        return None
    value = node.attr[key]
    return value.b if value.WhichOneof("value") == "b" else value.s.decode()


def _scopes(graph: Graph) -> dict[str, str | None]:
    return {op.name: _attr(graph, op.name, XLA_SCOPE_ATTR) for op in graph}


def _swapped_mlp() -> Graph:
    """The two-layer MLP step with the TFLMS rules at threshold 1 (tests/test_core.py has its swaps exactly)."""
    return rewrite(mlp_training_graph(2), LMSConfig(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)).graph


# ------------------------------------------------------------------ the rule, on hand-built graphs
def test_segments_end_at_each_copy_and_the_copies_stay_out():
    """Kahn's order with each copy as soon as it can run: a swap-out right after its producer, a swap-in right after
    its trigger; every copy ends a segment, and a segment's unconnected parts are clusters of their own."""
    graph = _swapped_mlp()
    result = cluster_for_xla(graph, accelerator_device=CPU, host_device=CPU, has_xla_kernel=_anything_compiles)
    report = result.report
    assert [(k, list(members)) for k, members in report.clusters] == [
        (0, ["fw/ReadVariableOp_0", "fw/MatMul_0", "fw/Relu_0"]),
        (1, ["fw/ReadVariableOp_1", "fw/MatMul_1", "fw/Relu_1"]),  # after lms/swap_out_fw/Relu_0_0
        (2, ["loss/Sub"]),  # after lms/swap_out_fw/Relu_1_0
        (3, ["loss/Mean"]),  # after lms/swap_in_fw/Relu_1_0_0 (trigger loss/Sub)
        (3, ["gradient_tape/ReluGrad_1"]),
        (4, ["gradient_tape/MatMul_1_1"]),  # after lms/swap_in_fw/Relu_0_0_0 (trigger ReluGrad_1)
        (4, ["gradient_tape/MatMul_1"]),
        # after lms/swap_in_fw/Relu_0_0_1 (trigger MatMul_1); the learning rate (a constant) joins its readers
        (5, ["lr", "opt/Mul_1", "opt/AssignSubVariableOp_1", "gradient_tape/ReluGrad_0", "gradient_tape/MatMul_1_0",
             "gradient_tape/MatMul_0", "opt/Mul_0", "opt/AssignSubVariableOp_0"]),
    ]
    assert report.boundaries == ("lms/swap_out_fw/Relu_0_0", "lms/swap_out_fw/Relu_1_0", "lms/swap_in_fw/Relu_1_0_0",
                                 "lms/swap_in_fw/Relu_0_0_0", "lms/swap_in_fw/Relu_0_0_1")
    assert dict(report.outside) == {**{n: NEVER_COMPILED for n in ("x", "y", "var_0", "var_1")},
                                    **{n: TFLMS_COPY for n in report.boundaries}}
    new = result.graph
    for k, members in report.clusters:
        for name in members:
            assert _attr(new, name, XLA_COMPILE_ATTR) is True, name
            assert _attr(new, name, XLA_SCOPE_ATTR) == _attr(new, name, XLA_INTERNAL_SCOPE_ATTR) == f"{SCOPE_PREFIX}{k}"
    for name in report.boundaries:  # vetoed even under global jit
        assert _attr(new, name, XLA_COMPILE_ATTR) is False and _attr(new, name, XLA_SCOPE_ATTR) is None, name
    assert _attr(new, "x", XLA_COMPILE_ATTR) is None  # arguments are no candidates anyway
    assert report.to_dict()["clusters"] == 8 and report.to_dict()["segments"] == 6
    # the input graph is untouched
    assert all(_attr(graph, op.name, XLA_COMPILE_ATTR) is None for op in graph)


def _contracted_is_acyclic(graph: Graph, clusters) -> bool:
    """Whether contracting each cluster to one node leaves the graph acyclic (mark_for_compilation's condition)."""
    where = {name: f"cluster {i}" for i, (_, members) in enumerate(clusters) for name in members}
    contracted = nx.DiGraph()
    contracted.add_nodes_from(where.get(op.name, op.name) for op in graph)
    for op in graph:
        for pred in graph.predecessors(op.name):
            a, b = where.get(pred, pred), where.get(op.name, op.name)
            if a != b:
                contracted.add_edge(a, b)
    return nx.is_directed_acyclic_graph(contracted)


@pytest.mark.parametrize("layers", [1, 3, 5])
def test_no_cluster_reaches_itself_through_a_copy(layers):
    graph = rewrite(mlp_training_graph(layers), LMSConfig(**RULES)).graph
    report = cluster_for_xla(graph, accelerator_device=CPU, host_device=CPU, has_xla_kernel=_anything_compiles).report
    assert report.num_clusters >= 2
    assert _contracted_is_acyclic(graph, report.clusters)
    # and the same clusters are what a control without the segment rule would merge into a cycle: one scope for all
    everything = [(0, tuple(n for _, members in report.clusters for n in members))]
    assert not _contracted_is_acyclic(graph, everything)


def test_an_op_without_an_xla_kernel_splits_its_segment_and_is_vetoed():
    """A member-to-member path through an op XLA cannot compile would be a cycle: the op is a boundary too."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    a = b.op("a", "Relu", [x])
    p = b.op("p", "NoKernelOp", [a])
    c = b.op("c", "Relu", [p])
    b.op("d", "AddV2", [a, c])
    result = cluster_for_xla(b.graph, accelerator_device=CPU, host_device=CPU,
                             has_xla_kernel=lambda t: t != "NoKernelOp")
    assert [(k, list(m)) for k, m in result.report.clusters] == [(0, ["a"]), (1, ["c", "d"])]
    assert dict(result.report.outside)["p"] == NO_XLA_KERNEL and result.report.blocked() == ("p",)
    assert _attr(result.graph, "p", XLA_COMPILE_ATTR) is False
    assert "XLA cannot compile also split segments (e.g. p)" in result.report.to_dict()["why"]


def test_host_ops_stay_out_where_the_accelerator_is_a_gpu_and_strings_never_compile():
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    a = b.op("a", "Relu", [x])
    b.graph.add_op("h", "Relu", inputs=[a], device="/job:localhost/replica:0/task:0/device:CPU:0",
                   outputs=b.graph.op("a").outputs)
    b.op("c", "Relu", [TensorRef("h")])
    b.op("s", "AsString", [TensorRef("c")], dtype="string")
    gpu = cluster_for_xla(b.graph, accelerator_device="/device:GPU:0", host_device=CPU,
                          has_xla_kernel=_anything_compiles).report
    assert dict(gpu.outside) == {"x": NEVER_COMPILED, "h": HOST_OP, "s": NEVER_COMPILED}
    assert [list(m) for _, m in gpu.clusters] == [["a"], ["c"]] and gpu.jit_device == "XLA_GPU_JIT"
    cpu = cluster_for_xla(b.graph, accelerator_device=CPU, host_device=CPU, has_xla_kernel=_anything_compiles).report
    assert [list(m) for _, m in cpu.clusters] == [["a", "h", "c"]]  # host and accelerator are one device here


def test_recompute_clones_join_their_readers_cluster_and_gates_stay_out():
    """Every forward op the backward pass reads recomputed: each gate (an Identity after its trigger) is a boundary,
    and each clone sits in the cluster of the ops that read it, never with the forward op it re-runs (XLA's CSE
    would merge the two and undo the recompute)."""
    from tflms.analysis.cto import analyze_graph
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import plan_recomputes, rank_candidates
    from tflms.policies.swapplan import SwapPlan
    from tflms.sim.cost import op_time_s
    from tflms.testing import serial_clock
    graph = mlp_training_graph(3)
    analysis = analyze_graph(graph)
    profile = serial_clock("v100-16gb-pcie3")
    ranked, _ = rank_candidates(analysis, lambda n: op_time_s(graph, graph.op(n), profile))
    decisions, _ = plan_recomputes(analysis, {op for c in ranked for op in c.chain})
    assert decisions, "the MLP step must have recompute candidates"
    plan = SwapPlan(LMSConfig(), CPU, (), (), recomputes=decisions)
    recomputed = apply_swaps(graph, plan).graph
    report = cluster_for_xla(recomputed, accelerator_device=CPU, host_device=CPU,
                             has_xla_kernel=_anything_compiles).report
    segment = {n: k for k, members in report.clusters for n in members}
    gates = {g for d in decisions for g, _, _ in d.gates}
    clones = {c for d in decisions for c in d.clones}
    assert gates and clones
    assert {g: dict(report.outside)[g] for g in gates} == {g: TFLMS_COPY for g in gates}
    joined = 0
    for clone in sorted(clones):
        readers = recomputed.successors(clone)
        if all(r in segment for r in readers):  # (a clone read through a gate ends its segment like any copy)
            assert segment[clone] == min(segment[r] for r in readers), (clone, readers)
            joined += 1
        original = clone.removeprefix("lms/recompute_")
        assert segment[clone] > segment[original], f"{clone} would share a cluster with {original}"
    assert joined >= 2, "the chains' last clones must be read by backward ops directly"
    assert _contracted_is_acyclic(recomputed, report.clusters)


def test_the_clustered_graph_is_deterministic():
    graph = _swapped_mlp()
    first, second = (cluster_for_xla(graph, accelerator_device=CPU, host_device=CPU,
                                     has_xla_kernel=_anything_compiles) for _ in range(2))
    assert to_graph_def(first.graph).SerializeToString(deterministic=True) == \
        to_graph_def(second.graph).SerializeToString(deterministic=True)
    assert first.report == second.report
