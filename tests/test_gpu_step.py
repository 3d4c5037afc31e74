"""tools/gpu_step.py without a GPU: its tables, its JSON checks and its refusals (the measuring needs PyTorch and a
GPU; it ran on the lent H100, docs/profiles/h100-80gb-hbm3-bert-step.json)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_step  # noqa: E402


def test_the_committed_measurement_is_the_bench_model_and_has_every_figure():
    result = json.loads((ROOT / "docs/profiles/h100-80gb-hbm3-bert-step.json").read_text())
    assert result["model"] == gpu_step.BERT
    assert result["device"]["name"] == "NVIDIA H100 80GB HBM3"
    for row in result["rows"]:
        assert row["dtype"] in gpu_step.BENCH_MODELS and "error" not in row
        assert row["plain_s"] < row["checkpointed_s"] and row["checkpointed_peak_bytes"] < row["plain_peak_bytes"]
    for dtype in gpu_step.DTYPES:
        # The two largest batches keep the GPU busy (the step time grows with the batch: at batch 8 PyTorch's
        # launches and checkpoint hooks set it), and there checkpointing adds about one forward pass.
        mid, big = sorted((r for r in result["rows"] if r["dtype"] == dtype), key=lambda r: r["batch"])[-2:]
        assert big["plain_s"] / mid["plain_s"] == pytest.approx(big["batch"] / mid["batch"], rel=0.2)
        for row in (mid, big):
            assert row["checkpointed_s"] - row["plain_s"] == pytest.approx(row["forward_s"], rel=0.1)


def test_the_comparison_table_gives_each_ratio():
    row = {"dtype": "float32", "batch": 32, "plain_s": 0.100, "checkpointed_s": 0.130, "forward_s": 0.033,
           "plain_peak_bytes": 21 * 2**30, "sim_plain_s": 0.150, "sim_checkpointed_s": 0.200,
           "sim_plain_peak_bytes": 14 * 2**30, "sim_contractions_s": 0.080}
    text = gpu_step.compare_table([row])
    assert "| float32 | 32 | 100.0 / 150.0 ms (1.50) | 130.0 / 200.0 ms (1.54) | +30.0% / +33.3% | 0.33 |" in text
    assert "21.00 / 14.00 GiB | 0.80 |" in text


def test_a_row_that_ran_out_of_memory_is_shown_and_not_simulated(capsys):
    result = {"date": "2026-11-27", "device": {"name": "NVIDIA H100 80GB HBM3", "library": "torch"},
              "rows": [{"dtype": "bfloat16", "batch": 512, "error": "out of memory: CUDA out of memory"}]}
    assert "| bfloat16 | 512 | out of memory: CUDA out of memory |" in gpu_step.measured_table(result)
    assert gpu_step.simulate_rows({**result, "model": gpu_step.BERT}) == []


def test_compare_refuses_another_model_and_an_unreadable_file(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model": {**gpu_step.BERT, "layers": 2}, "device": {"name": "x"}, "rows": []}))
    with pytest.raises(SystemExit, match="not the bench's BERT-base"):
        gpu_step.main(["--compare", str(other)])
    with pytest.raises(SystemExit, match="cannot read .*missing.json"):
        gpu_step.main(["--compare", str(tmp_path / "missing.json")])
