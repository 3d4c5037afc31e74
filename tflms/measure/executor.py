"""Peak memory of a graph measured by TensorFlow's own executor.

There is no accelerator in the test environment, so one is emulated: the single
physical CPU is split into two logical CPU devices, ``/device:CPU:1`` plays the
*accelerator* and ``/device:CPU:0`` the *host*. Logical CPU devices share one
allocator and a plain cross-device ``Identity`` shares the buffer, so swaps in
graphs measured here must be allocating copies (``DeepCopy``): swap-out on CPU:0,
swap-in on CPU:1. Nodes without a device are placed on the accelerator.

The graph runs in a ``tf.compat.v1.Session`` with two CPU devices
(``ConfigProto.device_count``) in a fresh subprocess (isolation from the caller's
TensorFlow state, crashes and timeouts), once per warm-up run and then once with
``FULL_TRACE``. The per-node
``allocation_records`` of that traced step, summed in time order per device,
give each device's live-bytes timeline and peak. Records come per allocator
(``mklcpu``: the subprocess runs oneDNN's kernels on every x86 machine, ``EMULATION_ENV``); both logical CPUs
share that allocator, so records are summed per device of the allocating node.

What the peak contains (the *step transient* peak):

- every buffer allocated during the traced step (op outputs and temporaries),
  attributed to the device of the node that allocated it;
- NOT buffers that existed before the step: variable buffers, ``Const`` tensors
  (held by the kernel, allocated when the kernel is built, even without warm-up)
  and fed values. Variables and top-level ``Const`` nodes are reported separately
  as :attr:`DeviceMemory.persistent_bytes` and can be added with
  ``peak(include_persistent=True)``; fed values are in neither;
- outputs forwarded in place (e.g. ``AddV2`` reusing an input buffer) have no
  record of their own, as on a real device.

A buffer allocated during the step that outlives it (a fetched output handed to
the client, a variable update that had to copy) leaves the timeline's last value,
:attr:`DeviceMemory.end_bytes`, above zero: its deallocation is not recorded.

Function calls (``PartitionedCall``) are measured too: the records of the ops
inside the function body appear under their own names.

The executor's own schedule is reported too: :attr:`ExecutorMeasurement.node_times`
gives every node that ran its start and end (microseconds since the step start,
from the step stats' nanosecond fields) and device role. With two inter-op threads
the executor runs ready ops in parallel, in an order that is not the CTO level
order; :meth:`ExecutorMeasurement.start_order` lists the nodes by start time, and
:func:`tflms.sim.simulator.order_from_start_times` turns that into an execution
order of an IR graph for ``simulate(order=...)``. Nodes the runtime adds (``_SOURCE``,
``_arg_*``/``_retval_*``, ``_Send``/``_Recv``, the variables of this module) are
included as they ran; fed placeholders do not run and are absent.

The traced step always starts from the given variable values: variables are
re-initialised after the warm-up runs, so :attr:`ExecutorMeasurement.variables_after`
holds exactly one step's update.

Usage::

    m = measure_executor_peak(graph_def, feeds={"x": x}, fetches=["loss:0"])
    m.peak("accelerator"), m.peak("host")

    # a traced training step, original and rewritten, in one subprocess
    ms = measure_executor_peaks([step_request(concrete, (x, y)),
                                 step_request(concrete, (x, y), graph_def=tf_io.to_graph_def(rewritten))])
    # the simulator's view of the same machine, in the executor's own schedule
    simulate(rewritten, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS, observed=ms[1].spans_s())

The subprocess runs :func:`main` (``python -c "from tflms.measure.executor import
main; main()" REQUEST_DIR``); the request directory format is private.

The pieces: :mod:`tflms.measure.emulation` (the emulated devices, the result types and
the records-to-timeline step), :mod:`tflms.measure.worker` (the subprocess); this module
holds the requests, their checks, and the parent's side of the subprocess, and
re-exports the public names of both.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from tflms.errors import ConfigError, GraphError
from tflms.measure.emulation import (
    ACCELERATOR_DEVICE,
    ALLOCATOR_TRACE_ENV,
    DEVICE_RE,
    EMULATION_ENV,
    EMULATION_PROFILE,
    EMULATION_SIM_OPTIONS,
    EMULATION_XLA_FLAGS,
    HOST_DEVICE,
    INTER_OP_THREADS,
    STDERR_TAIL_CHARS,
    DeviceMemory,
    ExecutorMeasurement,
    MeasurementError,
    NodeTime,
    device_memory_from_records,
    role_of_device,
    roles_by_cpu_index,
)
from tflms.measure.worker import main

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tensorflow.core.framework.graph_pb2 import GraphDef

logger = logging.getLogger(__name__)

__all__ = ["ACCELERATOR_DEVICE", "EMULATION_PROFILE", "EMULATION_SIM_OPTIONS", "HOST_DEVICE", "INTER_OP_THREADS",
           "STDERR_TAIL_CHARS", "DeviceMemory", "ExecutorMeasurement", "ExecutorRequest", "MeasurementError",
           "NodeTime", "device_memory_from_records", "main", "measure_executor_peak", "measure_executor_peaks",
           "step_request"]

_DT_RESOURCE = 20  # tensorflow.core.framework.types_pb2.DT_RESOURCE, without importing TensorFlow


@dataclass(frozen=True, eq=False)
class ExecutorRequest:
    """One graph to measure; see :func:`measure_executor_peak` for the fields."""

    graph_def: GraphDef
    feeds: Mapping[str, np.ndarray] = field(default_factory=dict)
    variables: Mapping[str, np.ndarray] = field(default_factory=dict)
    fetches: Sequence[str] = ()
    targets: Sequence[str] = ()
    warmup_runs: int = 1
    allocator_trace: bool = False
    accelerator_cpu: int = 1

    def __post_init__(self) -> None:
        if self.accelerator_cpu not in (0, 1):
            raise ConfigError(f"accelerator_cpu must be 0 or 1 (a logical CPU), got {self.accelerator_cpu!r}")
        if not hasattr(self.graph_def, "node") or not hasattr(self.graph_def, "SerializeToString"):
            raise ConfigError(f"graph_def must be a tf GraphDef proto, got {type(self.graph_def).__name__}")
        if isinstance(self.warmup_runs, bool) or not isinstance(self.warmup_runs, int) or self.warmup_runs < 0:
            raise ConfigError(f"warmup_runs must be an int >= 0, got {self.warmup_runs!r}")
        for what in ("fetches", "targets"):
            if isinstance(getattr(self, what), str):
                raise ConfigError(f"{what} must be a sequence of names, not the string {getattr(self, what)!r}")
        if not self.fetches and not self.targets:
            raise ConfigError("nothing to run: give fetches (tensor or op names) and/or targets (op names)")


def measure_executor_peak(
    graph_def: GraphDef,
    *,
    feeds: Mapping[str, np.ndarray],
    variables: Mapping[str, np.ndarray] | None = None,
    fetches: Sequence[str] = (),
    targets: Sequence[str] = (),
    warmup_runs: int = 1,
    timeout_s: float = 300,
) -> ExecutorMeasurement:
    """Run ``graph_def`` for one traced step on the emulated accelerator and report its memory.

    Args:
        graph_def: the graph, e.g. ``concrete_function.graph.as_graph_def()``. Nodes
            without a device run on the accelerator (CPU:1); devices other than
            CPU:0 and CPU:1 are rejected.
        feeds: value of each data placeholder, keyed by node or tensor name.
        variables: initial value of each ``Placeholder`` of dtype resource (the
            captured variables of a traced function, the last ``cf.graph.inputs``),
            keyed by placeholder name. Each becomes a real variable on the accelerator.
        fetches: tensor names (``"loss:0"``, value returned) or op names (run only).
        targets: op names to run, e.g. the function's control outputs (variable updates).
        warmup_runs: untraced runs before the traced one (variables are reset afterwards).
        timeout_s: limit for the whole subprocess.

    Raises:
        GraphError: a name is unknown, a resource placeholder has no value, a device is not CPU:0/CPU:1.
        MeasurementError: TensorFlow failed (message names the node and quotes the subprocess stderr).
    """
    request = ExecutorRequest(graph_def=graph_def, feeds=feeds, variables=variables or {},
                              fetches=tuple(fetches), targets=tuple(targets), warmup_runs=warmup_runs)
    return measure_executor_peaks([request], timeout_s=timeout_s)[0]


def measure_executor_peaks(requests: Sequence[ExecutorRequest], *, timeout_s: float = 300) -> list[ExecutorMeasurement]:
    """Measure several graphs in one subprocess (saves the ~5 s TensorFlow start per graph).

    Returns one measurement per request, in order. Requests are validated before the
    subprocess starts; the first request TensorFlow fails on raises (later ones are not run).
    """
    if not requests:
        return []
    with tempfile.TemporaryDirectory(prefix="tflms_measure_") as tmp:
        request_dir = Path(tmp)
        manifest = [_write_request(request_dir, index, request) for index, request in enumerate(requests)]
        (request_dir / "requests.json").write_text(json.dumps({"requests": manifest}))
        raw_results, stderr_tail = _run_subprocess(request_dir, timeout_s,
                                                    allocator_trace=any(r.allocator_trace for r in requests))
        return [_to_measurement(request_dir, index, raw, stderr_tail, requests[index].accelerator_cpu)
                for index, raw in enumerate(raw_results)]


def step_request(concrete_function: Any, args: Sequence[Any], *, graph_def: GraphDef | None = None,
                 warmup_runs: int = 1, allocator_trace: bool = False, accelerator_cpu: int = 1) -> ExecutorRequest:
    """A request that runs one step of a traced ``tf.function`` as the function would.

    ``args`` are the values of the function's argument tensors, in ``FuncGraph.inputs``
    order. Captured variables start from their current values (read now); other captured
    tensors are fed. Fetches are the function's outputs, targets its control outputs (the
    variable updates). ``graph_def`` runs another graph with the same placeholders instead,
    e.g. ``tf_io.to_graph_def`` of a rewrite of the function.
    """
    func_graph = concrete_function.graph
    captured = list(func_graph.captures)
    num_args = len(func_graph.inputs) - len(captured)
    if len(args) != num_args:
        raise ConfigError(f"the function takes {num_args} argument tensors, got {len(args)} values")
    feeds = {tensor.op.name: np.asarray(value) for tensor, value in zip(func_graph.inputs[:num_args], args)}
    try:
        known = func_graph.variables
    except AssertionError as exc:  # TensorFlow's message for weakly held variables that are gone
        raise GraphError("the function's variables have been deleted: keep the model and optimizer alive "
                         "while measuring its step") from exc
    by_handle = {id(var.handle): var for var in known if getattr(var, "handle", None) is not None}
    variables = {}
    for external, internal in captured:
        var = by_handle.get(id(external))
        if var is not None:
            variables[internal.op.name] = np.asarray(var.numpy())
        elif internal.dtype.name == "resource":
            raise GraphError(f"captured resource {internal.op.name!r} is not one of the function's variables; "
                             "only variables can be recreated in the measuring process")
        else:
            feeds[internal.op.name] = np.asarray(external.numpy())
    return ExecutorRequest(graph_def=func_graph.as_graph_def() if graph_def is None else graph_def, feeds=feeds,
                           variables=variables, fetches=tuple(t.name for t in func_graph.outputs),
                           targets=tuple(op.name for op in func_graph.control_outputs), warmup_runs=warmup_runs,
                           allocator_trace=allocator_trace, accelerator_cpu=accelerator_cpu)


# --------------------------------------------------------------------------------------------- parent side


def _tensor_name(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def _node_name(name: str) -> str:
    return name.split(":", 1)[0].lstrip("^")


def _validate(request: ExecutorRequest, index: int) -> None:
    """Check names and devices before paying for a subprocess; raise GraphError naming the culprit."""
    nodes = {node.name: node for node in request.graph_def.node}
    where = f"request {index}"

    def need(name: str, role: str) -> Any:
        node = nodes.get(_node_name(name))
        if node is None:
            raise GraphError(f"{where}: {role} {name!r} names no node of the graph ({len(nodes)} nodes)")
        return node

    for name in request.feeds:
        need(name, "feed")
    for name, value in request.variables.items():
        node = need(name, "variable")
        if node.op != "Placeholder" or node.attr["dtype"].type != _DT_RESOURCE:
            raise GraphError(f"{where}: variable {name!r} must name a Placeholder of dtype resource, "
                             f"got op {node.op!r}")
        if not isinstance(value, (np.ndarray, np.generic)):
            raise GraphError(f"{where}: initial value of variable {name!r} must be a numpy array or scalar "
                             f"(its dtype becomes the variable's), got {type(value).__name__}")
    given = {_node_name(name) for name in request.variables}
    for node in request.graph_def.node:
        if node.op == "Placeholder" and node.attr["dtype"].type == _DT_RESOURCE and node.name not in given:
            raise GraphError(f"{where}: resource placeholder {node.name!r} has no initial value; "
                             "pass it in variables={name: numpy_value}")
        if node.device and not DEVICE_RE.match(node.device):
            raise GraphError(f"{where}: node {node.name!r} has device {node.device!r}; the emulated machine "
                             f"only has {HOST_DEVICE} (host) and {ACCELERATOR_DEVICE} (accelerator)")
    for name in request.fetches:
        need(name, "fetch")
    for name in request.targets:
        if ":" in name:
            raise GraphError(f"{where}: target {name!r} must be an op name, not a tensor name")
        need(name, "target")


def _write_request(request_dir: Path, index: int, request: ExecutorRequest) -> dict[str, Any]:
    _validate(request, index)
    graph_def = type(request.graph_def)()
    graph_def.CopyFrom(request.graph_def)
    for node in graph_def.node:
        if not node.device:
            node.device = f"/device:CPU:{request.accelerator_cpu}"
    (request_dir / f"graph_{index}.pb").write_bytes(graph_def.SerializeToString())
    arrays: dict[str, np.ndarray] = {}
    feeds = []
    for position, (name, value) in enumerate(request.feeds.items()):
        arrays[f"feed_{position}"] = np.asarray(value)
        feeds.append(_tensor_name(name))
    variables = []
    for position, (name, value) in enumerate(request.variables.items()):
        arrays[f"var_{position}"] = np.asarray(value)
        variables.append(_node_name(name))
    try:
        np.savez(request_dir / f"arrays_{index}.npz", allow_pickle=False, **arrays)
    except ValueError as exc:
        raise GraphError(f"request {index}: feeds/variables must be numeric numpy arrays ({exc})") from exc
    return {"feeds": feeds, "variables": variables, "fetches": list(request.fetches),
            "targets": list(request.targets), "warmup_runs": request.warmup_runs,
            "allocator_trace": request.allocator_trace, "accelerator_cpu": request.accelerator_cpu}


def subprocess_env(environ: Mapping[str, str], *, allocator_trace: bool = False) -> dict[str, str]:
    """The measuring subprocess's environment: ``environ`` with this package importable, oneDNN's kernels
    (:data:`EMULATION_ENV`), every XLA cluster compiled when it first runs (:data:`EMULATION_XLA_FLAGS`, after any
    ``TF_XLA_FLAGS`` given) and, with ``allocator_trace``, the BFC allocator (:data:`ALLOCATOR_TRACE_ENV`)."""
    env = dict(environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env.update(EMULATION_ENV)
    env["TF_XLA_FLAGS"] = " ".join(f for f in (env.get("TF_XLA_FLAGS", ""), EMULATION_XLA_FLAGS) if f)
    if allocator_trace:
        env.update(ALLOCATOR_TRACE_ENV)
    return env


def _run_subprocess(request_dir: Path, timeout_s: float, *, allocator_trace: bool = False
                    ) -> tuple[list[dict[str, Any]], str]:
    env = subprocess_env(os.environ, allocator_trace=allocator_trace)
    stderr_path = request_dir / "stderr.txt"
    # ``-c`` rather than ``-m``: tflms.measure already imports this module (runpy would warn).
    command = [sys.executable, "-c", "import sys; from tflms.measure.executor import main; sys.exit(main())",
               str(request_dir)]
    logger.debug("running %s", command)
    with open(stderr_path, "wb") as stderr:
        try:
            completed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                       timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise MeasurementError(f"measuring subprocess exceeded timeout_s={timeout_s}; raise it for big graphs"
                                   f"{_tail(stderr_path)}") from exc
    tail = _tail(stderr_path)
    result_path = request_dir / "results.json"
    if not result_path.exists():
        raise MeasurementError(f"measuring subprocess died (exit code {completed.returncode}) before writing "
                               f"results{tail}")
    return json.loads(result_path.read_text())["results"], tail


def _tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    if not text.strip():
        return ""
    return f"\n--- subprocess stderr (tail) ---\n{text[-STDERR_TAIL_CHARS:]}"


def _to_measurement(request_dir: Path, index: int, raw: dict[str, Any], stderr_tail: str,
                    accelerator_cpu: int = 1) -> ExecutorMeasurement:
    if "error" in raw:
        error = raw["error"]
        node = f" at node {error['node']!r}" if error.get("node") else ""
        message = f"request {index}: TensorFlow failed{node}: {error['type']}: {error['message']}"
        if error["type"] == "GraphError":
            raise GraphError(message)
        raise MeasurementError(message + stderr_tail)
    devices = _device_memories(raw["devices"], raw["persistent_bytes"], accelerator_cpu,
                               f"request {index}: allocation records", origin_micros=raw["step_start_micros"])
    with np.load(request_dir / f"outputs_{index}.npz", allow_pickle=False) as outputs:
        fetch_values = {name: outputs[f"fetch_{i}"] for i, name in enumerate(raw["fetch_names"])}
        variables_after = {name: outputs[f"var_{i}"] for i, name in enumerate(raw["variable_names"])}
    origin_ns = raw["step_start_micros"] * 1000
    node_times = {}
    for name, raw_device, start_ns, end_ns in raw.get("nodes", ()):
        if name in node_times and node_times[name].start_us <= (start_ns - origin_ns) / 1000:
            continue  # a name on two devices (runtime nodes): keep the first run
        node_times[name] = NodeTime(start_us=(start_ns - origin_ns) / 1000, end_us=(end_ns - origin_ns) / 1000,
                                    role=role_of_device(raw_device, accelerator_cpu) or "")
    allocator = raw.get("allocator")
    allocator_devices = None if allocator is None else _device_memories(
        allocator["devices"], raw["persistent_bytes"], accelerator_cpu, f"request {index}: allocator events")
    return ExecutorMeasurement(devices=devices, fetch_values=fetch_values, variables_after=variables_after,
                               node_times=node_times, allocator_devices=allocator_devices,
                               unattributed_bytes=allocator["unattributed_bytes"] if allocator else 0,
                               allocator_peak_bytes=allocator["allocator_peak_bytes"] if allocator else 0)


def _device_memories(raw_devices: dict, persistent: dict, accelerator_cpu: int, what: str, *,
                     origin_micros: int = 0) -> dict[str, DeviceMemory]:
    """Each role's :class:`DeviceMemory` from a worker's per-device records (allocation records, or the allocator's
    events), a device without any given an empty timeline; ``what`` names the records in the error for a device
    that is neither role."""
    devices = {}
    for raw_name, data in raw_devices.items():
        role = role_of_device(raw_name, accelerator_cpu)
        if role is None:
            raise MeasurementError(f"{what} on unexpected device {raw_name!r}")
        devices[role] = device_memory_from_records(raw_name, data["records"], origin_micros=origin_micros,
                                                   persistent_bytes=persistent.get(role, 0),
                                                   allocators=data["allocators"])
    for cpu_index, role in roles_by_cpu_index(accelerator_cpu).items():
        devices.setdefault(role, DeviceMemory(device=f"/job:localhost/replica:0/task:0/device:CPU:{cpu_index}",
                                              peak_bytes=0, timeline=(), persistent_bytes=persistent.get(role, 0)))
    return devices


if __name__ == "__main__":
    sys.exit(main())
