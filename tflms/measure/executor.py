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
(``mklcpu`` when oneDNN is on, the default; ``cpu`` otherwise); both logical CPUs
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
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from tflms.errors import ConfigError, GraphError, TflmsError
from tflms.profiles import GIB, HardwareProfile
from tflms.sim.simulator import ONEDNN_CPU_WORKSPACES, SimOptions

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tensorflow.core.framework.graph_pb2 import GraphDef

logger = logging.getLogger(__name__)

#: Device that plays the accelerator (gets every node without a device).
ACCELERATOR_DEVICE = "/device:CPU:1"
#: Device that plays the host (swap-out copies live here).
HOST_DEVICE = "/device:CPU:0"
#: Keys of :attr:`ExecutorMeasurement.devices` by logical CPU index.
_ROLE_BY_CPU_INDEX = {1: "accelerator", 0: "host"}
#: Inter-op threads of the measuring session: one per emulated device, so a swap-out
#: on the host runs while the accelerator computes (like a copy engine beside the
#: compute stream). With one thread the host copies starve until the accelerator's
#: ready ops are done, and swapped tensors stay live far longer than on real hardware.
INTER_OP_THREADS = 2
#: The emulated machine as a simulator profile, for comparing simulated and measured peaks.
#: The memory a swapped graph needs depends on when copies run relative to compute, so
#: plans judged with a GPU profile behave differently here. Rough figures from the step
#: stats of ``tools/validate_memory.py`` on a 2-core x86 machine: MatMul/Conv2D kernels
#: reach ~65 GFLOP/s, element-wise ops ~8 GB/s, a 4 MiB DeepCopy takes 0.5-2 ms, tiny
#: ops 20-80 us.
EMULATION_PROFILE = HardwareProfile(
    "emulated-cpu", memory_bytes=64 * GIB, peak_flops=100e9, memory_gbps=12, link_gbps=5, link_latency_s=20e-6,
    launch_overhead_s=20e-6, compute_efficiency=0.65, link_efficiency=0.8, host_memory_bytes=64 * GIB,
    description="two logical CPU devices of tflms.measure.executor (CPU:1 = accelerator)")
#: Simulator options matching the emulation: the host device, and the workspaces of the
#: oneDNN kernels TensorFlow's x86 CPU build uses by default (``TF_ENABLE_ONEDNN_OPTS``).
EMULATION_SIM_OPTIONS = SimOptions(host_device=HOST_DEVICE, workspace_bytes_per_element=ONEDNN_CPU_WORKSPACES)
#: How much of the subprocess stderr an error message quotes.
STDERR_TAIL_CHARS = 4000

_DT_RESOURCE = 20  # tensorflow.core.framework.types_pb2.DT_RESOURCE, without importing TensorFlow
_DEVICE_RE = re.compile(
    r"^(?:/job:localhost)?(?:/replica:0)?(?:/task:0)?/(?:device:)?CPU:(?P<index>[01])$", re.IGNORECASE)
_NODE_IN_MESSAGE_RE = re.compile(r"\{\{node ([^}\s]+)\}\}")
_PREFIX = "tflms_measure"


class MeasurementError(TflmsError, RuntimeError):
    """TensorFlow could not run the graph being measured (names the node when known)."""


@dataclass(frozen=True)
class DeviceMemory:
    """Memory of one device during the traced step.

    ``timeline`` holds ``(micros since step start, live bytes)`` after each
    allocation record, in time order; ``records`` the same records as
    ``(micros since step start, +/- bytes, allocating node)``. ``peak_bytes`` is the
    timeline's maximum (0 when the device allocated nothing); it excludes
    ``persistent_bytes`` (variables and constants allocated before the step).
    """

    device: str
    peak_bytes: int
    timeline: tuple[tuple[int, int], ...]
    persistent_bytes: int = 0
    allocators: tuple[str, ...] = ()
    records: tuple[tuple[int, int, str], ...] = ()

    @property
    def end_bytes(self) -> int:
        """Bytes allocated during the step that were still live when it ended."""
        return self.timeline[-1][1] if self.timeline else 0


@dataclass(frozen=True)
class NodeTime:
    """When one node ran in the traced step: microseconds since the step start, and its device role."""

    start_us: float
    end_us: float
    role: str  # "accelerator" or "host" ("" for a device of neither role)


