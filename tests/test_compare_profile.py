"""The H100 and H200 measured by tools/gpu_probe.py (docs/profiles/*.json) against the profiles the cost model uses,
through tools/compare_profile.py, and the convolution efficiency fitted from them (issue 28, part 5)."""

import dataclasses
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import compare_profile  # noqa: E402
import gpu_probe  # noqa: E402

PROFILES = ROOT / "docs" / "profiles"


def _probe(name: str) -> dict:
    return json.loads((PROFILES / name).read_text())


#: the two H100 runs with --conv-layers, which the profile's conv_efficiency is fitted to
CONV_RUNS = ("h100-80gb-hbm3-conv-layers.json", "h100-80gb-hbm3-elementwise.json")


@pytest.fixture(scope="module")
def h100():
    return compare_profile.compare(_probe(CONV_RUNS[0]), ["h100-80gb-sxm5"], fit_conv=True,
                                   also=[_probe(CONV_RUNS[1])])


def _row(result, figure):
    [row] = [r for r in result["rows"] if r["figure"] == figure]
    return row


def test_every_committed_probe_names_its_device_driver_and_date():
    files = sorted(PROFILES.glob("*.json"))
    assert {f.name for f in files} >= {"h100-80gb-hbm3.json", *CONV_RUNS, "h200.json"}
    for path in files:
        probe = json.loads(path.read_text())
        assert probe["tool"] in ("tools/gpu_probe.py", "tools/gpu_step.py"), path
        assert probe["date"] and probe["device"]["driver"], path
        assert probe["device"]["name"].startswith("NVIDIA H"), path


def test_the_matched_profiles_predict_the_measured_products_copies_and_host_link_within_10_percent():
    for name, profile in (("h100-80gb-hbm3.json", "h100-80gb-sxm5"), ("h200.json", "h200-141gb")):
        result = compare_profile.compare(_probe(name))
        assert result["profiles"][0] == profile  # profile_for_device matched the device
        for figure in ("matmul tf32", "matmul fp16", "matmul bf16", "device copy", "host h2d pinned",
                       "host d2h pinned"):
            ratio = _row(result, figure)[profile]["ratio"]
            assert 0.9 <= ratio <= 1.1, (name, figure, ratio)


def test_resnet50_convolutions_were_priced_too_fast_at_the_products_efficiency_and_are_within_30_percent_now():
    """One efficiency for both dtypes: BF16 convolutions reach less of their peak than TF32 ones (fits 0.173 and
    0.250), so each dtype alone is off by up to a quarter; before, both were 2x to 3.3x too fast."""
    from tflms.profiles import get_profile
    before = dataclasses.replace(get_profile("h100-80gb-sxm5"), conv_efficiency=None, contraction_latency_s=0.0)
    for name in CONV_RUNS:
        result = compare_profile.compare(_probe(name), ["h100-80gb-sxm5"])
        for dtype in ("float32", "bfloat16"):
            ratio = _row(result, f"ResNet-50 convs {dtype}")["h100-80gb-sxm5"]["ratio"]
            assert 0.75 <= ratio <= 1.3, (name, dtype, ratio)
        layers = _probe(name)["measurements"]["conv_layers"]
        for dtype, times in compare_profile.conv_layer_times(layers, before).items():
            assert times["measured_s"] / times["predicted_s"] > 2.0, (name, dtype)


def test_element_wise_ops_are_priced_within_15_percent_and_reductions_are_not():
    """What a recompute plan re-runs most (activations, normalisation arithmetic, residual adds) is priced at
    HBM bandwidth as measured; a per-channel reduction runs at a third of it (not modelled: docs/results.md)."""
    result = compare_profile.compare(_probe("h100-80gb-hbm3-elementwise.json"))
    for dtype in ("float32", "bfloat16"):
        for op in ("relu", "add", "mul"):
            assert 0.85 <= _row(result, f"{op} {dtype}")["h100-80gb-sxm5"]["ratio"] <= 1.15, (op, dtype)
        assert _row(result, f"sum {dtype}")["h100-80gb-sxm5"]["ratio"] > 2.0, dtype


def test_the_profiles_conv_efficiency_is_the_fit_to_the_committed_measurement(h100):
    from tflms.profiles import get_profile
    assert h100["conv_efficiency"]["h100-80gb-sxm5"]["all"] == pytest.approx(
        get_profile("h100-80gb-sxm5").conv_efficiency, abs=0.002)
    fits = h100["conv_efficiency"]["h100-80gb-sxm5"]
    assert fits["bfloat16"] < fits["all"] < fits["float32"]


