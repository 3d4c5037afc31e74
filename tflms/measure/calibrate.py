"""Calibrate the emulated machine's timing from op times TensorFlow's executor measured.

:data:`tflms.measure.EMULATION_PROFILE` prices every op on one roofline (nominal FLOP/s and
memory bandwidth, one launch overhead). A CPU is not one roofline: per op class its kernels
reach very different fractions of it (on a 2-core AMD EPYC with oneDNN's kernels, a 3D
convolution's filter gradient takes 2-5 x its roofline time, a scalar ``Mul`` a tenth of the
launch overhead). When copies overlap compute, what is live at the peak depends on those
times, so the tuner and the simulator should price ops as the machine runs them.

:func:`calibrate_profile` takes graphs and executor measurements of them
(:class:`~tflms.measure.emulation.ExecutorMeasurement`, whose ``node_times`` hold every node's
start and end) and returns an :class:`EmulationCalibration` whose ``profile`` is the base
profile with

- ``launch_overhead_s``: the median measured time of the compute ops whose roofline work is
  at most :data:`TINY_WORK_S` (scalar and per-weight ops: what one kernel costs beside its work);
- ``op_time_factors``: per op type, the measured time minus that overhead, summed over the
  type's ops, over their summed roofline work (``tflms.sim.cost.op_work_s``): with it the
  simulated time of each op class equals the measured one. Types whose summed work is under
  ``min_work_s`` keep the roofline (too little signal), as do types never measured;
- ``link_gbps`` / ``link_latency_s``: a least-squares fit of the measured host copies
  (``DeepCopy`` swaps between the devices), when the measured graphs have copies of at least
  two sizes; otherwise the base profile's link is kept and the calibration says so.

Only ops the simulator runs on the accelerator's compute stream set the launch overhead and
the factors (host ops cost nothing in the simulator; copies between the devices are the
link's). The executor runs them on two inter-op threads, and two ops that overlap share the
cores, each slower; the simulator runs them one at a time. So each op is given its *share* of
the time it ran (``k`` ops running at once get ``1/k`` of each instant, :func:`_shared_times`):
the shares of one run add up to the time the device was busy, which is what the sequential
model must spend. (Raw durations would have charged the U-Net step of ``tools/validate_memory.py``
3.9 s of compute for a 2.26 s run.) An op's time is then the median of its shares over the
measurements of its graph, so one run preempted by another process does not set a factor.

``tools/validate_memory.py --calibrate`` measures the original training steps, calibrates
from them, then tunes and simulates with the calibrated profile. Importing this module does
not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tflms.errors import ConfigError
from tflms.ir.graph import Graph
from tflms.ir.op_types import COPY_OPS, FREE_OPS
from tflms.measure.emulation import EMULATION_PROFILE, EMULATION_SIM_OPTIONS, ExecutorMeasurement
from tflms.profiles import HardwareProfile
from tflms.sim.cost import codec_call, op_work_s
from tflms.sim.indexed import HOST, _device_class
from tflms.sim.records import SimOptions

#: Compute ops with at most this much roofline work time the launch overhead.
TINY_WORK_S = 1e-6
#: An op type gets a factor only when its ops' summed roofline work is at least this.
MIN_CLASS_WORK_S = 2e-4


@dataclasses.dataclass(frozen=True)
class OpClassTiming:
    """One op type's measured and roofline times (seconds, summed over its ops in every graph)."""

    op_type: str
    ops: int
    measured_s: float  # sum of each op's median measured time
    roofline_s: float  # sum of the base profile's op_time_s (launch + work)
    work_s: float  # sum of the base profile's work term
    factor: float | None  # None: kept on the roofline (work below min_work_s)


