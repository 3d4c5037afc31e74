"""Every keras.applications family trained with and without tflms, compared bit for bit.

For each model (``weights=None``, 3 classes, RMSprop, sparse cross-entropy on
logits, 2 steps at batch 2), at each input side of ``--input`` (default: the
smallest input the model accepts, and 96x96: grappler's decisions depend on the
tensor sizes, and issue 30 hid at 96 behind a suite run at the minimum), three
tflms paths are each compared to a plain run of the same path:

- ``fit_t1``: ``model.fit`` + ``tflms.keras.LMS(swapout_threshold=1)``;
- ``fit_budget``: ``model.fit`` + ``LMS(budget=...)``, the budget half the
  simulator's peak for the original step when the tuner can reach it, else the
  smallest peak the tuner reaches (``budget_rule`` in the JSON). At batch 2 the
  peak is at the weight update (weights, gradients, RMSprop slots), which
  swapping activations cannot lower: ResNet50's simulated peak is 471 MB with
  188 MB resident at 32x32 and 96x96, and the tuner gets 510 -> 472 MB at
  224x224. At the minimum inputs this path then swaps nothing ("0 swaps" in the
  table); ``--input 224`` makes it swap;
- ``fit_recompute``: ``model.fit`` + ``LMS(budget=..., recompute="only")``: recompute plans alone (no host
  copies), at the smallest peak they reach (or half the peak where they reach it), so that the step trains with
  as many tensors recomputed as lower its peak (``recomputed`` in the JSON; issue 27's bitwise check);
- ``function``: a GradientTape step (:func:`tflms.testing.make_train_step`) in
  ``tflms.function(swapout_threshold=1)`` against ``tf.function``;
- ``function_hybrid``: the same step with a hybrid plan built by hand (:func:`_hybrid`), against the same
  ``tf.function`` run: every recomputable forward op recomputed (the most clones any plan makes), the memory-aware
  order pinned on the recomputed step (:func:`tflms.passes.order.enforce_order`; ``order_edges`` 0 where it adds
  none), then the distance rules at threshold 1 choose swaps on the ordered step with clones offered
  (:func:`tflms.policies.eligibility.swapping_clones`): the shape of the hybrid search's ordered hybrids with
  clones offered (:func:`tflms.tune.hybrid._ordered_hybrids`). The JSON says how many tensors were ``recomputed``, ops
  ``cloned``, ``swaps``, ``clones_swapped`` and how many of those clones' swap-outs ran (``clone_swapouts_ran``).

Weights and optimizer state are compared by bytes (:mod:`tflms.testing.bitwise`);
a plain-vs-plain control per path (``fit_ctl``, ``function_ctl``) says whether
plain TensorFlow is deterministic for the model at all. From run metadata (the
post-optimization function graphs TensorFlow reported, collected over the whole
run) each tflms path checks that every swap op survived grappler, and counts the
user's op types (swap ops and plumbing aside) with and without tflms:
``op_changes`` lists the types whose counts differ (e.g. ``AddN 142->122``), and
``partition_op_changes`` the same in the partition graphs, after the graph passes
that run past grappler (oneDNN's: e.g. ``MaxPoolGrad 0->8``).

One subprocess per model (a crash, an out-of-memory or the per-model timeout
marks only that model; what finished before is kept), progress lines on stderr,
a table on stdout. With ``--probe`` a model whose plain fit (else plain ``tf.function``
loop) differs from itself is rerun with oneDNN off, with op determinism, and
single-threaded, to name the cause.

    python tools/zoo.py --models ResNet50,MobileNetV2,DenseNet121      # each at its minimum and at 96
    python tools/zoo.py --models ResNet50 --input 224                  # one side
    python tools/zoo.py --quick                   # fit_t1 and its control only
    python tools/zoo.py --models 'EfficientNet*' --json zoo.json --timeout 1200
    python tools/zoo.py --models InceptionV3 --quick --probe   # name the cause of plain nondeterminism
    python tools/zoo.py --models MobileNetV2,DenseNet121 --paths function_ctl,function_hybrid --input 64 --batch 4
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: keras.applications model functions in Keras 3.15 (RegNet is not in keras.applications there).
FAMILIES = (
    "ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2", "VGG16", "VGG19",
    "InceptionV3", "InceptionResNetV2", "Xception", "MobileNet", "MobileNetV2", "MobileNetV3Small",
    "MobileNetV3Large", "DenseNet121", "DenseNet169", "DenseNet201", "NASNetMobile", "NASNetLarge",
    "EfficientNetB0", "EfficientNetB1", "EfficientNetB2", "EfficientNetB3", "EfficientNetB4", "EfficientNetB5",
    "EfficientNetB6", "EfficientNetB7", "EfficientNetV2B0", "EfficientNetV2B1", "EfficientNetV2B2",
    "EfficientNetV2B3", "EfficientNetV2S", "EfficientNetV2M", "EfficientNetV2L", "ConvNeXtTiny", "ConvNeXtSmall",
    "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtXLarge")
#: the smallest input side each model accepts (keras.applications' checks); 32 for the others.
MIN_INPUT = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}
DEFAULT_MIN_INPUT = 32
CLASSES = 3
#: ``--batch`` (default 2), read from the environment so that every worker process uses it. At 2 the peak is at
#: the weight update and neither swapping nor recomputing activations lowers it; recompute plans need a batch
#: whose activations outweigh the weights (``--batch 16 --input 224``).
ENV_BATCH = "TFLMS_ZOO_BATCH"
BATCH = int(os.environ.get(ENV_BATCH, "2"))
STEPS = 2
SEED = 0
#: the hardware profile the budget is simulated for (the tuner's default).
PROFILE = "v100-16gb-pcie3"
#: a budget this close above the resident bytes leaves the tuner nothing to work with.
RESIDENT_MARGIN = 1.05
PATHS = ("fit_ctl", "fit_t1", "fit_budget", "fit_recompute", "function_ctl", "function", "function_hybrid")
QUICK_PATHS = ("fit_ctl", "fit_t1")
#: environment switches a worker reads (the probes for nondeterminism set them).
ENV_SINGLE_THREAD = "TFLMS_ZOO_SINGLE_THREAD"
ENV_OP_DETERMINISM = "TFLMS_ZOO_OP_DETERMINISM"
ENV_INPUT = "TFLMS_ZOO_INPUT"
#: when plain training differs from itself, these variants of the plain fit are tried, in order; the first that
#: makes it deterministic names the cause.
PROBES = (
    ("oneDNN off", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
    ("tf.config.experimental.enable_op_determinism()", {ENV_OP_DETERMINISM: "1"}),
    ("one inter-op and one intra-op thread", {ENV_SINGLE_THREAD: "1"}),
    ("all three", {"TF_ENABLE_ONEDNN_OPTS": "0", ENV_OP_DETERMINISM: "1", ENV_SINGLE_THREAD: "1"}),
)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- worker side
def _input_side(name: str) -> int:
    """The model's minimum input side, or ``--input`` (ENV_INPUT) when that is larger."""
    return max(MIN_INPUT.get(name, DEFAULT_MIN_INPUT), int(os.environ.get(ENV_INPUT, "0")))


