"""Per-op compute estimates from static shapes: FLOPs and bytes on a roofline.

A contraction (:data:`CONTRACTION_OPS`) is priced at the rate of its dtype's math mode on the
profile (float16 / bfloat16 on tensor cores, float32 as TF32 where the GPU has it and TF32 execution
is on, else FP32; :meth:`tflms.profiles.HardwareProfile.math_mode`) x the profile's
``contraction_efficiency``; other ops at the FP32 rate; every op's bytes at the memory bandwidth x
``memory_efficiency``. The op's time is the larger of the two (a roofline).

Encode/decode calls inserted by :mod:`tflms.compress.rewrite` (``PartitionedCall``
ops marked with :data:`CODEC_ATTR` and :data:`CODEC_ROLE_ATTR`) are costed by
:func:`codec_time_s`: from measured throughputs when the profile carries them
(``profile.codec_throughputs``, see :func:`tflms.compress.calibrate.with_throughputs`),
else on the roofline, as the memory traffic of the codec's unfused TF kernels
(:data:`CODEC_TRAFFIC`) at the profile's memory bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tflms.ir.graph import Graph, Op
from tflms.ir.consts import is_view_transpose
from tflms.ir.op_types import CONTRACTION_OPS, FREE_OPS
from tflms.profiles import HardwareProfile

#: FLOPs per output element of elementwise-like ops that do more than one op.
_FLOPS_PER_ELEMENT = {
    "FusedBatchNormV3": 10, "FusedBatchNormGradV3": 15, "FusedBatchNorm": 10, "FusedBatchNormGrad": 15,
    "Softmax": 5, "LogSoftmax": 5, "Exp": 4, "Log": 4, "Tanh": 4, "Sigmoid": 4, "Erf": 8, "Erfc": 8, "Rsqrt": 2,
    "Sqrt": 2, "Pow": 8, "TanhGrad": 2, "SigmoidGrad": 3, "SoftmaxCrossEntropyWithLogits": 8,
    "SparseSoftmaxCrossEntropyWithLogits": 8,
}


#: NodeDef attribute of an encode/decode call: the codec's cost key (``Codec.cost_key``, e.g. ``"zvc"``).
CODEC_ATTR = "_tflms_codec"
#: NodeDef attribute of an encode/decode call: ``"encode"`` or ``"decode"``.
CODEC_ROLE_ATTR = "_tflms_codec_role"
ENCODE, DECODE = "encode", "decode"


@dataclasses.dataclass(frozen=True)
class CodecTraffic:
    """Memory traffic of one codec's TF-op implementation, per byte of the uncompressed tensor.

    ``*_passes``: bytes read plus bytes written by its kernels (every intermediate
    written and read once, nothing fused) divided by the uncompressed bytes;
    ``*_kernels``: kernels launched per call (ops that are not metadata-only).
    """

    encode_passes: float
    decode_passes: float
    encode_kernels: int
    decode_kernels: int

    def passes(self, role: str) -> float:
        return self.encode_passes if role == ENCODE else self.decode_passes

    def kernels(self, role: str) -> int:
        return self.encode_kernels if role == ENCODE else self.decode_kernels


#: Counted by ``tflms.compress.calibrate.memory_traffic`` over the traced TF ops of each codec for
#: 2**20 float32 elements, half of them zero (``tests/test_compression.py`` recounts them). The
#: zero-value codec's data-dependent intermediates (indices, values) scale with the non-zero fraction.
CODEC_TRAFFIC: dict[str, CodecTraffic] = {
    "zvc": CodecTraffic(7.28, 16.66, 10, 19),
    "fp16": CodecTraffic(10.0, 1.5, 6, 1),
    "fp16-nosat": CodecTraffic(1.5, 1.5, 1, 1),
    "bf16": CodecTraffic(10.0, 1.5, 6, 1),
    "bf16-nosat": CodecTraffic(1.5, 1.5, 1, 1),
    "int8-block": CodecTraffic(28.25, 19.86, 33, 17),
}


def codec_call(op: Op) -> tuple[str, str] | None:
    """``(cost key, role)`` of an encode/decode call inserted by tflms.compress, else ``None``."""
    attrs = op.attrs
    if not attrs or CODEC_ATTR not in attrs or CODEC_ROLE_ATTR not in attrs:
        return None
    return _attr_str(attrs[CODEC_ATTR]), _attr_str(attrs[CODEC_ROLE_ATTR])


def _attr_str(value: Any) -> str:
    raw = getattr(value, "s", value)
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def codec_time_s(cost_key: str, role: str, num_bytes: int, profile: HardwareProfile,
                 throughputs: Any = None) -> float:
    """Time to encode or decode a tensor of ``num_bytes`` (uncompressed) with the codec ``cost_key``.

    ``throughputs`` (default: ``profile.codec_throughputs`` if the profile has
    them) is an object with ``encode_bytes_per_s(key)`` / ``decode_bytes_per_s(key)``
    returning measured bytes per second or ``None``; without a figure for the
    codec the roofline of :data:`CODEC_TRAFFIC` applies.
    """
    if role not in (ENCODE, DECODE):
        raise ValueError(f"codec role must be {ENCODE!r} or {DECODE!r}, got {role!r}")
    if throughputs is None:
        throughputs = getattr(profile, "codec_throughputs", None)
    if throughputs is not None:
        rate = (throughputs.encode_bytes_per_s(cost_key) if role == ENCODE
                else throughputs.decode_bytes_per_s(cost_key))
        if rate:
            return profile.launch_overhead_s + num_bytes / rate
    traffic = CODEC_TRAFFIC.get(cost_key)
    if traffic is None:
        raise KeyError(f"no throughput or memory-traffic figure for codec {cost_key!r}; known: {sorted(CODEC_TRAFFIC)}")
    return (traffic.kernels(role) * profile.launch_overhead_s
            + traffic.passes(role) * num_bytes / profile.effective_memory_bytes_per_s)


def _elements(shape) -> int:
    if shape is None or any(d is None for d in shape):
        return 0
    return math.prod(shape) if shape else 1


def _in_shape(graph: Graph, op: Op, index: int):
    if index >= len(op.inputs):
        return None
    return graph.tensor(op.inputs[index]).resolved_shape


def _einsum_flops(graph: Graph, op: Op) -> float | None:
    """2 x the product of every distinct index's size (one multiply-add per index tuple).

    ``None`` when the equation is missing, uses an ellipsis, or a dimension is unknown.
    """
    attr = op.attrs.get("equation") if hasattr(op.attrs, "get") else None
    if attr is None:
        return None
    equation = attr.s.decode() if isinstance(attr.s, bytes) else str(attr.s)
    if "..." in equation or "->" not in equation:
        return None
    operands = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for index, letters in enumerate(operands):
        shape = _in_shape(graph, op, index)
        if shape is None or len(shape) != len(letters) or any(d is None for d in shape):
            return None
        sizes.update(zip(letters, shape))
    return 2.0 * math.prod(sizes.values())


def op_flops(graph: Graph, op: Op) -> float:
    """Floating-point operations of one execution of ``op`` (0 if unknown)."""
    if op.type in FREE_OPS:
        return 0.0
    out = op.outputs[0].resolved_shape if op.outputs else None
    out_elems = _elements(out)
    t = op.type
    if t in GRAPPLER_FUSED_OPS:  # grappler's remapper fusions: the contraction, then one pass per fused op
        return _contraction_flops(graph, op, GRAPPLER_FUSED_OPS[t], out, out_elems) + out_elems * _num_fused(op)
    return _contraction_flops(graph, op, t, out, out_elems)


#: Grappler's fused ops (remapper.cc) and the op whose FLOPs their contraction has.
GRAPPLER_FUSED_OPS = {"_FusedConv2D": "Conv2D", "_FusedConv3D": "Conv3D", "_FusedMatMul": "MatMul",
                      "_FusedDepthwiseConv2dNative": "DepthwiseConv2dNative",
                      "_FusedBatchMatMulV2": "BatchMatMulV2"}


def _num_fused(op: Op) -> int:
    """Element-wise ops fused after the contraction (``fused_ops`` attr, e.g. ``[BiasAdd, Relu]``)."""
    attr = op.attrs.get("fused_ops")
    return len(attr.list.s) if attr is not None and attr.HasField("list") else 1


def _contraction_flops(graph: Graph, op: Op, t: str, out, out_elems) -> float:
    if t == "MatMul" and out:
        a = _elements(_in_shape(graph, op, 0))
        return 2.0 * out_elems * (a / out[0] if out[0] else 0)
    if t == "Einsum":
        flops = _einsum_flops(graph, op)
        if flops is not None:
            return flops
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


#: Inputs a training-mode fused batch norm reads twice: the forward reads ``x`` for the batch statistics, then to
#: normalise; the backward reads ``dy`` and ``x`` for the per-channel sums, then for ``dx``. On an H100 (float32,
#: ResNet-50's nine activation shapes at batch 64, docs/profiles/h100-80gb-hbm3-batchnorm.json) cuDNN's kernels
#: took 1.49x the time priced with each input read once, at 2.6-2.9 TB/s for the bytes counted this way.
TWO_PASS_INPUTS = {bn: (0,) for bn in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")} | {
    grad: (0, 1) for grad in ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")}


def op_bytes(graph: Graph, op: Op) -> int:
    """Bytes the op reads and writes (its inputs and outputs; a training-mode fused batch norm's
    :data:`TWO_PASS_INPUTS` twice)."""
    if op.type in FREE_OPS:
        return 0
    total = sum(graph.tensor(ref).num_bytes or 0 for ref in op.inputs)
    if op.type in TWO_PASS_INPUTS and _is_training(op):
        total += sum(graph.tensor(op.inputs[i]).num_bytes or 0 for i in TWO_PASS_INPUTS[op.type] if i < len(op.inputs))
    return total + sum(info.num_bytes or 0 for info in op.outputs)


def _is_training(op: Op) -> bool:
    """A batch norm's ``is_training`` attribute (TensorFlow's default, true, when the graph does not say)."""
    attr = op.attrs.get("is_training") if hasattr(op.attrs, "get") else None
    return True if attr is None else bool(getattr(attr, "b", attr))  # an AttrValue, or a plain value (as _attr_str)


def op_dtype(graph: Graph, op: Op) -> str | None:
    """The dtype a contraction computes in: its first output's (its operands' ``T``; an input may be a
    shape, as ``Conv2DBackpropInput``'s ``input_sizes``), else its first input's; ``None`` if neither is known."""
    if op.outputs and op.outputs[0].dtype:
        return op.outputs[0].dtype
    return graph.tensor(op.inputs[0]).dtype if op.inputs else None


def op_math_mode(graph: Graph, op: Op, profile: HardwareProfile) -> str | None:
    """The math mode ``op`` is priced at on ``profile`` (``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``),
    ``None`` for an op that is no contraction (priced at FP32 CUDA-core rate and memory bandwidth)."""
    if op.type not in CONTRACTION_OPS:
        return None
    return profile.math_mode(op_dtype(graph, op))


def op_compute_s(graph: Graph, op: Op, profile: HardwareProfile) -> float:
    """The roofline's compute term: a contraction's FLOPs at its dtype's math mode
    (:meth:`HardwareProfile.contraction_flops_per_s`), any other op's at the FP32 rate (``effective_flops``)."""
    if op.type in FREE_OPS:
        return 0.0
    flops = op_flops(graph, op)
    if op.type in CONTRACTION_OPS:
        return flops / profile.contraction_flops_per_s(op_dtype(graph, op), conv="Conv" in op.type)
    return flops / profile.effective_flops


