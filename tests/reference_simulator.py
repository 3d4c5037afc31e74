"""The simulator as it was at commit c78da4f, kept verbatim (graph- and name-based, slow) as the
reference that pins the fast index-based simulator (tflms/sim/simulator.py) and the incremental
evaluator (tflms/tune/evaluator.py) to identical results in tests/test_incremental.py.

Changed since, each where the simulator's memory model deliberately changed (and marked "changed:"):
a reduction that reduces nothing shares its input's buffer, as TensorFlow's ``ReductionOp`` does
(tflms.ir.op_types.IDENTITY_REDUCTION_OPS). Nothing in tflms imports this file.
"""


from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence

from tflms.analysis.cto import compute_levels
from tflms.config import normalize_device
from tflms.errors import ConfigError, GraphError
from tflms.ir.graph import DTYPE_BYTES, Graph, TensorRef
from tflms.ir.op_types import IDENTITY_REDUCTION_OPS, trivial_reduction  # changed: trivial reductions
from tflms.sim.cost import op_time_s
from tflms.profiles import HardwareProfile, get_profile

ACCEL, HOST = "accelerator", "host"

#: Ops whose output is a view of input 0 on the same device.
ALIAS_OPS = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
                       "PreventGradient", "EnsureShape", "CheckNumerics", "IdentityN"})
#: Copy ops that move a tensor between devices when their input lives elsewhere.
COPY_OPS = frozenset({"Identity", "DeepCopy", "Snapshot"})
#: Element-wise ops whose output may reuse a same-sized input that dies with them (TensorFlow's
#: cwise kernels call ``forward_input_or_allocate_output`` on every same-shaped input; ``Cast``
#: only aliases a cast to the same dtype, so the dtype check leaves it allocating otherwise).
FORWARDING_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Neg", "Abs", "Exp", "Log", "Sqrt", "Rsqrt", "Square",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "BiasAdd", "ReluGrad", "Relu6Grad",
    "TanhGrad", "SigmoidGrad", "AddN", "Cast", "SquaredDifference", "DivNoNan", "LeakyRelu", "LeakyReluGrad",
    "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "Reciprocal", "Inv", "EluGrad", "SeluGrad", "Softplus",
    "SoftplusGrad", "Softsign", "SoftsignGrad", "Log1p", "Expm1", "Sign", "Floor", "Ceil", "Round", "Rint",
    "Pow", "Div", "FloorDiv", "FloorMod", "Erf", "MulNoNan", "Xlogy", "Xdivy", "ClipByValue",
})
#: Kernel workspaces of TensorFlow's oneDNN CPU kernels (``SimOptions.workspace_bytes_per_element``):
#: ``_MklNativeMaxPool`` returns a workspace of one byte per output element (the argmax
#: index in the window) that ``MaxPoolGrad`` reads, so it lives as long as the output.
ONEDNN_CPU_WORKSPACES = {"MaxPool": 1.0}
#: Ops whose outputs are resident (variables) rather than step activations.
VARIABLE_READ_OPS = frozenset({"ReadVariableOp", "VarHandleOp", "ResourceGather"})
_SOURCE_OPS = frozenset({"Placeholder", "_Arg"})


