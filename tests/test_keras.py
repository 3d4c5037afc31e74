"""``tflms.keras.LMS``: ``model.fit`` with the callback against ``model.fit`` without it.

Every equivalence test builds the same model twice from the same seed, trains it
on the same fixed data (``shuffle=False``) once plainly and once with the LMS
callback, and asserts that the weights (BatchNorm statistics included), the
optimizer's variables and the Keras history are *bitwise* equal, and that the
callback really swapped something (``report.num_swapped > 0`` for every trace).

There is no GPU here: the accelerator is the CPU, so swaps move nothing (tflms
warns), but the rewritten graph is what runs, which is what equivalence needs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import tflms
import tflms.keras
from tflms.integrations import keras as keras_integration
from tflms.keras import LMS, UnsupportedModelError
from tflms.testing import assert_bitwise_equal, snapshot

SEED = 1234
#: small enough that the tiny test models get swaps.
THRESHOLD = 1
KINDS = ["sequential", "functional", "subclassed", "custom_train_step"]


def assert_swapped(callback: LMS, traces: int | None = None) -> None:
    reports = callback.reports
    assert reports, "the LMS callback never rewrote a step"
    if traces is not None:
        assert len(reports) == traces, f"expected {traces} traces, got {len(reports)}"
    for i, report in enumerate(reports):
        assert report.num_swapped > 0, f"trace {i} swapped nothing, equivalence proves nothing:\n{report.table()}"
        assert all(s.swap_ins for s in report.swaps), f"trace {i}: a swapped tensor has no swap-in"
    assert callback.report is not None and callback.report in reports


def is_keras_function(fn) -> bool:
    return getattr(fn, "__module__", "") == "keras.src.backend.tensorflow.trainer"


# ---------------------------------------------------------------- model cases
MLP_IN, MLP_HIDDEN, MLP_OUT = 8, 16, 4


class SubclassedMLP(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = [keras.layers.Dense(MLP_HIDDEN, activation="relu") for _ in range(3)]
        self.head = keras.layers.Dense(MLP_OUT)

    def call(self, x, training=False):
        for layer in self.hidden:
            x = layer(x)
        return self.head(x)


class CustomStepMLP(SubclassedMLP):
    """A subclassed model with its own ``train_step`` (the usual Keras customization)."""

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {m.name: m.result() for m in self.metrics}


def mlp(kind: str) -> keras.Model:
    """3 Dense+ReLU layers and a linear head, built from a fixed seed."""
    keras.utils.set_random_seed(SEED)
    if kind == "sequential":
        return keras.Sequential([keras.Input((MLP_IN,))]
                                + [keras.layers.Dense(MLP_HIDDEN, activation="relu") for _ in range(3)]
                                + [keras.layers.Dense(MLP_OUT)])
    if kind == "functional":
        inputs = keras.Input((MLP_IN,))
        h = inputs
        for _ in range(3):
            h = keras.layers.Dense(MLP_HIDDEN, activation="relu")(h)
        return keras.Model(inputs, keras.layers.Dense(MLP_OUT)(h))
    model = {"subclassed": SubclassedMLP, "custom_train_step": CustomStepMLP}[kind]()
    model(np.zeros((1, MLP_IN), np.float32))  # create the weights now, in a fixed order
    return model


def compiled_mlp(kind: str, **compile_options: Any) -> keras.Model:
    model = mlp(kind)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse", metrics=["mae"],
                  **compile_options)
    return model


_rng = np.random.default_rng(0)
#: 56 samples in batches of 16: three full batches and a short one (so Keras's dataset has a None batch dimension).
MLP_X = _rng.standard_normal((56, MLP_IN)).astype(np.float32)
MLP_Y = _rng.standard_normal((56, MLP_OUT)).astype(np.float32)
MLP_VAL = (_rng.standard_normal((12, MLP_IN)).astype(np.float32),
           _rng.standard_normal((12, MLP_OUT)).astype(np.float32))

CNN_CLASSES = 5


class SubclassedCNN(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(8, 3, padding="same")
        self.bn = keras.layers.BatchNormalization()
        self.relu = keras.layers.ReLU()
        self.pool = keras.layers.MaxPooling2D()
        self.flat = keras.layers.Flatten()
        self.dense = keras.layers.Dense(CNN_CLASSES)

    def call(self, x, training=False):
        return self.dense(self.flat(self.pool(self.relu(self.bn(self.conv(x), training=training)))))


def compiled_cnn(kind: str) -> keras.Model:
    """Conv2D + BatchNormalization + ReLU + MaxPool + Dense, SGD with momentum."""
    keras.utils.set_random_seed(SEED)
    layers = [keras.layers.Conv2D(8, 3, padding="same"), keras.layers.BatchNormalization(), keras.layers.ReLU(),
              keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(CNN_CLASSES)]
    if kind == "sequential":
        model = keras.Sequential([keras.Input((12, 12, 3))] + layers)
    elif kind == "functional":
        inputs = keras.Input((12, 12, 3))
        h = inputs
        for layer in layers:
            h = layer(h)
        model = keras.Model(inputs, h)
    else:
        model = SubclassedCNN()
        model(np.zeros((1, 12, 12, 3), np.float32))
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


CNN_X = _rng.standard_normal((40, 12, 12, 3)).astype(np.float32)
CNN_Y = _rng.integers(0, CNN_CLASSES, size=(40,)).astype(np.int32)
CNN_SAMPLE_WEIGHT = _rng.uniform(0.1, 2.0, size=(40,)).astype(np.float32)
CNN_CLASS_WEIGHT = {c: 0.5 + 0.25 * c for c in range(CNN_CLASSES)}
CNN_VAL = (_rng.standard_normal((8, 12, 12, 3)).astype(np.float32),
           _rng.integers(0, CNN_CLASSES, size=(8,)).astype(np.int32))


# --------------------------------------------------------------------- runner
@dataclasses.dataclass
class Fitted:
    model: keras.Model
    history: dict[str, list[float]]
    callback: LMS
    run_metadata: Any = None  # what TensorFlow ran during the LMS fit, when asked for


def fit_both(build: Callable[[], keras.Model], callback: LMS | None = None, *, record: bool = False,
             **fit_options: Any) -> Fitted:
    """Fit a fresh model plainly and a fresh model with ``callback``; assert bitwise-equal results.

    With ``record=True`` the run metadata of the LMS fit (the graphs TensorFlow
    optimized and ran) is kept.
    """
    fit_options = {"batch_size": 16, "epochs": 2, "shuffle": False, "verbose": 0, **fit_options}
    reference = build()
    initial = snapshot(variables=reference.weights)
    ref_history = reference.fit(**fit_options).history
    model = build()
    callback = callback or LMS(swapout_threshold=THRESHOLD, verbose=0)
    ctx = context.context()
    if record:
        ctx.enable_run_metadata()
        ctx.export_run_metadata()  # drop graphs stored by earlier tests
    try:
        history = model.fit(callbacks=[callback], **fit_options).history
        metadata = ctx.export_run_metadata() if record else None
    finally:
        if record:
            ctx.disable_run_metadata()
    trained = snapshot(variables=model.weights)
    with pytest.raises(AssertionError):
        assert_bitwise_equal(initial, trained, "training changed nothing: the comparison is vacuous")
    assert history == ref_history, f"history differs:\n{history}\nvs plain fit\n{ref_history}"
    assert_bitwise_equal(snapshot(reference), snapshot(model), "LMS fit vs plain fit")
    assert is_keras_function(model.train_function), "Keras's train function was not put back after fit"
    assert model.test_function is None or is_keras_function(model.test_function), "evaluate must not be touched"
    return Fitted(model, history, callback, metadata)


def assert_swaps_survived_grappler(run_metadata, report) -> None:
    """Every op ``report`` inserted is in the graph TensorFlow ran, after grappler and after partitioning.

    The rewritten step must have run as a function of its own: one function graph
    TensorFlow reported holds all swap ops under their own names (inlined into a
    caller they would be renamed, and optimized together with it).
    """
    inserted = set(report.inserted_ops)
    holders = [fg for fg in run_metadata.function_graphs
               if inserted <= {n.name for n in fg.pre_optimization_graph.node}]
    assert len(holders) == 1, (f"{len(holders)} of {len(run_metadata.function_graphs)} function graphs that ran "
                               "hold the rewritten step as a function of its own")
    post = {n.name for n in holders[0].post_optimization_graph.node}
    missing = sorted(inserted - post)
    assert not missing, f"grappler removed {len(missing)} of {len(inserted)} swap ops: {missing}"
    ran = {n.name for g in holders[0].partition_graphs for n in g.node}
    missing = sorted(inserted - ran)
    assert not missing, f"swap ops missing from the partition graphs that ran: {missing}"


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind,steps_per_execution", [
    ("sequential", 1), ("functional", 3), ("subclassed", 1),
    pytest.param("sequential", 3, marks=pytest.mark.slow), pytest.param("custom_train_step", 3, marks=pytest.mark.slow)])
def test_fit_matches_plain_fit(kind, steps_per_execution, capsys):
    """MLP + Adam, 2 epochs of 3 full batches and a short one, with validation data.

    With steps_per_execution=3 the 4 batches of an epoch run as 3 + 1. The graphs
    TensorFlow ran hold every swap op (run metadata).
    """
    fitted = fit_both(lambda: compiled_mlp(kind, steps_per_execution=steps_per_execution), record=True,
                      x=MLP_X, y=MLP_Y, validation_data=MLP_VAL)
    assert "val_loss" in fitted.history and "mae" in fitted.history
    # one trace, for the dataset's element_spec (batch None) as Keras traces it; sized by the first batch
    assert_swapped(fitted.callback, traces=1)
    assert fitted.callback.report.plan.config.batch_size == 16
    assert_swaps_survived_grappler(fitted.run_metadata, fitted.callback.report)
    assert "tflms.keras.LMS" not in capsys.readouterr().out, "verbose=0 must print nothing"


@pytest.mark.parametrize("kind,weighting", [
    ("functional", "sample_weight"), pytest.param("sequential", "class_weight", marks=pytest.mark.slow),
    pytest.param("subclassed", "class_weight", marks=pytest.mark.slow)])
def test_cnn_batchnorm_with_weights_matches_plain_fit(kind, weighting):
    """Conv + BatchNorm + SGD with momentum, class or sample weights, a short last batch, validation data."""
    weights = {"class_weight": CNN_CLASS_WEIGHT} if weighting == "class_weight" else {
        "sample_weight": CNN_SAMPLE_WEIGHT}
    fitted = fit_both(lambda: compiled_cnn(kind), LMS(swapout_threshold=2, verbose=0), x=CNN_X, y=CNN_Y,
                      epochs=1, validation_data=CNN_VAL, **weights)
    model, callback = fitted.model, fitted.callback
    assert any("moving_variance" in v.path for v in model.weights)
    assert_swapped(callback)
    # the weights reach the rewritten step as a third input (Keras turns class_weight into sample weights)
    first = callback._order[0].original  # noqa: SLF001 - the test looks at the traced function itself
    assert len(keras_integration._input_specs(first)) == 3, keras_integration._describe_inputs(first)


@pytest.fixture
def mixed_float16():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("kind", ["sequential", pytest.param("subclassed", marks=pytest.mark.slow)])
def test_mixed_precision_matches_plain_fit(kind, mixed_float16):
    fitted = fit_both(lambda: compiled_mlp(kind), x=MLP_X[:48], y=MLP_Y[:48])
    model, callback = fitted.model, fitted.callback
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert_swapped(callback, traces=1)
    dtypes = {s["dtype"] for s in callback.report.to_dict()["swaps"]}
    assert "float16" in dtypes, f"expected float16 activations to be swapped, got {dtypes}"


@pytest.mark.slow
def test_repeated_fit_reuses_traces_and_retraces_new_signatures():
    """Five fits: the same data twice (one trace), a larger batch (resized once), sample weights (a new
    signature: a new trace), and finally without the callback (Keras's own step).

    44 samples leave a short last batch, so Keras's datasets have an unknown batch
    dimension and the trace is shared by batch sizes 8 and 16; it was sized for 8,
    so it is rewritten once more, sized for 16, when 16 arrives.
    """
    fits = [dict(batch_size=8, lms=True), dict(batch_size=8, lms=True), dict(batch_size=16, lms=True),
            dict(batch_size=16, lms=True, sample_weight=np.linspace(0.5, 1.5, 44).astype(np.float32)),
            dict(batch_size=16, lms=False)]

    def train(model: keras.Model, callback: LMS | None):
        counts = []
        for options in fits:
            options = dict(options)
            callbacks = [callback] if options.pop("lms") and callback is not None else []
            model.fit(MLP_X[:44], MLP_Y[:44], epochs=1, shuffle=False, verbose=0, callbacks=callbacks, **options)
            counts.append(0 if callback is None else len(callback.reports))
        return counts

    reference = compiled_mlp("functional")
    train(reference, None)
    model = compiled_mlp("functional")
    callback = LMS(swapout_threshold=THRESHOLD, verbose=0)
    counts = train(model, callback)
    assert counts == [1, 1, 2, 3, 3], counts
    assert is_keras_function(model.train_function)
    assert_bitwise_equal(snapshot(reference), snapshot(model), "five fits, four with LMS")
    assert_swapped(callback, traces=3)
    assert [r.plan.config.batch_size for r in callback.reports] == [8, 16, 16]


@pytest.mark.slow
def test_a_new_compile_gets_a_new_rewrite():
    """compile() makes Keras build a new step (new optimizer variables): LMS must not reuse the old trace."""
    reference, model = compiled_mlp("sequential"), compiled_mlp("sequential")
    callback = LMS(swapout_threshold=THRESHOLD, verbose=0)
    for m, cbs in ((reference, []), (model, [callback])):
        m.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
        m.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.5), loss="mae")
        m.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
    assert_swapped(callback, traces=2)
    assert_bitwise_equal(snapshot(reference), snapshot(model), "fit, compile, fit")


def test_budget_chooses_the_rewrite():
    """With budget=..., the tuner picks the parameters; just below the unswapped peak it must swap."""
    build = lambda: compiled_cnn("sequential")  # noqa: E731
    fit = {"x": CNN_X[:32], "y": CNN_Y[:32], "epochs": 1}
    roomy = fit_both(build, LMS(budget="1GiB", verbose=0), **fit).callback
    tuning = roomy.report.tuning
    assert tuning is not None and tuning["strategy"] == "none" and roomy.report.num_swapped == 0, tuning
    tight = tuning["baseline_peak_bytes"] - 1
    callback = fit_both(build, LMS(budget=tight, verbose=0), **fit).callback
    assert_swapped(callback, traces=1)
    tuning = callback.report.tuning
    assert tuning["budget_bytes"] == tight and tuning["predicted_peak_bytes"] <= tight, tuning


@pytest.mark.slow
def test_saved_model_has_no_swap_ops_and_loads_without_tflms(tmp_path):
    fitted = fit_both(lambda: compiled_mlp("functional"), x=MLP_X[:48], y=MLP_Y[:48])
    model, callback = fitted.model, fitted.callback
    assert_swapped(callback)
    path = tmp_path / "model.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            data = archive.read(member)
            assert b"lms/swap" not in data and b"tflms" not in data, f"{member} mentions tflms"
    np.savez(tmp_path / "expected.npz", *model.get_weights())
    x = MLP_X[:4]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "predicted.npy", model.predict(x, verbose=0))
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import keras
        model = keras.models.load_model({str(path)!r})
        expected = np.load({str(tmp_path / 'expected.npz')!r})
        got = model.get_weights()
        assert len(got) == len(expected.files)
        for i, w in enumerate(got):
            assert w.tobytes() == expected[f"arr_{{i}}"].tobytes(), f"weight {{i}} differs"
        predicted = model.predict(np.load({str(tmp_path / 'x.npy')!r}), verbose=0)
        assert predicted.tobytes() == np.load({str(tmp_path / 'predicted.npy')!r}).tobytes()
        assert not any(m == "tflms" or m.startswith("tflms.") for m in sys.modules), "tflms was imported"
        print("loaded ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0 and "loaded ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_exported_saved_model_has_no_swap_ops(tmp_path):
    fitted = fit_both(lambda: compiled_mlp("sequential"), x=MLP_X[:32], y=MLP_Y[:32], epochs=1)
    model, callback = fitted.model, fitted.callback
    assert_swapped(callback)
    model.export(str(tmp_path / "exported"), verbose=False)
    data = (tmp_path / "exported" / "saved_model.pb").read_bytes()
    assert b"lms/swap" not in data and b"_grappler_do_not_remove" not in data
    reloaded = tf.saved_model.load(str(tmp_path / "exported"))
    got = reloaded.serve(tf.constant(MLP_X[:4]))
    assert np.array_equal(np.asarray(got), model.predict(MLP_X[:4], verbose=0))


# ------------------------------------------------------------------- refusals
def _weights_after_refused_fit(model: keras.Model, callbacks: list, match: str):
    weights = lambda: snapshot(variables=model.weights)  # noqa: E731
    before = weights()
    with pytest.raises(UnsupportedModelError, match=match):
        model.fit(MLP_X[:16], MLP_Y[:16], batch_size=16, verbose=0, callbacks=callbacks)
    assert_bitwise_equal(before, weights(), "a refused fit must not train")


def test_jit_compile_under_a_strategy_is_refused_before_any_step():
    """Issue 47 keeps an explicit jit_compile=True under the default strategy (tests/test_xla_clusters.py); under
    another one, where Keras's "auto" never chooses XLA, the callback does not keep it and refuses it."""
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = compiled_mlp("sequential", jit_compile=True)
    _weights_after_refused_fit(model, [LMS(verbose=0)], "jit_compile=True and trains under MirroredStrategy.*"
                                                        "jit_compile=False")


@pytest.fixture
def keras_sees_a_gpu(monkeypatch):
    """Keras's jit_compile="auto" resolution (``Trainer._resolve_auto_jit_compile``) sees a GPU.

    It asks ``tf.config.list_physical_devices()`` (no device type) for a device that
    is not a CPU; only that call gets a made-up GPU, so nothing tries to run on it.
    """
    real = tf.config.list_physical_devices
    fake = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda device_type=None: real(device_type) + ([fake] if device_type is None else []))


