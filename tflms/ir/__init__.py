"""The graph model (IR): ops, tensors, edges; TensorFlow graphs in and out."""

from tflms.ir.graph import Graph, Op, TensorInfo, TensorRef

__all__ = ["Graph", "Op", "TensorInfo", "TensorRef"]
