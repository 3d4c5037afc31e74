"""tools/segment_report.py: evenly spaced against balanced checkpoints on a bench model (simulated)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def report(load_tool):
    return load_tool("segment_report")


def test_every_checkpoint_choice_is_a_row_and_re_running_costs_time(report, capsys):
    assert report.main(["--point", "mlp-tiny:64", "--json"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)
    plans = [r["plan"] for r in rows]
    assert plans[0] == "none" and plans[-2:] == ["by bytes, slack 1", "by bytes, slack 1.5"]
    evenly = [r for r in rows if r["plan"].startswith("evenly spaced")]
    assert evenly[0]["plan"] == "evenly spaced, segments: 1" and len(evenly) == 3
    assert evenly[-1]["kept"] > evenly[0]["kept"]  # every articulation kept, against one
    for r in rows[1:]:
        assert r["step_s"] >= rows[0]["step_s"] and r["ordered_peak_bytes"] is not None


def test_a_bad_point_is_refused_by_name(report, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--point", "unet3d:3"])
    assert exit_info.value.code == 2
    assert "--point 'unet3d:3': give MODEL:BATCH" in capsys.readouterr().err
