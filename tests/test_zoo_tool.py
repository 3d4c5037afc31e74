"""tools/zoo.py: which input sides each keras.applications family runs at (issue 30: at more than its minimum)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def zoo(load_tool):
    return load_tool("zoo")


def test_every_family_runs_at_its_minimum_and_at_96_by_default(zoo):
    sides = zoo._parse_inputs(",".join(zoo.DEFAULT_INPUTS))
    assert zoo.input_sides("ResNet50", sides) == [32, 96]
    assert zoo.input_sides("InceptionV3", sides) == [75, 96]
    assert all(96 in zoo.input_sides(name, sides) for name in zoo.FAMILIES)


def test_sides_below_a_minimum_are_raised_to_it_once(zoo):
    assert zoo.input_sides("Xception", zoo._parse_inputs("min,32,71,224")) == [71, 224]
    assert zoo.input_sides("ResNet50", zoo._parse_inputs("224")) == [224]


@pytest.mark.parametrize("text, message", [("96,abc", "'abc' is not an input side"), ("0", "'0' is not"),
                                           (" , ", "at least one input side")])
def test_a_bad_input_side_is_refused_by_name(zoo, text, message, capsys):
    with pytest.raises(ValueError, match=message):
        zoo._parse_inputs(text)
    with pytest.raises(SystemExit):
        zoo.main(["--models", "ResNet50", "--input", text])
    assert message.split(" is")[0].split(" input")[0] in capsys.readouterr().err


def test_batch_reaches_the_workers_and_a_bad_one_is_refused(zoo, monkeypatch, capsys):
    """--batch goes through the environment, which every worker process reads at import (fit_recompute needs a
    batch whose activations outweigh the weights)."""
    import os
    monkeypatch.setattr(zoo, "BATCH", zoo.BATCH)
    monkeypatch.setenv(zoo.ENV_BATCH, "2")  # (restored after the test: main sets it)
    with pytest.raises(SystemExit):
        zoo.main(["--batch", "0", "--models", "ResNet50"])
    assert "--batch must be positive, got 0" in capsys.readouterr().err
    monkeypatch.setattr(zoo, "run_model", lambda name, paths, timeout_s, env=None: {
        "model": name, "input": 32, "paths": {}, "seconds": 0.0, "error": "not run"})
    zoo.main(["--batch", "16", "--models", "ResNet50", "--input", "32", "--paths", "fit_ctl,fit_recompute"])
    assert os.environ[zoo.ENV_BATCH] == "16" and zoo.BATCH == 16
    assert "fit_recompute" in zoo.PATHS
