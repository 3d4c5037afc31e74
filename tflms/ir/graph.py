"""The tflms graph model: ops, tensors and edges of a TensorFlow graph.

A :class:`Graph` holds :class:`Op` records in their original order. Each op keeps
its type, device, data inputs, control inputs and its ``NodeDef`` attributes
untouched; each output tensor carries dtype, static shape and byte size.

Edges change only through :class:`Graph` methods (``add_op``, ``set_input``,
``add_control_input``, ``remove_op``), which keep the consumer index current.
:meth:`Graph.lint` checks the invariants (no dangling inputs, unique names,
acyclic, consumer index consistent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from tflms.errors import GraphError
from tflms.ir.topo import priority_order


@dataclasses.dataclass(frozen=True, order=True)
class TensorRef:
    """Names output ``index`` of op ``op`` (``"op:index"`` in TensorFlow)."""

    op: str
    index: int = 0

    @property
    def name(self) -> str:
        return f"{self.op}:{self.index}"

    @classmethod
    def parse(cls, name: str) -> "TensorRef":
        """Parse ``"op"``, ``"op:1"`` (GraphDef tensor names)."""
        if name.startswith("^"):
            raise GraphError(f"{name!r} is a control input, not a tensor name")
        op, sep, idx = name.rpartition(":")
        if sep and idx.isdigit():
            return cls(op, int(idx))
        return cls(name, 0)

    def __str__(self) -> str:
        return self.name


#: Bytes per element of TensorFlow dtypes (by ``tf.DType.name``).
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "complex64": 8,
               "complex128": 16, "qint8": 1, "quint8": 1, "qint32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Static facts about one output tensor.

    ``shape`` is ``None`` for an unknown rank, else a tuple whose entries are
    ``None`` for unknown dimensions. ``num_bytes`` is ``None`` when the shape is
    not fully known (after batch-size resolution) or the dtype has no fixed size.
    """

    dtype: str
    shape: tuple[int | None, ...] | None
    num_bytes: int | None
    batch_size: int | None = None  # resolves an unknown leading dimension

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def resolved_shape(self) -> tuple[int | None, ...] | None:
        """``shape`` with an unknown leading dimension replaced by ``batch_size``."""
        if self.shape and self.shape[0] is None and self.batch_size is not None:
            return (self.batch_size,) + self.shape[1:]
        return self.shape

    def with_batch_size(self, batch_size: int) -> "TensorInfo":
        """This tensor at another batch size (only if its leading dimension is unknown)."""
        if not self.shape or self.shape[0] is not None:
            return self
        dims = (batch_size,) + self.shape[1:]
        size = DTYPE_BYTES.get(self.dtype)
        num_bytes = None
        if size is not None and all(d is not None for d in dims):
            num_bytes = size
            for d in dims:
                num_bytes *= d
        return TensorInfo(self.dtype, self.shape, num_bytes, batch_size)

    @property
    def fully_defined(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)


@dataclasses.dataclass(eq=False)
class Op:
    """One node. Mutate edges only through :class:`Graph` methods."""

    name: str
    type: str
    device: str
    inputs: list[TensorRef]
    control_inputs: list[str]
    attrs: Any  # the NodeDef's attr map (protobuf), kept untouched
    outputs: tuple[TensorInfo, ...]
    node_def: Any = None  # the original NodeDef (attrs, experimental debug info)

    def output(self, index: int = 0) -> TensorRef:
        if not 0 <= index < len(self.outputs):
            raise GraphError(f"op {self.name!r} ({self.type}) has no output {index}")
        return TensorRef(self.name, index)


