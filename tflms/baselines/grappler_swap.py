"""Baseline: TensorFlow grappler's own swapping (``RewriterConfig.SWAPPING_HEURISTICS``).

:func:`grappler_swap` hands a training step to grappler's memory optimizer, on a
virtual cluster whose GPU has a hardware profile's memory (the budget), reads the
swaps grappler inserted back into the tflms IR and returns a graph the tflms
simulator can judge like any tflms rewrite.

What grappler does (``tensorflow/core/grappler/optimizers/memory_optimizer.cc``,
``SwappingPass``; one pass in practice, since the pass never reports an update):

1. Estimate the GPU's peak memory statically (``GraphMemory``: every output is a
   fresh allocation from its producer's start to its last consumer's end). If the
   peak is at most the device's memory, stop.
2. Among tensors live at the peak, larger than 1 KiB, living longer than 1 ms of
   virtual time, pick the fittest (produced long before the peak, used long
   after it, few uses left) until the overshoot is covered; each of their
   consumers *after* the peak reads a swapped copy.
3. Per consumer input: ``swap_out_<consumer>_<input>`` (``_CopyFromGpuToHost``) reads
   the tensor, ``swap_in_<consumer>_<input>`` (``_CopyFromHostToGpu``) reads the
   swap-out and is triggered (control edge) by the latest op that, in grappler's
   estimated schedule, finishes early enough for a 16 GB/s copy; the consumer's
   earliest other user of the tensor waits for the swap-out (control edge).
   A consumer none of whose other inputs allows a trigger is skipped.

Reading back: only grappler's structural edits are taken (new swap nodes, rewired
consumer inputs, new control edges); attribute-only edits (colocation ``_class``,
``_grappler_relax_allocator_constraints``) are ignored and listed in the result.
The swap ops are mapped onto ops :mod:`tflms.sim.simulator` models as transfers
(:data:`SIMULATOR_OPS`): ``_CopyFromGpuToHost`` -> ``Identity`` on the host (a
device-to-host copy), ``_CopyFromHostToGpu`` -> ``DeepCopy`` on the accelerator (a
host-to-device copy that, like grappler's kernel, runs when its trigger has run and
not as soon as the data exists, which an ``Identity`` would: TensorFlow's ``_Recv``).
``map_ops=False`` keeps grappler's op types (for a simulator that knows them).

Known limit: grappler decides from its own static estimate, which sizes a tensor
from grappler's shape inference; a dimension it cannot infer counts as 1. In a
BERT-like Keras encoder (tools/bench.py) it leaves the batch dimension of the
attention tensors unknown, estimates 6.9 GiB where the tflms simulator predicts
56 GiB (batch 67) and swaps nothing.

Grappler's choice is not deterministic: the same 3D U-Net graph got 45 swaps in one
run and 46 in another (its swapping pass iterates hash maps keyed by node pointers).

The virtual GPU: ``memory_size`` is the budget; grappler's FLOP/s are
``num_cores * frequency * 64 * 2`` for compute capability >= 6, so the SM count is
chosen to give the profile's peak FP32 at :data:`GPU_FREQUENCY_MHZ`; memory
bandwidth is the profile's. Grappler's own constants (1 KiB, 1 ms, 16 GB/s) are not
configurable.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.errors import GraphError, TflmsError
from tflms.ir.graph import Graph, TensorRef
from tflms.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from tflms.units import parse_bytes

logger = logging.getLogger(__name__)

#: Grappler's swap op types.
SWAP_OUT_OP, SWAP_IN_OP = "_CopyFromGpuToHost", "_CopyFromHostToGpu"
#: How the swap ops are represented for the simulator: op type and device role.
SIMULATOR_OPS = {SWAP_OUT_OP: ("Identity", "host"), SWAP_IN_OP: ("DeepCopy", "accelerator")}
#: Virtual GPU clock; the SM count is derived from the profile's peak FLOP/s.
GPU_FREQUENCY_MHZ = 1000
#: FP32 cores per SM grappler assumes for compute capability >= 6, times 2 flops per FMA.
GRAPPLER_FLOPS_PER_SM_CYCLE = 64 * 2
#: Compute capability reported for the virtual GPU (selects the per-SM core count above).
GPU_ARCHITECTURE = "7.0"
#: Virtual host CPU.
CPU_FREQUENCY_MHZ = 2000
CPU_NUM_CORES = 8
CPU_BANDWIDTH_KBPS = 50_000_000
#: Grappler optimizers switched off so that only the memory optimizer runs.
_OTHER_OPTIMIZERS = (
    "layout_optimizer", "constant_folding", "shape_optimization", "remapping", "common_subgraph_elimination",
    "arithmetic_optimization", "dependency_optimization", "loop_optimization", "function_optimization",
    "debug_stripper", "scoped_allocator_optimization", "pin_to_host_optimization", "implementation_selector",
    "auto_mixed_precision", "auto_mixed_precision_mkl", "auto_mixed_precision_onednn_bfloat16",
    "auto_mixed_precision_cpu")
_ACCEL_NAME = "/job:localhost/replica:0/task:0/device:GPU:0"
_HOST_NAME = "/job:localhost/replica:0/task:0/device:CPU:0"


class GrapplerSwapError(TflmsError, RuntimeError):
    """Grappler could not optimize the graph, or its output cannot be read back."""


@dataclasses.dataclass(frozen=True)
class GrapplerSwap:
    """One swapped consumer input, as grappler built it."""

    tensor: str  # the swapped tensor, e.g. "conv1/Relu:0"
    consumer: str  # the op whose input now reads the swap-in
    input_index: int
    swap_out: str
    swap_in: str
    swap_in_trigger: str | None  # control input of the swap-in
    swap_out_waiters: tuple[str, ...]  # ops that got a control edge from the swap-out
    num_bytes: int


@dataclasses.dataclass(frozen=True)
class GrapplerSwapResult:
    """Grappler's swaps read back into the IR."""

    graph: Graph  # the input graph plus the swaps (see module doc for the op mapping)
    swaps: tuple[GrapplerSwap, ...]
    budget_bytes: int
    optimize_s: float  # grappler's OptimizeGraph call alone
    total_s: float  # export + optimize + read back
    ignored_edits: tuple[str, ...]  # grappler edits not carried over (attribute-only changes)
    optimized_graph_def: Any = dataclasses.field(repr=False, default=None)  # grappler's output, as is

    @property
    def swapped_bytes(self) -> int:
        return sum(s.num_bytes for s in self.swaps)

    def summary(self) -> dict[str, Any]:
        return {"swaps": len(self.swaps), "swapped_bytes": self.swapped_bytes, "budget_bytes": self.budget_bytes,
                "optimize_s": self.optimize_s, "total_s": self.total_s, "ops": len(self.graph)}


