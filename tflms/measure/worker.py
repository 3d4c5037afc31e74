"""The measuring subprocess of :mod:`tflms.measure.executor`: builds, places, runs and traces each graph.

It imports TensorFlow after splitting the CPU into the two emulated devices, imports
each request's graph with one real variable per resource placeholder on the
accelerator, runs the warm-up steps and one ``FULL_TRACE`` step in a
``tf.compat.v1.Session``, and writes the step's allocation records and node times
(``results.json``) and its fetched values and variables (``outputs_N.npz``) for the
parent to read. The request directory format is private to the two sides.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tflms.errors import GraphError
from tflms.measure.emulation import (
    ACCELERATOR_DEVICE,
    DEVICE_RE,
    INTER_OP_THREADS,
    STDERR_TAIL_CHARS,
    role_of_device,
    roles_by_cpu_index,
)

logger = logging.getLogger(__name__)

_NODE_IN_MESSAGE_RE = re.compile(r"\{\{node ([^}\s]+)\}\}")
_PREFIX = "tflms_measure"


def _serve(request_dir: Path) -> int:
    """Subprocess entry: measure every request in ``request_dir``, write results.json."""
    import tensorflow as tf  # noqa: PLC0415 - the runtime must start here, after the device split

    # The Session gets its two CPU devices from ConfigProto.device_count (see _session_config);
    # the eager context is split the same way so any eager code here sees the same machine.
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    manifest = json.loads((request_dir / "requests.json").read_text())["requests"]
    results: list[dict[str, Any]] = []
    for index, entry in enumerate(manifest):
        try:
            results.append(_measure_one(tf, request_dir, index, entry))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            results.append({"error": _describe_error(tf, exc)})
            break
    (request_dir / "results.json").write_text(json.dumps({"results": results}))
    return 0


def _describe_error(tf: Any, exc: Exception) -> dict[str, Any]:
    node = None
    if isinstance(exc, tf.errors.OpError):
        node = exc.op.name if getattr(exc, "op", None) is not None else None
    message = str(exc)
    if node is None:
        match = _NODE_IN_MESSAGE_RE.search(message)
        node = match.group(1) if match else None
    kind = "GraphError" if isinstance(exc, GraphError) else type(exc).__name__
    return {"type": kind, "node": node, "message": message.strip()[-STDERR_TAIL_CHARS:]}


def _unused_prefix(graph_def: Any) -> str:
    names = [node.name for node in graph_def.node]
    prefix, suffix = _PREFIX, 0
    while any(name == prefix or name.startswith(prefix + "/") for name in names):
        suffix += 1
        prefix = f"{_PREFIX}_{suffix}"
    return prefix


def _const_bytes_by_device(tf: Any, graph_def: Any, accelerator_cpu: int = 1) -> dict[str, int]:
    totals: dict[str, int] = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        dtype = tf.as_dtype(node.attr["dtype"].type)
        if dtype == tf.string:
            continue
        elements = int(np.prod([dim.size for dim in node.attr["value"].tensor.tensor_shape.dim], dtype=np.int64))
        cpu_index = int(DEVICE_RE.match(node.device).group("index"))
        role = roles_by_cpu_index(accelerator_cpu)[cpu_index]
        totals[role] = totals.get(role, 0) + elements * dtype.size
    return totals


def _session_config(tf: Any) -> Any:
    # A Session given a config does not inherit the eager context's logical devices
    # (it builds its own devices from the config): ask for the two CPUs explicitly.
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False, inter_op_parallelism_threads=INTER_OP_THREADS,
                                      device_count={"CPU": 2})
    # Run the graph as given: no grappler rewrites, no classic constant folding / CSE.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.optimizer_options.do_common_subexpression_elimination = False
    return config


@dataclass
class _SessionGraph:
    """The graph to run: the imported GraphDef plus one real variable per resource placeholder."""

    graph: Any
    init_ops: list[Any]
    init_feeds: dict[Any, np.ndarray]
    reads: list[Any]


def _import_with_variables(tf: Any, graph_def: Any, variables: Sequence[tuple[str, np.ndarray]],
                           accelerator: str = ACCELERATOR_DEVICE) -> _SessionGraph:
    """Import ``graph_def``, mapping each resource placeholder to a fresh ``VarHandleOp`` on the accelerator.

    Each variable gets an assign op fed from a placeholder (no large constants in the
    graph) and a read op for the values after the step.
    """
    prefix = _unused_prefix(graph_def)
    graph = tf.Graph()
    session_graph = _SessionGraph(graph=graph, init_ops=[], init_feeds={}, reads=[])
    input_map = {}
    with graph.as_default():
        for position, (name, value) in enumerate(variables):
            dtype = tf.as_dtype(value.dtype)
            with tf.device(accelerator):
                handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=value.shape, shared_name=f"{prefix}_{position}",
                                                name=f"{prefix}/var_{position}")
                initial = tf.compat.v1.placeholder(dtype, value.shape, name=f"{prefix}/initial_{position}")
                session_graph.init_ops.append(
                    tf.raw_ops.AssignVariableOp(resource=handle, value=initial, name=f"{prefix}/assign_{position}"))
                session_graph.reads.append(
                    tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype, name=f"{prefix}/read_{position}"))
            session_graph.init_feeds[initial] = value
            input_map[f"{name}:0"] = handle
        tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")
    return session_graph


def _node_span_ns(node_stats: Any) -> tuple[int, int]:
    """Start and end of a node in nanoseconds (from the nanosecond fields when set)."""
    if node_stats.all_start_nanos:
        return node_stats.all_start_nanos, node_stats.all_start_nanos + node_stats.all_end_rel_nanos
    start = node_stats.all_start_micros * 1000
    return start, start + node_stats.all_end_rel_micros * 1000


def _collect_records(step_stats: Any) -> tuple[dict[str, dict[str, Any]], int, list[list[Any]]]:
    """Allocation records per device (``{device: {"records": [(micros, bytes, node)], "allocators": [...]}}``),
    the step's first start time (micros) and ``[node, device, start_ns, end_ns]`` of every node."""
    devices: dict[str, dict[str, Any]] = {}
    nodes: list[list[Any]] = []
    start = None
    for dev_stats in step_stats.dev_stats:
        device = devices.setdefault(dev_stats.device, {"records": [], "allocators": []})
        for node_stats in dev_stats.node_stats:
            start = node_stats.all_start_micros if start is None else min(start, node_stats.all_start_micros)
            nodes.append([node_stats.node_name, dev_stats.device, *_node_span_ns(node_stats)])
            for memory in node_stats.memory:
                if memory.allocation_records:
                    device["allocators"].append(memory.allocator_name)
                for record in memory.allocation_records:
                    device["records"].append((record.alloc_micros, record.alloc_bytes, node_stats.node_name))
    for raw_name in list(devices):
        if role_of_device(raw_name) is None and not devices[raw_name]["records"]:
            logger.debug("ignoring device %s without allocation records", raw_name)
            del devices[raw_name]
    return devices, start or 0, nodes


