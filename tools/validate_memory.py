"""Validate the simulator's peak memory against TensorFlow's executor and grappler.

For each model (a Keras MLP with Adam, a CNN with BatchNorm and SGD momentum, a small
ResNet with SGD momentum), the training step is a custom ``tf.function`` traced with
``get_concrete_function``. Two variants of each step are compared:

- ``original``: the traced step as it is;
- ``rewritten``: the tflms rewrite chosen as the pipeline chooses it for the Keras
  callback (``copy_op="DeepCopy"``, swap-ins on the emulated accelerator
  ``/device:CPU:1``, swap-outs on the host ``/device:CPU:0``) for a budget of
  ``resident + --budget-fraction x transient`` of the simulated original (raised in
  steps of 0.1 when nothing fits): the tuner with the enforced order, the order pass
  when the tuner judged its winner in that order, and the budget guarantee
  (:func:`tflms.passes.order.hold_to_budget`: the tuner's pinned order kept, every
  order proved within the budget, or level order pinned). ``--free-order`` leaves the
  executor free instead (what issue 31 measured: the tuned 3D U-Net peaked 8% over its
  budget). With ``--threshold N``, a plain rewrite with ``swapout_threshold=N``.

Peaks (accelerator, *transient*: step buffers only, without variables, constants and
fed inputs, the same quantity the executor measurement reports):

- ``sim level``: the simulator on the CTO level order (what the tuner sees);
- ``sim exec``: the simulator on the executor's observed op order (from the traced
  step's node start times, mapped to the IR by name);
- ``sim replay``: the simulator replaying the observed start/end time of every op (it
  checks the memory model alone: the schedule is the executor's);
- ``grappler``: grappler's virtual-cluster peak (``tflms.measure.grappler``);
- ``executor``: TensorFlow's executor on two logical CPUs, from the allocation records
  of a traced step (``tflms.measure.executor``); all graphs run in one subprocess,
  ``--repeat`` times each. Its two inter-op threads make the peak vary from run to run
  (two ops that overlap cannot reuse each other's inputs), so the table shows the
  median run, the range, and compares the simulator with the median.

The simulator runs with ``tflms.measure.EMULATION_PROFILE`` (the emulated machine's
speeds: when a copy lands relative to compute decides what is live) and
``EMULATION_SIM_OPTIONS`` (host device, oneDNN kernel workspaces). With ``--calibrate``
the tool first measures every original step ``--repeat`` times and calibrates that
profile's op times from them (``tflms.measure.calibrate``: per op type, the launch
overhead, the host link when copies were measured); the tuner plans and the simulator
runs with the calibrated profile, and the calibration is printed before the table.
``step sim/ex`` compares the simulated step time with the measured one. ``sim total`` adds
the resident bytes. For the rewritten variant the tool also checks that the variables
after one step are bitwise identical to the original's.

Usage (from the repo root)::

    python tools/validate_memory.py                 # table on stdout, progress on stderr
    python tools/validate_memory.py --json          # records for machines
    python tools/validate_memory.py --models cnn --threshold 8 --repeat 5
    python tools/validate_memory.py --models resnet50,unet3d    # the real models, minutes
    python tools/validate_memory.py --models resnet50,unet3d --calibrate
    python tools/validate_memory.py --models bert,bert12 --recompute only    # recompute plans, the kit's encoder
    python tools/validate_memory.py --load      # another TensorFlow job runs beside every measurement
    python tools/validate_memory.py --models unet3d --free-order   # no order pinned: the executor's own

The default run takes about half a minute on two cores. ``--models resnet50,unet3d``
adds keras.applications ResNet-50 (224x224, batch 8) and the 3D U-Net of
``tflms.models`` (64^3 voxels, batch 1). Records carry the batch, how the budget is held
(``guarantee``) and whether the executor's total peak stayed under the budget the tuner was
given in every run (``executor_within_budget``: the largest run counts). ``--load`` runs
another TensorFlow process (matrix products on both cores) beside the measurements, as a
loaded machine would.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from typing import Any, Callable

import numpy as np

#: Models the tool runs by default, in table order (small: about half a minute in all).
MODELS = ("mlp", "cnn", "resnet")
#: Models run when named with --models (minutes: ResNet-50 at 224x224 runs on the CPU executor; bert is the kit's
#: BERT-style encoder with dropout and BatchNorm, 2 layers; bert12 the same at BERT-base's 12 layers).
LARGE_MODELS = ("resnet50", "unet3d", "bert", "bert12")
#: Budget for the tuner: resident bytes + this fraction of the original's simulated transient peak.
DEFAULT_BUDGET_FRACTION = 0.65
#: If nothing fits, the fraction is raised by this step, at most this many times.
BUDGET_FRACTION_STEP, BUDGET_FRACTION_TRIES = 0.1, 3
#: The simulator is meant to be within this relative error of the executor.
TARGET_RELATIVE_ERROR = 0.10
#: Executor runs per graph: its two inter-op threads make the peak vary from run to run.
DEFAULT_REPEAT = 3
#: Seed for model weights and data.
SEED = 0
#: The measuring subprocess's time limit per graph run (its default, 300 s for all of them, ran out for 10 graphs x
#: 5 runs on a 2-core machine with --load and other jobs).
SUBPROCESS_S_PER_RUN = 120


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ models


def _mlp(keras: Any, batch: int):
    """8 x Dense(512, relu) on 256 features, Adam; batch 2048: 4 MiB activations, 1 MiB weights."""
    model = keras.Sequential([keras.Input((256,))]
                             + [keras.layers.Dense(512, activation="relu", name=f"dense_{i}") for i in range(8)]
                             + [keras.layers.Dense(10, name="logits")], name="mlp")
    return model, keras.optimizers.Adam(learning_rate=1e-3), (batch, 256), (batch,), 10


def _cnn(keras: Any, batch: int):
    """Three stages of 2 x (Conv2D 3x3 + BatchNorm + ReLU) + MaxPool (16, 32, 64 filters), SGD momentum."""
    layers = keras.layers
    inputs = keras.Input((32, 32, 3))
    h = inputs
    for stage, filters in enumerate((16, 32, 64)):
        for j in range(2):
            h = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"s{stage}_conv{j}")(h)
            h = layers.BatchNormalization(name=f"s{stage}_bn{j}")(h)
            h = layers.ReLU(name=f"s{stage}_relu{j}")(h)
        h = layers.MaxPooling2D(name=f"s{stage}_pool")(h)
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = layers.Dense(10, name="logits")(h)
    return (keras.Model(inputs, outputs, name="cnn"), keras.optimizers.SGD(0.05, momentum=0.9), (batch, 32, 32, 3),
            (batch,), 10)


def _resnet(keras: Any, batch: int):
    """A stem and three residual blocks (16, 32, 32 filters; BN; projection shortcuts), SGD momentum."""
    layers = keras.layers
    inputs = keras.Input((32, 32, 3))
    h = layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    h = layers.ReLU(name="stem_relu")(layers.BatchNormalization(name="stem_bn")(h))
    for i, filters in enumerate((16, 32, 32)):
        stride = 1 if i == 0 else 2
        shortcut = h
        r = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=f"b{i}_conv0")(h)
        r = layers.ReLU(name=f"b{i}_relu0")(layers.BatchNormalization(name=f"b{i}_bn0")(r))
        r = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"b{i}_conv1")(r)
        r = layers.BatchNormalization(name=f"b{i}_bn1")(r)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"b{i}_proj")(shortcut)
            shortcut = layers.BatchNormalization(name=f"b{i}_proj_bn")(shortcut)
        h = layers.ReLU(name=f"b{i}_out")(layers.Add(name=f"b{i}_add")([r, shortcut]))
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = layers.Dense(10, name="logits")(h)
    return (keras.Model(inputs, outputs, name="resnet"), keras.optimizers.SGD(0.05, momentum=0.9),
            (batch, 32, 32, 3), (batch,), 10)


def _resnet50(keras: Any, batch: int):
    """keras.applications ResNet50 (weights=None) at 224x224x3, 10 classes, SGD momentum."""
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=10,
                                        classifier_activation=None)
    return model, keras.optimizers.SGD(0.05, momentum=0.9), (batch, 224, 224, 3), (batch,), 10


def _unet3d(keras: Any, batch: int):
    """The 3D U-Net of tflms.models (depth 3, 8 base filters) at 64^3 voxels, 4 channels, 4 classes, Adam."""
    from tflms.models import build_unet3d
    model = build_unet3d(channels=4, classes=4, base_filters=8, depth=3)
    return model, keras.optimizers.Adam(1e-3), (batch, 64, 64, 64, 4), (batch, 64, 64, 64), 4


def _bert(keras: Any, batch: int):
    """The BERT-style encoder of tflms.testing with BERT's dropout (0.1) and a BatchNorm on the pooled output
    (``bert_dropout_bn``), 2 layers of width 64, 64 tokens (int32 ids), Adam."""
    from tflms.testing import build_model
    model = build_model("bert_dropout_bn", seed=SEED, length=64, width=64, heads=4, layers=2, vocab=256)
    return model, keras.optimizers.Adam(1e-3), (batch, 64), (batch,), 5


def _bert12(keras: Any, batch: int):
    """``bert`` at BERT-base's depth: 12 layers (width 64, 4 heads, 64 tokens). One activation more or less, what the
    executor's two inter-op threads vary by, is a smaller part of a deeper step's peak."""
    from tflms.testing import build_model
    model = build_model("bert_dropout_bn", seed=SEED, length=64, width=64, heads=4, layers=12, vocab=256)
    return model, keras.optimizers.Adam(1e-3), (batch, 64), (batch,), 5


#: model -> (builder, default batch); the builder returns (model, optimizer, x shape, label shape, classes)
_BUILDERS: dict[str, tuple[Callable, int]] = {"mlp": (_mlp, 2048), "cnn": (_cnn, 32), "resnet": (_resnet, 32),
                                              "resnet50": (_resnet50, 8), "unet3d": (_unet3d, 1),
                                              "bert": (_bert, 32), "bert12": (_bert12, 32)}


@dataclasses.dataclass
class Case:
    """One model's traced training step, its IR graph and the data of one step."""

    model: str
    concrete_function: Any
    graph: Any  # tflms.ir.Graph
    args: tuple[np.ndarray, np.ndarray]
    owners: tuple[Any, ...] = ()  # the model and optimizer: a traced function holds its variables weakly
    batch: int = 0


