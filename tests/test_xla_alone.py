"""XLA alone first (issue 47, item 3): the plain XLA step is priced with XLA's fusion and its own rematerialization
rule; where it fits the budget the step is left to XLA, compiled whole, and tflms steps in only where it does not
(tflms/tune/xla_alone.py)."""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

import tflms
from tflms.config import LMSConfig
from tflms.sim.simulator import SimOptions
from tflms.tune.xla_alone import XLA_DEVICE_FRACTION, XLA_SLOP, price_xla_alone, xla_limit_bytes
from tflms.units import parse_bytes

PROFILE = "v100-16gb-pcie3"


def test_xla_limit_is_its_share_of_device_memory_less_the_parameters():
    gib = 1 << 30
    assert xla_limit_bytes(16 * gib, gib) == int(XLA_SLOP * (XLA_DEVICE_FRACTION * 16 * gib - gib))
    assert xla_limit_bytes(gib, 2 * gib) == 0  # parameters beyond the limit: nothing left for the step


@pytest.fixture(scope="module")
def cnn_analysis():
    from tflms.analysis.cto import analyze_graph
    from tflms.estimate import training_step
    from tflms.ir.tf_io import load_graph
    from tflms.testing.sweep import issue45_model
    model = issue45_model()  # issue 45's CNN, at batch 32
    step, _, optimizer = training_step(model)
    analysis = analyze_graph(load_graph(step, batch_size=32))
    return analysis, (model, optimizer, step)


@pytest.mark.parametrize("memory, fits, remat", [
    ("400MiB", True, False),  # the plain XLA step (120 MiB) is under XLA's limit
    ("150MiB", True, True),  # over XLA's limit: its rematerialization brings it under, and that fits
    ("100MiB", False, True),  # its rematerialization finds nothing under the limit, and the plain step is too big
])
def test_the_verdict_follows_xlas_limit_and_its_rematerialization(cnn_analysis, memory, fits, remat):
    from tflms.profiles import get_profile
    analysis, _ = cnn_analysis
    profile = dataclasses.replace(get_profile(PROFILE), name="small", memory_bytes=parse_bytes(memory))
    verdict = price_xla_alone(analysis, profile, profile.memory_bytes, SimOptions(margin_fraction=0.05), LMSConfig())
    assert (verdict.fits, verdict.remat) == (fits, remat), verdict.text()
    assert verdict.limit_bytes == xla_limit_bytes(profile.memory_bytes, _resident(analysis, profile))
    if verdict.remat_peak_bytes is not None:  # XLA's pass trades time for memory
        assert verdict.remat_peak_bytes < verdict.plain_peak_bytes and verdict.remat_step_s > verdict.plain_step_s
    assert verdict.peak_bytes <= verdict.budget_bytes if fits else verdict.peak_bytes > verdict.budget_bytes
    assert ("does not fit" in verdict.text()) != fits and "simulated" in verdict.text()
    again = price_xla_alone(analysis, profile, profile.memory_bytes, SimOptions(margin_fraction=0.05), LMSConfig())
    assert again == verdict  # deterministic


def _resident(analysis, profile) -> int:
    from tflms.sim.simulator import simulate
    return simulate(analysis.graph, profile, options=SimOptions(clock="xla")).resident_bytes


def _train(wrap, steps: int = 3):
    import keras

    from tflms.testing import make_train_step, snapshot
    from tflms.testing.models import build_model, make_batches
    model = build_model("cnn")
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    fn = wrap(make_train_step(model, optimizer))
    data = [tuple(tf.constant(t) for t in batch) for batch in make_batches(model, batch_size=8, steps=steps)]
    losses = [fn(x, y) for x, y in data]
    return fn, snapshot(model, optimizer, losses=losses)


def test_a_step_that_fits_with_xla_alone_is_left_to_xla_compiled_whole():
    from tflms.testing import assert_bitwise_equal, bitwise_diff
    fn, left = _train(lambda step: tflms.function(step, jit_compile=True, budget="1GiB", profile=PROFILE))
    _, xla = _train(lambda step: tf.function(step, jit_compile=True))
    _, plain = _train(tf.function)
    report = fn.report
    assert report.tuning["strategy"] == "xla-alone" and report.tuning["xla_alone"]["fits"]
    assert not report.inserted_ops and report.num_swapped == 0 and report.xla_clusters is None
    assert "XLA alone fits" in report.table() and "left to XLA" in report.table()
    # what ran is XLA's compilation of the whole step: bit for bit the plain jit_compile=True step's, not TensorFlow's
    assert_bitwise_equal(xla, left, "left to XLA vs plain jit_compile=True")
    assert bitwise_diff(plain, left), "plain TensorFlow must differ, or this test tells nothing"


def test_where_xla_alone_does_not_fit_tflms_steps_in_with_clusters(cnn_analysis):
    from tflms.pipeline import rewrite_step
    *_, step = cnn_analysis[1]
    # issue 45's CNN at batch 32: the plain XLA step needs 114.30 MiB (no rematerialization on a 16 GiB profile),
    # tflms's plan priced on its clusters 98.30 MiB
    result = rewrite_step(step, LMSConfig(budget="105MiB", profile=PROFILE, batch_size=32), xla=True, build=False)
    tuning = result.report.tuning
    alone = tuning["xla_alone"]
    assert not alone["fits"] and not alone["remat"] and alone["peak_bytes"] > parse_bytes("105MiB")
    assert tuning["strategy"] != "xla-alone" and tuning["clock"] == "xla-clusters"
    assert result.report.inserted_ops and result.report.xla_clusters["kept"]
    assert tuning["predicted_peak_bytes"] <= parse_bytes("105MiB")
    # and where XLA alone fits, nothing is tuned and nothing inserted
    left = rewrite_step(step, LMSConfig(budget="115MiB", profile=PROFILE, batch_size=32), xla=True, build=False)
    assert left.report.tuning["strategy"] == "xla-alone" and not left.report.inserted_ops
    assert left.report.xla_clusters is None and "tune" not in left.report.timings_s
