"""The largest batch that fits a budget, with and without tflms.

The step is traced once with an unknown batch dimension; each candidate batch
size re-sizes the same IR (``Graph.with_batch_size``), so no retracing happens.
Search without tflms: double until a batch does not fit, then bisect (each probe one
simulation). With tflms each probe asks the tuner only whether anything fits
(``first_fit``), seconds to a minute on a large step, and the fastest rewrite is searched
once, at the batch found. Two things spare tunes (issue 48):

- **The swap-only bound** (:func:`tflms.sim.bounds.swap_only_bound`): no rewrite, swaps or
  recomputes in any order, needs less than the resident bytes plus the largest op's working
  set. The smallest batch where that, with the margin, exceeds the budget is found with the
  bound alone (a tenth of a second each on ResNet-50) and bounds the search from above.
- **Where a fit ends the search.** With a tolerance, the first probe goes where a fit ends
  the search: the cap divided by ``1 + tolerance``. A probe that fails reports the least
  need of every plan it tried; a step's need grows about linearly with its batch, from
  what it needs at batch 0 (where the unchanged step's needs put it), so the next probe
  goes where that line meets the budget, raised to where a fit ends the search. Bisection
  takes over where the line leaves the bracket, or after an interpolated probe fitted
  without ending the search. ResNet-50 at 224x224 on v100-16gb-pcie3: the cap is 1579, the
  first probe (1404) fails, the line through its need puts the second at 1364, which fits:
  two tunes (the bench's largest is 1347).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from tflms.config import LMSConfig
from tflms.errors import BudgetError, ConfigError, GraphError
from tflms.ir.graph import Graph
from tflms.ir.tf_io import load_graph
from tflms.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from tflms.sim.bounds import swap_only_bound
from tflms.sim.simulator import SimOptions, SimResult, simulate
from tflms.tune.tuner import DEFAULT_STRATEGIES, TuneResult, tune
from tflms.units import parse_bytes

#: Upper end of the doubling search (a guard against graphs whose memory does not grow with the batch).
MAX_BATCH_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class MaxBatchResult:
    """Largest fitting batch and what was predicted there."""

    batch_size: int  # 0 when even batch 1 does not fit
    with_tflms: bool
    sim: SimResult | None  # at batch_size (the chosen rewrite's simulation with tflms)
    tuned: TuneResult | None  # with tflms: the tuner's result at batch_size
    evaluated: tuple[tuple[int, bool], ...]  # (batch, fits) in search order, each a simulation or a tune
    #: batches found not to fit by the swap-only bound alone, without a tune (with tflms)
    bound_rejected: tuple[int, ...] = ()

    @property
    def upper(self) -> int | None:
        """The smallest batch found not to fit (by a probe or by the bound), or ``None``."""
        failed = [b for b, ok in self.evaluated if not ok] + list(self.bound_rejected)
        return min(failed) if failed else None

    def to_dict(self) -> dict[str, Any]:
        out = {"batch_size": self.batch_size, "with_tflms": self.with_tflms, "upper": self.upper,
               "evaluated": [list(e) for e in self.evaluated], "bound_rejected": list(self.bound_rejected)}
        if self.sim is not None:
            out["peak_bytes"] = self.sim.peak_with_margin_bytes
            out["step_time_s"] = self.sim.step_time_s
        if self.tuned is not None:
            out["strategy"] = self.tuned.strategy
            out["overhead"] = self.tuned.overhead
        return out


def _graph_with_free_batch(source: Any, args: tuple) -> Graph:
    graph = load_graph(source, *args)
    inputs = [op for op in graph if op.type in ("Placeholder", "_Arg") and op.outputs
              and op.outputs[0].dtype not in ("resource", "variant")]
    if not any(op.outputs[0].shape and op.outputs[0].shape[0] is None for op in inputs):
        raise GraphError("the step has no tensor with an unknown leading (batch) dimension: trace it with "
                         "tf.TensorSpec((None, ...)) inputs so that one trace serves every batch size")
    return graph


def max_batch(source: Any, *args: Any, budget: int | str | None = None,
              profile: str | HardwareProfile = DEFAULT_PROFILE, with_tflms: bool = True,
              config: LMSConfig | None = None, strategies=DEFAULT_STRATEGIES, sim_options: SimOptions | None = None,
              start: int = 1, progress: Callable[[str], None] | None = None, tolerance: float = 0.0,
              fastest: bool = True) -> MaxBatchResult:
    """The largest batch size whose step fits ``budget`` (default: the profile's memory).

    ``source`` is traced once (a ConcreteFunction or tf.function with ``args``
    given as ``tf.TensorSpec``s whose first dimension is ``None``, or an IR
    graph with unknown batch dimensions). ``start``: a batch known to fit, where the doubling starts.
    ``tolerance``: stop bisecting once the smallest batch found not to fit is within this fraction above the
    largest that fits (0: adjacent). ``fastest``: with tflms, tune the batch found for its fastest rewrite
    (``False``: the first fit found is kept, and ``sim``/``tuned`` are the first fit's).
    """
    if tolerance < 0:
        raise ConfigError(f"tolerance must be >= 0, got {tolerance}")
    profile = get_profile(profile)
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    if start < 1:
        raise ConfigError(f"start must be >= 1, got {start}")
    config = config or LMSConfig()
    sim_options = sim_options or SimOptions(host_device=config.host_device)
    probe = _Probes(_graph_with_free_batch(source, args), budget_bytes, profile, with_tflms, config, strategies,
                    sim_options, progress)
    fits = probe.fits
    if not fits(start):
        return probe.result(0, None, None)
    low = start
    high = probe.bound_cap(start)  # (with tflms: nothing fits from there, by the bound alone)
    if high is not None:
        probe.say(f"batch {high}: does not fit with tflms (the swap-only bound: {probe.bound_op(high)}'s working set, "
                  f"nor any larger batch)")
    if high is None:
        high = start * 2
        while fits(high):
            low, high = high, high * 2
            if high > MAX_BATCH_LIMIT:
                raise GraphError(f"batch {low} still fits {budget_bytes} bytes: the step's memory does not seem to "
                                 "grow with the batch dimension")
    if not with_tflms:  # each probe one simulation, the need nearly a line in the batch
        low = crossing(probe.need_without, budget_bytes, low, high) - 1
        high = low + 1
    interpolated_fit = False  # the last probe was interpolated and fitted without ending the search: bisect next
    while high - low > 1 and high > low * (1 + tolerance):
        # (only where the search stops within a tolerance: an exact search ends by adjacent batches, which bisection
        # reaches in fewer probes than a line approaching from one side)
        guess = None if interpolated_fit or tolerance <= 0 else probe.interpolate(high)
        if tolerance > 0 and ((guess is not None and low < guess < high) or high in probe.rejected):
            # high enough that a fit there ends the search
            guess = min(max(guess or 0, math.ceil(high / (1 + tolerance))), high - 1)
        interpolated = guess is not None and low < guess < high
        if not interpolated:
            guess = (low + high) // 2
        if fits(guess):
            low, interpolated_fit = guess, interpolated
        else:
            high, interpolated_fit = guess, False
    _, sim, tuned = probe.cache[low]
    if with_tflms and fastest:  # the search only asked "does anything fit?": now find the fastest fit
        tuned = tune(probe.base.with_batch_size(low), budget=budget_bytes, profile=profile, config=config,
                     strategies=strategies, sim_options=sim_options, enforce_order=config.enforce_order is not False)
        sim = tuned.best.sim
    return probe.result(low, sim, tuned)


def crossing(need: Callable[[int], int], budget_bytes: int, low: int, high: int) -> int:
    """The smallest batch in ``(low, high]`` whose ``need`` exceeds ``budget_bytes``, where ``need(low)`` does not and
    ``need(high)`` does, and ``need`` grows with the batch. A need is nearly a line in the batch (a step's buffers
    grow with it; the swap-only bound is the largest of such lines), so a secant through the bracket's ends lands
    next to the crossing: two or three needs on ResNet-50 where bisection takes ten. Bisection takes every other
    step where a secant did not end the search (a line that bends approaches from one side)."""
    ends = {low: need(low), high: need(high)}
    secant = True
    while high - low > 1:
        guess = None
        if secant and ends[high] > ends[low]:
            guess = low + int((budget_bytes - ends[low]) * (high - low) / (ends[high] - ends[low]))
        if guess is None or not low < guess < high:
            guess, secant = (low + high) // 2, False
        ends[guess] = need(guess)
        if ends[guess] > budget_bytes:
            high = guess
        elif secant and guess + 1 < high and need(guess + 1) > budget_bytes:
            return guess + 1
        else:
            low = guess
        secant = not secant
    return high


class _Probes:
    """:func:`max_batch`'s answers to "does batch ``b`` fit?", each computed once, and what the failures needed."""

    def __init__(self, base: Graph, budget_bytes: int, profile: HardwareProfile, with_tflms: bool,
                 config: LMSConfig, strategies, sim_options: SimOptions, progress: Callable[[str], None] | None):
        self.base, self.budget_bytes, self.profile, self.with_tflms = base, budget_bytes, profile, with_tflms
        self.config, self.strategies, self.sim_options, self.progress = config, strategies, sim_options, progress
        self.cache: dict[int, tuple[bool, SimResult | None, TuneResult | None]] = {}
        self.order: list[tuple[int, bool]] = []
        self.rejected: list[int] = []  # by the swap-only bound, without a tune
        self._bounds: dict[int, tuple[int, str]] = {}  # batch -> (the swap-only bound with the margin, its op)
        self.needs: dict[int, int] = {}  # a failed batch -> the least need of what was tried there
        self.plain: dict[int, int] = {}  # a batch -> the unchanged step's need there

    def result(self, batch: int, sim: SimResult | None, tuned: TuneResult | None) -> MaxBatchResult:
        return MaxBatchResult(batch, self.with_tflms, sim, tuned, tuple(self.order), tuple(sorted(self.rejected)))

    def bound_op(self, batch: int) -> str:
        return self._bounds[batch][1]

    def say(self, message: str) -> None:
        if self.progress:
            self.progress(message)

    def _margin(self, peak: int) -> int:
        return peak + int(peak * self.sim_options.margin_fraction) + self.sim_options.margin_bytes

    def bound_rejects(self, batch: int) -> bool:
        """Whether the swap-only bound alone says that nothing fits at ``batch`` (with tflms; recorded)."""
        if not self.with_tflms or (batch in self.cache and batch not in self.rejected):
            return False
        if self._bound_need(batch) <= self.budget_bytes:
            return False
        if batch not in self.cache:
            self.cache[batch] = (False, None, None)
            self.rejected.append(batch)
        return True

    def bound_cap(self, start: int) -> int | None:
        """With tflms, the smallest batch above ``start`` that the swap-only bound rejects (doubling, then bisection,
        with the bound alone: about a tenth of a second each on ResNet-50); ``None`` without tflms, or past
        :data:`MAX_BATCH_LIMIT`."""
        if not self.with_tflms:
            return None
        low, high = start, start * 2
        while not self.bound_rejects(high):
            low, high = high, high * 2
            if high > MAX_BATCH_LIMIT:
                return None
        high = crossing(self._bound_need, self.budget_bytes, low, high)
        self.bound_rejects(high)  # (recorded)
        return high

    def _bound_need(self, batch: int) -> int:
        """The swap-only bound at ``batch`` with the margin (memoised)."""
        if batch not in self._bounds:
            bound = swap_only_bound(self.base.with_batch_size(batch), self.sim_options)
            self._bounds[batch] = (self._margin(bound.bound_bytes), bound.op)
        return self._bounds[batch][0]

    def need_without(self, batch: int) -> int:
        """The unchanged step's need at ``batch`` (a probe without tflms, recorded)."""
        self.fits(batch)
        return self.cache[batch][1].peak_with_margin_bytes

    def fits(self, batch: int) -> bool:
        if batch in self.cache:
            return self.cache[batch][0]
        if self.bound_rejects(batch):
            return False
        graph = self.base.with_batch_size(batch)
        if self.with_tflms:
            try:
                # judged as the pipeline tunes: in the enforced order unless the config turns it off (issue 48:
                # without it the largest batch with tflms was about half the bench's)
                tuned = tune(graph, budget=self.budget_bytes, profile=self.profile, config=self.config,
                             strategies=self.strategies, sim_options=self.sim_options, first_fit=True,
                             enforce_order=self.config.enforce_order is not False)
                self.cache[batch] = (True, tuned.best.sim, tuned)
                self.plain[batch] = tuned.baseline.peak_with_margin_bytes
            except BudgetError as err:
                self.cache[batch] = (False, None, None)
                tried = [c.sim.peak_with_margin_bytes for c in getattr(err, "candidates", ())]
                if tried:
                    self.needs[batch] = min(tried)
                if getattr(err, "baseline", None) is not None:
                    self.plain[batch] = err.baseline.peak_with_margin_bytes
        else:
            sim = simulate(graph, self.profile, options=self.sim_options)
            self.cache[batch] = (sim.peak_with_margin_bytes <= self.budget_bytes, sim, None)
            self.plain[batch] = self.needs[batch] = sim.peak_with_margin_bytes
        self.order.append((batch, self.cache[batch][0]))
        self.say(f"batch {batch}: {'fits' if self.cache[batch][0] else 'does not fit'}"
                  f"{' with tflms' if self.with_tflms else ' without tflms'}")
        return self.cache[batch][0]

    def interpolate(self, high: int) -> int | None:
        """Where the need grows to the budget, on the line from the need at batch 0 through the least need found at
        the failed batch ``high``; ``None`` where that is unknown. The need at batch 0 (weights, optimizer slots and
        what does not grow with the batch) is where the unchanged step's needs at the two largest batches probed put
        it."""
        if high not in self.needs or len(self.plain) < 2:
            return None
        (b1, p1), (b2, p2) = sorted(self.plain.items())[-2:]
        at_zero = p1 - (p2 - p1) * b1 / (b2 - b1)
        need = self.needs[high]
        if not at_zero < self.budget_bytes < need:
            return None
        return int(high * (self.budget_bytes - at_zero) / (need - at_zero))
