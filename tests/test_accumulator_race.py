"""tools/accumulator_race.py: its premise (three activations make grappler accumulators, two do not), the pins a
tflms run reports, and its input checks. Whether plain TensorFlow races is what the tool measures; it is not asserted
here (it depends on timing)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def race(load_tool):
    return load_tool("accumulator_race")


def test_three_activations_make_two_accumulators_and_two_make_none(race):
    three = race.train_once(("tanh", "sigmoid", "softplus"))
    two = race.train_once(("tanh", "sigmoid"))
    assert (three["accumulators"], two["accumulators"]) == (2, 0)
    assert three["digest"] != two["digest"] and len(three["digest"]) == 12


def test_with_tflms_the_run_reports_how_each_accumulator_was_pinned(race):
    out = race.train_once(("tanh", "sigmoid", "softplus"), lms=True)
    assert out["accumulators"] == 2 and len(out["pins"]) == 2, out
    assert {p["source"] for p in out["pins"]} == {"observed"}, out["pins"]
    static = race.train_once(("tanh", "sigmoid", "softplus"), lms=True, observe=False)
    assert {p["source"] for p in static["pins"]} == {"cpu-pool"}, static["pins"]
    assert all("--static-order" in p["why"] for p in static["pins"]), static["pins"]


def test_a_model_that_is_not_in_keras_applications_is_refused(race, capsys):
    with pytest.raises(SystemExit):
        race.main(["--model", "ResNet5O"])
    assert "--model ResNet5O: not a keras.applications model" in capsys.readouterr().err


def test_one_run_cannot_show_a_race(race, capsys):
    with pytest.raises(SystemExit):
        race.main(["--runs", "1"])
    assert "--runs 1: at least 2 runs" in capsys.readouterr().err
