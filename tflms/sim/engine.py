"""The simulation proper (:func:`_run`): buffers, timing (the event loop), forwarding, memory events.

The model is in the module doc of :mod:`tflms.sim.simulator`; :func:`tflms.sim.simulator.simulate` prepares
the indexed graph and the checked order this runs over. The loops are tuned for speed: keep function calls
out of them.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Mapping, Sequence

from tflms.errors import GraphError
from tflms.ir.graph import DTYPE_BYTES
from tflms.ir.op_types import (ALIAS_OPS, COPY_OPS, FORWARDING_OPS, IDENTITY_REDUCTION_OPS, SOURCE_OPS,
                               VARIABLE_READ_OPS, trivial_reduction)
from tflms.sim.cost import op_time_s
from tflms.sim.indexed import (_NO_BUFFER_DTYPES, ACCEL, HOST, IndexedGraph, OpCosts, _resident_variable_bytes,
                               _synthetic_op)
from tflms.sim.records import (TRANSFER_ORDER_RELEASE, MappingView, SequenceView, SimDetails, SimOptions,
                                SimResult)
from tflms.profiles import HardwareProfile


def _run(net: IndexedGraph, order: Sequence[int], position: Sequence[int], outputs: Iterable[int],
         profile: HardwareProfile, options: SimOptions, costs: OpCosts, alive: Sequence[bool],
         observed: Mapping[str, tuple[float, float]] | None = None) -> SimResult:
    """The simulation proper (see module doc) over an :class:`IndexedGraph` and a checked order."""
    n = len(net.names)
    names, types, dev, inputs, preds = net.names, net.types, net.dev, net.inputs, net.preds
    out_start, n_out, t_op, t_info = net.out_start, net.n_out, net.t_op, net.t_info
    outputs = set(outputs)
    num_tensors = len(t_op)
    # ----------------------------------------------------------- buffers
    # buffer_of[t] is the tensor owning t's buffer; until forwarding it is always resolved (an owner),
    # because an alias takes its input's (resolved) owner and inputs come earlier in the order.
    buffer_of = list(range(num_tensors))
    in_order = [False] * num_tensors  # outputs of ops in the order
    resident = [False] * num_tensors
    variable_reads = [False] * num_tensors
    unknown: list[str] = []
    is_transfer = [False] * n
    resident_inputs = options.resident_inputs
    for i in order:
        s, k = out_start[i], n_out[i]
        for t in range(s, s + k):
            in_order[t] = True
            info = t_info[t]
            if info.num_bytes is None and info.dtype not in _NO_BUFFER_DTYPES:
                unknown.append(net.tensor_name(t))
        op_type = types[i]
        ins = inputs[i]
        if op_type in COPY_OPS and ins and dev[t_op[ins[0]]] != dev[i]:
            is_transfer[i] = True
        if op_type in VARIABLE_READ_OPS:
            if k:
                variable_reads[s] = True
        elif (op_type in SOURCE_OPS and resident_inputs) or op_type in ("Const", "HostConst"):
            for t in range(s, s + k):
                resident[t] = True
        elif op_type in ALIAS_OPS and ins:
            if dev[t_op[ins[0]]] == dev[i] or op_type not in COPY_OPS:
                last = len(ins) - 1
                for j in range(k):
                    buffer_of[s + j] = buffer_of[ins[min(j, last)]]
        elif op_type in IDENTITY_REDUCTION_OPS and ins and k == 1 and trivial_reduction(t_info[ins[0]], t_info[s]):
            buffer_of[s] = buffer_of[ins[0]]

    def owner_of(t: int) -> int:
        owner = buffer_of[t]
        while buffer_of[owner] != owner:
            owner = buffer_of[owner]
        buffer_of[t] = owner
        return owner

    # ----------------------------------------------------------- timing
    if options.transfer_order == TRANSFER_ORDER_RELEASE or observed is not None:
        end: list = [None] * n
        start = [0.0] * n
        event_seq = [0.0] * n
        stream_free = {"d2h": 0.0, "h2d": 0.0}
        compute_free = 0.0
        stall = 0.0
        compute_time = 0.0
        transfer_time = 0.0
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
            nonlocal transfer_time
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
                duration = copy_time_s(t_info[inputs[i][0]].num_bytes or 0)
                stream_free[direction] = t0 + duration
                transfer_time += duration
                start[i] = t0
                end[i] = t0 + duration
                event_seq[i] = seq + 0.5
                more = dependents.get(i)
                if more:
                    release(more, seq + 0.5)

        src_ops = net.src_ops
        times = costs._times
        for idx, i in enumerate(order):
            if observed is not None:  # replay: every op at its observed time
                ready_at = max((end[p] for p in preds[i]), default=0.0)
                t0, t1 = observed.get(names[i], (ready_at, ready_at))
                if is_transfer[i]:
                    stream = "h2d" if dev[i] == ACCEL else "d2h"
                    transfer_time += t1 - t0
                else:
                    stream = "host" if dev[i] == HOST else "compute"
                    compute_time += (t1 - t0) if stream == "compute" else 0.0
                start[i], end[i], event_seq[i] = t0, t1, float(idx)
                continue
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
                t0 = compute_free if compute_free > ready_at else ready_at
                if ready_at > compute_free and is_transfer[latest]:
                    stall += ready_at - compute_free
                duration = times.get(i) if src_ops[i] is not None else None
                if duration is None:
                    duration = costs.time_s(i, src_ops[i]) if src_ops[i] is not None else op_time_s(
                        net.graph, _synthetic_op(net, i), profile)
                t1 = compute_free = t0 + duration
                compute_time += duration
            start[i] = t0
            end[i] = t1
            event_seq[i] = seq = float(idx)
            deps = dependents.get(i)
            if deps:
                release(deps, seq)
        # ``release`` calls itself through its closure: a reference cycle that would keep every list it reads
        # (``preds``, ``end``, ...) alive until the cyclic collector runs, which the simulations pause
        # (``gc_paused``). A tune of DenseNet-121 at batch 1143 held the dead simulations' lists, about
        # 120 million objects, at its peak.
        release = None  # noqa: F841 - breaks the cycle
        if observed is None:
            for i in pending_transfers:
                if end[i] is None:
                    raise GraphError(f"transfer {names[i]!r} never became ready (its inputs never ran)")
    else:
        end: list = [None] * n
        start = [0.0] * n
        event_seq = [0.0] * n
        stall = 0.0
        compute_time = 0.0
        transfer_time = 0.0
        # Events in time order. Compute ops run one at a time in the order; host ops run when their inputs
        # are done; transfers queue on their direction's stream and are served first come (by the time they
        # became ready), first served. ``event_seq`` breaks ties between memory events at one instant: an op's
        # position in the order, and for a transfer the latest sequence of its inputs plus one half.
        remaining = [0] * n
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
        ready_at = [0.0] * n
        release_seq = [-1.0] * n
        compute_ops = [i for i in order if not is_transfer[i] and dev[i] != HOST]
        next_compute = 0
        compute_free = 0.0
        stream_free = {"d2h": 0.0, "h2d": 0.0}
        waiting: dict[str, list] = {"d2h": [], "h2d": []}  # heaps of (ready, release seq, position, op)
        heap: list = []  # (time, seq, kind, op, direction): kind 0 = an op finished, 1 = a stream may start a copy
        heappush, heappop = heapq.heappush, heapq.heappop
        copy_time_s = profile.copy_time_s
        src_ops = net.src_ops
        times = costs._times
        inf = float("inf")
        for i in order:
            if remaining[i] == 0 and dev[i] == HOST and not is_transfer[i]:
                start[i] = end[i] = 0.0
                event_seq[i] = float(position[i])
                heappush(heap, (0.0, event_seq[i], 0, i, ""))
        while True:
            while next_compute < len(compute_ops) and remaining[compute_ops[next_compute]] == 0:
                i = compute_ops[next_compute]
                next_compute += 1
                ready = 0.0
                latest = -1
                for p in preds[i]:
                    e = end[p]
                    if latest < 0 or e > ready:
                        ready, latest = e, p
                t0 = compute_free if compute_free > ready else ready
                if ready > compute_free and is_transfer[latest]:
                    stall += ready - compute_free
                duration = times.get(i) if src_ops[i] is not None else None
                if duration is None:
                    duration = costs.time_s(i, src_ops[i]) if src_ops[i] is not None else op_time_s(
                        net.graph, _synthetic_op(net, i), profile)
                t1 = compute_free = t0 + duration
                compute_time += duration
                start[i] = t0
                end[i] = t1
                event_seq[i] = float(position[i])
                heappush(heap, (t1, event_seq[i], 0, i, ""))
            if not heap:
                break
            now, _, kind, i, direction = heappop(heap)
            if kind == 1:
                queue = waiting[direction]
                while queue and max(queue[0][0], stream_free[direction]) <= now:
                    ready, rseq, _, j = heappop(queue)
                    t0 = max(ready, stream_free[direction])
                    duration = copy_time_s(t_info[inputs[j][0]].num_bytes or 0)
                    stream_free[direction] = t0 + duration
                    transfer_time += duration
                    start[j] = t0
                    end[j] = t0 + duration
                    event_seq[j] = rseq + 0.5
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
                    t = ready_at[j]
                    start[j] = end[j] = t
                    event_seq[j] = float(position[j])
                    heappush(heap, (t, event_seq[j], 0, j, ""))
        for i in order:
            if end[i] is None:
                blocked = [names[p] for p in preds[i] if end[p] is None]
                raise GraphError(f"{names[i]!r} never ran: it waits for {blocked[:3]}, which the schedule cannot "
                                 "run before it")
    step_time = max((end[i] for i in order), default=0.0)

    # ----------------------------------------------------------- forwarding
    # An element-wise op reuses an input buffer when nothing else holds a reference to it:
    # it is the buffer's last reader in the order and every other reader has ended by the
    # time it starts (a concurrent reader, e.g. a copy still running, keeps its reference).
    # Function outputs are read by the caller after the last op (never forwarded).
    readers: dict[int, list[int]] = {}  # buffer -> the ops reading it, in order
    for i in order:
        for t in inputs[i]:
            o = buffer_of[t]
            r = readers.get(o)
            if r is None:
                readers[o] = [i]
            else:
                r.append(i)
    last_reader: dict[int, int] = {buf: position[rs[-1]] for buf, rs in readers.items()}
    for t in outputs:
        if in_order[t]:
            last_reader[buffer_of[t]] = len(order)
    if options.model_forwarding:
        for i in order:
            if types[i] not in FORWARDING_OPS or n_out[i] != 1 or is_transfer[i]:
                continue
            own = out_start[i]
            out = t_info[own]
            if not out.num_bytes:
                continue
            pos_i, start_i, dev_i = position[i], start[i], dev[i]
            for t in inputs[i]:
                buf = owner_of(t)
                info = t_info[buf]
                if (not resident[buf] and not variable_reads[buf] and dev[t_op[buf]] == dev_i
                        and last_reader.get(buf) == pos_i and info.num_bytes == out.num_bytes
                        and info.dtype == out.dtype
                        and all(end[r] <= start_i for r in readers[buf] if r != i)):
                    buffer_of[own] = buf
                    # The forwarded output's readers now read ``buf``: it lives as long as they do.
                    last_reader[buf] = max(last_reader[buf], last_reader.get(own, -1))
                    readers[buf].extend(readers.pop(own, ()))
                    break
    # Resolve the chains forwarding made; ``readers`` is keyed by final owners already.
    for t in range(num_tensors):
        o = buffer_of[t]
        if o != t and buffer_of[o] != o:
            owner_of(t)

    # ----------------------------------------------------------- memory events
    events: list[tuple[float, float, int, int, int, str]] = []  # (time, seq, phase, tensor id, delta, device)
    tid_buf: list[int] = []  # the buffer (its owning tensor) of each tensor id of the events
    resident_bytes = _resident_variable_bytes(net, alive)
    host_resident = 0
    output_owners = {buffer_of[t] for t in outputs if in_order[t]}
    workspaces = options.workspace_bytes_per_element
    inf = float("inf")
    for op in order:  # owners in order of (position, output index)
        s = out_start[op]
        for buf in range(s, s + n_out[op]):
            if buffer_of[buf] != buf:
                continue
            info = t_info[buf]
            size = info.num_bytes or 0
            if size == 0 or variable_reads[buf]:
                continue
            if workspaces:
                per_element = workspaces.get(types[op], 0)
                if per_element and buf == s and info.dtype in DTYPE_BYTES:
                    size += int(per_element * size // DTYPE_BYTES[info.dtype])
            d = dev[op]
            if resident[buf]:
                if d == ACCEL:
                    resident_bytes += size
                else:
                    host_resident += size
                continue
            tid = len(tid_buf)
            tid_buf.append(buf)
            users = readers.get(buf)
            if buf in output_owners:
                t_free, seq_free = step_time, inf
            elif users:
                last = users[0]
                t_free, seq_free = end[last], event_seq[last]
                for u in users:
                    e = end[u]
                    if e > t_free or (e == t_free and event_seq[u] > seq_free):
                        t_free, seq_free = e, event_seq[u]
            else:
                t_free, seq_free = end[op], event_seq[op]
            events.append((start[op], event_seq[op] - (0.25 if is_transfer[op] else 0.0), 0, tid, size, d))
            events.append((t_free, seq_free, 1, tid, -size, d))
    # Ties of (time, seq, phase) keep tensor order (the order events were made in).
    events.sort()
    live_accel, live_host = resident_bytes, host_resident
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
    alive_at: dict[int, int] = {}
    for _, _, phase, tid, delta, d in events[:peak_index + 1]:
        if d != ACCEL:
            continue
        if phase == 0:
            alive_at[tid] = delta
        else:
            alive_at.pop(tid, None)
    live_at_peak = tuple(sorted(((f"{names[t_op[tid_buf[k]]]}:{t_idx[tid_buf[k]]}", v) for k, v in alive_at.items()),
                                key=lambda kv: (-kv[1], kv[0])))
    margin = int(peak * options.margin_fraction) + options.margin_bytes
    details = SimDetails(
        names=tuple(names), t_op=array("i", t_op), t_idx=array("i", t_idx), order=array("i", order),
        start=array("d", map(start.__getitem__, order)), end=array("d", map(end.__getitem__, order)),
        streams=bytes([(2 if dev[i] == ACCEL else 3) if is_transfer[i] else (1 if dev[i] == HOST else 0)
                       for i in order]),
        times=times, accel=accel, host=host, buffer_of=array("i", buffer_of), in_order=bytes(in_order),
        lt_buf=array("i", map(tid_buf.__getitem__, device_tids)),
        lt_size=array("q", map(size_of.__getitem__, device_tids)),
        lt_first=array("i", map(first.__getitem__, device_tids)),
        lt_last=array("i", [max(first[tid], last_event[tid]) for tid in device_tids]))
    return SimResult(
        profile=profile.name, peak_bytes=peak, resident_bytes=resident_bytes,
        transient_peak_bytes=peak - resident_bytes, peak_with_margin_bytes=peak + margin, peak_time_s=peak_time,
        live_at_peak=live_at_peak, host_peak_bytes=host_peak, step_time_s=step_time, compute_time_s=compute_time,
        transfer_time_s=transfer_time, stall_time_s=stall, timeline=SequenceView(details, "timeline"),
        ops=SequenceView(details, "ops"), unknown_size_tensors=tuple(unknown),
        buffer_owner=MappingView(details, "buffer_owner"), buffer_lifetimes=SequenceView(details, "buffer_lifetimes"),
        details=details)