def _build(name: str):
    import keras
    keras.utils.set_random_seed(SEED)
    side = _input_side(name)
    return getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3), classes=CLASSES,
                                              classifier_activation=None)


def _data(name: str):
    import numpy as np
    rng = np.random.default_rng(SEED)
    side = _input_side(name)
    x = rng.standard_normal((BATCH * STEPS, side, side, 3)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(BATCH * STEPS,)).astype(np.int32)
    return x, y


def _loss():
    import keras
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _fit(name: str, callback=None):
    """A fresh model fitted for STEPS steps; returns (snapshot, RanGraphs)."""
    import keras

    from tflms.testing import record_run_metadata, snapshot
    keras.backend.clear_session()
    model = _build(name)
    model.compile(optimizer=keras.optimizers.RMSprop(), loss=_loss(), jit_compile=False)
    x, y = _data(name)
    with record_run_metadata() as ran:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[callback] if callback is not None else [])
    return snapshot(model), ran


def _custom_loop(name: str, wrap):
    """A fresh model trained STEPS steps by ``wrap(make_train_step(...))``; returns (snapshot, RanGraphs, fn)."""
    import keras
    import tensorflow as tf

    from tflms.testing import make_train_step, record_run_metadata, snapshot
    keras.backend.clear_session()
    model = _build(name)
    optimizer = keras.optimizers.RMSprop()
    optimizer.build(model.trainable_variables)
    fn = wrap(make_train_step(model, optimizer, _loss()))
    x, y = _data(name)
    with record_run_metadata() as ran:
        losses = [fn(tf.constant(x[i:i + BATCH]), tf.constant(y[i:i + BATCH])) for i in range(0, len(x), BATCH)]
    return snapshot(model, optimizer, losses=losses), ran, fn


