"""tools/accumulator_race.py: its premise (three activations make grappler accumulators, two do not) and its input
checks. Whether plain TensorFlow races is what the tool measures; it is not asserted here (it depends on timing)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "accumulator_race.py"


@pytest.fixture()
def race(monkeypatch):
    spec = importlib.util.spec_from_file_location("accumulator_race_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_three_activations_make_two_accumulators_and_two_make_none(race):
    digest3, accumulators3 = race.train_once(("tanh", "sigmoid", "softplus"))
    digest2, accumulators2 = race.train_once(("tanh", "sigmoid"))
    assert (accumulators3, accumulators2) == (2, 0)
    assert digest3 != digest2 and len(digest3) == 12


def test_one_run_cannot_show_a_race(race, capsys):
    with pytest.raises(SystemExit):
        race.main(["--runs", "1"])
    assert "--runs 1: at least 2 runs" in capsys.readouterr().err
