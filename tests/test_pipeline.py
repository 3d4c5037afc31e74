"""The one pipeline: every entry point rewrites through ``tflms.pipeline.rewrite_step``.

Checks that the stages run in order and report, that ``tflms.function``, the Keras
callback, the SavedModel command and ``tflms.rewrite`` produce the same rewrite for the
same step and config, and that compression (``LMSConfig.compress``) reaches every entry
point: lossless ``zvc`` trains bitwise, lossy codecs are applied and stay close.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
import tflms.keras
from tflms import cli
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.ir import tf_io
from tflms.pipeline import StepRewrite, inserted_ops, rewrite_step
from tflms.testing import Snapshot, assert_bitwise_equal, bitwise_diff, make_train_step, snapshot

BATCH = 8
#: Every tensor is a candidate: the small model gets swaps.
OPTIONS = {"swapout_threshold": 1}


def build_model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12, 12, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(4)(h))


def data(steps: int = 2):
    rng = np.random.default_rng(0)
    return [(tf.constant(rng.standard_normal((BATCH, 12, 12, 3)), tf.float32),
             tf.constant(rng.integers(0, 4, BATCH), tf.int32)) for _ in range(steps)]


def trained_state(wrap, steps: int = 2) -> tuple[object, Snapshot]:
    """Train a fresh model for ``steps`` steps through ``wrap(step)``; every variable's bytes after."""
    model = build_model()
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    fn = wrap(make_train_step(model, optimizer))
    for x, y in data(steps):
        fn(x, y)
    return fn, snapshot(model, optimizer)


@pytest.fixture(scope="module")
def plain_state():
    _, first = trained_state(tf.function)
    _, second = trained_state(tf.function)
    assert_bitwise_equal(first, second, "plain TensorFlow twice (must agree, or the comparison means nothing)")
    return first


def test_rewrite_step_runs_every_stage_and_builds_the_function():
    model = build_model()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x, y = data(1)[0]
    concrete = step.get_concrete_function(x, y)
    result = rewrite_step(concrete, LMSConfig(**OPTIONS))
    assert isinstance(result, StepRewrite)
    assert list(result.report.timings_s) == ["preoptimize", "load", "analyze", "plan", "apply", "place", "build"]
    assert result.report.num_swapped > 0
    # the report's inserted ops are exactly the ops the graph gained, all of them kept as control outputs
    from tflms.ir.preoptimize import preoptimize
    original = tf_io.load_graph(preoptimize(concrete))
    assert result.report.inserted_ops == inserted_ops(original, result.graph)
    assert set(result.report.inserted_ops) == {n for s in result.report.plan.swaps
                                               for n in (s.swap_out, *(g.name for g in s.swap_ins))}
    controls = {op.name for op in result.function.graph.control_outputs}
    assert set(result.report.inserted_ops) <= controls
    unbuilt = rewrite_step(concrete, LMSConfig(**OPTIONS), build=False)
    assert unbuilt.function is None and "build" not in unbuilt.report.timings_s


def test_a_step_left_alone_runs_the_users_own_function():
    """Nothing inserted (the step fits the budget): the built function is the user's, not the pre-optimized one.

    A rebuilt function would run the pre-pass's graph, the same only where it mimics TensorFlow exactly
    (AccumulateNV2 and while loops are the known exceptions: docs/design.md).
    """
    model = build_model()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    x, y = data(1)[0]
    concrete = step.get_concrete_function(x, y)
    fits = rewrite_step(concrete, LMSConfig(budget="12GiB"))
    assert fits.report.inserted_ops == () and fits.function is concrete
    swapped = rewrite_step(concrete, LMSConfig(**OPTIONS))  # the control: a rewrite builds a new function
    assert swapped.report.inserted_ops and swapped.function is not concrete


def test_entry_points_rewrite_the_same_step_identically():
    """tflms.function and tflms.rewrite go through one pipeline: the same graph, byte for byte."""
    fn, _ = trained_state(lambda s: tflms.function(s, **OPTIONS), steps=1)
    traced = fn.original_function.get_concrete_function(*data(1)[0])
    via_api = tflms.rewrite(traced, **OPTIONS)
    assert tf_io.to_graph_def(via_api.graph).SerializeToString(deterministic=True) == \
        tf_io.to_graph_def(rewrite_step(traced, LMSConfig(**OPTIONS), build=False).graph).SerializeToString(
            deterministic=True)
    assert fn.report.inserted_ops == via_api.report.inserted_ops


