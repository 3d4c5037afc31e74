"""``tflms.keras.LMS`` on tf_keras (Keras 2) models: ``fit`` with the callback against ``fit`` without it.

tf_keras is not a dependency of tflms, and its wheel requires the full
``tensorflow`` package, which would clash with the ``tensorflow-cpu`` the ``[cpu]``
extra installs (one import package, two distributions). The ``tf_keras`` fixture
makes it importable: the installed one if its version is TensorFlow's
``major.minor``, else the release of this TensorFlow that conftest's
``tf_keras_path`` installed once with ``pip install --no-deps --target`` into
pytest's cache directory, put on ``sys.path`` (and on child processes'
``PYTHONPATH``). So the README's test command needs no
hand install; it needs the package index, as the install before it does.

Every comparison fits the same model (same seed, same data, ``shuffle=False``)
plainly twice (the control: plain tf_keras must repeat itself bit for bit, or
the comparison means nothing) and once with ``LMS(swapout_threshold=1)``, and
asserts that weights, optimizer variables and history are bitwise equal, that
every trace swapped something, and that every swap op is in the graph TensorFlow
ran (run metadata: one function graph holds them all, after grappler and in the
partition graphs).

This file is also the child program of the scenarios that need a process of
their own (``python tests/test_tf_keras.py mirrored OUT.json``: logical CPU
devices must be configured before TensorFlow starts).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import traceback
from typing import Any

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve()
SEED = 1234
THRESHOLD = 1
#: seconds for the MirroredStrategy child and for a child that loads a saved model.
MIRRORED_TIMEOUT_S = 300
LOAD_TIMEOUT_S = 120


# ============================================================================================ tf_keras itself
@pytest.fixture(scope="session")
def tf_keras(tf_keras_path):
    if tf_keras_path is not None and str(tf_keras_path) not in sys.path:
        sys.path.insert(0, str(tf_keras_path))
    import tensorflow as tf
    import tf_keras
    assert tf_keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2], (tf_keras.__version__, tf.__version__)
    return tf_keras


def _child_env(tf_keras_path: pathlib.Path | None) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    paths = [str(HERE.parent.parent)] + ([str(tf_keras_path)] if tf_keras_path is not None else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


# ================================================================================================== models
MLP_IN, MLP_HIDDEN, MLP_OUT = 8, 16, 4
CNN_CLASSES = 5
_rng = np.random.default_rng(0)
#: 56 samples in batches of 16: three full batches and a short one.
MLP_X = _rng.standard_normal((56, MLP_IN)).astype(np.float32)
MLP_Y = _rng.standard_normal((56, MLP_OUT)).astype(np.float32)
MLP_VAL = (_rng.standard_normal((12, MLP_IN)).astype(np.float32),
           _rng.standard_normal((12, MLP_OUT)).astype(np.float32))
CNN_X = _rng.standard_normal((40, 12, 12, 3)).astype(np.float32)
CNN_Y = _rng.integers(0, CNN_CLASSES, size=(40,)).astype(np.int32)
CNN_CLASS_WEIGHT = {c: 0.5 + 0.25 * c for c in range(CNN_CLASSES)}
CNN_VAL = (_rng.standard_normal((8, 12, 12, 3)).astype(np.float32),
           _rng.integers(0, CNN_CLASSES, size=(8,)).astype(np.int32))


def mlp(tfk, kind: str = "sequential"):
    """3 Dense+ReLU layers and a linear head, from a fixed seed (``subclassed``: with its own ``train_step``)."""
    tfk.utils.set_random_seed(SEED)
    if kind == "sequential":
        return tfk.Sequential([tfk.Input((MLP_IN,))] + [tfk.layers.Dense(MLP_HIDDEN, activation="relu")
                                                          for _ in range(3)] + [tfk.layers.Dense(MLP_OUT)])
    if kind == "functional":
        inputs = h = tfk.Input((MLP_IN,))
        for _ in range(3):
            h = tfk.layers.Dense(MLP_HIDDEN, activation="relu")(h)
        return tfk.Model(inputs, tfk.layers.Dense(MLP_OUT)(h))

    class CustomStepMLP(tfk.Model):
        def __init__(self):
            super().__init__()
            self.hidden = [tfk.layers.Dense(MLP_HIDDEN, activation="relu") for _ in range(3)]
            self.head = tfk.layers.Dense(MLP_OUT)

        def call(self, x, training=False):
            for layer in self.hidden:
                x = layer(x)
            return self.head(x)

        def train_step(self, data):  # tf_keras's usual customization
            import tensorflow as tf
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(y, self(x, training=True))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                               self.trainable_variables))
            self.compiled_metrics.update_state(y, self(x, training=False))
            return {m.name: m.result() for m in self.metrics}

    model = CustomStepMLP()
    model(np.zeros((1, MLP_IN), np.float32))
    return model


def compiled_mlp(tfk, kind: str = "sequential", **compile_options):
    model = mlp(tfk, kind)
    model.compile(optimizer=tfk.optimizers.Adam(learning_rate=1e-2), loss="mse", metrics=["mae"], **compile_options)
    return model


def compiled_cnn(tfk, **compile_options):
    """Conv2D + BatchNormalization + ReLU + MaxPool + Dense, SGD with momentum (functional)."""
    tfk.utils.set_random_seed(SEED)
    inputs = tfk.Input((12, 12, 3))
    h = tfk.layers.Conv2D(8, 3, padding="same")(inputs)
    h = tfk.layers.ReLU()(tfk.layers.BatchNormalization()(h))
    h = tfk.layers.Flatten()(tfk.layers.MaxPooling2D()(h))
    model = tfk.Model(inputs, tfk.layers.Dense(CNN_CLASSES)(h))
    model.compile(optimizer=tfk.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                  loss=tfk.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  **compile_options)
    return model


# ================================================================================================== runner
def _is_tf_keras_function(model) -> bool:
    """``model.train_function`` is tf_keras's own (LMS put it back)."""
    fn = getattr(model.train_function, "python_function", None)
    return getattr(fn, "__module__", "") == "tf_keras.src.engine.training"


