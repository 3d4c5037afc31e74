"""Lower bounds: the least memory any swap rewrite needs, the least time a step can take at a budget.

Both are derived in docs/design.md ("Bounds"), under the simulator's memory model
(:mod:`tflms.sim.simulator`): resident bytes (variables, optimizer slots, the step's
arguments and constants) stay on the accelerator for the whole step; every other
device buffer lives from its op's start to its last reader's end.

- :func:`swap_only_bound`: an op runs with all its inputs and outputs on the
  accelerator, so no swap rewrite of the step (in any order) fits in less than the
  resident bytes plus the largest single op's *working set*: its distinct input
  buffers and its output buffers, an element-wise op's output counted once with an
  input of its size it may write into.
- :func:`step_time_bound`: at a budget, ``max(compute time, D / link bandwidth)``
  where ``D = transient peak - (budget - resident)`` is the fewest bytes that must be
  swapped out, and as many back in, for the step (in a given order) to fit.
- :func:`any_order_time_bound`: the least step time of any swap rewrite in *any* execution order at a
  budget: while an op runs, the bytes of its cut (:mod:`tflms.sim.footprint`) over the budget are away,
  copied out while only work that may precede the op runs and back while only work that may follow it
  runs.
- :func:`time_bound_ratio`: predicted step time over the bound (1.0 = at the bound).
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from tflms.errors import ConfigError
from tflms.ir.graph import Graph
from tflms.ir.op_types import SOURCE_OPS
from tflms.profiles import HardwareProfile, get_profile


@dataclasses.dataclass(frozen=True)
class MemoryBound:
    """The swap-only memory bound of one graph (see :func:`swap_only_bound`)."""

    resident_bytes: int
    working_set_bytes: int  # the largest single op's working set on the accelerator
    op: str  # the op with that working set

    @property
    def bound_bytes(self) -> int:
        return self.resident_bytes + self.working_set_bytes


def swap_only_bound(graph: Graph, options=None) -> MemoryBound:
    """Resident bytes plus the largest working set of one accelerator op (see the module doc).

    ``options`` are the simulator's :class:`~tflms.sim.simulator.SimOptions` (host
    device, forwarding, which inputs are resident). Ops that do not run (unused) and
    host ops are not counted; a host tensor an accelerator op reads is on the
    accelerator when it runs (TensorFlow's ``_Recv``), so it counts.
    """
    from tflms.schedule.memory import buffer_model
    m = buffer_model(graph, options)
    best, best_op = 0, ""
    for i in range(len(m)):
        if not m.needed[i] or not m.on_accelerator[i] or (m.eager[i] and not m.allocs[i]):
            continue
        inputs = sum(m.size[b] for b in m.reads[i])
        outputs = sum(m.size[b] for b in m.allocs[i])
        out = m.forward_out[i]
        if out >= 0 and any(m.size[b] == m.size[out] and m.dtype[b] == m.dtype[out] for b in m.reads[i]):
            outputs -= m.size[out]  # it may write into that input
        ws = inputs + outputs
        if ws > best or (ws == best and best_op and m.names[i] < best_op):
            best, best_op = ws, m.names[i]
    return MemoryBound(resident_bytes=m.resident_bytes, working_set_bytes=best, op=best_op)


@dataclasses.dataclass(frozen=True)
class TimeBound:
    """The step-time lower bound at one budget (see :func:`step_time_bound`)."""

    budget_bytes: int
    compute_s: float  # time of the accelerator's compute ops back to back
    min_swap_bytes: int  # fewest bytes each link direction must carry for the step to fit
    link_s: float  # min_swap_bytes at the profile's effective link bandwidth
    feasible: bool  # False when even the swap-only bound exceeds the budget
    #: the bound across the peak (copies out before an instant, back after it); 0.0 when not computed
    across_s: float = 0.0

    @property
    def bound_s(self) -> float:
        """``max(compute, D / bandwidth)``: the bound the issue defines and ``time_bound_ratio`` reports."""
        return max(self.compute_s, self.link_s) if self.feasible else math.inf

    @property
    def across_bound_s(self) -> float:
        """The tighter bound: :attr:`bound_s` or the bound across the peak, whichever is larger."""
        return max(self.bound_s, self.across_s) if self.feasible else math.inf

    @property
    def link_bound(self) -> bool:
        """Whether the link, not compute, sets the bound."""
        return self.link_s > self.compute_s


def min_swap_bytes(transient_peak_bytes: int, resident_bytes: int, budget_bytes: int) -> int:
    """Fewest bytes that must leave the accelerator (and come back) for the step to fit ``budget_bytes``."""
    return max(0, transient_peak_bytes - max(0, budget_bytes - resident_bytes))


def time_bound(*, compute_s: float, transient_peak_bytes: int, resident_bytes: int, budget_bytes: int,
               profile: str | HardwareProfile, swap_only_bytes: int | None = None,
               across_s: float = 0.0) -> TimeBound:
    """The step-time bound from the figures of an unswapped simulation (see :func:`step_time_bound`)."""
    profile = get_profile(profile)
    if budget_bytes <= 0:
        raise ConfigError(f"budget_bytes must be positive, got {budget_bytes}")
    need = min_swap_bytes(transient_peak_bytes, resident_bytes, budget_bytes)
    feasible = resident_bytes <= budget_bytes and (swap_only_bytes is None or swap_only_bytes <= budget_bytes)
    return TimeBound(budget_bytes=budget_bytes, compute_s=compute_s, min_swap_bytes=need,
                     link_s=need / profile.effective_link_bytes_per_s, feasible=feasible, across_s=across_s)


def across_peak_s(sim, budget_bytes: int, profile: str | HardwareProfile) -> float:
    """Least step time of a swap rewrite in ``sim``'s order that fits ``budget_bytes``, counted across each instant.

    At an instant ``t`` of the unswapped simulation ``sim`` with ``live(t)`` bytes on the device, at least
    ``D = live(t) - budget`` of them are away in any rewrite that fits and keeps the order: each was copied
    out before ``t`` (a device buffer is freed when its copy ends) and comes back after ``t`` (a swap-in
    allocates when its copy starts). So the compute stream's work before ``t`` and ``D / bandwidth`` both
    precede ``t``, the work after ``t`` and ``D / bandwidth`` both follow it, and the step lasts at least
    ``compute + max(0, D / L - before) + max(0, D / L - after)`` (docs/design.md, "Bounds"); the largest
    over the instants. ``max(compute, D / L)`` lets the two copies overlap; they cannot.
    """
    rate = get_profile(profile).effective_link_bytes_per_s
    spans = sorted((r.start_s, r.end_s) for r in sim.ops if r.stream == "compute")
    if not spans:
        return 0.0
    starts = np.array([s for s, _ in spans])
    ends = np.array([e for _, e in spans])
    work = ends - starts
    if getattr(sim, "clock", "serial") == "graph":
        # a kernel waiting for its launch: the host issues the same kernels in the same order in any rewrite, so
        # the wait belongs to the compute stream's time before and after each instant (tflms.sim.clock)
        work = work + np.maximum(0.0, starts - np.concatenate([[0.0], ends[:-1]]))
    done = np.concatenate([[0.0], np.cumsum(work)])  # compute time of the first k ops
    total = float(done[-1])
    best = 0.0
    for t, live, _host in sim.timeline:
        away = live - budget_bytes
        if away <= 0:
            continue
        link = away / rate
        before = float(done[np.searchsorted(ends, t, side="right")])  # ops ended by t
        after = total - float(done[np.searchsorted(starts, t, side="left")])  # ops starting at or after t
        best = max(best, total + max(0.0, link - before) + max(0.0, link - after))
    return best


def step_time_bound(graph: Graph, profile: str | HardwareProfile, budget_bytes: int, *, order=None,
                    options=None) -> TimeBound:
    """Least step time of any swap rewrite of ``graph`` that runs in ``order`` and fits ``budget_bytes``.

    ``graph`` is the step *without* swaps; ``order`` the execution order the
    rewrite keeps (default: the simulator's, CTO levels; give the enforced order
    of :func:`tflms.schedule.schedule_order` when the rewrite adds its edges).
    ``max(compute, D / bandwidth)`` with ``D`` from :func:`min_swap_bytes` of the
    unswapped transient peak in that order; infinite when the swap-only bound
    exceeds the budget. ``across_s`` is :func:`across_peak_s` of the same simulation.
    """
    from tflms.sim.simulator import simulate
    profile = get_profile(profile)
    sim = simulate(graph, profile, order=order, options=options)
    bound = swap_only_bound(graph, options)
    return time_bound(compute_s=compute_floor_s(sim, profile), transient_peak_bytes=sim.transient_peak_bytes,
                      resident_bytes=sim.resident_bytes, budget_bytes=budget_bytes, profile=profile,
                      swap_only_bytes=bound.bound_bytes, across_s=across_peak_s(sim, budget_bytes, profile))


def launches_s(sim, profile: HardwareProfile) -> float:
    """``sim``'s launches back to back where the host launches kernels ahead of the GPU (the ``graph`` clock): no order
    runs the step faster. 0 on the other clocks (``serial`` counts each launch in its kernel)."""
    return sim.kernels * profile.launch_overhead_s if getattr(sim, "clock", "serial") == "graph" else 0.0


def compute_floor_s(sim, profile: HardwareProfile) -> float:
    """The least compute time of ``sim``'s ops in any order a rewrite may run them in: the compute stream's time where
    the clock adds every launch to its kernel (``serial``); where the host launches ahead of the GPU (``graph``), the
    kernels back to back or their launches back to back (:func:`launches_s`), whichever is longer (this order's waits
    for launches are not every order's)."""
    if getattr(sim, "clock", "serial") != "graph":
        return sim.compute_time_s
    return max(sim.kernel_time_s, launches_s(sim, profile))


@dataclasses.dataclass(frozen=True)
class AnyOrderTimeBound:
    """The least step time of any swap-only rewrite in any order at one budget (:func:`any_order_time_bound`)."""

    budget_bytes: int  # device bytes the step may hold at once (resident included)
    compute_s: float  # the compute stream's work, back to back
    floor_s: float  # the bound: compute_s plus the copy time no order can hide
    op: str  # the op whose cut sets it ("" when nothing has to leave)
    away_bytes: int  # bytes of that op's cut away while it runs
    before_s: float  # compute of its ancestors: can only run before it
    after_s: float  # compute of its descendants: can only run after it
    free_s: float  # compute of the ops ordered neither way: before or after, as the order likes
    ops_examined: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def any_order_time_bound(graph: Graph, profile: str | HardwareProfile, budget_bytes: int,
                         options=None, *, sim=None, above: float | None = None) -> AnyOrderTimeBound:
    """Least step time of any swap-only rewrite of ``graph`` that fits ``budget_bytes``, in any order.

    ``graph`` is the step without swaps; ``budget_bytes`` the live device bytes allowed (resident included,
    as for :func:`across_peak_s`). While op ``x`` runs, in any order, every buffer of its cut
    (:class:`tflms.sim.footprint.Cuts`: made by ``x`` or an ancestor, read by ``x`` or a descendant) is
    on the device or away, so at least ``D = resident + cut - budget`` bytes are away when ``x`` starts
    and when it ends. Those away at its start left before it (a device buffer is freed when its copy
    ends); those away at its end come back after it (a swap-in allocates when its copy starts), each
    direction one stream of bandwidth ``L``. The compute stream runs ``x``'s ancestors (``A``) before it,
    its descendants (``C``) after it, and the rest (``N``) on either side, so with ``d = D / L``,
    ``p = max(0, d - A)`` and ``q = max(0, d - C)`` the step lasts at least ``compute + max(0, p + q - N)``
    (the unrelated work hides at most ``N`` of the two copies' excess; docs/design.md, "Bounds"). The
    largest over the ops whose level-order live bytes exceed the budget (below it no cut does); ``op`` is
    ``""`` when every copy can hide behind compute. Op times are the simulator's, which do not depend on
    the order; where the host launches kernels ahead of the GPU (``sim.clock == "graph"``), the floor is also at
    least the step's launches back to back. Unlike :func:`across_peak_s` (one order's instants, with the op that starts at an instant
    counted after it) the order is free, and ``x``'s own time hides neither copy. ``sim``: the simulation of
    ``graph`` on ``profile`` with ``options``, where the caller has it (it gives the op times). ``above``: stop at
    the first op whose floor exceeds it (the ops come largest level-order live bytes first); the bound is then that
    op's, a lower bound above ``above`` but not necessarily the largest.
    """
    from tflms.schedule.memory import buffer_model
    from tflms.sim.footprint import Cuts
    from tflms.sim.simulator import simulate
    profile = get_profile(profile)
    if budget_bytes <= 0:
        raise ConfigError(f"budget_bytes must be positive, got {budget_bytes}")
    if sim is None:
        sim = simulate(graph, profile, options=options)
    took: dict[str, float] = {}
    for r in sim.ops:
        if r.stream == "compute":
            took[r.name] = took.get(r.name, 0.0) + (r.end_s - r.start_s)
    cuts = Cuts(buffer_model(graph, options))
    m = cuts.model
    times = np.asarray([took.get(name, 0.0) for name in m.names])
    total = float(times.sum())
    # Where the host launches kernels ahead of the GPU (the graph clock), no order launches the step's kernels in
    # less than their launches back to back, and copies may hide in the GPU's waits for them: a floor of its own.
    launched = launches_s(sim, profile)
    rate = profile.effective_link_bytes_per_s
    room = budget_bytes - m.resident_bytes  # transient bytes that may stay on the device
    best = AnyOrderTimeBound(budget_bytes, max(total, launched), max(total, launched), "", 0, 0.0, 0.0, 0.0, 0)
    examined = 0
    for i in cuts.candidates:
        if cuts.level_live[i] <= room:
            break  # a cut is at most the op's level-order live bytes: nothing more has to leave
        examined += 1
        cut, anc, desc = cuts.cut(i)
        away = cut - room
        if away <= 0:
            continue
        link = away / rate
        before = float(times[anc].sum()) - float(times[i])
        after = float(times[desc].sum())
        free = total - before - after - float(times[i])
        floor = max(launched, total + max(0.0, max(0.0, link - before) + max(0.0, link - after) - free))
        if floor > best.floor_s or (floor == best.floor_s and best.op and m.names[i] < best.op):
            best = AnyOrderTimeBound(budget_bytes, max(total, launched), floor, m.names[i], away, before, after, free,
                                     0)
            if above is not None and floor > above:
                break
    return dataclasses.replace(best, ops_examined=examined)


def time_bound_ratio(predicted_step_s: float, bound_s: float) -> float:
    """Predicted step time over its lower bound (>= 1 when both are right; 1.25 = 25% above the bound)."""
    if not bound_s > 0 or math.isinf(bound_s):
        raise ConfigError(f"the time bound must be positive and finite, got {bound_s!r} (an infeasible budget "
                          "has no ratio)")
    if predicted_step_s < 0:
        raise ConfigError(f"predicted_step_s must be >= 0, got {predicted_step_s!r}")
    return predicted_step_s / bound_s


@dataclasses.dataclass(frozen=True)
class HiddenSwapBound:
    """The lowest peak swapping can reach without slowing a simulated step (see :func:`hidden_swap_bound`)."""

    peak_bytes: int  # the step's simulated peak
    lowest_peak_bytes: int  # no zero-overhead swap rewrite (in this order) peaks lower
    at_time_s: float  # the instant that decides it

    @property
    def max_saving(self) -> float:
        """The largest fraction of the peak a zero-overhead swap rewrite can save."""
        return 1.0 - self.lowest_peak_bytes / self.peak_bytes if self.peak_bytes else 0.0


def hidden_swap_bound(sim, profile: str | HardwareProfile, graph: Graph | None = None) -> HiddenSwapBound:
    """How far swapping hidden behind compute can lower a simulated step's peak (docs/design.md, "Bounds").

    A swap that costs no time leaves the step's compute timeline as it is, so at any
    instant ``t`` of it the device holds what it held at ``t`` (``sim.timeline``) minus
    what has left it: every byte gone at ``t`` was copied out on the device-to-host
    link between 0 and ``t``, and comes back on the host-to-device link between ``t``
    and the step's end ``T``, so at most ``B * min(t, T - t)`` bytes (``B`` the link's
    effective bandwidth per direction), and never resident bytes. The lowest
    zero-overhead peak is therefore at least
    ``max over t of max(resident, live(t) - B * min(t, T - t))``.

    With the simulated ``graph``, the bound also knows each buffer: only a buffer made
    before ``t`` and not read at ``t`` can be away, its bytes leave after its producer
    ends and are back before its next read, so for every ``s <= t`` at most
    ``B * (t - s)`` plus the bytes of such buffers made before ``s`` are away, and for
    every ``u >= t`` at most ``B * (u - t)`` plus those of such buffers next read after
    ``u`` (:func:`_away_at_most`). Still optimistic (a tensor may be partly away).
    """
    profile = get_profile(profile)
    rate = profile.effective_link_bytes_per_s
    end = sim.step_time_s
    timeline = tuple(sim.timeline)  # (a simulation's view, indexed below: built once)
    floors = [(max(sim.resident_bytes, live - int(rate * max(0.0, min(t, end - t)))), i)
              for i, (t, live, _host) in enumerate(timeline)]
    if graph is None:
        lowest, i = max(floors, default=(sim.resident_bytes, 0), key=lambda f: (f[0], -f[1]))
        at = timeline[i][0] if timeline else 0.0
        return HiddenSwapBound(peak_bytes=sim.peak_bytes, lowest_peak_bytes=min(lowest, sim.peak_bytes), at_time_s=at)
    buffers = _swappable_buffers(sim, graph)
    lowest, at = sim.resident_bytes, 0.0
    # The link-only floor is an upper bound of the buffer-aware one: visit instants by it, stop when it is beaten.
    for loose, i in sorted(floors, key=lambda f: (-f[0], f[1])):
        if loose <= lowest:
            break
        t, live, _host = timeline[i]
        floor = max(sim.resident_bytes, live - _away_at_most(buffers, i, t, end, rate))
        if floor > lowest:
            lowest, at = floor, t
    return HiddenSwapBound(peak_bytes=sim.peak_bytes, lowest_peak_bytes=min(lowest, sim.peak_bytes), at_time_s=at)


@dataclasses.dataclass(frozen=True)
class _Buffer:
    size: int
    first: int  # live from timeline entry ``first`` to ``last`` inclusive
    last: int
    ready_s: float  # its producer's end: the earliest a copy out can start
    reads: tuple[tuple[float, float], ...]  # (start, end) of every op reading it, by start


def _swappable_buffers(sim, graph: Graph) -> list[_Buffer]:
    """The simulated step's transient device buffers with when they are made and read."""
    from tflms.ir.graph import TensorRef
    span = {r.name: (r.start_s, r.end_s) for r in sim.ops}
    members: dict[str, list[str]] = {}
    for tensor, owner in sim.buffer_owner.items():
        members.setdefault(owner, []).append(tensor)
    out = []
    for owner, size, first, last in sim.buffer_lifetimes:
        producer = owner.rsplit(":", 1)[0]
        if producer not in span or graph.op(producer).type in SOURCE_OPS:
            continue  # (an XLA cluster's new variable value is named by the variable's handle: no copy moves it)
        reads = sorted({span[c] for t in [owner, *members.get(owner, ())]
                        for c, _ in graph.consumers(TensorRef.parse(t)) if c in span})
        # timeline entry k + 1 follows memory event k: the buffer is live in entries first + 1 .. last + 1
        out.append(_Buffer(size, first + 1, last + 1, span[producer][1], tuple(reads)))
    return out


def _away_at_most(buffers: list[_Buffer], index: int, t: float, end: float, rate: float) -> int:
    """The most bytes a zero-overhead rewrite can have off the device at timeline entry ``index`` (time ``t``)."""
    made, back_by = [], []  # (ready, size), (next read, size) of the buffers that may be away at t
    for b in buffers:
        if not b.first <= index <= b.last or b.ready_s > t:
            continue
        if any(start <= t < stop for start, stop in b.reads):
            continue  # read now
        following = bisect.bisect_right(b.reads, (t, math.inf))
        made.append((b.ready_s, b.size))
        back_by.append((b.reads[following][0] if following < len(b.reads) else end, b.size))
    if not made:
        return 0
    # out: for s in {0, ready times}: B (t - s) + bytes made before s; at s = t, all of them
    made.sort()
    total = sum(size for _, size in made)
    best, before = min(total, rate * t), 0
    for ready, size in made:
        best = min(best, rate * (t - ready) + before)
        before += size
    # back: for u in {next reads, T}: B (u - t) + bytes next read after u
    back_by.sort()
    after = total
    best = min(best, rate * (end - t))
    for due, size in back_by:
        best = min(best, rate * (due - t) + after - size)
        after -= size
    return int(max(0.0, best))