def _uses_xla(model) -> bool:
    return bool(keras_integration._keras_step(model, model.train_function)._jit_compile)  # noqa: SLF001


@pytest.mark.slow
def test_jit_compile_auto_on_a_gpu_machine_keeps_xla_in_clusters_and_puts_keras_function_back(keras_sees_a_gpu):
    """Issue 47: where Keras's "auto" chooses XLA the fit keeps it, as clusters between the copies: no warning, the
    report says how many clusters, and it trains within rtol 1e-4 of the plain XLA fit (tests/test_xla_clusters.py
    checks the clusters and copies in what TensorFlow ran)."""
    reference = compiled_mlp("sequential", jit_compile=True)
    reference.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0)
    model = compiled_mlp("sequential")  # Keras's default jit_compile="auto"
    assert model.jit_compile is True, "the patched device list must make Keras choose XLA, as on a GPU machine"
    callback = LMS(swapout_threshold=THRESHOLD, verbose=0)
    import warnings as _warnings
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")  # nothing to say: XLA is kept
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
        assert_swapped(callback, traces=1)
        assert callback.report.xla_clusters["kept"] and callback.report.xla_clusters["clusters"] >= 2
        for (name, a), (_, b) in zip(snapshot(reference), snapshot(model)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=name)
        assert model.jit_compile is True and _uses_xla(model), "Keras's XLA train function must be back after the fit"
        # a second fit reuses the rewrite
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
    assert len(callback.reports) == 1 and _uses_xla(model)