def assert_swaps_ran(ran, reports) -> None:
    """Every trace swapped, and one function graph TensorFlow ran holds all its swap ops after grappler and in its
    partitions (the rewritten step ran as a function of its own)."""
    assert reports, "the LMS callback never rewrote a step"
    for i, report in enumerate(reports):
        assert report.num_swapped > 0, f"trace {i} swapped nothing, equivalence proves nothing:\n{report.table()}"
        inserted = set(report.inserted_ops)
        holders = [fg for fg in ran.function_graphs if inserted <= {n.name for n in fg.pre_optimization_graph.node}]
        assert len(holders) == 1, f"trace {i}: {len(holders)} function graphs that ran hold all its swap ops"
        post = {n.name for n in holders[0].post_optimization_graph.node}
        assert not inserted - post, f"trace {i}: grappler removed {sorted(inserted - post)}"
        parts = {n.name for g in holders[0].partition_graphs for n in g.node}
        assert not inserted - parts, f"trace {i}: not in the partition graphs that ran: {sorted(inserted - parts)}"


def fit_three_times(build, callback=None, **fit_options):
    """Plain fit, plain fit again (control), fit with ``callback``: all bitwise equal; returns (model, callback).

    The graphs TensorFlow ran during the LMS fit must hold every swap op.
    """
    import tflms.keras
    from tflms.testing import assert_bitwise_equal, bitwise_diff, record_run_metadata, snapshot
    fit_options = {"batch_size": 16, "epochs": 2, "shuffle": False, "verbose": 0, **fit_options}
    initial = snapshot(build())
    results = []
    for lms in (None, None, callback or tflms.keras.LMS(swapout_threshold=THRESHOLD, verbose=0)):
        model = build()
        with record_run_metadata() as ran:
            history = model.fit(callbacks=[lms] if lms is not None else [], **fit_options).history
        results.append((model, history, snapshot(model), ran))
    (_, plain_history, plain, _), (_, control_history, control, _), (model, history, swapped, ran) = results
    assert bitwise_diff(initial, plain[:len(initial)]), "training changed nothing: the comparison is vacuous"
    assert_bitwise_equal(plain, control, "plain fit vs plain fit (control)")
    assert control_history == plain_history
    assert history == plain_history, f"history differs:\n{history}\nvs plain fit\n{plain_history}"
    assert_bitwise_equal(plain, swapped, "fit with LMS vs plain fit")
    assert_swaps_ran(ran, lms.reports)
    assert _is_tf_keras_function(model), "tf_keras's train function was not put back after fit"
    return model, lms