def _hybrid(step, x, y):
    """``step`` rewritten by hand with a hybrid plan whose swaps may take recompute clones' outputs, its order
    pinned before the swaps are chosen; returns ``(the function to call, RewriteReport, facts for the JSON)``.

    Every recomputable forward op is recomputed (``tests/test_recompute.py``'s ``_every_recompute``: the most
    clones any plan makes), the recomputed step's memory-aware order is pinned, then the TFLMS distance rules at
    threshold 1 choose swaps on the ordered step inside :func:`~tflms.policies.eligibility.swapping_clones`: the
    shape of the hybrid search's ordered hybrids with clones offered (:func:`tflms.tune.hybrid._ordered_hybrids`,
    tried only when no hybrid fits without), forced here on a step that needs none of it. ``x, y``: the first
    call's arguments (traced, and the call that observes any grappler accumulator's summation order, as
    ``tflms.function`` does).
    """
    import dataclasses

    import tensorflow as tf

    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.devices import resolve_accelerator
    from tflms.ir import tf_io
    from tflms.passes.order import enforce_order
    from tflms.passes.swaps import apply_swaps
    from tflms.pipeline import _build, _traced_and_preoptimized, inserted_ops
    from tflms.policies.eligibility import swapping_clones
    from tflms.policies.recompute import rank_candidates, recompute_plan
    from tflms.policies.tflms_rules import plan_swaps
    from tflms.profiles import get_profile
    from tflms.report import RewriteReport
    from tflms.sim.cost import op_time_s
    from tflms.sim.simulator import SimOptions
    _, pre = _traced_and_preoptimized(tf.function(step), (x, y), example_inputs=(x, y))
    graph = tf_io.load_graph(pre)
    analysis = analyze_graph(graph)
    profile = get_profile(PROFILE)
    ranked, _ = rank_candidates(analysis, lambda n: op_time_s(graph, graph.op(n), profile))
    config = LMSConfig(swapout_threshold=1)
    accelerator = resolve_accelerator(config.accelerator_device)[0]  # as the pipeline plans
    recomputing = recompute_plan(analysis, {op for c in ranked for op in c.chain}, config,
                                 accelerator_device=accelerator)
    recomputes = recomputing.recomputes
    if not recomputes:
        raise RuntimeError("no forward op can be recomputed")
    recomputed = apply_swaps(graph, recomputing).graph
    ordered = enforce_order(recomputed, profile, options=SimOptions(host_device=config.host_device))
    with swapping_clones():  # (a clone may wait across another branch's backward pass)
        swaps = plan_swaps(analyze_graph(ordered.graph), config, accelerator_device=accelerator)
    final = apply_swaps(ordered.graph, swaps).graph  # (the recomputes are in ordered.graph already)
    final.lint()
    plan = dataclasses.replace(swaps, recomputes=recomputes)
    inserted = inserted_ops(graph, final)  # clones, their gates and the swap ops
    report = RewriteReport(plan=plan, graph_summary=analysis.summary(), inserted_ops=inserted, timings_s={},
                           order={**ordered.report.to_dict(), "before_swaps": True} if ordered.changed else None)
    facts = {"recomputed": report.num_recomputed, "cloned": sum(len(r.ops) for r in recomputes),
             "swaps": len(plan.swaps), "order_edges": ordered.report.num_edges if ordered.changed else 0,
             "order_why": ordered.report.why}
    return _build(final, pre, inserted), report, facts


