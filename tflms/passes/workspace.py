"""Keep oneDNN's workspace edges where the rewritten step runs on a oneDNN CPU (issue 45's sweep).

oneDNN's graph pass hands a forward op's workspace to its gradient (``MaxPool`` -> ``MaxPoolGrad``, ...; the table
is :data:`~tflms.ir.op_types.ONEDNN_WORKSPACE_EDGES`) only when the gradient reads the forward op's output directly;
through a swap-in the gradient runs TensorFlow's own kernel, which routes the gradient of tied maxima elsewhere.
The swap policies never swap such a tensor when they plan for a oneDNN CPU (skip reason ``onednn-workspace``), but a
budgeted rewrite plans for a profile's GPU, where the rule does not apply, whatever machine makes the plan (so that a
plan is the same on every machine). When that plan then runs on this machine's oneDNN CPU (no GPU here), the
gradient would lose its workspace and training its bits: :func:`keep_workspace_edges` rewires each such gradient input
back to the forward op's output. The swap ops stay (they are control outputs and still run); on a CPU the copy saves
no memory anyway, and the plan, its report and its simulation are the GPU's.
"""

from __future__ import annotations

from tflms.ir.graph import Graph, TensorRef
from tflms.ir.op_types import ONEDNN_WORKSPACE_EDGES
from tflms.passes.result import PassResult
from tflms.policies.eligibility import is_inserted


def _source(graph: Graph, ref: TensorRef) -> TensorRef:
    """The tensor ``ref`` copies: back through the ops tflms inserted (swap-ins, swap-outs, codecs) by input 0."""
    while is_inserted(ref.op) and graph.op(ref.op).inputs:  # (the IR is acyclic: the walk ends)
        ref = graph.op(ref.op).inputs[0]
    return ref


def keep_workspace_edges(graph: Graph, runs_onednn: bool) -> PassResult:
    """Rewire every workspace-edge gradient input that reads a copy back to the forward op's output, when the step
    runs on a oneDNN CPU (``runs_onednn``); report: the ``(gradient op, input index)`` rewired (see the module doc)."""
    if not runs_onednn:
        return PassResult(graph, False, ())
    wanted = {edge: producer for producer, edge in ONEDNN_WORKSPACE_EDGES.items()}
    rewired = []
    for op in graph:
        for index, ref in enumerate(op.inputs):
            producer = wanted.get((op.type, index))
            if producer is None or not is_inserted(ref.op):
                continue
            source = _source(graph, ref)
            if (graph.op(source.op).type, source.index) == producer:
                rewired.append((op.name, index, source))
    if not rewired:
        return PassResult(graph, False, ())
    new = graph.copy()
    for name, index, source in rewired:
        new.set_input(name, index, source)
    return PassResult(new, True, tuple((name, index) for name, index, _ in rewired))
