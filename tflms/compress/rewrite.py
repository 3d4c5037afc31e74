"""Compressed swaps: encode before the swap-out, decode after each swap-in.

:func:`apply_compression` runs after :func:`~tflms.passes.swaps.apply_swaps`. For
every swapped tensor ``T = <op>:<idx>`` with a chosen codec it inserts, in a copy
of the graph:

- ``lms/encode_<op>_<idx>``: a ``PartitionedCall`` of the codec's traced
  ``encode`` on the tensor's device (the accelerator), reading ``T``; its outputs
  are the codec's *parts* (and, when ``T``'s static shape is not fully known,
  ``tf.shape(T)`` as a last, int32 output that stays on the device);
- one swap-out/swap-in pair per part. Part 0 keeps the plan's names
  (``lms/swap_out_<op>_<idx>``, ``lms/swap_in_<op>_<idx>_<group>``), which now copy
  the part instead of ``T``; part ``k > 0`` gets ``..._part<k>`` copies with the
  same device, the same trigger (control input) and the same sync-out edges;
- ``lms/decode_<op>_<idx>_<group>``: a ``PartitionedCall`` of the codec's
  ``decode`` on the consumers' device, reading the group's swapped-in parts; the
  group's consumers read its output instead of the swap-in.

So only the encoded parts cross the host link, and TensorFlow's implicit
``_Send``/``_Recv`` pairs move them exactly as they moved ``T`` (the swap-ins stay
on the host, see :mod:`tflms.passes.swaps`). The traced ``FunctionDef`` s are added
to a *copy* of the graph's function library under deterministic names
(``tflms_<role>_<codec>_<dtype>_<shape>``); the input graph is not modified, and the
same graph, plan and choices give a byte-identical result.

Sizes in the IR. Each part's :class:`~tflms.ir.graph.TensorInfo` carries its
static shape when TensorFlow knows it. A part whose size depends on the data (the
zero-value codec's values) or on an unknown batch dimension is recorded with
``shape=None`` and ``num_bytes`` *predicted* by ``Codec.part_bytes`` at the
choice's measured ``nonzero_fraction`` (1.0, the worst case, if not measured):
the simulator then moves the predicted bytes, and nothing re-sizes the part by
mistake (``with_batch_size`` leaves unknown-rank tensors alone, so size the graph
for its batch *before* compressing: predictions are not redone afterwards).

Lossy codecs (``fp16``, ``bf16``, ``int8-block``) change activation values: they
are refused with :class:`~tflms.errors.ConfigError` unless ``allow_lossy=True``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tflms.compress.codecs import Codec, get_codec, require_lossless_allowed
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import DTYPE_BYTES, Graph, TensorInfo, TensorRef
from tflms.ir.tf_io import DO_NOT_REMOVE_ATTR
from tflms.passes.swaps import inserted_op_names as plan_op_names
from tflms.passes.result import PassResult
from tflms.policies.eligibility import INSERTED_PREFIX
from tflms.policies.swapplan import SwapDecision, SwapPlan
from tflms.sim.cost import CODEC_ATTR, CODEC_ROLE_ATTR, DECODE, ENCODE

logger = logging.getLogger(__name__)

#: Op type of the encode/decode calls (the codecs are stateless).
CALL_OP = "PartitionedCall"
#: Prefix of the FunctionDefs this pass adds to the library.
FUNCTION_PREFIX = "tflms"
#: dtype of the shape output that encode adds when the static shape is not fully known.
SHAPE_DTYPE = "int32"


@dataclasses.dataclass(frozen=True)
class CompressionChoice:
    """Compress one swapped tensor with ``codec``.

    ``nonzero_fraction`` (measured, see :mod:`tflms.compress.profiling`) predicts
    the size of data-dependent parts; 1.0 assumes the worst case.
    """

    tensor: TensorRef
    codec: Codec
    nonzero_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise ConfigError(f"{self.tensor}: codec must be a tflms.compress Codec, got {self.codec!r}")
        if not 0.0 <= float(self.nonzero_fraction) <= 1.0:
            raise ConfigError(f"{self.tensor}: nonzero_fraction must be in [0, 1], got {self.nonzero_fraction!r}")


ChoiceLike = Codec | str | CompressionChoice


def encode_op_name(tensor: TensorRef) -> str:
    return f"{INSERTED_PREFIX}encode_{tensor.op}_{tensor.index}"


def decode_op_name(tensor: TensorRef, group: int) -> str:
    return f"{INSERTED_PREFIX}decode_{tensor.op}_{tensor.index}_{group}"


def part_op_name(base: str, part: int) -> str:
    """Name of part ``part``'s copy op: part 0 keeps the plan's name ``base``."""
    return base if part == 0 else f"{base}_part{part}"


def normalize_choices(plan: SwapPlan, choices: Mapping[TensorRef | str, ChoiceLike] | Iterable[CompressionChoice],
                      *, allow_lossy: bool = False) -> tuple[CompressionChoice, ...]:
    """Check ``choices`` against ``plan`` and return them in plan order.

    Keys are tensors (``TensorRef`` or ``"op:idx"``); values are codecs, codec
    names or :class:`CompressionChoice`. Raises :class:`ConfigError` for a tensor
    the plan does not swap, a codec that does not support the tensor's dtype, or
    a lossy codec without ``allow_lossy``.
    """
    if isinstance(choices, Mapping):
        items = list(choices.items())
    else:
        items = [(c.tensor, c) for c in choices]
    by_tensor: dict[TensorRef, CompressionChoice] = {}
    swapped = {s.tensor: s for s in plan.swaps}
    for key, value in items:
        ref = TensorRef.parse(key) if isinstance(key, str) else key
        if isinstance(value, CompressionChoice):
            choice = value if value.tensor == ref else dataclasses.replace(value, tensor=ref)
        else:
            codec = get_codec(value) if isinstance(value, str) else value
            choice = CompressionChoice(ref, codec)
        if ref not in swapped:
            raise ConfigError(f"cannot compress {ref.name}: the plan does not swap it (swapped tensors: "
                              f"{[s.tensor.name for s in plan.swaps][:5]}...)")
        try:
            require_lossless_allowed(choice.codec, allow_lossy)
            choice.codec.check_dtype(swapped[ref].dtype)
        except ConfigError as err:
            raise type(err)(f"{ref.name}: {err}") from None
        if ref in by_tensor:
            raise ConfigError(f"{ref.name} has two compression choices")
        by_tensor[ref] = choice
    return tuple(by_tensor[s.tensor] for s in plan.swaps if s.tensor in by_tensor)


# ------------------------------------------------------------------ traced codec functions
@dataclasses.dataclass(frozen=True)
class CodecFunctions:
    """A codec's encode and decode, traced for one dtype and static shape."""

    encode_name: str
    decode_name: str
    encode_def: Any  # FunctionDef
    decode_def: Any  # FunctionDef
    part_dtypes: tuple[str, ...]
    part_shapes: tuple[tuple[int | None, ...] | None, ...]  # static shapes TensorFlow infers
    dynamic_shape: bool  # encode also returns tf.shape(x), decode reads it