def build_case(model: str, *, batch: int | None = None, seed: int = SEED) -> Case:
    """Build ``model`` (one of :data:`MODELS`), trace its training step and make one batch of data."""
    import keras
    import tensorflow as tf

    from tflms.ir import tf_io
    from tflms.testing import make_train_step

    builder, default_batch = _BUILDERS[model]
    keras.utils.set_random_seed(seed)
    net, optimizer, x_shape, y_shape, classes = builder(keras, batch or default_batch)
    optimizer.build(net.trainable_variables)  # create the slots outside the traced step
    train_step = tf.function(make_train_step(net, optimizer))

    tokens = net.inputs[0].dtype == "int32"  # token ids (bert): ids in [1, 256), no padding
    concrete = train_step.get_concrete_function(tf.TensorSpec(x_shape, tf.int32 if tokens else tf.float32),
                                                tf.TensorSpec(y_shape, tf.int32))
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 256, x_shape).astype(np.int32) if tokens else rng.standard_normal(x_shape).astype(np.float32)
    args = (x, rng.integers(0, classes, y_shape).astype(np.int32))
    return Case(model, concrete, tf_io.from_concrete_function(concrete), args, owners=(net, optimizer),
                batch=x_shape[0])


# ------------------------------------------------------------------------------------------------ rewrites