def virtual_devices(profile: HardwareProfile, memory_bytes: int) -> list[Any]:
    """Grappler ``NamedDevice``s: a GPU like ``profile`` with ``memory_bytes``, and a host CPU."""
    from tensorflow.core.protobuf import device_properties_pb2  # noqa: PLC0415

    num_sms = max(1, round(profile.peak_flops / (GPU_FREQUENCY_MHZ * 1e6 * GRAPPLER_FLOPS_PER_SM_CYCLE)))
    gpu = device_properties_pb2.DeviceProperties(
        type="GPU", vendor="NVIDIA", frequency=GPU_FREQUENCY_MHZ, num_cores=num_sms,
        environment={"architecture": GPU_ARCHITECTURE}, memory_size=memory_bytes,
        bandwidth=int(profile.memory_gbps * 1e6))  # KB/s
    cpu = device_properties_pb2.DeviceProperties(
        type="CPU", frequency=CPU_FREQUENCY_MHZ, num_cores=CPU_NUM_CORES, memory_size=profile.host_memory_bytes,
        bandwidth=CPU_BANDWIDTH_KBPS)
    return [device_properties_pb2.NamedDevice(name=_ACCEL_NAME, properties=gpu),
            device_properties_pb2.NamedDevice(name=_HOST_NAME, properties=cpu)]