def _hybrid_checks(ran, report) -> dict[str, Any]:
    """What of the hand-made hybrid's clones, and of the swapped clones' swap-outs, TensorFlow ran (the step's
    graphs after grappler, and its partitions)."""
    from tflms.policies.eligibility import is_clone
    step = ran.step_graph(report.inserted_ops)
    graphs = [step.post_optimization_graph, *step.partition_graphs] if step is not None else []
    names = {n.name for g in graphs for n in g.node}
    clones = [c for r in report.plan.recomputes for c in r.clones]
    swapouts = [s.swap_out for s in report.plan.swaps if is_clone(s.tensor.op)]
    return {"clones_ran": sum(1 for n in clones if n in names), "clones_swapped": len(swapouts),
            "clone_swapouts_ran": sum(1 for n in swapouts if n in names)}


def _compare(reference, candidate) -> dict[str, Any]:
    from tflms.testing import differences
    found = differences(reference, candidate)
    worst = max((d.max_abs_diff for d in found if d.max_abs_diff == d.max_abs_diff), default=0.0)
    return {"identical": not found, "num_differing": len(found), "num_entries": len(reference),
            "first_difference": str(found[0]) if found else None, "max_abs_diff": worst}


def _ran_checks(plain_ran, lms_ran, reports) -> dict[str, Any]:
    """Swap ops alive in what TF ran, and the user's op-type counts with and without tflms."""
    from tflms.testing import op_type_counts
    from tflms.testing.ran import count_differences
    inserted = sorted({n for r in reports for n in r.inserted_ops})
    missing = sorted({m for r in reports for m in lms_ran.missing_after_optimization(r.inserted_ops)})
    plain_step = plain_ran.step_graph()
    lms_step = lms_ran.step_graph(reports[-1].inserted_ops) if reports else None
    out: dict[str, Any] = {"swapped": sum(r.num_swapped for r in reports), "swap_ops": len(inserted),
                           "swap_ops_missing": len(missing), "missing_examples": missing[:5]}
    if plain_step is not None and lms_step is not None:
        plain = op_type_counts(plain_step.post_optimization_graph)
        lms = op_type_counts(lms_step.post_optimization_graph, exclude_names=inserted)
        out["op_changes"] = {t: list(v) for t, v in count_differences(plain, lms).items()}
        # grappler's gradient accumulators in the plain step (each ends in a DestroyTemporaryVariable): their
        # AssignAdds' order is what tflms must keep (docs/design.md, "Exceptions to bitwise")
        out["plain_accumulators"] = plain.get("DestroyTemporaryVariable", 0)
        # after the graph passes that run past grappler (oneDNN's layout pass): NASNetMobile's MaxPoolGrad lost its
        # oneDNN kernel with unchanged grappler counts
        plain_parts = _partition_counts(plain_step, ())
        lms_parts = _partition_counts(lms_step, inserted)
        out["partition_op_changes"] = {t: list(v) for t, v in count_differences(plain_parts, lms_parts).items()}
    else:
        out["op_changes"] = None
        out["partition_op_changes"] = None
    return out


def _partition_counts(function_graphs, inserted) -> dict[str, int]:
    """Op-type counts over a step's partition graphs (what the executor ran), swap ops and plumbing aside."""
    from tflms.testing import op_type_counts
    total: dict[str, int] = {}
    for graph in function_graphs.partition_graphs:
        for op, n in op_type_counts(graph, exclude_names=inserted).items():
            total[op] = total.get(op, 0) + n
    return total


