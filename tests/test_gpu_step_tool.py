"""tools/gpu_step.py --whole-step without a GPU (issue 46 item 2): its pure parts (median, search, parsing), its
orchestration with the cell processes faked, and one real ``--dry-run`` (Keras on TensorFlow at tiny sizes, a
process per cell, the search against a fake memory limit). The measuring itself needs the lent GPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import whole_step  # noqa: E402
from whole_step import Runner, Settings, bisect_batches, search_largest  # noqa: E402


def test_median_is_in_milliseconds_and_batches_round_down_to_the_step():
    assert whole_step.median_ms([0.030, 0.010, 0.020]) == pytest.approx(20.0)
    assert whole_step.median_ms([0.010, 0.020]) == pytest.approx(15.0)
    with pytest.raises(ValueError):
        whole_step.median_ms([])
    assert [whole_step.round_batch(b, 32) for b in (1, 31, 32, 100, 1500.7)] == [32, 32, 32, 96, 1472]


def _oracle(limit, calls):
    def fits(batch):
        calls.append(batch)
        return batch <= limit
    return fits


def test_the_search_doubles_then_bisects_to_the_exact_boundary():
    calls = []
    found = search_largest(_oracle(100, calls), 8)
    assert found.largest == 100 and found.smallest_failure == 101
    assert calls[:6] == [8, 16, 32, 64, 128, 96]  # doubling until 128 fails, then halves of the gap
    assert [b for b, _ in found.tries] == calls and len(set(calls)) == len(calls)  # each batch once
    assert all(ok == (b <= 100) for b, ok in found.tries)


def test_the_search_goes_down_from_a_start_that_does_not_fit_and_reports_none_when_nothing_does():
    calls = []
    found = search_largest(_oracle(5, calls), 64)
    assert (found.largest, found.smallest_failure) == (5, 6) and calls[:4] == [64, 32, 16, 8]
    nothing = search_largest(_oracle(0, []), 4)
    assert (nothing.largest, nothing.smallest_failure) == (0, 1)
    assert [b for b, _ in nothing.tries] == [4, 2, 1]


def test_the_search_keeps_to_multiples_of_its_step_stops_at_its_tolerance_and_at_its_cap():
    found = search_largest(_oracle(1000, []), 256, step=32, tolerance=0.125)
    assert all(b % 32 == 0 for b, _ in found.tries)
    assert found.largest <= 1000 < found.smallest_failure
    assert found.smallest_failure - found.largest <= max(32, 0.125 * found.largest)
    assert found.largest > 1000 - 0.125 * 1000
    capped = search_largest(_oracle(10**9, []), 8, max_batch=100)
    assert (capped.largest, capped.smallest_failure) == (100, None) and capped.tries[-1] == (100, True)
    with pytest.raises(ValueError):
        search_largest(_oracle(1, []), 0)


def test_bisection_alone_narrows_the_gap_it_is_given():
    tries = []
    assert bisect_batches(_oracle(37, []), 32, 64, tries=tries) == (37, 38)
    assert [b for b, _ in tries] == [48, 40, 36, 38, 37]
    assert bisect_batches(_oracle(37, []), 32, 64, step=8) == (32, 40)
    assert bisect_batches(_oracle(37, []), 32, 64, tolerance=1.0) == (32, 64)  # already within 1x of 32


def test_the_start_is_predicted_from_the_two_largest_peaks():
    rows = [{"status": "ok", "batch": 128, "peak_bytes": 10 * 2**30},
            {"status": "ok", "batch": 256, "peak_bytes": 20 * 2**30},
            {"status": "oom", "batch": 512, "peak_bytes": None}]
    # 10 GiB per 128 samples; 0.9 x 100 GiB = 90 GiB is reached at batch 256 + 70 / 10 x 128 = 1152
    assert whole_step.predicted_start(rows, 100 * 2**30, 32) == 1152
    assert whole_step.predicted_start(rows[:1], 100 * 2**30, 32) is None
    assert whole_step.predicted_start(rows, None, 32) is None


def test_batches_are_given_per_model_or_per_dtype():
    parsed = whole_step.parse_batches(["resnet50=128,256", "bert-base:bfloat16="])
    assert parsed == {("resnet50", ""): (128, 256), ("bert-base", "bfloat16"): ()}
    settings = Settings(batches=parsed)
    assert settings.batches_of("resnet50", "bfloat16") == (128, 256)
    assert settings.batches_of("bert-base", "bfloat16") == ()
    assert settings.batches_of("bert-base", "float32") == (32, 64)
    assert Settings(dry_run=True).batches_of("bert-base", "float32") == (2, 4)
    for bad in ("vgg16=2", "resnet50", "resnet50:float16=2", "resnet50=a", "resnet50=0"):
        with pytest.raises(ValueError, match="--batch"):
            whole_step.parse_batches([bad])


def test_a_dead_cell_process_is_an_oom_when_its_output_says_so_else_an_error():
    oom = whole_step.failure_from_stderr("compiling\njaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: "
                                         "Out of memory while trying to allocate 123 bytes.\n", -6)
    assert oom["status"] == "oom" and oom["message"].startswith("jaxlib.xla_extension.XlaRuntimeError")
    err = whole_step.failure_from_stderr("Fatal Python error: Segmentation fault\n\n", -11)
    assert err == {"status": "error", "message": "exit status -11: Fatal Python error: Segmentation fault"}
    assert whole_step.failure_from_stderr("", 1)["message"] == "exit status 1: exit status 1, no output"


def test_a_cell_that_raises_writes_its_row(tmp_path, monkeypatch):
    out = tmp_path / "row.json"
    spec = {"framework": "keras"}

    def raising(message):
        def cell(_):
            raise RuntimeError(message)
        return cell

    monkeypatch.setattr(whole_step, "keras_cell", raising("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB\nmore"))
    whole_step.run_cell(spec, str(out))
    assert json.loads(out.read_text()) == {"status": "oom", "message": "RuntimeError: RESOURCE_EXHAUSTED: Out of "
                                                                      "memory allocating 9 GiB"}
    monkeypatch.setattr(whole_step, "keras_cell", raising("shapes do not match\ndetails"))
    whole_step.run_cell(spec, str(out))
    assert json.loads(out.read_text()) == {"status": "error", "message": "RuntimeError: shapes do not match"}


def test_files_are_named_by_the_device_as_docs_profiles_names_them():
    assert whole_step.default_output_name("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3-whole-step.json"
    assert whole_step.default_output_name("NVIDIA H200") == "h200-whole-step.json"


def test_the_bfloat16_model_is_the_bench_s_own_where_it_has_one():
    from benchlib.models import MODELS
    assert whole_step.bench_spec("bert-base", "bfloat16") is MODELS["bert-base-amp-bf16"]
    assert whole_step.bench_spec("resnet50", "float32") is MODELS["resnet50"]
    resnet = whole_step.bench_spec("resnet50", "bfloat16")
    assert resnet.dtype_policy == "mixed_bfloat16" and resnet.sized is not None


def test_the_bench_model_builders_import_no_tensorflow():
    """The GPU machine has no TensorFlow: importing benchlib.models and taking a sized build must not import it
    (the bench's input specs import it when called); where JAX is installed, the models are built too."""
    code = ("import sys, importlib.util; sys.modules['tensorflow'] = None\n"
            "from benchlib.models import MODELS\n"
            "builds = [MODELS['resnet50'].sized(side=32), MODELS['bert-base-amp-bf16'].sized(layers=1, hidden=64, "
            "heads=2, ffn=128, vocab=100, seq_len=16)]\n"
            "if importlib.util.find_spec('jax'):\n"
            "    import keras; assert keras.backend.backend() == 'jax'\n"
            "    print([b()[0].count_params() for b in builds])\n"
            "print('ok')\n")
    env = {**os.environ, "KERAS_BACKEND": "jax",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


# --- the orchestration, with each cell's process faked ------------------------------------------------------------

def _fake_runner(monkeypatch, tmp_path, settings, peak_per_sample=2**20, base=100 * 2**20):
    """A Runner whose cells are not processes: a cell's peak is ``base + batch * peak_per_sample``."""
    spawned = []

    def spawn(self, row, timeout):
        spawned.append((row["model"], row["dtype"], row["batch"], row["part"], row["extra_xla_flags"]))
        return {"status": "ok", "step_ms": float(row["batch"]), "steps_timed": 3, "first_step_s": 1.0,
                "peak_bytes": base + row["batch"] * peak_per_sample, "peak_source": "fake",
                "bytes_limit": 1000 * 2**20}

    monkeypatch.setattr(Runner, "_spawn", spawn)
    return Runner(settings, "gpu_step.py", lambda _: None), spawned


def test_the_search_runs_without_rematerialization_and_the_batches_beyond_it_with_xla_as_given(monkeypatch,
                                                                                                tmp_path):
    out = tmp_path / "run.json"
    settings = Settings(models=("resnet50",), frameworks=("keras",), dtypes=("float32",), dry_run=True,
                        keras_backend="tensorflow", batches={("resnet50", ""): (2, 4)}, search_step=1,
                        search_tolerance=0.0, memory_limit_bytes=150 * 2**20, output=str(out))
    runner, spawned = _fake_runner(monkeypatch, tmp_path, settings)
    runner.matrix("keras")
    runner.search()
    search = runner.result["search"]
    # peaks 100 MiB + 1 MiB per sample against 150 MiB: 50 fits, 51 does not
    assert search["status"] == "done" and (search["largest_fit"], search["smallest_failure"]) == (50, 51)
    assert search["start"] == 35  # 0.9 x 150 MiB = 135 MiB, on the line through the matrix's two peaks
    assert [b["batch"] for b in search["beyond"]] == [75, 100]
    assert all(b["status"] == "oom" for b in search["beyond"])
    flags = {part: {f for *_, p, f in spawned if p == part} for part in ("matrix", "search", "beyond")}
    assert flags == {"matrix": {""}, "search": {whole_step.NO_REMAT_FLAGS}, "beyond": {""}}
    written = json.loads(out.read_text())  # written after every cell
    assert written["search"] == search and len(written["cells"]) == len(spawned)
    over = [r for r in written["cells"] if r["status"] == "oom"]
    assert over and all(r["peak_bytes"] > 150 * 2**20 and "fake limit" in r["message"] for r in over)
    assert "Largest resnet50 float32 batch that fits" in whole_step.table(written)


def test_a_search_that_reaches_its_cap_runs_nothing_beyond_it(monkeypatch, tmp_path):
    settings = Settings(models=("bert-base",), frameworks=("keras",), dtypes=("float32",), dry_run=True,
                        keras_backend="tensorflow", batches={("bert-base", ""): (2,)}, search_model="bert-base",
                        search_step=1, search_max_batch=16)
    runner, _ = _fake_runner(monkeypatch, tmp_path, settings)
    runner.matrix("keras")
    runner.search()
    search = runner.result["search"]
    assert (search["largest_fit"], search["smallest_failure"], search["beyond"]) == (16, None, [])
    assert "16 fitted" in search["beyond_skipped"]


def test_resume_takes_measured_cells_and_a_deadline_skips_the_rest(monkeypatch, tmp_path):
    first = tmp_path / "first.json"
    settings = Settings(models=("bert-base",), frameworks=("keras", "torch"), dtypes=("float32",), dry_run=True,
                        keras_backend="tensorflow", batches={("bert-base", ""): (2, 4)}, output=str(first))
    runner, spawned = _fake_runner(monkeypatch, tmp_path, settings)
    runner.matrix("keras")
    runner.matrix("torch")
    no_torch = whole_step.importable("torch", "tensorflow") is not None
    assert len(spawned) == (2 if no_torch else 4)
    torch_status = {r["status"] for r in runner.result["cells"] if r["framework"] == "torch"}
    assert torch_status == ({"unavailable"} if no_torch else {"ok"})
    again = Settings(**{**settings.__dict__, "output": str(tmp_path / "second.json"), "resume": str(first),
                        "batches": {("bert-base", ""): (2, 4, 8)}, "deadline_s": 0.0})
    runner, spawned = _fake_runner(monkeypatch, tmp_path, again)
    runner.matrix("keras")
    cells = {r["batch"]: r for r in runner.result["cells"]}
    assert not spawned and cells[2]["reused"] and cells[4]["reused"] and cells[8]["status"] == "skipped"


def test_a_search_run_alone_starts_from_the_peaks_of_the_run_it_resumes(monkeypatch, tmp_path):
    first = tmp_path / "first.json"
    settings = Settings(models=("resnet50",), frameworks=("keras",), dtypes=("float32",), dry_run=True,
                        keras_backend="tensorflow", batches={("resnet50", ""): (2, 4)}, output=str(first),
                        search_step=1, memory_limit_bytes=150 * 2**20)
    runner, _ = _fake_runner(monkeypatch, tmp_path, settings)
    runner.matrix("keras")
    alone = Settings(**{**settings.__dict__, "output": None, "resume": str(first),
                        "batches": {("resnet50", ""): ()}})
    runner, spawned = _fake_runner(monkeypatch, tmp_path, alone)
    runner.search()
    assert runner.result["search"]["start"] == 35 and spawned[0][2] == 35


def test_the_table_shows_each_cell_and_the_search():
    result = {"device": {"name": "NVIDIA H200", "driver": "580"}, "date": "2026-11-28", "dry_run": False,
              "cells": [{"model": "resnet50", "framework": "keras", "backend": "jax", "dtype": "float32",
                         "batch": 256, "part": "matrix", "status": "ok", "step_ms": 80.25, "chained_step_ms": 78.0,
                         "peak_bytes": 30 * 2**30, "first_step_s": 41.0},
                        {"model": "resnet50", "framework": "torch", "backend": "torch", "dtype": "bfloat16",
                         "batch": 256, "part": "matrix", "status": "unavailable", "message": "torch not importable"}],
              "search": {"status": "stopped", "message": "batch 2048: error: timed out after 420 s"}}
    text = whole_step.table(result)
    assert "| resnet50 | keras (jax) | float32 | 256 | matrix | ok | 80.2 | 78.0 | 30 | 41.0 |" in text
    assert "| resnet50 | torch (torch) | bfloat16 | 256 | matrix | unavailable | torch not importable |" in text
    assert "Search stopped: batch 2048: error: timed out after 420 s" in text


# --- the real dry run ----------------------------------------------------------------------------------------------

#: TensorFlow's CPU allocator (TF_CPU_ALLOCATOR_USE_BFC=1) peaks at about 1.8 MB + 0.11 MB per sample for the
#: one-layer BERT (TensorFlow 2.21): batch 8 fits, 16 does not.
FAKE_LIMIT = 2_500_000


@pytest.mark.slow
def test_the_dry_run_measures_each_cell_in_its_own_process_and_searches_against_a_fake_limit(tmp_path):
    out = tmp_path / "dry.json"
    cmd = [sys.executable, str(ROOT / "tools" / "gpu_step.py"), "--dry-run", "--keras-backend", "tensorflow",
           "--batch", "resnet50=2", "--batch", "resnet50:bfloat16=", "--batch", "bert-base=2",
           "--search", "bert-base:float32", "--search-start", "8", "--search-tolerance", "0.5",
           "--search-xla-flags", "", "--memory-limit-bytes", str(FAKE_LIMIT), "--repeats", "3", "--warmup", "1",
           "-o", str(out)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["tool"], result["mode"], result["dry_run"]) == ("tools/gpu_step.py", "whole-step", True)
    assert result["date"] and result["device"]["name"] and result["device"]["driver"]
    assert result["versions"]["keras"] and result["settings"]["sizes"]["resnet50"] == {"side": 32}
    assert "| resnet50 | keras (tensorflow) | float32 | 2 | matrix | ok |" in done.stdout
    assert "[1] keras resnet50 float32 batch 2 ..." in done.stderr  # progress, cell by cell
    cells = result["cells"]
    assert {r["status"] for r in cells} <= set(whole_step.STATUSES)
    keras = {(r["model"], r["dtype"], r["batch"]): r for r in cells if r["framework"] == "keras"}
    for key in (("resnet50", "float32", 2), ("bert-base", "float32", 2), ("bert-base", "bfloat16", 2)):
        assert keras[key]["status"] == "ok", keras[key]
    for r in cells:
        if r["framework"] == "torch" and importlib_missing("torch"):
            assert r["status"] == "unavailable"
        if r["status"] == "ok" or r.get("peak_bytes"):
            assert r["step_ms"] > 0 and r["peak_bytes"] > 0 and r["steps_timed"] == 3 and r["wall_s"] > 0
    search = result["search"]
    assert search["status"] == "done" and search["start"] == 8
    tried = {t["batch"]: t["fits"] for t in search["tries"]}
    for batch, fits in tried.items():  # each try is a cell, judged by its measured peak against the fake limit
        row = keras[("bert-base", "float32", batch)]
        assert fits == (row["status"] == "ok") and (row["peak_bytes"] <= FAKE_LIMIT) == fits
    assert search["largest_fit"] == max(b for b, ok in tried.items() if ok)
    assert search["smallest_failure"] == min(b for b, ok in tried.items() if not ok) > search["largest_fit"]
    first_failure = next(i for i, t in enumerate(search["tries"]) if not t["fits"])
    assert first_failure < len(search["tries"]) - 1  # doubling found a failure, bisection tried between
    assert [b["batch"] for b in search["beyond"]] == [round(search["largest_fit"] * f) for f in (1.5, 2.0)]
    for b in search["beyond"]:
        row = keras[("bert-base", "float32", b["batch"])]
        assert b["status"] == row["status"] and (row["peak_bytes"] <= FAKE_LIMIT) == (row["status"] == "ok")


def importlib_missing(name):
    import importlib.util
    return importlib.util.find_spec(name) is None