# =========================================================================================== quick tests
@pytest.mark.parametrize("kind,steps_per_execution", [("sequential", 3), ("functional", 1)])
def test_mlp_fit_matches_plain_fit(tf_keras, kind, steps_per_execution, capsys):
    """MLP + Adam, 2 epochs of 3 full batches and a short one, validation data; steps_per_execution 3 runs each
    epoch as 3 + 1 (tf_keras lowers its variable for the last execution)."""
    model, callback = fit_three_times(lambda: compiled_mlp(tf_keras, kind, steps_per_execution=steps_per_execution),
                                      x=MLP_X, y=MLP_Y, validation_data=MLP_VAL)
    assert len(callback.reports) == 1, "one trace, for the dataset's element_spec (batch None)"
    assert callback.report.plan.config.batch_size == 16
    assert "val_loss" in model.history.history and "mae" in model.history.history
    assert int(model.steps_per_execution) == steps_per_execution
    assert "tflms.keras.LMS" not in capsys.readouterr().out, "verbose=0 must print nothing"


def test_a_dataset_of_unknown_length_matches_plain_fit(tf_keras):
    """A dataset of unknown length (a filter; TFRecord files and generators are such) ends its first epoch when
    tf_keras's train function raises OutOfRangeError, and the ops of that call that do not wait for data run first:
    tf_keras's own fit counts one optimizer iteration more than it trained (13 for 12 steps here), which Adam's bias
    correction reads in every later step. The callback calls tf_keras's function there too, so it trains the same."""
    import tensorflow as tf
    dataset = tf.data.Dataset.from_tensor_slices((MLP_X[:48], MLP_Y[:48])).filter(lambda x, y: True).batch(16)
    assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    model, _ = fit_three_times(lambda: compiled_mlp(tf_keras), x=dataset, batch_size=None, epochs=3)
    assert int(model._train_counter.numpy()) == 9  # noqa: SLF001 - three epochs of three batches
    assert int(model.optimizer.iterations.numpy()) == 10, "tf_keras's extra iteration, which the LMS fit must share"