def test_conv_efficiency_prices_convolutions_only():
    import tensorflow as tf
    from tflms.profiles import get_profile
    profile = get_profile("h100-80gb-sxm5")
    spec = tf.TensorSpec((4096, 4096), tf.bfloat16)
    product = compare_profile._graph(tf.matmul, spec, spec)
    assert compare_profile._priced(product, "MatMul", profile) == pytest.approx(
        compare_profile._priced(product, "MatMul", dataclasses.replace(profile, conv_efficiency=None)))
    conv = compare_profile._graph(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
                                  tf.TensorSpec((64, 14, 14, 1024), tf.bfloat16),
                                  tf.TensorSpec((3, 3, 1024, 1024), tf.bfloat16))
    slow, fast = (compare_profile._priced(conv, "Conv2D", p) for p in (profile, dataclasses.replace(
        profile, conv_efficiency=None)))
    fixed = profile.launch_overhead_s + profile.contraction_latency_s
    assert slow - fixed == pytest.approx((fast - fixed) * 0.81 / profile.conv_efficiency)


def test_conv_efficiency_out_of_range_is_refused():
    from tflms.errors import ConfigError
    from tflms.profiles import get_profile
    with pytest.raises(ConfigError, match="conv_efficiency must be in"):
        dataclasses.replace(get_profile("h100-80gb-sxm5"), conv_efficiency=1.5)


def test_the_conv_layer_probe_takes_each_layers_faster_layout():
    """The stand-in runs channels-first 1.5x slower: the totals are at its channels-last rate."""
    result = gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0), copy_bytes=2**20, matmul_n=256, repeats=1,
                           conv_layers=True)
    layers = result["measurements"]["conv_layers"]
    assert len(layers["layers"]) == 2 * 2 * len(gpu_probe.RESNET50_CONVS)
    assert layers["training_flops"]["bfloat16"] == pytest.approx(750e12)
    assert layers["training_flops"]["float32"] == pytest.approx(50e12)
    assert "ResNet-50's 13 stride-1 convolutions" in gpu_probe.table(result)


def test_the_tool_refuses_a_file_that_is_no_probe(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"name": "h100"}')
    with pytest.raises(SystemExit):
        compare_profile.main([str(bad)])
    assert "not a tools/gpu_probe.py JSON file" in capsys.readouterr().err


def test_the_elementwise_probe_counts_bytes_read_and_written():
    """The stand-in runs every element-wise op at its HBM rate: each rate comes back as that rate."""
    result = gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0, hbm_gbps=2500.0), copy_bytes=2**20, matmul_n=256,
                           repeats=1, elementwise=True)
    rates = result["measurements"]["elementwise_gbps"]
    assert rates["shape"] == list(gpu_probe.ELEMENTWISE_SHAPE)
    assert all(rates[f"{op} {dt}"] == pytest.approx(2500.0) for op in gpu_probe.ELEMENTWISE_OPS
               for dt in ("float32", "bfloat16"))
    elements = 64 * 56 * 56 * 256
    assert gpu_probe.elementwise_bytes("add", gpu_probe.ELEMENTWISE_SHAPE, "float32") == 3 * elements * 4
    assert gpu_probe.elementwise_bytes("sum", gpu_probe.ELEMENTWISE_SHAPE, "bfloat16") == (elements + 256) * 2


def test_small_products_are_priced_within_25_percent_with_the_contraction_latency():
    """1024^3 to 4096^3 products (gpu_probe --matmul-n) ran up to 3x slower than the roofline and the launch
    overhead said; the profile's contraction_latency_s (fitted to them) brings every one within 25%."""
    import math
    from tflms.profiles import get_profile
    profile = get_profile("h100-80gb-sxm5")
    assert profile.contraction_latency_s == pytest.approx(14.5e-6)
    logs = []
    for n in (1024, 2048, 4096):
        result = compare_profile.compare(_probe(f"h100-80gb-hbm3-n{n}.json"), ["h100-80gb-sxm5"])
        for mode in ("bf16", "tf32"):
            ratio = _row(result, f"matmul {mode}")["h100-80gb-sxm5"]["ratio"]
            assert 0.75 <= ratio <= 1.25, (n, mode, ratio)
            logs.append(math.log(ratio))
    assert abs(sum(logs) / len(logs)) < 0.05  # the fit: predicted over measured averages 1
    small = _probe("h100-80gb-hbm3-n1024.json")["measurements"]
    before = compare_profile.predictions(small, dataclasses.replace(profile, contraction_latency_s=0.0))
    assert before["matmul bf16"] > 2.5 * small["matmul_flops"]["bf16"]  # 2.7x too fast without it


