"""tools/stall_report.py: the gaps in a compute stream, read exactly, and a run on the benchmark's tiny MLP."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture()
def tool(load_tool):
    return load_tool("stall_report")


def _op(name, stream, start, end):
    return SimpleNamespace(name=name, stream=stream, start_s=start, end_s=end)


def test_stalls_are_the_gaps_in_the_compute_stream_longest_first(tool):
    sim = SimpleNamespace(ops=[
        _op("a", "compute", 0.0, 1.0), _op("out", "d2h", 0.5, 2.5),
        _op("b", "compute", 2.5, 3.0),  # waited 1.5 s for the copy
        _op("c", "compute", 3.0, 3.5),  # back to back: no stall
        _op("in", "h2d", 3.0, 3.6), _op("d", "compute", 3.6, 4.0),  # 0.1 s
        _op("e", "compute", 4.00005, 4.1)])  # under MIN_STALL_S: noise
    found = tool.stalls(sim)
    assert [(s["before"], round(s["gap_s"], 6), s["at_s"]) for s in found] == [("b", 1.5, 1.0), ("d", 0.1, 3.5)]
    assert tool.link_busy_s(sim) == {"d2h": 2.0, "h2d": pytest.approx(0.6)}


def test_a_tuned_step_is_reported_beside_its_bounds(tool, capsys):
    assert tool.main(["--model", "mlp-tiny", "--size", "4096", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "mlp-tiny at 4096 on v100-16gb-pcie3 (simulated, 5% headroom)" in out
    assert "time/bound" in out and "compute waits" in out and "links busy" in out


def test_a_model_the_benchmark_does_not_have_is_refused(tool, capsys):
    with pytest.raises(SystemExit):
        tool.main(["--model", "resnet5O", "--size", "8"])
    assert "--model resnet5O: choose one of" in capsys.readouterr().err
