"""tools/gpu_step.py --predict (issue 46, item 3): one whole step simulated in the xla or graph clock, as the JSON
object the GPU checks read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
sys.path.insert(0, TOOLS)

pytestmark = pytest.mark.slow  # traces ResNet-50 (about 10 s a trace)


def test_the_xla_step_is_faster_and_smaller_than_the_executors_and_above_its_contractions():
    from benchlib.models import Steps
    from benchlib.predict import predict
    steps = Steps()
    xla, graph = (predict(steps, "resnet50", "float32", 8, "h200-141gb", mode) for mode in ("xla", "graph"))
    assert xla["simulated"] and xla["mode"] == "xla" and graph["mode"] == "graph"
    # fusion: fewer kernels, a shorter step, fused intermediates never allocated
    assert xla["kernels"] < graph["kernels"] / 2
    assert xla["step_ms"] < graph["step_ms"]
    assert xla["peak_bytes"] <= graph["peak_bytes"]
    # the lower bounds shown beside them hold
    assert xla["contractions_ms"] < xla["step_ms"] and xla["resident_bytes"] < xla["peak_bytes"]
    assert xla["samples_per_s"] == pytest.approx(8 / (xla["step_ms"] / 1e3))


def test_predict_prints_one_json_object_and_refuses_what_it_cannot_predict():
    tool = os.path.join(TOOLS, "gpu_step.py")
    out = subprocess.run([sys.executable, tool, "--predict", "--model", "resnet50", "--dtype", "bfloat16", "--batch",
                          "4", "--profile", "h200-141gb", "--mode", "xla", "--json"],
                         capture_output=True, text=True, check=True, timeout=600)
    record = json.loads(out.stdout)
    assert record["bench_model"] == "resnet50-amp-bf16" and record["batch"] == 4
    assert record["step_ms"] > 0 and record["peak_bytes"] > 0
    missing = subprocess.run([sys.executable, tool, "--predict", "--model", "resnet50"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "--predict needs --dtype, --batch, --profile, --mode" in missing.stderr
