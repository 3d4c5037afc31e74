"""The largest batch that fits a budget, with and without tflms.

The step is traced once with an unknown batch dimension; each candidate batch
size re-sizes the same IR (``Graph.with_batch_size``), so no retracing happens.
Search: double until a batch does not fit, then bisect. With tflms, each step
asks the tuner only whether anything fits (``first_fit``); the fastest rewrite is
searched once, at the batch found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tflms.config import LMSConfig
from tflms.errors import BudgetError, ConfigError, GraphError
from tflms.ir.graph import Graph
from tflms.ir.tf_io import load_graph
from tflms.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
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
    evaluated: tuple[tuple[int, bool], ...]  # (batch, fits) in search order

    def to_dict(self) -> dict[str, Any]:
        out = {"batch_size": self.batch_size, "with_tflms": self.with_tflms,
               "evaluated": [list(e) for e in self.evaluated]}
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
    base = _graph_with_free_batch(source, args)
    cache: dict[int, tuple[bool, SimResult | None, TuneResult | None]] = {}
    order: list[tuple[int, bool]] = []

    def fits(batch: int) -> bool:
        if batch not in cache:
            graph = base.with_batch_size(batch)
            if with_tflms:
                try:
                    # judged as the pipeline tunes: in the enforced order unless the config turns it off (issue 48:
                    # without it the largest batch with tflms was about half the bench's)
                    tuned = tune(graph, budget=budget_bytes, profile=profile, config=config, strategies=strategies,
                                 sim_options=sim_options, first_fit=True, enforce_order=config.enforce_order is not False)
                    cache[batch] = (True, tuned.best.sim, tuned)
                except BudgetError:
                    cache[batch] = (False, None, None)
            else:
                sim = simulate(graph, profile, options=sim_options)
                cache[batch] = (sim.peak_with_margin_bytes <= budget_bytes, sim, None)
            order.append((batch, cache[batch][0]))
            if progress:
                progress(f"batch {batch}: {'fits' if cache[batch][0] else 'does not fit'}"
                         f"{' with tflms' if with_tflms else ' without tflms'}")
        return cache[batch][0]

    if not fits(start):
        return MaxBatchResult(0, with_tflms, None, None, tuple(order))
    low, high = start, start * 2
    while fits(high):
        low, high = high, high * 2
        if high > MAX_BATCH_LIMIT:
            raise GraphError(f"batch {low} still fits {budget_bytes} bytes: the step's memory does not seem to "
                             "grow with the batch dimension")
    while high - low > 1 and high > low * (1 + tolerance):
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    ok, sim, tuned = cache[low]
    if with_tflms and fastest:  # the search only asked "does anything fit?": now find the fastest fit
        tuned = tune(base.with_batch_size(low), budget=budget_bytes, profile=profile, config=config,
                     strategies=strategies, sim_options=sim_options, enforce_order=config.enforce_order is not False)
        sim = tuned.best.sim
    return MaxBatchResult(low, with_tflms, sim, tuned, tuple(order))