def test_running_out_of_data_mid_execution_ends_as_tf_keras_does(tf_keras):
    """steps_per_epoch 6 with steps_per_execution 3 over a dataset of 4 batches: tf_keras's own loop trains the 4th
    batch, runs out of data inside its second execution and raises OutOfRangeError there (that execution reports no
    batch end; fit warns and stops). The callback's loop must end the same way: same weights, same batch ends."""
    import tensorflow as tf
    import tflms.keras
    from tflms.testing import assert_bitwise_equal, snapshot

    class BatchEnds(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(batch)

    dataset = tf.data.Dataset.from_tensor_slices((MLP_X[:64], MLP_Y[:64])).batch(16)
    runs = []
    for lms in (None, None, tflms.keras.LMS(swapout_threshold=THRESHOLD, verbose=0)):
        model, ends = compiled_mlp(tf_keras, steps_per_execution=3), BatchEnds()
        model.fit(dataset, steps_per_epoch=6, epochs=2, verbose=0, callbacks=[ends] + ([lms] if lms else []))
        runs.append((snapshot(model), ends.ends))
    assert runs[0][1] == [2], runs[0][1]  # tf_keras's own behaviour, which the comparison relies on
    assert_bitwise_equal(runs[0][0], runs[1][0], "plain fit vs plain fit (control)")
    assert runs[2][1] == runs[0][1]
    assert_bitwise_equal(runs[0][0], runs[2][0], "fit with LMS vs plain fit")
    assert lms.reports and lms.report.num_swapped > 0


def test_cnn_batchnorm_with_class_weights_matches_plain_fit(tf_keras):
    """Conv + BatchNorm + SGD with momentum, class weights (a third input), a short last batch, validation data."""
    import tflms.keras
    model, callback = fit_three_times(lambda: compiled_cnn(tf_keras), tflms.keras.LMS(swapout_threshold=2, verbose=0),
                                      x=CNN_X, y=CNN_Y, epochs=1, class_weight=CNN_CLASS_WEIGHT,
                                      validation_data=CNN_VAL)
    assert any("moving_variance" in v.name for v in model.weights)
    from tflms.integrations.keras import _input_specs
    assert len(_input_specs(callback._order[0].original)) == 3  # noqa: SLF001 - x, y and the weights


def test_keras_flavour_is_read_from_the_classes(tf_keras):
    import keras
    from tflms._compat.flavour import KERAS_3, TF_KERAS, keras_flavour
    import tflms.keras

    class Mine(tf_keras.Model):
        pass

    assert keras_flavour(mlp(tf_keras)) == TF_KERAS
    assert keras_flavour(Mine()) == TF_KERAS
    assert keras_flavour(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])) == KERAS_3
    assert keras_flavour(tf_keras.callbacks.History()) == TF_KERAS
    assert keras_flavour(tflms.keras.LMS(verbose=0)) == KERAS_3  # a Keras 3 callback that serves both
    assert keras_flavour(np.zeros(2)) is None and keras_flavour(None) is None


def test_a_tf_keras_model_on_a_keras_3_only_path_names_the_flavour(tf_keras):
    """Gradient checkpointing reads Keras 3's layer graph: a tf_keras model gets a KerasFlavourError saying what it
    is and what to use, not an AttributeError from deep inside."""
    import tflms
    from tflms.baselines.recompute import checkpointed
    with pytest.raises(tflms.KerasFlavourError, match=r"'sequential\w*' is a tf_keras \(Keras 2\) object .*takes "
                       r"Keras 3 models only \(import keras.*build the model with Keras 3"):
        checkpointed(mlp(tf_keras))
    assert issubclass(tflms.KerasFlavourError, tflms.UnsupportedModelError)


def test_a_keras_3_model_on_the_tf_keras_path_names_the_flavour(tf_keras):
    import keras
    import tflms
    from tflms.integrations.tf_keras import train_step_function
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)], name="k3")
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    with pytest.raises(tflms.KerasFlavourError, match=r"'k3' is a Keras 3 object .*takes tf_keras \(Keras 2\) "
                       r"models only \(import tf_keras"):
        train_step_function(model, model.train_function)


def _refused(model, callbacks, match):
    import tflms
    from tflms.testing import assert_bitwise_equal, snapshot
    before = snapshot(variables=model.weights)
    with pytest.raises(tflms.UnsupportedModelError, match=match):
        model.fit(MLP_X[:16], MLP_Y[:16], batch_size=16, verbose=0, callbacks=callbacks)
    assert_bitwise_equal(before, snapshot(variables=model.weights), "a refused fit must not train")


def test_refusals_come_before_any_step(tf_keras):
    import tensorflow as tf
    import tflms.keras
    _refused(compiled_mlp(tf_keras, jit_compile=True), [tflms.keras.LMS(verbose=0)],
             "tf_keras model .* jit_compile=True.*jit_compile=False")
    _refused(compiled_mlp(tf_keras), [tflms.keras.LMS(verbose=0), tflms.keras.LMS(verbose=0)], "another LMS callback")
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = compiled_mlp(tf_keras)
    _refused(model, [tflms.keras.LMS(verbose=0)], "OneDeviceStrategy.*not supported")

    class OwnTrainFunction(tf_keras.Sequential):
        def make_train_function(self, force=False):
            keras_function = super().make_train_function(force)
            self.train_function = lambda iterator: keras_function(iterator)
            return self.train_function

    tf_keras.utils.set_random_seed(SEED)
    model = OwnTrainFunction([tf_keras.Input((MLP_IN,)), tf_keras.layers.Dense(MLP_OUT)])
    model.compile(optimizer="adam", loss="mse")
    _refused(model, [tflms.keras.LMS(verbose=0)], "train_function .*make_train_function")