def _budget_for(callback, name: str, recompute: str = "auto") -> tuple[int, str, dict[str, int]]:
    """About half the simulated peak of the original step the callback traced.

    Half the peak when the tuner finds a rewrite that fits it; otherwise (the
    peak is not where activations are live, or the weights alone take half) the
    smallest peak the tuner reaches, as its ``BudgetError`` reports. ``recompute``:
    :attr:`LMSConfig.recompute` of that tune (``"only"``: the smallest peak recomputing alone reaches).
    """
    from tflms.config import LMSConfig
    from tflms.errors import BudgetError
    from tflms.ir.tf_io import load_graph
    from tflms.sim.simulator import simulate
    from tflms.tune.tuner import tune
    original = callback._order[0].original  # noqa: SLF001 - the ConcreteFunction Keras traced (tool-only use)
    graph = load_graph(original, batch_size=BATCH)
    sim = simulate(graph, PROFILE)
    facts = {"peak_bytes": sim.peak_with_margin_bytes, "resident_bytes": sim.resident_bytes}
    budget = sim.peak_with_margin_bytes // 2
    try:
        tune(graph, budget=budget, profile=PROFILE, config=LMSConfig(batch_size=BATCH, recompute=recompute),
             first_fit=True)
        return budget, "half the peak", facts
    except BudgetError as err:
        smallest = min(c.sim.peak_with_margin_bytes for c in err.candidates)
        return smallest, "half does not fit: the smallest peak the tuner reaches", facts


def run_worker(name: str, paths: tuple[str, ...], out_path: str | None = None) -> dict[str, Any]:
    """Run the paths for one model; with ``out_path`` the results so far are written after every path."""
    import keras
    import tensorflow as tf

    import tflms
    import tflms.keras
    if os.environ.get(ENV_SINGLE_THREAD):
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    if os.environ.get(ENV_OP_DETERMINISM):
        tf.config.experimental.enable_op_determinism()
    result: dict[str, Any] = {"model": name, "input": _input_side(name), "tf": tf.__version__,
                              "keras": keras.__version__, "paths": {}}
    t_model = time.perf_counter()

    def timed(label: str, fn):
        t0 = time.perf_counter()
        out = fn()
        _say(f"  {name}: {label} {time.perf_counter() - t0:.1f}s")
        return out

    def guarded(path: str, fn) -> None:
        try:
            result["paths"][path] = fn()
        except Exception as err:  # noqa: BLE001 - one path failing must not hide the others
            result["paths"][path] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            _say(f"  {name}: {path} failed: {type(err).__name__}: {str(err)[:200]}")
        result["seconds"] = round(time.perf_counter() - t_model, 1)
        if out_path:  # a later timeout or crash keeps what finished
            with open(out_path, "w") as f:
                json.dump(result, f)

    need_fit = any(p.startswith("fit") for p in paths)
    if need_fit:
        plain, plain_ran = timed("fit plain", lambda: _fit(name))
        if "fit_ctl" in paths:
            guarded("fit_ctl", lambda: _compare(plain, timed("fit plain (control)", lambda: _fit(name))[0]))
        lms_t1 = None
        if "fit_t1" in paths or "fit_budget" in paths or "fit_recompute" in paths:
            def fit_t1():
                nonlocal lms_t1
                lms_t1 = tflms.keras.LMS(swapout_threshold=1, verbose=0)
                state, ran = timed("fit LMS(swapout_threshold=1)", lambda: _fit(name, lms_t1))
                return {**_compare(plain, state), **_ran_checks(plain_ran, ran, lms_t1.reports)}
            guarded("fit_t1", fit_t1)
        if "fit_budget" in paths:
            def fit_budget():
                if lms_t1 is None or not lms_t1.reports:
                    raise RuntimeError("no traced step to simulate (fit_t1 failed)")
                budget, rule, sim = _budget_for(lms_t1, name)
                lms = tflms.keras.LMS(budget=budget, profile=PROFILE, verbose=0)
                state, ran = timed(f"fit LMS(budget={budget})", lambda: _fit(name, lms))
                tuning = lms.reports[-1].tuning or {}
                return {**_compare(plain, state), **_ran_checks(plain_ran, ran, lms.reports), "budget_bytes": budget,
                        "budget_rule": rule, **sim, "strategy": tuning.get("strategy"),
                        "predicted_peak_bytes": tuning.get("predicted_peak_bytes")}
            guarded("fit_budget", fit_budget)
        if "fit_recompute" in paths:
            def fit_recompute():
                if lms_t1 is None or not lms_t1.reports:
                    raise RuntimeError("no traced step to simulate (fit_t1 failed)")
                budget, rule, sim = _budget_for(lms_t1, name, recompute="only")
                lms = tflms.keras.LMS(budget=budget, profile=PROFILE, recompute="only", verbose=0)
                state, ran = timed(f"fit LMS(budget={budget}, recompute='only')", lambda: _fit(name, lms))
                tuning = lms.reports[-1].tuning or {}
                return {**_compare(plain, state), **_ran_checks(plain_ran, ran, lms.reports), "budget_bytes": budget,
                        "budget_rule": rule, **sim, "strategy": tuning.get("strategy"),
                        "recomputed": lms.reports[-1].num_recomputed,
                        "predicted_peak_bytes": tuning.get("predicted_peak_bytes")}
            guarded("fit_recompute", fit_recompute)
    if {"function_ctl", "function", "function_hybrid"} & set(paths):
        plain, plain_ran, _ = timed("tf.function", lambda: _custom_loop(name, tf.function))
        if "function_ctl" in paths:
            guarded("function_ctl", lambda: _compare(
                plain, timed("tf.function (control)", lambda: _custom_loop(name, tf.function))[0]))
        if "function" in paths:
            def function():
                state, ran, fn = timed("tflms.function(swapout_threshold=1)", lambda: _custom_loop(
                    name, lambda step: tflms.function(step, swapout_threshold=1)))
                return {**_compare(plain, state), **_ran_checks(plain_ran, ran, fn.reports)}
            guarded("function", function)
        if "function_hybrid" in paths:
            def function_hybrid():
                built: dict[str, Any] = {}

                def wrap(step):
                    x, y = _data(name)
                    fn, built["report"], built["facts"] = timed("hybrid plan (recompute all, order, swaps)", lambda:
                                                                _hybrid(step, tf.constant(x[:BATCH]),
                                                                        tf.constant(y[:BATCH])))
                    return fn
                state, ran, _ = timed("hybrid step, built and trained", lambda: _custom_loop(name, wrap))
                report = built["report"]
                return {**_compare(plain, state), **_ran_checks(plain_ran, ran, [report]), **built["facts"],
                        **_hybrid_checks(ran, report)}
            guarded("function_hybrid", function_hybrid)
    result["seconds"] = round(time.perf_counter() - t_model, 1)
    return result


