"""What a new user meets (issue 14): honest verdicts, the hardware named, legends, full JSON, triggers."""

from __future__ import annotations

import json

import pytest

from tflms.analysis import analyze_graph
from tflms.config import LMSConfig
from tflms.pipeline import rewrite
from tflms.policies.swapplan import find_trigger
from tflms.testing import GraphBuilder, make_train_step

ACC = "/device:GPU:0"


# ------------------------------------------------------------------ triggers past identities
def _identity_window_graph():
    """``fw/a`` (level 1) is read again by ``gradient_tape/g`` (level 7), whose only ancestors at
    levels 5 and 6 are Identity ops; the nearest other ancestor is ``loss/l`` at level 4."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    a = b.op("fw/a", "Relu", [x])
    c = b.op("fw/b", "Relu", [a])
    c = b.op("fw/c", "Relu", [c])
    loss = b.op("loss/l", "Mul", [c, c])
    i1 = b.op("gradient_tape/id1", "Identity", [loss])
    i2 = b.op("gradient_tape/id2", "Identity", [i1])
    b.op("gradient_tape/g", "ReluGrad", [i2, a])
    return b.graph


def test_trigger_skips_a_window_of_identities_to_the_nearest_other_ancestor():
    analysis = analyze_graph(_identity_window_graph())
    levels = analysis.levels
    assert (levels["fw/a"], levels["loss/l"], levels["gradient_tape/id2"], levels["gradient_tape/g"]) == (1, 4, 6, 7)
    # the window [6, 7) holds only an Identity: the trigger is the nearest ancestor below it that is not one
    assert find_trigger(analysis, "gradient_tape/g", 1, 6) == "loss/l"
    # never at or before the producer's level: from fw/b's level, nothing qualifies
    assert find_trigger(analysis, "gradient_tape/g", 4, 6) is None


def test_identity_window_no_longer_falls_back_to_a_synchronous_swap_in():
    report = rewrite(_identity_window_graph(), swapout_threshold=2, accelerator_device=ACC).report
    swap = next(s for s in report.swaps if s.tensor.name == "fw/a:0")
    [group] = swap.swap_ins
    assert (group.trigger, group.trigger_level, group.sync) == ("loss/l", 4, False)


# ------------------------------------------------------------------ a small step with an unknown batch
def _step_with_unknown_batch():
    """A training step traced for a ``None`` batch: (tf_function, concrete function, model, x, y)."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    inputs = keras.Input((12, 12, 3))
    h = inputs
    for _ in range(5):  # a chain long enough that swapping lowers the peak
        h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    step = make_train_step(model, optimizer)

    signature = (tf.TensorSpec((None, 12, 12, 3), tf.float32), tf.TensorSpec((None,), tf.int32))
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((8, 12, 12, 3)), tf.float32)
    y = tf.constant(rng.integers(0, 4, 8), tf.int32)
    fn = tf.function(step, input_signature=signature)
    return step, signature, fn.get_concrete_function(), x, y


@pytest.fixture(scope="module")
def unknown_batch_step():
    return _step_with_unknown_batch()


def test_a_budget_verdict_on_unknown_sizes_is_refused_naming_batch_size(unknown_batch_step):
    from tflms.errors import UnknownSizeError
    _, _, concrete, _, _ = unknown_batch_step
    with pytest.raises(UnknownSizeError) as info:
        rewrite(concrete, budget="12GiB")
    message = str(info.value)
    assert "batch_size=N" in message and "--batch-size N" in message
    assert "(None, 12, 12, 3)" in message  # names an example tensor and its shape


def test_the_tuner_refuses_too(unknown_batch_step):
    from tflms.errors import UnknownSizeError
    from tflms.tune.tuner import tune
    _, _, concrete, _, _ = unknown_batch_step
    with pytest.raises(UnknownSizeError, match="batch_size"):
        tune(concrete, budget="12GiB")
    result = tune(concrete, budget="12GiB", config=LMSConfig(batch_size=8))
    assert result.strategy == "none"
    # a gradient's Reshape to a run-time tf.shape holds its input's elements: sized from it (Graph.fill_alias_bytes)
    from tflms.ir.tf_io import load_graph
    graph = load_graph(concrete, batch_size=8)
    reshapes = [i for op in graph.ops if op.type == "Reshape" for i in op.outputs if not i.fully_defined]
    assert reshapes and all(i.num_bytes for i in reshapes)
    assert result.baseline.unknown_size_tensors == () and "not counted" not in result.reason()