@pytest.fixture
def xla_not_kept(monkeypatch):
    """Where the callback cannot keep XLA in clusters (a Keras whose "auto" chooses XLA under a strategy: Keras 3.15's
    never does), it trains without XLA, says so and what it costs, and puts XLA back: that path, forced here."""
    monkeypatch.setattr(LMS, "_keeps_xla", staticmethod(lambda model: False))


@pytest.mark.slow
def test_where_xla_is_not_kept_the_fit_trains_without_it_and_puts_it_back(keras_sees_a_gpu, xla_not_kept):
    reference = compiled_mlp("sequential", jit_compile=False)
    reference.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0)
    model = compiled_mlp("sequential")  # Keras's default jit_compile="auto"
    assert model.jit_compile is True, "the patched device list must make Keras choose XLA, as on a GPU machine"
    callback = LMS(swapout_threshold=THRESHOLD, verbose=0)
    with pytest.warns(UserWarning, match="jit_compile='auto'.*without XLA.*cost is XLA's kernel fusion") as said:
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
    assert len([w for w in said if "jit_compile='auto'" in str(w.message)]) == 1
    assert_swapped(callback, traces=1)
    assert callback.report.xla_clusters is None
    assert_bitwise_equal(snapshot(reference), snapshot(model), "LMS fit without XLA vs plain fit without XLA")
    assert model.jit_compile is True and _uses_xla(model), "XLA must be back after the fit"
    # a second fit reuses the XLA-free train function and its rewrite, and says nothing again
    import warnings as _warnings
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
    assert len(callback.reports) == 1 and _uses_xla(model)