@dataclasses.dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulator (see module doc)."""

    host_device: str = "/device:CPU:0"
    margin_fraction: float = 0.0
    margin_bytes: int = 0
    model_forwarding: bool = True
    resident_inputs: bool = True
    prune_unused: bool = True
    #: Extra bytes per element of output 0 that kernels of these op types allocate with
    #: that output and keep as long as it (see ``ONEDNN_CPU_WORKSPACES``); ``{type: bytes}``.
    workspace_bytes_per_element: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_device", normalize_device(self.host_device, field="host_device"))
        workspaces = dict(self.workspace_bytes_per_element)
        for op_type, per_element in workspaces.items():
            if not isinstance(per_element, (int, float)) or per_element < 0:
                raise ConfigError(f"workspace_bytes_per_element[{op_type!r}] must be a number >= 0, "
                                  f"got {per_element!r}")
        object.__setattr__(self, "workspace_bytes_per_element", workspaces)
        if not 0 <= self.margin_fraction < 10:
            raise ConfigError(f"margin_fraction must be in [0, 10), got {self.margin_fraction}")
        if self.margin_bytes < 0:
            raise ConfigError("margin_bytes must be >= 0")


@dataclasses.dataclass(frozen=True)
class OpRecord:
    name: str
    device: str
    stream: str  # "compute", "d2h", "h2d" or "host"
    start_s: float
    end_s: float


@dataclasses.dataclass(frozen=True)
class SimResult:
    """The simulator's answer for one graph on one profile."""

    profile: str
    peak_bytes: int  # accelerator: resident + transient
    resident_bytes: int  # variables, optimizer slots, step arguments
    transient_peak_bytes: int  # peak of step activations alone
    peak_with_margin_bytes: int
    peak_time_s: float
    live_at_peak: tuple[tuple[str, int], ...]  # (tensor, bytes), largest first
    host_peak_bytes: int
    step_time_s: float
    compute_time_s: float
    transfer_time_s: float
    stall_time_s: float  # time compute waited for transfers
    timeline: tuple[tuple[float, int, int], ...]  # (time, accelerator bytes, host bytes) after each change
    ops: tuple[OpRecord, ...]
    unknown_size_tensors: tuple[str, ...]
    buffer_owner: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # tensor -> buffer
    #: accelerator buffers as (name, bytes, first, last): alive from memory event ``first`` to ``last``
    #: inclusive (event indices in time order), the input of the memory planner (``tflms.plan``).
    buffer_lifetimes: tuple[tuple[str, int, int, int], ...] = dataclasses.field(default=(), repr=False)

    def tensors_sharing(self, owner: str) -> list[str]:
        """Tensors that live in ``owner``'s buffer (aliases and forwarded outputs)."""
        return sorted(t for t, o in self.buffer_owner.items() if o == owner)

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_with_margin_bytes <= budget_bytes

    def overhead_vs(self, baseline: "SimResult") -> float:
        """Relative step-time overhead against ``baseline`` (0.1 = 10% slower)."""
        return self.step_time_s / baseline.step_time_s - 1.0 if baseline.step_time_s else 0.0

    def summary(self) -> dict:
        return {"profile": self.profile, "peak_bytes": self.peak_bytes, "resident_bytes": self.resident_bytes,
                "transient_peak_bytes": self.transient_peak_bytes,
                "peak_with_margin_bytes": self.peak_with_margin_bytes, "host_peak_bytes": self.host_peak_bytes,
                "step_time_s": self.step_time_s, "stall_time_s": self.stall_time_s,
                "transfer_time_s": self.transfer_time_s}


def level_order(graph: Graph) -> list[str]:
    """Ops sorted by CTO level, ties by graph order."""
    levels = compute_levels(graph)
    position = {op.name: i for i, op in enumerate(graph)}
    return sorted(levels, key=lambda n: (levels[n], position[n]))


def order_from_start_times(graph: Graph, start_times: Mapping[str, float]) -> list[str]:
    """An execution order of ``graph`` that follows observed start times.

    ``start_times`` maps op names to when they started (e.g. the executor's
    ``ExecutorMeasurement.node_times``); names not in the graph are ignored. The
    result is a topological order: among ready ops the earliest observed start runs
    first; an op that was not observed (a fed placeholder, a runtime-only node) runs
    as soon as its inputs are ready, ties by graph order. A correct observation of a
    run respects every edge, so the result is then exactly the observed order.
    """
    position = {op.name: i for i, op in enumerate(graph)}
    indegree = {op.name: len(graph.predecessors(op.name)) for op in graph}
    successors: dict[str, list[str]] = {name: [] for name in indegree}
    for name in indegree:
        for pred in graph.predecessors(name):
            successors[pred].append(name)
    key: dict[str, float] = {}
    ready = []
    for name, n in indegree.items():
        if n == 0:
            key[name] = start_times.get(name, float("-inf"))
            heapq.heappush(ready, (key[name], position[name], name))
    order: list[str] = []
    while ready:
        _, _, name = heapq.heappop(ready)
        order.append(name)
        for succ in successors[name]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                inherited = max(key[p] for p in graph.predecessors(succ))
                key[succ] = start_times.get(succ, inherited)
                heapq.heappush(ready, (key[succ], position[succ], succ))
    if len(order) != len(graph):
        raise GraphError("the graph has a cycle; no execution order exists")
    return order