def test_sizes_that_depend_on_the_data_are_said_not_hidden():
    """A boolean mask's output has a data-dependent dimension: no batch size sizes it; the verdict says so."""
    import tensorflow as tf

    from tflms.tune.tuner import tune
    weights = tf.Variable(tf.ones((3, 4)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            kept = tf.boolean_mask(x, tf.reduce_any(x > 0, axis=0), axis=1)  # (batch, data-dependent)
            loss = tf.reduce_sum(tf.matmul(x, weights)) + tf.reduce_sum(kept)
        weights.assign_sub(0.1 * tape.gradient(loss, weights))
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec((None, 3)))
    result = tune(concrete, budget="12GiB", config=LMSConfig(batch_size=8))
    unknown = result.baseline.unknown_size_tensors
    assert unknown and any("boolean_mask" in name for name in unknown)
    assert result.reason().endswith(f"; {len(unknown)} tensors whose size depends on the data are not counted")


def test_without_a_budget_the_rewrite_proceeds_and_says_what_it_left(unknown_batch_step):
    _, _, concrete, _, _ = unknown_batch_step
    report = rewrite(concrete, accelerator_device=ACC, swapout_threshold=1).report
    assert report.unknown_size_skips > 0 and report.prediction() is None
    table = report.table()
    assert f"note: {report.unknown_size_skips} tensors of unknown size were not swapped" in table
    assert "give batch_size" in table


def test_tflms_function_sizes_an_unknown_batch_from_its_arguments(unknown_batch_step):
    import tflms
    step, signature, _, x, y = unknown_batch_step
    fn = tflms.function(step, input_signature=signature, budget="12GiB")
    fn(x, y)
    report = fn.report
    assert report.plan.config.batch_size == 8
    assert report.hardware["batch_size"] == "8, from the inputs of the first call"
    assert report.unknown_size_skips == 0
    prediction = report.prediction()
    assert prediction["peak_before_bytes"] > 0 and prediction["profile"] == report.hardware["profile"]


# ------------------------------------------------------------------ the hardware a report is for
def test_cpu_only_budgeted_rewrite_says_it_plans_for_the_profiles_gpu(unknown_batch_step):
    import tensorflow as tf
    from tflms.profiles import DEFAULT_PROFILE
    assert not tf.config.list_physical_devices("GPU")  # this test describes a CPU-only machine
    _, _, concrete, _, _ = unknown_batch_step
    report = rewrite(concrete, budget="12GiB", batch_size=8).report
    h = report.hardware
    assert (h["profile"], h["source"], h["planned_for"], h["runs_on"]) == (
        DEFAULT_PROFILE, "default", "/device:GPU:0", "/device:CPU:0")
    [warning] = [w for w in report.warnings if w.startswith("no GPU found")]
    assert f"planned for the GPU of profile {DEFAULT_PROFILE}" in warning and "/device:CPU:0" in warning
    table = report.table()
    assert f"hardware: {DEFAULT_PROFILE} (the default profile" in table
    assert "this machine runs the step on /device:CPU:0" in table
    assert "warning: no GPU found" in table
    assert report.to_dict()["hardware"]["profile"] == DEFAULT_PROFILE


def test_a_given_profile_is_named_as_given(unknown_batch_step):
    _, _, concrete, _, _ = unknown_batch_step
    report = rewrite(concrete, profile="a100-80gb-pcie4", batch_size=8).report
    assert (report.hardware["profile"], report.hardware["source"]) == ("a100-80gb-pcie4", "given")
    assert report.table().splitlines()[1].startswith("hardware: a100-80gb-pcie4 (given")


def test_a_rewrite_without_budget_says_no_profile_was_used(unknown_batch_step):
    _, _, concrete, _, _ = unknown_batch_step
    report = rewrite(concrete, accelerator_device=ACC, batch_size=8, swapout_threshold=1).report
    assert report.hardware["profile"] is None
    assert report.table().splitlines()[1].startswith("hardware: no profile (TFLMS rule parameters given")


@pytest.mark.parametrize("device_name, memory, expected, source_word", [
    ("Tesla V100-PCIE-16GB", None, "v100-16gb-pcie3", "matched"),
    ("Tesla V100-SXM2-32GB", 32 * 2**30, "v100-32gb-nvlink2", "matched"),
    ("NVIDIA A100-SXM4-80GB", 79 * 2**30, "a100-80gb-sxm4", "matched"),
    ("NVIDIA A100-SXM4-40GB", None, "a100-40gb-pcie4", "matched"),  # closest memory before the form factor
    ("NVIDIA H100 80GB HBM3", None, "h100-80gb-sxm5", "matched"),  # HBM3: the SXM5 part (PCIe says "PCIe")
    ("NVIDIA GH200 480GB", 95 * 2**30, "gh200", "matched"),
    ("NVIDIA GeForce RTX 4090", 24 * 2**30, "v100-16gb-pcie3", "no profile"),  # 16 and 32 tie: the name decides
    ("NVIDIA RTX 6000 Ada", 28 * 2**30, "v100-32gb-nvlink2", "no profile"),  # closest memory: 32 GiB
    ("NVIDIA L4", 22 * 2**30, "v100-16gb-pcie3", "no profile"),  # 22 GiB: 16 is closer than 32
])
def test_profile_for_device_picks_family_then_closest_memory(device_name, memory, expected, source_word):
    from tflms.profiles import profile_for_device
    choice = profile_for_device(device_name, memory)
    assert (choice.name, choice.source) == (expected, "device")
    assert choice.why.startswith(source_word) and repr(device_name) in choice.why


def test_select_profile_given_then_device_then_default():
    from tflms.errors import ConfigError
    from tflms.profiles import DEFAULT_PROFILE, select_profile
    assert select_profile("gh200", ("Tesla V100-PCIE-16GB", None)).name == "gh200"
    assert select_profile(None, ("Tesla V100-PCIE-16GB", None)).name == "v100-16gb-pcie3"
    default = select_profile(None, None)
    assert (default.name, default.source) == (DEFAULT_PROFILE, "default") and "no GPU" in default.why
    with pytest.raises(ConfigError, match="unknown hardware profile"):
        select_profile("p100", None)


# ------------------------------------------------------------------ progress and summaries
def _tight_budget(concrete) -> int:
    """One byte under the step's predicted peak without swapping: the tuner must search."""
    return rewrite(concrete, budget="12GiB", batch_size=8).report.prediction()["peak_before_bytes"] - 1


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_tflms_function_verbose_shows_progress_and_a_summary(unknown_batch_step, verbose, capsys):
    import tflms
    step, signature, concrete, x, y = unknown_batch_step
    budget = _tight_budget(concrete)
    capsys.readouterr()
    fn = tflms.function(step, input_signature=signature, budget=budget, verbose=verbose)
    fn(x, y)
    fn(x, y)  # the second call reuses the trace: nothing more is printed
    out = capsys.readouterr().out
    report = fn.report
    assert report.num_swapped > 0 and report.tuning["candidates"]
    summaries = [line for line in out.splitlines() if line.startswith("tflms.function 'train_step': rewrote")]
    if verbose == 0:
        assert out == ""
        return
    assert len(summaries) == 1, out
    p = report.prediction()
    assert "inputs (None, 12, 12, 3) float32, (None,) int32" in summaries[0]
    assert (f"predicted peak {__import__('tflms').units.format_bytes(p['peak_before_bytes'])} -> "
            in summaries[0]), summaries[0]
    assert "  hardware: v100-16gb-pcie3 (the default profile" in out
    candidates = [line for line in out.splitlines() if line.startswith("tflms.function 'train_step': candidate ")]
    if verbose == 1:
        assert "simulating candidate rewrites" in out and "/Unknown" in out and not candidates  # a Progbar
        assert "columns:" not in out
    else:
        assert len(candidates) == len(report.tuning["candidates"]) - 1  # every candidate but "none"
        assert "peak" in candidates[0] and "step" in candidates[0] and "columns:" in out


def test_tflms_function_refuses_a_bad_verbose():
    import tflms
    with pytest.raises(ValueError, match="verbose must be 0"):
        tflms.function(lambda x: x, verbose=3)


# ------------------------------------------------------------------ full JSON, wide tables, legend
LONG_SCOPE = "functional/a_rather_long_keras_scope_name/residual_block"


def _many_swaps_report():
    """45 forward activations with names longer than a table column, each read again by the backward pass."""
    b = GraphBuilder()
    h = b.op("x", "Placeholder")
    acts = []
    for i in range(45):
        h = b.op(f"{LONG_SCOPE}_{i}/Relu", "Relu", [h])
        acts.append(h)
    g = b.op("loss/l", "Mul", [h, h])
    for i, act in reversed(list(enumerate(acts))):
        g = b.op(f"gradient_tape/{LONG_SCOPE}_{i}/ReluGrad", "ReluGrad", [g, act])
    return rewrite(b.graph, swapout_threshold=1, accelerator_device=ACC).report


def test_json_carries_full_names_and_every_swap_while_tables_cut_and_say_so():
    report = _many_swaps_report()
    assert report.num_swapped > 40
    data = json.loads(report.to_json())
    assert [s["tensor"] for s in data["swaps"]] == [s.tensor.name for s in report.swaps]
    assert "..." not in report.to_json()
    short = report.table()
    assert (f"... and {report.num_swapped - 40} more swapped tensors "
            "(table(wide=True) (--wide) or to_json() (--json) lists all)") in short
    wide = report.table(wide=True)
    assert "more swapped tensors" not in wide and "..." not in wide
    assert f"{LONG_SCOPE}_0/Relu:0" not in short and f"{LONG_SCOPE}_0/Relu:0" in wide  # cut short, then whole
    assert all(s.tensor.name in wide for s in report.swaps)
    for text in (short, wide):
        assert "columns: tensor = the swapped tensor" in text and "sync = yes when" in text
    assert "columns:" not in report.table(legend=False)


def test_tuner_json_keeps_every_candidate_and_full_params(unknown_batch_step):
    from tflms.tune.tuner import tune
    _, _, concrete, _, _ = unknown_batch_step
    result = tune(concrete, budget=_tight_budget(concrete), config=LMSConfig(batch_size=8))
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["candidates"]) == len(result.candidates)
    assert [c["params"] for c in data["candidates"]] == [c.params for c in result.candidates]
    wide = result.table(wide=True)
    assert "..." not in wide and "columns: params" in wide
    assert len(wide.splitlines()) == len(result.candidates) + 3