def test_where_the_callback_turns_xla_off_it_says_what_that_costs_this_step(keras_sees_a_gpu, xla_not_kept):
    """Issue 46: the second warning gives the unchanged step's predicted time without XLA against XLA's, from the
    report (the graph and xla clocks of tflms.sim.clock, on the profile the fit was tuned for)."""
    model = compiled_mlp("sequential")  # jit_compile="auto": XLA on a GPU machine
    callback = LMS(profile="h200-141gb", verbose=0)
    with pytest.warns(UserWarning) as said:
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
    cost = callback.report.xla_cost
    assert cost["profile"] == "h200-141gb" and cost["simulated"]
    assert cost["slowdown"] == pytest.approx(cost["graph_step_s"] / cost["xla_step_s"]) and cost["slowdown"] > 1
    texts = [str(w.message) for w in said if "without XLA: the unchanged step is predicted" in str(w.message)]
    assert len(texts) == 1 and f"{cost['slowdown']:.2f}x XLA's time on h200-141gb" in texts[0]
    assert callback.report.xla_text() in callback.report.table()


def test_explicit_jit_compile_on_a_gpu_machine_without_lms_keeps_xla(keras_sees_a_gpu):
    model = compiled_mlp("sequential", jit_compile=True)
    model.fit(MLP_X[:16], MLP_Y[:16], batch_size=16, verbose=0)
    assert _uses_xla(model)  # the comparison above is not vacuous: Keras really builds an XLA step here