# ----------------------------------------------------------------- parent side
def _select(patterns: str | None) -> list[str]:
    if not patterns:
        return list(FAMILIES)
    chosen = []
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        matches = [f for f in FAMILIES if fnmatch.fnmatchcase(f.lower(), pattern.lower())]
        if not matches:
            raise SystemExit(f"zoo: no keras.applications model matches {pattern!r}; known: {', '.join(FAMILIES)}")
        chosen += [m for m in matches if m not in chosen]
    return chosen


#: the input sides every model runs at by default: its minimum and 96x96.
DEFAULT_INPUTS = ("min", "96")


def _parse_inputs(text: str) -> tuple[int, ...]:
    """``--input``'s sides (0 for 'min'), in the order given; a ValueError names a bad one."""
    sides = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "min":
            sides.append(0)
        elif part.isdigit() and int(part) > 0:
            sides.append(int(part))
        else:
            raise ValueError(f"--input: {part!r} is not an input side (a positive number of pixels, or 'min')")
    if not sides:
        raise ValueError("--input: give at least one input side (e.g. 'min,96')")
    return tuple(sides)


def input_sides(name: str, sides: tuple[int, ...]) -> list[int]:
    """The distinct sides ``name`` runs at: each of ``sides`` raised to its minimum, in order."""
    minimum = MIN_INPUT.get(name, DEFAULT_MIN_INPUT)
    return list(dict.fromkeys(max(minimum, s) for s in sides))


