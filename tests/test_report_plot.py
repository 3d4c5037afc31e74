"""The user's own memory picture (issue 48, item 4): ``report.plot()`` and the measured peak beside the predicted one.

A small CNN's step is tuned one byte under its predicted peak, so that the tuner must swap (``recompute="off"``) or
recompute (``recompute="only"``); the figure's Axes are read back. No GPU exists here: the measurement
(:func:`tflms.devices.reset_gpu_peaks` and :func:`tflms.devices.gpu_peaks`) is replaced to test the report's
text and JSON, and a CPU-only run must say the measured peak is unavailable.
"""

from __future__ import annotations

import json
import sys

import pytest

PROFILE = "v100-16gb-pcie3"
BATCH = 64


def _step(**options):
    """A tflms.function training step of the kit's CNN, called once on a batch; returns it (``.report``, and the
    batch as ``.batch``)."""
    import keras
    import tensorflow as tf

    import tflms
    from tflms.testing import build_model, make_train_step
    keras.utils.set_random_seed(0)
    model = build_model("cnn", seed=0)
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    step = tflms.function(make_train_step(model, optimizer), profile=PROFILE, **options)
    x = tf.random.normal([BATCH, *model.inputs[0].shape[1:]])
    step.batch = (x, tf.zeros([BATCH], tf.int32))
    step(*step.batch)
    return step


@pytest.fixture(scope="module")
def tight_budget() -> int:
    """One byte under the unchanged step's predicted peak (a budget given: no margin)."""
    return _step(budget="1GiB").report.prediction()["peak_before_bytes"] - 1


@pytest.fixture(scope="module")
def swapped(tight_budget):
    report = _step(budget=tight_budget, recompute="off").report
    assert report.num_swapped > 0 and not report.recomputes
    return report


@pytest.fixture(scope="module")
def recomputed(tight_budget):
    report = _step(budget=tight_budget, recompute="only").report
    assert report.recomputes and report.num_swapped == 0
    return report


#: What the figure's lines are labelled with (each label starts so).
NAMES = ("without tflms", "with tflms", "swap-out", "swap-in", "recompute", "budget", "measured peak")


def _unit(fig) -> int:
    """Bytes per unit of the figure's y axis, from its label: "accelerator memory (MiB)"."""
    return {"(GiB)": 2**30, "(MiB)": 2**20, "(KiB)": 2**10, "(B)": 1}[fig.axes[0].get_ylabel().split()[-1]]


def _lines(fig) -> dict[str, object]:
    """The Axes' lines by the start of their labels (:data:`NAMES`)."""
    [ax] = fig.axes
    out = {}
    for line in ax.get_lines():
        label = line.get_label()
        out[next((n for n in NAMES if label == n or label.startswith(n + " ")), label)] = line
    return out


def test_the_picture_has_the_step_before_and_after_with_the_swaps_marked(swapped):
    picture = swapped.memory
    assert picture.before.peak_bytes > picture.after.peak_bytes and picture.budget_bytes == swapped.tuning[
        "budget_bytes"]
    assert len(picture.swap_outs_s) == len(picture.swap_ins_s) >= swapped.num_swapped and not picture.recomputes_s
    fig = swapped.plot()
    lines = _lines(fig)
    assert {"without tflms", "with tflms", "swap-out", "swap-in", "budget"} <= set(lines), set(lines)
    assert "recompute" not in lines
    before, after, unit = lines["without tflms"], lines["with tflms"], _unit(fig)
    assert unit == 2**20  # a step of about 1.5 MiB is drawn in MiB
    assert max(before.get_ydata()) == pytest.approx(picture.before.peak_bytes / unit)
    assert max(after.get_ydata()) == pytest.approx(picture.after.peak_bytes / unit)
    outs = lines["swap-out"]
    assert outs.get_marker() == "v" and outs.get_linestyle() == "None"
    assert list(outs.get_xdata()) == pytest.approx([1e3 * t for t in picture.swap_outs_s])
    assert lines["swap-in"].get_marker() == "^"
    assert lines["budget"].get_ydata()[0] == pytest.approx(picture.budget_bytes / unit)
    assert fig.axes[0].get_xlabel() == "simulated time in the step (ms)"


def test_recomputes_are_marked(recomputed):
    lines = _lines(recomputed.plot())
    assert lines["recompute"].get_marker() == "x" and len(lines["recompute"].get_xdata()) == len(
        recomputed.recomputes)
    assert "swap-out" not in lines and "swap-in" not in lines


def test_plot_saves_a_png(swapped, tmp_path):
    path = tmp_path / "memory.png"
    fig = swapped.plot(path, title="cnn")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.axes[0].get_title() == "cnn"