def test_distribution_strategy_is_refused():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = compiled_mlp("sequential")
    _weights_after_refused_fit(model, [LMS(verbose=0)], "OneDeviceStrategy.*not supported")


def test_a_train_function_keras_did_not_build_is_refused():
    class OwnTrainFunction(SubclassedMLP):
        def make_train_function(self, force=False):
            super().make_train_function(force)
            keras_function = self.train_function
            self.train_function = lambda iterator: keras_function(iterator)

    model = OwnTrainFunction()
    model(np.zeros((1, MLP_IN), np.float32))
    model.compile(optimizer="adam", loss="mse")
    _weights_after_refused_fit(model, [LMS(verbose=0)], "make_train_function")


def test_two_lms_callbacks_are_refused():
    model = compiled_mlp("sequential")
    _weights_after_refused_fit(model, [LMS(verbose=0), LMS(verbose=0)], "another LMS callback")


def test_run_eagerly_stands_aside_with_a_warning():
    reference = compiled_mlp("sequential", run_eagerly=True)
    reference.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, epochs=1, shuffle=False, verbose=0)
    model = compiled_mlp("sequential", run_eagerly=True)
    callback = LMS(verbose=0)
    with pytest.warns(UserWarning, match="run_eagerly=True.*stands aside"):
        model.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.report is None and callback.reports == []
    assert_bitwise_equal(snapshot(reference), snapshot(model), "run_eagerly with LMS standing aside")