def op_memory_s(graph: Graph, op: Op, profile: HardwareProfile) -> float:
    """The roofline's memory term: bytes read and written at the profile's memory bandwidth."""
    if op.type in FREE_OPS:
        return 0.0
    return op_bytes(graph, op) / profile.effective_memory_bytes_per_s


def op_work_s(graph: Graph, op: Op, profile: HardwareProfile) -> float:
    """The roofline's work term of ``op``: max(compute time, memory time), without launch overhead or factor.

    Compute: :func:`op_compute_s` (a contraction at its dtype's math mode); memory: :func:`op_memory_s`.
    On a profile without tensor-core rates (or with every efficiency at ``compute_efficiency``) a float32
    graph costs what it cost before issue 28: the V100 profiles' figures do not move.
    """
    if op.type in FREE_OPS or is_view_transpose(graph, op):
        return 0.0
    return max(op_compute_s(graph, op, profile), op_memory_s(graph, op, profile))


def op_launches(op: Op, profile: HardwareProfile) -> int:
    """Kernel launches :func:`op_time_s` counts in ``op``'s time: none for a free op, a codec call's kernels
    (:data:`CODEC_TRAFFIC`; one where the profile measured the codec's throughput), else one."""
    if op.type in FREE_OPS:
        return 0
    codec = codec_call(op)
    if codec is None:
        return 1
    key, role = codec
    throughputs = getattr(profile, "codec_throughputs", None)
    rate = throughputs is not None and (throughputs.encode_bytes_per_s(key) if role == ENCODE
                                        else throughputs.decode_bytes_per_s(key))
    return 1 if rate or key not in CODEC_TRAFFIC else CODEC_TRAFFIC[key].kernels(role)


def op_time_s(graph: Graph, op: Op, profile: HardwareProfile) -> float:
    """Roofline estimate: launch overhead (+ ``contraction_latency_s`` for a contraction) + the profile's factor
    for the op type (1 unless calibrated, ``HardwareProfile.op_time_factors``) x max(compute time, memory time);
    codec calls: :func:`codec_time_s`."""
    if op.type in FREE_OPS or is_view_transpose(graph, op):
        return 0.0
    codec = codec_call(op)
    if codec is not None:
        key, role = codec
        ref_bytes = (graph.tensor(op.inputs[0]).num_bytes if role == ENCODE and op.inputs
                     else op.outputs[0].num_bytes if op.outputs else 0)
        return codec_time_s(key, role, ref_bytes or 0, profile)
    latency = profile.contraction_latency_s if op.type in CONTRACTION_OPS else 0.0
    return profile.launch_overhead_s + latency + profile.op_time_factor(op.type) * op_work_s(graph, op, profile)
