"""The swap pass: a :class:`~tflms.policies.swapplan.SwapPlan` becomes copy ops in a new IR graph.

Each swap becomes a copy op on the host (swap-out) reading the tensor and, per
consumer group, a swap-in op reading the swap-out with a control input from its
trigger. Consumers are rewired to their swap-in. The input graph is not modified.

Where the swap-in runs matters. TensorFlow turns a cross-device edge into a
``_Send``/``_Recv`` pair, and the ``_Recv`` on the consumer's device has no
control inputs: it copies as soon as the data exists. A swap-in *on the
accelerator* would therefore be copied back right after the swap-out, whatever
its trigger. So by default the swap-in is an ``Identity`` *on the host*: the
trigger delays it, and the host-to-accelerator copy (the ``_Recv`` feeding the
consumers) can only start once it has run. For measurements on two logical CPU
devices (which share buffers), ``DeepCopy`` swap-ins on the emulated accelerator
make the copy explicit instead.
"""

from __future__ import annotations

import functools

from tflms.errors import GraphError
from tflms.ir.graph import Graph, TensorRef
from tflms.ir.tf_io import DO_NOT_REMOVE_ATTR
from tflms.passes.result import PassResult
from tflms.passes.recompute import insert_recomputes
from tflms.policies.eligibility import is_clone, is_inserted
from tflms.policies.swapplan import SwapPlan

#: Op type used for swap copies. ``Identity`` lets TensorFlow insert the
#: device-to-host and host-to-device transfers; ``DeepCopy`` allocates a new
#: buffer even between devices that share memory (emulated measurement).
DEFAULT_COPY_OP = "Identity"
COPY_OPS = ("Identity", "DeepCopy")


@functools.lru_cache(maxsize=None)
def _copy_attrs(dtype: str):
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    return {"T": attr_value_pb2.AttrValue(type=tf.as_dtype(dtype).as_datatype_enum),
            DO_NOT_REMOVE_ATTR: attr_value_pb2.AttrValue(b=True)}


#: Where swap-in ops run: on the host (copy starts when triggered) or on the accelerator.
SWAPIN_ON_HOST, SWAPIN_ON_ACCELERATOR = "host", "accelerator"


def resolve_swapin_on(copy_op: str, swapin_on: str | None) -> str:
    """Check ``copy_op`` and ``swapin_on``; ``swapin_on`` defaults to the host for ``Identity`` copies and to the
    accelerator for ``DeepCopy`` (see the module doc)."""
    if copy_op not in COPY_OPS:
        raise GraphError(f"copy_op must be one of {COPY_OPS}, got {copy_op!r}")
    if swapin_on is None:
        swapin_on = SWAPIN_ON_HOST if copy_op == "Identity" else SWAPIN_ON_ACCELERATOR
    if swapin_on not in (SWAPIN_ON_HOST, SWAPIN_ON_ACCELERATOR):
        raise GraphError(f"swapin_on must be 'host' or 'accelerator', got {swapin_on!r}")
    return swapin_on


def apply_swaps(graph: Graph, plan: SwapPlan, *, copy_op: str = DEFAULT_COPY_OP,
                swapin_on: str | None = None) -> PassResult:
    """A copy of ``graph`` with the plan applied: its recompute clones first
    (:func:`tflms.passes.recompute.insert_recomputes`), then its swap ops; the report is the inserted
    names, in insertion order.

    ``swapin_on`` defaults to the host for ``Identity`` copies and to the
    accelerator for ``DeepCopy`` (see the module doc).
    """
    swapin_on = resolve_swapin_on(copy_op, swapin_on)
    swapin_device = plan.config.host_device if swapin_on == SWAPIN_ON_HOST else plan.accelerator_device
    # swaps may go on a graph with recompute clones (the hybrid search plans them there); nothing else twice
    existing = [op.name for op in graph if is_inserted(op.name) and (plan.recomputes or not is_clone(op.name))]
    if existing and plan.changed:
        raise GraphError(f"the graph already holds tflms swap ops (e.g. {existing[0]!r}); rewrite the "
                         "original graph, not a rewritten one")
    new = graph.copy()
    gated = insert_recomputes(new, plan.recomputes)
    for swap in plan.swaps:
        info = new.tensor(swap.tensor)
        attrs = _copy_attrs(swap.dtype)
        new.add_op(swap.swap_out, copy_op, inputs=[swap.tensor], device=plan.config.host_device,
                   attrs=attrs, outputs=[info])
        for consumer in swap.sync_out_consumers:
            new.add_control_input(consumer, swap.swap_out)
        for group in swap.swap_ins:
            new.add_op(group.name, copy_op, inputs=[TensorRef(swap.swap_out, 0)],
                       control_inputs=[group.trigger] if group.trigger else [],
                       device=swapin_device, attrs=attrs, outputs=[info])
            members = set(group.consumers)
            for consumer, index in new.consumers(swap.tensor):
                if consumer in members:
                    new.set_input(consumer, index, TensorRef(group.name, 0))
    swapped = [name for name in inserted_op_names(plan) if name not in set(gated)]
    return PassResult(new, changed=plan.changed, report=tuple(gated + swapped))


def inserted_op_names(plan: SwapPlan) -> list[str]:
    """Names of every op the plan inserts (recompute gates and clones, then swap ops in insertion order)."""
    names = list(dict.fromkeys(name for decision in plan.recomputes for name in decision.inserted))
    for swap in plan.swaps:
        names.append(swap.swap_out)
        names.extend(g.name for g in swap.swap_ins)
    return names
