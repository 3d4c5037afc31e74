"""The emulated machine of :mod:`tflms.measure.executor` and what its measurements hold.

Two logical CPU devices stand in for a host and an accelerator (the device names, the
simulator profile and options that match them); a traced step's allocation records
become per-device live-bytes timelines (:func:`device_memory_from_records`), and the
result of one step is an :class:`ExecutorMeasurement`. Importing this does not import
TensorFlow.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tflms.devices import onednn_kernels
from tflms.errors import TflmsError
from tflms.ir.xla_left_out import SWAPPED_CONV
from tflms.profiles import GIB, HardwareProfile
from tflms.sim.simulator import ONEDNN_CPU_WORKSPACES, SimOptions

#: Device that plays the accelerator (gets every node without a device).
ACCELERATOR_DEVICE = "/device:CPU:1"
#: The accelerator of a step whose ops run as XLA clusters (``ExecutorRequest(accelerator_cpu=0)``), the host then
#: being CPU:1. In a session with two logical CPUs, a cluster placed on CPU:1 whose compile-time constant inputs
#: are computed (a ``Slice`` whose ``begin`` comes from a ``Shape``), or that has no input at all (``Prod`` of two
#: constants), fails with "Multiple CPU devices [CPU:1, CPU:0]" (checked on TensorFlow 2.21: XLA's device choice
#: sees CPU:0 beside the cluster's CPU:1); on CPU:0 the same cluster runs. The two logical CPUs are otherwise alike
#: (one allocator, one thread pool), so the roles can swap.
XLA_ACCELERATOR_DEVICE, XLA_HOST_DEVICE = "/device:CPU:0", "/device:CPU:1"
#: Device that plays the host (swap-out copies live here).
HOST_DEVICE = "/device:CPU:0"
#: Keys of :attr:`ExecutorMeasurement.devices` by logical CPU index.
ROLE_BY_CPU_INDEX = {1: "accelerator", 0: "host"}
#: Inter-op threads of the measuring session: one per emulated device, so a swap-out
#: on the host runs while the accelerator computes (like a copy engine beside the
#: compute stream). With one thread the host copies starve until the accelerator's
#: ready ops are done, and swapped tensors stay live far longer than on real hardware.
INTER_OP_THREADS = 2
#: The emulated machine as a simulator profile, for comparing simulated and measured peaks.
#: The memory a swapped graph needs depends on when copies run relative to compute, so
#: plans judged with a GPU profile behave differently here. Rough figures from the step
#: stats of ``tools/validate_memory.py`` on a 2-core x86 machine: MatMul/Conv2D kernels
#: reach ~65 GFLOP/s, element-wise ops ~8 GB/s, a 4 MiB DeepCopy takes 0.5-2 ms, tiny
#: ops 20-80 us. :func:`tflms.measure.calibrate.calibrate_profile` derives per-op-type
#: factors, the launch overhead and the link from a measured run instead
#: (``tools/validate_memory.py --calibrate``).
#: Op types whose kernel XLA:CPU copies into its cluster's temporary allocation before running them: it lowers a
#: backward-input convolution to a convolution over the kernel reversed and transposed (``transpose_copy_fusion``, the
#: whole temporary of the U-Net's ``up0_a_conv`` gradient cluster, 82944 bytes; the CNN's ``Conv2DBackpropInput``
#: likewise: ``tools/validate_xla_memory.py --dump DIR``, TensorFlow 2.21). XLA:GPU folds the reverse into cuDNN's
#: backward-data call. ``HardwareProfile.xla_kernel_copies``; docs/design.md, "Kernel copies".
EMULATION_XLA_KERNEL_COPIES = ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
#: Op types XLA:CPU fuses into one consumer fusion at most: each lowers to an instruction XLA's fusion calls expensive
#: (``InstructionFusion::IsExpensive``: exponential, logarithm, logistic, tanh, divide, remainder, power, square root,
#: erf, trigonometry), and it never duplicates one (``InstructionFusion::ShouldFuse``, "expensive producer would be
#: duplicated"). The zoo BERT's exact GELU: XLA:CPU writes each layer's ``Erfc`` (``add_select_fusion``), which the
#: forward product and the backward pass both read, as a buffer of its own (``tools/validate_xla_memory.py --dump
#: DIR``, TensorFlow 2.21); XLA:GPU counts float32 exponentials and divisions cheap.
#: ``HardwareProfile.xla_no_duplicate``.
EMULATION_XLA_NO_DUPLICATE = (
    "Exp", "Expm1", "Log", "Log1p", "Sigmoid", "Tanh", "Softplus", "Softsign", "Elu", "Selu", "Sqrt", "Rsqrt", "Pow",
    "Div", "RealDiv", "DivNoNan", "FloorDiv", "TruncateDiv", "FloorMod", "Mod", "TruncateMod", "Reciprocal", "Inv",
    "Erf", "Erfc", "Erfinv", "Ndtri", "Lgamma", "Digamma", "Sin", "Cos", "Tan", "Atan", "Atan2", "Asin", "Acos",
    "Asinh", "Acosh", "Atanh", "Sinh", "Cosh", "Xlogy", "Xdivy", "Gelu", "SqrtGrad", "SoftplusGrad", "SoftsignGrad")
#: Temporaries of the emulated accelerator's TensorFlow kernels that run outside its XLA clusters
#: (``HardwareProfile.xla_outside_scratch``): a max-pool gradient (left out of XLA, :data:`EMULATION_XLA_LEFT_OUT`)
#: runs TensorFlow's CPU kernel ``MaxPoolingGradOp``, whose forward pool ran in XLA, so oneDNN hands it no workspace:
#: it allocates a copy of the pooled output (input 1, unless it may take that buffer over) and an int64 argmax per
#: pooled element, for its run (``tensorflow/core/kernels/maxpooling_op.cc``; the zoo CNN at 0.8, TensorFlow 2.21: 0.5
#: and 1 MiB beside the 2 MiB gradient, in the allocator's events).
EMULATION_XLA_OUTSIDE_SCRATCH = (("MaxPoolGrad", 1, 1.0, 8.0), ("MaxPoolGradV2", 1, 1.0, 8.0))
EMULATION_PROFILE = HardwareProfile(
    "emulated-cpu", memory_bytes=64 * GIB, peak_flops=100e9, memory_gbps=12, link_gbps=5, link_latency_s=20e-6,
    launch_overhead_s=20e-6, compute_efficiency=0.65, link_efficiency=0.8, host_memory_bytes=64 * GIB,
    host_kernels=True, xla_kernel_copies=EMULATION_XLA_KERNEL_COPIES, xla_no_duplicate=EMULATION_XLA_NO_DUPLICATE,
    xla_outside_scratch=EMULATION_XLA_OUTSIDE_SCRATCH,
    description="two logical CPU devices of tflms.measure.executor (CPU:1 = accelerator)")
#: Simulator options matching the emulation: the host device, and the workspaces of the
#: oneDNN kernels the emulated accelerator runs (:data:`EMULATION_ENV`).
EMULATION_SIM_OPTIONS = SimOptions(host_device=HOST_DEVICE, workspace_bytes_per_element=ONEDNN_CPU_WORKSPACES)
#: Environment of the measuring subprocess: the emulated accelerator runs oneDNN's CPU kernels on every x86
#: machine. TensorFlow turns them on by default only on some CPUs (Intel's with AVX-512 and newer; not AMD
#: EPYC), and without them Eigen's convolution gradients allocate scratch buffers through the allocator
#: (25-28 MiB each for the 32x32 CNN of tests/test_validation.py, a 58 MB measured peak against a 7.7 MB
#: simulated one) that no accelerator's kernels have and the simulator does not model.
EMULATION_ENV = {"TF_ENABLE_ONEDNN_OPTS": "1"}
#: Appended to the measuring subprocess's ``TF_XLA_FLAGS``: every XLA cluster is compiled when it first runs, with no
#: fallback. With lazy compilation (TensorFlow's default), ``build_xla_ops_pass`` keeps each cluster's TensorFlow ops
#: beside its ``_XlaRun`` (``predicated_compilation_key``, ``merge_oidx``), and ``_XlaCompile`` may run those instead
#: of compiling; in the executor subprocess, which imports each request into a fresh session, the zoo CNN's pinned
#: 0.8 rewrite then peaked at 12.68 and 16.56 MiB in alternate runs of six, and at 12.68 in all six with this flag
#: (simulated: 12.67). The simulator prices the compiled clusters.
EMULATION_XLA_FLAGS = "--tf_xla_enable_lazy_compilation=false"
#: Added to :data:`EMULATION_ENV` where a request reads the allocator's own events (``allocator_trace``): the CPU's
#: BFC allocator, which reports every allocation to the profiler. oneDNN's ``mklcpu`` allocator (the default with
#: oneDNN on) reports only those its BFC part serves and leaves out the small ones (on the 32x32 CNN of
#: tools/validate_memory.py, 96 of 348 records; the peak 0.6% low). The kernels are the same.
ALLOCATOR_TRACE_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
#: Op types the emulated accelerator runs outside its XLA clusters, in TensorFlow's executor, and why
#: (:func:`tflms.passes.xla_clusters.leave_out`). XLA:CPU lowers each into buffers that XLA:GPU does not allocate, so
#: in a cluster they would measure XLA:CPU's compiler, not the XLA step the simulator prices (checked on the zoo CNN,
#: TensorFlow 2.21: its whole-step cluster's temporary allocation 28.9 MiB with them inside, 0.14 MiB with them out,
#: ``tools/validate_xla_memory.py --dump DIR`` with and without ``--all-in-xla``; docs/design.md, "Measuring a
#: clustered step"):
#:
#: - a max-pool gradient is XLA's ``select-and-scatter``, which XLA:CPU's ``SelectAndScatterExpander``
#:   (cpu_compiler.cc) rewrites into a window reduction over one ``s32`` index tensor per dimension of the pooled
#:   input, a scatter and a broadcast of its result, and its scheduler computes those operand-free tensors at the
#:   module's start: 20 bytes per element of a float32 NHWC input, live through the forward pass; XLA:GPU emits
#:   select-and-scatter as one kernel writing its result;
#: - a filter gradient is a convolution over the batch dimension, whose operands XLA:CPU's ``ConvCanonicalization``
#:   and layout assignment transpose into activation-sized copies (the input's often made in the forward pass); XLA:GPU
#:   calls cuDNN's backward-filter convolution on the operands as they are.
EMULATION_XLA_LEFT_OUT = {
    **dict.fromkeys(("MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad"),
                    "XLA:CPU expands select-and-scatter into index tensors XLA:GPU does not have"),
    **dict.fromkeys(("Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2"),
                    "XLA:CPU transposes a filter gradient's operands into copies XLA:GPU does not make"),
}
#: Rules (:data:`tflms.ir.xla_left_out.RULES`) that pick single ops the emulated accelerator runs outside its XLA
#: clusters, for the reason :data:`EMULATION_XLA_LEFT_OUT` gives: a forward convolution whose kernel's window exceeds
#: its input, which XLA:CPU turns around and whose kernel it reverses into a buffer of its own (ResNet-50's conv5 3x3
#: convolutions at a 64x64 input: three 9 MiB reverses in the forward cluster's temporary allocation, computed at its
#: start, 43 MiB in all against the clock's 9; docs/design.md, "Why ResNet-50's 0.8 rewrite peaks 7.6 MiB above its
#: simulation"); XLA:GPU turns the swap off.
EMULATION_XLA_LEFT_OUT_RULES = (SWAPPED_CONV,)


@contextlib.contextmanager
def planning_for_emulation() -> Iterator[None]:
    """A context to plan (tune, rewrite) a step for the emulated accelerator in:

    - its CPU ops run oneDNN's kernels (:data:`EMULATION_ENV`) whatever this process's TensorFlow runs, so the swap
      rules that depend on them (oneDNN's workspace edges: a swapped ``MaxPool3D`` output fed to ``MaxPool3DGrad``
      routes the gradient of tied maxima differently) follow the emulated machine
      (:func:`tflms.devices.onednn_kernels`);
    - a step that keeps XLA leaves :data:`EMULATION_XLA_LEFT_OUT` and the ops :data:`EMULATION_XLA_LEFT_OUT_RULES`
      pick out of its clusters, in the clustering pass and in the simulator's ``xla-clusters`` clock alike
      (:func:`tflms.passes.xla_clusters.leave_out`).
    """
    from tflms.passes.xla_clusters import leave_out
    with (onednn_kernels(EMULATION_ENV["TF_ENABLE_ONEDNN_OPTS"] == "1"),
          leave_out(EMULATION_XLA_LEFT_OUT, EMULATION_XLA_LEFT_OUT_RULES)):
        yield


#: How much of the subprocess stderr an error message quotes.
STDERR_TAIL_CHARS = 4000
#: A device string of the emulated machine; group ``index`` is the logical CPU (0 or 1).
DEVICE_RE = re.compile(
    r"^(?:/job:localhost)?(?:/replica:0)?(?:/task:0)?/(?:device:)?CPU:(?P<index>[01])$", re.IGNORECASE)


class MeasurementError(TflmsError, RuntimeError):
    """TensorFlow could not run the graph being measured (names the node when known)."""


@dataclass(frozen=True)
class DeviceMemory:
    """Memory of one device during the traced step.

    ``timeline`` holds ``(micros since step start, live bytes)`` after each
    allocation record, in time order; ``records`` the same records as
    ``(micros since step start, +/- bytes, allocating node)``. ``peak_bytes`` is the
    timeline's maximum (0 when the device allocated nothing); it excludes
    ``persistent_bytes`` (variables and constants allocated before the step).
    """

    device: str
    peak_bytes: int
    timeline: tuple[tuple[int, int], ...]
    persistent_bytes: int = 0
    allocators: tuple[str, ...] = ()
    records: tuple[tuple[int, int, str], ...] = ()

    @property
    def end_bytes(self) -> int:
        """Bytes allocated during the step that were still live when it ended."""
        return self.timeline[-1][1] if self.timeline else 0

    def live_at_peak(self) -> tuple[int, list[tuple[str, int]]]:
        """When the device peaked (micros since the step start) and what was live then: ``(node, bytes)`` by
        allocating node, largest first, ties by name; each free (a record of negative bytes) matched to its node's
        earliest live allocation of that size, as TensorFlow records a free under the node that allocated. Where the
        timeline reaches its maximum more than once, the first. A free whose node has no such live allocation (a
        buffer allocated before the step) is counted under ``"(before the step)"``."""
        if not self.records:
            return 0, []
        at = max(range(len(self.timeline)), key=lambda k: self.timeline[k][1])  # (the first of equal maxima)
        alive: dict[tuple[str, int], int] = {}
        before = 0
        for _, num_bytes, node in self.records[:at + 1]:
            key = (node, abs(num_bytes))
            if num_bytes >= 0:
                alive[key] = alive.get(key, 0) + 1
            elif alive.get(key):
                alive[key] -= 1
            else:
                before += num_bytes
        by_node: dict[str, int] = {}
        for (node, size), count in alive.items():
            if count:
                by_node[node] = by_node.get(node, 0) + size * count
        if before:
            by_node["(before the step)"] = before
        return self.records[at][0], sorted(by_node.items(), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class NodeTime:
    """When one node ran in the traced step: microseconds since the step start, and its device role."""

    start_us: float
    end_us: float
    role: str  # "accelerator" or "host" ("" for a device of neither role)


@dataclass(frozen=True)
class ExecutorMeasurement:
    """Result of one traced step: per-device memory, fetched values, variables after the step,
    and when each node ran (``node_times``, by node name)."""

    devices: Mapping[str, DeviceMemory]
    fetch_values: Mapping[str, np.ndarray] = field(default_factory=dict)
    variables_after: Mapping[str, np.ndarray] = field(default_factory=dict)
    node_times: Mapping[str, NodeTime] = field(default_factory=dict)
    #: With ``ExecutorRequest(allocator_trace=True)``: the same step run again under TensorFlow's profiler, each
    #: device's memory from the allocator's own events (:mod:`tflms.measure.allocator_events`; XLA's buffers
    #: included); ``unattributed_bytes``: allocated there outside every op of the step (the client's feeds);
    #: ``allocator_peak_bytes``: the allocator's own peak in use (every device, variables and feeds together).
    allocator_devices: Mapping[str, DeviceMemory] | None = None
    unattributed_bytes: int = 0
    allocator_peak_bytes: int = 0

    def start_order(self) -> list[str]:
        """Names of the nodes that ran, by start time (ties by end time, then name)."""
        return sorted(self.node_times, key=lambda n: (self.node_times[n].start_us, self.node_times[n].end_us, n))

    def spans_s(self) -> dict[str, tuple[float, float]]:
        """``{node: (start_s, end_s)}``: ``node_times`` in seconds, the form ``simulate(observed=...)`` takes."""
        return {name: (t.start_us * 1e-6, t.end_us * 1e-6) for name, t in self.node_times.items()}

    def peak(self, which: str = "accelerator", *, include_persistent: bool = False) -> int:
        """Peak live bytes of ``which`` ("accelerator" or "host") during the step.

        With ``include_persistent`` the device's variable and constant bytes are added.
        """
        if which not in self.devices:
            raise KeyError(f"no device {which!r} in this measurement; have {sorted(self.devices)}")
        device = self.devices[which]
        return device.peak_bytes + (device.persistent_bytes if include_persistent else 0)

    def allocator_peak(self, which: str = "accelerator", *, include_persistent: bool = False) -> int:
        """:meth:`peak` from the allocator's own events (``allocator_devices``): what XLA's buffers need too."""
        if self.allocator_devices is None:
            raise ValueError("no allocator trace in this measurement: measure with ExecutorRequest(allocator_trace=True)")
        device = self.allocator_devices[which]
        return device.peak_bytes + (device.persistent_bytes if include_persistent else 0)


def roles_by_cpu_index(accelerator_cpu: int = 1) -> dict[int, str]:
    """``{logical CPU: role}`` with the accelerator on ``accelerator_cpu`` (1, :data:`ROLE_BY_CPU_INDEX`, or 0)."""
    return ROLE_BY_CPU_INDEX if accelerator_cpu == 1 else {0: "accelerator", 1: "host"}


def role_of_device(device: str, accelerator_cpu: int = 1) -> str | None:
    """"accelerator" or "host" for a device string ending in CPU:1 or CPU:0 (the accelerator on
    ``accelerator_cpu``); None for any other."""
    match = re.search(r"/device:CPU:(\d+)$", device, re.IGNORECASE)
    return roles_by_cpu_index(accelerator_cpu).get(int(match.group(1))) if match else None


def device_memory_from_records(device: str, records: Sequence[Sequence[Any]], *, origin_micros: int = 0,
                               persistent_bytes: int = 0, allocators: Sequence[str] = ()) -> DeviceMemory:
    """Build a device's live-bytes timeline from ``(micros, bytes, node)`` allocation records.

    Records are summed in time order; records with the same timestamp keep their
    given order (TensorFlow lists them in the order they happened per node).
    """
    ordered = sorted(records, key=lambda record: record[0])  # stable
    live = peak = 0
    timeline, kept = [], []
    for micros, num_bytes, *rest in ordered:
        live += int(num_bytes)
        peak = max(peak, live)
        timeline.append((int(micros) - origin_micros, live))
        kept.append((int(micros) - origin_micros, int(num_bytes), str(rest[0]) if rest else ""))
    return DeviceMemory(device=device, peak_bytes=peak, timeline=tuple(timeline),
                        persistent_bytes=persistent_bytes, allocators=tuple(sorted(set(allocators))),
                        records=tuple(kept))
