"""Measure how compressible a training step's activations really are.

:func:`profile_tensors` runs the forward part of a traced step once on real
inputs and measures every candidate tensor: the fraction of non-zero elements
(what zero-value compression keeps), the range of its finite values, the
fraction of non-finite values and, per lossy codec, the fraction of values beyond
its storage range (which would saturate).

The user's variables are never changed. The step's IR graph is *pruned* to the
ancestors of the candidates: the optimizer's updates, the loss and the backward
pass are gone, so nothing that writes a variable is left in the common case. If
a writer does remain (a forward op that updates state before a candidate is
computed, e.g. a random-seed counter), the variables it writes are snapshot
before the run and restored after it, and the report lists them. The pruned
graph is imported into a fresh ``tf.function`` that captures the step's own
variable handles and returns the candidates.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tflms.analysis.cto import is_update_type
from tflms.compress.codecs import CODEC_NAMES, Codec, finite_range, get_codec, nonzero_fraction
from tflms.errors import GraphError
from tflms.ir import tf_io
from tflms.ir.graph import Graph, TensorRef

logger = logging.getLogger(__name__)

#: Import scope of the pruned step inside the probe function.
PROBE_SCOPE = "tflms_probe"


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """Measured facts about one tensor's values in one step."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    num_elements: int
    nonzero_fraction: float
    value_min: float
    value_max: float
    nonfinite_fraction: float
    out_of_range: tuple[tuple[str, float], ...] = ()  # (codec cost key, fraction beyond its range)

    @property
    def sparsity(self) -> float:
        """Fraction of elements whose bits are all zero."""
        return 1.0 - self.nonzero_fraction

    @property
    def num_bytes(self) -> int:
        from tflms.ir.graph import DTYPE_BYTES
        return self.num_elements * DTYPE_BYTES.get(self.dtype, 0)

    def out_of_range_fraction(self, codec: Codec) -> float:
        """Measured fraction beyond ``codec``'s range (0 for codecs without a range limit or not measured)."""
        return dict(self.out_of_range).get(codec.cost_key, 0.0)

    def zvc_ratio(self) -> float:
        """Uncompressed / zero-value-compressed bytes at the measured sparsity."""
        encoded = get_codec("zvc").compressed_bytes(self.num_elements, self.dtype, self.nonzero_fraction)
        return self.num_bytes / encoded if encoded else math.inf

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        out["out_of_range"] = dict(self.out_of_range)
        out["sparsity"] = self.sparsity
        out["zvc_ratio"] = self.zvc_ratio()
        out["num_bytes"] = self.num_bytes
        return out


def measure_array(name: str, array, codecs: Sequence[Codec] = ()) -> TensorStats:
    """:class:`TensorStats` of one numpy array (``codecs``: lossy codecs whose range to check)."""
    import numpy as np
    import tensorflow as tf
    array = np.asarray(array)
    if tf.as_dtype(array.dtype).is_floating:
        low, high, nonfinite = finite_range(array)
    else:
        low, high = (float(array.min()), float(array.max())) if array.size else (math.nan, math.nan)
        nonfinite = 0.0
    out_of_range = tuple((c.cost_key, c.out_of_range_fraction(array)) for c in codecs
                         if not c.lossless and _supports(c, array.dtype))
    return TensorStats(tensor=name, dtype=str(array.dtype), shape=tuple(int(d) for d in array.shape),
                       num_elements=int(array.size), nonzero_fraction=nonzero_fraction(array), value_min=low,
                       value_max=high, nonfinite_fraction=nonfinite, out_of_range=out_of_range)


def _supports(codec: Codec, dtype) -> bool:
    import tensorflow as tf
    try:
        return tf.as_dtype(dtype) in codec.supported_dtypes
    except TypeError:
        return False