def rewriter_config(memory_optimization: str = "SWAPPING_HEURISTICS"):
    """A ``ConfigProto`` that runs grappler's memory optimizer at ``memory_optimization`` and nothing else."""
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: PLC0415

    rc = rewriter_config_pb2.RewriterConfig
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    for name in _OTHER_OPTIMIZERS:
        setattr(rewrite, name, rc.OFF)
    rewrite.disable_tfg_optimizer = True  # it cannot import the GPU-only swap op types on a CPU build
    rewrite.disable_model_pruning = True  # it would drop StopGradient/Identity ops
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rc.ONE
    rewrite.memory_optimization = rc.MemOptType.Value(memory_optimization)
    return config


def variable_specs(graph: Graph) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{resource placeholder: (dtype, shape)}`` read off the ops that use each variable.

    A variable's shape is that of a ``ReadVariableOp`` of it, or of the value an
    ``Assign*VariableOp`` writes. Variables only used otherwise get a scalar
    float32 (grappler then under-counts their reads, which it treats as copies).
    """
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for op in graph:
        if op.type not in ("Placeholder", "_Arg") or not op.outputs or op.outputs[0].dtype != "resource":
            continue
        found = None
        for consumer, index in graph.consumers(TensorRef(op.name, 0)):
            user = graph.op(consumer)
            info = None
            if user.type == "ReadVariableOp" and index == 0:
                info = user.outputs[0]
            elif user.type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp") and index == 0:
                info = graph.tensor(user.inputs[1])
            shape = None if info is None else info.resolved_shape
            if shape is not None and all(d is not None for d in shape):
                found = (info.dtype, tuple(int(d) for d in shape))
                break
        specs[op.name] = found or ("float32", ())
    return specs


def _batch_size_of(graph: Graph) -> int | None:
    for op in graph:
        for info in op.outputs:
            if info.batch_size is not None:
                return info.batch_size
    return None


def _graph_def_for_grappler(graph: Graph, batch_size: int | None, host_device: str,
                            variables: Mapping[str, tuple[str, Sequence[int]]]):
    """The IR as a GraphDef grappler can size: fixed input shapes, devices, variables as VarHandleOps."""
    import tensorflow as tf  # noqa: PLC0415

    from tflms.config import normalize_device  # noqa: PLC0415
    from tflms.ir.tf_io import to_graph_def  # noqa: PLC0415

    host = normalize_device(host_device, field="host_device").rpartition("/device:")[2]
    graph_def = to_graph_def(graph)
    resource = tf.resource.as_datatype_enum
    for node in graph_def.node:
        device = node.device.rpartition("/device:")[2].upper() if node.device else ""
        node.device = _HOST_NAME if device == host else _ACCEL_NAME
        if node.op != "Placeholder":
            continue
        if node.attr["dtype"].type == resource:
            dtype, shape = variables.get(node.name, ("float32", ()))
            name, device = node.name, node.device
            node.Clear()
            node.name, node.op, node.device = name, "VarHandleOp", device
            node.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(list(shape)).as_proto())
            node.attr["shared_name"].s = b""
            node.attr["container"].s = b""
            continue
        dims = node.attr["shape"].shape.dim
        if dims and dims[0].size == -1:
            if batch_size is None:
                raise GraphError(f"input {node.name!r} has an unknown batch dimension: give batch_size= (grappler "
                                 "sizes tensors from the input shapes)")
            dims[0].size = batch_size
    return graph_def


def _fetches(graph: Graph) -> list[str]:
    sig = graph.signature
    if sig is not None:
        return [TensorRef.parse(n).op for n in sig.output_names] + list(sig.control_output_names)
    return [op.name for op in graph if not graph.successors(op.name)]


def run_grappler(graph_def, fetches: Sequence[str], devices: Sequence[Any],
                 memory_optimization: str = "SWAPPING_HEURISTICS"):
    """Grappler's ``OptimizeGraph`` on ``graph_def`` with a virtual cluster of ``devices``; returns a GraphDef."""
    import tensorflow as tf  # noqa: PLC0415
    from tflms._compat.tf import grappler  # noqa: PLC0415
    grappler_cluster, _, tf_optimizer = grappler()

    tf_graph = tf.Graph()
    with tf_graph.as_default():
        try:
            tf.graph_util.import_graph_def(graph_def, name="")
        except (ValueError, tf.errors.OpError) as err:
            raise GrapplerSwapError(f"TensorFlow cannot import the graph for grappler: {err}") from err
        for name in fetches:
            tf_graph.add_to_collection("train_op", tf_graph.get_operation_by_name(name))
        metagraph = tf.compat.v1.train.export_meta_graph(graph=tf_graph)
    cluster = grappler_cluster.Cluster(devices=list(devices))
    try:
        return tf_optimizer.OptimizeGraph(rewriter_config(memory_optimization), metagraph, cluster=cluster)
    except (tf.errors.OpError, ValueError, RuntimeError) as err:
        raise GrapplerSwapError(f"grappler's memory optimizer failed on {len(graph_def.node)} nodes: {err}") from err
    finally:
        cluster.Shutdown()


