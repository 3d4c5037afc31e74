"""Small hand-built IR graphs for tests, examples and benchmarks (no TensorFlow needed).

:class:`GraphBuilder` adds ops with given shapes; :func:`mlp_training_graph`
builds the structure of an MLP training step (forward chain, mirrored backward
chain, one variable update per layer), whose levels and swaps can be worked out
by hand and which scales to any number of ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from tflms.ir.graph import DTYPE_BYTES, Graph, TensorInfo, TensorRef

def tensor_info(shape: Sequence[int | None] | None, dtype: str = "float32") -> TensorInfo:
    """TensorInfo with the byte size computed from a fully known shape."""
    num_bytes = None
    if shape is not None and all(d is not None for d in shape) and dtype in DTYPE_BYTES:
        num_bytes = DTYPE_BYTES[dtype]
        for d in shape:
            num_bytes *= d
    return TensorInfo(dtype=dtype, shape=None if shape is None else tuple(shape), num_bytes=num_bytes)


class GraphBuilder:
    """Append ops to an IR graph with one call each."""

    def __init__(self) -> None:
        self.graph = Graph()

    def op(self, name: str, type: str, inputs: Sequence[TensorRef | str] = (), *,
           control: Sequence[str] = (), shape: Sequence[int | None] | None = (32, 64), dtype: str = "float32",
           num_outputs: int = 1) -> TensorRef:
        refs = [TensorRef.parse(i) if isinstance(i, str) else i for i in inputs]
        info = tensor_info(shape, dtype)
        self.graph.add_op(name, type, inputs=refs, control_inputs=control, outputs=[info] * num_outputs)
        return TensorRef(name, 0)


def two_branch_graph(small: Sequence[int] = (4, 4), big: Sequence[int] = (16, 16)) -> Graph:
    """``x`` feeds two branches; each makes a big temporary (``Pad``) and reduces it to a small one (``Sum``).

    Ops ``x``, ``a_big``, ``b_big``, ``a_small``, ``b_small``, ``out`` (levels 0, 1, 1, 2, 2, 3); float32, so
    64 and 1024 bytes with the default shapes. The peak depends on the order: one branch at a time holds one
    big tensor, level order both.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=small)
    a_big = b.op("a_big", "Pad", [x], shape=big)
    b_big = b.op("b_big", "Pad", [x], shape=big)
    a_small = b.op("a_small", "Sum", [a_big], shape=small)
    b_small = b.op("b_small", "Sum", [b_big], shape=small)
    b.op("out", "AddV2", [a_small, b_small], shape=small)
    return b.graph


def forward_backward_chain(small: Sequence[int] = (4, 4), big: Sequence[int] = (16, 16)) -> Graph:
    """``x -> f1 -> f2 -> f3 -> loss``, then ``g3``, ``g2``, ``g1`` read ``f3``, ``f2``, ``f1`` back and ``out``
    sums ``g1``: a 3-layer step's shape with one order only (float32: 64 and 1024 bytes by default)."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=small)
    f1 = b.op("f1", "Pad", [x], shape=big)
    f2 = b.op("f2", "Pad", [f1], shape=big)
    f3 = b.op("f3", "Pad", [f2], shape=big)
    loss = b.op("loss", "Sum", [f3], shape=small)
    g3 = b.op("g3", "MatMul", [loss, f3], shape=big)
    g2 = b.op("g2", "MatMul", [g3, f2], shape=big)
    g1 = b.op("g1", "MatMul", [g2, f1], shape=big)
    b.op("out", "Sum", [g1], shape=small)
    return b.graph


def mlp_training_graph(num_layers: int, *, batch: int = 32, width: int = 64) -> Graph:
    """An MLP training step's structure, ``9 * num_layers + 5`` ops.

    Forward layer i: ``fw/ReadVariableOp_i`` (weight), ``fw/MatMul_i``,
    ``fw/Relu_i``. Loss: ``loss/Sub``, ``loss/Mean``. Backward layer i (in
    reverse): ``gradient_tape/ReluGrad_i``, ``gradient_tape/MatMul_i`` (input
    gradient), ``gradient_tape/MatMul_1_i`` (weight gradient), then
    ``opt/Mul_i`` and ``opt/AssignSubVariableOp_i``.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    b = GraphBuilder()
    act = (batch, width)
    w_shape = (width, width)
    x = b.op("x", "Placeholder", shape=act)
    y = b.op("y", "Placeholder", shape=act)
    lr = b.op("lr", "Const", shape=())
    handles, acts, pre = [], [x], []
    h = x
    for i in range(num_layers):
        handle = b.op(f"var_{i}", "Placeholder", shape=(), dtype="resource")
        w = b.op(f"fw/ReadVariableOp_{i}", "ReadVariableOp", [handle], shape=w_shape)
        m = b.op(f"fw/MatMul_{i}", "MatMul", [h, w], shape=act)
        h = b.op(f"fw/Relu_{i}", "Relu", [m], shape=act)
        handles.append((handle, w))
        pre.append(m)
        acts.append(h)
    diff = b.op("loss/Sub", "Sub", [h, y], shape=act)
    b.op("loss/Mean", "Mean", [diff], shape=())
    grad = diff
    for i in reversed(range(num_layers)):
        handle, w = handles[i]
        g = b.op(f"gradient_tape/ReluGrad_{i}", "ReluGrad", [grad, acts[i + 1]], shape=act)
        gw = b.op(f"gradient_tape/MatMul_1_{i}", "MatMul", [acts[i], g], shape=w_shape)
        grad = b.op(f"gradient_tape/MatMul_{i}", "MatMul", [g, w], shape=act)
        step = b.op(f"opt/Mul_{i}", "Mul", [gw, lr], shape=w_shape)
        b.op(f"opt/AssignSubVariableOp_{i}", "AssignSubVariableOp", [handle, step], shape=None, num_outputs=0)
    return b.graph


def serial_clock(profile):
    """``profile`` (a name or a :class:`~tflms.profiles.HardwareProfile`) timed by the serial clock: every kernel after
    the last, its launch in its time, as every simulation was before issue 46 (:mod:`tflms.sim.clock`). The tuner's
    hand-built scenarios (a swap just needed, a floor that just rules a search out) were worked out on it; on the
    graph clock the tiny graphs they use are launch-bound, and the scenarios they build do not arise."""
    import dataclasses

    from tflms.profiles import get_profile
    return dataclasses.replace(get_profile(profile), host_kernels=True)


def without_copies(graph: Graph) -> Graph:
    """``graph`` with its swap copies (``lms/swap_out_*``, ``lms/swap_in_*``) taken out, each swap-in's readers
    reading the swapped tensor itself, and every other op, XLA attributes included, as it was: the control of a
    bitwise check that the copies change nothing (the same XLA clusters, no copies)."""
    new = graph.copy()
    copies = [op.name for op in new if op.name.startswith(("lms/swap_out_", "lms/swap_in_"))]
    for name in copies:
        if name.startswith("lms/swap_in_"):
            source = new.op(new.op(name).inputs[0].op).inputs[0]  # swap-in <- swap-out <- the tensor
            for reader, index in new.consumers(TensorRef(name, 0)):
                new.set_input(reader, index, source)
    for name in sorted(copies, key=lambda n: not n.startswith("lms/swap_in_")):  # swap-ins first
        for reader in new.control_consumers(name):
            new.remove_control_input(reader, name)
        new.remove_op(name)
    new.lint()
    return new
