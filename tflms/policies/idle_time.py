"""Swap selection by idle time around the memory peak (SINGA / grappler style).

A tensor alive at the peak but not read there *idles*: from its last access
before the peak until its next access after it. Swapping it frees its bytes for
that window; the copies cost ``2 * copy_time``. Its *duration of absence*
``DOA = idle - 2 * copy_time`` says whether the copies can hide behind compute
(``DOA > 0``), the *area of absence* ``AOA = DOA * bytes`` how much memory-time
it relieves, and the *weighted DOA* (WDOA) how much memory load (live
byte-seconds on the device) its absence overlaps. Candidates are ordered by
majority vote of three scores (after Zhang et al., arXiv 1903.06631) and picked
greedily until the simulated peak fits the budget; the simulation is re-run
after each round because the peak moves. The scores are the *saving*, AOA and
WDOA: Zhang et al.'s third score, DOA, does not grow with the tensor, so a 1 KiB
vector idle long outvoted a 100 MiB activation (10 of the 15 picks on ResNet-50 at
batch 208); the saving is the bytes freed at the peak, scaled down by the share of
the two copies the idle window cannot hide (``bytes * min(1, idle / (2 * copy))``).

Candidates are the tensors the forward *and* the backward pass produce (a
backward temporary can idle across the peak as long as an activation) and the
optimizer's plain tensors (a momentum product made at the start idles until the
update), under the never-swap rules of :func:`~tflms.policies.swapplan.skip_reason`
(variable reads and handles never).

Each swap-in is triggered by the latest ancestor of its consumer that ends at
least one copy time before the consumer starts (so the copy finishes in time)
but not before the peak (so the tensor is on the host at the peak).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tflms.analysis.cto import Analysis, Category
from tflms.config import LMSConfig
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import IDENTITY_OPS
from tflms.policies.swapplan import SwapDecision, group_consumers, SwapInGroup, SwapPlan, skip_reason, swap_op_names
from tflms.profiles import HardwareProfile
from tflms.sim.simulator import SimResult

#: Modes from Zhang et al.: only swaps whose copies hide behind compute, or meet the budget at any cost.
NO_OVERHEAD, STICK_TO_LIMIT = "no-overhead", "stick-to-limit"


@dataclasses.dataclass(frozen=True)
class SwapInChoice:
    """One swap-in of a candidate: its consumers and trigger, decided on one simulation."""

    consumers: tuple[str, ...]
    trigger: str | None
    on_time: bool  # the trigger ends a copy time before the first consumer starts
    first: str = ""  # the group's consumer that starts first
    need_s: float = 0.0  # when it starts (the copy must have arrived)


@dataclasses.dataclass(frozen=True)
class IdleCandidate:
    """A tensor alive across the peak, with its idle window, scores and swap-in choices."""

    tensor: TensorRef
    num_bytes: int
    last_before_s: float
    next_after_s: float
    copy_s: float
    near: tuple[str, ...]
    far: tuple[str, ...]
    swap_ins: tuple[SwapInChoice, ...] = ()
    produced_s: float = 0.0
    peak_s: float = 0.0
    load_byte_s: float = 0.0  # integral of accelerator live bytes over the absence window
    #: op name -> (start, end) in the simulation the candidate was found in (for re-placing triggers)
    spans: Mapping[str, tuple[float, float]] | None = dataclasses.field(default=None, compare=False, hash=False,
                                                                       repr=False)

    @property
    def saving(self) -> float:
        """Bytes freed at the peak, times the share of both copies the idle window hides (at most 1)."""
        return self.num_bytes * min(1.0, self.idle_s / (2 * self.copy_s)) if self.copy_s > 0 else self.num_bytes

    @property
    def wdoa(self) -> float:
        """Weighted DOA: the memory load (byte-seconds) the tensor's absence overlaps.

        A tensor absent while the device is fullest relieves the most pressure;
        negative when the copies do not fit in the idle window (like DOA).
        """
        return self.load_byte_s if self.doa_s > 0 else self.doa_s * self.num_bytes

    @property
    def idle_s(self) -> float:
        return self.next_after_s - self.last_before_s

    @property
    def doa_s(self) -> float:
        """Duration of absence: idle time left once both copies are paid."""
        return self.idle_s - 2 * self.copy_s

    @property
    def aoa(self) -> float:
        """Area of absence: DOA x bytes."""
        return self.doa_s * self.num_bytes

    @property
    def hides(self) -> bool:
        """Both copies fit in the idle window, off the peak, without delaying anything."""
        return self.doa_s > 0 and self.produced_s + self.copy_s <= self.peak_s and all(
            g.on_time for g in self.swap_ins)


def idle_candidates(analysis: Analysis, sim: SimResult, profile: HardwareProfile, config: LMSConfig,
                    exclude: Iterable[TensorRef] = (), accelerator_device: str | None = None) -> list[IdleCandidate]:
    """Forward- and backward-produced tensors alive at ``sim``'s peak with a read after it, by majority vote.

    ``sim`` may be of a rewritten version of ``analysis.graph``: original ops keep
    their names, so their simulated times apply. The same as
    ``majority_order([c for c in scored_candidates(...) if c.tensor not in exclude])``
    (a caller asking again about one simulation keeps the scored list and votes again).
    ``accelerator_device``: where unplaced ops run, as for :func:`~tflms.policies.swapplan.skip_reason`.
    """
    excluded = set(exclude)
    return majority_order([c for c in scored_candidates(analysis, sim, profile, config, accelerator_device)
                           if c.tensor not in excluded])


def scored_candidates(analysis: Analysis, sim: SimResult, profile: HardwareProfile,
                      config: LMSConfig, accelerator_device: str | None = None) -> list[IdleCandidate]:
    """The candidates of :func:`idle_candidates`, unordered (by tensor) and before any exclusion.

    Each candidate's fields depend only on its own tensor and ``sim``, so excluding
    some afterwards gives what excluding them first would. ``accelerator_device``: where
    unplaced ops run (default ``config.accelerator_device``, else the first GPU, else the CPU),
    which decides the never-swap rules that follow the kernels (``onednn-workspace``): the
    tuner passes the device it plans for, a GPU when it plans for a profile's GPU on a machine
    without one, so that the candidates do not depend on this machine's oneDNN setting.
    """
    graph = analysis.graph
    spans = {r.name: (r.start_s, r.end_s) for r in sim.ops}
    peak = sim.peak_time_s
    owners = {name for name, _ in sim.live_at_peak}
    alive = {TensorRef.parse(name) for name in owners}
    alive |= {TensorRef.parse(t) for t, owner in sim.buffer_owner.items() if owner in owners}
    found = []
    h2d_free = _h2d_queue(sim)
    for ref in sorted(alive):
        if ref.op not in analysis.categories:
            continue
        if analysis.categories[ref.op] not in CANDIDATE_CATEGORIES:
            continue
        if skip_reason(analysis, ref, config, accelerator_device) is not None:
            continue
        if ref.op not in spans:  # an op the runtime prunes (nothing needs it)
            continue
        consumers = sorted({c for c, _ in graph.consumers(ref) if c in spans}, key=lambda c: (spans[c][0], c))
        near = tuple(c for c in consumers if spans[c][0] <= peak)
        far = tuple(c for c in consumers if spans[c][0] > peak)
        if not far:
            continue
        last_before = max([spans[ref.op][1]] + [spans[c][1] for c in near])
        if last_before > peak:  # read at the peak itself: it must stay
            continue
        size = graph.tensor(ref).num_bytes or 0
        copy_s = profile.copy_time_s(size)
        groupby = config.with_rule_defaults().swapin_groupby
        swap_ins = tuple(_swap_in_choices(analysis, ref.op, far, spans, copy_s, peak, groupby, h2d_free))
        found.append(IdleCandidate(ref, size, last_before, spans[far[0]][0], copy_s, near, far, swap_ins,
                                   produced_s=spans[ref.op][1], peak_s=peak, spans=spans))
    loads = _load_integrals(sim.timeline, [(c.last_before_s + c.copy_s, c.next_after_s - c.copy_s) for c in found])
    return [dataclasses.replace(c, load_byte_s=load) for c, load in zip(found, loads)]


#: How often a swap-in's trigger is moved earlier when the host-to-device queue would make its copy late.
TRIGGER_RETRIES = 2
#: Times :func:`_pack_swap_ins` leaves out the candidates it cannot hide and packs the rest again.
PACK_ROUNDS = 3
#: The scores of Zhang et al. that vote on the order of candidates.
SCORES = (("saving", lambda c: c.saving), ("aoa", lambda c: c.aoa), ("wdoa", lambda c: c.wdoa))
#: Categories whose tensors may be swapped by idle time: the optimizer's plain tensors too (a momentum slot
#: times its factor is made when the slot's read is ready, at the start, and read by the update at the end);
#: variables and their reads are never swapped (:func:`~tflms.policies.swapplan.skip_reason`).
CANDIDATE_CATEGORIES = frozenset({Category.FORWARD, Category.BACKWARD, Category.UPDATE})


def majority_order(candidates: Sequence[IdleCandidate]) -> list[IdleCandidate]:
    """Order candidates by majority vote of the saving, AOA and WDOA (:data:`SCORES`).

    Candidate A beats B when at least two of the three scores prefer A; the
    order is by number of such wins (Copeland's method), ties by AOA then name.
    """
    wins = _copeland_wins([[fn(c) for _, fn in SCORES] for c in candidates])
    ranked = sorted(range(len(candidates)), key=lambda k: (-wins[k], -candidates[k].aoa, candidates[k].tensor))
    return [candidates[k] for k in ranked]


#: Rows of the pairwise vote compared at once (bounds the temporary arrays to about this x n bytes per score).
VOTE_BLOCK_ROWS = 1024


def _copeland_wins(scores: Sequence[Sequence[float]]) -> list[int]:
    """For each row of ``scores``, how many other rows it beats: more of its scores are larger than smaller.

    The pairwise comparison is done with numpy, :data:`VOTE_BLOCK_ROWS` rows at a time, one score column
    at a time (a row's margin over another, -len(SCORES)..len(SCORES), fits an int8).
    """
    n = len(scores)
    if n < 2:
        return [0] * n
    table = np.asarray(scores, dtype=np.float64)
    columns = [np.ascontiguousarray(table[:, k]) for k in range(table.shape[1])]
    wins = np.zeros(n, dtype=np.int64)
    for lo in range(0, n, VOTE_BLOCK_ROWS):
        margin = np.zeros((min(VOTE_BLOCK_ROWS, n - lo), n), dtype=np.int8)
        for column in columns:
            mine = column[lo:lo + VOTE_BLOCK_ROWS, None]
            margin += (mine > column).view(np.int8)
            margin -= (mine < column).view(np.int8)
        wins[lo:lo + VOTE_BLOCK_ROWS] = np.count_nonzero(margin > 0, axis=1)
    return wins.tolist()


def _load_integrals(timeline: Sequence[tuple[float, int, int]], windows: Sequence[tuple[float, float]]) -> list[float]:
    """Integral of accelerator live bytes over each ``(start, end)`` window (0 for empty windows).

    Live bytes are a step function of time (``timeline``); its running integral is tabulated once,
    so each window costs two binary searches.
    """
    timeline = tuple(timeline)  # (a simulation's view, indexed below: built once)
    times = [t for t, _, _ in timeline]
    if not times:
        return [0.0 for _ in windows]
    area = [0.0]  # integral from times[0] to times[k]
    for k in range(1, len(timeline)):
        area.append(area[-1] + (times[k] - times[k - 1]) * timeline[k - 1][1])

    def integral_to(x: float) -> float:
        k = bisect.bisect_right(times, x) - 1
        if k < 0:
            return 0.0
        return area[k] + (x - times[k]) * timeline[k][1]

    return [integral_to(end) - integral_to(max(start, times[0])) if end > start else 0.0 for start, end in windows]


def _swap_in_choices(analysis: Analysis, producer: str, far: Sequence[str], spans, copy_s: float, peak_s: float,
                     groupby: int, h2d_free=lambda t: t) -> list[SwapInChoice]:
    """One swap-in per consumer group, with the host-to-device queue in mind.

    Swap-ins share one host-to-device stream: a group's copy cannot start before
    the copies already on the stream (``h2d_free``, from the simulation the
    candidate was found in) and the previous group's copy have ended; a trigger
    that would make the copy late behind them is moved earlier
    (:data:`TRIGGER_RETRIES` times at most). A group whose first
    consumer starts before a second copy could arrive behind the previous one
    shares the previous group's swap-in instead (the tensor stays on the device
    between them; a second copy would only make that consumer wait).
    """
    # (ties of start times broken by level, then name: an op fused away on an XLA clock takes no time, so a consumer
    # may start when its ancestor does; the first consumer must be no descendant of another, or its trigger could
    # read the swap-in it triggers)
    levels = analysis.levels
    groups = sorted(group_consumers(far, levels, groupby),
                    key=lambda members: min((spans[n][0], levels[n], n) for n in members))
    choices: list[SwapInChoice] = []
    arrival = None  # when the previous group's copy arrives
    for members in groups:
        first = min(members, key=lambda n: (spans[n][0], levels[n], n))
        start = spans[first][0]
        if choices and arrival is not None and arrival + copy_s > start:
            prev = choices[-1]
            choices[-1] = dataclasses.replace(prev, consumers=prev.consumers + tuple(members))
            continue
        deadline = start - copy_s
        for _ in range(TRIGGER_RETRIES + 1):
            trigger, on_time = _trigger(analysis, first, producer, deadline, peak_s, spans)
            released = spans[trigger][1] if trigger is not None else peak_s
            copy_start = max(released, h2d_free(released), arrival if arrival is not None else 0.0)
            late = copy_start + copy_s - start
            if not on_time or late <= 0:
                break
            deadline -= late  # queued behind other copies: an earlier trigger
        on_time = on_time and copy_start + copy_s <= start
        arrival = copy_start + copy_s
        choices.append(SwapInChoice(tuple(members), trigger, on_time, first, start))
    return choices


def _pack_swap_ins(analysis: Analysis, selected: Sequence[IdleCandidate]) -> list[IdleCandidate]:
    """Place the triggers of all ``selected`` swap-ins together, so that their copies queue without delaying.

    Each candidate's triggers were chosen alone, as late as its copy allows; many
    swap-ins needed at the end of the step then queue on the one host-to-device
    stream and arrive late. Here the copies are packed backwards from the last
    one needed: each gets the latest slot that ends by its consumer's start and by
    the next copy's slot, and the latest trigger that ends by the slot's start
    (``_trigger``, on the timeline the candidate was found in). A candidate with a
    copy that finds no such trigger after the peak cannot be hidden beside the
    others and is left out (no-overhead mode); the rest are packed again.
    """
    if not selected or any(c.spans is None for c in selected):
        return list(selected)
    kept = list(selected)
    for _ in range(PACK_ROUNDS):
        packed, failed = _pack_once(analysis, kept)
        if not failed:
            return packed
        kept = [c for ci, c in enumerate(kept) if ci not in failed]
    return _pack_once(analysis, kept)[0] if kept else []


def _pack_once(analysis: Analysis, selected: Sequence[IdleCandidate]) -> tuple[list[IdleCandidate], set[int]]:
    slots = sorted(((choice.need_s, ci, gi) for ci, c in enumerate(selected) for gi, choice in enumerate(c.swap_ins)
                    if choice.first), reverse=True)
    new = {ci: list(c.swap_ins) for ci, c in enumerate(selected)}
    failed: set[int] = set()
    next_start = float("inf")
    for need_s, ci, gi in slots:
        cand, choice = selected[ci], selected[ci].swap_ins[gi]
        slot_end = min(need_s, next_start)
        trigger, on_time = _trigger(analysis, choice.first, cand.tensor.op, slot_end - cand.copy_s, cand.peak_s,
                                    cand.spans)
        if trigger is None or not on_time:
            failed.add(ci)
            continue
        new[ci][gi] = dataclasses.replace(choice, trigger=trigger, on_time=True)
        next_start = slot_end - cand.copy_s  # the latest this copy may start; earlier ones must end by then
    return [dataclasses.replace(c, swap_ins=tuple(new[ci])) for ci, c in enumerate(selected)], failed


def _h2d_queue(sim: SimResult):
    """``free(t)``: when the host-to-device stream of ``sim`` can start a copy released at ``t``.

    The stream serves copies in the order they are released, so a copy released at
    ``t`` waits for every copy that started before ``t`` to end.
    """
    copies = sorted((r.start_s, r.end_s) for r in sim.ops if r.stream == "h2d")
    starts = [a for a, _ in copies]
    ends = list(itertools.accumulate((b for _, b in copies), max))

    def free(t: float) -> float:
        k = bisect.bisect_left(starts, t)
        return max(t, ends[k - 1]) if k else t

    return free


def _trigger(analysis: Analysis, consumer: str, producer: str, deadline_s: float, peak_s: float,
             spans: Mapping[str, tuple[float, float]]) -> tuple[str | None, bool]:
    """The trigger of a swap-in for ``consumer``, and whether it is on time.

    Wanted: an ancestor of ``consumer`` (after ``producer``) that ends by
    ``deadline_s`` and not before ``peak_s`` (a swap-in started before the peak
    would be alive at it), as late as possible. The search walks back along the
    consumer's critical chain (each step to the predecessor that ended last, the
    one that decided when its successor could start), which costs the chain's
    length rather than the whole ancestry. If the chain drops below ``peak_s``
    before reaching ``deadline_s``, the last op after the peak is used: the
    consumer then waits for the copy.
    """
    graph, levels = analysis.graph, analysis.levels
    floor = levels[producer]
    node = consumer
    after_peak: str | None = None
    while True:
        preds = [p for p in graph.predecessors(node) if p in spans and levels[p] > floor]
        if not preds:
            break
        node = max(preds, key=lambda p: (spans[p][1], p))
        end = spans[node][1]
        if end < peak_s:
            break
        if graph.op(node).type in IDENTITY_OPS or node in analysis.conditional:  # a dead trigger kills the swap-in
            continue
        if end <= deadline_s:
            return node, True
        after_peak = node
    return after_peak, False


def plan_idle(analysis: Analysis, selected: Iterable[IdleCandidate], config: LMSConfig,
              accelerator_device: str, mode: str = STICK_TO_LIMIT) -> SwapPlan:
    """A plan swapping ``selected`` tensors with their chosen triggers.

    In ``stick-to-limit`` mode a tensor whose swap-out cannot finish before the
    peak makes its near consumers wait for the copy (synchronous swap-out), so
    that its buffer is really free at the peak.
    """
    levels = analysis.levels
    selected = sorted(selected, key=lambda c: c.tensor)
    if mode == NO_OVERHEAD:
        selected = _pack_swap_ins(analysis, selected)
    # Swap-outs share one copy stream: a swap-out is late if the queue ahead of it
    # keeps it from finishing before the peak it was chosen for.
    late, stream_free = set(), 0.0
    for cand in sorted(selected, key=lambda c: (c.produced_s, c.tensor)):
        stream_free = max(stream_free, cand.produced_s) + cand.copy_s
        if stream_free > cand.peak_s:
            late.add(cand.tensor)
    swaps = []
    for cand in selected:
        out_name, in_base = swap_op_names(cand.tensor)
        swap_ins = tuple(SwapInGroup(
            name=f"{in_base}_{gi}", consumers=choice.consumers,
            consumer_levels=tuple(levels[m] for m in choice.consumers), trigger=choice.trigger,
            trigger_level=None if choice.trigger is None else levels[choice.trigger], sync=not choice.on_time,
            note="" if choice.on_time else "no trigger ends a copy time before the consumer and after the peak: "
                                           "the consumer may wait")
            for gi, choice in enumerate(cand.swap_ins))
        sync_out = tuple(sorted(cand.near)) if mode == STICK_TO_LIMIT and cand.tensor in late else ()
        swaps.append(SwapDecision(tensor=cand.tensor, dtype=analysis.graph.tensor(cand.tensor).dtype,
                                  num_bytes=cand.num_bytes, producer_level=levels[cand.tensor.op], swap_out=out_name,
                                  sync_out_consumers=sync_out, swap_ins=swap_ins))
    return SwapPlan(config=config, accelerator_device=accelerator_device, swaps=tuple(swaps),
                    skipped=(), warnings=())
