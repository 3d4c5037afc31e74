"""Per-op compute estimates from static shapes: FLOPs and bytes on a roofline."""

from __future__ import annotations

import math

from tflms.ir.graph import Graph, Op
from tflms.sim.profiles import HardwareProfile

#: FLOPs per output element of elementwise-like ops that do more than one op.
_FLOPS_PER_ELEMENT = {
    "FusedBatchNormV3": 10, "FusedBatchNormGradV3": 15, "FusedBatchNorm": 10, "FusedBatchNormGrad": 15,
    "Softmax": 5, "LogSoftmax": 5, "Exp": 4, "Log": 4, "Tanh": 4, "Sigmoid": 4, "Erf": 8, "Rsqrt": 2,
    "Sqrt": 2, "Pow": 8, "TanhGrad": 2, "SigmoidGrad": 3, "SoftmaxCrossEntropyWithLogits": 8,
    "SparseSoftmaxCrossEntropyWithLogits": 8,
}
#: Ops that cost nothing on the accelerator (metadata or aliasing).
FREE_OPS = frozenset({"Const", "Placeholder", "_Arg", "_Retval", "NoOp", "Shape", "ShapeN", "Size", "Rank",
                      "ReadVariableOp", "VarHandleOp", "Identity", "Reshape", "Squeeze", "ExpandDims",
                      "StopGradient", "Snapshot", "PreventGradient", "BroadcastGradientArgs"})


def _elements(shape) -> int:
    if shape is None or any(d is None for d in shape):
        return 0
    return math.prod(shape) if shape else 1


def _in_shape(graph: Graph, op: Op, index: int):
    if index >= len(op.inputs):
        return None
    return graph.tensor(op.inputs[index]).resolved_shape


def op_flops(graph: Graph, op: Op) -> float:
    """Floating-point operations of one execution of ``op`` (0 if unknown)."""
    if op.type in FREE_OPS:
        return 0.0
    out = op.outputs[0].resolved_shape if op.outputs else None
    out_elems = _elements(out)
    t = op.type
    if t == "MatMul" and out:
        a = _elements(_in_shape(graph, op, 0))
        return 2.0 * out_elems * (a / out[0] if out[0] else 0)
    if t in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and out:
        a = _elements(_in_shape(graph, op, 0))
        return 2.0 * out_elems * (a * out[-1] / out_elems if out_elems else 0)
    if t in ("Conv2D", "Conv3D"):
        f = _in_shape(graph, op, 1)
        return 2.0 * out_elems * (_elements(f) / f[-1] if f and f[-1] else 0)
    if t in ("DepthwiseConv2dNative",):
        f = _in_shape(graph, op, 1)
        return 2.0 * out_elems * (f[0] * f[1] if f and None not in f[:2] else 0)
    if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2", "Conv2DBackpropFilter", "Conv3DBackpropFilterV2"):
        grad = _elements(_in_shape(graph, op, 2))
        f = _in_shape(graph, op, 1) if "Input" in t else out
        return 2.0 * grad * (_elements(f) / f[-1] if f and f[-1] else 0)
    if t in ("DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"):
        grad = _elements(_in_shape(graph, op, 2))
        f = _in_shape(graph, op, 1) if "Input" in t else out
        return 2.0 * grad * (f[0] * f[1] if f and None not in f[:2] else 0)
    if t in ("MaxPool", "AvgPool", "MaxPoolGrad", "AvgPoolGrad", "MaxPool3D", "AvgPool3D"):
        biggest = max([out_elems] + [_elements(_in_shape(graph, op, i)) for i in range(len(op.inputs))])
        return float(biggest) * 4
    biggest_in = max([_elements(_in_shape(graph, op, i)) for i in range(len(op.inputs))], default=0)
    return float(max(out_elems, biggest_in)) * _FLOPS_PER_ELEMENT.get(t, 1)


def op_bytes(graph: Graph, op: Op) -> int:
    """Bytes the op reads and writes (its inputs and outputs)."""
    if op.type in FREE_OPS:
        return 0
    total = sum(graph.tensor(ref).num_bytes or 0 for ref in op.inputs)
    return total + sum(info.num_bytes or 0 for info in op.outputs)


def op_time_s(graph: Graph, op: Op, profile: HardwareProfile) -> float:
    """Roofline estimate: launch overhead + max(compute time, memory time)."""
    if op.type in FREE_OPS:
        return 0.0
    compute = op_flops(graph, op) / profile.effective_flops
    memory = op_bytes(graph, op) / profile.effective_memory_bytes_per_s
    return profile.launch_overhead_s + max(compute, memory)
