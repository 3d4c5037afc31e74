"""tools/bench.py's mixed-precision rows (issue 28): models built and traced under a Keras dtype policy, and the
calibration of their predicted images/s against a published throughput.

The tiny MLP stands in for ResNet-50 and BERT (the same builder, ``benchlib.models.mixed_precision_spec``): under
``mixed_float16`` / ``mixed_bfloat16`` its traced step's contractions are float16 / bfloat16, the float32 step's
none; the global policy is float32 again after building and tracing, also when the build fails.
"""

from __future__ import annotations

import collections
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from benchlib import models  # noqa: E402
from benchlib.calibration import (PUBLISHED_TENSOR_CORES, Published, calibration_rows,  # noqa: E402
                                  predicted_vs_published, reference_profile)
from benchlib.models import MODELS, Steps, dtype_policy_scope, mixed_precision_spec  # noqa: E402

BATCH = 64


def _contraction_dtypes(graph) -> collections.Counter:
    from tflms.ir.op_types import CONTRACTION_OPS
    from tflms.sim.cost import op_dtype
    return collections.Counter(op_dtype(graph, op) for op in graph.ops if op.type in CONTRACTION_OPS)


def _policy() -> str:
    import keras
    return keras.config.dtype_policy().name


@pytest.fixture
def mixed_mlps(monkeypatch):
    for name, policy in (("mlp-tiny-amp-fp16", "mixed_float16"), ("mlp-tiny-amp-bf16", "mixed_bfloat16")):
        monkeypatch.setitem(MODELS, name, mixed_precision_spec(MODELS["mlp-tiny"], name, policy))


def test_the_bench_rows_are_resnet50_under_mixed_float16_and_bert_under_mixed_bfloat16():
    for name, base, policy in (("resnet50-amp-fp16", "resnet50", "mixed_float16"),
                               ("bert-base-amp-bf16", "bert-base", "mixed_bfloat16")):
        spec = MODELS[name]
        assert (spec.name, spec.dtype_policy, spec.kind, spec.specs) == (name, policy, "batch", MODELS[base].specs)
        assert MODELS[base].dtype_policy is None
        assert policy in spec.description


def test_mixed_step_has_half_precision_contractions_the_float32_step_none_and_the_policy_is_restored(mixed_mlps):
    steps = Steps()
    assert _policy() == "float32"
    plain, _ = steps.graph("mlp-tiny", "plain", BATCH)
    fp16, _ = steps.graph("mlp-tiny-amp-fp16", "plain", BATCH)
    assert _policy() == "float32"
    bf16, _ = steps.graph("mlp-tiny-amp-bf16", "plain", BATCH)
    assert _policy() == "float32"
    # 5 Dense layers: a forward MatMul each, two backward ones each but the first layer's (no input gradient)
    assert _contraction_dtypes(plain) == {"float32": 14}, _contraction_dtypes(plain)
    assert _contraction_dtypes(fp16) == {"float16": 14}, _contraction_dtypes(fp16)
    assert _contraction_dtypes(bf16) == {"bfloat16": 14}, _contraction_dtypes(bf16)
    # the variables stay float32 (Keras mixed precision): the layers compute in half precision, the weights do not
    model = steps._functions("mlp-tiny-amp-fp16")[0]
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    assert model.layers[1].dtype_policy.name == "mixed_float16"
    # mixed_float16 scales the loss (as Keras's train_step does); mixed_bfloat16 needs no scaling
    import keras
    assert isinstance(steps._functions("mlp-tiny-amp-fp16")[1], keras.optimizers.LossScaleOptimizer)
    assert not isinstance(steps._functions("mlp-tiny-amp-bf16")[1], keras.optimizers.LossScaleOptimizer)
    # the checkpointed step of a mixed model is traced under its policy too
    ckpt, _ = steps.graph("mlp-tiny-amp-bf16", "checkpoint-segments", BATCH)
    assert set(_contraction_dtypes(ckpt)) == {"bfloat16"} and _policy() == "float32"
    # on a profile with tensor cores the simulator prices them there
    from tflms.profiles import get_profile
    from tflms.sim.cost import op_math_mode
    a100 = get_profile("a100-80gb-sxm4")
    assert {op_math_mode(fp16, op, a100) for op in fp16.ops} - {None} == {"fp16"}
    assert {op_math_mode(plain, op, a100) for op in plain.ops} - {None} == {"tf32"}


def test_policy_is_restored_when_building_fails(monkeypatch):
    def broken():
        assert _policy() == "mixed_bfloat16"  # built under the policy
        raise RuntimeError("no model")
    monkeypatch.setitem(MODELS, "broken-amp", models.dataclasses.replace(MODELS["mlp-tiny"], name="broken-amp",
                                                                         build=broken, dtype_policy="mixed_bfloat16"))
    with pytest.raises(RuntimeError, match="no model"):
        Steps().graph("broken-amp", "plain", BATCH)
    assert _policy() == "float32"
    with dtype_policy_scope(None):
        assert _policy() == "float32"


def test_predicted_vs_published_is_the_batch_over_the_step_time_against_the_published_figure():
    assert predicted_vs_published(256, 0.5, 1024.0) == (512.0, 0.5)
    assert predicted_vs_published(128, 0.1, 640.0) == pytest.approx((1280.0, 2.0))
    for bad in ((0, 1.0, 1.0), (8, 0.0, 1.0), (8, 1.0, -3.0)):
        with pytest.raises(ValueError, match="predicted_vs_published"):
            predicted_vs_published(*bad)


def test_calibration_rows_divide_the_simulated_step_by_the_published_figure(mixed_mlps):
    from tflms.sim import simulate
    steps = Steps()
    ref = Published("a100-80gb-sxm4", 1000.0, "test", "test", model="mlp-tiny-amp-fp16", batch=BATCH,
                    precision="AMP", memory_gbps=1555.0)
    (row,) = calibration_rows(steps, published=(ref,))
    graph, _ = steps.graph("mlp-tiny-amp-fp16", "plain", BATCH)
    profile = reference_profile(ref)
    assert profile.memory_gbps == 1555.0 and profile.name == "a100-80gb-sxm4@1555GB/s"
    step_s = simulate(graph, profile).step_time_s
    assert row["simulated_step_s"] == step_s and row["math_modes"] == ["fp16"]
    assert row["ratio"] == pytest.approx(BATCH / step_s / 1000.0) and row["profile"] == profile.name


def test_tensor_core_references_cite_their_table_and_batch():
    for ref in PUBLISHED_TENSOR_CORES:
        assert ref.batch == 256 and "DeepLearningExamples" in ref.source and "batch 256" in ref.source, ref
        assert f"{ref.img_s:g} img/s" in ref.source, ref  # the figure used is the one quoted
        assert ref.model in MODELS


def test_op_type_breakdown_counts_the_contractions_by_dtype_and_ranks_memory_bound_time(mixed_mlps):
    from benchlib.calibration import op_type_breakdown
    from tflms.profiles import get_profile
    graph, _ = Steps().graph("mlp-tiny-amp-fp16", "plain", BATCH)
    parts = op_type_breakdown(graph, get_profile("a100-80gb-sxm4"), top=3)
    assert parts["contractions"] == {"MatMul float16": 14}
    ranked = parts["memory_bound_by_type"]
    assert len(ranked) == 3 and [s for _, _, s in ranked] == sorted((s for _, _, s in ranked), reverse=True)
    assert all(n >= 1 and s > 0 for _, n, s in ranked) and parts["memory_bound_bytes"] > 0
