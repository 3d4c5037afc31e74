"""What a hardware profile is, and how it prices work: :class:`HardwareProfile`.

A profile holds one accelerator's memory, compute and memory bandwidth and its host link, checked when it is
built; its methods say what the simulator reads of it: the rate a contraction of a dtype reaches, the memory
bandwidth ops reach, the time of one host copy.

Rates by math mode (issue 28): ``peak_flops`` is the FP32 (CUDA-core) rate; ``tf32_flops``,
``fp16_flops`` and ``bf16_flops`` are the dense tensor-core rates (the datasheets' figures marked
"with sparsity" halved). :mod:`tflms.sim.cost` prices a contraction (MatMul, BatchMatMul, Einsum,
Conv and their fused forms) by its dtype at these rates x ``contraction_efficiency`` (convolutions x
``conv_efficiency`` where a profile measured it), and every op's
memory traffic at ``memory_gbps`` x ``memory_efficiency``; each profile's ``sources`` cites where
every figure comes from (``HardwareProfile.source_of``).

Which profiles exist by name is :mod:`tflms.profiles.registry` (the vendors' are :mod:`tflms.profiles.vendors`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from tflms.errors import ConfigError
from tflms.units import parse_bytes

GIB = 2**30

#: Math modes of a contraction, and the profile field that holds each one's nominal FLOP/s.
MATH_FP32, MATH_TF32, MATH_FP16, MATH_BF16 = "fp32", "tf32", "fp16", "bf16"
MATH_MODE_FIELDS = {MATH_FP32: "peak_flops", MATH_TF32: "tf32_flops", MATH_FP16: "fp16_flops",
                    MATH_BF16: "bf16_flops"}
MATH_MODE_NAMES = {MATH_FP32: "FP32", MATH_TF32: "TF32", MATH_FP16: "FP16 tensor cores",
                   MATH_BF16: "BF16 tensor cores"}


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """One accelerator and its host link.

    Attributes:
      name: short id, e.g. ``v100-16gb-pcie3``.
      memory_bytes: accelerator memory.
      peak_flops: nominal FP32 FLOP/s.
      memory_gbps: accelerator memory bandwidth, GB/s (1e9 bytes/s).
      link_gbps: host link bandwidth per direction, GB/s (nominal).
      link_latency_s: fixed cost of one host copy.
      launch_overhead_s: fixed cost of one kernel.
      compute_efficiency: fraction of peak FLOP/s and memory bandwidth kernels reach.
      link_efficiency: fraction of nominal link bandwidth copies reach.
      host_memory_bytes: host memory available for swapped tensors.
      description: where the numbers come from.
      op_time_factors: measured time over the roofline's work term, per op type
        (``((op_type, factor), ...)``; a mapping is accepted and stored sorted). The
        simulator costs an op of a listed type ``launch_overhead_s + factor x max(compute,
        memory)``; other types keep the roofline. Empty for the vendor profiles; a
        calibration from measured op times fills it (:func:`tflms.measure.calibrate.calibrate_profile`).
      tf32_flops / fp16_flops / bf16_flops: dense tensor-core FLOP/s for TF32, FP16 and BF16
        contractions; ``None`` where the GPU has no such tensor cores (a float32 contraction is
        then priced at ``peak_flops``, a float16 or bfloat16 one too).
      contraction_efficiency: fraction of the math mode's peak that contractions reach
        (``None``: ``compute_efficiency``).
      conv_efficiency: fraction of the math mode's peak that convolutions (forward and both gradients)
        reach, where it was measured apart from matrix products (``None``: ``contraction_efficiency``).
        cuDNN's convolutions at ResNet-50's shapes reach a fraction of what a large matrix product does
        (``tools/gpu_probe.py --conv-layers``, ``tools/compare_profile.py --fit-conv``).
      contraction_latency_s: time every contraction takes beyond its roofline term and the launch overhead
        (the tail of its last wave of tiles, library setup): what makes a 1024^3 product run at an eighth of
        the large-product rate (``tools/gpu_probe.py --matmul-n``). 0 where not measured.
      memory_efficiency: fraction of ``memory_gbps`` that ops reach for their memory traffic
        (element-wise ops, reductions, copies; ``None``: ``compute_efficiency``).
      tf32_enabled: whether float32 contractions run as TF32 where the GPU has it (TensorFlow's
        default; ``tf.config.experimental.enable_tensor_float_32_execution``). The pipeline sets it
        from ``LMSConfig.tf32`` or TensorFlow's setting (:meth:`with_tf32`).
      sources: where each figure comes from, ``((field, citation), ...)`` (a mapping is accepted
        and stored sorted); :meth:`source_of` reads one.
      host_kernels: whether the device runs each kernel in the thread that dispatched it (a CPU device, as
        the emulated accelerator is), so launches do not overlap compute: the simulator's ``auto`` clock is
        then ``serial``, else ``graph`` (:mod:`tflms.sim.clock`).
      xla_kernel_copies: op types whose kernel (input 1) this machine's XLA copies before it runs them, inside
        their cluster: on the ``xla-clusters`` clock a temporary the kernel's size for the op's kernel
        (:mod:`tflms.sim.clusters`, "Kernel copies"). XLA:CPU reverses and transposes a backward-input
        convolution's kernel into its temporary allocation (``transpose_copy_fusion``); XLA:GPU folds the reverse
        into cuDNN's backward-data call and copies nothing (none, the default).
      xla_outside_scratch: temporaries TensorFlow's kernels of some op types allocate while they run, where such an op
        runs outside the XLA clusters of a step that keeps XLA (priced by the ``xla-clusters`` clock,
        :mod:`tflms.sim.clusters`, "Kernel scratch"): ``((op type, input, copies, bytes per element), ...)``, the
        scratch being ``copies`` x that input's bytes + ``bytes per element`` x its elements. The emulated
        accelerator's max-pool gradients (TensorFlow's CPU kernel: a copy of the pooled output and an int64 argmax per
        pooled element); none by default.
      xla_no_duplicate: op types this machine's XLA never fuses into more than one consumer: an op whose readers
        fall in several fusions is then a kernel of its own and writes its output
        (:func:`tflms.sim.fusion.xla_kernels`).
        XLA:CPU duplicates no *expensive* instruction (``InstructionFusion::ShouldFuse``: "expensive producer would
        be duplicated"; ``InstructionFusion::IsExpensive``: exponentials, logarithms, divisions, square roots, error
        functions, trigonometry), so an op whose lowering computes one keeps its output when a forward and a
        backward fusion both read it (the emulated accelerator's). XLA:GPU prices a duplicate by its cost model and
        counts float32 exponentials and divisions cheap (none, the default).
    """

    name: str
    memory_bytes: int
    peak_flops: float
    memory_gbps: float
    link_gbps: float
    link_latency_s: float = 10e-6
    launch_overhead_s: float = 5e-6
    compute_efficiency: float = 0.6
    link_efficiency: float = 0.8
    host_memory_bytes: int = 256 * GIB
    description: str = ""
    op_time_factors: tuple[tuple[str, float], ...] = ()
    tf32_flops: float | None = None
    fp16_flops: float | None = None
    bf16_flops: float | None = None
    contraction_efficiency: float | None = None
    memory_efficiency: float | None = None
    tf32_enabled: bool = True
    conv_efficiency: float | None = None
    contraction_latency_s: float = 0.0
    sources: tuple[tuple[str, str], ...] = ()
    host_kernels: bool = False
    xla_kernel_copies: tuple[str, ...] = ()
    xla_no_duplicate: tuple[str, ...] = ()
    xla_outside_scratch: tuple[tuple[str, int, float, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_bytes", parse_bytes(self.memory_bytes, what=f"{self.name}.memory_bytes"))
        object.__setattr__(self, "host_memory_bytes",
                           parse_bytes(self.host_memory_bytes, what=f"{self.name}.host_memory_bytes"))
        for field in ("peak_flops", "memory_gbps", "link_gbps"):
            if not getattr(self, field) > 0:
                raise ConfigError(f"profile {self.name!r}: {field} must be > 0, got {getattr(self, field)!r}")
        for field in ("compute_efficiency", "link_efficiency"):
            if not 0 < getattr(self, field) <= 1:
                raise ConfigError(f"profile {self.name!r}: {field} must be in (0, 1], got {getattr(self, field)!r}")
        for field in ("link_latency_s", "launch_overhead_s", "contraction_latency_s"):
            if getattr(self, field) < 0:
                raise ConfigError(f"profile {self.name!r}: {field} must be >= 0")
        factors = self.op_time_factors
        items = factors.items() if isinstance(factors, Mapping) else factors
        try:
            pairs = tuple(sorted((str(op_type), float(factor)) for op_type, factor in items))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"profile {self.name!r}: op_time_factors must map op types to numbers "
                              f"({exc})") from None
        for op_type, factor in pairs:
            if not (math.isfinite(factor) and factor > 0):
                raise ConfigError(f"profile {self.name!r}: op_time_factors[{op_type!r}] must be a finite number "
                                  f"> 0, got {factor!r}")
        if len({op_type for op_type, _ in pairs}) != len(pairs):
            raise ConfigError(f"profile {self.name!r}: op_time_factors names an op type twice")
        object.__setattr__(self, "op_time_factors", pairs)
        object.__setattr__(self, "_factor_by_type", dict(pairs))
        for field in MATH_MODE_FIELDS.values():
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"profile {self.name!r}: {field} must be a number > 0 (FLOP/s) or None (no such "
                                  f"tensor cores), got {value!r}")
        for field in ("contraction_efficiency", "memory_efficiency", "conv_efficiency"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ConfigError(f"profile {self.name!r}: {field} must be in (0, 1] or None "
                                  f"(compute_efficiency), got {value!r}")
        for field in ("xla_kernel_copies", "xla_no_duplicate"):  # op types, stored sorted
            types = getattr(self, field)
            if isinstance(types, str) or not all(isinstance(t, str) for t in types):
                raise ConfigError(f"profile {self.name!r}: {field} must be a list of op types, got {types!r}")
            object.__setattr__(self, field, tuple(sorted(set(types))))
        try:
            scratch = tuple(sorted((str(t), int(k), float(c), float(b)) for t, k, c, b in self.xla_outside_scratch))
        except (TypeError, ValueError):
            scratch = None
        if scratch is None or any(k < 0 or c < 0 or b < 0 for _, k, c, b in scratch):
            raise ConfigError(f"profile {self.name!r}: xla_outside_scratch must list (op type, input >= 0, "
                              f"copies >= 0, bytes per element >= 0), got {self.xla_outside_scratch!r}")
        object.__setattr__(self, "xla_outside_scratch", scratch)
        if not isinstance(self.tf32_enabled, bool):
            raise ConfigError(f"profile {self.name!r}: tf32_enabled must be True or False, got {self.tf32_enabled!r}")
        cited = self.sources.items() if isinstance(self.sources, Mapping) else self.sources
        try:
            cited = tuple(sorted((str(field), str(text)) for field, text in cited))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"profile {self.name!r}: sources must map field names to citations ({exc})") from None
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted({field for field, _ in cited} - known)
        if unknown:
            raise ConfigError(f"profile {self.name!r}: sources cite unknown fields {unknown}; known: {sorted(known)}")
        object.__setattr__(self, "sources", cited)

    def op_time_factor(self, op_type: str) -> float:
        """The factor :attr:`op_time_factors` gives ``op_type`` (1.0 when it lists none)."""
        return self._factor_by_type.get(op_type, 1.0)

    @property
    def effective_flops(self) -> float:
        """FP32 (CUDA-core) FLOP/s ops that are no contraction reach: ``peak_flops x compute_efficiency``."""
        return self.peak_flops * self.compute_efficiency

    @property
    def effective_memory_bytes_per_s(self) -> float:
        """Memory bandwidth ops reach: ``memory_gbps x memory_efficiency`` (``compute_efficiency`` if unset)."""
        efficiency = self.compute_efficiency if self.memory_efficiency is None else self.memory_efficiency
        return self.memory_gbps * 1e9 * efficiency

    def math_mode(self, dtype: str | None) -> str:
        """The math mode a contraction of ``dtype`` runs in on this GPU (:data:`MATH_MODES`).

        ``float16`` / ``bfloat16`` on tensor cores where the profile has their rate; ``float32`` as
        TF32 where the profile has TF32 and :attr:`tf32_enabled`; anything else as FP32.
        """
        if dtype == "float16" and self.fp16_flops is not None:
            return MATH_FP16
        if dtype == "bfloat16" and self.bf16_flops is not None:
            return MATH_BF16
        if dtype == "float32" and self.tf32_flops is not None and self.tf32_enabled:
            return MATH_TF32
        return MATH_FP32

    def peak_flops_of(self, mode: str) -> float:
        """Nominal FLOP/s of a math mode (``peak_flops`` for FP32 and for a mode the GPU lacks)."""
        if mode not in MATH_MODE_FIELDS:
            raise ConfigError(f"unknown math mode {mode!r}; known: {list(MATH_MODE_FIELDS)}")
        value = getattr(self, MATH_MODE_FIELDS[mode])
        return self.peak_flops if value is None else value

    def contraction_flops_per_s(self, dtype: str | None, conv: bool = False) -> float:
        """FLOP/s a contraction of ``dtype`` reaches: its math mode's peak x ``contraction_efficiency``
        (a convolution's, ``conv``, x ``conv_efficiency`` where the profile has one)."""
        efficiency = self.compute_efficiency if self.contraction_efficiency is None else self.contraction_efficiency
        if conv and self.conv_efficiency is not None:
            efficiency = self.conv_efficiency
        return self.peak_flops_of(self.math_mode(dtype)) * efficiency

    def with_tf32(self, enabled: bool) -> "HardwareProfile":
        """This profile with float32 contractions at TF32 (``enabled``, where it has TF32) or at FP32."""
        return self if enabled == self.tf32_enabled else dataclasses.replace(self, tf32_enabled=bool(enabled))

    def math_summary(self) -> str:
        """One phrase: which math mode each floating dtype's contractions are priced at (for reports)."""
        parts = []
        for dtype in ("float32", "float16", "bfloat16"):
            mode = self.math_mode(dtype)
            rate = self.peak_flops_of(mode) / 1e12
            parts.append(f"{dtype} at {MATH_MODE_NAMES[mode]} ({rate:g} TFLOP/s peak)")
        why = ""
        if self.tf32_flops is not None:
            why = ("; TF32 on, as TensorFlow's tensor_float_32_execution" if self.tf32_enabled
                   else "; TF32 off (FP32), as TensorFlow's tensor_float_32_execution")
        return "contractions: " + ", ".join(parts) + why

    def source_of(self, field: str) -> str | None:
        """The citation :attr:`sources` gives ``field`` (``None`` when it cites none)."""
        return dict(self.sources).get(field)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values (``op_time_factors`` and ``sources`` as objects); see :meth:`from_dict`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["op_time_factors"] = dict(self.op_time_factors)
        out["sources"] = dict(self.sources)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HardwareProfile":
        """A profile from :meth:`to_dict`'s form (e.g. a JSON file); unknown keys are an error naming them."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a hardware profile must be a mapping of its fields, got {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(f"hardware profile {data.get('name', '?')!r}: unknown fields {unknown}; "
                              f"known: {sorted(fields)}")
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                         and f.name not in data)
        if missing:
            raise ConfigError(f"hardware profile {data.get('name', '?')!r}: missing fields {missing}")
        return cls(**dict(data))

    @property
    def effective_link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 * self.link_efficiency

    def copy_time_s(self, num_bytes: int) -> float:
        """Time of one host copy of ``num_bytes`` in one direction."""
        return self.link_latency_s + num_bytes / self.effective_link_bytes_per_s