def run_model(name: str, paths: tuple[str, ...], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one model in its own Python process; a crash or timeout becomes an ``error`` entry."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        out_path = out.name
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--out", out_path, "--paths", ",".join(paths)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    tail: list[str] = []

    def pump():  # progress lines through, TF's log noise kept for the error message
        for line in proc.stderr:
            if line.startswith(f"  {name}:"):
                _say(line.rstrip())
            else:
                tail.append(line.rstrip())
                del tail[:-20]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    t0 = time.perf_counter()
    problem = None
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        problem = f"timeout after {timeout_s:.0f}s"
    reader.join(5)
    try:
        with open(out_path) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError):
        result = None
    finally:
        os.unlink(out_path)
    if problem is None and (result is None or not result.get("complete")):
        last = next((line for line in reversed(tail) if line.strip()), "")
        problem = f"worker exited with code {proc.returncode}: {last[:200]}"
    if result is None:
        return {"model": name, "error": problem, "seconds": round(time.perf_counter() - t0)}
    if problem:
        result["error"] = f"{problem} (after {', '.join(result['paths']) or 'no path'})"
    return result


def probe_nondeterminism(name: str, timeout_s: float, env: dict[str, str] | None = None,
                         control: str = "fit_ctl") -> str:
    """Which of :data:`PROBES` makes the plain run of ``control`` (``fit_ctl``, ``function_ctl``) equal itself: a
    cause, or that none did."""
    what = "fit" if control == "fit_ctl" else "tf.function loop"
    for label, probe in PROBES:
        _say(f"  {name}: plain {what} differs from itself; probing with {label}")
        entry = run_model(name, (control,), timeout_s, {**(env or {}), **probe}).get("paths", {}).get(control, {})
        if entry.get("identical"):
            return f"deterministic with {label}"
    return "still nondeterministic with oneDNN off, op determinism and one thread: cause not found"


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if "error" in entry:
        return "ERROR"
    if entry["identical"]:
        text = "same"
    else:
        text = f"DIFF {entry['max_abs_diff']:.1e}" if entry["max_abs_diff"] else "DIFF bits"
    if "clones_swapped" in entry:  # function_hybrid
        text += (f" ({entry['recomputed']} recomputed; {entry['swaps']} swaps, {entry['clones_swapped']} of clones, "
                 f"{entry['clone_swapouts_ran']} of those ran; {entry['order_edges']} order edges)")
    elif "recomputed" in entry:
        text += f" ({entry['recomputed']} recomputed)"
    elif entry.get("swapped") == 0:
        text += " (0 swaps)"
    if entry.get("plain_accumulators"):
        n = entry["plain_accumulators"]
        text += f" ({n} accumulator{'s' if n > 1 else ''})"
    if entry.get("swap_ops_missing"):
        text += f" ({entry['swap_ops_missing']} swaps lost)"
    return text


def _op_changes(entry: dict[str, Any] | None) -> str:
    if not entry or "error" in entry or entry.get("op_changes") is None:
        return "-"
    def show(changes):
        biggest = sorted(changes.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:4]
        return " ".join(f"{t} {a}->{b}" for t, (a, b) in biggest)

    text = show(entry["op_changes"]) or "none"
    after = entry.get("partition_op_changes")
    if after:
        text += f"; after oneDNN's pass: {show(after)}"
    return text


#: the paths whose op-type changes the table shows: fit_t1's, else the first of the others that ran.
OP_CHANGE_PATHS = ("fit_t1", "function", "function_hybrid", "fit_budget", "fit_recompute")


def _op_changes_of(result: dict[str, Any]) -> str:
    """The table's op-type changes of one run: fit_t1's, else those of the first tflms path that ran, named."""
    for path in OP_CHANGE_PATHS:
        entry = result["paths"].get(path)
        if entry and "error" not in entry:
            text = _op_changes(entry)
            return text if path == "fit_t1" else f"{path}: {text}"
    return "-"


