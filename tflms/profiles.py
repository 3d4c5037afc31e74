"""Hardware profiles: accelerator memory, compute, memory bandwidth and host link.

Every figure is a vendor's nominal number, cited below; the simulator derates
them by the profile's ``compute_efficiency`` / ``link_efficiency`` (what
training kernels and pinned-memory copies reach in practice). Users define their
own with :class:`HardwareProfile` or :func:`register_profile`.

Sources:
- V100: NVIDIA Tesla V100 datasheet (PCIe: 14 TFLOPS FP32, SXM2: 15.7 TFLOPS,
  HBM2 900 GB/s). PCIe 3.0 x16: 15.75 GB/s per direction.
- POWER9 AC922 with V100 SXM2 32GB: NVLink 2.0 CPU-GPU, 3 bricks x 25 GB/s = 75 GB/s
  per direction (IBM AC922 redbook; the setting of the TFLMS paper).
- POWER9 AC922 with V100 SXM2 16GB (``v100-16gb-nvlink2``, TFLMS's hardware class: Le et al.,
  ISMM 2019, trained on 16 GB V100s in an AC922): the same NVLink 2.0 host link, 3 bricks x
  25 GB/s = 75 GB/s per direction (IBM Redbook REDP-5472, "IBM Power System AC922 Introduction
  and Technical Overview", four-GPU configuration), 15.7 TFLOPS FP32 and 900 GB/s HBM2 (NVIDIA
  Tesla V100 SXM2 datasheet).
- A100 80GB PCIe: 19.5 TFLOPS FP32, 1935 GB/s HBM2e (NVIDIA A100 datasheet); PCIe 4.0 x16:
  31.5 GB/s per direction.
- H100 80GB PCIe: 51 TFLOPS FP32, 2.0 TB/s HBM2e (NVIDIA H100 datasheet); PCIe 5.0 x16:
  63 GB/s per direction.
- GH200 Grace Hopper: H100 with 96 GB HBM3 (67 TFLOPS FP32, 4 TB/s), NVLink-C2C 900 GB/s total,
  450 GB/s per direction, 480 GB LPDDR5X host memory (NVIDIA GH200 datasheet).

Rates by math mode (issue 28): ``peak_flops`` is the FP32 (CUDA-core) rate; ``tf32_flops``,
``fp16_flops`` and ``bf16_flops`` are the dense tensor-core rates (the datasheets' figures marked
"with sparsity" halved). :mod:`tflms.sim.cost` prices a contraction (MatMul, BatchMatMul, Einsum,
Conv and their fused forms) by its dtype at these rates x ``contraction_efficiency`` (convolutions x
``conv_efficiency`` where a profile measured it), and every op's
memory traffic at ``memory_gbps`` x ``memory_efficiency``; each profile's ``sources`` cites where
every figure comes from (``HardwareProfile.source_of``).
"""

from __future__ import annotations

import dataclasses
import math
import re
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
#: The profile the tuner and the simulator use when none is named (said in every report that uses it).
DEFAULT_PROFILE = "v100-16gb-pcie3"


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


_PROFILES: dict[str, HardwareProfile] = {}


def register_profile(profile: HardwareProfile) -> HardwareProfile:
    """Make ``profile`` available by name to :func:`get_profile` (and the CLI)."""
    _PROFILES[profile.name] = profile
    return profile


# ---------------------------------------------------------------------------------------------- citations
_V100 = "NVIDIA Tesla V100 GPU datasheet (Jul 2017), https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf"
_AC922 = "IBM Redbook REDP-5472, IBM Power System AC922 Introduction and Technical Overview (NVLink 2.0, 3 x 25 GB/s per direction)"
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
         "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-tensor-core/"
         "nvidia-tensor-core-gpu-datasheet")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet / product page (2024), https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet (2023), https://resources.nvidia.com/en-us-grace-cpu/"
          "grace-hopper-superchip")
