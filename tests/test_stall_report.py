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


def test_waits_are_split_by_phase_with_the_links_busy_meanwhile(tool):
    sim = SimpleNamespace(ops=[
        _op("f1", "compute", 0.0, 1.0), _op("out", "d2h", 0.5, 2.0),
        _op("f2", "compute", 2.0, 3.0),  # waited 1 s, the d2h link busy throughout
        _op("in", "h2d", 3.5, 4.0), _op("b1", "compute", 4.0, 5.0),  # waited 1 s, h2d busy half of it
        _op("b2", "compute", 5.5, 6.0)])  # waited 0.5 s with both links idle
    phases = tool.waits_by_phase(sim, {"f1": "forward", "f2": "forward", "b1": "backward", "b2": "backward"})
    assert phases == {"backward": {"wait_s": 1.5, "d2h_busy_s": 0.0, "h2d_busy_s": 0.5},
                      "forward": {"wait_s": 1.0, "d2h_busy_s": 1.0, "h2d_busy_s": 0.0}}


def test_the_link_idle_between_copies_is_split_by_room_for_the_next_copy(tool):
    # live bytes: 10 until t=2, 4 from then on; the budget allows 12
    timeline = [(0.0, 10, 0), (2.0, 4, 0)]
    sim = SimpleNamespace(timeline=timeline, ops=[
        _op("a", "h2d", 0.0, 1.0),
        _op("b", "h2d", 1.5, 2.5),  # idle 0.5 s at 10 live bytes: b (1 byte) had room
        _op("c", "h2d", 3.0, 3.5),  # idle 0.5 s at 4: c (8 bytes) had room
        _op("d", "h2d", 4.5, 5.0),  # idle 1 s at 4: d (9 bytes) had none
        _op("e", "compute", 0.0, 6.0)])
    sizes, phases = {"b": 1, "c": 8, "d": 9}, {"e": "forward", "g": "backward"}
    assert tool.h2d_idle(sim, sizes, 12, phases) == {"forward": {"with_room_s": 1.0, "without_room_s": 1.0}}
    # a stretch that spans the drop counts its fullest instant: c arriving at 1.5 would have found 10 live bytes
    sim.ops[2] = _op("c", "h2d", 2.5, 3.5)
    sim.ops[1] = _op("b", "h2d", 1.0, 1.5)
    assert tool.h2d_idle(sim, sizes, 12, phases) == {"forward": {"with_room_s": 0.0, "without_room_s": 2.0}}
    # each stretch goes to the phase of the compute op last started when the link went idle
    sim.ops[4:] = [_op("e", "compute", 0.0, 3.5), _op("g", "compute", 3.5, 6.0)]
    assert tool.h2d_idle(sim, sizes, 12, phases) == {"backward": {"with_room_s": 0.0, "without_room_s": 1.0},
                                                     "forward": {"with_room_s": 0.0, "without_room_s": 1.0}}


def test_a_tuned_step_is_reported_beside_its_bounds(tool, capsys):
    assert tool.main(["--model", "mlp-tiny", "--size", "4096", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "mlp-tiny at 4096 on v100-16gb-pcie3 (simulated, 5% headroom)" in out
    assert "time/bound" in out and "compute waits" in out and "links busy" in out
    assert "compute waits by the waiting op's phase" in out and "host-to-device link idle between copies" in out


def test_a_model_the_benchmark_does_not_have_is_refused(tool, capsys):
    with pytest.raises(SystemExit):
        tool.main(["--model", "resnet5O", "--size", "8"])
    assert "--model resnet5O: choose one of" in capsys.readouterr().err
