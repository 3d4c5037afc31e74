"""tools/bench.py --curve: samples/s against batch size, every method, from none's maximum to the swap-only bound;
the keras-remat methods (a model built under keras.RematScope); the renamed segment-checkpointing method.

The tiny MLP (64 MiB budget) on the V100 PCIe profile, as in tests/test_bench_at.py: a search takes seconds.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import bench  # noqa: E402
from benchlib.common import BOUND, METHODS, TRACED_METHODS, method_name, read_records  # noqa: E402
from benchlib.curve import curve_batches  # noqa: E402
from benchlib.models import Steps, VariantError, error_line  # noqa: E402

PROFILE = "v100-16gb-pcie3"
BUDGET = 64 * 2**20
POINTS = 4


def test_curve_batches_are_even_from_end_to_end_without_repeats():
    assert curve_batches(100, 400, 4) == [100, 200, 300, 400]
    assert curve_batches(4544, 10800, 4) == [4544, 6629, 8715, 10800]
    assert curve_batches(10, 12, 6) == [10, 11, 12]  # rounded, repeats dropped
    assert curve_batches(0, 3, 2) == [1, 3]  # nothing fits unchanged: from batch 1
    assert curve_batches(7, 7) == [7] and curve_batches(7, 5) == [7]
    with pytest.raises(ValueError, match="at least 2 points"):
        curve_batches(1, 10, 1)


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory):
    """One search with --curve of the tiny MLP: its JSON records, the report and the plots folder."""
    out = tmp_path_factory.mktemp("curve")
    capture = out / "stdout.json"
    saved = sys.stdout
    with open(capture, "w") as f:
        sys.stdout = f
        try:
            assert bench.main(["--models", "mlp-tiny", "--profiles", PROFILE, "--curve", "--curve-points",
                               str(POINTS), "--json", "--results", str(out / "results.md"),
                               "--plots", str(out / "plots")]) == 0
        finally:
            sys.stdout = saved
    records = {r["method"]: r for r in json.loads(capture.read_text())}
    return records, (out / "results.md").read_text(), out / "plots"


def test_curve_has_a_point_only_where_a_method_fits_and_samples_per_s_is_batch_over_step(curve_run):
    records, _, _ = curve_run
    none, bound = records["none"], records[BOUND]
    batches = curve_batches(none["max_batch"], bound["max_batch"], POINTS)
    assert len(batches) == POINTS and batches[0] == none["max_batch"] and batches[-1] == bound["max_batch"]
    assert "curve" not in bound  # the bound is no method: it has a maximum, no step
    for method in METHODS:
        curve = records[method]["curve"]
        assert [p[0] for p in curve] == batches, method
        for batch, rate, step_ms in curve:
            assert (rate is None) == (step_ms is None), (method, batch)
            if rate is not None:
                assert rate == pytest.approx(batch / (step_ms / 1e3), rel=1e-3), (method, batch)

    # none: a point up to its maximum and none past it, each judged afresh by the simulator
    from tflms.sim import SimOptions, get_profile, simulate
    steps, options = Steps(), SimOptions(margin_fraction=0.05)
    for batch, rate, _ in none["curve"]:
        plain, _ = steps.graph("mlp-tiny", "plain", batch)
        fits = simulate(plain, get_profile(PROFILE), options=options).peak_with_margin_bytes <= BUDGET
        assert fits == (batch <= none["max_batch"]) == (rate is not None), batch
    # a traced method's points are where its own step's peak fits, again judged afresh
    for method in ("checkpoint-segments", "keras-remat-activations"):
        for batch, rate, step_ms in records[method]["curve"]:
            graph, _ = steps.graph("mlp-tiny", method, batch)
            sim = simulate(graph, get_profile(PROFILE), options=options)
            assert (sim.peak_with_margin_bytes <= BUDGET) == (rate is not None), (method, batch)
            if rate is not None:
                assert step_ms == pytest.approx(1e3 * sim.step_time_s, abs=1e-3), (method, batch)
    # tflms fits wherever the unchanged step does, with the same samples/s there (the tuner keeps the step), and
    # past none's maximum; keras-remat (mode "full") failed: no points at all
    best = records["tflms-best"]["curve"]
    assert best[0][1] == none["curve"][0][1] and best[1][1] is not None and none["curve"][1][1] is None
    assert records["keras-remat"]["error"] and all(p[1] is None for p in records["keras-remat"]["curve"])


def test_curve_is_in_the_report_with_its_plot(curve_run):
    records, report, plots = curve_run
    section = report.split("## Throughput curve", 1)[1].split("\n## ", 1)[0]
    assert "**predicted by the simulator**" in section
    assert f"### mlp-tiny on {PROFILE} (samples/s, simulated)" in section
    assert "| batch | " + " | ".join(METHODS) + " |" in section
    first = records["none"]["curve"][0]
    cells = [f"{records[m]['curve'][0][1]:.1f}" if records[m]["curve"][0][1] is not None else "-" for m in METHODS]
    cells[METHODS.index("keras-remat")] = "failed"
    assert f"| {first[0]} | " + " | ".join(cells) + " |" in section
    plot = plots / f"mlp-tiny_{PROFILE}_curve.png"
    assert plot.is_file() and plot.stat().st_size > 1000
    assert f"(plots/mlp-tiny_{PROFILE}_curve.png)" in section


def test_curve_needs_the_search_and_two_points(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--at", "mlp-tiny=8", "--curve"])
    assert "--curve runs from none's maximum" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--models", "mlp-tiny", "--curve", "--curve-points", "1", "--json"])
    assert "--curve-points: at least 2" in capsys.readouterr().err


def test_keras_remat_builds_the_model_under_rematscope_or_reports_the_error():
    """Mode "activations" traces a step of its own (the activations wrapped in tf.recompute_grad: more ops than the
    plain step, the same variables); mode "full" fails with the TF backend, and the failure is kept and re-raised
    without tracing again."""
    steps = Steps()
    plain, _ = steps.graph("mlp-tiny", "plain", 64)
    remat, _ = steps.graph("mlp-tiny", "keras-remat-activations", 64)
    assert len(remat) > len(plain)
    assert sum(op.type == "IdentityN" for op in remat.ops) > sum(op.type == "IdentityN" for op in plain.ops)
    with pytest.raises(VariantError) as first:
        steps.graph("mlp-tiny", "keras-remat", 64)
    assert first.value.line.startswith("ValueError: The custom_gradient decorator currently supports keywords")
    assert str(first.value) == f"mlp-tiny: the keras-remat step failed: {first.value.line}"
    traced = steps.trace_s
    with pytest.raises(VariantError) as again:
        steps.graph("mlp-tiny", "keras-remat", 128)
    assert again.value is first.value and steps.trace_s == traced
    with pytest.raises(ValueError, match="unknown variant 'recompute'"):
        steps.graph("mlp-tiny", "recompute", 64)  # the old name is no step any more
    assert set(TRACED_METHODS) < set(METHODS)


@pytest.mark.parametrize("message, line", [
    ("in user code:\n\n    File \"x.py\", line 3, in f  *\n        y = g()\n\n    ValueError: Exception encountered "
     "when calling Functional.call().\n    \n    \x1b[1mThe real reason.\nSecond line.\x1b[0m\n\n    Arguments",
     "ValueError: The real reason."),
    ("in user code:\n\n    File \"x.py\", line 3\n    shapes do not match\n", "ValueError: shapes do not match"),
    ("plain message\nmore", "ValueError: plain message"),
    ("", "ValueError: (no message)"),
])
def test_error_line_is_the_telling_line_of_a_tracing_error(message, line):
    assert error_line(ValueError(message)) == line


def test_earlier_runs_name_checkpoint_segments_recompute_and_readers_map_it(tmp_path):
    """docs/results.json (the last --full run) says "recompute"; read_records gives today's name, nothing else
    changed."""
    committed = json.loads((TOOLS.parent / "docs" / "results.json").read_text())
    assert any(r["method"] == "recompute" for r in committed)
    read = read_records(TOOLS.parent / "docs" / "results.json")
    assert len(read) == len(committed)
    for old, new in zip(committed, read):
        assert new == {**old, "method": method_name(old["method"])}
    assert {r["method"] for r in read} == {method_name(r["method"]) for r in committed}
    assert "recompute" not in {r["method"] for r in read} and "checkpoint-segments" in {r["method"] for r in read}
    assert method_name("recompute") == "checkpoint-segments" and method_name("tflms-best") == "tflms-best"
