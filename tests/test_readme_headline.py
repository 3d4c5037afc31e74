"""The README's headline table says what docs/results.json (tools/bench.py --full) says (issue 29)."""

import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = {"ResNet-50": "resnet50", "DenseNet-121": "densenet121", "BERT-base": "bert-base", "VGG-16": "vgg16",
          "3D U-Net (volume, batch 1)": "unet3d"}
PROFILES = ("v100-16gb-pcie3", "v100-16gb-nvlink2")


def _size(record: dict) -> float:
    return record["max_voxels"] or record["max_batch"]


def _label(record: dict) -> str:
    shape = record["max_shape"]
    if not shape:
        return str(record["max_batch"])
    return f"{shape[0]}^3" if len(set(shape)) == 1 else "x".join(map(str, shape))


def expected_rows() -> dict[str, list[str]]:
    records = {(r["model"], r["profile"], r["method"]): r for r in json.loads((ROOT / "docs/results.json").read_text())}
    rows = {}
    for title, model in MODELS.items():
        cells = [_label(records[(model, PROFILES[0], "none")])]
        for profile in PROFILES:
            best, none = records[(model, profile, "tflms-best")], records[(model, profile, "none")]
            ratio = _size(best) / _size(none)
            throughput = (_size(best) / best["step_ms_at_max"]) / (_size(none) / none["step_ms_at_max"])
            cells += [f"{_label(best)} ({ratio:.2f}x)", f"{throughput:.2f}x"]
        rows[title] = cells
    return rows


def readme_rows() -> dict[str, list[str]]:
    text = (ROOT / "README.md").read_text().split("<!-- headline: docs/results.json -->", 1)[1]
    rows = {}
    for line in text.strip().splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_headline_table_is_the_benchmarks_json():
    assert readme_rows() == expected_rows()


def test_headline_is_labelled_simulated_and_points_at_how_it_was_made():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What it buys (simulated)", 1)[1].split("\n## ", 1)[0]
    assert "**Simulated**" in section and "docs/results.md" in section and "tools/bench.py --full" in section
    plot = re.search(r"!\[[^\]]+\]\((docs/plots/[^)]+\.png)\)", section)
    assert plot and (ROOT / plot.group(1)).is_file()
    assert readme.index("<!-- demo-command -->") < readme.index("<!-- test-command -->") < readme.index(
        "## What it buys")  # the two commands come first