def test_interrupted_fit_is_recovered_by_the_next_fit():
    """An exception in the middle of fit skips on_train_end; the next fit with the callback still works."""
    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise KeyboardInterrupt("stop")

    def train(model, callbacks):
        with pytest.raises(KeyboardInterrupt):
            model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=callbacks + [Interrupt()])
        model.fit(MLP_X, MLP_Y, batch_size=16, shuffle=False, verbose=0, callbacks=callbacks)

    reference = compiled_mlp("sequential")
    train(reference, [])
    model, callback = compiled_mlp("sequential"), LMS(swapout_threshold=THRESHOLD, verbose=0)
    train(model, [callback])
    assert is_keras_function(model.train_function)
    assert_swapped(callback)
    assert_bitwise_equal(snapshot(reference), snapshot(model), "interrupted fit, then fit")
    # a different LMS callback while the first one's step is still installed is refused, not stacked
    with pytest.raises(KeyboardInterrupt):
        model.fit(MLP_X, MLP_Y, batch_size=16, verbose=0, callbacks=[callback, Interrupt()])
    with pytest.raises(UnsupportedModelError, match="another LMS callback"):
        model.fit(MLP_X, MLP_Y, batch_size=16, verbose=0, callbacks=[LMS(verbose=0)])


# --------------------------------------------------------------- user surface
@pytest.mark.parametrize("verbose", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_verbose_says_what_it_did_once_per_trace(verbose, capsys):
    model = compiled_mlp("sequential")
    callback = LMS(verbose=verbose, swapout_threshold=THRESHOLD)
    model.fit(MLP_X, MLP_Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("tflms.keras.LMS:")]
    assert_swapped(callback, traces=1)
    assert len(lines) == 1, f"one trace, two epochs of four steps: one line expected\n{out}"
    assert f"{callback.report.num_swapped} tensors swapped" in lines[0]
    assert "(None, 8) float32, (None, 4) float32, sized for batch 16" in lines[0], lines[0]
    assert ("tensor" in out and "skipped candidates" in out) == (verbose == 2), out


@pytest.mark.parametrize("verbose", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_verbose_shows_tuner_progress_prediction_and_profile(verbose, capsys):
    fit = {"x": CNN_X[:32], "y": CNN_Y[:32], "epochs": 1, "batch_size": 16, "shuffle": False, "verbose": 0}
    probe = LMS(budget="1GiB", verbose=0)
    compiled_cnn("sequential").fit(callbacks=[probe], **fit)
    tight = probe.report.prediction()["peak_before_bytes"] - 1
    capsys.readouterr()
    callback = LMS(budget=tight, verbose=verbose)
    compiled_cnn("sequential").fit(callbacks=[callback], **fit)
    out = capsys.readouterr().out
    report = callback.report
    assert report.num_swapped > 0
    [summary] = [line for line in out.splitlines() if line.startswith("tflms.keras.LMS: training step")]
    p = report.prediction()
    assert f"predicted peak {tflms.units.format_bytes(p['peak_before_bytes'])} -> " in summary, summary
    assert f"step time {100 * p['overhead']:+.1f}% on v100-16gb-pcie3" in summary, summary
    assert "  hardware: v100-16gb-pcie3 (the default profile" in out
    candidates = [line for line in out.splitlines() if line.startswith("tflms.keras.LMS: candidate ")]
    if verbose == 1:  # a Keras progress bar counts the candidates
        assert "simulating candidate rewrites" in out and "/Unknown" in out and not candidates, out
    else:  # one line per candidate, with its peak and step time
        assert len(candidates) == len(report.tuning["candidates"]) - 1, out
        assert all(": peak " in line and ", step " in line for line in candidates)


def test_options_are_checked_when_the_callback_is_built():
    with pytest.raises(tflms.ConfigError, match="swapout_treshold.*did you mean 'swapout_threshold'"):
        LMS(swapout_treshold=2)
    with pytest.raises(tflms.DeviceError, match="GPU:7"):
        LMS(accelerator_device="/device:GPU:7")
    with pytest.raises(tflms.ConfigError, match="both '/device:CPU:0'"):
        LMS(accelerator_device="CPU:0")  # host_device defaults to the CPU too
    with pytest.raises(ValueError, match="verbose"):
        LMS(verbose=3)
    assert LMS("2GiB").config.budget_bytes == 2 * 1024 ** 3
    assert LMS(swapin_ahead=3, config=tflms.LMSConfig(swapout_threshold=5)).config.swapout_threshold == 5
    assert LMS().report is None and LMS().reports == []
    assert isinstance(LMS(), keras.callbacks.Callback)

