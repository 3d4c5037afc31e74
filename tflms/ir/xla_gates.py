"""Recompute gates in a step that keeps XLA (issue 47): which stay out of the clusters, which become XLA's optimization
barrier inside one, and what a barrier reads to wait for its trigger, over names or op ids.

A recompute clone waits for its trigger through a gate (:func:`tflms.policies.recompute.gate_name`). Left out of the
clusters, a gate is a boundary of the segment rule (:mod:`tflms.ir.xla_segments`); inside one, it becomes an
``XlaOptimizationBarrier`` that keeps the clones apart from the ops they re-run. :mod:`tflms.passes.xla_clusters`
places the gates with these rules and the simulator's XLA clocks (:mod:`tflms.sim.clusters`, :mod:`tflms.sim.fusion`)
price what it will place; the reasons are in the pass's module doc, "Recompute gates".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from tflms.ir.names import CLONE_PREFIX, is_clone, is_inserted
from tflms.ir.op_types import ALIAS_OPS, METADATA_OPS, XLA_ELEMENTWISE, XLA_NEVER_DTYPES, XLA_TAKES_PRODUCERS

#: A node: an op name in the pass, an op id in the simulator.
Node = TypeVar("Node", bound=Hashable)
#: A tensor of :func:`barrier_read`: a ``TensorRef`` in the pass, a tensor id in the simulator.
T = TypeVar("T", bound=Hashable)


def is_gate(op_type: str, name: str) -> bool:
    """Whether an op is a recompute gate (an ``Identity`` with its trigger as control input,
    :func:`tflms.policies.recompute.gate_name`): it stays out, so that the clones wait for the trigger's cluster and
    XLA cannot merge them with the forward ops they re-run."""
    return op_type == "Identity" and name.startswith(CLONE_PREFIX + "gate_")


def is_tflms_copy(op_type: str, name: str) -> bool:
    """Whether an op is one of tflms's copies (a swap, a recompute gate, a codec call): never in a cluster, but for
    the gates :func:`gate_role` lets in."""
    return is_inserted(name) and (not is_clone(name) or is_gate(op_type, name))


#: The op an in-cluster recompute gate becomes (``tf2xla``'s ``XlaOptimizationBarrier``: its outputs are its inputs,
#: and XLA neither merges what it separates nor, on a GPU, schedules a reader before it).
BARRIER = "XlaOptimizationBarrier"
#: :func:`gate_role`: the gate becomes a barrier inside its cluster, or stays an ``Identity`` inside it.
GATE_BARRIER, GATE_IDENTITY = "barrier", "identity"


def may_be_compile_time_constant(dtype: str) -> bool:
    """Whether a tensor of ``dtype`` may be an argument XLA needs at compile time: a shape, an axis, a permutation, a
    size, which TensorFlow types ``int32`` or ``int64``. Behind a barrier it is no constant any more, and its cluster
    fails to compile ("XLA compilation requires that operator arguments that represent shapes or dimensions be
    evaluated to concrete values")."""
    return dtype in ("int32", "int64")


def barrier_operand(trigger_dtypes: Sequence[str], trigger_on_accelerator: bool) -> int | None:
    """Which output of a recompute gate's trigger an in-cluster barrier reads: the first on the accelerator of a type
    XLA compiles, or ``None`` (module doc of :mod:`tflms.passes.xla_clusters`, "Recompute gates")."""
    if not trigger_on_accelerator:
        return None
    for k, dtype in enumerate(trigger_dtypes):
        if dtype not in XLA_NEVER_DTYPES and dtype != "resource":
            return k
    return None


#: How many ops XLA fuses into their consumers :func:`barrier_read` looks back through from a barrier's trigger.
BARRIER_READ_DEPTH = 8
#: The dtypes a barrier may read in place of its trigger's output (:func:`barrier_read`): data, never a shape.
BARRIER_READ_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def fuses_into_readers(readers: Sequence[tuple[str, str]]) -> bool:
    """Whether XLA can fuse an op into every reader of its output (``(name, type)`` each): each is fusible, a
    reduction (an input fusion), a variable update or a view. XLA's producer-consumer fusion takes a producer into
    all its consumers or none, so an op read by a product, a convolution or anything else that takes no producers
    writes its output to memory whatever else reads it (:mod:`tflms.sim.fusion`). Readers a tflms pass inserted
    (gates, copies; not clones) and those that read no data (``Shape``) are not counted.

    :func:`barrier_read` walks back only through ops that fuse so: a trigger whose output a product reads (the
    attention output's gradient, transposed for the products that read it) is in memory already, and its barrier
    reads it there. Taken by type alone, the walk went on to a view of the transpose's own input, and the barrier
    made XLA write that too (BERT-base, 0.68 ms a layer at batch 1872 in mixed_bfloat16 on h200-141gb)."""
    return all(kind in XLA_TAKES_PRODUCERS or kind in ALIAS_OPS for name, kind in readers
               if kind not in METADATA_OPS and (is_clone(name) or not is_inserted(name)))


def barrier_read(trigger_tensor: T, producer: Callable[[T], Node], inputs: Callable[[Node], Sequence[T]],
                 fused: Callable[[Node], bool], may_read: Callable[[T], bool],
                 depth: int = BARRIER_READ_DEPTH) -> T:
    """The tensor an in-cluster barrier reads to wait for its trigger (module doc of
    :mod:`tflms.passes.xla_clusters`, "Recompute gates"): the trigger's output (``trigger_tensor``,
    :func:`barrier_operand`'s), or, where the trigger is an op XLA fuses into its consumers (``fused(op)``), a tensor
    that reaches memory anyway, the output of an op no fusion takes in, which the trigger's fused chain reads: found
    by walking back at most ``depth`` fused ops, through the inputs ``may_read`` allows (the caller's rule: a float
    tensor of the same cluster, produced on the accelerator by an op of the step that descends from a gradient op,
    :func:`gradient_descendants`). Where the walk finds none, the trigger's output.

    A barrier's operands reach memory. Read of a fused op, the barrier writes a tensor XLA would have kept in
    registers: with Keras's batch norm in mixed precision, the float32 cast of an incoming gradient, twice the bytes
    of the ``bfloat16`` gradient its kernel reads (ResNet-50 at batch 8960 on h200-141gb: 26.8 GiB held at the
    peak). A tensor the chain reads is an input of the same fused kernel, so the clone waits as long, to the kernel,
    and still for the backward pass: the tensor descends from a gradient op, as the trigger does."""
    frontier = [trigger_tensor]
    for _ in range(depth):
        found = []
        for x in frontier:
            op = producer(x)
            if fused(op):
                found.extend(y for y in dict.fromkeys(inputs(op)) if may_read(y))
        if not found:
            break
        for y in found:
            if not fused(producer(y)):
                return y
        frontier = list(dict.fromkeys(found))
    return trigger_tensor


def gradient_descendants(preds: Callable[[Node], Sequence[Node]], seed: Callable[[Node], bool]
                         ) -> Callable[[Node], bool]:
    """Whether a node descends by data from a gradient op (``seed``; ``preds``: its data predecessors), memoized: a
    node so descended runs in the backward pass, after the gradients it reads exist (:func:`barrier_read`)."""
    known: dict = {}

    def descends(node: Node) -> bool:
        stack = [node]
        while stack:
            n = stack[-1]
            if n in known:
                stack.pop()
                continue
            if seed(n):
                known[n] = True
                stack.pop()
                continue
            ps = preds(n)
            if any(known.get(p) for p in ps):
                known[n] = True
                stack.pop()
                continue
            todo = [p for p in ps if p not in known]
            if todo:
                stack.extend(todo)
                continue
            known[n] = False
            stack.pop()
        return known[node]
    return descends


def barrier_passes(gated_dtype: str, reader_types: Sequence[str]) -> bool:
    """Whether a barrier may pass a gated tensor to its clones (of these types): it is no compile-time argument of
    theirs (:func:`gate_role`)."""
    return not may_be_compile_time_constant(gated_dtype) or all(t in XLA_ELEMENTWISE for t in reader_types)


def gate_role(gated_dtype: str, trigger_dtypes: Sequence[str], trigger_on_accelerator: bool,
              readers: Sequence[tuple[str, Sequence[str], Sequence[str]]]) -> str | None:
    """Where a recompute gate sits when its step keeps XLA: :data:`GATE_BARRIER` or :data:`GATE_IDENTITY` inside a
    cluster, or ``None``: outside them all, a boundary (module doc of :mod:`tflms.passes.xla_clusters`, "Recompute
    gates").

    ``gated_dtype``: the tensor it passes; ``trigger_dtypes`` / ``trigger_on_accelerator``: its trigger's outputs and
    where they live; ``readers``: for each clone reading it, its type and the dtypes of its inputs and outputs.

    - A gated tensor that may be a compile-time argument (:func:`may_be_compile_time_constant`) and that a clone
      other than an element-wise one (:data:`~tflms.ir.op_types.XLA_ELEMENTWISE`) reads keeps an ``Identity`` gate,
      which XLA sees through to a constant. It sits inside the cluster where each clone reading it has another input
      that is no such tensor (another clone's output, or a barrier's: that input keeps the clone apart from the op it
      re-runs), or computes nothing but such integers (shape arithmetic: XLA folds it, and merging it with its
      original would keep nothing large alive).
    - Any other tensor's gate becomes a barrier where the trigger has an output to read (:func:`barrier_operand`).
    """
    if barrier_operand(trigger_dtypes, trigger_on_accelerator) is None:
        return None
    if barrier_passes(gated_dtype, [t for t, _, _ in readers]):
        return GATE_BARRIER
    if all(any(not may_be_compile_time_constant(d) for d in inputs)
           or all(may_be_compile_time_constant(d) for d in outputs) for _, inputs, outputs in readers):
        return GATE_IDENTITY
    return None


def gates_seen_through(order: Sequence[Node], barrier: Callable[[Node], bool], trigger: Callable[[Node], Node | None],
                       gated_clone: Callable[[Node], Node | None], input_gates: Callable[[Node], Sequence[Node]]
                       ) -> set[Node]:
    """The barrier gates (``barrier(gate)``, in ``order``, a topological one) that stay ``Identity`` s inside their
    cluster: each gates the output of a clone (``gated_clone(gate)``) that already waits for the same trigger
    (``trigger(gate)``) through one of its own input gates (``input_gates(clone)``), a barrier or a gate seen through
    itself.

    A clone that reads only clones has its first input gated with its own trigger
    (:func:`tflms.policies.recompute.clone_inputs`), and in a chain whose clones share a trigger that gate adds no wait:
    the clone it gates was computed from a barrier's output of the same trigger. As a barrier it would still be a
    fusion boundary, the clone before it written to memory and read back. Seen through, XLA fuses the chain, and no
    clone can merge with the op it re-runs: each reads, at some distance, a barrier's output."""
    through: set[Node] = set()
    for gate in order:
        if not barrier(gate):
            continue
        clone = gated_clone(gate)
        if clone is None:
            continue
        want = trigger(gate)
        if want is not None and any(trigger(h) == want and (h in through or barrier(h)) for h in input_gates(clone)):
            through.add(gate)
    return through