_PCIE3 = "PCI Express 3.0 x16: 8 GT/s x 16 lanes, 128b/130b = 15.75 GB/s per direction (PCI-SIG PCIe 3.0 base spec)"
_PCIE4 = "PCI Express 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per direction (PCI-SIG PCIe 4.0 base spec)"
_PCIE5 = "PCI Express 5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s per direction (PCI-SIG PCIe 5.0 base spec)"
_SPARSE = " (the datasheet's 'with sparsity' figure halved: dense)"
#: Issue 28's measurements (PyTorch, random data, mean of ten after warm-up): an 8192^3 bfloat16 product
#: and a device-to-device copy (bytes read plus written).
_H100_MEASURED_MM = "measured on an H100 80GB HBM3 (issue 28): 8192^3 bf16 MatMul 798 TFLOP/s / 989.5 = 0.81"
_H100_MEASURED_COPY = "measured on an H100 80GB HBM3 (issue 28): device copy 3.0 TB/s / 3.35 = 0.90"
_H200_MEASURED_MM = "measured on an H200 (issue 28): 8192^3 bf16 MatMul 788 TFLOP/s / 989.5 = 0.80"
_H200_MEASURED_COPY = "measured on an H200 (issue 28): device copy 4.3 TB/s / 4.8 = 0.90"
#: tools/gpu_probe.py --conv-layers, twice on an H100 80GB HBM3 (2026-11-26,
#: docs/profiles/h100-80gb-hbm3-conv-layers.json and h100-80gb-hbm3-elementwise.json): ResNet-50's 13 stride-1
#: convolution shapes at batch 64, forward and both gradients, float32 (TF32) and bfloat16, each at its faster
#: layout; `tools/compare_profile.py A B --fit-conv` fits the efficiency at which the roofline (with the
#: contraction latency below) predicts their total time (geometric mean over both runs and dtypes; 0.250 for
#: TF32 alone, 0.173 for bfloat16 alone).
_H100_MEASURED_CONV = ("measured on an H100 80GB HBM3 (tools/gpu_probe.py --conv-layers, two runs, 2026-11-26, "
                       "docs/profiles/h100-80gb-hbm3-conv-layers.json, h100-80gb-hbm3-elementwise.json): "
                       "ResNet-50's convolutions at batch 64, forward and backward, reach 85-96 TFLOP/s in TF32 and "
                       "108-137 in BF16; tools/compare_profile.py --fit-conv over both runs, with the "
                       "14.5 us contraction latency: 0.210")
#: tools/gpu_probe.py --matmul-n 1024 / 2048 / 4096 on an H100 80GB HBM3 (2026-11-26,
#: docs/profiles/h100-80gb-hbm3-n*.json): bf16 products at 105 / 468 / 747 TFLOP/s and tf32 at 69 / 268 / 386
#: against 795 / 413 at 8192^3. The roofline with the launch overhead priced them up to 3x too fast; 14.5 us
#: more per contraction makes the geometric mean of predicted over measured time over the six 1.
_H100_MEASURED_LATENCY = ("measured on an H100 80GB HBM3 (tools/gpu_probe.py --matmul-n 1024/2048/4096, 2026-11-26, "
                          "docs/profiles/h100-80gb-hbm3-n*.json): bf16 and tf32 products of those sizes take "
                          "7.5-21 us more than the roofline and launch overhead; fitted over the six: 14.5 us")
_H100_MEASURED_LINK = ("measured on an H100 80GB HBM3 and an H200 (tools/gpu_probe.py, 2026-11-26, "
                       "docs/profiles/h100-80gb-hbm3.json, docs/profiles/h200.json): pinned copies 54.5-55.2 GB/s "
                       "each way of PCIe 5.0's 63 = 0.87")
_ASSUMED = (" -- assumed from the H100 SXM5 measurement of issue 28 (same cuBLAS/cuDNN kernel class), not measured "
            "on this GPU; tools/gpu_probe.py measures it")
_TFLMS = "tflms default, not a vendor figure (kept from the first profiles)"
_HOST_SERVER = "assumed: a two-socket PCIe server (a system figure, not the GPU's)"


def _cite(**sources: str) -> dict[str, str]:
    return sources


_V100_COMMON = _cite(memory_gbps=_V100 + ": HBM2 900 GB/s", compute_efficiency=_TFLMS,
                     link_efficiency=_TFLMS, link_latency_s=_TFLMS, launch_overhead_s=_TFLMS)

