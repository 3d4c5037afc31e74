"""Peak memory of a graph estimated by grappler's virtual cluster (no hardware needed).

An estimator independent of :mod:`tflms.measure.executor`: grappler's
``VirtualScheduler`` replays the graph on a described (virtual) GPU and CPU and
tracks every op output from the start of its producer until its last consumer
finishes. Placement: nodes without a device and nodes on ``accelerator`` go to
the virtual GPU, nodes on ``host`` to the virtual CPU; any other device is an
error. Cross-device edges get ``_Send``/``_Recv`` pairs as in a real partition.

Known biases of this estimator (checked on TF 2.21, see tests/test_measure.py):

- conservative: an output is allocated when its producer starts and freed one
  tick *after* its last consumer ends, so at every op boundary of a chain three
  chain tensors are live (the real executor frees inputs first: two);
- no buffer forwarding: ``Identity``/``Reshape`` outputs and in-place ops count
  as fresh allocations;
- constants are live for the whole step; placeholders (fed data) count like op outputs;
- a ``_Recv`` on the GPU runs as soon as its sender has run, whatever control
  dependencies its consumer has: a swap-in ``Identity`` placed on the GPU does not
  delay the host-to-device copy (the swapped tensor briefly reappears on the GPU
  right after the swap-out). Delaying must happen on the host side (swap-in op on
  the host, controlled by a late op). TF's executor also starts a ``_Recv`` as soon
  as its sender has run, so expect the same on a real GPU (not checked on hardware);
- a device without any allocation reports ``-1``; it is returned as ``0``;
- a graph that does not fit ``accelerator_memory_bytes`` is refused (by grappler's
  own static check) with :class:`GrapplerEstimateError` rather than estimated.

Resource placeholders (the captured variables of a traced function) carry no
dtype/shape of the variable in a GraphDef, so grappler would size every variable
read with an unknown shape (a kernel read of 8 KiB counted as 128 B). Give
``variables`` (anything with ``.shape`` and ``.dtype``: numpy arrays,
``tf.TensorSpec``...) and each resource placeholder becomes a ``VarHandleOp`` of
that dtype/shape; a resource placeholder without an entry is an error. Variable
buffers themselves are not counted (like the executor measurement's transient
peak), but every ``ReadVariableOp`` output is counted as a fresh copy.

``run_time_s`` (``MeasureCosts``) has 1 microsecond resolution per op: graphs of
tiny ops (e.g. an MLP with batch 64) come out as 0.0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tflms.errors import ConfigError, GraphError, TflmsError
from tflms.units import parse_bytes

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tensorflow.core.framework.graph_pb2 import GraphDef

logger = logging.getLogger(__name__)

#: Full names of the two virtual devices.
VIRTUAL_GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
VIRTUAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"

#: Virtual GPU description (V100-like). ``bandwidth`` is in KB/s, ``frequency`` in MHz.
GPU_FREQUENCY_MHZ = 1530
GPU_NUM_SMS = 80
GPU_BANDWIDTH_KBPS = 900_000_000
GPU_ARCHITECTURE = "7.0"
GPU_L2_CACHE_BYTES = 6 * 2**20
GPU_SHARED_MEMORY_PER_SM_BYTES = 96 * 2**10
GPU_REGISTERS_PER_SM = 65536
#: Virtual host description.
CPU_FREQUENCY_MHZ = 2000
CPU_NUM_CORES = 8
CPU_BANDWIDTH_KBPS = 50_000_000
CPU_MEMORY_BYTES = 256 * 2**30


class GrapplerEstimateError(TflmsError, RuntimeError):
    """Grappler could not build an item or run the virtual scheduler for a graph."""


@dataclass(frozen=True)
class GrapplerEstimate:
    """Virtual-cluster estimate: peak bytes per role and what was live at each peak.

    ``live_at_peak[role]`` lists ``(node, output index, bytes)`` sorted by node name.
    ``run_time_s`` is grappler's estimated step time (``MeasureCosts``), if asked for.
    """

    peaks: Mapping[str, int]
    live_at_peak: Mapping[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    run_time_s: float | None = None


def grappler_peak(graph_def: GraphDef, *, fetches: Sequence[str], accelerator_memory_bytes: int | str = 16 * 2**30,
                  accelerator: str = "/device:GPU:0", host: str = "/device:CPU:0",
                  variables: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Peak bytes ``{"accelerator": ..., "host": ...}`` estimated by grappler's virtual cluster.

    Args:
        graph_def: the graph; nodes without a device or on ``accelerator`` run on the
            virtual GPU, nodes on ``host`` on the virtual CPU.
        fetches: op or tensor names that must run (the estimate covers their fan-in).
        accelerator_memory_bytes: memory size of the virtual GPU (bytes or e.g. ``"16GiB"``).
        accelerator, host: device names used in ``graph_def`` for the two roles, e.g.
            ``accelerator="/device:CPU:1"`` for graphs built for :mod:`tflms.measure.executor`.
        variables: dtype/shape source (``.dtype``, ``.shape``) for each resource
            placeholder, keyed by placeholder name; required when the graph has any.

    Raises:
        GraphError: unknown fetch, unmapped device, resource placeholder without ``variables`` entry.
        GrapplerEstimateError: grappler failed on the graph.
    """
    estimate = grappler_estimate(graph_def, fetches=fetches, accelerator_memory_bytes=accelerator_memory_bytes,
                                 accelerator=accelerator, host=host, variables=variables)
    return dict(estimate.peaks)


