"""tools/bench_rewrite.py: no crash when nothing is selected, and a tune that cannot fit is a row, not a traceback."""

from __future__ import annotations

import pytest

from tflms.sim import HardwareProfile
from tflms.testing import mlp_training_graph


@pytest.fixture()
def bench(load_tool):
    return load_tool("bench_rewrite")


def test_no_graph_selected_prints_an_empty_table_and_says_why(bench, capsys):
    assert bench.main(["--quick", "--max-ops", "100", "--no-tune"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split()[:2] == ["graph", "ops"]  # the header, no rows
    assert "no graph to measure" in err and "--max-ops 100" in err


def test_format_table_of_no_records_is_the_header(bench):
    lines = bench.format_table([]).splitlines()
    assert len(lines) == 2 and lines[0].startswith("graph")


def test_unreachable_budget_on_a_step_that_fits_the_card_tunes_at_the_card(bench, monkeypatch):
    graph = mlp_training_graph(3)
    monkeypatch.setattr(bench, "tune_budget", lambda g: 1)  # 1 byte: nothing fits
    record = bench.time_tune(graph)
    assert record["tune_strategy"] == "none" and record["tune_swaps"] == 0
    assert record["tune_budget_bytes"] == 16 * 2**30  # the profile's memory
    assert "nothing fits" in record["tune_error"]


def test_unreachable_budget_on_a_step_larger_than_the_card_is_a_row(bench, monkeypatch):
    tiny = HardwareProfile("tiny-card", 4096, 14e12, 900, 15.75)
    monkeypatch.setattr(bench, "TUNE_PROFILE", tiny)
    record = bench.time_tune(mlp_training_graph(3))
    assert record["tune_strategy"] is None and record["tune_swaps"] is None
    assert record["tune_budget_bytes"] == 4096
    assert "nothing fits the budget" in record["tune_error"]
    assert bench._tuned(record) == "nothing fits 4.00 KiB"


def test_the_resnet_target_is_skipped_when_the_tune_needed_no_swapping(bench):
    def record(tune):
        return bench.Record(graph="resnet50-b2-sgd", kind="keras", ops=10, levels=3, swapped=0,
                            timings_s={"analyze": 0.1, "plan": 0.0, "apply": 0.0}, gc_s=0.0, gc_collections={},
                            cpu_s=0.1, tune=tune)

    tuned = {"tune_s": 1.0, "tune_cpu_s": 1.0, "tune_error": None}
    fallback = {**tuned, "tune_error": "nothing fits 0.38 GiB; tuned at the profile's memory instead"}
    target = [c for c in bench.evaluate([record(tuned)])[1] if "ResNet-50" in c.name][0]
    assert target.status == "PASS" and "10.0x" in target.detail
    target = [c for c in bench.evaluate([record(fallback)])[1] if "ResNet-50" in c.name][0]
    assert target.status == "SKIP" and "nothing fits 0.38 GiB" in target.detail


def test_the_tune_is_timed_as_the_rewrite_is_the_fastest_of_its_runs(bench, monkeypatch):
    """``--repeat`` runs of the tune, the fastest kept (as the rewrite's), every run's time in ``tune_s_runs``; a
    tune that chose another plan on a later run is an error, not a figure."""
    import types

    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(bench, "tune_budget", lambda graph: 1 << 30)
    best = types.SimpleNamespace(params={"kept": 1}, sim=types.SimpleNamespace(step_time_s=0.5,
                                                                               peak_with_margin_bytes=7),
                                 plan=None, order=None)
    result = types.SimpleNamespace(strategy="recompute", best=best, candidates=[best])
    import tflms.tune
    monkeypatch.setattr(tflms.tune, "tune", lambda graph, **kwargs: result)
    record = bench.time_tune([], repeat=3)
    assert record["tune_s_runs"] == [3.0, 1.0, 2.0] and record["tune_s"] == 1.0
    assert record["tune_strategy"] == "recompute" and record["tune_params"] == {"kept": 1}
    others = iter([result, types.SimpleNamespace(strategy="swap", best=best, candidates=[best])])
    monkeypatch.setattr(tflms.tune, "tune", lambda graph, **kwargs: next(others))
    clock = iter(range(100))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    with pytest.raises(RuntimeError, match="not deterministic"):
        bench.time_tune([], repeat=2)
