"""The simulation proper (:func:`_run`): when each op runs (the event loop), then the memory its buffers take
(:mod:`tflms.sim.buffers`), the peak and the timeline.

The model is in the module doc of :mod:`tflms.sim.simulator`; :func:`tflms.sim.simulator.simulate` prepares
the indexed graph and the checked order this runs over, and :mod:`tflms.sim.clock` says how long each op keeps the
accelerator busy and what its launch costs the host. The loops are tuned for speed: keep function calls out of them.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Mapping, Sequence

from tflms.errors import GraphError
from tflms.sim.buffers import _Buffers, _Events, _forward, _forward_resolve, _memory_events, _readers
from tflms.sim.clock import Kernels, kernels_for, resolve_clock
from tflms.sim.indexed import ACCEL, HOST, IndexedGraph, OpCosts, _indices, positions
from tflms.sim.records import (TRANSFER_ORDER_RELEASE, MappingView, SequenceView, SimDetails, SimOptions,
                                SimResult)
from tflms.profiles import HardwareProfile


class _Timing:
    """When each op started and ended, the order of its memory events at one instant (``event_seq``), and the step's
    compute, transfer and stall times."""

    __slots__ = ("start", "end", "event_seq", "compute_time", "kernel_time", "transfer_time", "stall")

    def __init__(self, n: int):
        self.start = [0.0] * n
        self.end: list = [None] * n
        self.event_seq = [0.0] * n
        self.compute_time = self.kernel_time = self.transfer_time = self.stall = 0.0


def _time_observed(net: IndexedGraph, order: Sequence[int], is_transfer: Sequence[bool],
                   observed: Mapping[str, tuple[float, float]]) -> _Timing:
    """Replay a measured run: every op starts and ends when it did (an op not listed when its inputs are done)."""
    timing = _Timing(len(net.names))
    start, end, event_seq, names, preds, dev = timing.start, timing.end, timing.event_seq, net.names, net.preds, net.dev
    for idx, i in enumerate(order):
        ready_at = max((end[p] for p in preds[i]), default=0.0)
        t0, t1 = observed.get(names[i], (ready_at, ready_at))
        if is_transfer[i]:
            timing.transfer_time += t1 - t0
        elif dev[i] != HOST:
            timing.compute_time += t1 - t0
        start[i], end[i], event_seq[i] = t0, t1, float(idx)
    timing.kernel_time = timing.compute_time
    return timing


def _time_release(net: IndexedGraph, order: Sequence[int], position: Sequence[int], is_transfer: Sequence[bool],
                  kernels: Kernels, profile: HardwareProfile) -> _Timing:
    """Compute in the order; each copy served by its stream in the order the walk releases it (module doc of
    :mod:`tflms.sim.simulator`); a kernel waits for the host to have launched it (``kernels.launch``)."""
    n = len(net.names)
    timing = _Timing(n)
    start, end, event_seq = timing.start, timing.end, timing.event_seq
    names, dev, inputs, t_info = net.names, net.dev, net.inputs, net.t_info
    preds = kernels.preds if kernels.preds is not None else net.preds
    duration, launch = kernels.duration, kernels.launch
    stream_free = {"d2h": 0.0, "h2d": 0.0}
    pending_transfers = [i for i in order if is_transfer[i]]
    waiting = [0] * n
    dependents: dict[int, list[int]] = {}
    for i in pending_transfers:
        waiting[i] = len(preds[i])
        for p in preds[i]:
            dependents.setdefault(p, []).append(i)
    copy_time_s = profile.copy_time_s

    def release(deps: list[int], seq: float) -> None:
        """Start the transfers that waited only for an op that just finished (in order of position)."""
        ready = []
        for dep in deps:
            waiting[dep] -= 1
            if waiting[dep] == 0:
                ready.append(dep)
        if len(ready) > 1:
            ready.sort(key=position.__getitem__)
        for i in ready:
            direction = "h2d" if dev[i] == ACCEL else "d2h"
            ready_at = max((end[p] for p in preds[i]), default=0.0)
            t0 = max(ready_at, stream_free[direction])
            span = copy_time_s(t_info[inputs[i][0]].num_bytes or 0)
            stream_free[direction] = t0 + span
            timing.transfer_time += span
            start[i] = t0
            end[i] = t0 + span
            event_seq[i] = seq + 0.5
            more = dependents.get(i)
            if more:
                release(more, seq + 0.5)

    compute_free = issued = stall = busy = 0.0
    seq = -1.0  # (the op's position in the order, as a float: counted, not converted)
    for i in order:
        seq += 1.0
        if is_transfer[i]:
            continue
        ready_at = 0.0
        latest = -1
        for p in preds[i]:
            e = end[p]
            if e is None:  # a transfer whose own inputs come later cannot happen in a valid order
                raise GraphError(f"{names[i]!r} depends on {names[p]!r}, which the schedule cannot run before it")
            if latest < 0 or e > ready_at:
                ready_at, latest = e, p
        if dev[i] == HOST:
            t0 = t1 = ready_at
        else:
            d = duration[i]
            issued += launch[i]
            free = compute_free if compute_free > issued else issued
            t0 = free if free > ready_at else ready_at
            if ready_at > free and is_transfer[latest]:
                stall += ready_at - free
            t1 = compute_free = t0 + d
            busy += d
        start[i] = t0
        end[i] = t1
        event_seq[i] = seq
        if i in dependents:
            release(dependents[i], seq)
    # ``release`` calls itself through its closure: a reference cycle that would keep every list it reads
    # (``preds``, ``end``, ...) alive until the cyclic collector runs, which the simulations pause
    # (``gc_paused``). A tune of DenseNet-121 at batch 1143 held the dead simulations' lists, about
    # 120 million objects, at its peak.
    release = None  # noqa: F841 - breaks the cycle
    for i in pending_transfers:
        if end[i] is None:
            raise GraphError(f"transfer {names[i]!r} never became ready (its inputs never ran)")
    timing.stall, timing.kernel_time = stall, busy
    timing.compute_time = _compute_time(busy, compute_free, stall, launch)
    return timing


def _compute_time(busy: float, compute_free: float, stall: float, launch: Sequence[float]) -> float:
    """The compute stream's time without copies: its kernels' time, plus the time it waited for launches (what a
    step lasts at best however its copies run; :attr:`SimResult.compute_bound`)."""
    if not any(launch):
        return busy
    return max(busy, compute_free - stall)


def _fifo_successors(net: IndexedGraph, order: Sequence[int],
                     preds: Sequence[Sequence[int]]) -> tuple[list[int], dict[int, list[int]]]:
    """How many predecessors each op of the order waits for, and each op's successors."""
    remaining = [0] * len(net.names)
    succs: dict[int, list[int]] = {}
    for i in order:
        p = preds[i]
        remaining[i] = len(p)
        for q in p:
            s_list = succs.get(q)
            if s_list is None:
                succs[q] = [i]
            else:
                s_list.append(i)
    return remaining, succs