@dataclass(frozen=True)
class ExecutorMeasurement:
    """Result of one traced step: per-device memory, fetched values, variables after the step,
    and when each node ran (``node_times``, by node name)."""

    devices: Mapping[str, DeviceMemory]
    fetch_values: Mapping[str, np.ndarray] = field(default_factory=dict)
    variables_after: Mapping[str, np.ndarray] = field(default_factory=dict)
    node_times: Mapping[str, NodeTime] = field(default_factory=dict)

    def start_order(self) -> list[str]:
        """Names of the nodes that ran, by start time (ties by end time, then name)."""
        return sorted(self.node_times, key=lambda n: (self.node_times[n].start_us, self.node_times[n].end_us, n))

    def spans_s(self) -> dict[str, tuple[float, float]]:
        """``{node: (start_s, end_s)}``: ``node_times`` in seconds, the form ``simulate(observed=...)`` takes."""
        return {name: (t.start_us * 1e-6, t.end_us * 1e-6) for name, t in self.node_times.items()}

    def peak(self, which: str = "accelerator", *, include_persistent: bool = False) -> int:
        """Peak live bytes of ``which`` ("accelerator" or "host") during the step.

        With ``include_persistent`` the device's variable and constant bytes are added.
        """
        if which not in self.devices:
            raise KeyError(f"no device {which!r} in this measurement; have {sorted(self.devices)}")
        device = self.devices[which]
        return device.peak_bytes + (device.persistent_bytes if include_persistent else 0)


@dataclass(frozen=True, eq=False)
class ExecutorRequest:
    """One graph to measure; see :func:`measure_executor_peak` for the fields."""

    graph_def: GraphDef
    feeds: Mapping[str, np.ndarray] = field(default_factory=dict)
    variables: Mapping[str, np.ndarray] = field(default_factory=dict)
    fetches: Sequence[str] = ()
    targets: Sequence[str] = ()
    warmup_runs: int = 1

    def __post_init__(self) -> None:
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
        raw_results, stderr_tail = _run_subprocess(request_dir, timeout_s)
        return [_to_measurement(request_dir, index, raw, stderr_tail) for index, raw in enumerate(raw_results)]


def step_request(concrete_function: Any, args: Sequence[Any], *, graph_def: GraphDef | None = None,
                 warmup_runs: int = 1) -> ExecutorRequest:
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
                           targets=tuple(op.name for op in func_graph.control_outputs), warmup_runs=warmup_runs)


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
        if node.device and not _DEVICE_RE.match(node.device):
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
            node.device = ACCELERATOR_DEVICE
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
            "targets": list(request.targets), "warmup_runs": request.warmup_runs}


