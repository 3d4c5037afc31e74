"""The recompute plans the tuner judges alone, and how one is judged: prices, segments, relaxation, bisection.

Capuchin's rule, priced by the simulator's cost model: a forward tensor the backward pass reads is worth recomputing
when re-running the chain that rebuilds it costs less than ``price`` times the two copies a swap of it would take
over the host link (:func:`priced`; each price on :data:`PRICES` gives one recompute set). Beside them,
graph-level checkpointing (:func:`_segment_candidates`: evenly spaced or balanced checkpoints, within a segment the
ops dearer than their copies kept, optionally re-run again past :data:`SEGMENT_SPLITS` levels), the fastest
fitting plan relaxed (:func:`_relax`), and for ``recompute="only"`` a bisection on the ranking (:func:`_bisect`).
Every plan is simulated and recorded by :func:`_judge_ops`, unless its compute alone is slower than the fastest fit
so far (:func:`compute_floor_s`). Which of them get swaps is :mod:`tflms.tune.hybrid`'s decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from tflms.policies.checkpoints import articulations, balanced_segment_ops, output_bytes, segment_ops
from tflms.policies.recompute import recompute_plan
from tflms.sim.clock import XLA_CLOCKS
from tflms.sim.records import COMPUTE_ROUND_OFF
from tflms.sim.simulator import SimResult
from tflms.tune.result import Candidate

if TYPE_CHECKING:
    from tflms.tune.search import TuneEvaluator

#: Recompute a tensor when its chain costs at most this times the two copies a swap of it takes.
PRICES = (0.05, 0.25, 1.0, 4.0)
#: Prices within checkpointed segments (``None``: every op of a segment is re-run, as Chen et al.).
SEGMENT_PRICES = (None, 1.0, 0.25)
#: ``split_levels`` of :func:`~tflms.policies.recompute.plan_recomputes` tried on each segment plan where the
#: hybrids found no fast fit (:func:`_split_hybrids`): a segment's first layers re-run again for their own backward
#: pass when their clones would wait more than this many levels. BERT-base at batch 324 on v100-16gb-pcie3, 8
#: segments: the enforced order's peak 24.71 GiB at 12.74 s without, 19.35 GiB at 14.20 s with 10 (docs/design.md,
#: "Swap or recompute", item 6).
SEGMENT_SPLITS = (10,)
#: ``slack`` of :func:`~tflms.policies.checkpoints.balanced_segment_ops` for the segment plans of ``recompute="only"``:
#: 1 keeps the checkpoints that bound every segment's bytes least, 1.5 fewer of them. On v100-16gb-pcie3, in the
#: enforced order, ResNet-50 at batch 1347 peaks at 35.0 / 40.3 GiB with them against 47.6 for the best evenly
#: spaced plan, DenseNet-121 at 1143 at 35.7 / 29.0 against 41.2, BERT-base at 324 at 29.2 / 31.0 against 41.2,
#: each at about the same step time (tools/segment_report.py). Not in the hybrid search: there, at BERT-base 324,
#: they took the swap search from the split plan that wins (13.02 s) and fitted at 26.57 s (docs/design.md, "Swap or
#: recompute", item 7).
BALANCED_SLACKS = (1.0, 1.5)
#: Simulations :func:`_relax` may take per ranking.
RELAX_BISECTIONS = 10
#: Off the XLA clocks :func:`_relax`'s bisection stops once the counts it has not ruled out span at most this
#: fraction of the ranking (``1 / RELAX_RESOLUTION``; one op on rankings shorter than that), and :func:`_fill` keeps
#: what fits of the rest: four trials at most (each halves the counts left; under 32 ops, 31 -> 15 -> 7 -> 3 -> 1).
RELAX_RESOLUTION = 16
#: Rankings :func:`_relax` bisects: by each op's own re-run, and by what keeping it spares (:func:`kept_savings`).
RELAX_RANKINGS = 2
#: Simulations :func:`_fill` may take: its fill over each kept tensor's span, half of it where that does not fit,
#: and the fill of the room at the peak alone.
FILL_TRIALS = 3
#: The most simulations :func:`_relax` takes for one plan: each ranking bisected and filled.
RELAX_TRIALS = RELAX_RANKINGS * (RELAX_BISECTIONS + FILL_TRIALS)
#: Simulations the bisection of ``recompute="only"`` may take.
ONLY_BISECTIONS = 8


def _relax(ev: TuneEvaluator, times: Mapping[str, float], cand: Candidate, skipped: tuple) -> list[Candidate]:
    """The fastest fitting recompute plan with its dearest ops (re-run time per byte freed) kept instead, as many
    as still fit: a bisection on how many, then :func:`_fill` with the room left. The memory the budget leaves is
    spent on not re-running matrix products. On the XLA clocks the bisection goes to one op (at most
    :data:`RELAX_BISECTIONS` simulations): its fits near the boundary are the fallbacks
    :func:`tflms.pipeline.held.held` holds where the winner's order cannot be, which it does for a step that keeps
    XLA only. (It stopped within a 64th of the ops until the twenty-eighth session: BERT-base's relaxed plan at 1568
    on h200-141gb kept 195 ops at 112 GiB of 141, the next trial 213 at 282 GiB, the gap 18 ops of about 9 GiB each;
    to one op, 1296.4 -> 1281.3 ms at 134 GiB. A 16th there left ResNet-50 at 2560 on h100-80gb-pcie5 and at 4480
    on h200-141gb with no fit that pinning holds, run unpinned, and a slower winner: 1801.5 against 1783.2 ms at
    2560.) Elsewhere it stops at a 16th of the ranking
    (:data:`RELAX_RESOLUTION`, four trials at most), since the fill keeps what fits of the rest from the fit's own
    memory timeline (thirty-eighth session; tools/bench_rewrite.py's tune: 43 -> 30 simulations, 2.17 -> 1.74 s, and
    a faster plan, 206.60 -> 201.35 ms; BERT-base at 67 on v100-16gb-pcie3 +14.89% -> +11.58%, its tune 5.6 ->
    15.7 s, as the farther misses get swap tunes; docs/design.md, "Relaxation").

    What a re-run costs: on the XLA clocks, what its clones' kernels take in ``cand``'s own simulation
    (:func:`rerun_times`), since there a clone XLA fuses into its reader costs nothing and one written for a library
    call costs its whole fusion; elsewhere, the op's price (``times``). Two rankings, each bisected: by each op's own
    re-run, and by what keeping it spares (:func:`kept_savings`: its re-run and those upstream that only rebuild
    it; those trials say ``"spares": 1``). Neither wins everywhere: the bytes a kept tensor holds are not the whole
    of its memory, since what the backward pass re-runs in its place is held while it runs (BERT-base at checkpointing's
    largest batch on h200-141gb, simulated: in mixed_bfloat16 at 1872 the second gives +12.6% against +14.1%, in
    float32 at 832 the first +12.2% against +12.8%).

    The bisection's halfway trials are not only steps: its misses are the hybrids' seeds (:mod:`tflms.tune.hybrid`)
    and its fits the fallbacks :func:`tflms.pipeline.held.held` can pin. A search from the count the fit's memory
    timeline predicts took 27 simulations instead of 45 on tools/bench_rewrite.py's tune (scratch counts), and
    chose worse plans elsewhere (DenseNet-121 at 528 on v100-16gb-pcie3, +9.93% -> +12.32%; docs/design.md, "Where
    the search starts: tried, not kept").

    Off the XLA clocks a trial whose compute floor is above the fastest fit so far is not simulated
    (:func:`_judge_ops`'s ``bound``): it could not win, nor could a hybrid of it, and keeping fewer of the ranking
    re-runs more, so the bisection keeps more, as after a fit. Where the fill would start from a count taken so, that
    count is simulated then, and where it does not fit the fill starts from the last fit simulated (fortieth
    session: on tools/bench_rewrite.py's tune 6 of 16 trials refused, all of which had fitted, 3 simulated for the
    fill; 27 -> 24 simulations, scratch counts; the same plan)."""
    graph = ev.analysis.graph
    rerun = rerun_times(cand.sim, cand.plan.recomputes) if cand.sim.clock in XLA_CLOCKS else times
    own = {op: rerun.get(op, 0.0) for r in cand.plan.recomputes for op in r.ops}
    rankings: list[tuple[list[str], dict, dict]] = []
    for saved, params in ((own, {}), (kept_savings(graph, cand.plan.recomputes, rerun), {"spares": 1})):
        ops = sorted(saved, key=lambda op: (-saved[op] / max(1, output_bytes(graph, op)), op))
        if all(ops != other for other, _, _ in rankings):
            rankings.append((ops, saved, params))
    added: list[Candidate] = []
    bound = None if cand.sim.clock in XLA_CLOCKS else ev.fastest_fit_s
    for ops, saved, params in rankings:
        low, high, fit = 0, len(ops), cand  # keeping ``low`` fits (``fit``); keeping ``high`` is not known to
        fit_kept = 0  # (``low`` where ``fit`` was simulated)
        resolution = 1 if cand.sim.clock in XLA_CLOCKS else max(1, len(ops) // RELAX_RESOLUTION)
        for _ in range(RELAX_BISECTIONS):
            if high - low <= resolution:
                break
            middle = (low + high + 1) // 2
            refused: list[float] = []
            trial = _judge_ops(ev, times, ops[middle:], skipped, {**cand.params, **params, "kept": middle},
                               bound=bound, refused=refused)
            if trial is None:
                if refused:  # re-runs too much to win: keep more, as after a fit, unsimulated
                    low = middle
                else:
                    high = middle - 1
                continue
            added.append(trial)
            if trial.fits:
                low, fit, fit_kept = middle, trial, middle
            else:
                high = middle - 1
        if low != fit_kept:  # the fill starts from a count taken as fitting unsimulated: simulated now
            trial = _judge_ops(ev, times, ops[low:], skipped, {**cand.params, **params, "kept": low})
            added.extend([trial] if trial is not None else [])
            if trial is not None and trial.fits:
                fit = trial
            else:
                low = fit_kept
        added.extend(_fill(ev, times, fit, ops, low, saved, skipped, {**cand.params, **params, "kept": low}))
    return added


def _fill(ev: TuneEvaluator, times: Mapping[str, float], fit: Candidate, ops: list[str], kept: int,
          saved: Mapping[str, float], skipped: tuple, params: dict) -> list[Candidate]:
    """The relaxation's fit (``fit``, keeping ``ops[:kept]``) with the room it leaves under the budget spent too: the
    later ops of the ranking whose outputs fit, in ranking order, skipping those that do not (the bisection stops at
    the first that does not: BERT-base in mixed_bfloat16 at 1872 on h200-141gb, 4.7 GiB left under the next 11 GiB
    attention probabilities). An output kept instead of re-run lives from its op's end to its last backward reader
    (:func:`_kept_spans`); it fits where the memory ``fit`` holds over that span, plus what the fill kept so far, stays
    under the budget. So a tensor the backward pass reads before the peak or made after it is kept whatever its
    size (the same cell: 6 ops kept, 1513.0 ms, against 3 in the 4.7 GiB left at the peak, 1513.9 ms). One
    simulation, and one more with half of them if it does not fit
    (a kept tensor may raise another moment, and the step's times move); and one of the ops that fit in the room
    at the peak alone, in ranking order (its trial says ``peak: 1``), where those differ: the spans' fill keeps
    other ops, and does not win everywhere (BERT-base in float32 at 832 on h200-141gb: 1241.3 ms by the spans,
    1239.2 by the room at the peak). Off the XLA clocks that last one is not judged where the spans' fill fits and
    keeps every op it would: there each re-run is a kernel on the one compute stream, so the plan that re-runs more
    computes no shorter (the tune of tools/bench_rewrite.py's ResNet-50: 43 simulations instead of 45, counted by a
    scratch script, the same plan).

    Off the XLA clocks a fill whose compute floor is slower than the fastest fit so far is not simulated
    (:func:`_judge_ops`'s ``bound``, as for the price sets and the segment plans): it could not win, nor could a
    hybrid of it. It counts as a fit for what is judged next, so neither its half nor a room-at-the-peak fill of its
    own ops is simulated either: each keeps fewer of the ranking's ops, so re-runs more (the tune of
    tools/bench_rewrite.py's ResNet-50: 4 of its 6 fills left out, 30 simulations to 27 (scratch counts), the same
    plan; the V100 cells of ``tools/bench.py --at resnet50=481,densenet121=528,bert-base=67``, simulated, the same
    plans, +13.92%, +9.93%, +11.58%). On the XLA clocks every fill is simulated: its fits are fallbacks
    :func:`tflms.pipeline.held.held` can pin."""
    graph = ev.analysis.graph
    moments = np.array([t for t, _, _ in fit.sim.timeline], dtype=float)
    held = np.array([b for _, b, _ in fit.sim.timeline], dtype=np.int64)
    if not len(held):
        return []
    room = ev.budget - ev.need(fit.sim)
    limit = int(held.max()) + room
    spans = _kept_spans(fit.sim, fit.plan.recomputes)
    over_spans: list[str] = []
    at_peak: list[str] = []
    for op in ops[kept:]:
        size = output_bytes(graph, op)
        if saved.get(op, 0.0) <= 0 or not size:
            continue
        if size <= room:
            at_peak.append(op)
            room -= size
        if op in spans:
            first, last = spans[op]
            lo = max(0, int(np.searchsorted(moments, first, side="right")) - 1)
            hi = max(lo + 1, int(np.searchsorted(moments, last, side="right")))
            if int(held[lo:hi].max()) + size <= limit:
                held[lo:hi] += size
                over_spans.append(op)
    added: list[Candidate] = []
    judged: list[list[str]] = []

    bound = None if fit.sim.clock in XLA_CLOCKS else ev.fastest_fit_s
    refused: list[float] = []

    def judge(extra: list[str], **marks: int) -> bool:
        """Judge the fit with ``extra`` kept too (once per set); whether that fits, or computes too long to win."""
        if not extra or extra in judged:
            return False
        judged.append(extra)
        chosen, before = set(extra), len(refused)
        trial = _judge_ops(ev, times, [op for op in ops[kept:] if op not in chosen], skipped,
                           {**params, "filled": len(extra), **marks}, bound=bound, refused=refused)
        added.extend([trial] if trial is not None else [])
        return (trial is not None and trial.fits) or len(refused) > before

    if not judge(over_spans):
        judge(over_spans[:len(over_spans) // 2])
    elif fit.sim.clock not in XLA_CLOCKS and set(at_peak) <= set(over_spans):
        # (off the XLA clocks every kernel runs, one after another, so the peak's plan, which re-runs every op the
        # spans' plan does and more, computes no shorter; it may hold less, but the spans' plan fits already)
        return added
    judge(at_peak, peak=1)
    return added


def _kept_spans(sim: SimResult, decisions: Iterable) -> dict[str, tuple[float, float]]:
    """By op the recompute ``decisions`` re-run, when its output would live in ``sim`` were it kept instead: from the
    op's end to the last start of an op that reads its clone's output outside the chain (``readers``), or, for an op
    only its chain reads, to the chain's last clone's end."""
    ran = sim.op_spans()
    spans: dict[str, tuple[float, float]] = {}
    for decision in decisions:
        read_until: dict[str, float] = {}
        for ref, readers in zip(decision.tensors, decision.readers):
            for reader in readers:
                if reader in ran:
                    read_until[ref.op] = max(read_until.get(ref.op, 0.0), ran[reader][0])
        chain_end = max((ran[c][1] for c in decision.clones if c in ran), default=0.0)
        for op in decision.ops:
            if op not in ran:
                continue
            end = ran[op][1]
            first, last = spans.get(op, (end, end))
            spans[op] = (first, max(last, read_until.get(op, chain_end)))
    return spans


def rerun_times(sim: SimResult, decisions: Iterable) -> dict[str, float]:
    """By op the recompute ``decisions`` re-run, what its clones' kernels
    (:attr:`~tflms.policies.recompute.RecomputeDecision.clones`) take on the compute stream of ``sim``, the plan's
    simulation: a fused clone takes nothing, its fusion's root the whole fusion. Dropout's mask is the case that
    matters: on the XLA clocks its random numbers and comparison fuse into the select that reads them, so keeping the
    mask saves nothing and costs its bytes, while its price alone (a kernel reading the random numbers and writing one
    byte an element) ranked it dearest per byte of all (BERT-base in mixed_bfloat16 at batch 1568 on h200-141gb: the
    plan that kept 7 layers' masks more took 32 ms more a step and 31 GiB more)."""
    took = {name: end - start for name, (start, end) in sim.op_spans("compute").items()}
    out: dict[str, float] = {}
    for decision in decisions:
        for op, clone in zip(decision.ops, decision.clones):
            out[op] = out.get(op, 0.0) + took.get(clone, 0.0)
    return out


#: Re-run ops upstream of one op that :func:`kept_savings` credits to keeping it, at most.
SPARED_DEPTH = 64


def kept_savings(graph, decisions: Iterable, rerun: Mapping[str, float]) -> dict[str, float]:
    """By op the recompute ``decisions`` re-run, what keeping its output instead saves: its own re-run (``rerun``) and
    that of the re-run ops upstream whose clones are read only on the way to it (none of their outputs read by the
    backward pass from a clone, every clone reading them spared too; at most :data:`SPARED_DEPTH` of them).

    Keeping an attention layer's softmax output spares the re-run of the scores' product too (its gradient reads
    the output alone); keeping the dropout select that reads it spares only the select, its mask fused in. Ranked by
    the op's own re-run, the two tie per byte (BERT-base in mixed_bfloat16 at batch 1872 on h200-141gb: the
    relaxed plan kept 5 layers' selects and re-ran every layer's product and softmax)."""
    readers: dict[str, set[str]] = {}  # a re-run op -> the re-run ops whose clones read its clone
    direct: set[str] = set()  # re-run ops whose clone the backward pass reads
    for decision in decisions:
        chain = set(decision.ops)
        direct.update(ref.op for ref in decision.tensors)
        for op in decision.ops:
            for ref in graph.op(op).inputs:
                if ref.op in chain and ref.op != op:
                    readers.setdefault(ref.op, set()).add(op)
    out: dict[str, float] = {}
    for kept in {op for decision in decisions for op in decision.ops}:
        spared, frontier = {kept}, [kept]
        while frontier and len(spared) <= SPARED_DEPTH:
            for ref in graph.op(frontier.pop()).inputs:
                up = ref.op
                if up not in spared and up not in direct and up in readers and readers[up] <= spared:
                    spared.add(up)
                    frontier.append(up)
        out[kept] = sum(rerun.get(op, 0.0) for op in spared)
    return out


def priced(ranked: list, profile, price: float) -> int:
    """How many of ``ranked`` (:func:`~tflms.policies.recompute_rank.rank_candidates`: best first) rebuild their tensor
    for at most ``price`` times the two copies a swap of its bytes would take over ``profile``'s host link: the
    recompute set of that price is the first that many."""
    return sum(1 for c in ranked if c.cost_s <= price * _round_trip_s(profile, c.freed_bytes))


def _priced_ops(ev: TuneEvaluator, times: Mapping[str, float], ops: Iterable[str], price: float | None) -> frozenset:
    """Those of ``ops`` whose re-run costs at most ``price`` times the two copies of their outputs (all of them for
    ``None``): within a segment, the rest are kept (:func:`_segment_candidates`, :func:`_enforced_hybrids`)."""
    graph = ev.analysis.graph
    return frozenset(op for op in ops
                     if price is None or times[op] <= price * _round_trip_s(ev.profile, output_bytes(graph, op)))


def _round_trip_s(profile, num_bytes: int) -> float:
    """The two copies a swap of ``num_bytes`` takes over ``profile``'s host link."""
    return 2 * profile.copy_time_s(num_bytes)


def _judge_ops(ev: TuneEvaluator, times: Mapping[str, float], ops, skipped: tuple, params: dict, *,
              split_only: bool = False, bound: Callable[[], float] | None = None,
              per_reader: frozenset[str] = frozenset(), split_readers: bool = False,
              refused: list[float] | None = None) -> Candidate | None:
    """Recompute ``ops`` (:func:`~tflms.policies.recompute.recompute_plan`, with ``params["split"]`` as its
    ``split_levels``, and ``split_readers``: a clone per reader), simulate and record the plan (``params`` plus what
    it recomputes); ``None`` when no op can be recomputed, or, with ``split_only``, when the split re-runs nothing
    again (the plan without it), or when the plan computes longer than ``bound()`` seconds (the fastest fit so far;
    then its floor is appended to ``refused``, where given).

    That plan cannot win, nor can a hybrid of it: the compute stream runs every op of the step and every clone,
    one after another, and a step lasts at least that long (:func:`compute_floor_s`). It is not simulated. On
    ResNet-50 at batch 32 (tools/bench_rewrite.py's budget) that leaves out 7 of the 16 recompute plans."""
    plan = recompute_plan(ev.analysis, ops, ev.base_config, accelerator_device=ev.accelerator,
                          split_levels=params.get("split"), per_reader=per_reader, skipped=skipped,
                          split_readers=split_readers)
    decisions = plan.recomputes
    if not decisions or (split_only and not any(r.copy for r in decisions)):
        return None
    if bound is not None:
        floor = compute_floor_s(ev.context.baseline, times, decisions, clone_launch_s(ev))
        if floor > bound():
            if refused is not None:
                refused.append(floor)
            return None
    # (incrementally, without the rewritten graph: that is built where it is read, ``ev.graph_of``)
    sim = ev.plans.evaluate(plan)
    params = {**params, "recomputed": sum(len(r.tensors) for r in decisions),
              "cloned": sum(len(r.ops) for r in decisions)}
    return ev.record("recompute", params, plan, sim, None, None)


def compute_floor_s(baseline: SimResult, times: Mapping[str, float], decisions: Iterable,
                    launch_s: float = 0.0) -> float:
    """The least step time of any plan with these recompute ``decisions``: the unswapped step's compute time plus
    the clones' (``times`` by original op, launch included; a clone takes its original's), less a round-off
    allowance. The gates and swaps add no compute; the order cannot remove any.

    On the XLA clocks (:data:`~tflms.sim.clock.XLA_CLOCKS`) a clone may cost nothing: XLA fuses it into the kernel of
    the backward op that reads it (its gate is a barrier inside the cluster, :mod:`tflms.passes.xla_clusters`),
    which reads the clone's inputs in place of its output. So there the floor counts no clone.

    ``launch_s``: the launch each price includes, where the host launches kernels ahead of the GPU (the ``graph``
    clock, :mod:`tflms.sim.clock`; 0 for the ``serial`` one). A clone then adds its kernel time (its price less
    the launch) to the kernels back to back (``kernel_time_s``), and at least the shorter of its kernel and its
    launch to the compute stream's time, which counts the waits for launches."""
    if baseline.clock in XLA_CLOCKS:
        return baseline.compute_time_s * (1 - COMPUTE_ROUND_OFF)
    kernels = [max(0.0, times[op] - launch_s) for r in decisions for op in r.ops]
    if not launch_s:
        return (baseline.compute_time_s + sum(kernels)) * (1 - COMPUTE_ROUND_OFF)
    floor = max(baseline.kernel_time_s + sum(kernels), baseline.compute_time_s + sum(min(k, launch_s) for k in kernels))
    return floor * (1 - COMPUTE_ROUND_OFF)


def clone_launch_s(ev: TuneEvaluator) -> float:
    """The launch :func:`compute_floor_s` takes off each price in ``ev``'s tune (0 unless its baseline was timed by
    the ``graph`` clock)."""
    return ev.profile.launch_overhead_s if ev.context.baseline.clock == "graph" else 0.0


def _bisect(ev: TuneEvaluator, judge: Callable[[int, float | None], Candidate | None], counts: list[int]) -> None:
    """Between the largest count that does not fit and the smallest that does, the fewest recomputes that fit."""
    for _ in range(ONLY_BISECTIONS):
        fit = sorted(n for n in counts if (c := judge(n, None)) is not None and c.fits)
        if not fit:
            return
        below = [n for n in counts if n < fit[0]]
        low, high = (max(below) if below else 0), fit[0]
        if high - low <= 1:
            return
        middle = (low + high) // 2
        counts.append(middle)
        judge(middle, None)


def _segment_candidates(ev: TuneEvaluator, times: Mapping[str, float], skipped: tuple,
                        splits: tuple[int, ...] = (), balanced: bool = False,
                        bound: Callable[[], float] | None = None) -> list[Candidate]:
    """Graph-level checkpointing (Chen et al.): segments between kept articulations re-run before their backward
    pass; within them, an op whose re-run costs more than ``price`` times the two copies of its outputs is kept
    instead (a matrix product whose output copies hide), for the swap tuner to swap or keep. With ``splits``: the
    same plans re-run again past each of those levels instead (where that re-runs something). With ``balanced``:
    the articulations kept are chosen by bytes (:func:`~tflms.policies.checkpoints.balanced_segment_ops`, at each
    of :data:`BALANCED_SLACKS`; ``params["balanced"]``), and ``splits`` adds to the plans instead of replacing
    them. ``bound``: as :func:`_judge_ops`'s."""
    import math
    cuts = articulations(ev.analysis)
    if not cuts:
        return []
    if balanced:
        bases = []
        for slack in BALANCED_SLACKS:
            ops, kept = balanced_segment_ops(ev.analysis, slack)
            bases.append((ops, {"segments": kept + 1, "balanced": slack}))
        splits = (None, *splits)
    else:
        bases = [(segment_ops(ev.analysis, segments), {"segments": segments})
                 for segments in sorted({len(cuts), max(1, round(math.sqrt(len(cuts))))}, reverse=True)]
    added, seen = [], set()
    for base, how in bases:
        for price in SEGMENT_PRICES:
            ops = _priced_ops(ev, times, base, price)
            if not ops or ops in seen:
                continue
            seen.add(ops)
            params = {**how, "price": "any" if price is None else price}
            for split in splits or (None,):
                cand = _judge_ops(ev, times, ops, skipped, params if split is None else {**params, "split": split},
                                  split_only=split is not None,  # (a split that re-runs nothing again: no plan)
                                  bound=bound)
                if cand is not None:
                    added.append(cand)
    return added