def _time_fifo(net: IndexedGraph, order: Sequence[int], position: Sequence[int], is_transfer: Sequence[bool],
               kernels: Kernels, profile: HardwareProfile) -> _Timing:
    """Events in time order: compute ops run one at a time in the order; host ops run when their inputs are done;
    transfers queue on their direction's stream and are served first come (by the time they became ready), first
    served. ``event_seq`` breaks ties between memory events at one instant: an op's position in the order, and for a
    transfer the latest sequence of its inputs plus one half."""
    n = len(net.names)
    timing = _Timing(n)
    start, end, event_seq = timing.start, timing.end, timing.event_seq
    dev, inputs, t_info = net.dev, net.inputs, net.t_info
    preds = kernels.preds if kernels.preds is not None else net.preds
    duration, launch = kernels.duration, kernels.launch
    remaining, succs = _fifo_successors(net, order, preds)
    ready_at, release_seq = [0.0] * n, [-1.0] * n
    compute_ops = [i for i in order if not is_transfer[i] and dev[i] != HOST]
    next_compute = 0
    compute_free = issued = stall = busy = 0.0
    stream_free = {"d2h": 0.0, "h2d": 0.0}
    waiting: dict[str, list] = {"d2h": [], "h2d": []}  # heaps of (ready, release seq, position, op)
    heap: list = []  # (time, seq, kind, op, direction): kind 0 = an op finished, 1 = a stream may start a copy
    heappush, heappop = heapq.heappush, heapq.heappop
    copy_time_s = profile.copy_time_s
    inf = float("inf")
    for i in order:
        if remaining[i] == 0 and dev[i] == HOST and not is_transfer[i]:
            event_seq[i] = float(position[i])
            end[i] = 0.0
            heappush(heap, (0.0, event_seq[i], 0, i, ""))
    while True:
        while next_compute < len(compute_ops) and remaining[compute_ops[next_compute]] == 0:
            i = compute_ops[next_compute]
            next_compute += 1
            ready, latest = 0.0, -1
            for p in preds[i]:
                e = end[p]
                if latest < 0 or e > ready:
                    ready, latest = e, p
            issued += launch[i]
            free = compute_free if compute_free > issued else issued
            t0 = free if free > ready else ready
            if ready > free and is_transfer[latest]:
                stall += ready - free
            t1 = compute_free = t0 + duration[i]
            busy += duration[i]
            start[i], end[i], event_seq[i] = t0, t1, float(position[i])
            heappush(heap, (t1, event_seq[i], 0, i, ""))
        if not heap:
            break
        now, _, kind, i, direction = heappop(heap)
        if kind == 1:
            queue = waiting[direction]
            while queue and max(queue[0][0], stream_free[direction]) <= now:
                ready, rseq, _, j = heappop(queue)
                t0 = max(ready, stream_free[direction])
                span = copy_time_s(t_info[inputs[j][0]].num_bytes or 0)
                stream_free[direction] = t0 + span
                timing.transfer_time += span
                start[j], end[j], event_seq[j] = t0, t0 + span, rseq + 0.5
                heappush(heap, (end[j], event_seq[j], 0, j, ""))
            if queue:
                heappush(heap, (max(queue[0][0], stream_free[direction]), inf, 1, -1, direction))
            continue
        e_i, s_i = end[i], event_seq[i]
        for j in succs.get(i, ()):
            if e_i > ready_at[j]:
                ready_at[j] = e_i
            if s_i > release_seq[j]:
                release_seq[j] = s_i
            remaining[j] -= 1
            if remaining[j]:
                continue
            if is_transfer[j]:
                d = "h2d" if dev[j] == ACCEL else "d2h"
                heappush(waiting[d], (ready_at[j], release_seq[j], position[j], j))
                heappush(heap, (max(ready_at[j], stream_free[d]), inf, 1, -1, d))
            elif dev[j] == HOST:
                start[j] = end[j] = ready_at[j]
                event_seq[j] = float(position[j])
                heappush(heap, (ready_at[j], event_seq[j], 0, j, ""))
    _check_all_ran(net, order, end)
    timing.stall, timing.kernel_time = stall, busy
    timing.compute_time = _compute_time(busy, compute_free, stall, launch)
    return timing


