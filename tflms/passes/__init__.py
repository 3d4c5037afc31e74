"""Graph passes: each takes an IR graph and returns a :class:`PassResult` (graph, changed, report).

The pipeline (:func:`tflms.pipeline.rewrite_step`) runs them in this order:

1. :func:`apply_swaps` inserts a swap plan's copy ops (report: the inserted op names);
2. :func:`tflms.compress.rewrite.apply_compression` wraps chosen swaps in codecs (report: the choices);
3. :func:`place_swaps` puts each replica's swap ops on that replica's host (report: the placement);
4. :func:`tflms.passes.order.enforce_order` pins a lower-peak execution order with control edges, when
   ``LMSConfig.orders`` (report: :class:`~tflms.passes.order.OrderReport`);
5. :func:`tflms.passes.xla_clusters.cluster_for_xla` marks the compute ops for XLA in clusters between the copies,
   for a step that keeps XLA (report: :class:`~tflms.passes.xla_clusters.ClusterReport`).

No pass modifies its input graph; each output is linted by the pipeline.
"""

from tflms.passes.place import Placement, SwapPlacement, host_for, place_swaps
from tflms.passes.result import PassResult
from tflms.passes.swaps import DEFAULT_COPY_OP, apply_swaps, inserted_op_names

__all__ = ["DEFAULT_COPY_OP", "PassResult", "Placement", "SwapPlacement", "apply_swaps", "host_for",
           "inserted_op_names", "place_swaps"]
