"""Which compression pass a rewrite runs: a named codec on every swapped tensor it supports, or ``"auto"``'s
choice from the step's measured sparsity; and the report's record of the codecs used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, Category
from tflms.config import COMPRESS_AUTO, LMSConfig
from tflms.errors import ConfigError
from tflms.ir import tf_io
from tflms.ir.graph import Graph, TensorRef
from tflms.policies.swapplan import SwapPlan, skip_reason
from tflms.profiles import HardwareProfile

def _compression_summary(graph: Graph) -> dict[str, str]:
    """``{swapped tensor: codec}`` read from the codec calls in ``graph``."""
    from tflms.sim.cost import ENCODE, codec_call
    out = {}
    for op in graph:
        call = codec_call(op)
        if call is not None and call[1] == ENCODE:
            out[op.inputs[0].name] = call[0]
    return dict(sorted(out.items()))


def _compressor(config: LMSConfig, analysis: Analysis, step: Any,
                example_inputs: Sequence[Any] | None,
                profile: HardwareProfile | None) -> Callable[[Graph, SwapPlan], Graph] | None:
    """The compression pass the config asks for, as ``(swapped graph, plan) -> compressed graph``."""
    if config.compress is None:
        return None
    from tflms.compress.rewrite import apply_compression
    if config.compress != COMPRESS_AUTO:
        from tflms.compress.codecs import get_codec
        codec = get_codec(config.compress)

        def fixed(graph: Graph, plan: SwapPlan) -> Graph:
            choices = {s.tensor: codec for s in plan.swaps if _supports(codec, s.dtype)}
            return apply_compression(graph, plan, choices, allow_lossy=not codec.lossless).graph

        return fixed
    if example_inputs is None or not tf_io.is_concrete_function(step):
        raise ConfigError(
            "compress='auto' measures each candidate tensor's sparsity on real inputs, and this entry point has "
            "none: name a codec instead (compress='zvc' is lossless), or use tflms.function / the Keras callback, "
            "which measure on the first batch")
    from tflms.compress.policy import make_compressor
    from tflms.compress.profiling import profile_tensors
    candidates = [TensorRef(name, i) for name in analysis.order if analysis.categories[name] is Category.FORWARD
                  for i in range(len(analysis.graph.op(name).outputs))
                  if skip_reason(analysis, TensorRef(name, i), config) is None]
    stats = profile_tensors(step, list(example_inputs), candidates, graph=analysis.graph)
    return make_compressor(stats, profile)


def _supports(codec: Any, dtype: str) -> bool:
    try:
        codec.check_dtype(dtype)
    except ConfigError:  # CodecDtypeError: this tensor keeps its plain swap
        return False
    return True