@dataclasses.dataclass
class Variant:
    """A graph to validate and how it was made."""

    model: str
    variant: str  # "original" or "rewritten"
    graph: Any
    params: dict[str, Any]
    budget_bytes: int | None = None
    swapped_tensors: int = 0
    clone_triggers: dict[str, str] = dataclasses.field(default_factory=dict)  # recompute clone -> its trigger


def rewrite_config(**params: Any):
    """The LMSConfig of the emulation: swap-ins on CPU:1, swap-outs on CPU:0."""
    from tflms.config import LMSConfig
    from tflms.measure import ACCELERATOR_DEVICE, HOST_DEVICE
    return LMSConfig(accelerator_device=ACCELERATOR_DEVICE, host_device=HOST_DEVICE, **params)


def tuned_rewrite(case: Case, budget_fraction: float, free_order: bool = False, profile: Any = None,
                  recompute: str = "auto") -> Variant:
    """The pipeline's rewrite for ``resident + budget_fraction * transient`` (raised until something fits),
    planned with ``profile`` (default ``EMULATION_PROFILE``): the stages of
    :func:`tflms.pipeline.rewrite_step` for a budget, on the emulated machine's simulator options.
    ``free_order``: no order edges and no budget guarantee (the executor takes its own order)."""
    from tflms.errors import BudgetError
    from tflms.measure import EMULATION_PROFILE, EMULATION_SIM_OPTIONS, planning_for_emulation
    from tflms.sim.simulator import simulate
    from tflms.tune import tune

    profile = profile or EMULATION_PROFILE
    base = simulate(case.graph, profile, options=EMULATION_SIM_OPTIONS)
    error = None
    for attempt in range(BUDGET_FRACTION_TRIES):
        fraction = budget_fraction + attempt * BUDGET_FRACTION_STEP
        budget = int(base.resident_bytes + fraction * base.transient_peak_bytes)
        try:
            with planning_for_emulation():  # the emulated accelerator's kernels, not this process's
                result = tune(case.graph, budget=budget, profile=profile, config=rewrite_config(recompute=recompute),
                              copy_op="DeepCopy", sim_options=EMULATION_SIM_OPTIONS, enforce_order=not free_order)
        except BudgetError as exc:
            error = exc
            progress(f"  {case.model}: nothing fits {fraction:.2f} of the transient peak; trying more")
            continue
        swapped = 0 if result.best.plan is None else len(result.best.plan.swaps)
        params = {"strategy": result.strategy, **result.best.params, "budget_fraction": round(fraction, 3)}
        triggers = {} if result.best.plan is None else {
            clone: trigger for r in result.best.plan.recomputes for clone, trigger in zip(r.clones, r.triggers)}
        graph = result.graph
        if not free_order:  # the pipeline's stages: the order the tuner judged in, then the budget guarantee
            from tflms.passes.order import apply_tuned_order, hold_to_budget
            graph, order = apply_tuned_order(graph, result.best.order, profile, options=EMULATION_SIM_OPTIONS)
            graph, order = hold_to_budget(graph, order, budget_bytes=budget, options=EMULATION_SIM_OPTIONS)
            params["order"] = order.get("heuristic") if order.get("applied") else "free"
            params["order_edges"] = order.get("edges", 0) if order.get("applied") else 0
            params["guarantee"] = order["guarantee"]
        return Variant(case.model, "rewritten", graph, params, budget_bytes=budget, swapped_tensors=swapped,
                       clone_triggers=triggers)
    raise error


