"""The rewrite pipeline every entry point runs: :func:`rewrite_step`.

``tflms.function``, the Keras callback, the SavedModel commands and the
:func:`rewrite` / :func:`analyze` API all call :func:`rewrite_step`, so a fix
made here reaches every user. Its stages, in order:

1. **load**: the graph TensorFlow would run: a ``ConcreteFunction`` is first optimized by
   grappler as TensorFlow does at its first call (:func:`tflms.ir.preoptimize.preoptimize`),
   so that the swaps cannot change grappler's treatment of the user's ops
   (docs/design.md, "Bitwise under grappler"); then into the IR
   (:func:`tflms.ir.tf_io.load_graph`);
2. **analyze**: categorized topological ordering, once (:func:`tflms.analysis.cto.analyze_graph`);
3. **choose**: the tuner over every policy for the config's budget and profile
   (:func:`tflms.tune.tuner.tune`), or the TFLMS rules with the config's
   parameters (:func:`tflms.policies.tflms_rules.plan_swaps`);
4. **passes**, each returning a :class:`~tflms.passes.PassResult` and linted:
   swaps (:func:`~tflms.passes.apply_swaps`), compression
   (:func:`~tflms.compress.rewrite.apply_compression`, when ``config.compress``
   asks for it), placement per replica (:func:`~tflms.passes.place_swaps`), and the
   enforced order (:func:`tflms.passes.order.enforce_order`, when ``config.orders``: by default
   when tuning; control edges only where they lower the simulated peak), and a tuned step held to its budget in
   any order the executor may take (:func:`tflms.pipeline.held.held`: pinned, proved, or said; a step that keeps
   XLA whose winner cannot be held runs the next fastest fit that can);
5. **build**: the ``ConcreteFunction`` that runs the rewritten graph on the
   original's variables, when the step is one, with grappler off for it
   (:func:`tflms.ir.preoptimize.run_preoptimized`): grappler already ran in step 1.

A step that keeps XLA (``xla=True``, issue 47) skips grappler in step 1, gets one more pass after step 4, the XLA
clusters between tflms's copies (:func:`tflms.passes.xla_clusters.cluster_for_xla`), and is built never compiled
whole, with grappler off (:func:`tflms.pipeline.load_build._build_xla`).

The result is one typed record, :class:`StepRewrite`.

The decisions the stages take are in modules of their own: LOAD and BUILD (:mod:`tflms.pipeline.load_build`),
which hardware a rewrite plans for and at which price (:mod:`tflms.pipeline.hardware`), which compression pass it
runs (:mod:`tflms.pipeline.compression`), how a tuned step is held to its budget (:mod:`tflms.pipeline.held`). Their names stay importable from ``tflms.pipeline``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, analyze_graph, no_training_step_error
from tflms.config import COMPRESS_AUTO, LMSConfig
from tflms.devices import local_gpu, resolve_accelerator, runs_onednn_cpu_kernels
from tflms.ir import tf_io
from tflms.ir.graph import Graph
from tflms.passes import DEFAULT_COPY_OP, Placement, apply_swaps, place_swaps
from tflms.passes.workspace import keep_workspace_edges
from tflms.policies.swapplan import SwapPlan, check_filters
from tflms.policies.tflms_rules import plan_swaps
from tflms.profiles import HardwareProfile, select_profile
from tflms.report import RewriteReport, memory_picture  # issue 48: memory_picture
from tflms.budget import budget_sim_options  # issue 48: one margin for the library and the bench
from tflms.sim.clock import resolve_clock
# the stages' decisions: the names stay importable from here
from tflms.pipeline.compression import _compression_summary, _compressor, _supports  # noqa: F401
from tflms.pipeline.hardware import (PROFILE_DEVICE, default_budget, hardware_record,  # noqa: F401
                                     no_gpu_warning, priced_profile, tf32_setting, xla_cost,
                                     update_parts_for, xla_sim_options)
from tflms.tune.xla_alone import price_xla_alone, xla_alone_tuning
from tflms.pipeline.load_build import (_accumulator_pins, _build, _build_xla, _grappler_done_before,  # noqa: F401
                                       _observer, _preoptimized, _ran_check, _traced_and_preoptimized)

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class StepRewrite:
    """What :func:`rewrite_step` made of a training step.

    ``graph``: the rewritten IR (swaps applied, compressed, placed);
    ``analysis``: the analysis of the input graph; ``report``: the plan, the
    passes' records, the tuning summary and timings; ``placement``: where each
    replica's swap ops run; ``function``: the ``ConcreteFunction`` that runs
    ``graph`` on the original's variables (``None`` unless the step was a
    ``ConcreteFunction`` and building was asked for).
    """

    graph: Graph
    analysis: Analysis
    report: RewriteReport
    placement: Placement
    function: Any = None


#: The record :func:`rewrite` returns (the same type: one record for every entry point).
RewriteResult = StepRewrite


def analyze(source: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> Analysis:
    """Categorized topological ordering of a training step.

    Returns an :class:`~tflms.analysis.cto.Analysis`: ``levels`` and
    ``categories`` per op, and ``tensor(name)`` / ``tensors()`` giving each
    tensor's producer, consumers, level distances and bytes.
    """
    return analyze_graph(tf_io.load_graph(_preoptimized(source, args, kwargs), batch_size=batch_size))


def rewrite(source: Any, config: LMSConfig | None = None, *args: Any, copy_op: str = DEFAULT_COPY_OP,
            require_backward: bool = True, **options: Any) -> StepRewrite:
    """Analyze ``source`` and rewrite it as ``config`` says (see :func:`rewrite_step`); no function is built.

    ``options`` override fields of ``config`` (e.g. ``swapout_threshold=4``).
    ``args`` are example arguments when ``source`` is a ``tf.function``.
    Raises :class:`~tflms.errors.NoTrainingStepError` if the graph has no
    gradient ops (unless ``require_backward=False``).
    """
    return rewrite_step(source, LMSConfig.from_kwargs(config, **options), trace_args=args, build=False,
                        copy_op=copy_op, require_backward=require_backward)


def rewrite_step(step: Any, config: LMSConfig | None = None, *, trace_args: Sequence[Any] = (),
                 example_inputs: Sequence[Any] | None = None, build: bool = True, copy_op: str = DEFAULT_COPY_OP,
                 require_backward: bool = True, progress: Progress | None = None, xla: bool = False) -> StepRewrite:
    """Run the pipeline (see the module doc) on one training step.

    ``step``: a ``ConcreteFunction``, a ``tf.function`` (traced with
    ``trace_args``), a ``GraphDef``/``FunctionDef``/``tf.Graph`` or an IR
    :class:`~tflms.ir.graph.Graph`. ``example_inputs``: the step's positional
    arguments, needed only by ``config.compress="auto"`` (it measures the
    activations' sparsity on them). ``build``: also build the
    ``ConcreteFunction`` (only for a ``ConcreteFunction`` step).
    ``progress``: called with one line per tuner candidate.
    ``xla``: keep XLA (issue 47): LOAD reads the traced step without grappler, the rewritten step's compute ops
    are marked for XLA in clusters between tflms's copies (:func:`tflms.passes.xla_clusters.cluster_for_xla`;
    ``report.xla_clusters`` says how many), and BUILD runs it with grappler off, never compiled whole
    (:func:`tflms.pipeline.load_build._build_xla`).
    """
    config = config or LMSConfig()
    sized_from_inputs = None
    if config.batch_size is None and example_inputs is not None:
        sized_from_inputs = batch_size_of_inputs(step, example_inputs)
        if sized_from_inputs is not None:
            config = config.replace(batch_size=sized_from_inputs)
    with _gc_paused():
        timings: dict[str, float] = {}
        clock = _Clock(timings)
        original, step = clock("preoptimize", lambda: _traced_and_preoptimized(
            step, trace_args, example_inputs=example_inputs, grappler=not xla))
        graph = clock("load", lambda: tf_io.load_graph(step, batch_size=config.batch_size))
        loaded, materialized = graph, ()
        if xla:  # issue 47: traced without grappler, the gradients' shape reads become constants as grappler's would
            from tflms.passes.shapes import materialize_gradient_shapes
            shapes = clock("shapes", lambda: materialize_gradient_shapes(graph))
            graph, materialized = shapes.graph, shapes.report
        analysis = clock("analyze", lambda: analyze_graph(graph))
        if require_backward and not analysis.has_backward:
            raise no_training_step_error(analysis)
        accelerator, device_warnings = resolve_accelerator(config.accelerator_device)
        simulates = config.auto_tune or config.compress == COMPRESS_AUTO or config.orders
        gpu = local_gpu() if simulates else None
        choice = select_profile(config.profile, gpu) if simulates else None
        profile = priced_profile(choice.name, config.tf32) if simulates else None
        compressor = _compressor(config, analysis, step, example_inputs, profile)
        # what fits is judged with the library's margin (issue 48), and a step that keeps XLA is priced as its
        # clusters will run (issue 47: the xla-clusters clock)
        sim_options = budget_sim_options(config)
        if xla and simulates:
            sim_options = xla_sim_options(sim_options, graph, accelerator)
        tuning = None
        budget_why = None
        left_to_xla = False  # (issue 47: XLA alone fits, and the step is compiled whole)
        if config.auto_tune:
            from tflms.tune.plancache import cached_tune as tune  # plan cache hook (issue 48): tune, or reuse a plan
            # The filters are checked before any search: a step that fits is never planned, yet a misspelt
            # op type or scope is still an error.
            filter_warnings = tuple(check_filters(analysis, config))
            budget, budget_why = default_budget(choice, gpu) if config.default_tuning else (config.budget_bytes, None)
            # issue 47, item 3: XLA alone first. A step that keeps XLA and fits with XLA alone (its fusion, and its
            # own rematerialization where that is faster than tflms's plan) is left to XLA, compiled whole.
            alone = clock("xla-alone", lambda: price_xla_alone(analysis, profile, budget, budget_sim_options(config),
                                                               config)) if xla else None
            tunes = alone is None or not alone.fits or alone.remat
            if xla and tunes and budget is not None:  # issue 47: a step over its budget updates its variables in parts
                sim_options = update_parts_for(sim_options, analysis.graph, profile, budget)
            def run_tune(options):
                return tune(analysis, budget=budget, profile=profile,
                            sim_options=options,  # issue 48: the margin; issue 47: the clusters' clock
                            config=config, copy_op=copy_op, fit_by=config.fit_by, compress=compressor,
                            progress=progress, enforce_order=config.orders, require_backward=require_backward)

            result = None
            if tunes and xla:  # issue 47: the swaps' readers in clusters of their own too, where the winner swaps
                from tflms.tune.xla_cuts import tune_xla
                result, sim_options = clock("tune", lambda: tune_xla(run_tune, sim_options))
            elif tunes:
                result = clock("tune", lambda: run_tune(sim_options))
            planned = accelerator if accelerator != config.host_device else PROFILE_DEVICE
            left_to_xla = alone is not None and alone.fits and (result is None
                                                                  or result.best.sim.step_time_s >= alone.step_s)
            if left_to_xla:
                plan, swapped, tuning = _empty_plan(config, planned), loaded, xla_alone_tuning(alone, result)
            else:
                plan = result.best.plan or _empty_plan(config, planned)
                swapped, tuning = result.graph, result.to_dict()
                if alone is not None:
                    tuning["xla_alone"] = alone.to_dict()
                if xla:  # the clock the plan was priced on: its XLA clusters (issue 47), and whether the swaps'
                    tuning["clock"] = resolve_clock(sim_options.clock, profile)  # readers start clusters
                    tuning["xla_land_cuts"] = sim_options.xla_land_cuts
                    tuning["xla_clones_last"] = sim_options.xla_clones_last
            tuning["margin_fraction"] = sim_options.margin_fraction  # issue 48
            baseline = getattr(result, "baseline", None)  # what leaving XLA costs this step (issue 46): the
            # callback says so (a plan from the plan cache keeps no baseline: simulated again)
            if not left_to_xla:
                tuning["xla"] = xla_cost(analysis.graph, profile,
                                         baseline.step_time_s if getattr(baseline, "clock", None) == "graph" else None,
                                         alone.plain_step_s if alone is not None else None)  # (simulated once)
            if filter_warnings:
                plan = dataclasses.replace(plan, warnings=tuple(w for w in filter_warnings if w not in plan.warnings)
                                           + plan.warnings)
            if accelerator == config.host_device:  # no GPU here: the tuner planned for the profile's
                plan = dataclasses.replace(plan, warnings=(no_gpu_warning(choice.name, accelerator),) + plan.warnings)
        else:
            plan = clock("plan", lambda: plan_swaps(analysis, config, accelerator_device=accelerator))
            if device_warnings:
                plan = dataclasses.replace(plan, warnings=tuple(device_warnings) + plan.warnings)
            swapped = clock("apply", lambda: apply_swaps(graph, plan, copy_op=copy_op).graph)
            if compressor is not None:
                swapped = clock("compress", lambda: compressor(swapped, plan))
        placed = clock("place", lambda: place_swaps(swapped, plan))
        placed.graph.lint()
        final, order, pinned_by_guarantee = placed.graph, None, False
        tuned = config.auto_tune and not left_to_xla
        if tuned or config.orders:
            from tflms.passes.order import GUARANTEE_NONE, apply_tuned_order, enforce_order
            from tflms.pipeline.held import held, held_plan
            options = sim_options  # issue 48: judged with the tuner's margin (tflms/budget.py) and clock
        if tuned:
            final, order = clock("order", lambda: apply_tuned_order(final, result.best.order, profile,
                                                                    options=options))
            # The verdict was simulated in one order; TensorFlow's executor runs any order the edges allow
            # (issue 31). Hold it to the budget: pinned already, proved for every order, pinned now, or said; a
            # step that keeps XLA may run the next fastest fit that can be held instead (tflms.pipeline.held).
            tuned_result = result
            final, order, result, pinned_by_guarantee, placed = clock("guarantee", lambda: held(
                placed, final, order, tuned_result, profile, options, pin=config.orders, xla=xla, copy_op=copy_op,
                compress=compressor))
            if result is not tuned_result:
                plan = held_plan(plan, tuned_result, result)
                tuning.update(result.to_dict(), held_instead_of=order["held_instead_of"], reason=(
                    f"{result.best.strategy} ({100 * result.overhead:+.1f}%) runs instead of the fastest fit "
                    f"({tuned_result.best.strategy}, {100 * tuned_result.overhead:+.1f}%), which could not be held to "
                    f"the budget in TensorFlow's executor; the tune: {tuned_result.reason()}"))
            final.lint()
            grappler_after = not xla and not _grappler_done_before(step, original)  # (XLA: grappler stays off)
            if grappler_after:
                order["guarantee_why"] += ("; and grappler runs on this step after the rewrite (it was rewritten "
                                           "before grappler), so ops it fuses or removes change the peak")
            if order["guarantee"] == GUARANTEE_NONE or grappler_after:
                plan = dataclasses.replace(plan, warnings=plan.warnings + (order["guarantee_why"],))
        elif config.orders and not left_to_xla:
            ordered = clock("order", lambda: enforce_order(placed.graph, profile, options=options))
            ordered.graph.lint()
            final, order = ordered.graph, ordered.report.to_dict()
        # (tflms.passes.workspace; under XLA the gradients run in clusters, not on oneDNN's kernels)
        kept = keep_workspace_edges(final, runs_onednn_cpu_kernels(accelerator) and not xla)
        if kept.changed:
            final = kept.graph
            final.lint()
            plan = dataclasses.replace(plan, warnings=plan.warnings + (
                f"{len(kept.report)} gradient(s) read their forward op's output directly, not its swap-in, because this "
                f"machine runs the step on oneDNN's CPU kernels, which hand them a workspace only so "
                f"({', '.join(name for name, _ in kept.report[:3])}); the copies still run",))
        xla_clusters = None
        if xla and not left_to_xla:  # issue 47: XLA clusters between the copies
            from tflms.passes.xla_clusters import cluster_for_xla
            parts = sim_options.xla_update_parts if simulates else 1
            cuts = sim_options.xla_land_cuts if simulates else False
            last = sim_options.xla_clones_last if simulates else False
            clustered = clock("xla", lambda: cluster_for_xla(final, accelerator_device=accelerator,
                                                             host_device=config.host_device, update_parts=parts,
                                                             land_cuts=cuts, clones_last=last))
            final = clustered.graph
            final.lint()
            xla_clusters = clustered.report.to_dict()
            xla_clusters["shapes_materialized"] = len(materialized)
            if materialized:
                xla_clusters["why"] += (f"; {len(materialized)} shape read(s) of known shapes are constants (as "
                                        "grappler's constant folding makes them without XLA), so no tensor is held "
                                        "or copied back for its shape")
        pinned = check_pinned_host(  # before anything runs: TensorFlow's pinned-memory cap (issue 28)
            plan, final, host_peak_bytes=result.best.sim.host_peak_bytes if tuned else None,
            profile=profile, tf32=config.tf32, host_device=config.host_device)
        inserted = inserted_ops(loaded if left_to_xla else graph, final)
        hardware = hardware_record(choice, planned_for=plan.accelerator_device, runs_on=accelerator,
                                   simulated=config.auto_tune, profile=profile)
        if budget_why is not None:
            hardware["budget"] = budget_why
        if pinned is not None:
            hardware["pinned_host"] = pinned
        if sized_from_inputs is not None:
            hardware["batch_size"] = f"{sized_from_inputs}, from the inputs of the first call"
        report = RewriteReport(plan=plan, graph_summary=analysis.summary(), inserted_ops=inserted,
                               timings_s=timings, tuning=tuning, compression=_compression_summary(placed.graph),
                               hardware=hardware, order=order, accumulations=_accumulator_pins(step),
                               memory=memory_picture(result, tuning["margin_fraction"]) if tuned else None,  # issue 48
                               xla_clusters=xla_clusters)
        for w in plan.warnings:
            logger.warning("tflms: %s", w)
        function = None
        if build and tf_io.is_concrete_function(step):
            # Nothing inserted (the step fits, or nothing qualifies): the user's own function, as TensorFlow runs
            # it; a rebuilt one would run the pre-optimized graph, identical only where the pre-pass mimics
            # TensorFlow exactly (docs/design.md, "Exceptions to bitwise").
            # A step that keeps XLA is always rebuilt: its clusters are marked on the rewritten graph.
            if left_to_xla:  # issue 47: the step as it was traced, compiled whole by XLA
                function = clock("build", lambda: _build_xla(final, step, inserted, whole=True))
            elif xla:
                function = clock("build", lambda: _build_xla(final, step, inserted))
            else:
                function = original if not inserted and not pinned_by_guarantee and original is not None else clock(
                    "build", lambda: _build(final, step, inserted))
        return StepRewrite(graph=final, analysis=analysis, report=report, placement=placed.report,
                           function=function)


def check_pinned_host(plan: SwapPlan, graph: Graph, *, host_peak_bytes: int | None,
                      profile: HardwareProfile | None, tf32: bool | None, host_device: str) -> str | None:
    """Refuse a plan for a GPU whose swapped tensors need more pinned host memory than TensorFlow will pin.

    TensorFlow holds every swapped tensor in pinned memory, capped by ``TF_GPU_HOST_MEM_LIMIT_IN_MB``
    (:mod:`tflms.sim.hostmem`; docs/design.md, "Pinned host memory"). The bytes held are the simulated
    host peak: the tuner's (``host_peak_bytes``), else, when the plan's swapped bytes summed could exceed
    the limit, ``graph`` simulated on ``profile`` (``None``: the profile closest to this machine's GPU, priced
    with ``tf32``). Raises :class:`~tflms.errors.HostMemoryError` over
    the limit; returns one phrase for the report (``None`` when the plan is not for a GPU or swaps nothing:
    nothing is pinned).
    """
    if not plan.swaps or "GPU" not in plan.accelerator_device.upper():
        return None
    from tflms.sim.hostmem import check_pinned_host_bytes, pinned_host_limit
    from tflms.units import format_bytes
    limit = pinned_host_limit()
    needed = host_peak_bytes
    how = "simulated host peak"
    if needed is None:
        needed, how = sum(s.num_bytes for s in plan.swaps), "every swapped tensor at once"
        if needed > limit.limit_bytes:  # the sum may overstate what is held at once: simulate
            from tflms.sim.simulator import SimOptions, simulate
            profile = profile or priced_profile(select_profile(None, local_gpu()).name, tf32)
            needed = simulate(graph, profile, options=SimOptions(host_device=host_device)).host_peak_bytes
            how = f"simulated host peak on {profile.name}"
    check_pinned_host_bytes(needed, limit, what=f"this rewrite ({how})")
    return (f"swapped tensors in pinned host memory: {format_bytes(needed)} ({how}) of "
            f"{format_bytes(limit.limit_bytes)} ({limit.source})")


def batch_size_of_inputs(step: Any, example_inputs: Sequence[Any]) -> int | None:
    """The batch size of a step traced with an unknown batch dimension, read from the arguments of a call.

    ``None`` when the step is not a ``ConcreteFunction``, its inputs have no
    unknown leading dimension, or the arguments carry no leading dimension. The
    largest leading dimension among the arguments' tensors counts (the batch).
    """
    if not tf_io.is_concrete_function(step):
        return None
    import tensorflow as tf
    specs = [s for s in tf.nest.flatten(step.structured_input_signature, expand_composites=True)
             if isinstance(s, tf.TensorSpec)]
    if not any(s.shape.rank and s.shape[0] is None for s in specs):
        return None
    dims = [t.shape[0] for t in tf.nest.flatten(list(example_inputs), expand_composites=True)
            if getattr(t, "shape", None) is not None and len(t.shape)]
    known = [int(d) for d in dims if d is not None]
    return max(known) if known else None


def predict(result: StepRewrite, profile: str | None = None) -> dict[str, Any]:
    """The simulator's verdict on a rewrite that was not tuned (e.g. the demo's, with given parameters).

    Simulates the input graph and the rewritten one on ``profile`` (default: the
    report's, else :func:`~tflms.profiles.select_profile`'s choice for this
    machine) and returns the keys of :meth:`RewriteReport.prediction`
    (``budget_bytes`` is ``None``) plus ``profile_why``. A tuned rewrite's report
    already has it (:meth:`RewriteReport.prediction`). Raises
    :class:`~tflms.errors.UnknownSizeError` when tensors of an unknown batch
    dimension would count as 0 bytes (rewrite with ``batch_size``).
    """
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.tune.tuner import check_known_sizes
    config = result.report.plan.config
    if profile is None and result.report.hardware.get("profile"):
        profile = result.report.hardware["profile"]
    choice = select_profile(profile, local_gpu())
    priced = priced_profile(choice.name, config.tf32)
    options = SimOptions(host_device=config.host_device)
    before = simulate(result.analysis.graph, priced, options=options)
    check_known_sizes(result.analysis.graph, before, config.batch_size)
    after = simulate(result.graph, priced, options=options)
    return {"profile": choice.name, "profile_why": choice.why, "budget_bytes": None,
            "peak_before_bytes": before.peak_with_margin_bytes, "peak_after_bytes": after.peak_with_margin_bytes,
            "step_time_before_s": before.step_time_s, "step_time_after_s": after.step_time_s,
            "overhead": after.overhead_vs(before), "margin_fraction": options.margin_fraction}  # issue 48


def inserted_ops(original: Graph, rewritten: Graph) -> tuple[str, ...]:
    """The ops of ``rewritten`` that ``original`` does not have, in graph order.

    These are every op the passes added (swap copies, codec calls and their part
    copies); the built function keeps them as control outputs, which grappler's
    dependency optimizer must not remove.
    """
    return tuple(op.name for op in rewritten if op.name not in original)


class _Clock:
    """Runs a stage and records its wall time under a name."""

    def __init__(self, timings: dict[str, float]):
        self.timings = timings

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.timings[name] = time.perf_counter() - start


def _empty_plan(config: LMSConfig, accelerator: str) -> SwapPlan:
    return SwapPlan(config=config, accelerator_device=accelerator, swaps=(), skipped=())


@contextlib.contextmanager
def _gc_paused():
    """Pause CPython's cyclic collector while rewriting (and restore its state).

    A rewrite of a 100k-op graph allocates about a million small objects, none of
    them cyclic garbage; full collections then cost up to a second each and make
    the rewrite time grow faster than the graph.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
