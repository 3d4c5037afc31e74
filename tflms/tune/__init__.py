"""Auto-tuner: searches swap parameters that fit a memory budget, using the simulator."""

from tflms.tune.tuner import DEFAULT_STRATEGIES, STRATEGIES, Candidate, TuneResult, tune

__all__ = ["DEFAULT_STRATEGIES", "STRATEGIES", "Candidate", "TuneResult", "tune"]