def _codec_key(codec: Codec) -> str:
    fields = "".join(f"_{f.name}_{getattr(codec, f.name)}" for f in dataclasses.fields(codec))
    return _identifier(codec.name + fields)


def _identifier(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _shape_key(shape: tuple[int | None, ...] | None) -> str:
    if shape is None:
        return "unknown"
    return "x".join("N" if d is None else str(d) for d in shape) or "scalar"


@functools.lru_cache(maxsize=256)
def codec_functions(codec: Codec, dtype: str, shape: tuple[int | None, ...] | None) -> CodecFunctions:
    """Trace ``codec``'s encode and decode for tensors of ``dtype`` and static ``shape``.

    Cached per (codec, dtype, shape). The FunctionDefs are renamed
    deterministically and must not call other functions.
    """
    import tensorflow as tf
    from tensorflow.core.framework import function_pb2

    tf_dtype = codec.check_dtype(dtype)
    dynamic = shape is None or any(d is None for d in shape)
    spec = tf.TensorSpec(None if shape is None else list(shape), tf_dtype)

    def encode(x):
        parts = tuple(codec.encode(x))
        return parts + ((tf.shape(x, out_type=tf.int32),) if dynamic else ())

    enc = tf.function(encode, autograph=False).get_concrete_function(spec)
    num_parts = len(enc.outputs) - (1 if dynamic else 0)
    part_specs = [tf.TensorSpec(t.shape, t.dtype) for t in enc.outputs[:num_parts]]
    extra = [tf.TensorSpec([None if shape is None else len(shape)], tf.int32)] if dynamic else []

    def decode(*args):
        parts = args[:num_parts]
        return codec.decode(parts, args[num_parts] if dynamic else list(shape), tf_dtype)

    dec = tf.function(decode, autograph=False).get_concrete_function(*part_specs, *extra)
    key = f"{_codec_key(codec)}_{tf_dtype.name}_{_shape_key(shape)}"
    defs = []
    for role, cf in ((ENCODE, enc), (DECODE, dec)):
        nested = cf.graph.as_graph_def().library.function
        if len(nested) > 1 or (nested and nested[0].signature.name != cf.function_def.signature.name):
            raise GraphError(f"codec {codec.name!r} {role} calls other functions "
                             f"({[f.signature.name for f in nested]}); codecs must be built from primitive ops")
        fdef = function_pb2.FunctionDef()
        fdef.CopyFrom(cf.function_def)
        fdef.signature.name = f"{FUNCTION_PREFIX}_{role}_{key}"
        defs.append(fdef)
    return CodecFunctions(
        encode_name=defs[0].signature.name, decode_name=defs[1].signature.name, encode_def=defs[0],
        decode_def=defs[1], part_dtypes=tuple(s.dtype.name for s in part_specs),
        part_shapes=tuple(None if s.shape.rank is None else tuple(s.shape.as_list()) for s in part_specs),
        dynamic_shape=dynamic)


def _type_list(dtypes: Sequence[str]):
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
        type=[tf.as_dtype(d).as_datatype_enum for d in dtypes]))