def _batchnorm_probe(**stand_in) -> dict:
    return gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0, device_name="NVIDIA H100 80GB HBM3", **stand_in),
                         copy_bytes=2**20, matmul_n=256, repeats=1, batchnorm=True)


def test_batch_norm_is_priced_as_the_fused_ops_and_the_ratio_is_measured_over_predicted():
    """Each layer at its faster layout (the stand-in's channels-last) against FusedBatchNormV3 and
    FusedBatchNormGradV3 on the matched profile: twice the measured time is twice the ratio."""
    import math
    from tflms.profiles import get_profile
    probe = _batchnorm_probe(hbm_gbps=3000.0)
    result = compare_profile.compare(probe, ["h100-80gb-sxm5"])
    rows = result["batchnorm"]["h100-80gb-sxm5"]["layers"]
    assert len(rows) == 2 * len(gpu_probe.RESNET50_BATCHNORMS)
    assert {row["layout"] for row in rows} == {"nhwc"}
    profile = get_profile("h100-80gb-sxm5")
    for row in rows:
        for which in ("forward", "backward"):
            times = row[which]
            assert times["ratio"] == pytest.approx(times["measured_s"] / times["predicted_s"])
            bytes_ = gpu_probe.batchnorm_bytes(tuple(row["shape"]), row["dtype"], which)
            assert times["measured_s"] == pytest.approx(bytes_ / 3000e9)
    # the model prices the activation-sized tensors a training-mode kernel moves (forward: x twice and y;
    # backward: x and dy twice and dx: tflms.sim.cost.TWO_PASS_INPUTS), at the profile's memory rate, bfloat16 at
    # 2 bytes an element: the probe's own count
    [big] = [row for row in rows if row["shape"] == [64, 256, 56] and row["dtype"] == "bfloat16"]
    elements = 64 * 256 * 56 * 56
    assert big["forward"]["predicted_s"] == pytest.approx(
        profile.launch_overhead_s + 3 * elements * 2 / profile.effective_memory_bytes_per_s, rel=0.01)
    assert big["backward"]["predicted_s"] == pytest.approx(
        profile.launch_overhead_s + 5 * elements * 2 / profile.effective_memory_bytes_per_s, rel=0.01)
    means = result["batchnorm"]["h100-80gb-sxm5"]["geomean_ratio"]
    for dtype in ("float32", "bfloat16"):
        ratios = [row[which]["ratio"] for row in rows if row["dtype"] == dtype for which in ("forward", "backward")]
        assert means[dtype]["all"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))

    slower = compare_profile.compare(_batchnorm_probe(hbm_gbps=1500.0), ["h100-80gb-sxm5"])
    for fast, slow in zip(rows, slower["batchnorm"]["h100-80gb-sxm5"]["layers"]):
        assert fast["shape"] == slow["shape"] and fast["dtype"] == slow["dtype"]
        for which in ("forward", "backward"):
            assert slow[which]["ratio"] == pytest.approx(2 * fast[which]["ratio"])
    assert slower["batchnorm"]["h100-80gb-sxm5"]["geomean_ratio"]["float32"]["backward"] == pytest.approx(
        2 * means["float32"]["backward"])
    text = compare_profile.table(result)
    assert "| (64, 256, 56) | bfloat16 | backward |" in text
    assert "h100-80gb-sxm5: batch norm measured / predicted, geometric mean: float32 forward" in text


def test_a_failed_batch_norm_layer_is_left_out_of_the_comparison_and_shown():
    probe = _batchnorm_probe()
    [layer] = [layer for layer in probe["measurements"]["batchnorm"]["layers"]
               if layer["shape"] == [64, 2048, 7] and layer["dtype"] == "float32" and layer["layout"] == "nhwc"]
    for key in ("forward_s", "backward_s", "forward_gbps", "backward_gbps"):
        del layer[key]
    layer["error"] = "RuntimeError: cuDNN error"
    result = compare_profile.compare(probe, ["h100-80gb-sxm5"])
    [row] = [row for row in result["batchnorm"]["h100-80gb-sxm5"]["layers"]
             if row["shape"] == [64, 2048, 7] and row["dtype"] == "float32"]
    assert row["layout"] == "nchw"  # the slower layout, the only one measured
    assert "(64, 2048, 7) float32 nhwc failed: RuntimeError: cuDNN error" in compare_profile.table(result)
    assert "batchnorm" not in compare_profile.compare(_probe("h100-80gb-hbm3.json"))


