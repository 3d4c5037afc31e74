"""One default for every entry point (issue 14, item 6): tune for the accelerator's memory."""

from __future__ import annotations

import pytest

from tflms import pipeline
from tflms.config import RULE_DEFAULTS, LMSConfig
from tflms.errors import ConfigError
from tflms.pipeline import rewrite
from tflms.testing import mlp_training_graph

ACC = "/device:GPU:0"


def _peak(graph) -> int:
    from tflms.sim.simulator import simulate
    return simulate(graph, "v100-16gb-pcie3").peak_with_margin_bytes


def test_without_a_gpu_the_default_tunes_for_the_profiles_memory_and_leaves_a_fitting_step_alone(monkeypatch):
    monkeypatch.setattr(pipeline, "local_gpu", lambda: None)
    graph = mlp_training_graph(6)
    report = rewrite(graph, accelerator_device=ACC).report
    assert report.tuning is not None and report.num_swapped == 0
    assert report.hardware["profile"] == "v100-16gb-pcie3"
    assert "the default: 16.00 GiB, the memory of profile v100-16gb-pcie3 (this machine has no GPU" \
        in report.hardware_text()


def test_on_a_gpu_the_default_fits_the_step_in_that_gpus_memory(monkeypatch):
    graph = mlp_training_graph(6, batch=4096, width=128)  # activations dominate the resident weights
    peak = _peak(graph)
    small_gpu = int(peak * 0.8)  # a GPU too small for the step: the default must swap or recompute, and fit
    monkeypatch.setattr(pipeline, "local_gpu", lambda: ("Tesla V100-PCIE-16GB", small_gpu))
    report = rewrite(graph, accelerator_device=ACC).report
    assert report.tuning is not None and report.changed and (report.num_swapped or report.num_recomputed)
    assert report.tuning["budget_bytes"] == small_gpu
    assert report.prediction()["peak_after_bytes"] <= small_gpu < report.prediction()["peak_before_bytes"]
    assert "the memory of this machine's GPU 'Tesla V100-PCIE-16GB'" in report.hardware["budget"]


def test_a_rule_parameter_selects_the_tflms_rules_with_the_others_at_their_defaults(monkeypatch):
    monkeypatch.setattr(pipeline, "local_gpu", lambda: None)
    graph = mlp_training_graph(6)
    report = rewrite(graph, accelerator_device=ACC, swapin_ahead=2).report
    assert report.tuning is None and report.num_swapped > 0
    config = report.plan.config
    assert (config.swapout_threshold, config.swapin_ahead, config.swapin_groupby, config.sync_mode) == (
        RULE_DEFAULTS["swapout_threshold"], 2, RULE_DEFAULTS["swapin_groupby"], RULE_DEFAULTS["sync_mode"])


def test_a_misspelt_filter_is_an_error_even_when_the_step_fits():
    with pytest.raises(ConfigError, match="did you mean"):
        rewrite(mlp_training_graph(2), accelerator_device=ACC, include_types=["Matmul"])


def test_the_default_is_the_same_for_every_entry_point():
    from tflms.cli import build_parser, config_from_args
    args = build_parser().parse_args(["rewrite", "in", "out"])
    assert config_from_args(args) == LMSConfig() and LMSConfig().default_tuning
    from tflms.integrations.keras import LMS
    assert LMS().config == LMSConfig()
