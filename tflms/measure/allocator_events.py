"""Live bytes per device from the allocator's own events: what XLA's buffers need (issue 47).

The allocation records of a ``FULL_TRACE`` step (:mod:`tflms.measure.worker`) come from the ``TrackingAllocator``
that the executor wraps around an op's allocator *for the allocations the op makes through its context*
(``allocate_output``, ``allocate_temp``). An ``_XlaRun`` op (an XLA cluster) does not allocate that way: it hands
XLA the device's allocator itself (``GetAllocator`` in ``tensorflow/compiler/jit/xla_platform_info.cc``:
``device->GetAllocator({})`` wrapped in a ``TfAllocatorAdapter``), so XLA's result buffers and its temporary
allocation leave no record (checked on TensorFlow 2.21, CPU: a cluster's ``_XlaRun`` has none, only its outputs'
sizes in the step stats).

The allocator reports every allocation itself when TensorFlow's profiler runs: each ``AllocateRaw`` /
``DeallocateRaw`` of the CPU allocator (``mklcpu`` with oneDNN on, a BFC allocator inside; the BFC allocator with
``TF_CPU_ALLOCATOR_USE_BFC=true``) is a ``MemoryAllocation`` / ``MemoryDeallocation`` event of the host plane with
its address, bytes and the allocator's own running totals. :func:`device_records` attributes each allocation to the
op that ran on the same thread at that instant (the executor's op events, ``name:Type``), whose device the
partition graphs give, and each deallocation to the allocation at its address. Allocations made outside any op of
the step (the client's feeds) and deallocations of buffers allocated before the traced step are left out, as the
records leave them out, but for the buffers an XLA cluster frees (``_XlaRun``, named ``<cluster>/xla_run`` by
``build_xla_ops_pass``): a cluster updates no variable in place (``XlaCompileOp`` compiles with
``may_alias_resource_update=false``), so it allocates each new value and, when it hands it to the variable, frees
the old one, which was allocated before the step. Left out, every variable a step updates would count as live from
its update to the step's end (the zoo ResNet-50's momenta and weights: 180 MiB at the end of its step); counted, the
old buffer goes where the new one comes, as the simulator has it (:mod:`tflms.sim.clusters`, "Variable updates").

Importing this does not import TensorFlow; :func:`read_xspace` does.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ALLOCATION = "MemoryAllocation"
DEALLOCATION = "MemoryDeallocation"
#: The host plane of a profile: the executor's op events and the allocator's memory events are there.
HOST_PLANE = "/host:CPU"
#: How many earlier ops of a thread :func:`_enclosing` looks at for one that still runs (an op that runs others
#: inline, a function call, starts before them).
NEST_LOOKBACK = 8
#: The name TensorFlow's ``build_xla_ops_pass`` gives a cluster's ``_XlaRun`` op, under the cluster's name.
XLA_RUN_SUFFIX = "/xla_run"


@dataclass(frozen=True)
class AllocatorTrace:
    """What :func:`device_records` read: ``records`` per device, ``(micros since the first op, +/- bytes, node)``,
    in the form :func:`tflms.measure.emulation.device_memory_from_records` takes; ``allocators`` per device;
    ``unattributed_bytes`` / ``unattributed``: bytes and count of allocations made outside every op of the step;
    ``allocator_peak_bytes``: the largest ``peak_bytes_in_use`` an event reported (the allocator's own peak since the
    process started or its stats were reset: every device, variables and feeds together); ``replaced_bytes``: bytes of
    buffers from before the step that XLA clusters freed (module doc), recorded as frees."""

    records: Mapping[str, list[tuple[int, int, str]]]
    allocators: Mapping[str, list[str]]
    unattributed_bytes: int
    unattributed: int
    allocator_peak_bytes: int
    replaced_bytes: int = 0


def read_xspace(path: str) -> tuple[list[tuple[int, int, str, int]], list[tuple[int, str, int, dict[str, Any]]]]:
    """``(ops, memory)`` of an ``.xplane.pb``'s host plane: ``ops`` as ``(start_ps, end_ps, name, thread)`` for every
    event whose name is ``node:Type`` (other events too: :func:`device_records` keeps the nodes it knows), ``memory``
    as ``(time_ps, kind, thread, stats)``; times are absolute picoseconds."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TensorFlow only where a profile is read

    with open(path, "rb") as handle:
        space = xplane_pb2.XSpace.FromString(handle.read())
    ops: list[tuple[int, int, str, int]] = []
    memory: list[tuple[int, str, int, dict[str, Any]]] = []
    for plane in space.planes:
        if plane.name != HOST_PLANE:
            continue
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        event_names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            base_ps = line.timestamp_ns * 1000
            for event in line.events:
                name = event_names.get(event.metadata_id, "")
                start = base_ps + event.offset_ps
                if name in (ALLOCATION, DEALLOCATION):
                    memory.append((start, name, line.id, _stats(event, stat_names)))
                elif ":" in name:
                    ops.append((start, start + event.duration_ps, name.split(":", 1)[0], line.id))
    return ops, memory


