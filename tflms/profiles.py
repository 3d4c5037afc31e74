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
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from tflms.errors import ConfigError
from tflms.units import parse_bytes

GIB = 2**30
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
        for field in ("link_latency_s", "launch_overhead_s"):
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

    def op_time_factor(self, op_type: str) -> float:
        """The factor :attr:`op_time_factors` gives ``op_type`` (1.0 when it lists none)."""
        return self._factor_by_type.get(op_type, 1.0)

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def effective_memory_bytes_per_s(self) -> float:
        return self.memory_gbps * 1e9 * self.compute_efficiency

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


for _p in (
    HardwareProfile("v100-16gb-pcie3", 16 * GIB, 14e12, 900, 15.75, host_memory_bytes=256 * GIB,
                    description="NVIDIA V100 16GB PCIe on PCIe 3.0 x16"),
    HardwareProfile("v100-32gb-nvlink2", 32 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    description="NVIDIA V100 SXM2 32GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS paper setup)"),
    HardwareProfile("v100-16gb-nvlink2", 16 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    description="NVIDIA V100 SXM2 16GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS's hardware)"),
    HardwareProfile("a100-80gb-pcie4", 80 * GIB, 19.5e12, 1935, 31.5, host_memory_bytes=512 * GIB,
                    description="NVIDIA A100 80GB PCIe on PCIe 4.0 x16"),
    HardwareProfile("h100-80gb-pcie5", 80 * GIB, 51e12, 2000, 63, host_memory_bytes=1024 * GIB,
                    description="NVIDIA H100 80GB PCIe on PCIe 5.0 x16"),
    HardwareProfile("gh200", 96 * GIB, 67e12, 4000, 450, host_memory_bytes=480 * GIB,
                    description="NVIDIA GH200 Grace Hopper: H100 96GB HBM3, NVLink-C2C to 480GB LPDDR5X"),
):
    register_profile(_p)


def get_profile(profile: str | HardwareProfile) -> HardwareProfile:
    """A profile by name (or the profile itself)."""
    if isinstance(profile, HardwareProfile):
        return profile
    try:
        return _PROFILES[profile]
    except KeyError:
        raise ConfigError(f"unknown hardware profile {profile!r}; known: {sorted(_PROFILES)} "
                          "(or build a tflms.sim.HardwareProfile)") from None


def profile_names() -> list[str]:
    return sorted(_PROFILES)


#: How a profile was chosen (:attr:`ProfileChoice.source`).
PROFILE_GIVEN, PROFILE_FROM_DEVICE, PROFILE_DEFAULT = "given", "device", "default"

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
    ``memory_bytes`` is ``None``). Then the host link: a name saying ``SXM`` or
    ``NVLINK`` prefers an ``nvlink`` profile, any other (``PCIE``, consumer cards)
    a ``pcie`` one.
    Ties go to the name. Deterministic and pure:
    it reads nothing from the machine (see :func:`tflms.devices.local_gpu`).
    """
    if memory_bytes is None:
        found = _MEMORY_IN_NAME.search(device_name)
        memory_bytes = int(found.group(1)) * GIB if found else None
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    family = [p for p in _PROFILES.values() if p.name.split("-")[0].lower() in words]
    pool = family or list(_PROFILES.values())
    link = "nvlink" if any(w in device_name.lower() for w in ("sxm", "nvlink")) else "pcie"

    def other_link(p: HardwareProfile) -> bool:
        return link not in p.name

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
        return ProfileChoice(get_profile(given).name, PROFILE_GIVEN, "given in the configuration")
    if gpu is not None:
        return profile_for_device(*gpu)
    return ProfileChoice(DEFAULT_PROFILE, PROFILE_DEFAULT,
                         "the default profile: none was given and this machine has no GPU to match one to")