def grappler_estimate(graph_def: GraphDef, *, fetches: Sequence[str], accelerator_memory_bytes: int | str = 16 * 2**30,
                      accelerator: str = "/device:GPU:0", host: str = "/device:CPU:0",
                      variables: Mapping[str, Any] | None = None, measure_time: bool = False) -> GrapplerEstimate:
    """Like :func:`grappler_peak`, also returning live tensors at the peaks and, with
    ``measure_time``, grappler's estimated step time."""
    import tensorflow as tf  # noqa: PLC0415 - keep TensorFlow out of import time
    from tflms._compat.tf import grappler  # noqa: PLC0415 - keep TensorFlow out of import time
    grappler_cluster, grappler_item, _ = grappler()

    if isinstance(fetches, str) or not fetches:
        raise ConfigError(f"fetches must be a non-empty sequence of op or tensor names, got {fetches!r}")
    memory_bytes = parse_bytes(accelerator_memory_bytes, what="accelerator_memory_bytes")
    if memory_bytes <= 0:
        raise ConfigError(f"accelerator_memory_bytes must be positive, got {accelerator_memory_bytes!r}")
    placed = _place(tf, graph_def, accelerator=accelerator, host=host)
    _resource_placeholders_to_variables(tf, placed, variables or {})
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(placed, name="")
        for name in fetches:
            op_name = name.split(":", 1)[0]
            try:
                graph.add_to_collection("train_op", graph.get_operation_by_name(op_name))
            except KeyError as exc:
                raise GraphError(f"fetch {name!r} names no node of the graph") from exc
        metagraph = tf.compat.v1.train.export_meta_graph(graph=graph)
    cluster = grappler_cluster.Cluster(devices=_virtual_devices(memory_bytes))
    try:
        try:
            item = grappler_item.Item(metagraph, ignore_colocation=True, ignore_user_placement=False)
            usage = cluster.DeterminePeakMemoryUsage(item)
            run_time_s = float(cluster.MeasureCosts(item)[1]) if measure_time else None
        except (tf.errors.OpError, ValueError, RuntimeError) as exc:
            raise GrapplerEstimateError(f"grappler virtual cluster failed on the graph "
                                        f"({len(placed.node)} nodes): {exc}") from exc
    finally:
        cluster.Shutdown()
    peaks, live = {}, {}
    for role, device in (("accelerator", VIRTUAL_GPU), ("host", VIRTUAL_CPU)):
        peak, tensors = usage.get(device, (0, []))
        peaks[role] = max(int(peak), 0)  # grappler reports -1 for a device with no allocation
        live[role] = tuple(sorted((str(node), int(port), int(size)) for node, port, size, *_ in tensors))
    logger.debug("grappler peaks %s", peaks)
    return GrapplerEstimate(peaks=peaks, live_at_peak=live, run_time_s=run_time_s)