def grappler_swap(graph: Graph, profile: str | HardwareProfile = DEFAULT_PROFILE, *,
                  budget: int | str | None = None, batch_size: int | None = None,
                  host_device: str = "/device:CPU:0", accelerator_device: str = "/device:GPU:0",
                  variables: Mapping[str, tuple[str, Sequence[int]]] | None = None,
                  map_ops: bool = True) -> GrapplerSwapResult:
    """Let grappler's ``SWAPPING_HEURISTICS`` rewrite ``graph`` for ``budget`` bytes (default: the profile's memory).

    ``graph`` is a training step in the IR (e.g. from
    :func:`tflms.ir.tf_io.from_concrete_function`, possibly sized with
    ``with_batch_size``). Inputs with an unknown batch dimension are fixed to
    ``batch_size`` (default: the size the IR was given) so that grappler can size
    tensors. ``variables`` overrides :func:`variable_specs`. Returns the input graph
    with grappler's swaps (see the module doc); it has no swaps when grappler's own
    estimate already fits the budget or it found nothing it could swap.
    """
    t_start = time.perf_counter()
    profile = get_profile(profile)
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    batch_size = batch_size if batch_size is not None else _batch_size_of(graph)
    specs = variable_specs(graph)
    specs.update(variables or {})
    graph_def = _graph_def_for_grappler(graph, batch_size, host_device, specs)
    t0 = time.perf_counter()
    optimized = run_grappler(graph_def, _fetches(graph), virtual_devices(profile, budget_bytes))
    optimize_s = time.perf_counter() - t0
    new_graph, swaps, ignored = read_back(graph, optimized, host_device=host_device,
                                          accelerator_device=accelerator_device, map_ops=map_ops)
    logger.debug("grappler inserted %d swaps in %.2f s", len(swaps), optimize_s)
    return GrapplerSwapResult(graph=new_graph, swaps=tuple(swaps), budget_bytes=budget_bytes, optimize_s=optimize_s,
                              total_s=time.perf_counter() - t_start, ignored_edits=tuple(ignored),
                              optimized_graph_def=optimized)