#: The other TensorFlow job of --load: matrix products on every core until it is stopped (or for an hour).
LOAD_SCRIPT = """
import time, tensorflow as tf
a = tf.random.normal([1024, 1024])
end = time.time() + 3600
while time.time() < end:
    a = tf.tanh(tf.matmul(a, a) * 1e-3)
"""


@contextlib.contextmanager
def beside_load():
    """Run :data:`LOAD_SCRIPT` in another process while the block runs (a loaded machine)."""
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    progress(f"another TensorFlow job runs beside the measurements (pid {proc.pid})")
    try:
        time.sleep(5)  # past its TensorFlow import: busy before the first measurement
        yield
    finally:
        proc.kill()
        proc.wait()


def threshold_rewrite(case: Case, threshold: int) -> Variant:
    import tflms
    from tflms.measure import planning_for_emulation
    with planning_for_emulation():
        result = tflms.rewrite(case.graph, rewrite_config(swapout_threshold=threshold), copy_op="DeepCopy")
    return Variant(case.model, "rewritten", result.graph, {"swapout_threshold": threshold},
                   swapped_tensors=result.report.num_swapped)


def segment_rewrite(case: Case, segments: int, split: int | None) -> Variant:
    """Graph-level checkpointing with ``segments`` segments, every recomputable op of a segment re-run
    (:func:`tflms.policies.checkpoints.segment_ops`), its chains re-run again past ``split`` levels
    (``plan_recomputes(split_levels=)``); no swaps, no budget, no order pinned (the executor takes its own)."""
    from tflms.analysis.cto import analyze_graph
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import recompute_plan, segment_ops
    config = rewrite_config(recompute="only")
    analysis = analyze_graph(case.graph)
    plan = recompute_plan(analysis, segment_ops(analysis, segments), config,
                          accelerator_device=config.accelerator_device, split_levels=split)
    decisions = plan.recomputes
    if not decisions:
        raise SystemExit(f"{case.model}: {segments} segments recompute nothing")
    graph = apply_swaps(case.graph, plan, copy_op="DeepCopy").graph
    triggers = {clone: trigger for r in decisions for clone, trigger in zip(r.clones, r.triggers)}
    params = {"segments": segments, "split": split, "cloned": len(triggers),
              "re_runs": sum(1 for r in decisions if r.copy)}
    return Variant(case.model, "rewritten", graph, params, clone_triggers=triggers)


