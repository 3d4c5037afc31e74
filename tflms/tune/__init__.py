"""Auto-tuner: searches swap parameters that fit a memory budget, using the simulator."""

from tflms.tune.tuner import STRATEGIES, Candidate, TuneResult, tune

__all__ = ["STRATEGIES", "Candidate", "TuneResult", "tune"]