def test_without_matplotlib_the_error_names_the_extra(swapped, monkeypatch):
    from tflms.errors import MissingExtraError
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` now raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[plot\]"') as caught:
        swapped.plot()
    assert isinstance(caught.value, ImportError)


def test_a_rewrite_nothing_was_simulated_for_says_how_to_get_a_picture():
    from tflms.errors import ConfigError
    from tflms.pipeline import rewrite
    from tflms.testing import mlp_training_graph
    report = rewrite(mlp_training_graph(2), swapout_threshold=1, accelerator_device="/device:GPU:0").report
    assert report.memory is None and report.to_dict()["memory"] is None
    with pytest.raises(ConfigError, match="nothing was simulated.*budget= or profile="):
        report.plot()


def test_the_report_json_has_the_picture_without_its_points(swapped):
    out = json.loads(swapped.to_json())["memory"]
    assert out["peak_before_bytes"] == swapped.memory.before.peak_bytes and out["swap_outs"] > 0
    assert "before" not in out  # the timelines stay out of the report's JSON; memory.to_dict() has them
    assert swapped.memory.to_dict()["after"]["accelerator_bytes"]


def test_a_long_timeline_keeps_its_peak():
    from types import SimpleNamespace

    from tflms.report import Timeline
    rows = [(i * 1e-6, 100 + (5000 if i == 7777 else i % 50), 0) for i in range(20_000)]
    line = Timeline.of(SimpleNamespace(timeline=rows, peak_bytes=5100, step_time_s=0.02), points=1000)
    assert len(line.times_s) <= 1000 and max(line.accelerator_bytes) == 5100 and line.times_s[0] == 0.0
    assert list(line.times_s) == sorted(line.times_s)


# ------------------------------------------------------------------ the measured peak
def test_on_a_cpu_the_measured_peak_is_unavailable_not_made_up(swapped):
    measured = swapped.measured
    assert measured.done and measured.peak_bytes is None and "unavailable: this machine has no GPU" in measured.why
    assert "measured peak: unavailable: this machine has no GPU" in swapped.table()
    assert swapped.to_dict()["measured"] == {"peak_bytes": None, "per_device": {}, "why": measured.why}


def test_on_a_gpu_the_first_step_measures_the_peak_beside_the_prediction(monkeypatch, tight_budget):
    from tflms import devices
    calls = []
    monkeypatch.setattr(devices, "reset_gpu_peaks", lambda: calls.append("reset") or ("GPU:0",))
    monkeypatch.setattr(devices, "gpu_peaks", lambda names: calls.append(names) or {"GPU:0": 123_456_789})
    step = _step(budget=tight_budget, recompute="off")
    report = step.report
    assert calls == ["reset", ("GPU:0",)]  # measured around the first step only
    assert report.measured.peak_bytes == 123_456_789
    text = report.table()
    from tflms.units import format_bytes
    assert (f"measured peak: {format_bytes(123_456_789)} (GPU:0 {format_bytes(123_456_789)}; TensorFlow's allocator "
            f"over the first step); predicted {format_bytes(report.memory.after.peak_bytes)}") in text
    assert json.loads(report.to_json())["measured"]["peak_bytes"] == 123_456_789
    fig = report.plot()
    assert _lines(fig)["measured peak"].get_ydata()[0] == pytest.approx(123_456_789 / _unit(fig))
    step(*step.batch)  # a later step: not measured again
    assert calls == ["reset", ("GPU:0",)]


def test_the_keras_callback_measures_its_first_step_too(monkeypatch):
    import keras
    import numpy as np

    import tflms.keras
    from tflms import devices
    calls = []
    monkeypatch.setattr(devices, "reset_gpu_peaks", lambda: calls.append("reset") or ("GPU:0", "GPU:1"))
    monkeypatch.setattr(devices, "gpu_peaks", lambda names: {"GPU:0": 3 << 20, "GPU:1": 1 << 20})
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lms = tflms.keras.LMS(verbose=0)
    model.fit(np.ones((32, 8), np.float32), np.zeros(32, np.int32), batch_size=8, epochs=2, verbose=0,
              callbacks=[lms])
    assert calls == ["reset"]  # one trace, measured over its first step only
    measured = lms.report.measured
    assert measured.peak_bytes == 4 << 20 and measured.per_device == {"GPU:0": 3 << 20, "GPU:1": 1 << 20}
    assert "measured peak: 4.00 MiB (GPU:0 3.00 MiB, GPU:1 1.00 MiB; TensorFlow's allocator" in lms.report.table()