def _call_attrs(function_name: str, in_dtypes: Sequence[str], out_dtypes: Sequence[str], cost_key: str,
                role: str) -> dict:
    from tensorflow.core.framework import attr_value_pb2
    return {
        "Tin": _type_list(in_dtypes), "Tout": _type_list(out_dtypes),
        "f": attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=function_name)),
        "config": attr_value_pb2.AttrValue(s=b""), "config_proto": attr_value_pb2.AttrValue(s=b""),
        "executor_type": attr_value_pb2.AttrValue(s=b""),
        CODEC_ATTR: attr_value_pb2.AttrValue(s=cost_key.encode()),
        CODEC_ROLE_ATTR: attr_value_pb2.AttrValue(s=role.encode()),
    }


def _copy_attrs(dtype: str) -> dict:
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    return {"T": attr_value_pb2.AttrValue(type=tf.as_dtype(dtype).as_datatype_enum),
            DO_NOT_REMOVE_ATTR: attr_value_pb2.AttrValue(b=True)}


def _with_functions(library: Any, defs: Sequence[Any]):
    """A new FunctionDefLibrary: ``library``'s functions plus ``defs`` (each once)."""
    from tensorflow.core.framework import function_pb2
    new = function_pb2.FunctionDefLibrary()
    if library is not None:
        new.CopyFrom(library)
    present = {f.signature.name: f for f in new.function}
    for fdef in defs:
        old = present.get(fdef.signature.name)
        if old is None:
            new.function.add().CopyFrom(fdef)
            present[fdef.signature.name] = fdef
        elif old.SerializeToString(deterministic=True) != fdef.SerializeToString(deterministic=True):
            raise GraphError(f"the function library already holds a different {fdef.signature.name!r}; rewrite "
                             "the graph apply_swaps returned, not one that was compressed already")
    return new


# ------------------------------------------------------------------ sizes
def part_infos(choice: CompressionChoice, info: TensorInfo, functions: CodecFunctions) -> tuple[TensorInfo, ...]:
    """IR facts of each encoded part of a tensor described by ``info`` (see the module doc)."""
    shape = info.resolved_shape
    if info.num_bytes is None or shape is None or any(d is None for d in shape):
        raise GraphError(f"cannot compress {choice.tensor.name}: its size is unknown (shape {info.shape}); "
                         "pass batch_size=... when reading the graph")
    num_elements = info.num_bytes // DTYPE_BYTES[info.dtype]
    predicted = choice.codec.part_bytes(num_elements, info.dtype, choice.nonzero_fraction)
    infos = []
    for k, (dtype, static, size) in enumerate(zip(functions.part_dtypes, functions.part_shapes, predicted)):
        known = (k not in choice.codec.data_dependent_parts and static is not None
                 and all(d is not None for d in static))
        infos.append(TensorInfo(dtype, static, size) if known else TensorInfo(dtype, None, size))
    return tuple(infos)


