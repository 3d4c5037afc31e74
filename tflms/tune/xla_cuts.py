"""Land cuts or none: a step that keeps XLA is tuned with the copies' readers in clusters of their own too (issue 47).

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


def tune_xla(run: Callable[[Any], Any], options: Any, *, fit_only: bool = False) -> tuple[Any, bool]:
    """``(result, land_cuts)``: ``run(options)`` (a tune on those :class:`~tflms.sim.records.SimOptions`, returning
    a :class:`~tflms.tune.result.TuneResult` or raising :class:`~tflms.errors.BudgetError`), and where ``options``
    are the ``xla-clusters`` clock's without cuts and the winner swaps or nothing fits, ``run`` again with
    ``xla_land_cuts``; the faster winner (the first on a tie) and whether it was tuned with the cuts. With
    ``fit_only`` (a search for the largest batch that fits) the second tune runs only where nothing fits. Raises
    the first tune's :class:`~tflms.errors.BudgetError` where neither fits."""
    try:
        first, error = run(options), None
    except BudgetError as err:
        first, error = None, err
    second = None
    if options.clock == CLOCK_XLA_CLUSTERS and not options.xla_land_cuts and (
            first is None or (not fit_only and swaps(first))):
        if error is not None:  # (its candidates, graphs among them, are not held while the second tune runs)
            error.candidates = ()
        try:
            second = run(dataclasses.replace(options, xla_land_cuts=True))
        except BudgetError:
            pass
    if second is not None and (first is None or second.best.sim.step_time_s < first.best.sim.step_time_s):
        return second, True
    if first is None:
        raise error
    return first, options.xla_land_cuts
