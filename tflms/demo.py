"""The built-in demo: a small model's training step, with and without tflms.

``run_demo`` builds the same model twice from one seed, trains one copy with
``tf.function`` and the other with ``tflms.function`` on the same synthetic
batch, and compares every weight bit for bit.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from tflms.config import LMSConfig
from tflms.report import RewriteReport

logger = logging.getLogger(__name__)

DEMO_MODELS = ("cnn", "mlp")
#: With no swap parameter, budget or profile, the demo tunes for this fraction of its step's predicted peak: its
#: models fit any accelerator, and the default (tune for the accelerator's memory) would leave them alone.
DEMO_BUDGET_FRACTION = 0.6


def build_model(kind: str, *, seed: int = 0):
    """A small Keras model: ``cnn`` (Conv2D+BatchNorm+ReLU blocks) or ``mlp``."""
    import keras
    keras.utils.set_random_seed(seed)
    if kind == "cnn":
        inputs = keras.Input((32, 32, 3))
        h = inputs
        for i, filters in enumerate((16, 32, 64)):
            h = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"block{i}_conv")(h)
            h = keras.layers.BatchNormalization(name=f"block{i}_bn")(h)
            h = keras.layers.ReLU(name=f"block{i}_relu")(h)
            h = keras.layers.MaxPooling2D(name=f"block{i}_pool")(h)
        h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
        outputs = keras.layers.Dense(10, name="logits")(h)
        return keras.Model(inputs, outputs, name="demo_cnn"), (32, 32, 3)
    if kind == "mlp":
        model = keras.Sequential([keras.Input((256,))] + [
            keras.layers.Dense(512, activation="relu", name=f"dense_{i}") for i in range(4)
        ] + [keras.layers.Dense(10, name="logits")], name="demo_mlp")
        return model, (256,)
    raise ValueError(f"unknown demo model {kind!r}; choose one of {DEMO_MODELS}")


def make_train_step(model, optimizer, *, from_logits: bool = True) -> Callable:
    """A custom-loop training step: :func:`tflms.testing.make_train_step` with sparse categorical cross-entropy.

    The loss is on the model's outputs, which are logits unless
    ``from_logits=False`` (a softmax head).
    """
    import keras

    from tflms.testing import make_train_step as kit_step
    return kit_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))


@dataclasses.dataclass(frozen=True)
class DemoResult:
    model: str
    steps: int
    batch_size: int
    losses_plain: tuple[float, ...]
    losses_tflms: tuple[float, ...]
    num_weights: int
    mismatched_weights: tuple[str, ...]
    max_abs_diff: float
    report: RewriteReport
    budget_note: str = ""

    @property
    def identical(self) -> bool:
        return not self.mismatched_weights and self.losses_plain == self.losses_tflms

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "steps": self.steps, "batch_size": self.batch_size,
                "identical": self.identical, "losses_plain": list(self.losses_plain),
                "losses_tflms": list(self.losses_tflms), "num_weights": self.num_weights,
                "mismatched_weights": list(self.mismatched_weights), "max_abs_diff": self.max_abs_diff,
                "budget_note": self.budget_note, "report": self.report.to_dict()}


def run_demo(model: str = "cnn", *, steps: int = 3, batch_size: int = 32, config: LMSConfig | None = None,
             seed: int = 0, progress: Callable[[str], None] | None = None) -> DemoResult:
    """Train ``steps`` steps with and without tflms and compare the weights bitwise."""
    import keras
    import tensorflow as tf

    import tflms
    say = progress or (lambda msg: None)
    config, budget_note = config or LMSConfig(), ""
    rng = np.random.RandomState(seed)
    runs = {}
    for variant in ("plain", "tflms"):
        net, input_shape = build_model(model, seed=seed)
        optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        optimizer.build(net.trainable_variables)  # so the step can be traced before its first call
        step = make_train_step(net, optimizer)
        if variant == "tflms" and config.default_tuning:
            config, budget_note = demo_config(step, input_shape, batch_size, config)
        fn = tf.function(step) if variant == "plain" else tflms.function(step, config=config)
        runs[variant] = (net, optimizer, fn)
    data = [(rng.standard_normal((batch_size, *input_shape)).astype("float32"),
             rng.randint(0, 10, size=(batch_size,)).astype("int32")) for _ in range(steps)]
    losses: dict[str, list[float]] = {"plain": [], "tflms": []}
    # tflms first: its first call traces and rewrites the step, so a bad option (e.g. --include-types Conv2d)
    # is refused before the plain model spends any time training.
    for variant in ("tflms", "plain"):
        fn = runs[variant][2]
        say(f"training {steps} steps of the {model} demo model ({variant})")
        for x, y in data:
            losses[variant].append(float(fn(tf.constant(x), tf.constant(y)).numpy()))
    from tflms.testing import differences, snapshot
    plain_state = snapshot(runs["plain"][0], runs["plain"][1])
    found = differences(plain_state, snapshot(runs["tflms"][0], runs["tflms"][1]))  # bitwise: tobytes()
    mismatched = [d.name for d in found]
    max_diff = max((d.max_abs_diff for d in found if d.max_abs_diff == d.max_abs_diff), default=0.0)
    report = runs["tflms"][2].report
    return DemoResult(model=model, steps=steps, batch_size=batch_size, losses_plain=tuple(losses["plain"]),
                      losses_tflms=tuple(losses["tflms"]), num_weights=len(plain_state),
                      mismatched_weights=tuple(mismatched), max_abs_diff=max_diff, report=report,
                      budget_note=budget_note)


def demo_config(step: Callable, input_shape: tuple[int, ...], batch_size: int,
                config: LMSConfig) -> tuple[LMSConfig, str]:
    """``config`` with a budget below the step's predicted peak, and a note saying so.

    :data:`DEMO_BUDGET_FRACTION` of the peak when some rewrite fits that; else
    halfway between the smallest peak a rewrite reaches and the peak without one.
    """
    import tensorflow as tf

    from tflms.devices import local_gpu
    from tflms.pipeline import analyze
    from tflms.profiles import select_profile
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.units import format_bytes
    specs = (tf.TensorSpec((batch_size, *input_shape), tf.float32), tf.TensorSpec((batch_size,), tf.int32))
    profile = select_profile(config.profile, local_gpu()).name
    analysis = analyze(tf.function(step).get_concrete_function(*specs))
    peak = simulate(analysis.graph, profile, options=SimOptions(host_device=config.host_device)).peak_with_margin_bytes
    from tflms.errors import BudgetError
    from tflms.tune.tuner import tune
    budget = int(peak * DEMO_BUDGET_FRACTION)
    try:
        tune(analysis, budget=budget, profile=profile, config=config, first_fit=True)
        how = ""
    except BudgetError as err:
        smallest = min(c.sim.peak_with_margin_bytes for c in err.candidates)
        budget = (smallest + peak) // 2
        how = (f": no rewrite reaches {DEMO_BUDGET_FRACTION:.0%}, so halfway between the peak and the smallest peak "
               f"a rewrite reaches, {format_bytes(smallest)}")
    note = (f"{format_bytes(budget)}, {budget / peak:.0%} of the step's predicted peak {format_bytes(peak)} on "
            f"{profile}{how}; the demo model fits any accelerator, and a budget below its peak gives it something "
            "to swap (--budget sets another)")
    return config.replace(budget_bytes=budget), note
