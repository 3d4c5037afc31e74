"""The recompute pass: each :class:`~tflms.policies.recompute.RecomputeDecision` becomes clones in the graph.

A clone ``lms/recompute_<op>`` is the op itself (type, attributes, device, outputs), reading the
clones of its inputs inside the chain and the original tensors outside it, with one control input,
from its trigger (the original's control inputs only order a stateless op, and the clone runs after
they have anyway: its trigger is in the backward pass). The chain's readers outside the forward
pass are rewired to the clones. The input graph is not modified.
"""

from __future__ import annotations

from collections.abc import Sequence

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.policies.recompute import RecomputeDecision, clone_name


def insert_recomputes(graph: Graph, decisions: Sequence[RecomputeDecision]) -> list[str]:
    """Insert the clones of ``decisions`` into ``graph`` (in place) and rewire their readers; returns the clones'
    names in insertion order. :func:`tflms.passes.swaps.apply_swaps` calls this on its copy of the graph."""
    inserted = []
    for decision in decisions:
        chain = set(decision.ops)
        for name, trigger in zip(decision.ops, decision.triggers):
            op = graph.op(name)
            clone = clone_name(name)
            if clone in graph:
                raise GraphError(f"an op named {clone!r} already exists: is {name!r} recomputed twice?")
            inputs = [TensorRef(clone_name(ref.op), ref.index) if ref.op in chain else ref for ref in op.inputs]
            # Only the trigger: the original's control inputs order a stateless op and change nothing it computes,
            # and one from a later op (an order pinned by the order pass) could read a clone of this chain
            graph.add_op(clone, op.type, inputs=inputs, control_inputs=[trigger], device=op.device, attrs=op.attrs,
                         outputs=op.outputs, node_def=op.node_def)
            inserted.append(clone)
        for ref, readers in zip(decision.tensors, decision.readers):
            members = set(readers)
            for consumer, index in graph.consumers(ref):
                if consumer in members:
                    graph.set_input(consumer, index, TensorRef(clone_name(ref.op), ref.index))
    return inserted