def _measure_one(tf: Any, request_dir: Path, index: int, entry: dict[str, Any]) -> dict[str, Any]:
    graph_def = tf.compat.v1.GraphDef.FromString((request_dir / f"graph_{index}.pb").read_bytes())
    with np.load(request_dir / f"arrays_{index}.npz", allow_pickle=False) as arrays:
        feed_values = [arrays[f"feed_{i}"] for i in range(len(entry["feeds"]))]
        var_values = [arrays[f"var_{i}"] for i in range(len(entry["variables"]))]
    accelerator_cpu = entry.get("accelerator_cpu", 1)
    session_graph = _import_with_variables(tf, graph_def, list(zip(entry["variables"], var_values)),
                                           accelerator=f"/device:CPU:{accelerator_cpu}")
    graph = session_graph.graph
    feeds = {graph.get_tensor_by_name(name): value for name, value in zip(entry["feeds"], feed_values)}
    fetch_names = [name for name in entry["fetches"] if ":" in name]
    fetch_tensors = [graph.get_tensor_by_name(name) for name in fetch_names]
    run_ops = [graph.get_operation_by_name(name) for name in entry["fetches"] if ":" not in name]
    run_ops += [graph.get_operation_by_name(name) for name in entry["targets"]]

    with tf.compat.v1.Session(graph=graph, config=_session_config(tf)) as session:
        for run in range(entry["warmup_runs"] + 1):
            if session_graph.init_ops:  # every run starts from the given variable values
                session.run(session_graph.init_ops, feed_dict=session_graph.init_feeds)
            if run < entry["warmup_runs"]:
                session.run([fetch_tensors, run_ops], feed_dict=feeds)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                          output_partition_graphs=bool(entry.get("allocator_trace")))
        metadata = tf.compat.v1.RunMetadata()
        fetched, _ = session.run([fetch_tensors, run_ops], feed_dict=feeds, options=options, run_metadata=metadata)
        allocator = None
        if entry.get("allocator_trace"):  # the same step again, under the profiler (module doc)
            if session_graph.init_ops:
                session.run(session_graph.init_ops, feed_dict=session_graph.init_feeds)
            allocator = _allocator_trace(tf, session, [fetch_tensors, run_ops], feeds, metadata.partition_graphs,
                                         request_dir / f"profile_{index}")
        variables_after = session.run(session_graph.reads) if session_graph.reads else []

    devices, start, nodes = _collect_records(metadata.step_stats)
    persistent = _const_bytes_by_device(tf, graph_def, accelerator_cpu)
    persistent["accelerator"] = persistent.get("accelerator", 0) + sum(int(value.nbytes) for value in var_values)
    for name, value in zip(fetch_names, fetched):
        if np.asarray(value).dtype.kind == "O":
            raise GraphError(f"fetch {name!r} is not numeric (dtype {np.asarray(value).dtype}); fetch numeric "
                             "tensors only, or run its op as a target")
    np.savez(request_dir / f"outputs_{index}.npz", allow_pickle=False,
             **{f"fetch_{i}": np.asarray(value) for i, value in enumerate(fetched)},
             **{f"var_{i}": np.asarray(value) for i, value in enumerate(variables_after)})
    return {"devices": devices, "persistent_bytes": persistent, "step_start_micros": start,
            "fetch_names": fetch_names, "variable_names": list(entry["variables"]), "nodes": nodes,
            "allocator": allocator}


