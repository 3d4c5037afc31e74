"""Calibrating the emulated machine's op times from executor measurements (tflms.measure.calibrate).

Hand-built graphs and synthetic measurements whose times are planted: the calibration must
recover the planted launch overhead, per-op-type factors and link, and the calibrated
simulator must then time the measured step as it was measured. No TensorFlow: the end-to-end
check on the executor's real node times is in tests/test_validation.py.
"""

from __future__ import annotations

import pytest

from tflms.errors import ConfigError
from tflms.measure import EMULATION_PROFILE, EMULATION_SIM_OPTIONS, HOST_DEVICE
from tflms.measure.calibrate import _shared_times, calibrate_profile
from tflms.measure.emulation import ExecutorMeasurement, NodeTime
from tflms.profiles import HardwareProfile
from tflms.sim.cost import op_time_s, op_work_s
from tflms.sim.simulator import simulate
from tflms.testing import GraphBuilder

#: Planted: the machine's launch overhead and each op type's time over its roofline work.
LAUNCH_S = 3e-6
PLANTED = {"MatMul": 2.5, "Relu": 0.4, "BiasAdd": 6.0}


def _chain():
    """x -> MatMul -> BiasAdd -> Relu, three times (big tensors), then a scalar Mul per layer (tiny work)."""
    b = GraphBuilder()
    h = b.op("x", "Placeholder", shape=(512, 512))
    w = b.op("w", "Placeholder", shape=(512, 512))
    bias = b.op("bias", "Placeholder", shape=(512,))
    step = b.op("step", "Placeholder", shape=(1,))
    for i in range(3):
        h = b.op(f"mm{i}", "MatMul", [h, w], shape=(512, 512))
        h = b.op(f"add{i}", "BiasAdd", [h, bias], shape=(512, 512))
        h = b.op(f"relu{i}", "Relu", [h], shape=(512, 512))
        b.op(f"scale{i}", "Mul", [step, step], shape=(1,))
    b.op("loss", "Sum", [h], shape=())
    return b.graph


def _measured(graph, times: dict[str, float], *, gap_s: float = 0.0, overlap: dict[str, str] | None = None):
    """A measurement that ran ``times`` one after the other in graph order (``gap_s`` between ops);
    ``overlap[a] = b`` starts ``a`` together with ``b`` instead."""
    spans, clock = {}, 0.0
    for op in graph:
        if op.name not in times:
            continue
        if overlap and op.name in overlap:
            start = spans[overlap[op.name]].start_us * 1e-6
        else:
            start, clock = clock, clock + times[op.name] + gap_s
        spans[op.name] = NodeTime(start_us=start * 1e6, end_us=(start + times[op.name]) * 1e6, role="accelerator")
    return ExecutorMeasurement(devices={}, node_times=spans)


def _planted_times(graph) -> dict[str, float]:
    times = {}
    for op in graph:
        if op.type in ("Placeholder",):
            continue
        work = op_work_s(graph, op, EMULATION_PROFILE)
        times[op.name] = LAUNCH_S + PLANTED.get(op.type, 1.0) * work
    return times


def test_calibration_recovers_planted_factors_and_launch_overhead():
    graph = _chain()
    times = _planted_times(graph)
    cal = calibrate_profile([(graph, [_measured(graph, times)])], min_work_s=1e-5)
    assert cal.profile.launch_overhead_s == pytest.approx(LAUNCH_S, rel=1e-3)  # + a scalar Mul's work
    factors = dict(cal.profile.op_time_factors)
    for op_type, factor in PLANTED.items():
        assert factors[op_type] == pytest.approx(factor, rel=1e-4)
    assert "Mul" not in factors, "scalar Muls have too little work to set a factor"
    # The calibrated simulator times every op as measured, so the step as a whole too.
    result = simulate(graph, cal.profile, options=EMULATION_SIM_OPTIONS)
    simulated = {r.name: r.end_s - r.start_s for r in result.ops}
    for name, seconds in times.items():
        assert simulated[name] == pytest.approx(seconds, rel=1e-3), name
    assert result.step_time_s == pytest.approx(sum(times.values()), rel=1e-6)
    # The uncalibrated profile does not (the control): the planted MatMuls take 2.5 x its roofline.
    uncalibrated = simulate(graph, EMULATION_PROFILE, options=EMULATION_SIM_OPTIONS).step_time_s
    assert uncalibrated < 0.5 * sum(times.values())
    assert cal.profile.peak_flops == EMULATION_PROFILE.peak_flops and cal.profile.name == "emulated-cpu-calibrated"
    assert "BiasAdd" in cal.table() and cal.to_dict()["op_time_factors"]["MatMul"] == pytest.approx(2.5)