# ------------------------------------------------------------------------------------------------ validation


@dataclasses.dataclass
class Record:
    model: str
    batch: int
    variant: str
    params: dict[str, Any]
    swapped_tensors: int
    budget_bytes: int | None
    resident_bytes: int
    sim_peak_bytes: int  # transient, level order
    sim_total_peak_bytes: int  # sim_peak_bytes + resident
    sim_exec_order_peak_bytes: int  # in the order of the median executor run
    sim_replay_peak_bytes: int  # replaying the median executor run
    grappler_peak_bytes: int
    executor_peak_bytes: int  # median over the runs
    executor_peak_runs: list[int]  # every run's peak, in run order
    sim_host_peak_bytes: int
    executor_host_peak_bytes: int  # of the median run
    executor_total_peak_bytes: int  # executor_peak_bytes + the same resident bytes
    replay_worst_ratio: float  # the replay of each run against that run, farthest from 1
    variables_identical: bool | None  # rewritten: bitwise equal to the original after one step (every run)
    profile: str = ""  # the profile the rewrite was tuned and every simulation run with
    sim_step_time_s: float = 0.0  # the simulated step in level order
    executor_step_time_s: float = 0.0  # the median run's step: its last node's end
    executor_step_runs_s: list[float] = dataclasses.field(default_factory=list)  # every run's, in run order
    clones: int = 0  # recompute clones in the rewrite
    clones_ran: int = 0  # of them, how many ran in every run
    clones_after_trigger: int = 0  # of them, how many started after their trigger ended, in every run

    @property
    def step_time_ratio(self) -> float:
        """Simulated over measured step time: how well the profile times this machine."""
        return self.sim_step_time_s / self.executor_step_time_s if self.executor_step_time_s else float("nan")

    @property
    def executor_worst_total_peak_bytes(self) -> int:
        """The largest run's total peak (transient + the resident bytes)."""
        return max(self.executor_peak_runs, default=self.executor_peak_bytes) + self.resident_bytes

    @property
    def executor_within_budget(self) -> bool | None:
        """The executor's total peak under the budget the tuner was given, in every run."""
        return None if self.budget_bytes is None else self.executor_worst_total_peak_bytes <= self.budget_bytes

    @property
    def sim_ratio(self) -> float:
        return self.sim_peak_bytes / self.executor_peak_bytes if self.executor_peak_bytes else float("nan")

    @property
    def sim_exec_order_ratio(self) -> float:
        return self.sim_exec_order_peak_bytes / self.executor_peak_bytes if self.executor_peak_bytes else float("nan")

    @property
    def sim_replay_ratio(self) -> float:
        return self.sim_replay_peak_bytes / self.executor_peak_bytes if self.executor_peak_bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(executor_within_budget=self.executor_within_budget,
                   executor_worst_total_peak_bytes=self.executor_worst_total_peak_bytes,
                   sim_ratio=self.sim_ratio, sim_exec_order_ratio=self.sim_exec_order_ratio,
                   sim_replay_ratio=self.sim_replay_ratio, step_time_ratio=self.step_time_ratio)
        return out