# ------------------------------------------------------------------ the pass
def apply_compression(graph: Graph, plan: SwapPlan,
                      choices: Mapping[TensorRef | str, ChoiceLike] | Iterable[CompressionChoice], *,
                      allow_lossy: bool = False) -> PassResult:
    """A copy of ``graph`` (the output of ``apply_swaps(…, plan).graph``) with compressed swaps.

    The report is the :class:`CompressionChoice` s applied, in plan order.

    See the module doc for the ops inserted and their names. ``choices`` maps
    swapped tensors to codecs (see :func:`normalize_choices`); tensors without a
    choice keep their plain swap. Raises :class:`ConfigError` for a lossy codec
    without ``allow_lossy``, :class:`GraphError` if ``graph`` does not hold the
    plan's swap ops. The result is linted.
    """
    chosen = normalize_choices(plan, choices, allow_lossy=allow_lossy)
    if not chosen:
        return PassResult(graph, changed=False, report=())
    swaps = {s.tensor: s for s in plan.swaps}
    for choice in chosen:
        swap = swaps[choice.tensor]
        for name in (swap.swap_out, *(g.name for g in swap.swap_ins)):
            if name not in graph:
                raise GraphError(f"{name!r} is not in the graph: apply_compression rewrites the graph that "
                                 "apply_swaps(graph, plan) returned, with the same plan")
        if encode_op_name(choice.tensor) in graph:
            raise GraphError(f"{encode_op_name(choice.tensor)!r} already exists: the graph is compressed already")
    new = graph.copy()
    traced = {c.tensor: codec_functions(c.codec, swaps[c.tensor].dtype, new.tensor(c.tensor).shape) for c in chosen}
    new.library = _with_functions(graph.library, [d for f in traced.values() for d in (f.encode_def, f.decode_def)])
    for choice in chosen:
        _compress_swap(new, plan, swaps[choice.tensor], choice, traced[choice.tensor])
    new.lint()
    return PassResult(new, changed=True, report=chosen)


def _compress_swap(graph: Graph, plan: SwapPlan, swap: SwapDecision, choice: CompressionChoice,
                   functions: CodecFunctions) -> None:
    ref = swap.tensor
    info = graph.tensor(ref)
    parts = part_infos(choice, info, functions)
    cost_key = choice.codec.cost_key
    producer_device = graph.op(ref.op).device or plan.accelerator_device
    enc_outputs = list(parts) + ([TensorInfo(SHAPE_DTYPE, (len(info.shape),), DTYPE_BYTES[SHAPE_DTYPE] *
                                             len(info.shape))] if functions.dynamic_shape else [])
    encode = encode_op_name(ref)
    graph.add_op(encode, CALL_OP, inputs=[ref], device=producer_device,
                 attrs=_call_attrs(functions.encode_name, [info.dtype], [o.dtype for o in enc_outputs], cost_key,
                                   ENCODE),
                 outputs=enc_outputs)
    # Part 0 reuses the plan's swap-out: it now copies the first part.
    out0 = graph.op(swap.swap_out)
    graph.set_input(swap.swap_out, 0, TensorRef(encode, 0))
    _retype(graph, swap.swap_out, parts[0])
    for k in range(1, len(parts)):
        name = part_op_name(swap.swap_out, k)
        graph.add_op(name, out0.type, inputs=[TensorRef(encode, k)], device=out0.device,
                     attrs=_copy_attrs(parts[k].dtype), outputs=[parts[k]])
        for consumer in swap.sync_out_consumers:
            graph.add_control_input(consumer, name)
    for gi, group in enumerate(swap.swap_ins):
        in0 = graph.op(group.name)
        _retype(graph, group.name, parts[0])
        part_refs = [TensorRef(group.name, 0)]
        for k in range(1, len(parts)):
            name = part_op_name(group.name, k)
            graph.add_op(name, in0.type, inputs=[TensorRef(part_op_name(swap.swap_out, k), 0)],
                         control_inputs=list(in0.control_inputs), device=in0.device,
                         attrs=_copy_attrs(parts[k].dtype), outputs=[parts[k]])
            part_refs.append(TensorRef(name, 0))
        if functions.dynamic_shape:
            part_refs.append(TensorRef(encode, len(parts)))
        consumer_devices = sorted({graph.op(c).device for c in group.consumers} - {""})
        decode = decode_op_name(ref, gi)
        graph.add_op(decode, CALL_OP, inputs=part_refs,
                     device=consumer_devices[0] if consumer_devices else plan.accelerator_device,
                     attrs=_call_attrs(functions.decode_name, [graph.tensor(r).dtype for r in part_refs],
                                       [info.dtype], cost_key, DECODE),
                     outputs=[info])
        for consumer, index in graph.consumers(TensorRef(group.name, 0)):
            if consumer != decode:
                graph.set_input(consumer, index, TensorRef(decode, 0))


