"""Which hardware profile a rewrite plans for, and why: given, matched to this machine's GPU, or the default.

:func:`select_profile` chooses (the pipeline, the estimate and the SavedModel commands call it) and returns a
:class:`ProfileChoice`, whose sentence every report that simulates prints; :func:`profile_for_device` is the
match to a GPU by its name and memory, pure (:func:`tflms.devices.local_gpu` reads the machine).
"""

from __future__ import annotations

import dataclasses
import re

from tflms.profiles.hardware import GIB, HardwareProfile
from tflms.profiles.registry import _PROFILES, get_profile, is_profile_file

#: The profile the tuner and the simulator use when none is named (said in every report that uses it).
DEFAULT_PROFILE = "v100-16gb-pcie3"

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