def test_multi_worker_mirrored_strategy_is_refused_for_tf_keras_models(tf_keras):
    """Untested with tf_keras, so refused by name (a strategy object made without starting it: creating one needs
    a process of its own)."""
    import types
    import tensorflow as tf
    import tflms
    from tflms.integrations.tf_keras import check_supported
    strategy = tf.distribute.MultiWorkerMirroredStrategy.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    model = types.SimpleNamespace(name="m", jit_compile=None, run_eagerly=False, distribute_strategy=strategy)
    with pytest.raises(tflms.UnsupportedModelError, match="'m' trains under MultiWorkerMirroredStrategy.*not tested "
                       "with tf_keras.*Use MirroredStrategy"):
        check_supported(model)
    check_supported(types.SimpleNamespace(name="m", jit_compile=None, run_eagerly=False,
                                          distribute_strategy=tf.distribute.get_strategy()))


def test_run_eagerly_stands_aside_with_a_warning(tf_keras):
    import tflms.keras
    from tflms.testing import assert_bitwise_equal, snapshot
    reference = compiled_mlp(tf_keras, run_eagerly=True)
    reference.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, shuffle=False, verbose=0)
    model, callback = compiled_mlp(tf_keras, run_eagerly=True), tflms.keras.LMS(verbose=0)
    with pytest.warns(UserWarning, match="run_eagerly=True.*stands aside"):
        model.fit(MLP_X[:32], MLP_Y[:32], batch_size=16, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.reports == []
    assert_bitwise_equal(snapshot(reference), snapshot(model), "run_eagerly with LMS standing aside")


# ============================================================================================ slow tests
@pytest.mark.slow
def test_custom_train_step_matches_plain_fit(tf_keras):
    fit_three_times(lambda: compiled_mlp(tf_keras, "subclassed", steps_per_execution=2), x=MLP_X, y=MLP_Y)


@pytest.mark.slow
def test_repeated_fit_reuses_the_trace_and_resizes_for_a_larger_batch(tf_keras):
    """Four fits of one model with one callback: batch 8 twice (one trace), batch 16 (the trace, of batch None, is
    rewritten again, sized for 16), then a fit without the callback (tf_keras's own step)."""
    import tflms.keras
    from tflms.testing import assert_bitwise_equal, snapshot
    fits = [(8, True), (8, True), (16, True), (16, False)]

    def train(model, callback):
        counts = []
        for batch_size, lms in fits:
            model.fit(MLP_X[:44], MLP_Y[:44], batch_size=batch_size, shuffle=False, verbose=0,
                      callbacks=[callback] if lms and callback is not None else [])
            counts.append(0 if callback is None else len(callback.reports))
        return counts

    reference = compiled_mlp(tf_keras, "functional")
    train(reference, None)
    model, callback = compiled_mlp(tf_keras, "functional"), tflms.keras.LMS(swapout_threshold=THRESHOLD, verbose=0)
    assert train(model, callback) == [1, 1, 2, 2]
    assert [r.plan.config.batch_size for r in callback.reports] == [8, 16]
    assert _is_tf_keras_function(model)
    assert_bitwise_equal(snapshot(reference), snapshot(model), "four fits, three with LMS")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["keras", "savedmodel"])
