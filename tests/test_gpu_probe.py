"""tools/gpu_probe.py without a GPU: a stand-in device layer with known rates (issue 28, part 5)."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import gpu_probe  # noqa: E402

MIB = 2**20


def _run(**stand_in):
    return gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0, **stand_in), copy_bytes=64 * MIB, matmul_n=4096,
                         repeats=3)


def test_the_probe_recovers_the_rates_it_was_given():
    result = _run(h2d_gbps=25.0, d2h_gbps=20.0, pageable_fraction=0.4, hbm_gbps=3000.0)
    m = result["measurements"]
    assert m["link_gbps"]["h2d_pinned"] == pytest.approx(25.0)
    assert m["link_gbps"]["d2h_pageable"] == pytest.approx(8.0)
    assert m["link_gbps"]["both_pinned"] == pytest.approx(2 * 20.0 * 0.8)  # two copies in the slower one's time
    assert m["matmul_flops"]["bf16"] == pytest.approx(750e12)
    assert m["matmul_flops"]["tf32"] == pytest.approx(380e12)
    assert m["hbm_gbps"] == pytest.approx(3000.0)  # read + written
    assert m["conv_flops"]["float32"] == pytest.approx(50e12)


def test_overlap_says_how_much_a_copy_slows_under_a_product():
    m = _run(overlap_slowdown=1.25)["measurements"]
    assert m["overlap"]["h2d"]["product"] == "bf16"
    assert m["overlap"]["h2d"]["copy_vs_alone"] == pytest.approx(1.25)
    assert m["overlap"]["d2h"]["product_vs_alone"] == pytest.approx(1.0)


def test_the_profile_takes_the_slower_pinned_direction_and_every_measured_rate():
    result = _run(h2d_gbps=50.0, d2h_gbps=40.0)
    profile = result["profile"]
    assert profile["link_gbps"] == pytest.approx(40.0)
    assert profile["peak_flops"] == pytest.approx(50e12)
    assert profile["tf32_flops"] == pytest.approx(380e12) and profile["bf16_flops"] == pytest.approx(750e12)
    assert profile["memory_bytes"] == 80 * 2**30
    assert profile["name"] == "measured-stand-in-gpu"
    assert "Stand-in GPU" in profile["description"] and "median of 3" in profile["description"]
    assert set(profile["sources"]) == {"peak_flops", "memory_gbps", "link_gbps", "tf32_flops", "fp16_flops",
                                       "bf16_flops"}
    json.dumps(result)  # all of it is JSON


def test_a_rate_the_library_cannot_measure_is_said_not_faked():
    class NoBf16(gpu_probe.StandInBackend):
        def matmul_s(self, n, mode, repeats):
            if mode == "bf16":
                raise NotImplementedError("no bfloat16 product here")
            return super().matmul_s(n, mode, repeats)

    result = gpu_probe.run(NoBf16(), copy_bytes=MIB, matmul_n=256, repeats=1)
    m = result["measurements"]
    assert m["matmul_flops"]["bf16"] is None and "bfloat16" in m["not_measured"]["matmul_bf16"]
    assert m["overlap"]["h2d"]["product"] == "fp16"  # overlapped with a product that was measured
    assert "bf16_flops" not in result["profile"] and "bf16_flops" not in result["profile"]["sources"]
    assert "bf16 -" in gpu_probe.table(result)


def test_table_and_cli_errors():
    text = gpu_probe.table(_run())
    assert "pinned" in text and "pageable" in text and "HBM" in text
    with pytest.raises(SystemExit):
        gpu_probe.main(["--repeats", "0"])


def test_without_a_gpu_the_probe_says_what_it_needs():
    with pytest.raises(SystemExit, match="NVIDIA GPU with PyTorch or CuPy"):
        gpu_probe.make_backend("auto")


def test_tflms_loads_the_probes_json_as_a_profile(tmp_path):
    """LMSConfig(profile=path), the CLI's --profile path: the probe's JSON is a profile the simulator prices with."""
    from tflms.config import LMSConfig
    from tflms.errors import ConfigError
    from tflms.profiles import get_profile, select_profile
    from tflms.sim.cost import op_time_s
    from tflms.testing import GraphBuilder

    result = _run(h2d_gbps=50.0, d2h_gbps=40.0, hbm_gbps=3000.0)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(result))
    config = LMSConfig(profile=str(path), budget="1GiB")
    profile = get_profile(config.profile)
    assert profile.name == "measured-stand-in-gpu" and profile.link_gbps == pytest.approx(40.0)
    assert profile.copy_time_s(40 * 10**9) == pytest.approx(1.0 + profile.link_latency_s)  # efficiency 1: as measured
    choice = select_profile(str(path), None)
    assert choice.name == profile.name and str(path) in choice.why
    # a bfloat16 product is priced at the measured bf16 rate
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(4096, 4096), dtype="bfloat16")
    w = b.op("w", "Placeholder", shape=(4096, 4096), dtype="bfloat16")
    mm = b.op("mm", "MatMul", [x, w], shape=(4096, 4096), dtype="bfloat16")
    seconds = op_time_s(b.graph, b.graph.op(mm.op), profile) - profile.launch_overhead_s
    assert 2 * 4096**3 / seconds == pytest.approx(750e12, rel=0.01)
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(ConfigError, match="bad.json.*missing fields"):
        LMSConfig(profile=str(bad))
    with pytest.raises(ConfigError, match="cannot read the hardware profile file"):
        LMSConfig(profile=str(tmp_path / "absent.json"))


def test_the_batchnorm_probe_times_every_shape_dtype_and_layout():
    """The stand-in moves batchnorm_bytes at its HBM rate channels-last, 1.25x slower channels-first."""
    result = gpu_probe.run(gpu_probe.StandInBackend(latency_s=0.0, hbm_gbps=2500.0), copy_bytes=MIB, matmul_n=256,
                           repeats=1, batchnorm=True)
    section = result["measurements"]["batchnorm"]
    layers = section["layers"]
    assert {(tuple(layer["shape"]), layer["dtype"], layer["layout"]) for layer in layers} == {
        (shape, dtype, layout) for shape in gpu_probe.RESNET50_BATCHNORMS for dtype in ("float32", "bfloat16")
        for layout in ("nchw", "nhwc")}
    assert len(layers) == 9 * 2 * 2 and len(gpu_probe.RESNET50_BATCHNORMS) == 9
    for layer in layers:
        assert layer["forward_s"] > 0 and layer["backward_s"] > 0 and "error" not in layer
        expected = 2500.0 if layer["layout"] == "nhwc" else 2000.0
        assert layer["forward_gbps"] == pytest.approx(expected) and layer["backward_gbps"] == pytest.approx(expected)
    assert section["params_dtype"]["bfloat16 nhwc"] == "float32"
    best = gpu_probe.batchnorm_best(layers)
    assert len(best) == 18 and {layer["layout"] for layer in best.values()} == {"nhwc"}
    assert "batch norm (training) on ResNet-50's 9 activation shapes" in gpu_probe.table(result)
    assert "float32 forward 2500 backward 2500" in gpu_probe.table(result)
    json.dumps(result)


def test_batchnorm_bytes_count_three_activations_forward_and_five_backward():
    elements = 64 * 256 * 56 * 56
    assert gpu_probe.batchnorm_bytes((64, 256, 56), "float32", "forward") == 3 * elements * 4  # x twice, y
    assert gpu_probe.batchnorm_bytes((64, 256, 56), "float32", "backward") == 5 * elements * 4  # x, dy twice; dx
    assert gpu_probe.batchnorm_bytes((64, 2048, 7), "bfloat16", "backward") == 5 * 64 * 2048 * 49 * 2
    with pytest.raises(KeyError):
        gpu_probe.batchnorm_bytes((64, 256, 56), "float32", "sideways")


def test_a_batchnorm_layer_that_fails_is_recorded_and_the_probe_goes_on():
    class Flaky(gpu_probe.StandInBackend):
        def batchnorm_train_s(self, shape, dtype, layout, repeats):
            if shape == (64, 512, 7) and dtype == "bfloat16":
                raise RuntimeError("CUDA out of memory")
            return super().batchnorm_train_s(shape, dtype, layout, repeats)

    result = gpu_probe.run(Flaky(), copy_bytes=MIB, matmul_n=256, repeats=1, batchnorm=True)
    layers = result["measurements"]["batchnorm"]["layers"]
    failed = [layer for layer in layers if "error" in layer]
    assert len(failed) == 2 and failed[0]["error"] == "RuntimeError: CUDA out of memory"
    assert len(layers) == 36 and all(layer["forward_s"] > 0 for layer in layers if "error" not in layer)
    every = {(dt, s) for s in gpu_probe.RESNET50_BATCHNORMS for dt in ("float32", "bfloat16")}
    assert gpu_probe.batchnorm_best(layers).keys() == every - {("bfloat16", (64, 512, 7))}
    assert "2 of 36 measurements failed" in gpu_probe.table(result)


def test_a_backend_without_batchnorm_says_so():
    class NoBatchNorm(gpu_probe.StandInBackend):
        def batchnorm_train_s(self, shape, dtype, layout, repeats):
            return None

    result = gpu_probe.run(NoBatchNorm(), copy_bytes=MIB, matmul_n=256, repeats=1, batchnorm=True)
    assert result["measurements"]["batchnorm"] == {"not_measured": "stand-in has no batch normalisation"}
    assert "batch norm: stand-in has no batch normalisation" in gpu_probe.table(result)


def test_the_cli_flags_reach_the_probe(monkeypatch, capsys):
    monkeypatch.setattr(gpu_probe, "make_backend", lambda choice: gpu_probe.StandInBackend())
    assert gpu_probe.main(["--batchnorm", "--json", "--copy-mib", "1", "--matmul-n", "256", "--repeats", "1"]) == 0
    m = json.loads(capsys.readouterr().out)["measurements"]
    assert len(m["batchnorm"]["layers"]) == 36 and "conv_layers" not in m and "elementwise_gbps" not in m
    assert gpu_probe.main(["--copy-mib", "1", "--matmul-n", "256", "--repeats", "1"]) == 0
    assert "batch norm" not in capsys.readouterr().out


def _attention_bytes_by_hand(batch, dtype):
    """Each op's inputs read and output written once: e elements a chain tensor, w bytes an element, a bool mask."""
    e, w = batch * 12 * 512 * 512, 4 if dtype == "float32" else 2
    qk = 2 * batch * 12 * 512 * 64 * w
    return {"scores": qk + e * w, "scale": 2 * e * w, "softmax": 2 * e * w, "uniform": e * w, "mask": e * w + e,
            "rescale": 2 * e * w, "select": e + 2 * e * w}