def _allocator_trace(tf: Any, session: Any, fetches: Any, feeds: Any, partition_graphs: Any,
                     log_dir: Path) -> dict[str, Any]:
    """Run one step under TensorFlow's profiler and read each device's allocations from the allocator's own events
    (:mod:`tflms.measure.allocator_events`: they include XLA's buffers, which the allocation records miss)."""
    from tflms.measure.allocator_events import device_records, read_xspace

    device_of = {node.name: node.device for graph in partition_graphs for node in graph.node}
    tf.profiler.experimental.start(str(log_dir))
    try:
        session.run(fetches, feed_dict=feeds)
    finally:
        tf.profiler.experimental.stop()
    paths = sorted(log_dir.glob("plugins/profile/*/*.xplane.pb"))
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {log_dir}")
    ops, memory = read_xspace(str(paths[-1]))
    trace = device_records(ops, memory, device_of)
    return {"devices": {device: {"records": trace.records[device], "allocators": trace.allocators.get(device, [])}
                        for device in trace.records},
            "unattributed_bytes": trace.unattributed_bytes, "unattributed": trace.unattributed,
            "allocator_peak_bytes": trace.allocator_peak_bytes, "memory_events": len(memory)}


def main(argv: Sequence[str] | None = None) -> int:
    """Subprocess entry used by :func:`measure_executor_peaks`: ``main([REQUEST_DIR])``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -c 'from tflms.measure.executor import main; main()' REQUEST_DIR", file=sys.stderr)
        return 2
    return _serve(Path(args[0]))