def _stats(event: Any, stat_names: Mapping[int, str]) -> dict[str, Any]:
    out = {}
    for stat in event.stats:
        kind = stat.WhichOneof("value")
        value = getattr(stat, kind)
        out[stat_names.get(stat.metadata_id, "")] = stat_names.get(value) if kind == "ref_value" else value
    return out


def device_records(ops: list[tuple[int, int, str, int]], memory: list[tuple[int, str, int, dict[str, Any]]],
                   device_of: Mapping[str, str]) -> AllocatorTrace:
    """Per-device allocation records from a profile's events (module doc); ``device_of`` maps the step's node names
    (the partition graphs') to their devices. Times are microseconds since the first op of the step started."""
    by_thread: dict[int, list[tuple[int, int, str]]] = {}
    for start, end, node, thread in ops:
        if node in device_of:
            by_thread.setdefault(thread, []).append((start, end, node))
    starts: dict[int, list[int]] = {}
    for thread, spans in by_thread.items():
        spans.sort()
        starts[thread] = [s for s, _, _ in spans]
    origin = min((s for spans in by_thread.values() for s, _, _ in spans), default=0)
    records: dict[str, list[tuple[int, int, str]]] = {}
    allocators: dict[str, list[str]] = {}
    live: dict[int, tuple[str, int, str]] = {}  # address -> (device, bytes, node)
    unattributed = unattributed_bytes = peak = replaced = 0
    for time, kind, thread, stats in sorted(memory, key=lambda m: m[0]):
        peak = max(peak, int(stats.get("peak_bytes_in_use", 0) or 0))
        address, num_bytes = int(stats.get("addr", 0)), int(stats.get("requested_bytes", 0) or 0)
        micros = (time - origin) // 1_000_000
        if kind == DEALLOCATION:
            found = live.pop(address, None)
            if found is not None:
                device, allocated, node = found
                records[device].append((micros, -allocated, node))
                continue
            node = _enclosing(by_thread.get(thread, ()), starts.get(thread, ()), time)
            if node is not None and node.endswith(XLA_RUN_SUFFIX) and num_bytes:  # a variable's old value
                records.setdefault(device_of[node], []).append((micros, -num_bytes, node))
                replaced += num_bytes
            continue
        node = _enclosing(by_thread.get(thread, ()), starts.get(thread, ()), time)
        if node is None:
            unattributed += 1
            unattributed_bytes += num_bytes
            continue
        device = device_of[node]
        records.setdefault(device, []).append((micros, num_bytes, node))
        allocators.setdefault(device, []).append(str(stats.get("allocator_name", "")))
        live[address] = (device, num_bytes, node)
    return AllocatorTrace(records=records, allocators=allocators, unattributed_bytes=unattributed_bytes,
                          unattributed=unattributed, allocator_peak_bytes=peak, replaced_bytes=replaced)


def _enclosing(spans: Any, starts: Any, time: int) -> str | None:
    """The op of ``spans`` (sorted ``(start, end, node)`` of one thread) running at ``time``: the latest started one
    that has not ended (ops on one thread nest only when one runs another inline)."""
    k = bisect.bisect_right(starts, time) - 1
    for j in range(k, max(k - NEST_LOOKBACK, -1), -1):
        _, end, node = spans[j]
        if end >= time:
            return node
    return None