def variable_bytes(graph: Graph) -> dict[str, int]:
    """Bytes of each variable the step uses, by resource handle.

    Taken from ``graph.resource_bytes`` (recorded when the IR was read from a
    ConcreteFunction) or else from the largest read of each handle.
    """
    known = graph.resource_bytes
    if known:
        return dict(known)
    sizes: dict[str, int] = {}
    for op in graph:
        if op.type in VARIABLE_READ_OPS and op.inputs and op.outputs:
            handle = op.inputs[0].name
            sizes[handle] = max(sizes.get(handle, 0), op.outputs[0].num_bytes or 0)
    return sizes


def _device_class(device: str, host: str) -> str:
    if not device:
        return ACCEL
    try:
        local = normalize_device(device, field="device").rpartition("/device:")[2]
    except ConfigError:
        return ACCEL
    return HOST if local == host.rpartition("/device:")[2] else ACCEL


#: Suffix of the virtual copy ops that stand for TensorFlow's _Send/_Recv pairs.
RECV_SUFFIX = "/_recv"


def _with_implicit_copies(graph: Graph, order: Sequence[str] | None, host: str):
    """Make TensorFlow's implicit cross-device copies explicit.

    An accelerator op reading a host tensor gets it through a ``_Recv`` that
    TensorFlow inserts (one per tensor and device), which copies as soon as the
    tensor exists: control inputs of the consumer do not delay it. Each such
    tensor gets an ``Identity`` on the accelerator named ``<op>/_recv`` (output
    index appended when not 0), which the simulator then treats as a transfer.
    ``DeepCopy`` consumers are the exception: they are the explicit copies of the
    two-logical-CPU emulation, where cross-device edges share buffers.
    """
    device = {op.name: _device_class(op.device, host) for op in graph}
    needed: dict[TensorRef, list[tuple[str, int]]] = {}
    for op in graph:
        if device[op.name] != ACCEL or op.type == "DeepCopy":
            continue
        for i, ref in enumerate(op.inputs):
            if device[ref.op] == HOST and graph.tensor(ref).dtype not in ("resource", "variant", "string"):
                needed.setdefault(ref, []).append((op.name, i))
    if not needed:
        return graph, order
    graph = graph.copy()
    order = list(order) if order is not None else None
    for ref in sorted(needed):
        name = ref.op + RECV_SUFFIX + ("" if ref.index == 0 else f"_{ref.index}")
        graph.add_op(name, "Identity", inputs=[ref], device="", outputs=[graph.tensor(ref)])
        for consumer, index in needed[ref]:
            graph.set_input(consumer, index, TensorRef(name, 0))
        if order is not None:
            first = min(order.index(c) for c, _ in needed[ref])
            order.insert(first, name)
    return graph, order


def _prune_unused(graph: Graph, output_names: Sequence[str]) -> Graph:
    """``graph`` without the ops that neither the outputs nor the control outputs need.

    Only for graphs with a signature (the roots are then known); others are returned as they are.
    """
    sig = graph.signature
    if sig is None:
        return graph
    roots = [TensorRef.parse(n).op for n in output_names] + list(sig.control_output_names)
    needed: set[str] = set()
    stack = [r for r in roots if r in graph]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(p for p in graph.predecessors(name) if p not in needed)
    if len(needed) == len(graph):
        return graph
    pruned = graph.copy()
    for name in reversed(graph.topological_order()):
        if name not in needed:
            pruned.remove_op(name)
    return pruned