def table(results: list[dict[str, Any]]) -> str:
    width = {p: max([16] + [len(_cell(r["paths"].get(p))) + 2 for r in results if "paths" in r]) for p in PATHS}
    header = (f"{'model':<20}{'in':>4}  " + "".join(f"{p:<{width[p]}}" for p in PATHS)
              + f"{'sec':>6}  op-type changes (fit_t1, else the path named)")
    lines = [header, "-" * len(header)]
    for r in results:
        if "paths" not in r:
            lines.append(f"{r['model']:<20}{'':>4}  {r['error']}")
            continue
        cells = "".join(f"{_cell(r['paths'].get(p)):<{width[p]}}" for p in PATHS)
        changes = _op_changes_of(r)
        lines.append(f"{r['model']:<20}{r['input']:>4}  {cells}{r['seconds']:>6.0f}  {changes}")
    notes = []
    for r in results:
        for path in ("fit_ctl", "function_ctl"):
            entry = r.get("paths", {}).get(path)
            if entry and "error" not in entry and not entry["identical"]:
                probed = r.get("probed")
                cause = (r.get("nondeterminism") if probed == path else "not probed (--probe)" if probed is None
                         else f"not probed (--probe probed {probed}, the first control that differed)")
                notes.append(f"  {r['model']}: plain {path[:-4]} is nondeterministic ({entry['first_difference']}); "
                             f"{cause}")
        if "paths" in r and r.get("error"):
            notes.append(f"  {r['model']}: {r['error']}")
        for path, entry in r.get("paths", {}).items():
            if "error" in entry:
                notes.append(f"  {r['model']} {path}: {entry['error']}")
    if notes:
        lines += ["", "notes:"] + notes
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names or globs (default: every family)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_PATHS)}")
    parser.add_argument("--paths", help=f"comma-separated subset of {', '.join(PATHS)} (function_hybrid: every "
                        "recomputable op recomputed, the order pinned, then swaps that may take clones' outputs; "
                        "`--paths function_ctl,function_hybrid --input 64 --batch 4`)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per model (default 1800)")
    parser.add_argument("--input", default=",".join(DEFAULT_INPUTS),
                        help="comma-separated input sides, each run for every model ('min': its minimum; a side "
                             "below a model's minimum is raised to it; default: %(default)s). At the minimum the "
                             "simulated peak is at the weight update, so the budget path swaps nothing")
    parser.add_argument("--probe", action="store_true",
                        help="when a plain fit (or tf.function loop, without fit_ctl) differs from itself, retry "
                             "it with oneDNN off / op determinism / one thread to name the cause")
    parser.add_argument("--batch", type=int, help=f"batch size of every fit and step (default {BATCH}); "
                        "`--paths fit_ctl,fit_recompute --batch 16 --input 224` trains with recompute plans")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch is not None:
        if args.batch <= 0:
            parser.error(f"--batch must be positive, got {args.batch}")
        BATCH = args.batch
        os.environ[ENV_BATCH] = str(args.batch)  # the workers read it
    paths = QUICK_PATHS if args.quick else PATHS
    if args.paths:
        paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
        unknown = sorted(set(paths) - set(PATHS))
        if unknown:
            parser.error(f"unknown paths {unknown}; choose from {list(PATHS)}")
    if args.worker:
        result = run_worker(args.worker, paths, args.out)
        result["complete"] = True
        with open(args.out, "w") as f:
            json.dump(result, f)
        return 0
    models = _select(args.models)
    try:
        sides = _parse_inputs(args.input)
    except ValueError as err:
        parser.error(str(err))
    runs = [(name, side) for name in models for side in input_sides(name, sides)]
    _say(f"zoo: {len(models)} models, {len(runs)} runs (inputs {args.input}), paths {', '.join(paths)}, batch {BATCH}, "
         f"{STEPS} steps, TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}")
    results = []
    for i, (name, side) in enumerate(runs, 1):
        _say(f"[{i}/{len(runs)}] {name} at {side}x{side}")
        env = {ENV_INPUT: str(side)}  # the worker reads its input side from it
        result = run_model(name, paths, args.timeout, env)
        result.setdefault("input", side)
        differing = [p for p in ("fit_ctl", "function_ctl")
                     if (result.get("paths", {}).get(p) or {}).get("identical") is False]
        if args.probe and differing:
            result["nondeterminism"] = probe_nondeterminism(name, args.timeout, env, differing[0])
            result["probed"] = differing[0]
        results.append(result)
        _say(f"[{i}/{len(runs)}] {name} at {side}: " + ", ".join(
            [f"{p} {_cell(e)}" for p, e in result.get("paths", {}).items()] + [result.get("error") or ""]).strip(", "))
    print(table(results))
    if args.json:
        text = json.dumps(results, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
