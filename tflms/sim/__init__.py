"""Memory and time simulator over an execution order, with hardware profiles."""

from tflms.sim.profiles import HardwareProfile, get_profile, profile_names, register_profile
from tflms.sim.simulator import SimOptions, SimResult, compare, level_order, simulate

__all__ = ["HardwareProfile", "SimOptions", "SimResult", "compare", "get_profile", "level_order",
           "profile_names", "register_profile", "simulate"]
