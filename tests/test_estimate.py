"""`tflms estimate` / tflms.estimate.estimate: will it fit, with and without tflms (issue 48, item 2)."""

import json

import pytest

PROFILE = "v100-16gb-pcie3"
#: Past the unchanged step's largest batch on the profile (4398) and within tflms's (7623, judged in the enforced order
#: as the pipeline tunes): simulated figures, with the default 5% margin on the profile's memory (tflms/budget.py).
BATCH = 5000


def _model(compiled: bool = True):
    import keras
    keras.utils.set_random_seed(0)
    i = keras.Input((64, 64, 3))
    h = i
    for f in (32, 64, 64):
        h = keras.layers.Conv2D(f, 3, padding="same", activation="relu")(h)
    model = keras.Model(i, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)), name="three_convs")
    if compiled:
        model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_batch_that_does_not_fit_unchanged_fits_with_tflms():
    from tflms.estimate import estimate
    e = estimate(_model(), batch_size=BATCH, profile=PROFILE)
    assert e.profile == PROFILE and e.budget_bytes == 16 * 2**30
    assert not e.fits_without and e.peak_bytes_without > e.budget_bytes
    assert e.fits_with and e.peak_bytes_with <= e.budget_bytes < e.peak_bytes_without
    assert e.step_time_s_with >= e.step_time_s_without and e.strategy
    assert e.max_batch_without < BATCH <= e.max_batch_with
    assert e.assumed == ()
    # one batch below the unchanged step's largest fits either way, with nothing to do
    below = estimate(_model(), batch_size=e.max_batch_without, profile=PROFILE, search_max_batch=False)
    assert below.fits_without and below.peak_bytes_with == below.peak_bytes_without and below.strategy is None
    assert below.max_batch_without is None
    assert "three_convs at batch" in e.table() and "simulated" in e.table()


def test_the_command_prints_one_json_object_from_a_keras_file(tmp_path, capsys):
    from tflms.cli import main
    path = str(tmp_path / "model.keras")
    _model().save(path)
    assert main(["estimate", path, "--batch", str(BATCH), "--profile", PROFILE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits_without"] is False and out["fits_with"] is True
    assert out["max_batch_without"] < BATCH <= out["max_batch_with"]
    assert out["peak_bytes_without"] > out["budget_bytes"] >= out["peak_bytes_with"] and out["simulated"] is True


def test_what_the_model_does_not_say_is_assumed_and_said():
    from tflms.estimate import estimate
    e = estimate(_model(compiled=False), batch_size=8, profile=PROFILE, search_max_batch=False)
    assert any("Adam" in a for a in e.assumed) and any("cross-entropy" in a for a in e.assumed)
    assert "assumed:" in e.table()


def test_bad_input_names_the_file_and_the_value(tmp_path, capsys):
    from tflms.cli import main
    from tflms.errors import ConfigError
    from tflms.estimate import estimate
    missing = str(tmp_path / "nope.keras")
    assert main(["estimate", missing, "--batch", "8"]) == 2
    assert "nope.keras: no such file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="batch_size must be a positive int, got 0"):
        estimate(_model(), batch_size=0)


def _step(model):
    """The model's training step as a tf.function with an unknown batch dimension (what estimate() traces itself)."""
    import keras
    import tensorflow as tf

    from tflms.testing.steps import make_train_step
    optimizer, loss = keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)
    signature = [tf.TensorSpec((None, 64, 64, 3), tf.float32), tf.TensorSpec((None,), tf.int32)]
    return tf.function(make_train_step(model, optimizer, loss), input_signature=signature), optimizer


def test_a_tf_function_step_and_a_saved_model_estimate_as_the_keras_model_does(tmp_path, capsys):
    import tensorflow as tf

    from tflms.cli import main
    from tflms.estimate import estimate
    keras_estimate = estimate(_model(), batch_size=BATCH, profile=PROFILE, search_max_batch=False)
    model = _model(compiled=False)
    step, optimizer = _step(model)
    for given in (step, step.get_concrete_function()):
        e = estimate(given, batch_size=BATCH, profile=PROFILE, search_max_batch=False)
        assert (e.peak_bytes_without, e.peak_bytes_with) == (keras_estimate.peak_bytes_without,
                                                             keras_estimate.peak_bytes_with)
        assert not e.fits_without and e.fits_with
    module = tf.Module()
    module.model, module.optimizer, module.train_step = model, optimizer, step
    module.forward = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec((None, 64, 64, 3), tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    saved = estimate(str(tmp_path / "saved"), batch_size=BATCH, profile=PROFILE, search_max_batch=False)
    assert saved.model.endswith(":train_step")  # the function that computes gradients, not the forward pass
    assert (saved.peak_bytes_without, saved.fits_with) == (keras_estimate.peak_bytes_without, True)
    assert main(["estimate", str(tmp_path / "saved"), "--function", "forward", "--batch", "8", "--profile", PROFILE,
                 "--no-max-batch"]) == 2
    assert "no function of the SavedModel" in capsys.readouterr().err


def test_a_step_traced_for_one_batch_or_without_a_signature_is_refused():
    import tensorflow as tf

    from tflms.estimate import EstimateError, estimate
    model = _model(compiled=False)
    step, _optimizer = _step(model)
    fixed = step.get_concrete_function()
    with pytest.raises(EstimateError, match="has no input_signature"):
        estimate(tf.function(lambda x: x), batch_size=8, profile=PROFILE)
    traced_at_8 = tf.function(step.python_function).get_concrete_function(
        tf.TensorSpec((8, 64, 64, 3), tf.float32), tf.TensorSpec((8,), tf.int32))
    with pytest.raises(EstimateError, match="traced for batch 8, not 16"):
        estimate(traced_at_8, batch_size=16, profile=PROFILE, search_max_batch=False)
    assert fixed is not None


def test_a_range_of_batches_is_traced_once_and_printed_as_a_json_list(tmp_path, capsys):
    from tflms.cli import main
    path = str(tmp_path / "model.keras")
    _model().save(path)
    assert main(["estimate", path, "--batch", f"8,{BATCH}", "--profile", PROFILE, "--json"]) == 0
    small, large = json.loads(capsys.readouterr().out)
    assert (small["batch_size"], large["batch_size"]) == (8, BATCH)
    assert small["fits_without"] and not large["fits_without"] and large["fits_with"]
    assert small["max_batch_with"] == large["max_batch_with"] and small["max_batch_without"] < BATCH
    assert small["peak_bytes_without"] < large["peak_bytes_without"]
    assert main(["estimate", path, "--batch", "8,x", "--profile", PROFILE]) == 2
    assert "--batch takes whole numbers separated by commas, got '8,x'" in capsys.readouterr().err
