"""Land cuts or none, clones where needed or last: a step that keeps XLA is tuned each way that may win (issue 47).

On the ``xla-clusters`` clock a swap-in follows its trigger, and the ops between the trigger and the swap-in's reader
share the reader's cluster, which starts only when all its inputs exist: they wait for the copy they could hide.
With ``SimOptions.xla_land_cuts`` (and ``land_cuts`` in :func:`tflms.passes.xla_clusters.cluster_for_xla`) the
reader starts a cluster of its own and those ops run while the copy lands. The cut is a boundary like any other:
what those ops hand the reader is written instead of fused, and they allocate while the copy is still on the link,
so it trades memory for overlap, and neither rule is better for every plan (docs/design.md, "Land cuts"):

- ResNet-50 at batch 7392 on h200-141gb (simulated): the best plan without cuts is a hybrid at +194.4%; with them,
  another hybrid at +101.1%, whose swaps were chosen with the copies overlapped;
- the test CNN at 90% of its activations: without cuts a hybrid fits, with them none does.

So :func:`tune_xla` runs the tune without cuts and, where its winner swaps (or nothing fits), again with them, and
keeps the faster winner: a plan that only recomputes has no swap-in, and the second tune could not change it.

**Where the clones go.** The segment rule orders each recompute clone where the op it feeds is
(:func:`tflms.ir.xla_segments._where_needed`); ordered last, as the rewrite appends them, re-run chains were cut in
two by the swap-ins between them, the first part's results held by its cluster from its start. Neither order is
better for every plan (docs/design.md, "Clones where they are needed"), simulated on h200-141gb:

- BERT-base in mixed_bfloat16 at batch 5460: clones last, the best plan was a hybrid at 53.5 s a step (0.08x the
  plain step's samples/s at its maximum); where they are needed, a hybrid at 5.79 s (0.74x);
- ResNet-50 at batch 7392: clones last, a hybrid at +97.1% (0.51x); where needed, +107.2% (0.49x);
- the test MLP at 90% of XLA alone's peak: clones last, a hybrid fits; where needed, none does.

Only a plan that swaps and recomputes both has clones and copies to order against each other, so where the winner
is such a hybrid (or nothing fits) :func:`tune_xla` tunes again with ``SimOptions.xla_clones_last``, cuts judged the
same way, and keeps the faster winner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tflms.errors import BudgetError
from tflms.sim.clock import CLOCK_XLA_CLUSTERS


def swaps(result: Any) -> bool:
    """Whether the winner of tune ``result`` (a :class:`~tflms.tune.result.TuneResult`) swaps anything."""
    plan = result.best.plan
    return plan is not None and bool(plan.swaps)


def hybrid(result: Any) -> bool:
    """Whether the winner of tune ``result`` swaps and recomputes both."""
    return swaps(result) and bool(result.best.plan.recomputes)


def tune_xla(run: Callable[[Any], Any], options: Any, *, fit_only: bool = False) -> tuple[Any, Any]:
    """``(result, options)``: the fastest winner of ``run`` (a tune on those :class:`~tflms.sim.records.SimOptions`,
    returning a :class:`~tflms.tune.result.TuneResult` or raising :class:`~tflms.errors.BudgetError`) and the options
    it was tuned on (the first on a tie).

    On the ``xla-clusters`` clock, unless ``options`` fix them already: without land cuts, and with them where that
    winner swaps or nothing fits (:func:`_with_and_without_cuts`); then, where the faster winner is a hybrid or
    nothing fits, both again with ``xla_clones_last`` (module doc). With ``fit_only`` (a search for the largest batch
    that fits) each further tune runs only where nothing fits. Raises the first tune's
    :class:`~tflms.errors.BudgetError` where nothing fits."""
    result, chosen, error = _with_and_without_cuts(run, options, fit_only)
    if options.clock == CLOCK_XLA_CLUSTERS and not options.xla_clones_last and (
            result is None or (not fit_only and hybrid(result))):
        if error is not None:
            error.candidates = ()
        last, last_options, _ = _with_and_without_cuts(run, dataclasses.replace(options, xla_clones_last=True),
                                                       fit_only)
        if last is not None and (result is None or last.best.sim.step_time_s < result.best.sim.step_time_s):
            return last, last_options
    if result is None:
        raise error
    return result, chosen


def _with_and_without_cuts(run: Callable[[Any], Any], options: Any, fit_only: bool
                           ) -> tuple[Any, Any, BudgetError | None]:
    """``(result or None, its options, the first tune's BudgetError or None)``: ``run(options)``, and where
    ``options`` are the ``xla-clusters`` clock's without cuts and the winner swaps or nothing fits (with ``fit_only``:
    only where nothing fits), ``run`` again with ``xla_land_cuts``; the faster winner (the first on a tie)."""
    try:
        first, error = run(options), None
    except BudgetError as err:
        first, error = None, err
    second = None
    cut = dataclasses.replace(options, xla_land_cuts=True)
    if options.clock == CLOCK_XLA_CLUSTERS and not options.xla_land_cuts and (
            first is None or (not fit_only and swaps(first))):
        if error is not None:  # (its candidates, graphs among them, are not held while the second tune runs)
            error.candidates = ()
        try:
            second = run(cut)
        except BudgetError:
            pass
    if second is not None and (first is None or second.best.sim.step_time_s < first.best.sim.step_time_s):
        return second, cut, error
    return first, options, error
