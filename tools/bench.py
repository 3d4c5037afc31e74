"""Benchmark suite: the largest batch each memory-saving method reaches, side by side.

For each model and hardware profile the training step is traced (custom
``tf.GradientTape`` step, never run) and judged by the tflms simulator:

    none            the step as traced: no swapping, no recomputation
    tflms-distance  tflms with TFLMS's distance rules only (tune(strategies=["tflms-distance"]))
    tflms-best      tflms with every tuner strategy (distance rules, idle-time, idle-time-no-overhead)
    grappler        TensorFlow grappler's own swapping (RewriterConfig.SWAPPING_HEURISTICS) on a
                    virtual GPU with the profile's memory (tflms.baselines.grappler_swap)
    checkpoint-segments
                    gradient checkpointing: the same Keras model run in sqrt(n) segments under
                    tf.recompute_grad (tflms.baselines.recompute), traced as its own step
                    (earlier runs, docs/results.json among them, call it ``recompute``: readers map the
                    old name, ``benchlib.common.read_records``; "recompute" now names the tuner's plan action)
    keras-remat     the same Keras model built under keras.RematScope(mode="full"), traced as its own step
    keras-remat-activations
                    the same under keras.RematScope(mode="activations") (only activation functions remat'd)

A keras-remat step that Keras cannot build or trace is reported, not skipped: its rows say ``failed: <the
error's first line>`` instead of numbers (``MethodResult.error``, ``"error"`` in the JSON). So it is with
Keras 3.15 and the TensorFlow backend for mode "full": it wraps the Functional model's own call in
tf.recompute_grad, whose custom gradient takes no keyword arguments in graph mode, and Keras passes the
call's ``training`` and ``mask`` by keyword.

Headroom (``--headroom``, default ``benchlib.common.HEADROOM`` = 5%, the library's own margin from
tflms/budget.py): every method's simulated peak counts ``1 + headroom`` times (``SimOptions.margin_fraction``)
against the budget, ``none`` included, for what the simulator cannot see (workspaces, allocator fragmentation). The
swap-only bound (``tflms.sim.bounds.swap_only_bound``: resident bytes plus the largest op's
working set; and ``tflms.sim.footprint.footprint_bound``, what the step holds at once in every
order, within the accelerator plus the profile's host memory) is judged the same way and
searched like a method (row ``swap-only-bound``); a swapping method's probe fits only if its
host peak is within the host memory too, as in the tuner;
each method's maximum is reported as a fraction of it, with the simulated step time,
throughput (samples/s) and ``time_bound_ratio`` (step time over
``tflms.sim.bounds.step_time_bound`` at the budget the headroom leaves) at that maximum.
``tflms-best`` tunes with ``enforce_order=True``, as the pipeline does: its finalists are
judged in the memory-aware order the order pass pins (docs/design.md, "Enforced order").

Reported per model, profile and method: the largest batch that fits the profile's
memory (for ``unet3d``: the largest volume D x H x W at batch 1, see below), the predicted
step-time overhead at a *common batch* (the smallest of the maxima that exceed
``none``'s: a batch every method that extends the batch can run), the wall time of
the rewrite/tune that produced the graph at the common batch, and its op count.

Search: doubling from a known fit until a size does not fit, then bisection.
``none`` starts at 1, ``tflms-distance``/``grappler``/``checkpoint-segments``/``keras-remat*`` at ``none``'s
maximum (trying ``none``'s first miss next), ``tflms-best`` at ``tflms-distance``'s
(a size ``none`` fits is fitted by tflms without tuning: the tuner would keep the
unchanged step). ``--full`` answers a tflms-distance size with
``tune(strategies=["tflms-distance"], first_fit=True)``; quick mode simulates the
tuner's two most aggressive distance candidates instead (``QUICK_DISTANCE_PROBES``:
a fit is exact, a miss may hide another fitting candidate). tflms-best sizes the
distance rules miss run ``tune(first_fit=True, enforce_order=True)`` (every strategy, the
finalists judged in the enforced order). One
full tune with every strategy runs at the common batch; ``tflms-distance``'s choice
and wall time are read off it (the tuner evaluates the distance candidates first).
Quick mode bisects ``QUICK_BISECT_STEPS`` times: the reported maximum fits, and
``max_batch_upper`` (the smallest size found not to fit) is at most 1/8 above it (in
sizes: for ``unet3d`` the size index below, about 1/8 of each side);
``--full`` bisects until they are adjacent. Afterwards every maximum is read off all
probes of the run (a size ``none`` fits counts for the tflms methods).

The 3D U-Net's size is its volume at batch 1: sides multiples of ``UNET_RESOLUTION_STEP`` (16)
that differ by at most one step, in increasing voxel order n^3 < (n+1)n^2 < (n+1)^2n < (n+1)^3
(``benchlib.common.unet_shape``: three sizes per 16-voxel step of a cube, each multiplying the
voxels by (n+1)/n, a third of the cube step's ((n+1)/n)^3); the report shows
``208x192x192`` (or ``192^3``) and compares voxels. The step is re-traced for every volume
probed, each trace cached for the run.
Batch models are traced once with an unknown batch dimension and re-sized in the IR.

Usage (from the repo root)::

    python tools/bench.py                       # quick: QUICK_MODELS on QUICK_PROFILES (< 10 min on 2 cores)
    python tools/bench.py --full                # FULL_MODELS on FULL_PROFILES (V100 PCIe 3 and NVLink 2), exact search
    python tools/bench.py --models resnet50,bert-base --profiles h100-80gb-pcie5
    python tools/bench.py --models mlp-tiny --json   # seconds (tiny MLP, 64 MiB budget); records on stdout
    python tools/bench.py --at vgg16=256,densenet121=540 --profiles v100-16gb-pcie3   # no search: those sizes
    python tools/bench.py --models resnet50 --profiles v100-16gb-pcie3 --curve --curve-points 4   # + throughput curve
    python tools/bench.py --models resnet50,resnet50-amp-bf16 --profiles h200-141gb --clock xla   # today's GPUs
    python tools/bench.py --models resnet50 --profiles h200-141gb --xla-targets --json   # tflms-xla (issue 47)

``--clock xla`` (issue 46) prices ``none`` and the traced checkpointing steps as XLA:GPU compiles them
(``tflms.sim.clock``): the step a Keras 3 user runs on a GPU by default, against which every method's overhead and
samples/s are then measured. tflms's rewrites (and grappler's) run without XLA (the callback turns it off until issue
47 keeps it), so they are priced on the graph clock (TensorFlow's executor, launches overlapping compute) whatever
``--clock`` says: their overhead includes what leaving XLA costs. ``--clock graph`` prices every method without XLA.

``--xla-targets`` (issue 47) runs the method ``tflms-xla`` instead: tflms keeping XLA, its clusters between the copies,
every candidate priced on the ``xla-clusters`` clock (``tflms.sim.clusters``), as ``rewrite_step(xla=True)`` tunes;
beside it the plain XLA step (``none`` on the ``xla`` clock) and segment checkpointing under XLA. Per model and profile:
the three maxima, tflms-xla's full tune at checkpointing's maximum and at its own, and the issue's two simulated
targets (``benchlib.xla``). With ``--json`` one record per line on stdout as each finishes. With ``--at``, no
search: tflms-xla's full tune and checkpointing under XLA at those sizes, one JSON record each.
What tflms-xla's quick search can miss: its maximum is searched from checkpointing's with ``tune(first_fit=True)`` in
level order (``benchlib.xla.probe_xla``), while its step there is the full tune's choice, whose finalists are judged in
the enforced order and whose last stage runs hybrids with swaps chosen in that order. So a batch that only a plan
judged in the enforced order fits reads as a miss: ResNet-50 at batch 3872 on h100-80gb-pcie5 (simulated), where the
probe's last greedy swap search stops 1.95 GiB over the 80 GiB budget with no tensor left to swap at its peak, and the
full tune fits a hybrid (``--at resnet50=3872``). The bisection also takes fitting as monotone in the batch and stops
after ``QUICK_BISECT_STEPS``: no batch above the smallest miss found is tried. The reported maximum fits (the probe
found a plan there); a larger batch may fit with the full tune, which ``--at MODEL=SIZE`` runs. (Probing in the
enforced order instead overshoots: that first-fit probe fits batches the full tune does not, e.g. resnet50-amp-bf16
at 6292 on h100-80gb-pcie5; docs/results-gpus-xla-clusters.md, "Nineteenth session".)

``--at MODEL=SIZE,...`` skips the maximum search and runs every method at the given sizes only (batches;
``unet3d=160^3`` or ``208x192x192``) exactly as at a search's common size (``search.run_methods_at``):
one table per profile with each method's overhead, peak with headroom, whether it fits, and its choice.
It compares figures taken at fixed sizes (an earlier report's common batches) like for like
(docs/regressions.md). It writes no file unless ``--results``/``--plots`` is given, and runs no extras.

``--tune-log FILE`` writes every full tune's progress to FILE, a line per candidate the tuner judged (model,
profile, size, seconds into the tune, then the candidate's strategy, parameters, peak with headroom and step
time, and why it missed): the figures behind a ``tflms-best`` row, e.g. each recompute plan's peak.

``--curve`` adds, after each batch model's search, its throughput curve (``benchlib.curve``): simulated
samples/s against batch size at ``--curve-points`` (default 6) batches evenly spaced from ``none``'s
maximum to the swap-only bound's, ends included. At each batch every method runs as at the common batch
(``search.run_at_size``: the full tune for tflms, grappler's rewrite, the traced steps), so each point is
that method's own rewrite there; a method that does not fit a batch has no point there. It prints a table
per model and profile (the report's section "Throughput curve"; with ``--json``, a ``curve`` list of
``[batch, samples/s, step ms]`` in each method's record, ``null`` where it does not fit) and plots it to
``<plots>/<model>_<profile>_curve.png``. Each point costs a full tune: on the large models budget about
as much per point as the common batch's rewrites take. The 3D U-Net (a volume at batch 1) gets no curve.

Without ``--json`` the Markdown report goes to stdout and to ``--results``
(default ``docs/results.md``), memory timelines to ``--plots`` (default
``docs/plots/<model>_<profile>.png``, needs matplotlib: ``pip install -e ".[plot]"``).
With ``--json`` the records go to stdout and nothing is written unless ``--results``
or ``--plots`` is given. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shlex
import sys
import time

from benchlib.common import (ALL_MODELS, FULL_MODELS, FULL_PROFILES, HEADROOM, QUICK_BISECT_STEPS, QUICK_MODELS,
                             QUICK_PROFILES, say)
from benchlib.models import MODELS, Steps, parse_sizes
from benchlib.curve import CURVE_POINTS, throughput_curve
from benchlib.report import at_markdown, at_records, curve_markdown, markdown, plot_curve, plot_timelines, records_for
from benchlib.search import budget_for, run_at_size, run_model_profile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parent.parent


def extra_sections(steps, models, profiles, headroom: float) -> dict[str, list[str]]:
    """The compute-model calibration (ResNet-50 in the run) and vDNN like for like (VGG-16, each V100 profile)."""
    from benchlib.calibration import calibration_markdown, calibration_rows
    from benchlib.vdnn import like_for_like, like_for_like_markdown
    extras: dict[str, list[str]] = {}
    if "resnet50" in models:
        say("calibrating the compute model (ResNet-50, batch 128)")
        extras["Compute model against a published throughput"] = [
            "ResNet-50 training step, batch 128, FP32, simulated without swapping, beside NVIDIA's published "
            "figure (`tools/calibrate_compute.py`). The FLOP-bound ops alone come close to it; Keras 3 builds "
            "batch normalization from separate element-wise ops that a tuned run (cuDNN's fused batch norm, XLA) "
            "fuses, and the roofline prices each of them at memory bandwidth.", "",
            *calibration_markdown(calibration_rows(steps))]
    if "resnet50-amp-fp16" in models:
        from benchlib.calibration import PUBLISHED_TENSOR_CORES
        say("calibrating the tensor-core prices (ResNet-50 AMP and TF32, batch 256)")
        extras["Tensor-core prices against published throughputs"] = [
            "ResNet-50 training steps at batch 256, simulated without swapping: Keras mixed_float16 "
            "(`resnet50-amp-fp16`) against NVIDIA's AMP figures, the float32 step at TF32 against the TF32 figure "
            "(`tools/calibrate_compute.py --tensor-cores`; docs/results.md, \"Mixed precision on A100 and H100\").", "",
            *calibration_markdown(calibration_rows(steps, published=PUBLISHED_TENSOR_CORES))]
    if "vgg16" in models:
        body = []
        for profile in (p for p in profiles if p.startswith("v100")):
            say(f"vDNN like for like on {profile}")
            body += like_for_like_markdown(like_for_like(steps, profile, headroom=headroom)) + [""]
        if body:
            extras["vDNN like for like"] = body + [
                "The paper's step needed 2.33x its card's memory. Here the swap-only bound (the largest single op's "
                "working set with the resident bytes) does not fit at that over-subscription, so no swap rewrite "
                "can; the second table compares each method at its own largest batch (`tools/vdnn_like_for_like.py`)."]
    return extras


def _relative(path: pathlib.Path, results_path: str | None) -> str:
    """``path`` as the report links it: relative to the report's folder (the repo root without a report)."""
    try:
        return os.path.relpath(path, pathlib.Path(results_path).parent if results_path else REPO)
    except ValueError:
        return str(path)


