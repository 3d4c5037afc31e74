"""The budget sweep (issue 45): every rewrite tflms hands back trains bitwise like the plain step, or it refuses.

One *case* is a small model kind, a Keras precision policy and an entry point (the Keras callback or
``tflms.function``). :func:`run_case` trains the plain step twice (the control: is plain TensorFlow deterministic
here?), finds the span of budgets worth asking for (the best rewrite's simulated peak, from the tuner's
``BudgetError`` at an impossible budget, up to the unchanged step's simulated peak), and trains once with tflms at
each budget between them, and once just below the best peak (:data:`BELOW_BEST`). Each run ends in one
:data:`OUTCOMES`:

- ``bitwise``: weights and optimizer state equal to the plain run's bytes, and every inserted op alive in what
  TensorFlow ran (run metadata);
- ``budget_error``: :class:`~tflms.errors.BudgetError` before anything ran;
- ``fits``: nothing was inserted, yet it trained bitwise: the unchanged step fits the budget, in level order or in
  the memory-aware order the tuner pinned with control edges (the MLP's 12.2 MB peak drops to 9.6 MB by order alone);
- ``differs``, ``ops_lost``, ``error``: failures (a different byte, an inserted op removed, any other exception).

oneDNN is chosen when TensorFlow starts (``TF_ENABLE_ONEDNN_OPTS``): run a case in a fresh process per setting
(``tools/budget_sweep.py`` and ``tests/test_budget_sweep.py`` do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

#: The model kinds (:func:`_build`).
KINDS = ("conv", "residual_bn", "dense_block", "mlp_dropout", "attention")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
ENTRIES = ("callback", "function")
OUTCOMES = ("bitwise", "budget_error", "fits", "differs", "ops_lost", "error")
#: The outcomes a sweep allows (issue 45: a bitwise fit or a BudgetError, nothing else).
ALLOWED = frozenset({"bitwise", "budget_error", "fits"})
#: Where between the best rewrite's peak (0) and the unchanged peak (1) each budget lies, by default.
FRACTIONS = (0.1, 0.5, 0.9)
#: One more budget per case, this fraction of the best rewrite's peak: the tuner must refuse it (or find a fit there
#: that the span's own tune did not, and train it bitwise).
BELOW_BEST = 0.97


def _build(keras, kind: str, size: int):
    """A small Keras model of ``kind`` (float32 head, as mixed precision asks) and its input shape."""
    layers = keras.layers
    if kind == "conv":  # issue 45's reproducer: three Conv2D + ReLU with bias
        shape = (size, size, 3)
        inputs = keras.Input(shape)
        h = inputs
        for f in (16, 32, 32):
            h = layers.Conv2D(f, 3, padding="same", activation="relu")(h)
        h = layers.GlobalAveragePooling2D()(h)
    elif kind == "residual_bn":
        shape = (size, size, 3)
        inputs = keras.Input(shape)
        h = layers.Conv2D(16, 3, padding="same")(inputs)
        for _ in range(2):
            y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(16, 3, padding="same", use_bias=False)(h)))
            h = layers.Add()([h, y])
        h = layers.GlobalAveragePooling2D()(layers.MaxPooling2D()(h))
    elif kind == "dense_block":  # DenseNet's stem and blocks: Pad + VALID conv, BN, ReLU, max pool, concatenation
        shape = (size, size, 3)
        inputs = keras.Input(shape)
        h = layers.Conv2D(8, 3, use_bias=False)(layers.ZeroPadding2D(1)(inputs))
        h = layers.MaxPooling2D(3, strides=2)(layers.ZeroPadding2D(1)(
            layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(h))))
        for _ in range(2):
            y = layers.Conv2D(16, 1, use_bias=False)(layers.Activation("relu")(layers.BatchNormalization(
                epsilon=1.001e-5)(h)))
            y = layers.Conv2D(4, 3, padding="same", use_bias=False)(layers.Activation("relu")(
                layers.BatchNormalization(epsilon=1.001e-5)(y)))
            h = layers.Concatenate()([h, y])
        h = layers.GlobalAveragePooling2D()(layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(h)))
    elif kind == "mlp_dropout":
        shape = (8 * size,)
        inputs = keras.Input(shape)
        h = inputs
        for _ in range(3):
            h = layers.Dropout(0.2)(layers.Dense(16 * size, activation="relu")(h))
    elif kind == "attention":
        shape = (size // 2, 32)
        inputs = keras.Input(shape)
        a = layers.MultiHeadAttention(4, 8)(inputs, inputs)
        h = layers.LayerNormalization()(layers.Add()([inputs, a]))
        f = layers.Dense(32)(layers.Dense(64, activation="gelu")(h))
        h = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(layers.Add()([h, f])))
    else:
        raise ValueError(f"unknown sweep model kind {kind!r}; choose one of {list(KINDS)}")
    outputs = layers.Dense(5, dtype="float32")(h)
    return keras.Model(inputs, outputs), shape


def issue45_model():
    """Issue 45's Keras CNN, seeded and not compiled: three 3x3 convolutions of 32, 64 and 64 filters with ReLU on
    64x64x3 inputs, global average pooling and 10 logits."""
    import keras
    keras.utils.set_random_seed(0)
    i = keras.Input((64, 64, 3))
    h = i
    for f in (32, 64, 64):
        h = keras.layers.Conv2D(f, 3, padding="same", activation="relu")(h)
    return keras.Model(i, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)))


def issue45_fit(callbacks=(), *, record: bool = False):
    """Issue 45's reproducer: :func:`issue45_model` compiled with Adam, fitted one epoch at batch 32 on fixed data with
    ``callbacks``. Returns ``(model, what ran)`` (``None`` unless ``record``: run metadata,
    :func:`tflms.testing.record_run_metadata`)."""
    import contextlib

    import keras

    from tflms.testing import record_run_metadata
    model = issue45_model()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    x = np.random.RandomState(0).randn(32, 64, 64, 3).astype("float32")
    with (record_run_metadata() if record else contextlib.nullcontext()) as ran:
        model.fit(x, np.zeros(32, "int32"), batch_size=32, epochs=1, verbose=0, callbacks=list(callbacks))
    return model, ran


@dataclasses.dataclass(frozen=True)
class Run:
    """One tflms run of a case at one budget."""

    budget_bytes: int
    outcome: str
    detail: str = ""
    inserted: int = 0
    strategy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _data(shape: tuple[int, ...], batch: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, *shape)).astype(np.float32),
             rng.integers(0, 5, size=(batch,)).astype(np.int32)) for _ in range(steps)]


class _Case:
    """Builds the model afresh (same seed, same weights) and trains it through one entry point."""

    def __init__(self, kind: str, precision: str, entry: str, *, size: int, batch: int, steps: int, seed: int):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")
        if entry not in ENTRIES:
            raise ValueError(f"unknown entry point {entry!r}; choose one of {list(ENTRIES)}")
        self.kind, self.precision, self.entry = kind, precision, entry
        self.size, self.batch, self.steps, self.seed = size, batch, steps, seed

    def model(self):
        import keras
        keras.mixed_precision.set_global_policy(self.precision)
        try:
            keras.utils.set_random_seed(self.seed)
            model, shape = _build(keras, self.kind, self.size)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        return model, shape

    def train(self, lms: dict[str, Any] | None):
        """``(snapshot, what ran, reports, concrete step or None)``: one epoch of ``steps`` batches."""
        import keras
        import tensorflow as tf

        import tflms
        import tflms.keras
        from tflms.testing import make_train_step, record_run_metadata, snapshot
        model, shape = self.model()
        data = _data(shape, self.batch, self.steps, self.seed)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        reports, concrete = [], None
        with record_run_metadata() as ran:
            if self.entry == "callback":
                model.compile(keras.optimizers.Adam(1e-3), loss, jit_compile=False)
                x = np.concatenate([d[0] for d in data])
                y = np.concatenate([d[1] for d in data])
                callbacks = [] if lms is None else [tflms.keras.LMS(verbose=0, **lms)]
                model.fit(x, y, batch_size=self.batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
                if callbacks:
                    reports = callbacks[0].reports
                    concrete = callbacks[0]._order[0].original if callbacks[0]._order else None  # noqa: SLF001
                optimizer = model.optimizer
            else:
                optimizer = keras.optimizers.Adam(1e-3)
                optimizer.build(model.trainable_variables)
                step = make_train_step(model, optimizer, loss)
                fn = tf.function(step) if lms is None else tflms.function(step, **lms)
                for x, y in data:
                    fn(tf.constant(x), tf.constant(y))
                if lms is not None:
                    reports = fn.reports
                else:
                    concrete = fn.get_concrete_function(tf.constant(data[0][0]), tf.constant(data[0][1]))
        self.alive = (model, optimizer)  # the concrete step reads their variables (budget_span)
        return snapshot(model, optimizer), ran, reports, concrete


def budget_span(concrete, batch: int, recompute: str | None = None) -> tuple[int, int]:
    """``(the best rewrite's simulated peak, the unchanged step's)`` for ``concrete``, as the pipeline tunes it
    (with ``LMSConfig.recompute`` ``recompute``; ``None``: the default)."""
    from tflms.config import LMSConfig
    from tflms.errors import BudgetError
    from tflms.pipeline import _preoptimized
    from tflms.ir.tf_io import load_graph
    from tflms.tune.tuner import tune
    graph = load_graph(_preoptimized(concrete, ()), batch_size=batch)
    try:
        config = LMSConfig(batch_size=batch, **({"recompute": recompute} if recompute else {}))
        result = tune(graph, budget=1, config=config, enforce_order=True)
    except BudgetError as err:
        return min(c.sim.peak_with_margin_bytes for c in err.candidates), err.baseline.peak_with_margin_bytes
    raise AssertionError(f"a budget of 1 byte fits: {result.reason()}")


def run_case(kind: str, precision: str, entry: str, *, fractions: Sequence[float] = FRACTIONS, size: int = 32,
             batch: int = 16, steps: int = 2, seed: int = 0, recompute: str | None = None) -> dict[str, Any]:
    """The sweep of one case (see the module doc): ``{"control": bool, "span": [low, high], "runs": [...]}``.

    ``recompute``: ``LMSConfig.recompute`` for every run (``None``: the default).
    """
    from tflms.errors import BudgetError
    from tflms.testing import differences
    case = _Case(kind, precision, entry, size=size, batch=batch, steps=steps, seed=seed)
    plain, _, _, concrete = case.train(None)
    if concrete is None:  # the callback's step: trace it through a run that fits whatever the budget
        concrete = case.train({"budget": "1TiB"})[3]
    low, high = budget_span(concrete, batch, recompute)  # (while the model whose variables it reads is alive)
    control = not differences(plain, case.train(None)[0])
    runs = []
    # each fraction of the span, and just below the best rewrite's peak, where a BudgetError is the answer expected
    for budget in [int(low + f * (high - low)) for f in fractions] + [int(low * BELOW_BEST)]:
        options = {"budget": budget, **({"recompute": recompute} if recompute else {})}
        try:
            state, ran, reports, _ = case.train(options)
        except BudgetError as err:
            runs.append(Run(budget, "budget_error", str(err)[:300]))
            continue
        except Exception as err:  # noqa: BLE001 - any other ending is the failure the sweep looks for
            runs.append(Run(budget, "error", f"{type(err).__name__}: {str(err)[:300]}"))
            continue
        inserted = sorted({n for r in reports for n in r.inserted_ops})
        strategy = (reports[-1].tuning or {}).get("strategy") if reports else None
        found = differences(plain, state)
        lost = sorted({m for r in reports for m in ran.missing_after_optimization(r.inserted_ops)})
        if found:
            outcome, detail = "differs", f"{len(found)} entries differ, e.g. {found[0]}"
        elif lost:
            outcome, detail = "ops_lost", f"{len(lost)} inserted ops not in what ran, e.g. {lost[:3]}"
        else:
            outcome, detail = ("bitwise" if inserted else "fits"), ""
        runs.append(Run(budget, outcome, detail, len(inserted), strategy))
    return {"kind": kind, "precision": precision, "entry": entry, "control": control, "span": [low, high],
            "runs": [r.to_dict() for r in runs]}
