"""Does a size fit with a method, and the largest size that does: the benchmark's search."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .common import (BOUND, HEADROOM, KERAS_REMAT_MODES, METHODS, QUICK_DISTANCE_PROBES, SEARCH_LIMIT,
                     TRACED_METHODS, say)
from .models import MODELS, Steps, VariantError, size_amount, size_label


@dataclasses.dataclass
class Probe:
    fits: bool
    sim: Any = None  # SimResult of the graph judged (None when answered without simulating)
    ops: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class MethodResult:
    method: str
    max_size: int = 0
    upper: int | None = None  # smallest size known not to fit
    probes: list = dataclasses.field(default_factory=list)
    search_s: float = 0.0
    overhead: float | None = None  # at the common size; None = does not fit there
    rewrite_s: float = 0.0
    ops: int = 0
    sim: Any = None  # at the common size
    detail: str = ""
    common: int = 0  # the common size the overhead refers to
    # at max_size: simulated step time, samples per second, and predicted step over the step-time bound
    step_s_at_max: float | None = None
    samples_per_s_at_max: float | None = None
    time_bound_ratio_at_max: float | None = None
    # the same step over the bound across the peak (TimeBound.across_bound_s): copies out and back cannot overlap
    time_across_ratio_at_max: float | None = None
    # tflms methods: the same ratio for the plan the max-size probe found first (a yes/no search), and for the
    # full tune's choice before pruning (tflms.tune.prune); time_bound_ratio_at_max is the full tune's choice
    time_bound_ratio_first_fit_at_max: float | None = None
    time_bound_ratio_unpruned_at_max: float | None = None
    # the least time/bound any swap-only rewrite reaches at max_size, in any order (tflms.sim.bounds.any_order_time_bound)
    floor_bound_ratio_at_max: float | None = None
    # a traced method whose step could not be built or traced: the error's first line (models.VariantError), shown
    # instead of its numbers
    error: str | None = None
    # bench.py --curve: (batch, simulated step seconds, or None where the method does not fit that batch)
    curve: list = dataclasses.field(default_factory=list)


def size_label_long(model: str, size: int) -> str:
    """``"batch 256"`` or ``"volume 208x192x192"``: a size of ``model`` as progress lines and details name it."""
    kind = "volume" if MODELS[model].kind == "resolution" else "batch"
    return f"{kind} {size_label(model, size)}"


def budget_for(model: str, profile, budget: int | None) -> int:
    """The bytes a method must fit in: ``--budget``, else the model's own (``mlp-tiny``), else the profile's memory."""
    return budget or MODELS[model].budget_bytes or profile.memory_bytes


class Evaluator:
    """Answers "does ``size`` fit with ``method``?" for one model on one profile, caching every answer."""

    def __init__(self, steps: Steps, model: str, profile, budget_bytes: int, exact: bool, options=None):
        from tflms.sim import SimOptions
        self.steps, self.model, self.profile, self.budget = steps, model, profile, budget_bytes
        self.options = options or SimOptions()  # margin_fraction: the headroom, the same for every method
        self.rewrite_options = rewrite_options(self.options)  # tflms's and grappler's rewrites: no XLA
        self.exact = exact  # tflms-distance probes: the tuner's whole search (True) or QUICK_DISTANCE_PROBES
        self.cache: dict[tuple[str, int], Probe] = {}
        self.errors: dict[str, str] = {}  # traced methods whose step failed -> the error's first line

    def fits(self, method: str, size: int) -> bool:
        """Whether ``size`` fits with ``method``; ``False`` without probing once the method's step failed to build
        or trace (:attr:`errors`)."""
        if method in self.errors:
            return False
        key = (method, size)
        if key not in self.cache:
            t0 = time.perf_counter()
            probe = (self._traced(method, size) if method in TRACED_METHODS
                     else getattr(self, "_" + method.replace("-", "_"))(size))
            probe.seconds = time.perf_counter() - t0
            self.cache[key] = probe
            say(f"{self.model} {self.profile.name} {method}: {self.label(size)} "
                f"{'fits' if probe.fits else 'does not fit'}"
                f"{f' (peak {probe.sim.peak_with_margin_bytes / 2**30:.2f} GiB)' if probe.sim is not None else ''}"
                f" [{probe.seconds:.1f} s]")
        return self.cache[key].fits

    def label(self, size: int) -> str:
        return size_label_long(self.model, size)

    def _fits(self, sim) -> bool:
        """The tuner's verdict on a simulation: the peak with headroom within the budget and the swapped
        tensors within the profile's host memory (``tune``'s ``host_budget`` default)."""
        return sim.peak_with_margin_bytes <= self.budget and sim.host_peak_bytes <= self.profile.host_memory_bytes

    def _none(self, size):
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        sim = simulate(graph, self.profile, options=self.options)
        return Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(graph))

    def _swap_only_bound(self, size):
        """The swap-only memory bound with the same headroom: no swap rewrite in any order fits beyond it.

        Two conditions (docs/design.md, "Bounds"): the largest op's working set fits the accelerator, and
        what some moment of the step holds in every order (:func:`tflms.sim.footprint.footprint_bound`)
        fits the accelerator and the host together (swapping moves bytes, it does not remove them).
        """
        from tflms.sim.bounds import swap_only_bound
        from tflms.sim.footprint import footprint_bound
        graph, _ = self.steps.graph(self.model, "plain", size)
        bound = swap_only_bound(graph, self.options).bound_bytes
        need = bound + int(bound * self.options.margin_fraction) + self.options.margin_bytes
        if need > self.budget:
            return Probe(False, None, len(graph))
        device = int((self.budget - self.options.margin_bytes) / (1 + self.options.margin_fraction))
        fits = footprint_bound(graph, self.options).fits(device, self.profile.host_memory_bytes)
        return Probe(fits, None, len(graph))

    def _tune(self, size, strategies, enforce_order=False):
        from tflms.errors import BudgetError
        from tflms.tune.tuner import tune
        graph, _ = self.steps.graph(self.model, "plain", size)
        try:
            result = tune(graph, budget=self.budget, profile=self.profile, strategies=strategies, first_fit=True,
                          sim_options=self.rewrite_options, enforce_order=enforce_order)
        except BudgetError:
            return Probe(False)
        return Probe(True, result.best.sim, len(result.graph))

    def _tflms_distance(self, size):
        if self.fits("none", size):
            return Probe(True)
        if self.exact:
            return self._tune(size, ["tflms-distance"])
        from tflms.analysis.cto import analyze_graph
        from tflms.config import LMSConfig
        from tflms.passes.swaps import apply_swaps
        from tflms.policies.tflms_rules import plan_swaps
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        analysis = analyze_graph(graph)
        best = None
        for params in QUICK_DISTANCE_PROBES:
            plan = plan_swaps(analysis, LMSConfig(**params), accelerator_device="/device:GPU:0")
            rewritten = apply_swaps(graph, plan).graph
            sim = simulate(rewritten, self.profile, options=self.rewrite_options)
            if best is None or (self._fits(sim), -sim.peak_with_margin_bytes) > (
                    best.fits, -best.sim.peak_with_margin_bytes):
                best = Probe(self._fits(sim), sim, len(rewritten))
            if best.fits:
                break
        return best

    def _tflms_best(self, size):
        if self.fits("tflms-distance", size):
            return Probe(True)
        # Every strategy, judged in the enforced order: a distance plan the rules' probe saw miss in level
        # order can fit once the order pass pins its schedule.
        from tflms.tune.tuner import DEFAULT_STRATEGIES
        return self._tune(size, list(DEFAULT_STRATEGIES), enforce_order=True)

    def _grappler(self, size):
        from tflms.baselines.grappler_swap import grappler_swap
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        result = grappler_swap(graph, self.profile, budget=self.budget)
        sim = simulate(result.graph, self.profile, options=self.rewrite_options)
        return Probe(self._fits(sim), sim, len(result.graph))

    def _traced(self, method, size):
        """A method judged as its own traced step (:data:`TRACED_METHODS`); a step that fails to build or trace
        fits nowhere, its error recorded in :attr:`errors`."""
        from tflms.sim import simulate
        try:
            graph, _ = self.steps.graph(self.model, method, size)
        except VariantError as err:
            self.errors[method] = err.line
            return Probe(False)
        sim = simulate(graph, self.profile, options=self.options)
        return Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(graph))


def search_max(fits: Callable[[int], bool], start: int, bisect_steps: int | None,
               next_try: int | None = None) -> tuple[int, int | None]:
    """``(largest size found to fit, smallest size found not to)``.

    From ``start``: if it fits, try ``next_try`` (when larger) and then double until a
    size does not fit; if it does not, halve until one does. Then bisect
    ``bisect_steps`` times (``None``: until the two are adjacent).
    """
    start = max(1, start)
    if fits(start):
        low, high = start, None
        if next_try is not None and next_try > start:
            if fits(next_try):
                low = next_try
            else:
                high = next_try
        while high is None:
            if low * 2 > SEARCH_LIMIT:
                return low, None
            if fits(low * 2):
                low *= 2
            else:
                high = low * 2
    else:
        low, high = 0, start
        while high > 1:
            if fits(high // 2):
                low = high // 2
                break
            high //= 2
        if low == 0:
            return 0, high
    steps = 0
    while high - low > 1 and (bisect_steps is None or steps < bisect_steps):
        mid = (low + high) // 2
        steps += 1
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, high


def rewrite_options(options):
    """The simulator options tflms's and grappler's rewrites are priced with: their steps run without XLA (tflms turns
    it off for the steps it manages until issue 47 keeps it; grappler's swapping is off under XLA), so on the graph
    clock where the bench's clock is ``xla``. The unchanged step and the traced checkpointing steps keep the bench's
    clock: under ``--clock xla`` they are what a Keras 3 user runs on a GPU by default."""
    import dataclasses

    from tflms.sim.clock import CLOCK_GRAPH, CLOCK_XLA
    return dataclasses.replace(options, clock=CLOCK_GRAPH) if getattr(options, "clock", None) == CLOCK_XLA else options


def run_model_profile(steps: Steps, model: str, profile_name: str, budget: int | None,
                      bisect_steps: int | None, headroom: float = HEADROOM, clock: str = "auto"
                      ) -> dict[str, MethodResult]:
    from tflms.sim import SimOptions, get_profile

    profile = get_profile(profile_name)
    budget_bytes = budget_for(model, profile, budget)
    options = SimOptions(margin_fraction=headroom, clock=clock)
    ev = Evaluator(steps, model, profile, budget_bytes, exact=bisect_steps is None, options=options)
    results: dict[str, MethodResult] = {}
    # Where each search starts, and the first larger size it tries (the previous method's first miss).
    plan = {"none": ("none", False), "tflms-distance": ("none", True), "tflms-best": ("tflms-distance", True),
            "grappler": ("none", True), **{m: ("none", True) for m in TRACED_METHODS}}
    for method in METHODS:
        t0 = time.perf_counter()
        if method == "none":
            start, next_try = 1, None
        else:
            ref = results[plan[method][0]]
            start, next_try = ref.max_size, ref.upper
        low, high = search_max(lambda s: ev.fits(method, s), start, bisect_steps, next_try)
        res = MethodResult(method, low, high, [(s, p.fits) for (m, s), p in ev.cache.items() if m == method],
                           time.perf_counter() - t0, error=ev.errors.get(method))
        results[method] = res
        if res.error is not None:
            say(f"{model} {profile_name} {method}: failed: {res.error}")
            continue
        say(f"{model} {profile_name} {method}: largest {ev.label(low)}"
            f"{f' (< {ev.label(high)})' if high is not None else ''} in {res.search_s:.1f} s")
    # Searches with different starts end at different granularities: probe the unchanged step at every
    # size another method probed inside none's open interval, then read every maximum off all probes
    # (a size none fits is fitted by tflms-distance, one tflms-distance fits by tflms-best).
    none = results["none"]
    for size in sorted({s for (_, s) in ev.cache}):
        if none.max_size < size and (none.upper is None or size < none.upper):
            ev.fits("none", size)
    implied = {"none": (), "tflms-distance": ("none",), "tflms-best": ("none", "tflms-distance"),
               "grappler": (), **{m: () for m in TRACED_METHODS}}
    for method, r in results.items():
        if r.error is not None:  # no size was judged: no maximum, no bracket
            r.max_size, r.upper, r.probes = 0, None, []
            continue
        known = {}
        for (m, size), probe in ev.cache.items():
            if m == method or (m in implied[method] and probe.fits):
                known[size] = known.get(size, False) or probe.fits
        fitting = [size for size, ok in known.items() if ok]
        r.max_size = max(fitting, default=0)
        failing = [size for size, ok in known.items() if not ok and size > r.max_size]
        r.upper = min(failing) if failing else (r.upper if r.upper and r.upper > r.max_size else None)
        r.probes = sorted(known.items())
    # The common size: the smallest maximum among the methods that certainly extend none's.
    extended = [r.max_size for r in results.values() if r.method != "none"
                and (none.upper is None or r.max_size >= none.upper)]
    common = max(1, min(extended) if extended else none.max_size)
    say(f"{model} {profile_name}: maxima " + ", ".join(f"{m} {ev.label(r.max_size)}" for m, r in results.items()))
    say(f"{model} {profile_name}: common {ev.label(common)}; full tune and rewrites there")
    run_methods_at(steps, model, profile, budget_bytes, options, common, results)
    _at_max(ev, results, implied)
    # The swap-only bound under the same headroom, searched like a method from tflms-best's maximum.
    t0 = time.perf_counter()
    top = results["tflms-best"]
    low, high = search_max(lambda s: ev.fits(BOUND, s), max(top.max_size, 1), bisect_steps, top.upper)
    results[BOUND] = MethodResult(BOUND, low, high, [(s, p.fits) for (m, s), p in ev.cache.items() if m == BOUND],
                                  time.perf_counter() - t0, common=common, detail="resident + largest working set")
    results[BOUND].ops = ev.cache[(BOUND, low)].ops if (BOUND, low) in ev.cache else 0  # the graph judged there
    say(f"{model} {profile_name}: swap-only bound {ev.label(low)}; "
        + ", ".join(f"{m} {size_amount(model, r.max_size) / size_amount(model, low):.0%}"
                    for m, r in results.items() if m != BOUND and low))
    return results


#: A text file every full tune's progress lines go to (``bench.py --tune-log``; ``None``: nowhere): each candidate the
#: tuner judged, its peak with headroom and step time, after the model, profile, size and seconds into the tune.
tune_log = None


def run_methods_at(steps: Steps, model: str, profile, budget_bytes: int, options, size: int,
                   results: dict[str, MethodResult]) -> None:
    """Every method at one ``size``: its overhead, graph, simulation and choice, into ``results``.

    The overhead is the simulated step time over the unchanged step's at ``size`` on a GPU with
    unlimited memory, minus 1; ``None`` when the method's peak with headroom exceeds ``budget_bytes``.
    tflms: one full tune with every strategy (``enforce_order=True``), ``tflms-distance`` read off
    it; grappler: its swapping rewrite of the plain step; checkpoint-segments and keras-remat: their own
    steps traced (a step that fails to build or trace gets its error's first line, ``MethodResult.error``).
    Used at the common size of a search (:func:`run_model_profile`) and at sizes given on the
    command line (:func:`run_at_size`).
    """
    from tflms.baselines.grappler_swap import grappler_swap
    from tflms.errors import BudgetError
    from tflms.passes.swaps import apply_swaps
    from tflms.sim import simulate
    from tflms.tune.tuner import tune

    plain, _ = steps.graph(model, "plain", size)
    baseline = simulate(plain, profile, options=options)
    rewritten = rewrite_options(options)  # tflms's and grappler's steps run without XLA

    def fits_overhead(sim):
        if sim is None or sim.peak_with_margin_bytes > budget_bytes:
            return None
        return sim.step_time_s / baseline.step_time_s - 1.0

    for r in results.values():
        r.common = size
        r.detail = size_label_long(model, size)
    none = results["none"]
    none.ops, none.sim, none.overhead = len(plain), baseline, fits_overhead(baseline)

    # One full tune with every strategy. The tuner runs the distance search first, so the candidates it
    # reports before the first idle-time one are exactly what tune(strategies=["tflms-distance"]) would
    # evaluate: its wall time is the time of the last of them, its choice the fastest of them that fits. Where
    # the full tune skips the swap searches (their floor is slower than its choice), the distance rules run alone.
    t0 = time.perf_counter()
    stamps: list[tuple[float, str]] = []

    def progress(msg: str) -> None:
        stamps.append((time.perf_counter() - t0, msg))
        if tune_log is not None:
            tune_log.write(f"{model} {profile.name} {size} {stamps[-1][0]:8.1f} s  {msg}\n")
            tune_log.flush()
    try:
        tuned = tune(plain, budget=budget_bytes, profile=profile, sim_options=rewritten, enforce_order=True,
                     progress=progress)
    except BudgetError as err:
        tuned, error = None, str(err)
    total = time.perf_counter() - t0
    best, dist = results["tflms-best"], results["tflms-distance"]
    best.rewrite_s = total
    distance_stamps = [t for t, msg in stamps if msg.startswith("tflms-distance ")]
    dist.rewrite_s = distance_stamps[-1] if distance_stamps else total
    if tuned is None:
        best.detail += f"; {error[:120]}"
        dist.detail += "; nothing fits"
    else:
        best.overhead, best.ops, best.sim = fits_overhead(tuned.best.sim), len(tuned.graph), tuned.best.sim
        best.detail += f"; chose {tuned.strategy} {tuned.best.params}"
        choices = [c for c in tuned.candidates if c.fits and c.strategy in ("none", "tflms-distance")]
        if tuned.swap_searches_skipped:
            # the full tune left the distance rules out (no swap plan could beat its choice): they run alone, timed
            # on their own
            t1 = time.perf_counter()
            try:
                alone = tune(plain, budget=budget_bytes, profile=profile, sim_options=rewritten, enforce_order=True,
                             strategies=["tflms-distance"])
                choices = [c for c in alone.candidates if c.fits and c.strategy in ("none", "tflms-distance")]
            except BudgetError:
                choices = []
            dist.rewrite_s = time.perf_counter() - t1
        if choices:
            pick = min(choices, key=lambda c: (c.sim.step_time_s, c.swapped_bytes))
            graph = plain if pick.plan is None else apply_swaps(plain, pick.plan).graph
            dist.overhead, dist.ops, dist.sim = fits_overhead(pick.sim), len(graph), pick.sim
            dist.detail += f"; chose {pick.strategy} {pick.params}"
        else:
            dist.detail += "; nothing fits"
    say(f"{model} {profile.name}: full tune in {total:.1f} s ({len(stamps)} candidates): "
        f"distance {'-' if dist.overhead is None else f'{100 * dist.overhead:+.1f}%'}, "
        f"best {'-' if best.overhead is None else f'{100 * best.overhead:+.1f}%'}")

    r = results["grappler"]
    swapped = grappler_swap(plain, profile, budget=budget_bytes)
    r.sim = simulate(swapped.graph, profile, options=rewritten)
    r.rewrite_s, r.ops, r.overhead = swapped.total_s, len(swapped.graph), fits_overhead(r.sim)
    r.detail += f"; {len(swapped.swaps)} swaps of {swapped.swapped_bytes / 2**30:.2f} GiB"
    for method in TRACED_METHODS:
        r = results[method]
        try:
            graph, trace_s = steps.graph(model, method, size)
        except VariantError as err:
            r.error = err.line
            r.detail += f"; failed: {err.line}"
            continue
        r.sim = simulate(graph, profile, options=options)
        r.rewrite_s, r.ops, r.overhead = trace_s, len(graph), fits_overhead(r.sim)
        r.detail += (f"; {len(steps.checkpointing(model).segments)} segments" if method == "checkpoint-segments"
                     else f"; keras.RematScope(mode={KERAS_REMAT_MODES[method]!r})")


def run_at_size(steps: Steps, model: str, profile_name: str, budget: int | None, size: int,
                headroom: float = HEADROOM, clock: str = "auto") -> dict[str, MethodResult]:
    """Every method at ``size`` only, without searching any maximum (``bench.py --at``).

    The same runs as at a search's common size (:func:`run_methods_at`), so that figures taken at a
    fixed size (e.g. an earlier report's common batch) can be compared like for like. ``max_size`` is
    left 0: nothing was searched.
    """
    from tflms.sim import SimOptions, get_profile
    profile = get_profile(profile_name)
    budget_bytes = budget_for(model, profile, budget)
    results = {method: MethodResult(method) for method in METHODS}
    say(f"=== {model} on {profile_name} at {size_label_long(model, size)} (headroom {headroom:g})")
    run_methods_at(steps, model, profile, budget_bytes, SimOptions(margin_fraction=headroom, clock=clock), size,
                   results)
    return results


def _sim_at(ev: Evaluator, method: str, size: int, implied: dict) -> Any:
    """The simulation that answered ``method`` at ``size`` (or the method that implied the fit)."""
    for m in (method,) + tuple(reversed(implied[method])):
        probe = ev.cache.get((m, size))
        if probe is not None and probe.fits and probe.sim is not None:
            return probe.sim
    return None


#: Methods whose step at the maximum is the full tune's choice (the probes answer "does it fit?" with the first
#: plan that does): tflms-distance with the distance rules alone in level order, tflms-best with every strategy
#: in the enforced order, as at the common size.
FULL_TUNE_AT_MAX = ("tflms-distance", "tflms-best")


def _full_tune(ev: Evaluator, method: str, size: int):
    """``(winner's sim, fastest fit before pruning's sim or None)`` of the full tune of ``method`` at ``size``;
    ``None`` when it finds no fit (the quick distance probes plan with other parameters than the tuner's ladder)."""
    from tflms.errors import BudgetError
    from tflms.tune.prune import EARLIER_PARAM, MERGED_PARAM, PRUNED_PARAM
    from tflms.tune.tuner import DEFAULT_STRATEGIES, tune
    graph, _ = ev.steps.graph(ev.model, "plain", size)
    best = method == "tflms-best"
    t0 = time.perf_counter()
    try:
        result = tune(graph, budget=ev.budget, profile=ev.profile, sim_options=rewrite_options(ev.options),
                      enforce_order=best,
                      strategies=list(DEFAULT_STRATEGIES) if best else ["tflms-distance"])
    except BudgetError:
        say(f"{ev.model} {ev.profile.name} {method}: the full tune at {ev.label(size)} finds no fit")
        return None
    changes = (PRUNED_PARAM, MERGED_PARAM, EARLIER_PARAM)
    # (None where every fit was pruned: a hybrid ordered before its swaps keeps its nested tune's pruned plan alone)
    unpruned = min((c for c in result.candidates if c.fits and not any(k in c.params for k in changes)),
                   key=lambda c: c.sim.step_time_s, default=None)
    before = "" if unpruned is None else f" (before pruning {unpruned.sim.step_time_s:.2f} s)"
    say(f"{ev.model} {ev.profile.name} {method}: full tune at {ev.label(size)} in {time.perf_counter() - t0:.1f} s: "
        f"{result.best.strategy} {result.best.params}, step {result.best.sim.step_time_s:.2f} s{before}")
    return result.best.sim, None if unpruned is None else unpruned.sim


@dataclasses.dataclass(frozen=True)
class StepBounds:
    """The step-time bounds at one size (:func:`time_bounds`)."""

    bound_s: float  # issue 11's max(compute, D / L): the smaller of level order's and the schedule's
    across_s: float  # the bound across the peak, likewise
    floor: Any  # tflms.sim.bounds.AnyOrderTimeBound: the least step time of any swap-only rewrite in any order

    @property
    def floor_s(self) -> float:
        return self.floor.floor_s


def time_bounds(graph, profile, budget_bytes: int, options) -> StepBounds:
    """The step-time bounds of ``graph`` at the budget the headroom of ``options`` leaves: issue 11's and
    the bound across the peak (the smaller of level order's and the schedule's, tflms.sim.bounds.step_time_bound)
    and the least step time of any swap-only rewrite in any order (tflms.sim.bounds.any_order_time_bound)."""
    from tflms.schedule import schedule_order
    from tflms.sim.bounds import any_order_time_bound, step_time_bound
    usable = int((budget_bytes - options.margin_bytes) / (1 + options.margin_fraction))
    level = step_time_bound(graph, profile, usable, options=options)
    ordered = step_time_bound(graph, profile, usable, options=options,
                              order=schedule_order(graph, options=options, profile=profile))
    return StepBounds(min(level.bound_s, ordered.bound_s), min(level.across_bound_s, ordered.across_bound_s),
                      any_order_time_bound(graph, profile, usable, options=options))


def _at_max(ev: Evaluator, results: dict[str, MethodResult], implied: dict) -> None:
    """Step time, throughput and time_bound_ratio of every method at its own maximum.

    For :data:`FULL_TUNE_AT_MAX` the step is the full tune's choice there (what a user of the tuner gets),
    not the plan the yes/no probe found first; both are recorded, and the choice before pruning.

    The step-time bound (tflms.sim.bounds.step_time_bound) is taken at the budget the headroom leaves,
    in level order and in the memory-aware schedule of the unswapped step; the smaller of the two (the
    enforced order may lower the unswapped peak, and with it the bytes that must cross the link).
    """
    from tflms.sim.bounds import time_bound_ratio
    bounds: dict[tuple[int, str], StepBounds] = {}
    for r in results.values():
        if not r.max_size:
            continue
        sim = _sim_at(ev, r.method, r.max_size, implied)
        if sim is None:
            continue
        first_fit, unpruned = sim, None
        if r.method in FULL_TUNE_AT_MAX:
            tuned = _full_tune(ev, r.method, r.max_size)
            if tuned is not None:
                sim, unpruned = tuned
        samples = r.max_size if MODELS[ev.model].kind == "batch" else 1
        r.step_s_at_max, r.samples_per_s_at_max = sim.step_time_s, samples / sim.step_time_s
        # the bound on the clock the method's step was priced on (under --clock xla: the swap rewrites on the graph
        # clock, the unchanged and the checkpointed steps on the xla one)
        opts = rewrite_options(ev.options) if getattr(sim, "clock", None) == "graph" else ev.options
        key = (r.max_size, getattr(opts, "clock", ""))
        if key not in bounds:
            graph, _ = ev.steps.graph(ev.model, "plain", r.max_size)
            bounds[key] = time_bounds(graph, ev.profile, ev.budget, opts)
        at = bounds[key]
        if 0 < at.bound_s < float("inf"):
            r.time_bound_ratio_at_max = time_bound_ratio(sim.step_time_s, at.bound_s)
            r.time_across_ratio_at_max = time_bound_ratio(sim.step_time_s, at.across_s)
            r.floor_bound_ratio_at_max = at.floor_s / at.bound_s
            if r.method in FULL_TUNE_AT_MAX:
                r.time_bound_ratio_first_fit_at_max = time_bound_ratio(first_fit.step_time_s, at.bound_s)
                if unpruned is not None:
                    r.time_bound_ratio_unpruned_at_max = time_bound_ratio(unpruned.step_time_s, at.bound_s)