@dataclasses.dataclass(frozen=True)
class EmulationCalibration:
    """A calibrated profile and the evidence it was derived from."""

    profile: HardwareProfile
    base: HardwareProfile
    classes: tuple[OpClassTiming, ...]
    launch_ops: int  # compute ops whose median time gave launch_overhead_s (0: the base's kept)
    copies: int  # host copies the link was fitted to (0: the base's link kept)
    measurements: int  # executor measurements used, over all graphs
    source: str = ""  # how the measurements were made (a command line), for the record

    @property
    def measured_s(self) -> float:
        return sum(c.measured_s for c in self.classes)

    @property
    def roofline_s(self) -> float:
        return sum(c.roofline_s for c in self.classes)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "base": self.base.name, "source": self.source,
                "measurements": self.measurements,
                "launch_overhead_s": self.profile.launch_overhead_s, "launch_ops": self.launch_ops,
                "link_gbps": self.profile.link_gbps, "link_latency_s": self.profile.link_latency_s,
                "copies": self.copies, "op_time_factors": dict(self.profile.op_time_factors),
                "classes": [dataclasses.asdict(c) for c in self.classes]}

    def table(self, limit: int = 15) -> str:
        """The op classes by measured time (the ``limit`` largest), the launch overhead and the link."""
        p, b = self.profile, self.base
        lines = [f"calibrated {p.name} from {self.measurements} executor measurements"
                 + (f" ({self.source})" if self.source else ""),
                 f"launch overhead {b.launch_overhead_s * 1e6:.1f} -> {p.launch_overhead_s * 1e6:.1f} us "
                 f"({self.launch_ops} ops with roofline work <= {TINY_WORK_S * 1e6:g} us)",
                 (f"link {b.link_gbps:g} -> {p.link_gbps:.3g} GB/s nominal, latency {b.link_latency_s * 1e6:.0f} -> "
                  f"{p.link_latency_s * 1e6:.0f} us ({self.copies} copies)") if self.copies else
                 f"link kept at {b.link_gbps:g} GB/s (no host copies measured)",
                 f"compute: measured {self.measured_s:.3f} s, roofline {self.roofline_s:.3f} s",
                 f"{'op type':<38}{'ops':>6}{'measured ms':>13}{'roofline ms':>13}{'factor':>8}"]
        for c in sorted(self.classes, key=lambda c: -c.measured_s)[:limit]:
            factor = "-" if c.factor is None else f"{c.factor:.3f}"
            lines.append(f"{c.op_type:<38}{c.ops:>6}{c.measured_s * 1e3:>13.2f}{c.roofline_s * 1e3:>13.2f}{factor:>8}")
        return "\n".join(lines)


def _shared_times(spans: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each span's share of the time it ran: ``k`` spans running at once get ``1/k`` of each instant.

    The simulator runs compute ops one at a time; the executor runs up to two at once on the same
    cores, each slower. Shared this way, the times of ops that overlapped add up to the time the
    device was busy, which is what a sequential model of the same run must spend.
    """
    events = sorted({t for span in spans.values() for t in span})
    if len(events) < 2:
        return {name: end - start for name, (start, end) in spans.items()}
    shares = dict.fromkeys(spans, 0.0)
    starts = sorted(spans, key=lambda name: spans[name][0])
    active: list[str] = []
    next_start = 0
    for left, right in zip(events, events[1:]):
        while next_start < len(starts) and spans[starts[next_start]][0] <= left:
            active.append(starts[next_start])
            next_start += 1
        active = [name for name in active if spans[name][1] > left]
        if active:
            share = (right - left) / len(active)
            for name in active:
                shares[name] += share
    return shares


def _median_times(measurements: Sequence[ExecutorMeasurement], compute: set[str],
                  copies: set[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Median over the measurements of each compute op's shared time and each copy's duration (seconds)."""
    compute_times: dict[str, list[float]] = {}
    copy_times: dict[str, list[float]] = {}
    for measurement in measurements:
        spans = {name: (t.start_us * 1e-6, max(t.start_us, t.end_us) * 1e-6)
                 for name, t in measurement.node_times.items() if name in compute or name in copies}
        for name, seconds in _shared_times({n: s for n, s in spans.items() if n in compute}).items():
            compute_times.setdefault(name, []).append(seconds)
        for name in copies & spans.keys():
            copy_times.setdefault(name, []).append(spans[name][1] - spans[name][0])
    return ({name: statistics.median(v) for name, v in compute_times.items()},
            {name: statistics.median(v) for name, v in copy_times.items()})


def _fit_link(copies: Sequence[tuple[int, float]], base: HardwareProfile) -> tuple[float, float] | None:
    """``(link_gbps, link_latency_s)`` fitted to ``(bytes, seconds)`` copies, or None with too few sizes."""
    if len({b for b, _ in copies}) < 2:
        return None
    n = len(copies)
    mean_b = sum(b for b, _ in copies) / n
    mean_t = sum(t for _, t in copies) / n
    var = sum((b - mean_b) ** 2 for b, _ in copies)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in copies) / var
    latency = mean_t - slope * mean_b
    if slope <= 0:
        return None
    if latency < 0:  # through the origin
        latency, slope = 0.0, sum(t for _, t in copies) / sum(b for b, _ in copies)
    return 1.0 / slope / base.link_efficiency / 1e9, latency