def _command(argv) -> str:
    return "python tools/bench.py" + ("" if argv is None and len(sys.argv) == 1 else " " + shlex.join(
        sys.argv[1:] if argv is None else argv))


def run_at(args, sizes: dict[str, int], profiles: list[str], budget: int | None, results_path: str | None,
           plots_dir: str | None, argv) -> int:
    """``--at``: every method at each given size on each profile; the table (or ``--json`` records) on stdout."""
    from tflms.sim import get_profile
    t_start = time.perf_counter()
    steps = Steps()
    records = []
    for model, size in sizes.items():
        for profile in profiles:
            results = run_at_size(steps, model, profile, budget, size, args.headroom, clock=args.clock)
            records += at_records(model, profile, results, budget_bytes=budget_for(model, get_profile(profile), budget),
                                  headroom=args.headroom)
            if plots_dir:
                plot_timelines(pathlib.Path(plots_dir) / f"{model}_{profile}_at.png", model, profile, results,
                               budget_for(model, get_profile(profile), budget), records[-1]["detail"].split(";")[0])
    say(f"done in {time.perf_counter() - t_start:.0f} s ({steps.trace_s:.0f} s tracing)")
    report = at_markdown(records, command=_command(argv))
    print(json.dumps(records, indent=2) if args.json else report)
    if results_path:
        pathlib.Path(results_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(results_path).write_text(report + "\n")
        say(f"wrote {results_path}")
    return 0


def run_xla(args, models: list[str], profiles: list[str], budget: int | None, bisect_steps: int | None,
            results_path: str | None, argv) -> int:
    """``--xla-targets``: tflms-xla, the plain XLA step and checkpointing under XLA on each model and profile
    (:mod:`benchlib.xla`); JSON records on stdout with ``--json``, else the Markdown tables."""
    from benchlib.xla import markdown as xla_markdown
    from benchlib.xla import run_xla_targets
    t_start = time.perf_counter()
    steps = Steps()
    records = []
    for model in models:
        for profile in profiles:
            say(f"=== {model} on {profile} (tflms-xla and issue 47's targets)")
            records.append(run_xla_targets(steps, model, profile, budget, bisect_steps, args.headroom))
            if args.json:  # each record as it is done: a long run keeps what it finished
                print(json.dumps(records[-1]), flush=True)
    say(f"done in {time.perf_counter() - t_start:.0f} s ({steps.trace_s:.0f} s tracing)")
    report = "\n".join(xla_markdown(records, _command(argv)))
    if not args.json:
        print(report)
    if results_path:
        pathlib.Path(results_path).write_text(report + "\n")
        say(f"wrote {results_path}")
    return 0


def run_xla_at_sizes(args, at_sizes: dict[str, int], profiles: list[str], budget: int | None) -> int:
    """``--xla-targets --at MODEL=SIZE,...``: tflms-xla's full tune and checkpointing under XLA at those sizes only,
    one JSON record per model and profile on stdout (:func:`benchlib.xla.run_xla_at`)."""
    from benchlib.xla import run_xla_at
    steps = Steps()
    for model, size in at_sizes.items():
        for profile in profiles:
            say(f"=== {model} on {profile} at {size} (tflms-xla)")
            print(json.dumps(run_xla_at(steps, model, profile, size, budget, args.headroom)), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="every model on every profile, exact bisection")
    parser.add_argument("--models", help=f"comma-separated, from {', '.join(ALL_MODELS)}")
    parser.add_argument("--profiles", help="comma-separated hardware profiles")
    parser.add_argument("--at", metavar="MODEL=SIZE,...",
                        help="no search: every method at these sizes only (e.g. vgg16=256,unet3d=160^3); "
                             "names the models, so not with --models or --full")
    parser.add_argument("--budget", help="accelerator budget for every profile instead of its memory (e.g. 64MiB)")
    parser.add_argument("--bisect-steps", type=int, default=None,
                        help=f"bisection steps after doubling (quick default {QUICK_BISECT_STEPS}; --full: exact)")
    parser.add_argument("--headroom", type=float, default=HEADROOM,
                        help=f"fraction of each peak (and of the swap-only bound) kept free, the same for every method "
                             f"(default {HEADROOM})")
    parser.add_argument("--clock", choices=("auto", "graph", "xla"), default="auto",
                        help="the simulator's clock for the unchanged and the checkpointed steps (tflms.sim.clock): xla "
                             "prices the step a Keras 3 user runs on a GPU by default; tflms's and grappler's rewrites "
                             "run without XLA and are priced on the graph clock either way (auto: graph on a GPU "
                             "profile)")
    parser.add_argument("--xla-targets", action="store_true",
                        help="issue 47: tflms-xla (XLA clusters kept, priced on the xla-clusters clock) against the plain "
                             "XLA step and segment checkpointing under XLA, and the issue's two simulated targets "
                             "(benchlib.xla); only those three methods run")
    parser.add_argument("--json", action="store_true", help="print JSON records instead of the Markdown report")
    parser.add_argument("--results", help="write the Markdown report here (default docs/results.md without --json)")
    parser.add_argument("--plots", help="directory for timeline PNGs (default docs/plots without --json)")
    parser.add_argument("--tune-log", metavar="FILE",
                        help="write every full tune's progress lines (each candidate judged: its peak and step time) "
                             "to FILE, e.g. the recompute plans' peaks behind a tflms-best row")
    parser.add_argument("--curve", action="store_true",
                        help="also samples/s against batch size, from none's maximum to the swap-only bound, every "
                             "method (batch models; a table, a plot per model and profile, a report section)")
    parser.add_argument("--curve-points", type=int, default=CURVE_POINTS,
                        help=f"batches sampled per curve, ends included (default {CURVE_POINTS}, at least 2)")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip the compute-model calibration (with resnet50) and vDNN like for like (with vgg16)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.tune_log:
            from benchlib import search
            search.tune_log = stack.enter_context(open(args.tune_log, "w", encoding="utf-8"))
            stack.callback(setattr, search, "tune_log", None)
        return _run(parser, args, argv)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, argv) -> int:
    """:func:`main` once the arguments are parsed."""

    from tflms.sim import get_profile
    from tflms.units import parse_bytes

    at_sizes = None
    if args.at is not None:
        if args.models or args.full:
            parser.error("--at names the models and runs no search: drop --models/--full")
        if args.curve:
            parser.error("--curve runs from none's maximum to the bound, which --at does not search: drop --at")
        try:
            at_sizes = parse_sizes(args.at)
        except ValueError as err:
            parser.error(str(err))
    models = (list(at_sizes) if at_sizes else args.models.split(",") if args.models
              else list(FULL_MODELS if args.full else QUICK_MODELS))
    profiles = args.profiles.split(",") if args.profiles else list(FULL_PROFILES if args.full else QUICK_PROFILES)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(ALL_MODELS)}")
    for p in profiles:
        get_profile(p)
    if args.curve_points < 2:
        parser.error(f"--curve-points: at least 2 (the two ends), got {args.curve_points}")
    budget = parse_bytes(args.budget, what="--budget") if args.budget else None
    bisect_steps = args.bisect_steps if args.bisect_steps is not None else (None if args.full else QUICK_BISECT_STEPS)
    mode = "full" if bisect_steps is None else "quick"
    results_path = args.results or (None if args.json or at_sizes else str(REPO / "docs" / "results.md"))
    plots_dir = args.plots or (None if args.json or at_sizes else str(REPO / "docs" / "plots"))
    if at_sizes and args.xla_targets:
        return run_xla_at_sizes(args, at_sizes, profiles, budget)
    if at_sizes:
        return run_at(args, at_sizes, profiles, budget, results_path, plots_dir, argv)
    if args.xla_targets:
        return run_xla(args, models, profiles, budget, bisect_steps, None if args.json else args.results, argv)

    t_start = time.perf_counter()
    steps = Steps()
    records, plots, curve_plots = [], {}, {}
    for model in models:
        for profile in profiles:
            say(f"=== {model} on {profile}")
            results = run_model_profile(steps, model, profile, budget, bisect_steps, args.headroom, clock=args.clock)
            if args.curve and MODELS[model].kind != "batch":
                say(f"{model}: no throughput curve (its size is a volume at batch 1)")
            elif args.curve:
                throughput_curve(steps, model, profile, budget, results, args.curve_points, args.headroom)
                path = pathlib.Path(plots_dir) / f"{model}_{profile}_curve.png" if plots_dir else None
                if path is not None and plot_curve(path, model, profile, results):
                    curve_plots[f"{model} on {profile}"] = _relative(path, results_path)
            recs = records_for(model, profile, results)
            records += recs
            if plots_dir:
                path = pathlib.Path(plots_dir) / f"{model}_{profile}.png"
                common = recs[0]["common_batch"]
                label = f"batch {common}" if recs[0]["unit"] == "batch" else f"volume {common}, batch 1"
                if plot_timelines(path, model, profile, results, budget_for(model, get_profile(profile), budget), label):
                    plots[f"{model} on {profile}"] = _relative(path, results_path)
    extras = {}
    if any(r.get("curve") for r in records):
        extras["Throughput curve"] = curve_markdown(records, curve_plots)
    if not args.no_extras:
        extras.update(extra_sections(steps, models, profiles, args.headroom))
    elapsed = time.perf_counter() - t_start
    say(f"done in {elapsed:.0f} s ({steps.trace_s:.0f} s tracing)")
    command = _command(argv)
    if args.json:
        print(json.dumps(records, indent=2))
    report = markdown(records, command=command, mode=mode, elapsed_s=elapsed, plots=plots, extras=extras,
                      **({} if bisect_steps is None else {"bisect_steps": bisect_steps}))
    if not args.json:
        print(report)
    if results_path:
        pathlib.Path(results_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(results_path).write_text(report + "\n")
        say(f"wrote {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