def median_run(peaks: list[int]) -> int:
    """Index of the run with the median peak (the lower median for an even count)."""
    ranked = sorted(range(len(peaks)), key=lambda i: (peaks[i], i))
    return ranked[(len(ranked) - 1) // 2]


def measure_originals(cases: list[Case], repeat: int) -> list[list[Any]]:
    """``repeat`` executor measurements of each case's original step (one subprocess), by case."""
    from tflms.measure import measure_executor_peaks, step_request

    requests = [step_request(case.concrete_function, case.args) for case in cases]
    flat = measure_executor_peaks(requests * repeat, timeout_s=SUBPROCESS_S_PER_RUN * len(requests) * repeat)
    return [flat[i::len(requests)] for i in range(len(requests))]


def calibrate(cases: list[Case], repeat: int, source: str = ""):
    """The emulated machine calibrated from ``repeat`` measured runs of every case's original step
    (:func:`tflms.measure.calibrate.calibrate_profile`, pooled over the cases)."""
    from tflms.measure.calibrate import calibrate_profile

    progress(f"calibrating: measuring {len(cases)} original steps x {repeat} runs (one subprocess) ...")
    t0 = time.perf_counter()
    runs = measure_originals(cases, repeat)
    progress(f"  {time.perf_counter() - t0:.1f} s")
    return calibrate_profile([(case.graph, measurements) for case, measurements in zip(cases, runs)],
                             source=source)


def validate(cases: list[Case], variants: list[Variant], *, repeat: int = 1, profile: Any = None) -> list[Record]:
    """Measure every variant ``repeat`` times (one executor subprocess), estimate with grappler,
    simulate three ways (with ``profile``, default ``EMULATION_PROFILE``)."""
    from tflms.ir import tf_io
    from tflms.measure import (EMULATION_PROFILE, EMULATION_SIM_OPTIONS, grappler_peak, measure_executor_peaks,
                               step_request)
    from tflms.measure.executor import ACCELERATOR_DEVICE, HOST_DEVICE
    from tflms.sim.simulator import order_from_start_times, simulate
    from tflms.testing import bitwise_diff

    sim_profile = profile or EMULATION_PROFILE
    by_model = {case.model: case for case in cases}
    requests = [step_request(by_model[v.model].concrete_function, by_model[v.model].args,
                             graph_def=tf_io.to_graph_def(v.graph)) for v in variants]
    progress(f"measuring {len(requests)} graphs x {repeat} runs with the executor (one subprocess) ...")
    t0 = time.perf_counter()
    flat = measure_executor_peaks(requests * repeat, timeout_s=SUBPROCESS_S_PER_RUN * len(requests) * repeat)
    progress(f"  {time.perf_counter() - t0:.1f} s")
    runs = [flat[i::len(requests)] for i in range(len(requests))]  # runs[variant index][run]
    original_after = {v.model: ms[0].variables_after for v, ms in zip(variants, runs) if v.variant == "original"}
    records = []
    for variant, request, measurements in zip(variants, requests, runs):
        progress(f"simulating and estimating {variant.model}/{variant.variant} ...")
        graph, options = variant.graph, EMULATION_SIM_OPTIONS
        peaks = [m.peak("accelerator") for m in measurements]
        median = measurements[median_run(peaks)]
        level = simulate(graph, sim_profile, options=options)
        spans = [m.spans_s() for m in measurements]  # each run's op spans, read once
        observed = spans[median_run(peaks)]
        exec_order = order_from_start_times(graph, {name: span[0] for name, span in observed.items()})
        in_exec_order = simulate(graph, sim_profile, options=options, order=exec_order)
        replays = [simulate(graph, sim_profile, options=options, observed=sp).transient_peak_bytes for sp in spans]
        replay_ratios = [r / p for r, p in zip(replays, peaks) if p]
        grappler = grappler_peak(request.graph_def, fetches=[*request.fetches, *request.targets],
                                 accelerator=ACCELERATOR_DEVICE, host=HOST_DEVICE, variables=request.variables)
        identical = None
        if variant.variant != "original" and variant.model in original_after:
            before = original_after[variant.model]
            names = sorted(before)
            identical = all(set(before) == set(m.variables_after) and not bitwise_diff(
                [(n, before[n]) for n in names], [(n, m.variables_after[n]) for n in names]) for m in measurements)
        ran = after = 0
        for clone, trigger in variant.clone_triggers.items():
            if all(clone in sp for sp in spans):
                ran += 1
                after += all(trigger in sp and sp[clone][0] >= sp[trigger][1] for sp in spans)
        records.append(Record(
            clones=len(variant.clone_triggers), clones_ran=ran, clones_after_trigger=after,
            model=variant.model, batch=by_model[variant.model].batch, variant=variant.variant, params=variant.params,
            swapped_tensors=variant.swapped_tensors, budget_bytes=variant.budget_bytes,
            resident_bytes=level.resident_bytes, sim_peak_bytes=level.transient_peak_bytes,
            sim_total_peak_bytes=level.peak_bytes, sim_exec_order_peak_bytes=in_exec_order.transient_peak_bytes,
            sim_replay_peak_bytes=replays[measurements.index(median)], grappler_peak_bytes=grappler["accelerator"],
            executor_peak_bytes=median.peak("accelerator"), executor_peak_runs=peaks,
            sim_host_peak_bytes=level.host_peak_bytes, executor_host_peak_bytes=median.peak("host"),
            executor_total_peak_bytes=median.peak("accelerator") + level.resident_bytes,
            replay_worst_ratio=max(replay_ratios, key=lambda r: abs(r - 1)) if replay_ratios else float("nan"),
            variables_identical=identical, profile=sim_profile.name, sim_step_time_s=level.step_time_s,
            executor_step_time_s=_step_s(median), executor_step_runs_s=[_step_s(m) for m in measurements]))
    return records


def _step_s(measurement: Any) -> float:
    """A measured step's time: its last node's end (seconds since the step started)."""
    return max((t.end_us for t in measurement.node_times.values()), default=0.0) * 1e-6


def _mib(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.2f}"


def table(records: list[Record]) -> str:
    """The records as a text table (MiB; ratios are sim / executor median)."""
    header = (f"{'model':<9}{'batch':>6} {'variant':<11}{'swaps':>6}{'sim level':>11}{'sim exec':>10}{'sim replay':>12}"
              f"{'sim total':>11}{'grappler':>10}{'executor':>10}{'ex min-max':>16}{'level/ex':>10}{'exec/ex':>9}"
              f"{'replay/ex':>11}{'host sim':>10}{'host ex':>9}{'step sim/ex':>13}  identical")
    profiles = sorted({r.profile for r in records if r.profile})
    lines = ["peaks in MiB: accelerator transient (sim total adds the resident bytes); executor = median run;",
             "ratios = simulator / executor median; host peaks at the end; step sim/ex: simulated (level order) "
             "over the median run's step time" + (f"; profile {', '.join(profiles)}" if profiles else ""),
             header, "-" * len(header)]
    for r in records:
        identical = "" if r.variables_identical is None else ("yes" if r.variables_identical else "NO")
        spread = f"{_mib(min(r.executor_peak_runs))}-{_mib(max(r.executor_peak_runs))}"
        lines.append(f"{r.model:<9}{r.batch:>6} {r.variant:<11}{r.swapped_tensors:>6}{_mib(r.sim_peak_bytes):>11}"
                     f"{_mib(r.sim_exec_order_peak_bytes):>10}{_mib(r.sim_replay_peak_bytes):>12}"
                     f"{_mib(r.sim_total_peak_bytes):>11}{_mib(r.grappler_peak_bytes):>10}"
                     f"{_mib(r.executor_peak_bytes):>10}{spread:>16}{r.sim_ratio:>10.3f}{r.sim_exec_order_ratio:>9.3f}"
                     f"{r.sim_replay_ratio:>11.3f}{_mib(r.sim_host_peak_bytes):>10}"
                     f"{_mib(r.executor_host_peak_bytes):>9}{r.step_time_ratio:>13.3f}  {identical}")
    worst = {name: max(abs(getattr(r, name) - 1) for r in records)
             for name in ("sim_ratio", "sim_exec_order_ratio", "replay_worst_ratio")}
    lines.append("")
    lines.append("largest |sim/executor - 1|: " + ", ".join(
        f"{label} {100 * worst[name]:.1f}%" for label, name in
        (("level order", "sim_ratio"), ("executor order", "sim_exec_order_ratio"),
         ("replay (every run)", "replay_worst_ratio"))) + f" (target {100 * TARGET_RELATIVE_ERROR:.0f}%)")
    for r in records:
        if r.variant != "original":
            lines.append(f"{r.model} rewrite: {json.dumps(r.params)}"
                         + (f", budget {_mib(r.budget_bytes)} MiB total" if r.budget_bytes else "")
                         + f", executor total {_mib(r.executor_total_peak_bytes)} MiB (median), "
                         + f"{_mib(r.executor_worst_total_peak_bytes)} MiB (largest of {len(r.executor_peak_runs)})"
                         + ("" if r.executor_within_budget is None else
                            " (within the budget in every run)" if r.executor_within_budget
                            else " (OVER the budget)"))
    for r in records:
        if r.clones:
            lines.append(f"{r.model} recompute: {r.clones} clones; {r.clones_ran} ran in every run, "
                         f"{r.clones_after_trigger} started after their trigger ended in every run")
    for r in records:
        if r.executor_step_runs_s:
            lines.append(f"{r.model} {r.variant} step: {r.sim_step_time_s:.3f} s simulated, "
                         f"{', '.join(f'{s:.3f}' for s in r.executor_step_runs_s)} s measured")
    return "\n".join(lines)


def parse_models(text: str) -> tuple[str, ...]:
    models = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = sorted(set(models) - set(MODELS + LARGE_MODELS))
    if not models or unknown:
        raise argparse.ArgumentTypeError(f"--models: choose from {','.join(MODELS + LARGE_MODELS)}; got {text!r}")
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=parse_models, default=MODELS,
                        help="comma-separated, from " + ",".join(MODELS + LARGE_MODELS))
    parser.add_argument("--free-order", action="store_true",
                        help="tune in level order and pin nothing (the executor takes its own order), instead of "
                             "the pipeline's default: the enforced order and the budget guarantee")
    parser.add_argument("--recompute", choices=("auto", "off", "only"), default="auto",
                        help="what the tuner may do besides swapping (LMSConfig.recompute; default %(default)s)")
    parser.add_argument("--load", action="store_true",
                        help="run another TensorFlow process (matrix products) beside the measurements")
    parser.add_argument("--budget-fraction", type=float, default=DEFAULT_BUDGET_FRACTION,
                        help="tuner budget: resident + this fraction of the simulated transient peak")
    parser.add_argument("--threshold", type=int, default=None,
                        help="rewrite with this swapout_threshold instead of tuning")
    parser.add_argument("--segments", type=int, default=None,
                        help="recompute every segment of this many checkpointed segments instead of tuning (no "
                             "swaps, no order pinned)")
    parser.add_argument("--split", type=int, default=None,
                        help="with --segments: re-run a chain's first ops again past this many levels "
                             "(plan_recomputes(split_levels=))")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT,
                        help="executor runs per graph (the table compares with the median run)")
    parser.add_argument("--calibrate", action="store_true",
                        help="first measure the original steps --repeat times and calibrate the emulated machine's "
                             "op times from them (tflms.measure.calibrate); tune and simulate with that profile")
    parser.add_argument("--json", action="store_true", help="print the records as JSON instead of the table "
                        "(with --calibrate: an object with the calibration and the records)")
    args = parser.parse_args(argv)
    if not 0 < args.budget_fraction <= 1:
        parser.error("--budget-fraction must be in (0, 1]")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.threshold is not None and args.threshold < 1:
        parser.error("--threshold must be >= 1")
    if args.segments is not None and (args.segments < 1 or args.threshold is not None):
        parser.error("--segments must be >= 1, and not with --threshold")
    if args.split is not None and (args.segments is None or args.split < 0):
        parser.error("--split needs --segments and must be >= 0")

    t_start = time.perf_counter()
    progress("importing TensorFlow and Keras ...")
    cases, variants = [], []
    for model in args.models:
        progress(f"building and tracing {model} ...")
        cases.append(build_case(model))
    calibration = None
    if args.calibrate:
        command = "python tools/validate_memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
        calibration = calibrate(cases, args.repeat, source=f"original steps of {','.join(args.models)}, "
                                                           f"{args.repeat} runs each: {command}")
        progress(calibration.table())
    profile = calibration.profile if calibration is not None else None
    for case in cases:
        variants.append(Variant(case.model, "original", case.graph, {}))
        progress(f"choosing the rewrite of {case.model} ...")
        variants.append(threshold_rewrite(case, args.threshold) if args.threshold is not None
                        else segment_rewrite(case, args.segments, args.split) if args.segments is not None
                        else tuned_rewrite(case, args.budget_fraction, args.free_order, profile=profile,
                                           recompute=args.recompute))
    with (beside_load() if args.load else contextlib.nullcontext()):
        records = validate(cases, variants, repeat=args.repeat, profile=profile)
    if args.json:
        out = [r.to_dict() for r in records]
        print(json.dumps(out if calibration is None else {"calibration": calibration.to_dict(), "records": out},
                         indent=1))
    else:
        if calibration is not None:
            print(calibration.table() + "\n")
        print(table(records))
    progress(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