def read_back(graph: Graph, optimized, *, host_device: str = "/device:CPU:0",
              accelerator_device: str = "/device:GPU:0", map_ops: bool = True):
    """Apply grappler's structural edits in ``optimized`` (a GraphDef) to a copy of ``graph``.

    Returns ``(graph, swaps, ignored_edits)``. Raises :class:`GrapplerSwapError` if
    grappler removed ops or added ops other than its swap ops.
    """
    from tflms.ir.tf_io import DO_NOT_REMOVE_ATTR  # noqa: PLC0415

    by_name = {node.name: node for node in optimized.node}
    missing = [op.name for op in graph if op.name not in by_name]
    if missing:
        raise GrapplerSwapError(f"grappler removed {len(missing)} ops (e.g. {missing[:3]}); only the memory "
                                "optimizer should run")
    added = [node for node in optimized.node if node.name not in graph]
    strangers = [n.name for n in added if n.op not in (SWAP_OUT_OP, SWAP_IN_OP)]
    if strangers:
        raise GrapplerSwapError(f"grappler added ops other than swaps: {strangers[:3]}")
    new = graph.copy()
    roles = {"host": host_device, "accelerator": accelerator_device}
    # Swap-outs first (swap-ins read them), in grappler's (deterministic) node order.
    for node in sorted(added, key=lambda n: (n.op != SWAP_OUT_OP, n.name)):
        source = node.input[0]
        ref = TensorRef.parse(source)
        op_type, role = SIMULATOR_OPS[node.op] if map_ops else (node.op, "host" if node.op == SWAP_OUT_OP
                                                                   else "accelerator")
        info = new.tensor(ref)
        attrs = {"T": node.attr["T"]}
        if map_ops:
            from tensorflow.core.framework import attr_value_pb2  # noqa: PLC0415
            attrs[DO_NOT_REMOVE_ATTR] = attr_value_pb2.AttrValue(b=True)
        new.add_op(node.name, op_type, inputs=[ref], device=roles[role], attrs=attrs, outputs=[info])
    swaps_in = {n.name: n for n in added if n.op == SWAP_IN_OP}
    ignored: list[str] = []
    for node in added:
        for raw in node.input[1:]:
            if raw.startswith("^"):
                new.add_control_input(node.name, raw[1:])
    waiters: dict[str, list[str]] = {}
    swaps: list[GrapplerSwap] = []
    for op in graph:
        node = by_name[op.name]
        data = [i for i in node.input if not i.startswith("^")]
        ctrl = [i[1:] for i in node.input if i.startswith("^")]
        if len(data) != len(op.inputs):
            raise GrapplerSwapError(f"grappler changed the number of inputs of {op.name!r}")
        for index, (raw, old) in enumerate(zip(data, op.inputs)):
            ref = TensorRef.parse(raw)
            if ref == old:
                continue
            if ref.op not in swaps_in:
                raise GrapplerSwapError(f"grappler rewired input {index} of {op.name!r} to {raw!r}, not a swap-in")
            new.set_input(op.name, index, ref)
        for src in ctrl:
            if src not in op.control_inputs:
                new.add_control_input(op.name, src)
                waiters.setdefault(src, []).append(op.name)
        if op.type == "Placeholder" and op.outputs and op.outputs[0].dtype == "resource":
            continue  # sent to grappler as a VarHandleOp (see _graph_def_for_grappler)
        before = set(op.node_def.attr) if op.node_def is not None else set(op.attrs)
        if set(node.attr) != before:
            ignored.append(f"{op.name}: attributes {sorted(set(node.attr) ^ before)}")
    for name in sorted(swaps_in):
        swap_in = swaps_in[name]
        swap_out = swap_in.input[0]
        consumers = new.consumers(TensorRef(name, 0))
        consumer, index = consumers[0] if consumers else ("", -1)
        source = TensorRef.parse(by_name[swap_out].input[0])
        trigger = next((i[1:] for i in swap_in.input[1:] if i.startswith("^")), None)
        swaps.append(GrapplerSwap(tensor=source.name, consumer=consumer, input_index=index, swap_out=swap_out,
                                  swap_in=name, swap_in_trigger=trigger,
                                  swap_out_waiters=tuple(waiters.get(swap_out, ())),
                                  num_bytes=new.tensor(source).num_bytes or 0))
    return new, swaps, ignored