def simulate(graph: Graph, profile: str | HardwareProfile, *, order: Sequence[str] | None = None,
             options: SimOptions | None = None, output_names: Sequence[str] | None = None,
             observed: Mapping[str, tuple[float, float]] | None = None) -> SimResult:
    """Simulate one step of ``graph`` (see module doc); ``order`` defaults to CTO levels.

    ``order`` may also list ops that do not run (unused ops, see ``SimOptions.prune_unused``).
    ``observed`` replays a measured run: ``{op: (start_s, end_s)}`` replaces the profile's
    timing for the ops it lists (an op it does not list takes no time and starts when its
    inputs are done); ``order`` then defaults to the observed start order.
    """
    profile = get_profile(profile)
    options = options or SimOptions()
    sig = graph.signature
    if output_names is None:
        output_names = sig.output_names if sig is not None else ()
    if options.prune_unused:
        graph = _prune_unused(graph, output_names)
    if observed is not None and order is None:
        order = order_from_start_times(graph, {name: span[0] for name, span in observed.items()})
    graph, order = _with_implicit_copies(graph, order, options.host_device)
    if order is not None:
        order = [name for name in order if name in graph]
    else:
        order = level_order(graph)
    if len(order) != len(graph) or set(order) != {op.name for op in graph}:
        missing = sorted({op.name for op in graph} - set(order))[:5]
        raise GraphError(f"the execution order must list every op exactly once; missing e.g. {missing}")
    position = {name: i for i, name in enumerate(order)}
    for name in order:
        for pred in graph.predecessors(name):
            if position[pred] > position[name]:
                raise GraphError(f"the execution order runs {name!r} before its input {pred!r}")
    outputs = {TensorRef.parse(n) for n in output_names}

    device = {op.name: _device_class(op.device, options.host_device) for op in graph}
    # ----------------------------------------------------------- buffers
    buffer_of: dict[TensorRef, TensorRef] = {}  # tensor -> the tensor that owns its buffer
    resident: set[TensorRef] = set()
    variable_reads: set[TensorRef] = set()
    unknown: list[str] = []
    for name in order:
        op = graph.op(name)
        for i, info in enumerate(op.outputs):
            ref = TensorRef(name, i)
            buffer_of[ref] = ref
            if info.num_bytes is None and info.dtype not in ("resource", "variant", "string"):
                unknown.append(ref.name)
        if op.type in VARIABLE_READ_OPS:
            variable_reads.add(TensorRef(name, 0))
        elif (op.type in _SOURCE_OPS and options.resident_inputs) or op.type in ("Const", "HostConst"):
            resident.update(TensorRef(name, i) for i in range(len(op.outputs)))
        elif op.type in ALIAS_OPS and op.inputs:
            src = op.inputs[0]
            if device[src.op] == device[name] or op.type not in COPY_OPS:
                for i in range(len(op.outputs)):
                    buffer_of[TensorRef(name, i)] = buffer_of[op.inputs[min(i, len(op.inputs) - 1)]]
        elif (op.type in IDENTITY_REDUCTION_OPS and op.inputs and len(op.outputs) == 1  # changed: trivial reductions
              and trivial_reduction(graph.tensor(op.inputs[0]), op.outputs[0])):
            buffer_of[TensorRef(name, 0)] = buffer_of[op.inputs[0]]
    is_transfer = {name: graph.op(name).type in COPY_OPS and bool(graph.op(name).inputs)
                   and device[graph.op(name).inputs[0].op] != device[name] for name in order}

    def owner_of(ref: TensorRef) -> TensorRef:
        owner = buffer_of[ref]
        while buffer_of[owner] != owner:
            owner = buffer_of[owner]
        buffer_of[ref] = owner
        return owner

    # ----------------------------------------------------------- timing
    end: dict[str, float] = {}
    records: list[OpRecord] = []
    stream_free = {"d2h": 0.0, "h2d": 0.0}
    compute_free = 0.0
    stall = 0.0
    compute_time = 0.0
    transfer_time = 0.0
    pending_transfers = [n for n in order if is_transfer[n]]
    waiting = {n: set(graph.predecessors(n)) for n in pending_transfers}
    dependents: dict[str, list[str]] = {}
    for n, preds in waiting.items():
        for p in preds:
            dependents.setdefault(p, []).append(n)
    start: dict[str, float] = {}
    event_seq: dict[str, float] = {}

    def finish(name: str, when: float, seq: float) -> None:
        end[name] = when
        event_seq[name] = seq
        ready = []
        for dep in dependents.get(name, ()):
            waiting[dep].discard(name)
            if not waiting[dep]:
                ready.append(dep)
        for dep in sorted(ready, key=lambda n: position[n]):
            run_transfer(dep, seq)

    def run_transfer(name: str, seq: float) -> None:
        nonlocal transfer_time
        op = graph.op(name)
        direction = "h2d" if device[name] == ACCEL else "d2h"
        ready_at = max((end[p] for p in graph.predecessors(name)), default=0.0)
        t0 = max(ready_at, stream_free[direction])
        duration = profile.copy_time_s(graph.tensor(op.inputs[0]).num_bytes or 0)
        stream_free[direction] = t0 + duration
        transfer_time += duration
        start[name] = t0
        records.append(OpRecord(name, device[name], direction, t0, t0 + duration))
        finish(name, t0 + duration, seq + 0.5)

    for idx, name in enumerate(order):
        if observed is not None:  # replay: every op at its observed time
            ready_at = max((end[p] for p in graph.predecessors(name)), default=0.0)
            t0, t1 = observed.get(name, (ready_at, ready_at))
            if is_transfer[name]:
                stream = "h2d" if device[name] == ACCEL else "d2h"
                transfer_time += t1 - t0
            else:
                stream = "host" if device[name] == HOST else "compute"
                compute_time += (t1 - t0) if stream == "compute" else 0.0
            start[name], end[name], event_seq[name] = t0, t1, float(idx)
            records.append(OpRecord(name, device[name], stream, t0, t1))
            continue
        if is_transfer[name]:
            continue
        op = graph.op(name)
        preds = graph.predecessors(name)
        missing = [p for p in preds if p not in end]
        if missing:  # a transfer whose own inputs come later cannot happen in a valid order
            raise GraphError(f"{name!r} depends on {missing[0]!r}, which the schedule cannot run before it")
        ready_at = max((end[p] for p in preds), default=0.0)
        if device[name] == HOST:
            t0 = ready_at
            duration = 0.0
            stream = "host"
        else:
            t0 = max(ready_at, compute_free)
            if ready_at > compute_free and is_transfer[max(preds, key=lambda p: end[p])]:
                stall += ready_at - compute_free
            duration = op_time_s(graph, op, profile)
            compute_free = t0 + duration
            compute_time += duration
            stream = "compute"
        start[name] = t0
        records.append(OpRecord(name, device[name], stream, t0, t0 + duration))
        finish(name, t0 + duration, float(idx))
    for name in pending_transfers if observed is None else ():
        if name not in end:
            raise GraphError(f"transfer {name!r} never became ready (its inputs never ran)")
    step_time = max(end.values(), default=0.0)

    # ----------------------------------------------------------- forwarding
    # An element-wise op reuses an input buffer when nothing else holds a reference to it:
    # it is the buffer's last reader in the order and every other reader has ended by the
    # time it starts (a concurrent reader, e.g. a copy still running, keeps its reference).
    # Function outputs are read by the caller after the last op (never forwarded).
    readers: dict[TensorRef, list[str]] = {}
    for name in order:
        for ref in graph.op(name).inputs:
            readers.setdefault(owner_of(ref), []).append(name)
    last_reader: dict[TensorRef, int] = {buf: max(position[r] for r in rs) for buf, rs in readers.items()}
    for ref in outputs:
        if ref in buffer_of:
            last_reader[owner_of(ref)] = len(order)
    if options.model_forwarding:
        for name in order:
            op = graph.op(name)
            if op.type not in FORWARDING_OPS or len(op.outputs) != 1 or is_transfer[name]:
                continue
            out = op.outputs[0]
            own = TensorRef(name, 0)
            for ref in op.inputs:
                buf = owner_of(ref)
                info = graph.tensor(buf)
                if (buf not in resident and buf not in variable_reads and device[buf.op] == device[name]
                        and last_reader.get(buf) == position[name] and info.num_bytes == out.num_bytes
                        and info.dtype == out.dtype and out.num_bytes
                        and all(end[r] <= start[name] for r in readers[buf] if r != name)):
                    buffer_of[own] = buf
                    # The forwarded output's readers now read ``buf``: it lives as long as they do.
                    last_reader[buf] = max(last_reader[buf], last_reader.get(own, -1))
                    readers[buf].extend(readers.pop(own, ()))
                    break
    # Resolve alias chains to their owners.
    for ref in list(buffer_of):
        owner_of(ref)
    readers = {}
    for name in order:
        for ref in graph.op(name).inputs:
            readers.setdefault(buffer_of[ref], []).append(name)

    # ----------------------------------------------------------- memory events
    events: list[tuple[float, float, int, int, str, int]] = []  # (time, seq, phase, delta, device, tensor id)
    tensor_names: list[str] = []
    resident_bytes = sum(variable_bytes(graph).values())
    host_resident = 0
    owners = sorted({b for b in buffer_of.values()}, key=lambda r: (position[r.op], r.index))
    output_owners = {buffer_of[r] for r in outputs if r in buffer_of}
    for buf in owners:
        info = graph.tensor(buf)
        size = info.num_bytes or 0
        if size == 0 or buf in variable_reads:
            continue
        per_element = options.workspace_bytes_per_element.get(graph.op(buf.op).type, 0)
        if per_element and buf.index == 0 and info.dtype in DTYPE_BYTES:
            size += int(per_element * size // DTYPE_BYTES[info.dtype])
        dev = device[buf.op]
        if buf in resident:
            if dev == ACCEL:
                resident_bytes += size
            else:
                host_resident += size
            continue
        tid = len(tensor_names)
        tensor_names.append(buf.name)
        t_alloc = start[buf.op]
        seq_alloc = event_seq[buf.op] - (0.25 if is_transfer[buf.op] else 0.0)
        users = readers.get(buf, [])
        if buf in output_owners:
            t_free, seq_free = step_time, float("inf")
        elif users:
            last = max(users, key=lambda u: (end[u], event_seq[u]))
            t_free, seq_free = end[last], event_seq[last]
        else:
            t_free, seq_free = end[buf.op], event_seq[buf.op]
        events.append((t_alloc, seq_alloc, 0, size, dev, tid))
        events.append((t_free, seq_free, 1, -size, dev, tid))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    live = {ACCEL: resident_bytes, HOST: host_resident}
    peak, peak_index, peak_time, host_peak = live[ACCEL], -1, 0.0, live[HOST]
    timeline = [(0.0, live[ACCEL], live[HOST])]
    for i, (t, _, _, delta, dev, _) in enumerate(events):
        live[dev] += delta
        timeline.append((t, live[ACCEL], live[HOST]))
        if dev == ACCEL and live[ACCEL] > peak:
            peak, peak_index, peak_time = live[ACCEL], i, t
        host_peak = max(host_peak, live[HOST])
    first_event: dict[int, int] = {}
    lifetimes = []
    for i, (_, _, phase, delta, dev, tid) in enumerate(events):
        if dev != ACCEL:
            continue
        if phase == 0:
            first_event[tid] = i
        else:
            lifetimes.append((tensor_names[tid], -delta, first_event[tid], max(first_event[tid], i - 1)))
    lifetimes.sort(key=lambda lt: (lt[2], lt[0]))
    alive: dict[int, int] = {}
    for t, _, phase, delta, dev, tid in events[:peak_index + 1]:
        if dev != ACCEL:
            continue
        if phase == 0:
            alive[tid] = delta
        else:
            alive.pop(tid, None)
    live_at_peak = tuple(sorted(((tensor_names[k], v) for k, v in alive.items()), key=lambda kv: (-kv[1], kv[0])))
    margin = int(peak * options.margin_fraction) + options.margin_bytes
    records.sort(key=lambda r: (r.start_s, r.end_s, r.name))
    return SimResult(
        profile=profile.name, peak_bytes=peak, resident_bytes=resident_bytes,
        transient_peak_bytes=peak - resident_bytes, peak_with_margin_bytes=peak + margin, peak_time_s=peak_time,
        live_at_peak=live_at_peak, host_peak_bytes=host_peak, step_time_s=step_time, compute_time_s=compute_time,
        transfer_time_s=transfer_time, stall_time_s=stall, timeline=tuple(timeline), ops=tuple(records),
        unknown_size_tensors=tuple(unknown),
        buffer_owner={r.name: o.name for r, o in buffer_of.items() if o != r},
        buffer_lifetimes=tuple(lifetimes))


def compare(original: SimResult, rewritten: SimResult) -> Mapping[str, float]:
    """Peak saved and time overhead of a rewrite."""
    return {"peak_saved_bytes": original.peak_bytes - rewritten.peak_bytes,
            "peak_ratio": rewritten.peak_bytes / original.peak_bytes if original.peak_bytes else 1.0,
            "overhead": rewritten.overhead_vs(original)}

