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


def test_the_hybrid_path_swaps_clones_in_the_pinned_order_and_trains_bitwise(zoo, monkeypatch):
    """function_hybrid (issue 27) on the kit's residual_bn in place of a keras.applications model (seconds, not
    minutes): every recomputable op recomputed, the order pinned, clones among the swaps, and what TensorFlow ran
    trains bit for bit like the plain tf.function loop, every clone and every swapped clone's swap-out in it."""
    from tflms.testing.models import residual_bn
    monkeypatch.setattr(zoo, "_build", lambda name: residual_bn(seed=1, size=32, classes=zoo.CLASSES))
    monkeypatch.setattr(zoo, "BATCH", 2)
    result = zoo.run_worker("residual_bn", ("function_ctl", "function_hybrid"))
    assert result["paths"]["function_ctl"]["identical"], "plain tf.function twice (the control)"
    hybrid = result["paths"]["function_hybrid"]
    assert "error" not in hybrid, hybrid.get("error")
    assert hybrid["identical"], hybrid["first_difference"]
    assert hybrid["recomputed"] > 0 and hybrid["clones_ran"] == hybrid["cloned"] > 0
    assert hybrid["order_edges"] > 0  # two residual blocks: the order pass has branches to order
    assert 0 < hybrid["clones_swapped"] < hybrid["swaps"] == hybrid["swapped"]
    assert hybrid["clone_swapouts_ran"] == hybrid["clones_swapped"] and hybrid["swap_ops_missing"] == 0
    assert hybrid["op_changes"] == {}  # the user's op types, clones and swap ops aside
    cell = zoo._cell(hybrid)
    assert cell.startswith("same (") and f"{hybrid['clones_swapped']} of clones" in cell
    assert zoo._op_changes_of(result) == "function_hybrid: none"
    assert "function_hybrid" in zoo.PATHS and "function_hybrid" not in zoo.QUICK_PATHS


def test_a_fit_cell_counts_the_plain_steps_accumulators(zoo):
    """Where grappler made gradient accumulators in the plain step, the cell says so: only then does the comparison
    test the order of their AssignAdds (ResNet50 at 224 on some machines, docs/zoo.md)."""
    entry = {"identical": True, "max_abs_diff": 0.0, "swapped": 468, "swap_ops_missing": 0, "plain_accumulators": 1}
    assert zoo._cell(entry) == "same (1 accumulator)"
    assert zoo._cell({**entry, "identical": False, "max_abs_diff": 6.2, "plain_accumulators": 3}) == \
        "DIFF 6.2e+00 (3 accumulators)"
    assert zoo._cell({**entry, "plain_accumulators": 0}) == "same"