def test_the_attention_probe_times_each_op_the_chain_and_the_tensors_copies():
    """The stand-in moves attention_bytes at its HBM rate (every op memory-bound at batch 8) and copies at its link
    rates plus latency: each op, the chain, the copies and the ratio come back as those rates give."""
    backend = gpu_probe.StandInBackend(latency_s=20e-6, hbm_gbps=2500.0, h2d_gbps=50.0, d2h_gbps=40.0)
    result = gpu_probe.run(backend, copy_bytes=MIB, matmul_n=256, repeats=1, attention=True)
    section = result["measurements"]["attention"]
    assert section["shape"] == [8, 12, 512, 64] and section["dropout_rate"] == 0.1
    names = [name for name, _, _ in gpu_probe.ATTENTION_OPS]
    assert names == ["scores", "scale", "softmax", "uniform", "mask", "rescale", "select"]
    assert list(section["ops"]) == names and set(section["dtypes"]) == {"float32", "bfloat16"}
    for dtype in ("float32", "bfloat16"):
        entry = section["dtypes"][dtype]
        by_hand = _attention_bytes_by_hand(8, dtype)
        assert list(entry["ops"]) == names
        for name in names:
            assert gpu_probe.attention_bytes(name, (8, 12, 512, 64), dtype) == by_hand[name]
            assert entry["ops"][name]["seconds"] == pytest.approx(by_hand[name] / 2500e9)
            assert entry["ops"][name]["gbps"] == pytest.approx(2500.0)
        flops = 2 * 8 * 12 * 512 * 512 * 64
        assert entry["ops"]["scores"]["flops"] == pytest.approx(flops / (by_hand["scores"] / 2500e9))
        chain = sum(by_hand.values()) / 2500e9
        assert entry["chain_s"] == pytest.approx(chain) and entry["ops_sum_s"] == pytest.approx(chain)
        tensor = 8 * 12 * 512 * 512 * (4 if dtype == "float32" else 2)
        assert entry["tensor_bytes"] == tensor == gpu_probe.attention_tensor_bytes((8, 12, 512, 64), dtype)
        assert entry["d2h_s"] == pytest.approx(20e-6 + tensor / 40e9)
        assert entry["h2d_s"] == pytest.approx(20e-6 + tensor / 50e9)
        assert entry["copy_s"] == pytest.approx(entry["d2h_s"] + entry["h2d_s"])
        assert entry["recompute_over_copy"] == pytest.approx(chain / (40e-6 + tensor / 40e9 + tensor / 50e9))
    # bfloat16 halves every tensor but the bool mask: its chain is a little more than half float32's
    f32, bf16 = section["dtypes"]["float32"]["chain_s"], section["dtypes"]["bfloat16"]["chain_s"]
    assert 0.5 < bf16 / f32 < 0.55
    text = gpu_probe.table(result)
    assert "attention chain (batch 8, 12 heads, sequence 512, head size 64, dropout 0.1)" in text
    ratio = section["dtypes"]["float32"]["recompute_over_copy"]
    scores_us = section["dtypes"]["float32"]["ops"]["scores"]["seconds"] * 1e6
    assert f"float32: scores {scores_us:.0f} scale" in text
    assert f"recompute / copies {ratio:.3f}" in text and "(96 MiB)" in text and "(48 MiB)" in text
    json.dumps(result)


