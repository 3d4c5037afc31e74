"""Measure the peak memory of a graph two independent ways.

- :mod:`tflms.measure.executor`: TensorFlow's real executor in a subprocess, with the
  accelerator emulated by a second logical CPU (``/device:CPU:1``); peaks come from the
  allocation records of a traced step.
- :mod:`tflms.measure.grappler`: grappler's virtual cluster, an analytic estimate on a
  virtual GPU + CPU.

Importing this package does not import TensorFlow.
"""

from tflms.measure.executor import (ACCELERATOR_DEVICE, EMULATION_PROFILE, EMULATION_SIM_OPTIONS, HOST_DEVICE,
                                    DeviceMemory, ExecutorMeasurement, ExecutorRequest, MeasurementError, NodeTime,
                                    measure_executor_peak, measure_executor_peaks, step_request)
from tflms.measure.emulation import planning_for_emulation
from tflms.measure.grappler import GrapplerEstimate, GrapplerEstimateError, grappler_estimate, grappler_peak

__all__ = ["ACCELERATOR_DEVICE", "EMULATION_PROFILE", "EMULATION_SIM_OPTIONS", "HOST_DEVICE", "DeviceMemory",
           "ExecutorMeasurement", "ExecutorRequest", "GrapplerEstimate", "GrapplerEstimateError", "MeasurementError",
           "NodeTime", "grappler_estimate", "grappler_peak", "measure_executor_peak", "measure_executor_peaks",
           "planning_for_emulation", "step_request"]