def _run_subprocess(request_dir: Path, timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
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


def _to_measurement(request_dir: Path, index: int, raw: dict[str, Any], stderr_tail: str) -> ExecutorMeasurement:
    if "error" in raw:
        error = raw["error"]
        node = f" at node {error['node']!r}" if error.get("node") else ""
        message = f"request {index}: TensorFlow failed{node}: {error['type']}: {error['message']}"
        if error["type"] == "GraphError":
            raise GraphError(message)
        raise MeasurementError(message + stderr_tail)
    devices = {}
    for raw_name, data in raw["devices"].items():
        role = _role_of_device(raw_name)
        if role is None:
            raise MeasurementError(f"request {index}: allocation records on unexpected device {raw_name!r}")
        devices[role] = device_memory_from_records(
            raw_name, data["records"], origin_micros=raw["step_start_micros"],
            persistent_bytes=raw["persistent_bytes"].get(role, 0), allocators=data["allocators"])
    for cpu_index, role in _ROLE_BY_CPU_INDEX.items():
        devices.setdefault(role, DeviceMemory(device=f"/job:localhost/replica:0/task:0/device:CPU:{cpu_index}",
                                              peak_bytes=0, timeline=(),
                                              persistent_bytes=raw["persistent_bytes"].get(role, 0)))
    with np.load(request_dir / f"outputs_{index}.npz", allow_pickle=False) as outputs:
        fetch_values = {name: outputs[f"fetch_{i}"] for i, name in enumerate(raw["fetch_names"])}
        variables_after = {name: outputs[f"var_{i}"] for i, name in enumerate(raw["variable_names"])}
    origin_ns = raw["step_start_micros"] * 1000
    node_times = {}
    for name, raw_device, start_ns, end_ns in raw.get("nodes", ()):
        if name in node_times and node_times[name].start_us <= (start_ns - origin_ns) / 1000:
            continue  # a name on two devices (runtime nodes): keep the first run
        node_times[name] = NodeTime(start_us=(start_ns - origin_ns) / 1000, end_us=(end_ns - origin_ns) / 1000,
                                    role=_role_of_device(raw_device) or "")
    return ExecutorMeasurement(devices=devices, fetch_values=fetch_values, variables_after=variables_after,
                               node_times=node_times)


def _role_of_device(device: str) -> str | None:
    match = re.search(r"/device:CPU:(\d+)$", device, re.IGNORECASE)
    return _ROLE_BY_CPU_INDEX.get(int(match.group(1))) if match else None


def device_memory_from_records(device: str, records: Sequence[Sequence[Any]], *, origin_micros: int = 0,
                               persistent_bytes: int = 0, allocators: Sequence[str] = ()) -> DeviceMemory:
    """Build a device's live-bytes timeline from ``(micros, bytes, node)`` allocation records.

    Records are summed in time order; records with the same timestamp keep their
    given order (TensorFlow lists them in the order they happened per node).
    """
    ordered = sorted(records, key=lambda record: record[0])  # stable
    live = peak = 0
    timeline, kept = [], []
    for micros, num_bytes, *rest in ordered:
        live += int(num_bytes)
        peak = max(peak, live)
        timeline.append((int(micros) - origin_micros, live))
        kept.append((int(micros) - origin_micros, int(num_bytes), str(rest[0]) if rest else ""))
    return DeviceMemory(device=device, peak_bytes=peak, timeline=tuple(timeline),
                        persistent_bytes=persistent_bytes, allocators=tuple(sorted(set(allocators))),
                        records=tuple(kept))


# ------------------------------------------------------------------------------------------ subprocess side


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


def _const_bytes_by_device(tf: Any, graph_def: Any) -> dict[str, int]:
    totals: dict[str, int] = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        dtype = tf.as_dtype(node.attr["dtype"].type)
        if dtype == tf.string:
            continue
        elements = int(np.prod([dim.size for dim in node.attr["value"].tensor.tensor_shape.dim], dtype=np.int64))
        cpu_index = int(_DEVICE_RE.match(node.device).group("index"))
        totals[_ROLE_BY_CPU_INDEX[cpu_index]] = totals.get(_ROLE_BY_CPU_INDEX[cpu_index], 0) + elements * dtype.size
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


def _import_with_variables(tf: Any, graph_def: Any, variables: Sequence[tuple[str, np.ndarray]]) -> _SessionGraph:
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
            with tf.device(ACCELERATOR_DEVICE):
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
        if _role_of_device(raw_name) is None and not devices[raw_name]["records"]:
            logger.debug("ignoring device %s without allocation records", raw_name)
            del devices[raw_name]
    return devices, start or 0, nodes


def _measure_one(tf: Any, request_dir: Path, index: int, entry: dict[str, Any]) -> dict[str, Any]:
    graph_def = tf.compat.v1.GraphDef.FromString((request_dir / f"graph_{index}.pb").read_bytes())
    with np.load(request_dir / f"arrays_{index}.npz", allow_pickle=False) as arrays:
        feed_values = [arrays[f"feed_{i}"] for i in range(len(entry["feeds"]))]
        var_values = [arrays[f"var_{i}"] for i in range(len(entry["variables"]))]
    session_graph = _import_with_variables(tf, graph_def, list(zip(entry["variables"], var_values)))
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
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        fetched, _ = session.run([fetch_tensors, run_ops], feed_dict=feeds, options=options, run_metadata=metadata)
        variables_after = session.run(session_graph.reads) if session_graph.reads else []

    devices, start, nodes = _collect_records(metadata.step_stats)
    persistent = _const_bytes_by_device(tf, graph_def)
    persistent["accelerator"] = persistent.get("accelerator", 0) + sum(int(value.nbytes) for value in var_values)
    for name, value in zip(fetch_names, fetched):
        if np.asarray(value).dtype.kind == "O":
            raise GraphError(f"fetch {name!r} is not numeric (dtype {np.asarray(value).dtype}); fetch numeric "
                             "tensors only, or run its op as a target")
    np.savez(request_dir / f"outputs_{index}.npz", allow_pickle=False,
             **{f"fetch_{i}": np.asarray(value) for i, value in enumerate(fetched)},
             **{f"var_{i}": np.asarray(value) for i, value in enumerate(variables_after)})
    return {"devices": devices, "persistent_bytes": persistent, "step_start_micros": start,
            "fetch_names": fetch_names, "variable_names": list(entry["variables"]), "nodes": nodes}


def main(argv: Sequence[str] | None = None) -> int:
    """Subprocess entry used by :func:`measure_executor_peaks`: ``main([REQUEST_DIR])``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -c 'from tflms.measure.executor import main; main()' REQUEST_DIR", file=sys.stderr)
        return 2
    return _serve(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