def calibrate_profile(samples: Sequence[tuple[Graph, Sequence[ExecutorMeasurement]]], *,
                      base: HardwareProfile = EMULATION_PROFILE, options: SimOptions = EMULATION_SIM_OPTIONS,
                      min_work_s: float = MIN_CLASS_WORK_S, name: str | None = None,
                      source: str = "") -> EmulationCalibration:
    """Calibrate ``base`` from executor measurements of graphs (see the module doc).

    Args:
        samples: ``(graph, measurements)`` pairs: an IR graph and one or more executor
            measurements of it (e.g. ``measure_executor_peaks([step_request(...)] * 3)``).
        base: the profile whose roofline is calibrated (its FLOP/s, bandwidth and efficiency stay).
        options: the simulator options of the measured machine (its host device).
        min_work_s: an op type gets a factor only with at least this much summed roofline work.
        name: the calibrated profile's name (default ``base.name + "-calibrated"``).
        source: how the measurements were made, kept in the result.

    Raises:
        ConfigError: no measurement timed any compute op of the graphs.
    """
    host = options.host_device
    per_op: list[tuple[str, float, float, float]] = []  # (type, measured, work, base time)
    copies: list[tuple[int, float]] = []
    count = 0
    for graph, measurements in samples:
        count += len(measurements)
        device = {op.name: _device_class(op.device, host) for op in graph}
        compute, copy_bytes = set(), {}
        for op in graph:
            if op.type in FREE_OPS or codec_call(op) is not None:
                continue
            source_device = device.get(op.inputs[0].op) if op.inputs else None
            if op.type in COPY_OPS and source_device is not None and source_device != device[op.name]:
                copy_bytes[op.name] = graph.tensor(op.inputs[0]).num_bytes or 0
            elif device[op.name] != HOST:
                compute.add(op.name)
        compute_times, copy_times = _median_times(measurements, compute, set(copy_bytes))
        copies += [(copy_bytes[name], seconds) for name, seconds in sorted(copy_times.items())]
        for op in graph:
            if op.name in compute_times:
                per_op.append((op.type, compute_times[op.name], op_work_s(graph, op, base), base.launch_overhead_s))
    if not per_op:
        raise ConfigError("no compute op of the graphs was timed by the measurements: nothing to calibrate")
    tiny = [measured for _, measured, work, _ in per_op if work <= TINY_WORK_S]
    launch = statistics.median(tiny) if tiny else base.launch_overhead_s
    by_type: dict[str, list[tuple[float, float, float]]] = {}
    for op_type, measured, work, _ in per_op:
        by_type.setdefault(op_type, []).append((measured, work, base.launch_overhead_s + work))
    classes, factors = [], {}
    for op_type, rows in sorted(by_type.items()):
        work = sum(w for _, w, _ in rows)
        factor = None
        if work >= min_work_s:
            factor = max(sum(max(0.0, m - launch) for m, _, _ in rows) / work, 1e-6)
            factors[op_type] = factor
        classes.append(OpClassTiming(op_type, len(rows), sum(m for m, _, _ in rows), sum(r for _, _, r in rows),
                                     work, factor))
    link = _fit_link(copies, base)
    changes: dict[str, Any] = {"launch_overhead_s": launch, "op_time_factors": factors}
    if link is not None:
        changes["link_gbps"], changes["link_latency_s"] = link
    label = name or f"{base.name}-calibrated"
    description = (f"{base.name} calibrated from {count} executor measurements: {len(factors)} op-type factors, "
                   f"launch overhead from {len(tiny)} ops, "
                   + (f"link from {len(copies)} copies" if link is not None else "link of the base profile")
                   + (f" ({source})" if source else ""))
    profile = dataclasses.replace(base, name=label, description=description, **changes)
    return EmulationCalibration(profile=profile, base=base, classes=tuple(classes), launch_ops=len(tiny),
                                copies=len(copies) if link is not None else 0, measurements=count, source=source)