def test_fused_batch_norms_measured_on_the_h100_are_priced_within_20_percent_in_float32():
    """cuDNN's training-mode batch norm reads its activation inputs twice: priced with each read once, the
    committed H100 run was 1.49x slower than predicted (float32, geometric mean of both passes over ResNet-50's
    nine shapes); with :data:`tflms.sim.cost.TWO_PASS_INPUTS` it is within 20%. bfloat16 stays slower than
    priced (PyTorch's bfloat16 forward ran at about 1 TB/s): not modelled."""
    result = compare_profile.compare(_probe("h100-80gb-hbm3-batchnorm.json"), ["h100-80gb-sxm5"])
    means = result["batchnorm"]["h100-80gb-sxm5"]["geomean_ratio"]
    for which in ("forward", "backward", "all"):
        assert 1 / 1.2 <= means["float32"][which] <= 1.2, (which, means["float32"])
    assert means["bfloat16"]["forward"] > 1.5


def _attention_probe(**stand_in) -> dict:
    return gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0, device_name="NVIDIA H100 80GB HBM3", **stand_in),
                         copy_bytes=2**20, matmul_n=256, repeats=1, attention=True, attention_batch=2)


def test_the_attention_chain_is_priced_op_by_op_and_against_the_copies_of_its_tensor():
    """At batch 2: each probed op against the TensorFlow ops traced for it (named after it), the chain against their
    sum, the copies against copy_time_s, and the recompute / copies ratio measured against predicted."""
    import math
    from tflms.profiles import get_profile
    probe = _attention_probe(hbm_gbps=2500.0)
    result = compare_profile.compare(probe, ["h100-80gb-sxm5"])
    assert set(result["attention"]) == {"h100-80gb-sxm5", "measured-h100-80gb-hbm3"}
    assert result["attention_shape"] == {"shape": [2, 12, 512, 64], "dropout_rate": 0.1}
    priced = result["attention"]["h100-80gb-sxm5"]
    profile = get_profile("h100-80gb-sxm5")
    bw, launch = profile.effective_memory_bytes_per_s, profile.launch_overhead_s
    for dtype, w in (("float32", 4), ("bfloat16", 2)):
        rows = priced["dtypes"][dtype]
        entry = probe["measurements"]["attention"]["dtypes"][dtype]
        ops = {op["op"]: op for op in rows["ops"]}
        assert [op["op"] for op in rows["ops"]] == [name for name, _, _ in gpu_probe.ATTENTION_OPS]
        assert ops["uniform"]["tf_ops"] == ["StatelessRandomUniformV2"]  # (grappler folds the * 1 and + 0 after it)
        for op in rows["ops"]:
            assert op["measured_s"] == entry["ops"][op["op"]]["seconds"]
            assert op["ratio"] == pytest.approx(op["measured_s"] / op["predicted_s"])
        e = 2 * 12 * 512 * 512  # elements of a chain tensor
        # element-wise ops at the profile's memory rate: one tensor in and one out, a bool mask 1 byte an element
        assert ops["softmax"]["predicted_s"] == pytest.approx(launch + 2 * e * w / bw, rel=1e-3)
        assert ops["rescale"]["predicted_s"] == pytest.approx(launch + 2 * e * w / bw, rel=1e-3)
        assert ops["mask"]["predicted_s"] == pytest.approx(launch + (e * w + e) / bw, rel=1e-3)
        assert ops["select"]["predicted_s"] == pytest.approx(launch + (e + 2 * e * w) / bw, rel=1e-3)
        # the uniform writes one tensor
        assert ops["uniform"]["predicted_s"] == pytest.approx(launch + e * w / bw, rel=1e-3)
        assert rows["chain"]["predicted_s"] == pytest.approx(sum(op["predicted_s"] for op in rows["ops"]))
        assert rows["chain"]["measured_s"] == entry["chain_s"]
        assert rows["tensor_bytes"] == e * w
        for direction in ("d2h", "h2d"):
            assert rows["copies"][direction]["predicted_s"] == pytest.approx(profile.copy_time_s(e * w))
            assert rows["copies"][direction]["measured_s"] == entry[f"{direction}_s"]
        assert rows["copy"]["predicted_s"] == pytest.approx(2 * profile.copy_time_s(e * w))
        ratio = rows["recompute_over_copy"]
        assert ratio["measured"] == pytest.approx(entry["chain_s"] / (entry["d2h_s"] + entry["h2d_s"]))
        assert ratio["predicted"] == pytest.approx(rows["chain"]["predicted_s"] / rows["copy"]["predicted_s"])
        assert ratio["ratio"] == pytest.approx(ratio["measured"] / ratio["predicted"])
        assert priced["geomean_ratio"][dtype] == pytest.approx(
            math.exp(sum(math.log(op["ratio"]) for op in rows["ops"]) / len(rows["ops"])))
    # float32 scores are priced as TensorFlow runs them, at TF32: memory-bound here, where FP32 would be compute-bound
    scores = {op["op"]: op for op in priced["dtypes"]["float32"]["ops"]}["scores"]
    scores_bytes = (2 * 2 * 12 * 512 * 64 + 2 * 12 * 512 * 512) * 4
    assert scores["predicted_s"] == pytest.approx(launch + profile.contraction_latency_s + scores_bytes / bw, rel=1e-3)
    fp32 = 2 * 2 * 12 * 512 * 512 * 64 / profile.with_tf32(False).contraction_flops_per_s("float32")
    assert fp32 > scores_bytes / bw

    # half the HBM rate: every op and the chain take twice as long against the same prices, the copies do not move
    slower = compare_profile.compare(_attention_probe(hbm_gbps=1250.0), ["h100-80gb-sxm5"])["attention"]
    for dtype in ("float32", "bfloat16"):
        fast, slow = priced["dtypes"][dtype], slower["h100-80gb-sxm5"]["dtypes"][dtype]
        for a, b in zip(fast["ops"], slow["ops"]):
            assert a["op"] == b["op"] and b["ratio"] == pytest.approx(2 * a["ratio"])
        assert slow["chain"]["ratio"] == pytest.approx(2 * fast["chain"]["ratio"])
        assert slow["copy"]["ratio"] == pytest.approx(fast["copy"]["ratio"])
        assert slow["recompute_over_copy"]["ratio"] == pytest.approx(2 * fast["recompute_over_copy"]["ratio"])
        assert slower["h100-80gb-sxm5"]["geomean_ratio"][dtype] == pytest.approx(2 * priced["geomean_ratio"][dtype])
    text = compare_profile.table(result)
    assert "attention chain (batch 2, 12 heads, sequence 512, head size 64, dropout 0.1)" in text
    assert "| bfloat16 | uniform (StatelessRandomUniformV2) |" in text
    f32 = priced["dtypes"]["float32"]["recompute_over_copy"]
    assert (f"| float32 | recompute / copies | {f32['measured']:.3f} | {f32['predicted']:.3f} "
            f"({f32['ratio']:.2f}) |") in text
    assert "h100-80gb-sxm5: attention ops measured / predicted, geometric mean: float32" in text
    json.dumps(result)