class Graph:
    """A mutable, ordered set of ops with a consumer index.

    ``library`` and ``versions`` carry the GraphDef's function library and
    version stamps through unchanged. ``signature`` (a
    :class:`~tflms.ir.tf_io.FunctionSignature`) says how a traced function's
    graph meets its caller; ``resource_bytes`` maps a variable handle tensor to
    the variable's size. Both are ``None``/empty for plain graphs.
    """

    def __init__(self, library: Any = None, versions: Any = None):
        self._ops: dict[str, Op] = {}
        self._consumers: dict[TensorRef, list[tuple[str, int]]] = {}
        self._control_consumers: dict[str, list[str]] = {}
        self.library = library
        self.versions = versions
        self.signature: Any = None
        self.resource_bytes: dict[str, int] = {}

    # ----------------------------------------------------------------- access
    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops.values())

    @property
    def ops(self) -> list[Op]:
        return list(self._ops.values())

    def op(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise GraphError(f"no op named {name!r} in the graph") from None

    def tensor(self, ref: TensorRef | str) -> TensorInfo:
        ref = TensorRef.parse(ref) if isinstance(ref, str) else ref
        op = self.op(ref.op)
        if not 0 <= ref.index < len(op.outputs):
            raise GraphError(f"op {ref.op!r} ({op.type}) has no output {ref.index}")
        return op.outputs[ref.index]

    def consumers(self, ref: TensorRef) -> list[tuple[str, int]]:
        """Data consumers of ``ref`` as ``(op name, input index)``, in op order."""
        return list(self._consumers.get(ref, ()))

    def control_consumers(self, name: str) -> list[str]:
        return list(self._control_consumers.get(name, ()))

    def tensors(self) -> Iterator[TensorRef]:
        for op in self._ops.values():
            for i in range(len(op.outputs)):
                yield TensorRef(op.name, i)

    # ------------------------------------------------------------------ edits
    def add_op(self, name: str, type: str, *, inputs: Sequence[TensorRef] = (),
               control_inputs: Sequence[str] = (), device: str = "", attrs: Any = None,
               outputs: Sequence[TensorInfo] = (), node_def: Any = None) -> Op:
        """Append a new op; its inputs must already exist."""
        if name in self._ops:
            raise GraphError(f"an op named {name!r} already exists")
        op = Op(name=name, type=type, device=device, inputs=[], control_inputs=[],
                attrs=attrs if attrs is not None else {}, outputs=tuple(outputs), node_def=node_def)
        self._ops[name] = op
        for ref in inputs:
            self._check_ref(ref, for_op=name)
            op.inputs.append(ref)
            self._consumers.setdefault(ref, []).append((name, len(op.inputs) - 1))
        for src in control_inputs:
            self.add_control_input(name, src)
        return op

    def append_input(self, op_name: str, ref: TensorRef) -> int:
        """Give ``op_name`` one more data input, ``ref``; returns its index.

        For readers that add every op first and wire them after (a ``GraphDef``
        may list an input before its producer).
        """
        op = self.op(op_name)
        self._check_ref(ref, for_op=op_name)
        op.inputs.append(ref)
        index = len(op.inputs) - 1
        self._consumers.setdefault(ref, []).append((op_name, index))
        return index

    def set_input(self, op_name: str, index: int, ref: TensorRef) -> None:
        """Make input ``index`` of ``op_name`` read ``ref`` instead."""
        op = self.op(op_name)
        if not 0 <= index < len(op.inputs):
            raise GraphError(f"op {op_name!r} has no input {index}")
        self._check_ref(ref, for_op=op_name)
        old = op.inputs[index]
        self._consumers[old].remove((op_name, index))
        if not self._consumers[old]:
            del self._consumers[old]
        op.inputs[index] = ref
        self._consumers.setdefault(ref, []).append((op_name, index))

    def drop_inputs(self, op_name: str) -> None:
        """Take every data input away from ``op_name`` (an op that becomes a source, e.g. a constant)."""
        op = self.op(op_name)
        for i, ref in enumerate(op.inputs):
            self._consumers[ref].remove((op_name, i))
            if not self._consumers[ref]:
                del self._consumers[ref]
        op.inputs.clear()

    def add_control_input(self, op_name: str, src: str) -> None:
        """Add a control edge ``src -> op_name`` (no-op if present)."""
        op = self.op(op_name)
        if src not in self._ops:
            raise GraphError(f"control input {src!r} of {op_name!r} does not exist")
        if src == op_name:
            raise GraphError(f"op {op_name!r} cannot be its own control input")
        if src not in op.control_inputs:
            op.control_inputs.append(src)
            self._control_consumers.setdefault(src, []).append(op_name)

    def remove_control_input(self, op_name: str, src: str) -> None:
        """Remove the control edge ``src -> op_name`` (no-op if absent)."""
        op = self.op(op_name)
        if src in op.control_inputs:
            op.control_inputs.remove(src)
            self._control_consumers[src].remove(op_name)
            if not self._control_consumers[src]:
                del self._control_consumers[src]

    def remove_op(self, name: str) -> None:
        """Remove an op that nothing consumes."""
        op = self.op(name)
        users = [c for i in range(len(op.outputs)) for c in self._consumers.get(TensorRef(name, i), ())]
        if users or self._control_consumers.get(name):
            raise GraphError(f"cannot remove {name!r}: it still has consumers "
                             f"{sorted({u for u, _ in users} | set(self._control_consumers.get(name, ())))}")
        for i, ref in enumerate(op.inputs):
            self._consumers[ref].remove((name, i))
            if not self._consumers[ref]:
                del self._consumers[ref]
        for src in op.control_inputs:
            self._control_consumers[src].remove(name)
        del self._ops[name]

    def with_batch_size(self, batch_size: int) -> "Graph":
        """A copy whose tensors with an unknown leading dimension are sized for ``batch_size``."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise GraphError(f"batch_size must be a positive int, got {batch_size!r}")
        new = self.copy()
        for op in new._ops.values():
            op.outputs = tuple(info.with_batch_size(batch_size) for info in op.outputs)
        new.fill_alias_bytes()
        return new

    def fill_alias_bytes(self) -> int:
        """Give reshaping ops' outputs their input's size where only their shape is unknown; returns how many.

        A ``Reshape`` (or ``Squeeze``, ``Identity``, ... :data:`~tflms.ir.op_types.ALIAS_OPS`) holds exactly
        its input's elements, so its output's size is known whenever the input's is, even when its shape
        comes from a tensor computed at run time (``Tensordot``'s ``[None, None]`` reshapes of Keras's
        ``Dense`` on 3-D inputs), and its input's size is known whenever its output's is (a gradient's
        ``Sum`` over axes computed at run time, reshaped back to the operand's shape: without this the
        upstream gradient it forwards counted 0 bytes). Sizes only; the shapes stay as traced.
        """
        from tflms.ir.op_types import ALIAS_OPS, MULTI_ALIAS_OPS
        filled, progress = 0, True
        while progress:  # passes in graph order until nothing more is known (no topological order: loops)
            progress = False
            for op in self._ops.values():
                if op.type not in ALIAS_OPS or not op.inputs:
                    continue
                outputs = list(op.outputs)
                for k, info in enumerate(outputs):
                    if info.num_bytes is not None:
                        continue
                    source = op.inputs[k] if op.type in MULTI_ALIAS_OPS and k < len(op.inputs) else op.inputs[0]
                    known = self.tensor(source)
                    if known.num_bytes is not None and known.dtype == info.dtype:
                        outputs[k] = dataclasses.replace(info, num_bytes=known.num_bytes)
                        filled += 1
                        progress = True
                op.outputs = tuple(outputs)
                # and backwards: an input of unknown size holds the elements of the output it is reshaped into
                # (a gradient's ``Sum`` over axes known only at run time, then ``Reshape`` d to the input's shape)
                for k, info in enumerate(op.outputs):
                    source = op.inputs[k] if op.type in MULTI_ALIAS_OPS and k < len(op.inputs) else op.inputs[0]
                    producer = self._ops.get(source.op)
                    if info.num_bytes is None or producer is None or source.index >= len(producer.outputs):
                        continue
                    unknown = producer.outputs[source.index]
                    if unknown.num_bytes is None and unknown.dtype == info.dtype:
                        produced = list(producer.outputs)
                        produced[source.index] = dataclasses.replace(unknown, num_bytes=info.num_bytes)
                        producer.outputs = tuple(produced)
                        filled += 1
                        progress = True
        return filled

    def copy(self) -> "Graph":
        """A structural copy: new Op records, shared (immutable) attrs and TensorInfos."""
        new = Graph(self.library, self.versions)
        new.signature = self.signature
        new.resource_bytes = dict(self.resource_bytes)
        for op in self._ops.values():
            new._ops[op.name] = Op(op.name, op.type, op.device, list(op.inputs), list(op.control_inputs),
                                   op.attrs, op.outputs, op.node_def)
        new._consumers = {k: list(v) for k, v in self._consumers.items()}
        new._control_consumers = {k: list(v) for k, v in self._control_consumers.items()}
        return new

    def _check_ref(self, ref: TensorRef, *, for_op: str) -> None:
        src = self._ops.get(ref.op)
        if src is None:
            raise GraphError(f"input {ref.name!r} of {for_op!r} names no op in the graph")
        if not 0 <= ref.index < len(src.outputs):
            raise GraphError(f"input {ref.name!r} of {for_op!r}: op {ref.op!r} ({src.type}) "
                             f"has only {len(src.outputs)} outputs")

    # ---------------------------------------------------------------- queries
    def predecessors(self, name: str) -> list[str]:
        """Data and control predecessors of ``name`` (deduplicated, in order)."""
        op = self.op(name)
        return list(dict.fromkeys([r.op for r in op.inputs] + op.control_inputs))

    def successors(self, name: str) -> list[str]:
        op = self.op(name)
        out = [c for i in range(len(op.outputs)) for c, _ in self._consumers.get(TensorRef(name, i), ())]
        out += self._control_consumers.get(name, [])
        return list(dict.fromkeys(out))

    def adjacency(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Predecessors and successors of every op (data and control, deduplicated), in one pass."""
        preds: dict[str, list[str]] = {}
        succs: dict[str, list[str]] = {name: [] for name in self._ops}
        for name, op in self._ops.items():
            p = list(dict.fromkeys([r.op for r in op.inputs] + op.control_inputs))
            preds[name] = p
            for q in p:
                succs[q].append(name)
        return preds, succs

    def topological_order(self, adjacency=None) -> list[str]:
        """Kahn's algorithm over data and control edges; ties keep graph order.

        Raises :class:`GraphError` naming ops on a cycle.
        """
        preds, succs = adjacency or self.adjacency()
        index = {name: i for i, name in enumerate(self._ops)}
        indegree = {name: len(p) for name, p in preds.items()}
        order = priority_order(indegree, succs, index.__getitem__)
        if len(order) != len(self._ops):
            stuck = sorted(n for n, d in indegree.items() if d > 0)
            raise GraphError(f"the graph has a cycle through {len(stuck)} ops, e.g. {stuck[:5]}; "
                             "TF1 loops (NextIteration) are not supported: use TF2 control flow (tf.while_loop "
                             "inside tf.function)")
        return order

    def to_networkx(self):
        """A ``networkx.DiGraph`` over op names (data and control edges)."""
        import networkx as nx
        g = nx.DiGraph()
        g.add_nodes_from(self._ops)
        for name in self._ops:
            g.add_edges_from((p, name) for p in self.predecessors(name))
        return g

    def lint(self) -> None:
        """Check invariants; raise :class:`GraphError` naming the first violation."""
        expected: dict[TensorRef, list[tuple[str, int]]] = {}
        expected_ctrl: dict[str, list[str]] = {}
        for op in self._ops.values():
            for i, ref in enumerate(op.inputs):
                self._check_ref(ref, for_op=op.name)
                expected.setdefault(ref, []).append((op.name, i))
            if len(set(op.control_inputs)) != len(op.control_inputs):
                raise GraphError(f"op {op.name!r} lists a control input twice")
            for src in op.control_inputs:
                if src not in self._ops:
                    raise GraphError(f"control input {src!r} of {op.name!r} names no op in the graph")
                expected_ctrl.setdefault(src, []).append(op.name)
        if {k: sorted(v) for k, v in expected.items()} != {k: sorted(v) for k, v in self._consumers.items()}:
            stale = {k for k in set(expected) | set(self._consumers)
                     if sorted(expected.get(k, [])) != sorted(self._consumers.get(k, []))}
            bad = sorted(str(k) for k in stale)[:5]
            raise GraphError(f"consumer index is stale for tensors {bad}")
        if {k: sorted(v) for k, v in expected_ctrl.items()} != \
                {k: sorted(v) for k, v in self._control_consumers.items() if v}:
            raise GraphError("control-consumer index is stale")
        self.topological_order()
        from tflms.ir.merges import merge_cycle  # (a leaf module: no cycle of imports)
        cycle = merge_cycle(self)
        if cycle is not None:
            raise GraphError(f"TensorFlow would refuse this graph: {cycle}")

