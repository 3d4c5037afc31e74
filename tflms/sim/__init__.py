"""Memory and time simulator over an execution order, with hardware profiles."""

from tflms.profiles import HardwareProfile, get_profile, profile_names, register_profile
from tflms.sim.simulator import (ONEDNN_CPU_WORKSPACES, SimOptions, SimResult, compare, level_order,
                                 order_from_start_times, simulate)

__all__ = ["ONEDNN_CPU_WORKSPACES", "HardwareProfile", "SimOptions", "SimResult", "compare", "get_profile",
           "level_order", "order_from_start_times", "profile_names", "register_profile", "simulate"]