def test_an_attention_product_bound_by_its_flops_is_timed_at_them():
    """At a slow product rate the scores' time is its FLOPs: the probe's FLOP/s give the rate back."""
    backend = gpu_probe.StandInBackend(latency_s=0.0, flops={"fp32": 1e12, "tf32": 2e12, "fp16": 4e12, "bf16": 4e12})
    section = gpu_probe.run(backend, copy_bytes=MIB, matmul_n=64, repeats=1, attention=True,
                            attention_batch=2)["measurements"]["attention"]
    assert section["shape"] == [2, 12, 512, 64]
    assert section["dtypes"]["float32"]["ops"]["scores"]["flops"] == pytest.approx(2e12)  # TF32, as TensorFlow
    assert section["dtypes"]["bfloat16"]["ops"]["scores"]["flops"] == pytest.approx(4e12)
    assert gpu_probe.attention_flops("softmax", (2, 12, 512, 64)) == 0.0


def test_an_attention_dtype_that_fails_is_recorded_and_the_other_measured():
    class Flaky(gpu_probe.StandInBackend):
        def attention_s(self, shape, dtype, rate, repeats):
            if dtype == "bfloat16":
                raise RuntimeError("CUDA out of memory")
            return super().attention_s(shape, dtype, rate, repeats)

    result = gpu_probe.run(Flaky(), copy_bytes=MIB, matmul_n=256, repeats=1, attention=True)
    dtypes = result["measurements"]["attention"]["dtypes"]
    assert dtypes["bfloat16"] == {"error": "RuntimeError: CUDA out of memory"}
    assert dtypes["float32"]["recompute_over_copy"] > 0
    assert "bfloat16: failed: RuntimeError: CUDA out of memory" in gpu_probe.table(result)