def _check_all_ran(net: IndexedGraph, order: Sequence[int], end: Sequence[float | None]) -> None:
    for i in order:
        if end[i] is None:
            blocked = [net.names[p] for p in net.preds[i] if end[p] is None]
            raise GraphError(f"{net.names[i]!r} never ran: it waits for {blocked[:3]}, which the schedule cannot "
                             "run before it")


def _streams(order: Sequence[int], position: Sequence[int], dev: list[str], is_transfer: list[bool]) -> bytes:
    """:attr:`SimDetails.streams`: by position in the order, 0 for compute, 1 for the host, 2 and 3 for copies to and
    from the device (host ops and copies are few: placed by position)."""
    streams = bytearray(len(order))
    for i in _indices(dev, HOST):
        if position[i] >= 0:
            streams[position[i]] = 1
    for i in _indices(is_transfer, True):
        streams[position[i]] = 2 if dev[i] == ACCEL else 3
    return bytes(streams)


def _result(net: IndexedGraph, order: Sequence[int], position: Sequence[int], bufs: _Buffers, timing: _Timing,
            ev: _Events, profile: HardwareProfile, options: SimOptions, step_time: float,
            kernels: Kernels) -> SimResult:
    """Walk the memory events: the timeline, the peak and what is alive at it, the buffers' lifetimes."""
    names, t_op, dev, is_transfer = net.names, net.t_op, net.dev, bufs.is_transfer
    events, tid_buf = ev.events, ev.tid_buf
    live_accel, live_host = ev.resident_bytes, ev.host_resident
    peak, peak_index, peak_time, host_peak = live_accel, -1, 0.0, live_host
    # the timeline (one entry before the events, one after each) and the device buffers' lifetimes, as arrays
    times, accel, host = array("d", [0.0]), array("q", [live_accel]), array("q", [live_host])
    add_time, add_accel, add_host = times.append, accel.append, host.append
    first = [0] * len(tid_buf)
    last_event = [0] * len(tid_buf)
    size_of = [0] * len(tid_buf)
    device_tids: list[int] = []  # in order of their first event
    for k, (t, _, phase, tid, delta, d) in enumerate(events):
        if d == ACCEL:
            live_accel += delta
            if phase == 0:
                first[tid], size_of[tid] = k, delta
                device_tids.append(tid)
                if live_accel > peak:
                    peak, peak_index, peak_time = live_accel, k, t
            else:
                last_event[tid] = k - 1
        else:
            live_host += delta
            if live_host > host_peak:
                host_peak = live_host
        add_time(t)
        add_accel(live_accel)
        add_host(live_host)
    t_idx = net.t_idx
    margin = int(peak * options.margin_fraction) + options.margin_bytes
    start, end = timing.start, timing.end
    details = SimDetails(
        names=tuple(names), t_op=array("i", t_op), t_idx=array("i", t_idx), order=array("i", order),
        start=array("d", map(start.__getitem__, order)), end=array("d", map(end.__getitem__, order)),
        streams=_streams(order, position, dev, is_transfer),
        times=times, accel=accel, host=host, buffer_of=array("i", bufs.buffer_of), in_order=bytes(bufs.in_order),
        lt_buf=array("i", map(tid_buf.__getitem__, device_tids)),
        lt_size=array("q", map(size_of.__getitem__, device_tids)),
        lt_first=array("i", map(first.__getitem__, device_tids)),
        lt_last=array("i", [max(first[tid], last_event[tid]) for tid in device_tids]), peak_event=peak_index)
    resident_bytes = ev.resident_bytes
    return SimResult(
        profile=profile.name, peak_bytes=peak, resident_bytes=resident_bytes,
        transient_peak_bytes=peak - resident_bytes, peak_with_margin_bytes=peak + margin, peak_time_s=peak_time,
        live_at_peak=SequenceView(details, "live_at_peak"), host_peak_bytes=host_peak, step_time_s=step_time,
        compute_time_s=timing.compute_time, transfer_time_s=timing.transfer_time, stall_time_s=timing.stall,
        kernel_time_s=timing.kernel_time,
        timeline=SequenceView(details, "timeline"), ops=SequenceView(details, "ops"),
        unknown_size_tensors=tuple(bufs.unknown), buffer_owner=MappingView(details, "buffer_owner"),
        buffer_lifetimes=SequenceView(details, "buffer_lifetimes"), details=details, clock=kernels.mode,
        kernels=kernels.kernels)