def test_predict_gives_an_untuned_rewrite_its_peaks_before_and_after(unknown_batch_step):
    from tflms.errors import UnknownSizeError
    from tflms.pipeline import predict
    _, _, concrete, _, _ = unknown_batch_step
    sized = rewrite(concrete, swapout_threshold=1, batch_size=8, accelerator_device=ACC)
    p = predict(sized)
    assert p["profile"] == "v100-16gb-pcie3" and "default" in p["profile_why"]
    assert p["peak_after_bytes"] < p["peak_before_bytes"] and p["overhead"] >= 0
    tuned = rewrite(concrete, budget="12GiB", batch_size=8).report.prediction()
    assert set(p) - {"profile_why"} == set(tuned)  # the same record as a tuned report's
    with pytest.raises(UnknownSizeError, match="batch_size"):
        predict(rewrite(concrete, swapout_threshold=1, accelerator_device=ACC))


def test_lms_config_accepts_the_documented_budget_alias():
    from tflms.config import LMSConfig
    from tflms.errors import ConfigError
    config = LMSConfig(budget="12GiB")
    assert config.budget_bytes == 12 * 2**30 and config.auto_tune
    assert config.replace(swapout_threshold=2).budget_bytes == 12 * 2**30 and "budget" not in config.to_dict()
    with pytest.raises(ConfigError, match="budget or budget_bytes"):
        LMSConfig(budget="1GiB", budget_bytes=2**30)


def test_a_static_batch_is_not_refused_for_shape_vectors_of_unknown_length():
    """Attention gradients hold BroadcastGradientArgs shape vectors of unknown length; with every step
    argument's batch known they are not a batch size to ask for (tools/plan_report.py's transformer)."""
    import keras
    import tensorflow as tf

    from tflms.errors import UnknownSizeError
    from tflms.testing.models import mha_block
    from tflms.testing.steps import make_train_step
    from tflms.tune.tuner import tune
    model = mha_block()
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    fixed = step.get_concrete_function(tf.TensorSpec((4, 8, 16)), tf.TensorSpec((4,), tf.int32))
    result = tune(fixed, budget="12GiB")
    unknown = result.baseline.unknown_size_tensors
    assert unknown and any("BroadcastGradientArgs" in name for name in unknown)  # what the check must see past
    assert result.strategy == "none"
    # the same step with an unknown batch is still refused
    free = step.get_concrete_function(tf.TensorSpec((None, 8, 16)), tf.TensorSpec((None,), tf.int32))
    with pytest.raises(UnknownSizeError, match="batch_size"):
        tune(free, budget="12GiB")
