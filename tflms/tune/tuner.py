"""Budget-driven auto-tuning: pick the rewrite that fits with the least slowdown.

Strategies (each evaluated with the simulator on the same graph):

- ``none``: the original step, if it fits.
- ``tflms-distance`` (TFLMS's search): thresholds from large to small until one
  fits; then the largest ``swapin_ahead`` and ``swapin_groupby`` that still fit;
  ``sync_mode`` is raised only when nothing asynchronous fits. Unlike TFLMS, every
  fitting candidate is compared by simulated step time, not just by fit.
- ``idle-time``: tensors ranked by how long they idle around the memory peak
  (:mod:`tflms.policies.idle_time`), in ``stick-to-limit`` mode.
- ``idle-time-no-overhead``: the same, but only swaps whose copies hide behind
  compute; it fails rather than slow the step down.

Then the fastest fitting candidate's plan is *pruned* (:mod:`tflms.tune.prune`): the swaps
fitting does not need are dropped, a tensor swapped in several times is swapped in once, compute
stops waiting for swap-outs where fitting does not need it and waits later where it does, and swap-ins
are triggered earlier, each
change kept while the plan still fits and is no slower; the pruned plan is one more candidate (its
parameters say ``pruned``, ``merged``, ``unsynced``, ``waits_later``, ``earlier``: how many
swaps changed).

With ``enforce_order=True`` (as the pipeline tunes), ``idle-time-no-overhead`` also runs on the step with
its memory-aware order pinned before the swaps (:func:`tflms.tune.search.search_order_first`): those
candidates say ``order_first`` in their parameters, and their graph keeps the order's edges.

The winner is the fitting candidate with the smallest simulated step time (ties:
fewer swapped bytes). When nothing fits, :class:`~tflms.errors.BudgetError`
names the smallest budget any candidate reached.

The searches and their stopping rules are in :mod:`tflms.tune.search`, the
records (:class:`Candidate`, :class:`TuneResult`) in :mod:`tflms.tune.result`;
their names stay importable from here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph, no_training_step_error
from tflms.config import RECOMPUTE_OFF, RECOMPUTE_ONLY, LMSConfig
from tflms.devices import resolve_accelerator
from tflms.errors import BudgetError, ConfigError, UnknownSizeError
from tflms.ir.graph import Graph
from tflms.ir.op_types import SOURCE_OPS
from tflms.ir.tf_io import load_graph
from tflms.passes.swaps import DEFAULT_COPY_OP
from tflms.policies.idle_time import NO_OVERHEAD, STICK_TO_LIMIT
from tflms.policies.swapplan import SwapPlan
from tflms.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from tflms.sim.simulator import SimOptions, SimResult, gc_paused
from tflms.tune.result import Candidate, TuneResult
# the searches and their knobs live in tflms.tune.search; the names stay importable from here
from tflms.tune.search import (FIT_BY_BFC, FIT_BY_LIVE, NO_OVERHEAD_TOLERANCE, ORDER_FINALISTS,  # noqa: F401
                               ORDER_MAX_OVERSHOOT,
                               TuneEvaluator, judge_ordered, search_distance, search_idle, search_order_first)
from tflms.tune.hybrid import search_recompute
from tflms.tune.vdnn import search_vdnn
from tflms.units import format_bytes, parse_bytes

logger = logging.getLogger(__name__)

STRATEGIES = ("tflms-distance", "idle-time", "idle-time-no-overhead")
#: What the recompute search records (:mod:`tflms.tune.hybrid`; ``LMSConfig.recompute``): recomputes alone, and
#: recomputes with swaps chosen for the rest.
RECOMPUTE_STRATEGIES = ("recompute", "hybrid")
#: What :func:`tune` searches by default: the swap strategies and the recompute search (when
#: ``LMSConfig.recompute`` is not ``"off"``; ``"only"`` searches recompute alone, whatever is asked).
DEFAULT_STRATEGIES = STRATEGIES + ("recompute",)
#: Strategies searched only when asked for (vDNN's layer-wise policies, for comparison).
OPT_IN_STRATEGIES = ("vdnn_conv", "vdnn_all")


#: Tensors of unknown size an :class:`~tflms.errors.UnknownSizeError` names.
UNKNOWN_SIZE_EXAMPLES = 3


def check_known_sizes(graph: Graph, sim: SimResult, batch_size: int | None) -> None:
    """Refuse a memory verdict that would count tensors of an unknown batch size as 0 bytes.

    Raises :class:`~tflms.errors.UnknownSizeError` when a tensor's only unknown
    dimension is the leading (batch) one and no batch size was given, naming a
    few of them and the fix: ``batch_size=N`` in the API and the Keras callback,
    ``--batch-size N`` on the command line. Tensors whose size depends on the data
    (e.g. a gradient's ``Reshape`` to a ``tf.shape`` computed at run time, or the
    shape vectors of ``BroadcastGradientArgs`` when every step argument's leading
    dimension is known) do not stop the verdict: :meth:`TuneResult.reason` says how many were left out. A
    rewrite by the TFLMS rules without a budget needs no verdict: it leaves
    tensors of unknown size unswapped (reason ``unknown-shape``) instead.
    """
    if batch_size is not None or not sim.unknown_size_tensors:
        return
    if not any(info.shape and info.shape[0] is None for op in graph.ops if op.type in SOURCE_OPS
               for info in op.outputs):
        return  # every step argument has a known leading dimension: no unknown size is the batch's
    from tflms.ir.graph import TensorRef
    batch_only = []
    for name in sim.unknown_size_tensors:
        ref = TensorRef.parse(name)
        shape = graph.op(ref.op).outputs[ref.index].shape
        if shape and shape[0] is None and all(d is not None for d in shape[1:]):
            batch_only.append((name, shape))
    if not batch_only:
        return
    examples = ", ".join(f"{n} {_shape_text(s)}" for n, s in batch_only[:UNKNOWN_SIZE_EXAMPLES])
    raise UnknownSizeError(
        f"cannot predict the step's memory: {len(batch_only)} tensors have an unknown batch (leading) dimension "
        f"(e.g. {examples}) and would count as 0 bytes. Give the batch size: batch_size=N (--batch-size N)")


def _shape_text(shape) -> str:
    return "(unknown rank)" if shape is None else "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def tune(source: Any, *args: Any, budget: int | str | None = None, profile: str | HardwareProfile = DEFAULT_PROFILE,
         config: LMSConfig | None = None, strategies: Sequence[str] = DEFAULT_STRATEGIES,
         sim_options: SimOptions | None = None, host_budget: int | str | None = None, copy_op: str = DEFAULT_COPY_OP, first_fit: bool = False,
         require_backward: bool = True, fit_by: str = FIT_BY_LIVE,
         compress: Callable[[Graph, SwapPlan], Graph] | None = None,
         progress: Callable[[str], None] | None = None, enforce_order: bool = False,
         prune: bool = True) -> TuneResult:
    """Find the rewrite of ``source`` that fits ``budget`` (default: the profile's memory) fastest.

    ``config`` supplies the fixed options (filters, devices, ``min_swap_bytes``,
    ``batch_size``); the swap parameters are searched. Raises
    :class:`~tflms.errors.BudgetError` when nothing fits. ``first_fit`` stops at
    the first configuration that fits (answers "does anything fit?" quickly); with
    ``enforce_order`` it also judges the finalists in the order before the recompute
    search, which a fit there spares (each plan judged once a tune: issue 48's estimate).
    ``fit_by="bfc"`` judges fit by the BFC allocator model (resident bytes plus
    what the allocator reserves for the step's allocation sequence) instead of
    the live-bytes peak: a budget the live bytes meet but the allocator does not
    is not a fit. ``compress`` (e.g. ``tflms.compress.policy.make_compressor``)
    post-processes every candidate's rewritten graph with compressed swaps.
    ``enforce_order``: the pipeline will pin a memory-aware order (:func:`tflms.passes.order.enforce_order`),
    so the finalists (:func:`judge_ordered`) are judged again with the order's edges, and one that fits
    only in that order can win; and, when no plan fits at zero overhead yet, the no-overhead search runs
    again with that order pinned before the swaps (:func:`tflms.tune.search.search_order_first`; not with
    ``first_fit`` or ``compress``), before the recompute search, which a plan it fits spares.
    ``prune``: after the searches, the fastest fitting candidate's plan is judged again with waits instead of
    the swaps that go out and straight back, without the swaps fitting does not need, with merged swap-ins,
    without the waits for swap-outs it does not need and the others split or later, and with earlier swap-ins
    (also where the link idles; :func:`tflms.tune.prune.prune_swaps`, at most 108 simulations; not with
    ``first_fit``); the result is one more candidate, with ``round_trips`` / ``pruned`` / ``merged`` /
    ``unsynced`` / ``waits_split`` / ``waits_later`` / ``earlier`` in its parameters.
    """
    if fit_by not in (FIT_BY_LIVE, FIT_BY_BFC):
        raise ConfigError(f"fit_by must be {FIT_BY_LIVE!r} or {FIT_BY_BFC!r}, got {fit_by!r}")
    # One pause for the whole search: the simulations allocate about a million small objects, none of them
    # cyclic garbage; a collection at the end of each search would scan all that the tune still holds.
    with gc_paused():
        return _tune(source, args, budget, profile, config, strategies, sim_options, host_budget, copy_op, first_fit,
                     require_backward, fit_by, compress, progress, enforce_order, prune)


#: How a candidate that fits but would not run starts its ``why_not``.
UNRUNNABLE = "not runnable: "


def _runnable(ev: TuneEvaluator, ranked: list[Candidate], progress: Callable[[str], None] | None) -> list[Candidate]:
    """``ranked`` (fastest first) from the first candidate whose graph TensorFlow will run on; the ones before it are
    recorded as not fitting, and said.

    A graph whose ops oneDNN merges into a node that waits for itself (:func:`tflms.ir.merges.merge_cycle`) fails at
    its first call: such a candidate is no fit, whatever its peak (docs/design.md, "Runnable graphs"). The graphs are
    built in rank order, so the check usually builds only the winner's.
    """
    from tflms.ir.merges import merge_cycle
    for k, cand in enumerate(ranked):
        cycle = None if ev.known_runnable(cand) else merge_cycle(ev.graph_of(cand))
        if cycle is None:
            return ranked[k:]
        refused = dataclasses.replace(cand, fits=False, why_not=UNRUNNABLE + cycle)
        ev.candidates[:] = [refused if c is cand else c for c in ev.candidates]
        ev.graphs.pop(id(cand), None)
        message = f"{cand.strategy} {cand.params} fits but is left out: TensorFlow would refuse it ({cycle})"
        logger.info(message)
        if progress is not None:
            progress(message)
    return []


def _tune(source: Any, args: Sequence[Any], budget: int | str | None, profile: str | HardwareProfile,
          config: LMSConfig | None, strategies: Sequence[str], sim_options: SimOptions | None,
          host_budget: int | str | None, copy_op: str, first_fit: bool, require_backward: bool, fit_by: str,
          compress: Callable[[Graph, SwapPlan], Graph] | None, progress: Callable[[str], None] | None,
          enforce_order: bool, prune: bool) -> TuneResult:
    """:func:`tune`'s body (run with the cyclic collector paused)."""
    profile = get_profile(profile)
    unknown = sorted(set(strategies) - set(DEFAULT_STRATEGIES) - set(OPT_IN_STRATEGIES))
    if unknown:
        raise ConfigError(f"unknown tuning strategies {unknown}; choose from "
                          f"{list(DEFAULT_STRATEGIES + OPT_IN_STRATEGIES)}")
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    if budget_bytes <= 0:
        raise ConfigError("budget must be positive")
    host_bytes = profile.host_memory_bytes if host_budget is None else parse_bytes(host_budget, what="host_budget")
    config = (config or LMSConfig()).with_rule_defaults()  # the base of every candidate's config
    sim_options = sim_options or SimOptions(host_device=config.host_device)
    analysis = source if isinstance(source, Analysis) else analyze_graph(
        load_graph(source, *args, batch_size=config.batch_size))
    graph = analysis.graph
    if require_backward and not analysis.has_backward:
        raise no_training_step_error(analysis)
    accelerator = config.accelerator_device or resolve_accelerator(config.accelerator_device)[0]
    if accelerator == config.host_device:
        accelerator = "/device:GPU:0"  # planning for a GPU we do not have: the profile is the device
    ev = TuneEvaluator(analysis, profile, budget_bytes, host_bytes, sim_options, config, accelerator, copy_op, progress)
    baseline = ev.plans.evaluate(None)  # = simulate(graph, profile, options=sim_options)
    ev.context = dataclasses.replace(ev.context, baseline=baseline)
    check_known_sizes(graph, baseline, config.batch_size)
    ev.fit_by = fit_by
    ev.compress = compress
    base_need = ev.need(baseline)
    base = Candidate("none", {}, None, baseline, fits=base_need <= budget_bytes,
                     why_not="" if base_need <= budget_bytes else f"needs {format_bytes(base_need)} > budget")
    ev.candidates.append(base)
    ev.graphs[id(base)] = graph
    searches = [("tflms-distance", lambda: search_distance(ev, first_fit=first_fit)),
                ("idle-time", lambda: search_idle(ev, baseline, STICK_TO_LIMIT)),
                ("idle-time-no-overhead", lambda: search_idle(ev, baseline, NO_OVERHEAD)),
                ("vdnn", lambda: search_vdnn(ev, policies=[s for s in strategies if s in OPT_IN_STRATEGIES]))]
    only = config.recompute == RECOMPUTE_ONLY
    found = lambda: first_fit and any(c.fits for c in ev.candidates)  # noqa: E731 - first_fit's stop
    free = lambda cands: any(c.sim.overhead_vs(baseline) <= NO_OVERHEAD_TOLERANCE for c in cands)  # noqa: E731

    def swap_tune(source: Analysis, swap_strategies: list[str], **options: Any) -> tuple[TuneResult | None, list]:
        """This tune's swap strategies on another graph (the recomputed step, the ordered step), swaps only:
        ``(its result or None when nothing fits, every candidate it judged)``."""
        try:
            result = tune(source, budget=budget_bytes, profile=profile, config=config.replace(recompute=RECOMPUTE_OFF),
                          strategies=swap_strategies, sim_options=sim_options, host_budget=host_bytes,
                          copy_op=copy_op, fit_by=fit_by, require_backward=require_backward, **options)
        except BudgetError as err:
            return None, list(err.candidates)
        return result, list(result.candidates)

    def swap_searches() -> None:
        for name, search in searches:
            if base.fits or found() or only:
                break
            if name in strategies or (name == "vdnn" and set(strategies) & set(OPT_IN_STRATEGIES)):
                search()

    recomputes = only or (config.recompute != RECOMPUTE_OFF and "recompute" in strategies)
    # No swap plan that fits is faster than the swap floor, in any order. Where that floor is slower than the
    # unswapped step, no swap plan is free, so the recompute search would run whatever the swap searches found: it
    # runs first, and the swap searches (the distance rules, the idle-time rounds, pruning) only where the floor
    # does not rule out that they beat what it found; the order-first search, whose plans must be free, only where
    # nothing fits (docs/design.md, "Tuning time").
    floored = recomputes and not only and not base.fits and not first_fit and compress is None
    recompute_first = floored and ev.swap_floor_above(baseline.step_time_s * (1 + NO_OVERHEAD_TOLERANCE))

    def swaps_can_win() -> bool:
        fastest = ev.fastest_fit_s()
        return not floored or fastest == float("inf") or not ev.swap_floor_above(fastest)

    if not recompute_first:
        swap_searches()
    # the no-overhead search with the order pinned before the swaps (see the docstring's ``enforce_order``)
    order_first = (enforce_order and "idle-time-no-overhead" in strategies and not base.fits and not first_fit
                   and compress is None and not only)

    def order_first_fits() -> list:
        def no_overhead_search(ordered: Analysis) -> list:
            # (the search on the ordered step checks there whether copies can hide: level order's peak is elsewhere)
            return swap_tune(ordered, ["idle-time-no-overhead"], prune=False)[1]
        return [c for c in search_order_first(ev, baseline, no_overhead_search) if c.fits]

    def recompute_pays() -> bool:  # (a swap plan that fits at no cost leaves recompute nothing to gain)
        return recomputes and not base.fits and not free(c for c in ev.candidates if c.fits) and not found()

    if first_fit and enforce_order and not base.fits and not found() and recomputes:
        # "does anything fit?" at a large batch is mostly answered in the enforced order: judged before the recompute
        # search, which a fit there spares (judge_ordered keeps its judgments for the call after it)
        judge_ordered(ev, first_fit=True)
    order_first_ran = order_first and not recompute_first and recompute_pays()
    if order_first_ran:
        # before the recompute search, which its fits (recorded in ev.candidates) can spare: on keras.applications
        # ResNet50 (64x64, batch 8) at 55% of its peak the order-first plan fits at no cost, and the recompute
        # search took two thirds of a 60 s tune to find nothing faster
        order_first_fits()
    if recompute_pays():
        idle = [s for s in strategies if s in ("idle-time", "idle-time-no-overhead")]

        def swaps_on(recomputed: Analysis, searched: list[str] = idle, **options: Any) -> list:
            # the idle-time searches on the step with the recomputes in it (in level order: the finalists are
            # judged in the enforced order below, hybrids among them): their winner, or the plan closest to fitting
            result, tried = swap_tune(recomputed, searched, first_fit=first_fit, prune=prune, **options)
            if result is not None:
                ev.nested_winner(result)  # (its graph, checked runnable there, serves the hybrid)
                return [result.best]
            tried = [c for c in tried if c.plan is not None]
            return [min(tried, key=lambda c: c.sim.peak_with_margin_bytes)] if tried else []

        with_distance = idle + [s for s in strategies if s == "tflms-distance"]

        def swaps_on_ordered(recomputed: Analysis) -> list:
            # with the order pinned first the distance rules search too: on ResNet-50 at batch 999 on
            # v100-16gb-pcie3 with 5% headroom only their plan fits there (1.81x the plain step; swaps alone 2.82x)
            return swaps_on(recomputed, with_distance)

        def swaps_in_order(recomputed: Analysis) -> list:
            # the whole swap tuner in the enforced order (its finalists judged in the order, swaps across the ordered
            # peak): on ResNet-50 at batch 1347 on v100-16gb-pcie3 only its plans fit the least recompute
            return swaps_on(recomputed, with_distance, enforce_order=True)
        in_order = enforce_order and not first_fit
        search_recompute(ev, baseline, only=only, nested=None if only or not idle else swaps_on,
                         ordered=swaps_on_ordered if in_order else None,
                         enforced=swaps_in_order if in_order and idle else None)
    skipped = recompute_first and not swaps_can_win()
    if skipped:
        message = (f"swap searches skipped: no swap plan that fits takes less than "
                   f"{1e3 * ev.swap_floor.floor_s:.2f} ms (their floor in any order, simulated), and a plan found "
                   f"fits in {1e3 * ev.fastest_fit_s():.2f} ms")
        logger.info(message)
        if progress is not None:
            progress(message)
    elif recompute_first:
        swap_searches()
    if enforce_order and not base.fits and not found():
        judge_ordered(ev, first_fit=first_fit)
    order = ("none",) + STRATEGIES + OPT_IN_STRATEGIES + RECOMPUTE_STRATEGIES
    rank = lambda c: (c.sim.step_time_s, c.swapped_bytes, order.index(c.strategy))  # noqa: E731
    fitting = [c for c in ev.candidates if c.fits]
    # (a hybrid's swaps were pruned; an order-first plan's swaps were chosen for its pinned order)
    swaps_only = [c for c in fitting if (c.plan is None or not c.plan.recomputes)
                  and not (c.order or {}).get("before_swaps")]
    if prune and swaps_only and not first_fit and swaps_can_win():
        from tflms.tune.prune import prune_swaps
        pruned = prune_swaps(ev, min(swaps_only, key=rank))
        if pruned is not None and pruned.fits:
            fitting.append(pruned)
    # (free: nothing left to gain; with no swap plan free, its plans fit nothing, and it runs only for a smaller need to
    # name where nothing fits)
    if order_first and not order_first_ran and not free(fitting) and not (recompute_first and fitting):
        fitting += order_first_fits()
    fitting = _runnable(ev, sorted(fitting, key=rank), progress)
    if not fitting:
        smallest = min(ev.candidates, key=lambda c: ev.need(c.sim))
        error = BudgetError(
            f"nothing fits the budget {format_bytes(budget_bytes)} on {profile.name}: the step needs "
            f"{format_bytes(base_need)} without swapping and at least "
            f"{format_bytes(ev.need(smallest.sim))} with the best rewrite found "
            f"({smallest.strategy} {smallest.params}); give a budget of at least that, or a smaller batch. "
            f"Resident variables alone take {format_bytes(baseline.resident_bytes)}."
            + "".join(f" Left out: {c.strategy} {c.params}, which fits but TensorFlow would refuse ({c.why_not})."
                      for c in ev.candidates if c.why_not.startswith(UNRUNNABLE)))
        error.candidates, error.baseline = tuple(ev.candidates), baseline  # what was tried, for reports
        try:
            raise error
        finally:
            # (the error's traceback holds this frame: a local naming the error would make a cycle that keeps
            # this tune's evaluator, every candidate and graph, alive until the next full collection; the hybrid
            # search catches several of these from its nested tunes)
            del error
    best = min(fitting, key=rank)
    return TuneResult(budget_bytes=budget_bytes, profile=profile.name, baseline=baseline, best=best,
                      candidates=tuple(ev.candidates), graph=ev.graph_of(best), analysis=analysis,
                      swap_floor_s=None if ev.swap_floor is None else ev.swap_floor.floor_s,
                      swap_searches_skipped=skipped)