def test_zvc_compression_through_tflms_function_is_bitwise(plain_state):
    fn, state = trained_state(lambda s: tflms.function(s, compress="zvc", **OPTIONS))
    assert fn.report.compression and set(fn.report.compression.values()) == {"zvc"}
    assert any(name.startswith("lms/encode_") for name in fn.report.inserted_ops)
    assert_bitwise_equal(plain_state, state, "tflms.function(compress='zvc') vs plain")


def test_lossy_compression_is_applied_and_stays_close(plain_state):
    fn, state = trained_state(lambda s: tflms.function(s, compress="bf16", **OPTIONS))
    assert set(fn.report.compression.values()) == {"bf16"}
    assert bitwise_diff(plain_state, state), "bf16 swaps should change some bits: was the codec applied?"
    for (_, a), (_, b) in zip(plain_state, state):
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.05)


def test_auto_compression_measures_on_the_first_call(plain_state):
    fn, state = trained_state(lambda s: tflms.function(s, compress="auto", **OPTIONS))
    # CSwap+ only compresses exposed copies where it pays; whatever it chose is lossless
    assert set(fn.report.compression.values()) <= {"zvc"}
    assert_bitwise_equal(plain_state, state, "tflms.function(compress='auto') vs plain")


def test_zvc_compression_through_the_keras_callback_is_bitwise():
    def fit(callbacks):
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        xs = np.concatenate([x.numpy() for x, _ in data(2)])
        ys = np.concatenate([y.numpy() for _, y in data(2)])
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return snapshot(model)

    plain = fit([])
    lms = tflms.keras.LMS(compress="zvc", verbose=0, **OPTIONS)
    assert_bitwise_equal(plain, fit([lms]), "LMS(compress='zvc') fit vs plain fit")
    assert set(lms.report.compression.values()) == {"zvc"}


class Trainer(tf.Module):
    def __init__(self):
        super().__init__()
        self.w1 = tf.Variable(tf.random.stateless_normal((8, 32), seed=(1, 2)), name="w1")
        self.w2 = tf.Variable(tf.random.stateless_normal((32, 4), seed=(3, 4)), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32), tf.TensorSpec([4, 4], tf.float32)])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, self.w1))
            h = tf.nn.relu(h * 2.0)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, self.w2) - y))
        g1, g2 = tape.gradient(loss, [self.w1, self.w2])
        self.w1.assign_sub(0.01 * g1)
        self.w2.assign_sub(0.01 * g2)
        return loss


def test_zvc_compression_through_the_savedmodel_command(tmp_path, capsys):
    in_dir = tmp_path / "in"
    tf.saved_model.save(Trainer(), str(in_dir))
    out_dir = tmp_path / "out"
    code = cli.main(["rewrite", str(in_dir), str(out_dir), "--compress", "zvc", "--swapout-threshold", "1",
                     "--verify", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    loaded = tf.saved_model.load(str(out_dir))
    (traced,) = loaded.train.concrete_functions
    ops = [op.name for op in traced.graph.get_operations()]
    assert '"compression"' in out and '"zvc"' in out
    assert any(name.startswith("lms/encode_") for name in ops) and any(
        name.startswith("lms/decode_") for name in ops), [n for n in ops if n.startswith("lms/")]


def test_auto_compression_is_refused_where_there_are_no_inputs(tmp_path, capsys):
    in_dir = tmp_path / "in"
    tf.saved_model.save(Trainer(), str(in_dir))
    code = cli.main(["rewrite", str(in_dir), str(tmp_path / "out"), "--compress", "auto"])
    err = capsys.readouterr().err
    assert code == 2 and "--compress auto" in err and "zvc" in err
    assert not (tmp_path / "out").exists()


def test_compress_is_validated_when_the_config_is_built():
    with pytest.raises(ConfigError, match="compress must be None, 'auto' or a codec name"):
        LMSConfig(compress="lz4")
    assert LMSConfig(compress="int8").compress == "int8-block"
    from tflms.compress.codecs import CODEC_NAMES
    from tflms.config import COMPRESS_CODECS
    assert set(COMPRESS_CODECS) == set(CODEC_NAMES), "config.py's codec names must follow tflms.compress"