def test_saved_model_loads_without_tflms_and_has_no_swap_ops(tf_keras, tf_keras_path, tmp_path, fmt):
    """model.save after a fit with the callback (tf_keras's .keras file, and its SavedModel directory, which TFX
    serves): loaded by tf_keras in a fresh process without tflms, the weights and predictions are the trained
    ones, bit for bit, and nothing in the saved files mentions a swap op."""
    model, _ = fit_three_times(lambda: compiled_mlp(tf_keras, "functional"), x=MLP_X[:48], y=MLP_Y[:48], epochs=1)
    path = tmp_path / ("model.keras" if fmt == "keras" else "saved_model")
    model.save(str(path))
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        data = file.read_bytes()
        assert b"lms/swap" not in data and b"tflms" not in data, f"{file} mentions tflms"
    np.savez(tmp_path / "expected.npz", *model.get_weights())
    np.save(tmp_path / "x.npy", MLP_X[:4])
    np.save(tmp_path / "predicted.npy", model.predict(MLP_X[:4], verbose=0))
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import tf_keras
        model = tf_keras.models.load_model({str(path)!r})
        expected = np.load({str(tmp_path / 'expected.npz')!r})
        got = model.get_weights()
        assert len(got) == len(expected.files), (len(got), len(expected.files))
        for i, w in enumerate(got):
            assert w.tobytes() == expected[f"arr_{{i}}"].tobytes(), f"weight {{i}} differs"
        predicted = model.predict(np.load({str(tmp_path / 'x.npy')!r}), verbose=0)
        assert predicted.tobytes() == np.load({str(tmp_path / 'predicted.npy')!r}).tobytes()
        assert not any(m == "tflms" or m.startswith("tflms.") for m in sys.modules), "tflms was imported"
        print("loaded ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=LOAD_TIMEOUT_S,
                          env=_child_env(tf_keras_path))
    assert done.returncode == 0 and "loaded ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_tf_keras_via_the_legacy_keras_env_var(tf_keras_path, tmp_path):
    """``TF_USE_LEGACY_KERAS=1`` (as TFX sets it): ``tf.keras`` is tf_keras, ``import keras`` still Keras 3, and a
    ``tf.keras`` model trains with the callback bitwise like without it (in a fresh process: the variable is read
    when TensorFlow is imported)."""
    script = textwrap.dedent(f"""
        import numpy as np
        import tensorflow as tf
        import tflms.keras
        from tflms.testing import bitwise_diff, snapshot
        assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
        x = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
        y = x[:, :4] * 2

        def build():
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                         tf.keras.layers.Dense(4)])
            model.compile(optimizer="adam", loss="mse")
            return model

        runs = []
        for lms in (None, None, tflms.keras.LMS(swapout_threshold={THRESHOLD}, verbose=0)):
            model = build()
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[lms] if lms else [])
            runs.append(snapshot(model))
        assert not bitwise_diff(runs[0], runs[1]), "plain vs plain"
        assert not bitwise_diff(runs[0], runs[2]), bitwise_diff(runs[0], runs[2])
        assert type(model).__module__.startswith("tf_keras.") and lms.report.num_swapped > 0
        print("legacy ok")
    """)
    env = dict(_child_env(tf_keras_path), TF_USE_LEGACY_KERAS="1")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=LOAD_TIMEOUT_S,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0 and "legacy ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_model_checkpoint_during_fit_saves_no_swap_ops(tf_keras, tmp_path):
    """tf_keras's ModelCheckpoint saves a SavedModel at every epoch end while the callback's train function is in
    place: tf_keras leaves train functions out of what it saves, so no swap op gets in."""
    import tflms.keras
    model, lms = compiled_mlp(tf_keras), tflms.keras.LMS(swapout_threshold=THRESHOLD, verbose=0)
    checkpoint = tf_keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch{epoch}"), save_weights_only=False)
    model.fit(MLP_X, MLP_Y, batch_size=16, epochs=2, verbose=0, callbacks=[lms, checkpoint])
    assert lms.report.num_swapped > 0
    saved = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert {p.relative_to(tmp_path).parts[0] for p in saved} == {"epoch1", "epoch2"}, saved
    for file in saved:
        data = file.read_bytes()
        assert b"lms/swap" not in data and b"tflms" not in data, f"{file} mentions tflms"


# -------------------------------------------------------------------------- tf_keras.applications, transformer
BATCH, STEPS = 2, 2


def _image_data(side: int, classes: int):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH * STEPS, side, side, 3)).astype(np.float32),
            rng.integers(0, classes, size=(BATCH * STEPS,)).astype(np.int32))


