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
