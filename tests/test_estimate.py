"""`tflms estimate` / tflms.estimate.estimate: will it fit, with and without tflms (issue 48, item 2)."""

import json

import pytest

PROFILE = "v100-16gb-pcie3"
#: Past the unchanged step's largest batch on the profile (4398) and within tflms's (5121): simulated figures, with the
#: default 5% margin on the profile's memory (tflms/budget.py; 4618 and 5377 without it).
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