def _compiled(tfk, model):
    model.compile(optimizer=tfk.optimizers.RMSprop(), jit_compile=False,
                  loss=tfk.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _application(tfk, name: str, side: int):
    def build():
        tfk.utils.set_random_seed(0)
        return _compiled(tfk, getattr(tfk.applications, name)(weights=None, input_shape=(side, side, 3), classes=3,
                                                              classifier_activation=None))
    return build


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("name,side", [("ResNet50", 32), ("MobileNetV2", 32)])
def test_application_fit_is_bitwise(tf_keras, name, side):
    """tf_keras.applications at 32x32, batch 2, two steps: residual adds and BatchNorm (ResNet50), depthwise
    convolutions and ReLU6 (MobileNetV2)."""
    fit_three_times(_application(tf_keras, name, side), x=_image_data(side, 3)[0], y=_image_data(side, 3)[1],
                    batch_size=BATCH, epochs=1)


def _transformer_block(tfk, seq: int = 8, dim: int = 16, classes: int = 3):
    def build():
        tfk.utils.set_random_seed(0)
        inputs = tfk.Input((seq, dim))
        attended = tfk.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs)
        h = tfk.layers.LayerNormalization()(tfk.layers.Add()([inputs, attended]))
        ff = tfk.layers.Dense(dim)(tfk.layers.Dense(4 * dim, activation="gelu")(h))
        h = tfk.layers.LayerNormalization()(tfk.layers.Add()([h, ff]))
        outputs = tfk.layers.Dense(classes)(tfk.layers.GlobalAveragePooling1D()(h))
        return _compiled(tfk, tfk.Model(inputs, outputs))
    return build


@pytest.mark.slow
def test_transformer_block_fit_is_bitwise(tf_keras):
    """MultiHeadAttention + residual Add + LayerNormalization + Dense(gelu) feed-forward, pooled to a classifier."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, 8, 16)).astype(np.float32)
    y = rng.integers(0, 3, size=(BATCH * STEPS,)).astype(np.int32)
    fit_three_times(_transformer_block(tf_keras), x=x, y=y, batch_size=BATCH, epochs=1)


# ------------------------------------------------------------------------------------------ MirroredStrategy
@pytest.fixture(scope="module")
def mirrored(tf_keras_path, tmp_path_factory) -> dict[str, Any]:
    """The MirroredStrategy scenarios, run in one child process with three logical CPUs (replicas CPU:1 and CPU:2,
    host CPU:0, as on a machine with two GPUs)."""
    out = tmp_path_factory.mktemp("tf_keras_mirrored") / "results.json"
    log = out.with_suffix(".log")
    with open(log, "w") as handle:
        try:
            done = subprocess.run([sys.executable, str(HERE), "mirrored", str(out)], env=_child_env(tf_keras_path),
                                  stdout=handle, stderr=subprocess.STDOUT, timeout=MIRRORED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the MirroredStrategy child took over {MIRRORED_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
    assert done.returncode == 0, f"the child exited with {done.returncode}:\n{log.read_text()[-5000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp_validation", "cnn_batchnorm_spe2"])
def test_mirrored_strategy_fit_matches_plain_fit(mirrored, case):
    """Every replica's copy of every weight and optimizer variable bitwise equal to a plain fit under the same
    strategy (and a plain control); every replica swaps to its host, and the swap ops ran (test_distribute's
    placement checks on the partition graphs)."""
    result = mirrored[case]
    assert result["error"] is None, f"{case} failed in the child:\n{result['error']}"
    assert result["control_diffs"] == [], "plain fit vs plain fit:\n  " + "\n  ".join(result["control_diffs"])
    assert result["diffs"] == [], "fit with LMS vs plain fit:\n  " + "\n  ".join(result["diffs"])
    assert result["changed"], "training changed no variable: the comparison is vacuous"
    assert result["history"] == result["reference_history"]
    local = "/job:localhost/replica:0/task:0/device:"
    replicas = [local + "CPU:1", local + "CPU:2"]
    per_replica = result["swaps_per_replica"]
    assert sorted(per_replica) == replicas and len(set(per_replica.values())) == 1, per_replica
    assert min(per_replica.values()) > 0, per_replica
    assert result["hosts"] == {r: [local + "CPU:0"] for r in replicas}, result["hosts"]
    assert result["violations"] == [], "placement / survival violations:\n  " + "\n  ".join(result["violations"])
    assert result["cross_device_feeds"] > 0 and result["recv_from_host"] == result["cross_device_feeds"], result


# ============================================================================================ child side
def _mirrored_state(strategy, variables) -> list[tuple[str, np.ndarray]]:
    """Every replica's copy of every variable."""
    return [(f"{v.name}[replica {i}]", np.array(c.numpy()))
            for v in variables for i, c in enumerate(strategy.experimental_local_results(v))]


