"""Hardware profiles: accelerator memory, compute, memory bandwidth and host link.

Every figure is a vendor's nominal number, cited where the profile is defined
(:mod:`tflms.profiles.vendors`); the simulator derates
them by the profile's ``compute_efficiency`` / ``link_efficiency`` (what
training kernels and pinned-memory copies reach in practice). Users define their
own with :class:`HardwareProfile` or :func:`register_profile`.

The package decides three things, one module each:

- :mod:`tflms.profiles.hardware`: what a profile is and how it prices work (:class:`HardwareProfile`:
  its fields, their checks, and the rates by math mode the simulator reads);
- :mod:`tflms.profiles.registry` and :mod:`tflms.profiles.vendors`: which profiles exist by name (the registry,
  a profile from a JSON file) and the vendors' profiles registered in it, each figure cited;
- :mod:`tflms.profiles.matching`: which profile a rewrite plans for (given, matched to this machine's GPU, or
  :data:`DEFAULT_PROFILE`), and why (:class:`ProfileChoice`).

Every name stays importable from ``tflms.profiles``.
"""

from tflms.profiles.hardware import (GIB, MATH_BF16, MATH_FP16, MATH_FP32, MATH_MODE_FIELDS, MATH_MODE_NAMES,
                                     MATH_TF32, HardwareProfile)
from tflms.profiles.registry import (get_profile, is_profile_file, load_profile, profile_names,
                                     register_profile)
from tflms.profiles.vendors import _cite  # noqa: F401 (imported for its side effect: the vendors' profiles registered)
from tflms.profiles.matching import (DEFAULT_PROFILE, PROFILE_DEFAULT, PROFILE_FROM_DEVICE, PROFILE_GIVEN,
                                     ProfileChoice, profile_for_device, select_profile)
# the private names stay importable from here too (tests add profiles to the registry: the same dict)
from tflms.profiles.registry import _PROFILES  # noqa: F401
from tflms.profiles.vendors import (_A100, _AC922, _ASSUMED, _GH200, _H100, _H100_MEASURED_CONV,  # noqa: F401
                                    _H100_MEASURED_COPY, _H100_MEASURED_LATENCY, _H100_MEASURED_LINK,
                                    _H100_MEASURED_MM, _H200, _H200_MEASURED_COPY, _H200_MEASURED_MM, _HOST_SERVER,
                                    _PCIE3, _PCIE4, _PCIE5, _SPARSE, _TFLMS, _V100, _V100_COMMON)
from tflms.profiles.matching import _MEMORY_IN_NAME, _SXM_WORDS  # noqa: F401

__all__ = ["DEFAULT_PROFILE", "GIB", "MATH_BF16", "MATH_FP16", "MATH_FP32", "MATH_MODE_FIELDS", "MATH_MODE_NAMES",
           "MATH_TF32", "PROFILE_DEFAULT", "PROFILE_FROM_DEVICE", "PROFILE_GIVEN", "HardwareProfile",
           "ProfileChoice", "get_profile", "is_profile_file", "load_profile", "profile_for_device", "profile_names",
           "register_profile", "select_profile"]
