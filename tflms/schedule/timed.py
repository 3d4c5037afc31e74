"""The sequential memory model of :mod:`tflms.schedule.memory` with the simulator's timing."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from tflms.ir.graph import Graph
from tflms.schedule.memory import BufferModel, Replay, eager_asap


class TimedReplay(Replay):
    """:class:`Replay` with the simulator's timing: one compute stream, one copy stream per direction.

    ``durations[i]``: op ``i``'s time on its stream (compute ops: the cost model; copies:
    the link). A buffer is freed when its last reader *ended* (a swap-out still copying
    holds it); TensorFlow's ``_Recv`` of a host tensor copies on the host-to-device
    stream once the host op ran, and its readers wait for it. Memory changes are events
    in time order, as in the simulator; ``peak`` is over all of them.
    """

    def __init__(self, model: BufferModel, durations: Sequence[float], recv_durations: Sequence[float],
                 transfer_direction: Sequence[str]) -> None:
        super().__init__(model)
        self.dur = durations
        self.recv_dur = recv_durations  # by buffer: copy time of a _Recv buffer, else 0
        self.direction = transfer_direction  # by op: "d2h", "h2d" or ""
        self.clock = 0.0
        self.stream_free = {"d2h": 0.0, "h2d": 0.0}
        self.end = [0.0] * len(model)
        self.last_end = [0.0] * len(model.size)
        self.buf_ready = [0.0] * len(model.size)
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, phase, delta)
        self.seq = 0
        self.recv_of_host = [[b for b in a if model.recv[b]] for a in model.allocs]

    def _event(self, time: float, phase: int, delta: int) -> None:
        heapq.heappush(self.events, (time, self.seq, phase, delta))

    def advance(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            _, _, phase, delta = heapq.heappop(self.events)
            self.live += delta
            if phase == 0 and self.live > self.peak:
                self.peak = self.live

    def flush(self) -> None:
        self.advance(float("inf"))

    def ready_at(self, i: int) -> float:
        m = self.m
        t = max((self.end[p] for p in m.preds[i]), default=0.0)
        for b in m.reads[i]:
            t = max(t, self.buf_ready[b])
        return t

    def start_of(self, i: int) -> float:
        ready = self.ready_at(i)
        if not self.m.eager[i]:
            return max(self.clock, ready)
        d = self.direction[i]
        return max(ready, self.stream_free[d]) if d else ready

    def forward_source(self, i: int) -> int:
        out = self.m.forward_out[i]
        if out < 0:
            return -1
        m, start = self.m, self.start_of(i)
        for b in m.reads[i]:
            o = self.owner(b)
            if (self.remaining[o] == 1 and not self.pinned[o] and m.size[o] == m.size[out]
                    and m.dtype[o] == m.dtype[out] and self.last_end[o] <= start):
                return o
        return -1

    def net_bytes(self, i: int, end: float | None = None) -> tuple[int, int]:
        """``(allocated, freed by its end)`` if op ``i`` ran next; a buffer a copy still reads is not freed."""
        self.advance(self.clock)
        return super().net_bytes(i, self.start_of(i) + self.dur[i] if end is None else end)

    def run(self, i: int) -> list[int]:
        m = self.m
        self.done[i] = True
        self.seq += 1
        start = self.start_of(i)
        end = start + (self.dur[i] if m.needed[i] else 0.0)
        self.end[i] = end
        if not m.needed[i]:
            return []
        if not m.eager[i]:
            self.advance(start)
            self.clock = end
        elif self.direction[i]:
            self.stream_free[self.direction[i]] = end
        new = self._forward(i, [b for b in m.allocs[i] if not m.recv[b]])
        for b in new:
            self._event(start, 0, m.size[b])
        for b in self.recv_of_host[i]:  # TensorFlow's _Recv: copies once this host op ran
            t0 = max(end, self.stream_free["h2d"])
            self.stream_free["h2d"] = self.buf_ready[b] = t0 + self.recv_dur[b]
            self._event(t0, 0, m.size[b])
            if self.remaining[b] == 0 and not self.pinned[b]:
                self._event(self.buf_ready[b], 1, -m.size[b])
        last_one: list[int] = []
        for b in m.reads[i]:
            o = self.owner(b)
            self.remaining[o] -= 1
            self.last_end[o] = max(self.last_end[o], end)
            if self.remaining[o] == 0 and not self.pinned[o]:
                self._event(self.last_end[o], 1, -m.size[o])
            elif self.remaining[o] == 1:
                last_one.append(o)
        for b in new:
            if self.remaining[b] == 0 and not self.pinned[b]:
                self._event(end, 1, -m.size[b])
        return last_one


def timed_replay(model: BufferModel, graph: Graph, profile) -> TimedReplay:
    """A :class:`TimedReplay` of ``model`` (built from ``graph``) on ``profile``."""
    from tflms.sim.cost import op_time_s
    from tflms.profiles import get_profile
    profile = get_profile(profile)
    known = model.timings.get(profile)
    if known is not None and known[0] is graph:
        return TimedReplay(model, *known[1:])
    ops = graph.ops
    durations, direction = [], []
    for i, op in enumerate(ops):
        if not model.needed[i]:
            durations.append(0.0)
            direction.append("")
        elif model.transfer[i]:
            src = graph.tensor(op.inputs[0])
            durations.append(profile.copy_time_s(src.num_bytes or 0))
            direction.append("h2d" if model.on_accelerator[i] else "d2h")
        elif not model.on_accelerator[i]:
            durations.append(0.0)
            direction.append("")
        else:
            durations.append(op_time_s(graph, op, profile))
            direction.append("")
    recv = [profile.copy_time_s(model.size[b]) if model.recv[b] else 0.0 for b in range(len(model.size))]
    model.timings[profile] = (graph, durations, recv, direction)  # read only: every replay shares them
    return TimedReplay(model, durations, recv, direction)


def replay_peak_timed(model: BufferModel, graph: Graph, profile, order: Sequence[str]) -> int:
    """Peak device bytes (resident included) of ``order`` with the simulator's timing (see :class:`TimedReplay`).

    Eager ops (host ops, copies) run as soon as their inputs ran, wherever ``order`` lists them
    (:func:`~tflms.schedule.memory.eager_asap`), as in the simulator and TensorFlow.
    """
    replay = timed_replay(model, graph, profile)
    for i in eager_asap(model, [model.index[name] for name in order]):
        replay.run(i)
    replay.flush()
    return model.resident_bytes + replay.peak