def test_the_traced_attention_ops_carry_the_probes_names_and_drift_is_refused():
    graph = compare_profile._traced("attention", (2, 12, 512, 64), "bfloat16")
    for name, _, op_types in gpu_probe.ATTENTION_OPS:
        ops = compare_profile.attention_ops(graph, name, op_types)
        assert sorted(op.type for op in ops) == sorted(op_types)
        assert all(op.outputs[0].shape == (2, 12, 512, 512) and op.outputs[0].dtype == "bfloat16"
                   for op in ops if op.type != "GreaterEqual")
        if name != "uniform":
            assert [op.name for op in ops] == [name]
    uniform = [op.type for op in graph if op.name.startswith("uniform/") and op.outputs
               and op.outputs[0].shape == (2, 12, 512, 512)]  # traced, and left out: grappler folds the * 1 and + 0
    assert sorted(uniform) == ["Mul", "StatelessRandomUniformV2"]
    [mask] = compare_profile.attention_ops(graph, "mask", ("GreaterEqual",))
    assert mask.outputs[0].dtype == "bool"
    with pytest.raises(ValueError, match="not gpu_probe.ATTENTION_OPS"):
        compare_profile.attention_ops(graph, "softmax", ("Softmax", "Exp"))


def test_a_failed_or_unmeasured_attention_chain_is_shown_and_left_out():
    probe = _attention_probe()
    probe["measurements"]["attention"]["dtypes"]["bfloat16"] = {"error": "RuntimeError: CUDA out of memory"}
    result = compare_profile.compare(probe, ["h100-80gb-sxm5"])
    assert set(result["attention"]["h100-80gb-sxm5"]["dtypes"]) == {"float32"}
    assert "attention bfloat16: not measured: RuntimeError: CUDA out of memory" in compare_profile.table(result)
    probe["measurements"]["attention"] = {"not_measured": "cupy has no attention chain"}
    result = compare_profile.compare(probe, ["h100-80gb-sxm5"])
    assert "attention" not in result
    assert "attention all: not measured: cupy has no attention chain" in compare_profile.table(result)
    assert "attention" not in compare_profile.compare(_probe("h100-80gb-hbm3.json"))