@dataclasses.dataclass(frozen=True)
class ProfileReport:
    """What one profiling run measured, and how it ran."""

    stats: Mapping[str, TensorStats]  # by tensor name, in the order asked
    kept_ops: int
    pruned_ops: int
    restored_variables: tuple[str, ...]
    elapsed_s: float

    def __getitem__(self, tensor: TensorRef | str) -> TensorStats:
        return self.stats[tensor.name if isinstance(tensor, TensorRef) else tensor]

    def mean_sparsity(self, weighted: bool = True) -> float:
        """Mean sparsity over the tensors (weighted by size by default)."""
        values = list(self.stats.values())
        if not values:
            return 0.0
        if weighted:
            total = sum(s.num_elements for s in values)
            return sum(s.sparsity * s.num_elements for s in values) / total if total else 0.0
        return sum(s.sparsity for s in values) / len(values)

    def zvc_ratio(self) -> float:
        """Overall zero-value compression ratio: all tensors' bytes / all their encoded bytes."""
        zvc = get_codec("zvc")
        raw = sum(s.num_bytes for s in self.stats.values())
        enc = sum(zvc.compressed_bytes(s.num_elements, s.dtype, s.nonzero_fraction) for s in self.stats.values())
        return raw / enc if enc else math.inf

    def table(self) -> str:
        lines = [f"{'tensor':<58}{'dtype':>9}{'MiB':>9}{'sparsity':>10}{'zvc ratio':>11}{'min':>11}{'max':>11}"]
        for s in self.stats.values():
            lines.append(f"{s.tensor[-57:]:<58}{s.dtype:>9}{s.num_bytes / 2**20:>9.2f}{s.sparsity:>10.3f}"
                         f"{s.zvc_ratio():>11.2f}{s.value_min:>11.3g}{s.value_max:>11.3g}")
        lines.append(f"{len(self.stats)} tensors, size-weighted sparsity {self.mean_sparsity():.3f}, overall zvc ratio "
                     f"{self.zvc_ratio():.2f}; ran {self.kept_ops} of {self.kept_ops + self.pruned_ops} ops"
                     + (f"; restored {list(self.restored_variables)}" if self.restored_variables else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"tensors": [s.to_dict() for s in self.stats.values()], "kept_ops": self.kept_ops,
                "pruned_ops": self.pruned_ops, "restored_variables": list(self.restored_variables),
                "elapsed_s": self.elapsed_s, "mean_sparsity": self.mean_sparsity(), "zvc_ratio": self.zvc_ratio()}


def prune_to(graph: Graph, tensors: Iterable[TensorRef]) -> Graph:
    """A copy of ``graph`` holding only the ops ``tensors`` need (data and control ancestors)."""
    wanted = sorted(set(tensors))
    for ref in wanted:
        graph.tensor(ref)  # raises naming a missing op or output
    needed: set[str] = set()
    stack = [ref.op for ref in wanted]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(p for p in graph.predecessors(name) if p not in needed)
    pruned = graph.copy()
    for name in reversed(graph.topological_order()):
        if name not in needed:
            pruned.remove_op(name)
    return pruned


def _written_variables(graph: Graph, concrete) -> list[Any]:
    """Python variables that writer ops left in ``graph`` write (by their captured handles)."""
    sig = graph.signature
    captured = dict(zip(sig.input_names[len(sig.input_names) - sig.num_captures:], concrete.captured_inputs))
    by_handle = {id(getattr(v, "handle", None)): v for v in concrete.graph.variables}
    written, seen = [], set()
    for op in graph:
        if not is_update_type(op.type):
            continue
        handle_op = op.inputs[0].op if op.inputs else None
        variable = by_handle.get(id(captured.get(handle_op))) if handle_op else None
        if variable is None:
            raise GraphError(f"{op.name!r} ({op.type}) writes state the candidates depend on and its variable "
                             "cannot be found among the step's captures, so it cannot be restored; profile tensors "
                             "computed before it")
        if id(variable) not in seen:
            seen.add(id(variable))
            written.append(variable)
    return written


def profile_tensors(concrete_function, args: Sequence[Any], tensors: Iterable[TensorRef | str], *,
                    graph: Graph | None = None, codecs: Sequence[Codec | str] = CODEC_NAMES) -> ProfileReport:
    """Run the forward part of ``concrete_function`` on ``args`` once and measure ``tensors``.

    ``args``: the step's positional tensor arguments (as for a call).
    ``graph``: its IR (default: read from the function). ``codecs``: lossy
    codecs whose range is checked. The step's variables are unchanged
    afterwards (see the module doc).
    """
    import numpy as np
    import tensorflow as tf

    start = time.perf_counter()
    refs = list(dict.fromkeys(TensorRef.parse(t) if isinstance(t, str) else t for t in tensors))
    codec_objs = [get_codec(c) if isinstance(c, str) else c for c in codecs]
    graph = graph if graph is not None else tf_io.from_concrete_function(concrete_function)
    sig = graph.signature
    if sig is None:
        raise GraphError("profile_tensors needs the IR of a ConcreteFunction (read with from_concrete_function)")
    pruned = prune_to(graph, refs)
    written = _written_variables(pruned, concrete_function)
    num_args = len(sig.input_names) - sig.num_captures
    flat = [tf.convert_to_tensor(a) for a in tf.nest.flatten(list(args))]
    if len(flat) != num_args:
        raise GraphError(f"the step takes {num_args} tensor arguments, got {len(flat)}: pass the same positional "
                         "arguments as for a call of the step")
    graph_def = tf_io.to_graph_def(pruned)
    present = {op.name for op in pruned}
    names = [ref.name for ref in refs]
    handles = list(concrete_function.captured_inputs)

    @tf.function(autograph=False)
    def probe(*inputs):
        func_graph = tf.compat.v1.get_default_graph()
        feeds = list(inputs) + [func_graph.capture(h) for h in handles]
        input_map = {f"{name}:0": t for name, t in zip(sig.input_names, feeds) if name in present}
        return tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=names,
                                              name=PROBE_SCOPE)

    saved = [(v, np.array(v.numpy(), copy=True)) for v in written]
    try:
        values = probe(*flat)
    finally:
        for variable, value in saved:
            variable.assign(value)
    stats = {name: measure_array(name, np.asarray(value), codec_objs) for name, value in zip(names, values)}
    restored = tuple(getattr(v, "path", None) or v.name for v, _ in saved)
    if restored:
        logger.info("tflms: profiling restored %d variables written before the candidates: %s", len(restored),
                    restored)
    return ProfileReport(stats=stats, kept_ops=len(pruned), pruned_ops=len(graph) - len(pruned),
                         restored_variables=restored, elapsed_s=time.perf_counter() - start)