def _place(tf: Any, graph_def: Any, *, accelerator: str, host: str) -> Any:
    """Copy of ``graph_def`` with every node on :data:`VIRTUAL_GPU` or :data:`VIRTUAL_CPU`."""
    accelerator_key, host_key = _device_key(tf, accelerator, "accelerator"), _device_key(tf, host, "host")
    if accelerator_key == host_key:
        raise GraphError(f"accelerator {accelerator!r} and host {host!r} are the same device")
    placed = type(graph_def)()
    placed.CopyFrom(graph_def)
    for node in placed.node:
        key = _device_key(tf, node.device, f"device of node {node.name!r}") if node.device else accelerator_key
        if key == accelerator_key:
            node.device = VIRTUAL_GPU
        elif key == host_key:
            node.device = VIRTUAL_CPU
        else:
            raise GraphError(f"node {node.name!r} is on {node.device!r}, which is neither the accelerator "
                             f"{accelerator!r} nor the host {host!r}; pass accelerator=/host= to map it")
    return placed


def _resource_placeholders_to_variables(tf: Any, graph_def: Any, variables: Mapping[str, Any]) -> None:
    """Turn each resource ``Placeholder`` into a ``VarHandleOp`` with the dtype/shape given in ``variables``."""
    by_name = {node.name: node for node in graph_def.node}
    for name in variables:
        node = by_name.get(name.split(":", 1)[0])
        if node is None or node.op != "Placeholder" or node.attr["dtype"].type != tf.resource.as_datatype_enum:
            raise GraphError(f"variables entry {name!r} does not name a Placeholder of dtype resource")
    given = {name.split(":", 1)[0]: spec for name, spec in variables.items()}
    for node in graph_def.node:
        if node.op != "Placeholder" or node.attr["dtype"].type != tf.resource.as_datatype_enum:
            continue
        if node.name not in given:
            raise GraphError(f"resource placeholder {node.name!r} has no variables entry; grappler cannot size its "
                             "reads without the variable's dtype and shape (pass variables={name: array or spec})")
        spec = given[node.name]
        try:
            dtype, shape = tf.as_dtype(spec.dtype), tf.TensorShape(spec.shape)
        except (AttributeError, TypeError) as exc:
            raise GraphError(f"variables entry {node.name!r} needs .dtype and .shape, got "
                             f"{type(spec).__name__}") from exc
        name, device = node.name, node.device
        node.Clear()
        node.name, node.op, node.device = name, "VarHandleOp", device
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(shape.as_proto())
        node.attr["shared_name"].s = node.name.encode()
        node.attr["container"].s = b""


def _device_key(tf: Any, device: str, what: str) -> tuple[str, int]:
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as exc:
        raise GraphError(f"{what}: cannot parse device {device!r} ({exc})") from exc
    if not spec.device_type:
        raise GraphError(f"{what}: device {device!r} has no device type (e.g. '/device:GPU:0')")
    return spec.device_type.upper(), spec.device_index or 0


def _virtual_devices(accelerator_memory_bytes: int) -> list[Any]:
    from tensorflow.core.protobuf import device_properties_pb2  # noqa: PLC0415

    gpu = device_properties_pb2.DeviceProperties(
        type="GPU", vendor="NVIDIA", frequency=GPU_FREQUENCY_MHZ, num_cores=GPU_NUM_SMS,
        environment={"architecture": GPU_ARCHITECTURE}, num_registers=GPU_REGISTERS_PER_SM,
        l2_cache_size=GPU_L2_CACHE_BYTES, shared_memory_size_per_multiprocessor=GPU_SHARED_MEMORY_PER_SM_BYTES,
        memory_size=accelerator_memory_bytes, bandwidth=GPU_BANDWIDTH_KBPS)
    cpu = device_properties_pb2.DeviceProperties(
        type="CPU", frequency=CPU_FREQUENCY_MHZ, num_cores=CPU_NUM_CORES, memory_size=CPU_MEMORY_BYTES,
        bandwidth=CPU_BANDWIDTH_KBPS)
    return [device_properties_pb2.NamedDevice(name=VIRTUAL_GPU, properties=gpu),
            device_properties_pb2.NamedDevice(name=VIRTUAL_CPU, properties=cpu)]
