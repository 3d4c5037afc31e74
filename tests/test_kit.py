"""The shared test kit (tflms.testing): bitwise comparison, snapshots, model zoo, train step."""

from __future__ import annotations

import numpy as np
import pytest

from tflms.testing import (MODEL_BUILDERS, assert_bitwise_equal, bitwise_diff, build_model, differences,
                           make_batches, make_train_step, snapshot)


def test_bitwise_diff_is_stricter_than_array_equal():
    """-0.0 vs 0.0 differs although np.array_equal says equal; a NaN equals itself bit for bit."""
    zero = [("w", np.array([0.0, 1.0], np.float32))]
    minus_zero = [("w", np.array([-0.0, 1.0], np.float32))]
    assert np.array_equal(zero[0][1], minus_zero[0][1])
    found = differences(zero, minus_zero)
    assert [(d.name, d.num_differing, d.max_abs_diff) for d in found] == [("w", 1, 0.0)]
    assert "signed zeros" in str(found[0])
    nan = [("w", np.array([np.nan, 2.0], np.float32))]
    assert bitwise_diff(nan, [("w", nan[0][1].copy())]) == []
    assert not np.array_equal(nan[0][1], nan[0][1])


def test_assert_bitwise_equal_names_first_difference_and_max():
    ref = [("a", np.zeros(3, np.float32)), ("b", np.zeros((2, 2), np.float32)), ("c", np.ones(2, np.float32))]
    cand = [("a", np.zeros(3, np.float32)), ("b", np.array([[0, 0], [0, 0.5]], np.float32)),
            ("c", np.array([1, 3], np.float32))]
    with pytest.raises(AssertionError, match=r"2 of 3 entries differ, first 'b', max \|diff\| 2:") as info:
        assert_bitwise_equal(ref, cand, "run")
    assert "b: max |diff| = 0.5 (1 of 4 elements differ; largest at index (1, 1))" in str(info.value)
    with pytest.raises(AssertionError, match="dtype/shape"):
        assert_bitwise_equal(ref, [ref[0], ("b", np.zeros(4, np.float32)), ref[2]])
    with pytest.raises(AssertionError, match="3 vs 2 entries"):
        assert_bitwise_equal(ref, ref[:2])
    assert_bitwise_equal(ref, [(n, v.copy()) for n, v in ref])


@pytest.mark.parametrize(
    "name", [n if not n.startswith("bert") else pytest.param(n, marks=pytest.mark.slow) for n in sorted(MODEL_BUILDERS)])
def test_zoo_models_are_deterministic_and_train(name):
    """Same seed -> same bytes; another seed -> other weights; the kit's step changes weights and optimizer state."""
    import keras
    import tensorflow as tf
    a, b, c = build_model(name, seed=5), build_model(name, seed=5), build_model(name, seed=6)
    assert_bitwise_equal(snapshot(a), snapshot(b), f"{name} built twice from one seed")
    assert bitwise_diff(snapshot(a), snapshot(c)), f"{name}: seeds 5 and 6 gave the same weights"
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(a.trainable_variables)
    before = snapshot(a, optimizer)
    step = tf.function(make_train_step(a, optimizer))
    for x, y in make_batches(a, batch_size=3, steps=1, seed=0):
        loss = step(tf.constant(x), tf.constant(y))
    assert np.isfinite(loss.numpy())
    changed = {line.split(":")[0] for line in bitwise_diff(before, snapshot(a, optimizer))}
    assert changed >= {v.path for v in a.trainable_variables}, f"{name}: untrained weights {sorted(changed)}"


def test_bert_batches_are_padded():
    model = build_model("bert", seed=0)
    (x, y), = make_batches(model, batch_size=8, steps=1, seed=2)
    assert x.dtype == np.int32 and x.shape == (8, 12) and y.shape == (8,)
    assert (x[:, 0] > 0).all() and (x == 0).any(), "rows start with a token and some are padded"
    assert ((x[:, 1:] > 0) <= (x[:, :-1] > 0)).all(), "padding only at the end"
