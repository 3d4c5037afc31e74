"""tools/time_floor.py: the any-order step-time floor at benchmark points, read from a bench run or given."""

from __future__ import annotations

import json

import pytest


@pytest.fixture()
def tool(load_tool):
    return load_tool("time_floor")


def test_points_are_parsed_with_volumes_and_refused_with_the_fix(tool):
    from benchlib import common  # on the path once the tool is loaded
    assert tool.parse_point("vgg16:432:v100-16gb-pcie3") == ("vgg16", 432, "v100-16gb-pcie3")
    assert tool.parse_point("unet3d:208^3:v100-16gb-nvlink2") == ("unet3d", common.unet_index((208, 208, 208)),
                                                                  "v100-16gb-nvlink2")
    assert tool.parse_point("unet3d:224x208x208:p")[1] == common.unet_index((224, 208, 208))
    with pytest.raises(ValueError, match="MODEL:SIZE:PROFILE"):
        tool.parse_point("vgg16:432")
    with pytest.raises(ValueError, match="unknown model 'resnet5O'"):
        tool.parse_point("resnet5O:8:v100-16gb-pcie3")
    with pytest.raises(ValueError, match="positive batch"):
        tool.parse_point("vgg16:0:v100-16gb-pcie3")


def test_the_tiny_mlp_under_its_need_has_a_floor_above_its_compute(tool, tmp_path, capsys):
    """mlp-tiny at batch 8192 needs more than its 64 MiB: some bytes must go out and back while little
    compute runs, so no order reaches the compute time."""
    bench = [{"model": "mlp-tiny", "profile": "v100-16gb-pcie3", "method": "tflms-best", "max_batch": 8192,
              "max_shape": None, "time_bound_ratio_at_max": 9.99, "step_ms_at_max": 1.0},
             {"model": "mlp-tiny", "profile": "v100-16gb-pcie3", "method": "none", "max_batch": 512}]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert tool.main(["--bench-json", str(path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["model"], row["size"], row["profile"], row["time_bound_ratio"]) == ("mlp-tiny", "8192",
                                                                                   "v100-16gb-pcie3", 9.99)
    assert row["floor_s"] > row["compute_s"] and row["floor"]["away_bytes"] > 0 and row["floor"]["op"]
    assert row["floor_over_bound"] == pytest.approx(row["floor_s"] / row["bound_s"]) and row["floor_over_bound"] >= 1
    assert tool.main(["--point", "mlp-tiny:8192:v100-16gb-pcie3"]) == 0
    out = capsys.readouterr().out
    assert "floor/bound" in out and "mlp-tiny" in out and "issue 11's target is 1.25" in out


def test_no_points_and_unreadable_runs_are_refused(tool, tmp_path, capsys):
    with pytest.raises(SystemExit):
        tool.main([])
    assert "--bench-json FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["--bench-json", str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(SystemExit):
        tool.main(["--bench-json", str(empty)])
    assert "no tflms-best maxima" in capsys.readouterr().err


def test_a_recompute_price_bounds_the_swaps_its_recompute_set_leaves(tool, capsys):
    """With --recompute, each price adds the floor of the step with the tuner's recompute set of that price in it:
    the clones add compute, and fewer bytes must leave the device."""
    assert tool.main(["--point", "mlp-tiny:8192:v100-16gb-pcie3", "--recompute", "1", "--json"]) == 0
    plain, priced = json.loads(capsys.readouterr().out)
    assert (plain["price"], plain["recomputed"]) == (None, 0)
    assert priced["price"] == 1.0 and priced["recomputed"] > 0
    assert priced["compute_s"] > plain["compute_s"]
    assert priced["floor"]["away_bytes"] < plain["floor"]["away_bytes"]
    assert tool.main(["--point", "mlp-tiny:8192:v100-16gb-pcie3", "--recompute", "1"]) == 0
    out = capsys.readouterr().out
    assert f"price 1: {priced['recomputed']} tensors" in out and "not every hybrid" in out
    for bad, said in (("cheap", "give prices as numbers"), ("0.05,0", "a positive number")):
        with pytest.raises(SystemExit):
            tool.main(["--point", "mlp-tiny:8192:v100-16gb-pcie3", "--recompute", bad])
        assert said in capsys.readouterr().err