def test_a_backend_without_the_attention_chain_says_so():
    class NoAttention(gpu_probe.StandInBackend):
        def attention_s(self, shape, dtype, rate, repeats):
            return None

    result = gpu_probe.run(NoAttention(), copy_bytes=MIB, matmul_n=256, repeats=1, attention=True)
    assert result["measurements"]["attention"] == {
        "not_measured": "stand-in has no attention chain (--attention needs --backend pytorch)"}
    assert "attention: stand-in has no attention chain" in gpu_probe.table(result)
    assert gpu_probe.CupyBackend.attention_s(None, (8, 12, 512, 64), "float32", 0.1, 1) is None


def test_the_attention_flags_reach_the_probe(monkeypatch, capsys):
    monkeypatch.setattr(gpu_probe, "make_backend", lambda choice: gpu_probe.StandInBackend())
    assert gpu_probe.main(["--attention", "--attention-batch", "2", "--json", "--copy-mib", "1", "--matmul-n", "256",
                           "--repeats", "1"]) == 0
    m = json.loads(capsys.readouterr().out)["measurements"]
    assert m["attention"]["shape"] == [2, 12, 512, 64] and "batchnorm" not in m
    assert m["attention"]["dtypes"]["bfloat16"]["tensor_bytes"] == 2 * 12 * 512 * 512 * 2
    assert gpu_probe.main(["--copy-mib", "1", "--matmul-n", "256", "--repeats", "1"]) == 0
    assert "attention" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_probe.main(["--attention", "--attention-batch", "0"])