for _p in (
    # V100: no TF32, no BF16 (Volta); float32 contractions stay at FP32, so the V100 rows of
    # docs/results.md do not move. FP16 tensor cores: 112 TFLOPS (PCIe), 125 TFLOPS (SXM2).
    HardwareProfile("v100-16gb-pcie3", 16 * GIB, 14e12, 900, 15.75, host_memory_bytes=256 * GIB,
                    fp16_flops=112e12,
                    description="NVIDIA V100 16GB PCIe on PCIe 3.0 x16",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 PCIe 14 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 PCIe 112 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 16 GB HBM2", "link_gbps": _PCIE3,
                             "host_memory_bytes": _HOST_SERVER}),
    HardwareProfile("v100-32gb-nvlink2", 32 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    fp16_flops=125e12,
                    description="NVIDIA V100 SXM2 32GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS paper setup)",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 SXM2 15.7 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 SXM2 125 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 32 GB HBM2", "link_gbps": _AC922,
                             "host_memory_bytes": _AC922 + " (512 GB configuration)"}),
    HardwareProfile("v100-16gb-nvlink2", 16 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    fp16_flops=125e12,
                    description="NVIDIA V100 SXM2 16GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS's hardware)",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 SXM2 15.7 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 SXM2 125 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 16 GB HBM2", "link_gbps": _AC922,
                             "host_memory_bytes": _AC922 + " (512 GB configuration)"}),
    # A100 (Ampere): FP32 19.5, TF32 156, BF16/FP16 312 dense TFLOPS, every form factor.
    HardwareProfile("a100-40gb-pcie4", 40 * GIB, 19.5e12, 1555, 31.5, host_memory_bytes=512 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 40GB PCIe on PCIe 4.0 x16",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 40GB PCIe, 40 GB HBM2",
                        memory_gbps=_A100 + ": A100 40GB PCIe, 1,555 GB/s", link_gbps=_PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    HardwareProfile("a100-80gb-pcie4", 80 * GIB, 19.5e12, 1935, 31.5, host_memory_bytes=512 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 80GB PCIe on PCIe 4.0 x16",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 80GB PCIe, 80 GB HBM2e",
                        memory_gbps=_A100 + ": A100 80GB PCIe, 1,935 GB/s", link_gbps=_PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    HardwareProfile("a100-80gb-sxm4", 80 * GIB, 19.5e12, 2039, 31.5, host_memory_bytes=1024 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 80GB SXM4 (HGX A100), PCIe 4.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 80GB SXM, 80 GB HBM2e",
                        memory_gbps=_A100 + ": A100 80GB SXM, 2,039 GB/s",
                        link_gbps=_A100 + ": PCIe Gen4 64 GB/s (both directions); " + _PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED,
                        host_memory_bytes="NVIDIA DGX A100 datasheet: 1 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # H100 (Hopper). SXM5: FP32 67, TF32 494.5, BF16/FP16 989.5 dense TFLOPS, 3.35 TB/s;
    # PCIe: FP32 51, TF32 378, BF16/FP16 756.5 dense TFLOPS, 2.0 TB/s. Both: PCIe Gen5 128 GB/s to the host.
    HardwareProfile("h100-80gb-sxm5", 80 * GIB, 67e12, 3350, 63, host_memory_bytes=2048 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H100 80GB SXM5 (HGX H100), PCIe 5.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_H100 + ": H100 SXM FP32 67 TFLOPS",
                        tf32_flops=_H100 + ": H100 SXM TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_H100 + ": H100 SXM FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_H100 + ": H100 SXM BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_H100 + ": H100 SXM 80 GB", memory_gbps=_H100 + ": H100 SXM 3.35 TB/s",
                        link_gbps=_H100 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H100_MEASURED_MM, memory_efficiency=_H100_MEASURED_COPY,
                        host_memory_bytes="NVIDIA DGX H100 datasheet: 2 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK,
                        contraction_latency_s=_H100_MEASURED_LATENCY,
                        conv_efficiency=_H100_MEASURED_CONV, link_latency_s=_TFLMS, launch_overhead_s=_TFLMS)),
    HardwareProfile("h100-80gb-pcie5", 80 * GIB, 51e12, 2000, 63, host_memory_bytes=1024 * GIB,
                    tf32_flops=378e12, fp16_flops=756.5e12, bf16_flops=756.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H100 80GB PCIe on PCIe 5.0 x16",
                    sources=_cite(
                        peak_flops=_H100 + ": H100 PCIe FP32 51 TFLOPS",
                        tf32_flops=_H100 + ": H100 PCIe TF32 Tensor Core 756" + _SPARSE,
                        fp16_flops=_H100 + ": H100 PCIe FP16 Tensor Core 1,513" + _SPARSE,
                        bf16_flops=_H100 + ": H100 PCIe BF16 Tensor Core 1,513" + _SPARSE,
                        memory_bytes=_H100 + ": H100 PCIe 80 GB", memory_gbps=_H100 + ": H100 PCIe 2 TB/s",
                        link_gbps=_H100 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED.replace(
                            "(same", "(the SXM5 part; the PCIe card's lower power limit may lower it; same"),
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK + _ASSUMED,
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # H200 (Hopper, HBM3e): the H100 SXM's compute, 141 GB at 4.8 TB/s.
    HardwareProfile("h200-141gb", 141 * GIB, 67e12, 4800, 63, host_memory_bytes=2048 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.80, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H200 141GB SXM (HGX H200), PCIe 5.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_H200 + ": H200 SXM FP32 67 TFLOPS",
                        tf32_flops=_H200 + ": H200 SXM TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_H200 + ": H200 SXM FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_H200 + ": H200 SXM BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_H200 + ": 141 GB HBM3e", memory_gbps=_H200 + ": 4.8 TB/s",
                        link_gbps=_H200 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H200_MEASURED_MM, memory_efficiency=_H200_MEASURED_COPY,
                        host_memory_bytes="NVIDIA DGX H200 datasheet: 2 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK,
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # GH200: an H100 with 96 GB HBM3 at 4 TB/s, NVLink-C2C (900 GB/s total) to 480 GB LPDDR5X.
    HardwareProfile("gh200", 96 * GIB, 67e12, 4000, 450, host_memory_bytes=480 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6,
                    description="NVIDIA GH200 Grace Hopper: H100 96GB HBM3, NVLink-C2C to 480GB LPDDR5X",
                    sources=_cite(
                        peak_flops=_GH200 + ": FP32 67 TFLOPS",
                        tf32_flops=_GH200 + ": TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_GH200 + ": FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_GH200 + ": BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_GH200 + ": 96 GB HBM3", memory_gbps=_GH200 + ": 4 TB/s",
                        link_gbps=_GH200 + ": NVLink-C2C 900 GB/s (both directions), 450 GB/s per direction",
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED,
                        host_memory_bytes=_GH200 + ": up to 480 GB LPDDR5X",
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
):
    register_profile(_p)


def load_profile(path: str) -> HardwareProfile:
    """The profile a JSON file describes, registered under its name: :meth:`HardwareProfile.to_dict`'s form, or
    the output of ``tools/gpu_probe.py`` (its ``profile`` object). Errors name the file and what is wrong."""
    import json
    import os
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read the hardware profile file {path!r}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"hardware profile file {path!r} is not JSON: {err}") from None
    if isinstance(data, Mapping) and "profile" in data and "measurements" in data:
        data = data["profile"]  # tools/gpu_probe.py's output
    try:
        profile = HardwareProfile.from_dict(data)
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"hardware profile file {os.fspath(path)!r}: {err}") from None
    known = _PROFILES.get(profile.name)
    if known is not None and known != profile:
        raise ConfigError(f"hardware profile file {path!r} names {profile.name!r}, which is already another "
                          "profile: rename it in the file")
    return register_profile(profile)


def is_profile_file(profile: str) -> bool:
    """Whether ``profile`` names a JSON file rather than a registered profile."""
    return profile.endswith(".json")


def get_profile(profile: str | HardwareProfile) -> HardwareProfile:
    """A profile by name, from a JSON file (a name ending in ``.json``: :func:`load_profile`), or the profile
    itself."""
    if isinstance(profile, HardwareProfile):
        return profile
    if is_profile_file(profile):
        return load_profile(profile)
    try:
        return _PROFILES[profile]
    except KeyError:
        raise ConfigError(f"unknown hardware profile {profile!r}; known: {sorted(_PROFILES)} "
                          "(or build a tflms.sim.HardwareProfile)") from None


def profile_names() -> list[str]:
    return sorted(_PROFILES)


#: How a profile was chosen (:attr:`ProfileChoice.source`).
PROFILE_GIVEN, PROFILE_FROM_DEVICE, PROFILE_DEFAULT = "given", "device", "default"

#: Words in a device's or a profile's name that say SXM form factor (NVLink to peers, or to the CPU).
_SXM_WORDS = ("sxm", "nvlink", "hbm3")
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*G(?:i)?B", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ProfileChoice:
    """Which hardware profile a rewrite plans for, and why (printed in every report that simulates).

    ``source``: ``"given"`` (named in the config), ``"device"`` (matched to this
    machine's GPU by :func:`profile_for_device`) or ``"default"``
    (:data:`DEFAULT_PROFILE`: none given and no GPU found). ``why``: one sentence.
    """

    name: str
    source: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def profile_for_device(device_name: str, memory_bytes: int | None = None) -> ProfileChoice:
    """The registered profile closest to a GPU, from the device's name and memory.

    A profile's family is its name up to the first ``-`` (``v100``, ``a100``,
    ``h100``, ``gh200``); profiles whose family appears in ``device_name`` as a
    word (``"NVIDIA A100-SXM4-80GB"`` is an ``a100``) are preferred, and among
    them (or among all profiles when no family matches) the one whose memory is
    closest to ``memory_bytes`` wins (the memory in the name, e.g. ``80GB``, when
    ``memory_bytes`` is ``None``). Then the form factor: a name saying ``SXM``,
    ``NVLINK`` or ``HBM3`` (the H100 SXM5 reports itself as ``NVIDIA H100 80GB HBM3``; the
    PCIe card as ``NVIDIA H100 PCIe``) prefers an ``sxm`` or ``nvlink`` profile, any other
    (``PCIE``, consumer cards) a ``pcie`` one.
    Ties go to the name. Deterministic and pure:
    it reads nothing from the machine (see :func:`tflms.devices.local_gpu`).
    """
    if memory_bytes is None:
        found = _MEMORY_IN_NAME.search(device_name)
        memory_bytes = int(found.group(1)) * GIB if found else None
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    family = [p for p in _PROFILES.values() if p.name.split("-")[0].lower() in words]
    pool = family or list(_PROFILES.values())
    sxm = any(w in device_name.lower() for w in _SXM_WORDS)

    def other_link(p: HardwareProfile) -> bool:
        return any(w in p.name for w in _SXM_WORDS) != sxm

    if memory_bytes is None:
        best = min(pool, key=lambda p: (other_link(p), p.name))
    else:
        best = min(pool, key=lambda p: (abs(p.memory_bytes - memory_bytes), other_link(p), p.name))
    memory = "" if memory_bytes is None else f" with {memory_bytes / GIB:.0f} GiB"
    if family:
        why = (f"matched to this machine's GPU {device_name!r}{memory} (same family, closest memory); "
               "name another with profile=... (--profile)")
    else:
        why = (f"no profile for this machine's GPU {device_name!r}{memory}: the profile with the closest memory; "
               "name a better one with profile=... (--profile), or register_profile(HardwareProfile(...))")
    return ProfileChoice(best.name, PROFILE_FROM_DEVICE, why)


def select_profile(given: str | None, gpu: tuple[str, int | None] | None) -> ProfileChoice:
    """The profile to plan for: the one given, else the closest to ``gpu`` (name, memory), else the default."""
    if given is not None:
        where = f" (from the file {given})" if is_profile_file(given) else ""
        return ProfileChoice(get_profile(given).name, PROFILE_GIVEN, f"given in the configuration{where}")
    if gpu is not None:
        return profile_for_device(*gpu)
    return ProfileChoice(DEFAULT_PROFILE, PROFILE_DEFAULT,
                         "the default profile: none was given and this machine has no GPU to match one to")