def test_each_op_takes_the_median_of_its_runs():
    graph = _chain()
    times = _planted_times(graph)
    slow = dict(times, mm1=times["mm1"] * 50)  # one run preempted during mm1
    runs = [_measured(graph, times), _measured(graph, slow), _measured(graph, times)]
    cal = calibrate_profile([(graph, runs)], min_work_s=1e-5)
    assert dict(cal.profile.op_time_factors)["MatMul"] == pytest.approx(PLANTED["MatMul"], rel=1e-4)
    with_outlier = calibrate_profile([(graph, runs[:2])], min_work_s=1e-5)  # the control: two runs, no majority
    assert dict(with_outlier.profile.op_time_factors)["MatMul"] > 1.5 * PLANTED["MatMul"]


def test_overlapping_ops_share_the_time_they_ran_together():
    assert _shared_times({"a": (0.0, 4.0), "b": (2.0, 6.0), "c": (7.0, 8.0)}) == {"a": 3.0, "b": 3.0, "c": 1.0}
    assert _shared_times({"a": (0.0, 2.0)}) == {"a": 2.0}
    # relu2 ran beside mm2 on the other inter-op thread: together they kept the device busy for
    # max(mm2, relu2) only, and the calibrated (sequential) step spends no more than that.
    graph = _chain()
    times = _planted_times(graph)
    measurement = _measured(graph, times, overlap={"relu2": "mm2"})
    busy = max(t.end_us for t in measurement.node_times.values()) * 1e-6
    cal = calibrate_profile([(graph, [measurement])], min_work_s=1e-5)
    assert cal.measured_s == pytest.approx(busy, rel=1e-9)


def test_host_copies_calibrate_the_link_and_types_never_measured_keep_the_roofline():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(8,))
    sizes = [(256, 256), (512, 512), (1024, 1024)]  # 256 KiB, 1 MiB, 4 MiB
    graph = b.graph
    for i, shape in enumerate(sizes):
        big = b.op(f"fill{i}", "Fill", [x], shape=shape)
        graph.add_op(f"out{i}", "DeepCopy", inputs=[big], device=HOST_DEVICE, outputs=[graph.tensor(big)])
    rate, latency = 6e9, 15e-6  # bytes/s, s
    times = {}
    for op in graph:
        if op.type == "DeepCopy":
            times[op.name] = latency + graph.tensor(op.inputs[0]).num_bytes / rate
        elif op.type == "Fill":
            times[op.name] = 1e-3
    cal = calibrate_profile([(graph, [_measured(graph, times)])], min_work_s=1e-5)
    assert cal.copies == 3
    assert cal.profile.effective_link_bytes_per_s == pytest.approx(rate)
    assert cal.profile.link_latency_s == pytest.approx(latency)
    assert cal.profile.copy_time_s(2**20) == pytest.approx(latency + 2**20 / rate)
    # One copy size cannot separate latency from bandwidth: the base profile's link is kept, and said so.
    one = calibrate_profile([(graph, [_measured(graph, {k: v for k, v in times.items() if k != "out1"
                                                        and k != "out2"})])], min_work_s=1e-5)
    assert one.copies == 0 and one.profile.link_gbps == EMULATION_PROFILE.link_gbps
    assert "link kept" in one.table()
    # Tanh was never measured: the roofline (with the calibrated launch overhead) prices it.
    tanh = b.op("tanh", "Tanh", [x], shape=(1024, 1024))
    op = graph.op(tanh.op)
    assert op_time_s(graph, op, cal.profile) == pytest.approx(
        cal.profile.launch_overhead_s + op_work_s(graph, op, EMULATION_PROFILE))


def test_nothing_timed_is_refused():
    graph = _chain()
    with pytest.raises(ConfigError, match="nothing to calibrate"):
        calibrate_profile([(graph, [ExecutorMeasurement(devices={})])])


def test_profile_op_time_factors_are_checked_and_priced():
    graph = _chain()
    op = graph.op("mm0")
    slower = HardwareProfile("slow-matmul", "1GiB", 1e11, 10, 5, op_time_factors={"MatMul": 3.0})
    plain = HardwareProfile("plain", "1GiB", 1e11, 10, 5)
    assert slower.op_time_factors == (("MatMul", 3.0),) and slower.op_time_factor("Relu") == 1.0
    assert op_time_s(graph, op, slower) - slower.launch_overhead_s == pytest.approx(
        3.0 * (op_time_s(graph, op, plain) - plain.launch_overhead_s))
    assert op_time_s(graph, graph.op("relu0"), slower) == op_time_s(graph, graph.op("relu0"), plain)
    assert hash(slower) != hash(plain) and slower != plain
    for bad, message in (({"MatMul": 0}, "must be a finite number > 0"), ({"MatMul": float("nan")}, "finite"),
                         ({"MatMul": "fast"}, "must map op types to numbers")):
        with pytest.raises(ConfigError, match=message):
            HardwareProfile("bad", "1GiB", 1e11, 10, 5, op_time_factors=bad)