def step_kernels(net: IndexedGraph, order: Sequence[int], outputs: Sequence[int], profile: HardwareProfile,
                 options: SimOptions, costs: OpCosts,
                 position: Sequence[int] | None = None) -> tuple[_Buffers, Kernels]:
    """The buffers each tensor starts in and the kernels the clock of ``options`` makes of the step, as
    :func:`_run` (and :func:`tflms.sim.simulator.kernel_reads`) use them. ``position``: by op id its position in
    ``order`` (-1: not in it), where the caller has it."""
    if position is None:
        position = positions(order, len(net.names))
    bufs = _Buffers(net, order, options, position)
    return bufs, kernels_for(resolve_clock(options.clock, profile), net, order, bufs.is_transfer, costs, profile,
                             outputs, options, position)


def _run(net: IndexedGraph, order: Sequence[int], position: Sequence[int], outputs: Iterable[int],
         profile: HardwareProfile, options: SimOptions, costs: OpCosts, alive: Sequence[bool],
         observed: Mapping[str, tuple[float, float]] | None = None) -> SimResult:
    """The simulation proper (see module doc) over an :class:`IndexedGraph` and a checked order."""
    outputs = list(dict.fromkeys(outputs))
    bufs, kernels = step_kernels(net, order, outputs, profile, options, costs, position)
    if kernels.order is not None:  # XLA clusters: each cluster's kernels back to back (tflms.sim.clusters)
        order = kernels.order
        position = positions(order, len(net.names))
    if observed is not None:
        timing = _time_observed(net, order, bufs.is_transfer, observed)
    elif options.transfer_order == TRANSFER_ORDER_RELEASE:
        timing = _time_release(net, order, position, bufs.is_transfer, kernels, profile)
    else:
        timing = _time_fifo(net, order, position, bufs.is_transfer, kernels, profile)
    step_time = max(map(timing.end.__getitem__, order), default=0.0)
    reads = kernels.reads if kernels.reads is not None else net.inputs
    readers, last_reader = _readers(order, reads, bufs.buffer_of, outputs, bufs.in_order, position, len(order))
    if options.model_forwarding:
        _forward(net, order, position, bufs, timing, reads, kernels.virtual, readers, last_reader, kernels.cluster)
    else:
        _forward_resolve(bufs)
    ev = _memory_events(net, order, bufs, timing, readers, outputs, kernels.virtual, alive, options, step_time,
                        kernels.cluster, kernels.first, kernels.unowned)
    return _result(net, order, position, bufs, timing, ev, profile, options, step_time, kernels)
