"""The recompute pass: each :class:`~tflms.policies.recompute.RecomputeDecision` becomes clones in the graph.

A clone ``lms/recompute_<op>`` is the op itself (type, attributes, device, outputs), reading the
clones of its inputs inside the chain and the original tensors outside it through *gates*: an
``Identity`` per tensor with the trigger as its control input (:func:`~tflms.policies.recompute.clone_inputs`
says why the clone itself carries none). The original's control inputs are not copied: they only order
a stateless op, and the clone runs after them anyway (its trigger is in the backward pass). The chain's
readers outside the forward pass are rewired to the clones. The input graph is not modified.
"""

from __future__ import annotations

from collections.abc import Sequence

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.policies.recompute import GATE, RecomputeDecision, clone_inputs, clone_name


def insert_recomputes(graph: Graph, decisions: Sequence[RecomputeDecision]) -> list[str]:
    """Insert the gates and clones of ``decisions`` into ``graph`` (in place, in each decision's ``inserted``
    order: a gate just before the first clone that reads it) and rewire their readers; returns the inserted names
    in insertion order. :func:`tflms.passes.swaps.apply_swaps` calls this on its copy of the graph."""
    inserted: list[str] = []
    gated: set[str] = set()  # gates are shared: chains that read one tensor after one trigger read one gate
    for decision in decisions:
        chain = frozenset(decision.ops)
        for kind, name, trigger, what in decision.insertions():
            if kind == GATE:
                if name not in gated:
                    gated.add(name)
                    _gate(graph, name, what, trigger)
                    inserted.append(name)
                continue
            if name in graph:
                raise GraphError(f"an op named {name!r} already exists: is {what!r} recomputed twice?")
            op = graph.op(what)
            inputs, _ = clone_inputs(op, chain, trigger, decision.copy)
            graph.add_op(name, op.type, inputs=inputs, device=op.device, attrs=op.attrs, outputs=op.outputs,
                         node_def=op.node_def)
            inserted.append(name)
        for ref, readers in zip(decision.tensors, decision.readers):
            members = set(readers)
            for consumer, index in graph.consumers(ref):
                if consumer in members:
                    graph.set_input(consumer, index, TensorRef(clone_name(ref.op, decision.copy), ref.index))
    return inserted


def _gate(graph: Graph, name: str, ref: TensorRef, trigger: str) -> None:
    """An ``Identity`` of ``ref`` that runs after ``trigger`` (grappler may not remove it)."""
    from tflms.passes.swaps import _copy_attrs  # (swaps imports this module)
    info = graph.tensor(ref)
    graph.add_op(name, "Identity", inputs=[ref], control_inputs=[trigger], device=graph.op(ref.op).device,
                 attrs=_copy_attrs(info.dtype), outputs=[info])
