"""tools/benchlib: the 3D U-Net's size sequence (volumes in increasing voxel order), its search and its report rows.

The benchmark's U-Net size index k is a volume D x H x W (sides multiples of 16, at most one step apart):
16^3, 32x16x16, 32x32x16, 32^3, 48x32x32, ... The doubling + bisection search assumes that a larger index
never needs less memory; for one model that holds when voxels strictly increase with the index.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from benchlib.common import (BOUND, METHODS, UNET_RESOLUTION_STEP, shape_label, unet_index,  # noqa: E402
                             unet_shape, voxels)
from benchlib.search import MethodResult, search_max  # noqa: E402

STEP = UNET_RESOLUTION_STEP


def test_unet_sizes_increase_in_voxels_with_sides_at_most_one_step_apart_and_round_trip():
    shapes = [unet_shape(k) for k in range(1, 301)]
    assert shapes[:5] == [(16, 16, 16), (32, 16, 16), (32, 32, 16), (32, 32, 32), (48, 32, 32)]
    counts = [voxels(s) for s in shapes]
    assert all(a < b for a, b in zip(counts, counts[1:]))
    for k, shape in enumerate(shapes, start=1):
        assert all(side % STEP == 0 for side in shape), shape
        assert max(shape) - min(shape) <= STEP, shape
        assert list(shape) == sorted(shape, reverse=True), shape  # the larger sides first
        assert unet_index(shape) == k
    # Every cube of the old sequence is still there, at index 3n - 2, with two sizes between neighbours.
    for n in range(1, 100):
        assert unet_shape(3 * n - 2) == (n * STEP,) * 3
    assert unet_index((192, 192, 192)) == 34 and unet_shape(35) == (208, 192, 192)


@pytest.mark.parametrize("shape", [(16, 32, 16), (48, 16, 16), (20, 16, 16), (16, 16), (0, 0, 0), (32, 32, 32, 32)])
def test_unet_index_rejects_a_volume_outside_the_sequence(shape):
    with pytest.raises(ValueError, match="not a benchmark volume"):
        unet_index(shape)


def test_unet_shape_rejects_index_zero():
    with pytest.raises(ValueError, match="must be >= 1"):
        unet_shape(0)


def test_shape_label_writes_cubes_as_powers_and_other_volumes_side_by_side():
    assert shape_label((192, 192, 192)) == "192^3"
    assert shape_label((208, 192, 192)) == "208x192x192"
    assert shape_label((208, 208, 192)) == "208x208x192"


@pytest.mark.parametrize("limit", [4096, 100_000, 208**3 - 1, 192 * 192 * 208, 7_654_321])
def test_search_finds_the_largest_volume_under_a_voxel_limit(limit):
    """Doubling from index 1, then bisection until adjacent: the exact answer; from another start, too."""
    probed = []

    def fits(k):
        probed.append(k)
        return voxels(unet_shape(k)) <= limit

    best = max(k for k in range(1, 400) if voxels(unet_shape(k)) <= limit)
    assert search_max(fits, 1, None) == (best, best + 1)
    assert search_max(fits, best + 7, None) == (best, best + 1)  # starting above: halves down first
    assert search_max(fits, max(1, best - 5), None, next_try=best + 2) == (best, best + 1)
    low, high = search_max(fits, 1, 3)  # quick mode: a fit and a miss, not necessarily adjacent
    assert fits(low) and not fits(high) and low <= best < high
    assert probed


def test_records_and_report_show_volumes_and_compare_voxels():
    from benchlib.report import markdown, records_for
    maxima = {"none": 25, "tflms-distance": 31, "tflms-best": 35, "grappler": 31, "checkpoint-segments": 32,
              "keras-remat": 0, "keras-remat-activations": 28, BOUND: 37}
    results = {m: MethodResult(m, max_size=k, upper=k + 1, probes=[(k, True), (k + 1, False)], common=31)
               for m, k in maxima.items()}
    results["tflms-best"].time_bound_ratio_at_max, results["tflms-best"].floor_bound_ratio_at_max = 1.3, 1.2
    # a traced step that failed to build: no size, its error's first line instead (a "|" kept out of the table)
    results["keras-remat"] = MethodResult("keras-remat", common=31, error="ValueError: mode | other",
                                          detail="volume 176^3; failed: ValueError: mode | other")
    records = {r["method"]: r for r in records_for("unet3d", "v100-16gb-pcie3", results)}
    assert [m for m in records] == list(METHODS) + [BOUND]
    best, none, bound = records["tflms-best"], records["none"], records[BOUND]
    assert unet_shape(25) == (144, 144, 144) and unet_shape(37) == (208, 208, 208)
    assert best["max_batch"] == "208x192x192" and best["max_shape"] == [208, 192, 192]
    assert best["max_voxels"] == 208 * 192 * 192 and best["max_batch_upper"] == "208x208x192"
    assert none["max_batch"] == "144^3" and best["common_batch"] == "176^3" and best["bound_batch"] == "208^3"
    assert best["probes"] == [["208x192x192", True], ["208x208x192", False]]
    assert best["fraction_of_bound"] == round(192 * 192 / 208**2, 4)  # voxels, not sides
    assert bound["fraction_of_bound"] == 1.0
    report = markdown(list(records.values()), command="python tools/bench.py", mode="quick", elapsed_s=1.0,
                      plots={}, bisect_steps=30)
    ratio = 208 * 192 * 192 / 144**3
    assert f"| unet3d | tflms-best | 208x192x192 | {100 * 192 * 192 / 208**2:.0f}% | {ratio:.2f}x vox |" in report
    assert f"208x192x192 ({ratio:.2f}x vox)" in report
    assert best["floor_bound_ratio_at_max"] == 1.2 and none["floor_bound_ratio_at_max"] is None
    assert "| 1.30 | - | 1.20 |" in report and "| floor/bound |" in report
    assert "Quick mode bisects 30 times" in report and "cubic" not in report
    assert records["keras-remat"]["error"] == "ValueError: mode | other" and best["error"] is None
    assert "(1.99x vox) | failed | 160^3 (1.37x vox) |" in report  # maxima table: the error is in the rows below
    assert "| unet3d | keras-remat | failed: ValueError: mode \\| other | - |" in report
    assert report.count("failed: ValueError: mode \\| other") == 3  # both method tables, and the detail
    assert "| `checkpoint-segments` |" in report and "| `recompute` |" not in report


def test_unet3d_traces_a_volume_that_is_not_a_cube():
    """build_unet3d takes any D, H, W that are multiples of 2 ** depth: the skips line up with the upsampled tensors."""
    tf = pytest.importorskip("tensorflow")
    import keras

    from tflms.ir import tf_io
    from tflms.models import build_unet3d, unet3d_input_specs
    from tflms.testing import make_train_step
    keras.utils.set_random_seed(0)
    model = build_unet3d(channels=1, classes=2, base_filters=2, depth=2)
    x_spec, y_spec = unet3d_input_specs((12, 8, 4), channels=1, depth=2)
    assert x_spec.shape.as_list() == [None, 12, 8, 4, 1] and y_spec.shape.as_list() == [None, 12, 8, 4]
    assert tf.function(model).get_concrete_function(x_spec).structured_outputs.shape.as_list() == [None, 12, 8, 4, 2]
    loss = keras.losses.SparseCategoricalCrossentropy()
    step = tf.function(make_train_step(model, keras.optimizers.Adam(1e-3), loss))
    graph = tf_io.from_concrete_function(step.get_concrete_function(x_spec, y_spec))
    assert len(graph) > 0


def test_unet3d_input_specs_name_a_side_the_unet_cannot_halve():
    pytest.importorskip("tensorflow")
    from tflms.errors import ConfigError
    from tflms.models import unet3d_input_specs
    with pytest.raises(ConfigError, match=r"\('H', 10\).*multiples of 2 \*\* depth = 4"):
        unet3d_input_specs((12, 10, 4), depth=2)
    with pytest.raises(ConfigError, match="positive int or three"):
        unet3d_input_specs((16, 16))
    assert unet3d_input_specs(32)[0].shape.as_list() == [None, 32, 32, 32, 4]  # an int is still a cube


def test_the_full_tune_at_a_maximum_reports_no_unpruned_fit_where_every_fit_was_pruned(monkeypatch):
    """A hybrid ordered before its swaps carries its nested tune's pruned plan alone: when every fitting candidate
    says ``pruned``, the step before pruning is unknown (None), not an error that ends the benchmark."""
    import types

    import benchlib.search as search
    import tflms.tune.tuner as tuner
    from tflms.tune.prune import PRUNED_PARAM

    sim = types.SimpleNamespace(step_time_s=2.0)
    best = types.SimpleNamespace(fits=True, params={PRUNED_PARAM: 3}, sim=sim, strategy="hybrid")
    other = types.SimpleNamespace(fits=False, params={}, sim=types.SimpleNamespace(step_time_s=1.0))
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: types.SimpleNamespace(best=best, candidates=(other, best)))
    steps = types.SimpleNamespace(graph=lambda model, variant, size: (object(), 0.0))
    ev = types.SimpleNamespace(steps=steps, model="resnet50", budget=1, profile=types.SimpleNamespace(name="p"),
                               options=None, label=lambda size: f"batch {size}")
    assert search._full_tune(ev, "tflms-best", 8) == (sim, None)
    unpruned = types.SimpleNamespace(fits=True, params={}, sim=types.SimpleNamespace(step_time_s=3.0))
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: types.SimpleNamespace(best=best,
                                                                             candidates=(unpruned, best)))
    assert search._full_tune(ev, "tflms-best", 8) == (sim, unpruned.sim)
