"""The README's headline table says what the runs of tools/bench.py --full it names say (issue 29): docs/results.json,
and the later runs of some models on some profiles that replace its records for them."""

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


def headline_sources() -> list[str]:
    """The JSON runs the README's headline marker names, oldest first: ``<!-- headline: A, B -->``."""
    marker = re.search(r"<!-- headline: ([^>]+?) -->", (ROOT / "README.md").read_text())
    assert marker, "README.md has no <!-- headline: ... --> marker"
    return [name.strip() for name in marker.group(1).split(",")]


def expected_rows() -> dict[str, list[str]]:
    """The headline from the named runs: a later run's records for a model on a profile replace an earlier's."""
    records = {}
    for source in headline_sources():
        run = json.loads((ROOT / source).read_text())
        for key in {(r["model"], r["profile"]) for r in run}:
            records = {k: v for k, v in records.items() if k[:2] != key}
        records.update({(r["model"], r["profile"], r["method"]): r for r in run})
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


def readme_rows(marker: str = "headline") -> dict[str, list[str]]:
    """The rows of the README's table after ``<!-- MARKER: ... -->``, by their first cell."""
    text = re.split(rf"<!-- {marker}: [^>]+ -->", (ROOT / "README.md").read_text(), maxsplit=1)[1]
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


#: The GPU headline (issues 46 and 47): today's GPUs, the unchanged step as XLA compiles it (what a Keras 3 user runs on
#: a GPU by default); tflms keeping XLA in clusters (tools/bench.py --xla-targets: ``tflms-xla``, what the callback does
#: there), and tflms without XLA (tools/bench.py --clock xla: ``tflms-best``), each against the unchanged step of its
#: own run.
GPU_MODELS = {"ResNet-50 (float32)": "resnet50", "ResNet-50 (mixed_bfloat16)": "resnet50-amp-bf16",
              "BERT-base (float32)": "bert-base", "BERT-base (mixed_bfloat16)": "bert-base-amp-bf16"}
GPU_PROFILES = {"H100 PCIe": "h100-80gb-pcie5", "H200": "h200-141gb"}


def gpu_sources() -> tuple[str, str]:
    """The two runs the GPU headline's marker names: ``<!-- headline-gpus: XLA-KEPT, WITHOUT-XLA -->``."""
    marker = re.search(r"<!-- headline-gpus: ([^>]+?) -->", (ROOT / "README.md").read_text())
    assert marker, "README.md has no <!-- headline-gpus: ... --> marker"
    kept, without = (name.strip() for name in marker.group(1).split(","))
    return kept, without


def gpu_expected_rows() -> dict[str, list[str]]:
    kept_source, without_source = gpu_sources()
    kept = {(r["model"], r["profile"]): r for r in json.loads((ROOT / kept_source).read_text())}
    without = {(r["model"], r["profile"], r["method"]): r for r in json.loads((ROOT / without_source).read_text())}
    rows = {}
    for title, model in GPU_MODELS.items():
        for gpu, profile in GPU_PROFILES.items():
            run = kept[(model, profile)]
            none, xla = run["maxima"]["none"], run["tflms_xla_at_its_max"]
            assert run["simulated"] and xla["clock"] == "xla-clusters", "tflms-xla must be priced by its clusters"
            best, plain = without[(model, profile, "tflms-best")], without[(model, profile, "none")]
            assert plain["clock"] == "xla" and best["clock"] == "graph", \
                "that run must price none by XLA, tflms without"
            throughput = (_size(best) / best["step_ms_at_max"]) / (_size(plain) / plain["step_ms_at_max"])
            rows[f"{title}, {gpu}"] = [
                str(none), f"{xla['batch']} ({xla['batch'] / none:.2f}x)",
                f"{xla['samples_per_s'] / run['none_at_max']['samples_per_s']:.2f}x",
                f"{_label(best)} ({_size(best) / _size(plain):.2f}x)", f"{throughput:.2f}x"]
    return rows


def test_the_gpu_headline_table_is_the_xla_benchmarks_json():
    assert readme_rows("headline-gpus") == gpu_expected_rows()
    readme = (ROOT / "README.md").read_text()
    assert readme.index("<!-- headline-gpus:") < readme.index("<!-- headline:")  # today's GPUs lead, V100 below


def _agrees(shown: str, value: float) -> bool:
    """Whether ``shown`` ("+34.8%", "0.499x") is ``value`` (a fraction, or a ratio for "x") to its own decimals."""
    number = re.fullmatch(r"\*{0,2}([+-]?\d+(?:\.(\d+))?)(%|x)\*{0,2}", shown)
    assert number, f"not a figure: {shown!r}"
    decimals = len(number.group(2) or "")
    scale = 100 if number.group(3) == "%" else 1
    return abs(float(number.group(1)) - value * scale) <= 0.5 * 10 ** -decimals + 1e-9


def test_the_readme_target_1_table_is_the_latest_at_records():
    """Issue 47's target 1 table in the README (at checkpointing's largest batch) says what the newest ``--at`` record of
    each cell in docs/results-gpus-xla-clusters-at.json says: both overheads and their ratio, of the step the pipeline
    runs, and "(not held)" exactly where the executor cannot be held to its budget."""
    records = json.loads((ROOT / "docs" / "results-gpus-xla-clusters-at.json").read_text())
    newest = {(r["model"], r["profile"], r["batch"]): r for r in records if "batch" in r}  # in time order
    text = (ROOT / "README.md").read_text().split("| model, GPU | checkpointing's largest batch |", 1)[1]
    lines = text.splitlines()[2:]
    rows = lines[:next((k for k, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    assert len(rows) == 8
    for line in rows:
        title, batch, checkpointing, kept, ratio = (c.strip() for c in line.strip().strip("|").split("|"))
        model = GPU_MODELS[title.split(", ")[0]]
        record = newest[(model, GPU_PROFILES[title.split(", ")[1]], int(batch))]
        not_held = record["tflms-xla"].get("guarantee") == "not-guaranteed"
        assert ratio.endswith(" (not held)") == not_held, (line, record["tflms-xla"].get("guarantee"))
        ratio = ratio.removesuffix(" (not held)")
        ck, xla = record["checkpoint"]["overhead"], record["tflms-xla"]["overhead"]
        assert _agrees(checkpointing, ck) and _agrees(kept, xla) and _agrees(ratio, xla / ck), (line, ck, xla)
        assert xla <= ck / 2 or "**" not in ratio, f"{title}: shown as met, but {xla:.4f} > {ck:.4f} / 2"
