"""Which hardware profiles exist by name: the registry, and a profile read from a JSON file.

:func:`register_profile` adds a profile under its name (:mod:`tflms.profiles.vendors` registers the vendors'
when the package is imported), :func:`get_profile` finds one by name, from a file, or as given.
"""

from __future__ import annotations

from collections.abc import Mapping

from tflms.errors import ConfigError
from tflms.profiles.hardware import HardwareProfile

_PROFILES: dict[str, HardwareProfile] = {}


def register_profile(profile: HardwareProfile) -> HardwareProfile:
    """Make ``profile`` available by name to :func:`get_profile` (and the CLI)."""
    _PROFILES[profile.name] = profile
    return profile


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