def _retype(graph: Graph, name: str, info: TensorInfo) -> None:
    """Make the copy op ``name`` carry a tensor described by ``info`` (its edges are unchanged)."""
    op = graph.op(name)  # a record of this graph's copy: changing its attrs leaves the input graph alone
    op.attrs = _copy_attrs(info.dtype)
    op.outputs = (info,)
    op.node_def = None


def inserted_op_names(plan: SwapPlan, choices: Mapping[TensorRef | str, ChoiceLike] | Iterable[CompressionChoice],
                      graph: Graph | None = None) -> list[str]:
    """Every op ``apply_swaps`` + :func:`apply_compression` insert (for ``extra_control_outputs``).

    With ``graph`` (the compressed graph) the names are read from it; without,
    they are derived from the plan and the codecs' part counts (lossy codecs are
    accepted here: this only names ops).
    """
    names = plan_op_names(plan)
    chosen = normalize_choices(plan, choices, allow_lossy=True)
    for choice in chosen:
        swap = next(s for s in plan.swaps if s.tensor == choice.tensor)
        num_parts = len(choice.codec.part_bytes(0, swap.dtype))
        names.append(encode_op_name(choice.tensor))
        names.extend(part_op_name(swap.swap_out, k) for k in range(1, num_parts))
        for gi, group in enumerate(swap.swap_ins):
            names.extend(part_op_name(group.name, k) for k in range(1, num_parts))
            names.append(decode_op_name(choice.tensor, gi))
    if graph is not None:
        missing = [n for n in names if n not in graph]
        if missing:
            raise GraphError(f"ops {missing[:3]} are not in the graph: was it compressed with these choices?")
    return names


@dataclasses.dataclass(frozen=True)
class CompressedRewrite:
    """A compressed rewrite ready to run: the graph and the names to keep as control outputs."""

    graph: Graph
    inserted_ops: tuple[str, ...]
    choices: tuple[CompressionChoice, ...]


def compress_rewrite(graph: Graph, plan: SwapPlan,
                     choices: Mapping[TensorRef | str, ChoiceLike] | Iterable[CompressionChoice], *,
                     allow_lossy: bool = False) -> CompressedRewrite:
    """:func:`apply_compression` plus the inserted op names (what ``to_concrete_function`` needs)."""
    chosen = normalize_choices(plan, choices, allow_lossy=allow_lossy)
    new = apply_compression(graph, plan, chosen, allow_lossy=allow_lossy).graph
    return CompressedRewrite(new, tuple(inserted_op_names(plan, chosen, new)), chosen)


def register_functions(graph: Graph) -> list[str]:
    """Make the codec functions in ``graph.library`` known to TensorFlow's eager runtime; return their names.

    ``tf_io.to_concrete_function`` builds the rewritten function from the graph's
    ``FunctionDef`` s, but only functions already registered with the eager context
    (those of the original step) can be called; the codec functions this pass adds
    are registered here (once; registering is idempotent).
    """
    from tflms._compat.tf import eager_context
    ctx = eager_context()
    added = []
    if graph.library is None:
        return added
    for fdef in graph.library.function:
        name = fdef.signature.name
        if name.startswith(FUNCTION_PREFIX + "_") and not ctx.has_function(name):
            ctx.add_function_def(fdef)
            added.append(name)
    return added


def to_concrete_function(compressed: CompressedRewrite, original, *, name: str | None = None):
    """The ``ConcreteFunction`` that runs ``compressed.graph`` in place of ``original`` (same variables)."""
    from tflms.ir import tf_io
    register_functions(compressed.graph)
    return tf_io.to_concrete_function(compressed.graph, original, extra_control_outputs=compressed.inserted_ops,
                                      name=name)