def _mirrored_scenario(strategy, replicas, case: str):
    import tf_keras as tfk
    from test_distribute import _placement_facts, _Recorder, _summary  # this directory is sys.path[0] here
    import tflms.keras
    from tflms.testing.bitwise import bitwise_diff
    rng = np.random.default_rng(0)
    if case == "mlp_validation":
        x, y = rng.standard_normal((64, MLP_IN)).astype(np.float32), rng.standard_normal((64, MLP_OUT)).astype(
            np.float32)
        fit = {"validation_data": (x[:16], y[:16])}
        spe = 1
    else:
        x = rng.standard_normal((64, 12, 12, 3)).astype(np.float32)
        y = rng.integers(0, CNN_CLASSES, size=(64,)).astype(np.int32)
        fit, spe = {}, 2
    fit.update(batch_size=16, epochs=2, shuffle=False, verbose=0)

    def build():
        with strategy.scope():
            return (compiled_mlp(tfk, "sequential", steps_per_execution=spe) if case == "mlp_validation"
                    else compiled_cnn(tfk, steps_per_execution=spe))

    def variables(model):
        return list(model.weights) + list(model.optimizer.variables)

    def run():
        reference, control = build(), build()
        ref_history = reference.fit(x, y, **fit).history
        control.fit(x, y, **fit)
        model = build()
        initial = _mirrored_state(strategy, model.weights)
        lms = tflms.keras.LMS(swapout_threshold=THRESHOLD, accelerator_device="/device:CPU:1", verbose=0)
        with _Recorder() as rec:
            history = model.fit(x, y, callbacks=[lms], **fit).history
        trace = lms._last_step.last  # noqa: SLF001 - the trace that ran (its rewritten ConcreteFunction)
        plain = _mirrored_state(strategy, variables(reference))
        return {"history": history, "reference_history": ref_history,
                "control_diffs": bitwise_diff(plain, _mirrored_state(strategy, variables(control))),
                "diffs": bitwise_diff(plain, _mirrored_state(strategy, variables(model))),
                "changed": bool(bitwise_diff(initial, _mirrored_state(strategy, model.weights))),
                **_summary(lms.report, lms.placement),
                **_placement_facts(lms.report, lms.placement, trace.rewritten, rec.metadata, replicas)}
    return run


def mirrored_main(out: str) -> None:
    from test_distribute import LOCAL, _configure_cpus  # this directory is sys.path[0] here
    _configure_cpus(3)
    import tensorflow as tf
    replicas = [LOCAL + "CPU:1", LOCAL + "CPU:2"]
    strategy = tf.distribute.MirroredStrategy(replicas)
    results: dict[str, Any] = {}
    for case in ("mlp_validation", "cnn_batchnorm_spe2"):
        try:
            results[case] = {"error": None, **_mirrored_scenario(strategy, replicas, case)()}
        except Exception:  # reported to the parent, which fails the matching test
            results[case] = {"error": traceback.format_exc()}
        print(f"{case}: {'ok' if results[case]['error'] is None else 'FAILED'}", flush=True)
    pathlib.Path(out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    if sys.argv[1:2] != ["mirrored"]:
        raise SystemExit("usage: python tests/test_tf_keras.py mirrored OUT.json")
    mirrored_main(sys.argv[2])
