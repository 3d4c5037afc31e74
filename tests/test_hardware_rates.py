"""Issue 28: today's GPUs priced by dtype and op class, every figure cited, and TensorFlow's pinned-memory cap.

The targets: an 8192^3 bfloat16 MatMul on h100-80gb-sxm5 within 25% of the 798 TFLOP/s measured on an
H100 80GB HBM3, an HBM-bound copy within 25% of 3.0 TB/s, a float32 MatMul at the TF32 rate by default
and at FP32 with TF32 off, and a plan over the pinned-memory limit refused before anything runs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import tflms
from tflms.errors import ConfigError, HostMemoryError
from tflms.profiles import (MATH_BF16, MATH_FP16, MATH_FP32, MATH_TF32, HardwareProfile, get_profile,
                            profile_for_device, profile_names)
from tflms.sim import simulate
from tflms.sim.cost import op_math_mode, op_time_s
from tflms.sim.hostmem import DEFAULT_PINNED_LIMIT_MB, PINNED_LIMIT_ENV, check_pinned_host_bytes, pinned_host_limit
from tflms.testing import GraphBuilder, mlp_training_graph

N = 8192
MEASURED_H100_BF16_FLOPS = 798e12  # issue 28: PyTorch, 8192^3 bf16 product, mean of ten after warm-up
MEASURED_H100_COPY_BYTES_PER_S = 3.0e12  # issue 28: device-to-device copy, bytes read plus written
NEW_PROFILES = ("a100-40gb-pcie4", "a100-80gb-sxm4", "h100-80gb-sxm5", "h100-80gb-pcie5", "h200-141gb", "gh200")


def _traced(fn, *specs):
    """The IR of a traced tf.function (what tflms prices in a real step)."""
    import tensorflow as tf
    from tflms.ir.tf_io import load_graph
    return load_graph(tf.function(fn).get_concrete_function(*specs))


def _op(graph, op_type):
    [op] = [op for op in graph if op.type == op_type]
    return op


@pytest.fixture(scope="module")
def matmuls():
    import tensorflow as tf
    return {dtype: _traced(tf.matmul, tf.TensorSpec((N, N), dtype), tf.TensorSpec((N, N), dtype))
            for dtype in (tf.bfloat16, tf.float16, tf.float32)}


def _matmul_flops_per_s(graph, profile) -> float:
    return 2 * N**3 / op_time_s(graph, _op(graph, "MatMul"), profile)


def test_bf16_matmul_on_h100_sxm5_is_within_25_percent_of_the_measured_rate(matmuls):
    import tensorflow as tf
    graph, profile = matmuls[tf.bfloat16], get_profile("h100-80gb-sxm5")
    assert op_math_mode(graph, _op(graph, "MatMul"), profile) == MATH_BF16
    rate = _matmul_flops_per_s(graph, profile)
    assert abs(rate / MEASURED_H100_BF16_FLOPS - 1) <= 0.25, f"predicted {rate / 1e12:.1f} TFLOP/s"
    # before issue 28 every FLOP was priced at the FP32 rate: 26x too slow on the PCIe profile
    assert rate > 10 * get_profile("h100-80gb-sxm5").effective_flops


def test_hbm_bound_copy_on_h100_sxm5_is_within_25_percent_of_the_measured_bandwidth():
    import tensorflow as tf
    graph = _traced(lambda x: tf.raw_ops.DeepCopy(x=x), tf.TensorSpec((N, N), tf.float32))
    copy = _op(graph, "DeepCopy")
    moved = 2 * N * N * 4  # read plus written
    rate = moved / op_time_s(graph, copy, get_profile("h100-80gb-sxm5"))
    assert abs(rate / MEASURED_H100_COPY_BYTES_PER_S - 1) <= 0.25, f"predicted {rate / 1e12:.2f} TB/s"
    assert op_math_mode(graph, copy, get_profile("h100-80gb-sxm5")) is None  # no contraction: memory-bound


def test_float32_matmul_is_priced_at_tf32_by_default_and_at_fp32_with_tf32_off(matmuls):
    import tensorflow as tf
    graph, profile = matmuls[tf.float32], get_profile("h100-80gb-sxm5")
    op = _op(graph, "MatMul")
    assert profile.tf32_enabled and op_math_mode(graph, op, profile) == MATH_TF32
    off = profile.with_tf32(False)
    assert op_math_mode(graph, op, off) == MATH_FP32
    fixed = profile.launch_overhead_s + profile.contraction_latency_s  # (the measured small-product latency)
    assert op_time_s(graph, op, profile) - fixed == pytest.approx(2 * N**3 / (494.5e12 * 0.81))
    assert op_time_s(graph, op, off) - fixed == pytest.approx(2 * N**3 / (67e12 * 0.81))
    # float16 at the FP16 tensor-core rate; TF32 changes nothing for it
    half = matmuls[tf.float16]
    assert op_math_mode(half, _op(half, "MatMul"), off) == MATH_FP16
    assert _matmul_flops_per_s(half, off) == _matmul_flops_per_s(half, profile)


def test_v100_float32_pricing_is_the_pre_issue_28_roofline(matmuls):
    """V100 has no TF32: a float32 step costs what it did (docs/results.md's V100 rows must not move)."""
    import tensorflow as tf
    graph = matmuls[tf.float32]
    for name in ("v100-16gb-pcie3", "v100-16gb-nvlink2", "v100-32gb-nvlink2"):
        p = get_profile(name)
        for op in graph:
            if op.type in ("MatMul",):
                from tflms.sim.cost import op_bytes, op_flops
                old = p.launch_overhead_s + max(op_flops(graph, op) / (p.peak_flops * p.compute_efficiency),
                                                op_bytes(graph, op) / (p.memory_gbps * 1e9 * p.compute_efficiency))
                assert op_time_s(graph, op, p) == old
                assert op_time_s(graph, op, p.with_tf32(False)) == old
    # float16 reaches V100's tensor cores; bfloat16 has none there (FP32 rate)
    v100 = get_profile("v100-16gb-pcie3")
    assert (v100.math_mode("float16"), v100.math_mode("bfloat16"), v100.math_mode("float32")) == (
        MATH_FP16, MATH_FP32, MATH_FP32)


def test_contraction_classes_follow_the_dtype_of_the_output():
    """Conv2DBackpropInput's first input is a shape (int32): its math mode comes from its output's dtype."""
    b = GraphBuilder()
    sizes = b.op("sizes", "Const", shape=(4,), dtype="int32")
    w = b.op("w", "Placeholder", shape=(3, 3, 8, 8), dtype="bfloat16")
    dy = b.op("dy", "Placeholder", shape=(2, 8, 8, 8), dtype="bfloat16")
    b.op("dx", "Conv2DBackpropInput", [sizes, w, dy], shape=(2, 8, 8, 8), dtype="bfloat16")
    b.op("dw", "DepthwiseConv2dNative", [dy, w], shape=(2, 8, 8, 8), dtype="bfloat16")
    h100 = get_profile("h100-80gb-sxm5")
    assert op_math_mode(b.graph, b.graph.op("dx"), h100) == MATH_BF16
    assert op_math_mode(b.graph, b.graph.op("dw"), h100) is None  # depthwise: CUDA cores, not a contraction


# ------------------------------------------------------------------ profiles: figures and sources
@pytest.mark.parametrize("name", NEW_PROFILES)
def test_every_figure_of_the_new_profiles_has_a_source(name):
    p = get_profile(name)
    for field in ("memory_bytes", "peak_flops", "tf32_flops", "fp16_flops", "bf16_flops", "memory_gbps",
                  "link_gbps", "contraction_efficiency", "memory_efficiency", "host_memory_bytes",
                  "compute_efficiency", "link_efficiency", "link_latency_s", "launch_overhead_s"):
        source = p.source_of(field)
        assert source, f"{name}.{field} ({getattr(p, field)!r}) cites no source"
    for field in ("peak_flops", "tf32_flops", "fp16_flops", "bf16_flops", "memory_gbps"):
        assert "NVIDIA" in p.source_of(field) and "datasheet" in p.source_of(field), (name, field)
    assert "measured" in p.source_of("contraction_efficiency") and "measured" in p.source_of("memory_efficiency")
    # tensor cores: BF16 = FP16 = 2 x TF32 (the datasheets round: 989.5 against 2 x 494.5), far above FP32
    assert p.bf16_flops == p.fp16_flops == pytest.approx(2 * p.tf32_flops, rel=0.002)
    assert p.tf32_flops > 5 * p.peak_flops


def test_profiles_the_issue_asks_for_are_registered_and_v100s_kept():
    assert set(NEW_PROFILES) | {"v100-16gb-pcie3", "v100-16gb-nvlink2", "v100-32gb-nvlink2"} <= set(profile_names())
    sxm5, h200 = get_profile("h100-80gb-sxm5"), get_profile("h200-141gb")
    assert (sxm5.memory_gbps, sxm5.link_gbps, sxm5.bf16_flops) == (3350, 63, 989.5e12)
    assert (h200.memory_bytes, h200.memory_gbps) == (141 * 2**30, 4800)
    assert get_profile("gh200").link_gbps == 450  # NVLink-C2C, per direction


def test_a_profile_round_trips_through_json():
    for name in profile_names():
        p = get_profile(name)
        again = HardwareProfile.from_dict(json.loads(json.dumps(p.to_dict())))
        assert again == p and again.sources == p.sources
    with pytest.raises(ConfigError, match=r"unknown fields \['bf16_tflops'\]"):
        HardwareProfile.from_dict({**get_profile("gh200").to_dict(), "bf16_tflops": 990})
    with pytest.raises(ConfigError, match=r"missing fields \['link_gbps'\]"):
        HardwareProfile.from_dict({"name": "x", "memory_bytes": "1GiB", "peak_flops": 1e12, "memory_gbps": 10})


@pytest.mark.parametrize("changes, message", [
    ({"tf32_flops": -1.0}, "tf32_flops must be a number > 0"),
    ({"memory_efficiency": 1.5}, r"memory_efficiency must be in \(0, 1\]"),
    ({"sources": {"bf16_tflops": "a datasheet"}}, r"sources cite unknown fields \['bf16_tflops'\]"),
    ({"tf32_enabled": "yes"}, "tf32_enabled must be True or False"),
])
def test_bad_profile_figures_are_refused_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(get_profile("h100-80gb-sxm5"), **changes)


@pytest.mark.parametrize("device_name, memory, expected", [
    ("NVIDIA A100-SXM4-80GB", 79 * 2**30, "a100-80gb-sxm4"),
    ("NVIDIA A100-SXM4-40GB", None, "a100-40gb-pcie4"),  # closest memory first, then the form factor
    ("NVIDIA A100-PCIE-40GB", 39 * 2**30, "a100-40gb-pcie4"),
    ("NVIDIA A100 80GB PCIe", 79 * 2**30, "a100-80gb-pcie4"),
    ("NVIDIA H100 80GB HBM3", 79 * 2**30, "h100-80gb-sxm5"),  # what an H100 SXM5 calls itself
    ("NVIDIA H100 PCIe", 79 * 2**30, "h100-80gb-pcie5"),
    ("NVIDIA H200", 140 * 2**30, "h200-141gb"),
    ("NVIDIA GH200 480GB", 95 * 2**30, "gh200"),
])
def test_todays_gpus_match_their_profile(device_name, memory, expected):
    assert profile_for_device(device_name, memory).name == expected


# ------------------------------------------------------------------ TF32 follows TensorFlow; the report says
def _tuned_report(**options):
    graph = mlp_training_graph(8, batch=256, width=1024)
    budget = simulate(graph, "h100-80gb-sxm5").peak_with_margin_bytes - 1
    return tflms.rewrite(graph, budget=budget, profile="h100-80gb-sxm5", **options).report


def test_the_report_says_which_math_mode_float32_contractions_were_priced_at():
    import tensorflow as tf
    from tflms.pipeline import priced_profile
    assert "float32 at TF32" in _tuned_report().hardware["math"]
    off = _tuned_report(tf32=False)
    assert "float32 at FP32" in off.hardware["math"] and "TF32 off" in off.hardware["math"]
    assert "float32 at FP32" in off.table()
    was = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        tf.config.experimental.enable_tensor_float_32_execution(False)
        assert not priced_profile("h100-80gb-sxm5").tf32_enabled  # None follows TensorFlow
        assert priced_profile("h100-80gb-sxm5", True).tf32_enabled  # given wins
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(was)
    assert priced_profile("h100-80gb-sxm5").tf32_enabled == was
    with pytest.raises(ConfigError, match="tf32 must be None"):
        tflms.LMSConfig(tf32="on")


# ------------------------------------------------------------------ pinned host memory
def test_the_pinned_limit_is_the_variable_or_tensorflows_default():
    assert DEFAULT_PINNED_LIMIT_MB == 131072  # gpu_process_state.cc: 1LL << 17 MiB (128 GiB)
    assert pinned_host_limit({}).limit_bytes == 128 * 2**30
    assert "unset" in pinned_host_limit({}).source
    assert pinned_host_limit({PINNED_LIMIT_ENV: "4096"}).limit_bytes == 4 * 2**30
    with pytest.raises(ConfigError, match=f"{PINNED_LIMIT_ENV}='4GB' is not a whole number of MiB"):
        pinned_host_limit({PINNED_LIMIT_ENV: "4GB"})


def test_a_plan_over_the_pinned_limit_names_the_variable_the_bytes_and_the_fix():
    limit = pinned_host_limit({PINNED_LIMIT_ENV: "1"})
    assert check_pinned_host_bytes(2**20, limit) is limit  # at the limit: fine
    with pytest.raises(HostMemoryError) as err:
        check_pinned_host_bytes(3 * 2**20 + 1, limit)
    text = str(err.value)
    assert "3145729 bytes" in text and f"{PINNED_LIMIT_ENV}=1)" in text and f"{PINNED_LIMIT_ENV}=4 " in text
    assert "pinned memory" in text and "gpu_host_bfc" in text


def test_the_pipeline_refuses_a_tuned_plan_over_the_pinned_limit_before_anything_runs(monkeypatch):
    """On this CPU machine: the plan is for the GPU of the profile, whose swaps TensorFlow would pin."""
    report = _tuned_report()
    assert report.num_swapped > 0 and "pinned host memory" in report.hardware["pinned_host"]
    assert f"{PINNED_LIMIT_ENV} unset" in report.table()
    monkeypatch.setenv(PINNED_LIMIT_ENV, "0")
    with pytest.raises(HostMemoryError, match=f"{PINNED_LIMIT_ENV}=0"):
        _tuned_report()


def test_the_pipeline_refuses_a_rule_plan_over_the_pinned_limit(monkeypatch):
    graph = mlp_training_graph(8, batch=256, width=1024)  # 7 swaps of 1 MiB each
    ok = tflms.rewrite(graph, accelerator_device="/device:GPU:0", swapout_threshold=4).report
    assert ok.num_swapped == 7 and "every swapped tensor at once" in ok.hardware["pinned_host"]
    monkeypatch.setenv(PINNED_LIMIT_ENV, "1")  # 1 MiB: the sum (7 MiB) is over, so the host peak is simulated
    with pytest.raises(HostMemoryError, match="simulated host peak") as err:
        tflms.rewrite(graph, accelerator_device="/device:GPU:0", swapout_threshold=4)
    assert f"{PINNED_LIMIT_ENV}=1)" in str(err.value)
    # on the host itself nothing is pinned: no check
    cpu = tflms.rewrite(graph, accelerator_device="/device:CPU:1", swapout_threshold=4).report
    assert "pinned_host" not in cpu.hardware


def test_price_ops_tool_prints_the_targets_figures():
    """tools/price_ops.py, the command docs/design.md gives for the predicted rates."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parent.parent / "tools" / "price_ops.py"
    spec = importlib.util.spec_from_file_location("price_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    h100, v100 = module.price(["h100-80gb-sxm5", "v100-16gb-pcie3"])
    assert (h100["matmul_bf16_mode"], h100["matmul_fp32_tf32_on_mode"], h100["matmul_fp32_tf32_off_mode"]) == (
        "bf16", "tf32", "fp32")
    assert h100["matmul_bf16_tflops"] == 790.3 and h100["copy_tb_per_s"] == 2.93
    assert v100["matmul_fp32_tf32_on_mode"] == "fp32"  # no TF32 on a V100
