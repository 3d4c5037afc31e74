"""Static memory planning over tensor lifetimes, and models of online allocators.

Pure Python + numpy; no TensorFlow. Feed it :class:`Lifetime` records (a tensor's
size and the schedule steps it is alive over) and compare

- the smallest single pool a static plan needs (:func:`best_plan` and the
  individual strategies in :mod:`tflms.memplan.offsets`), against
- what TensorFlow's BFC allocator or PyTorch's caching allocator would reserve
  for the same allocate/free sequence (:func:`replay` in :mod:`tflms.memplan.allocators`),

both measured against the :func:`lower_bound` (the most bytes alive at once).
"""

from tflms.memplan.allocators import (
    AllocatorResult,
    BFCAllocatorModel,
    CachingAllocatorModel,
    OutOfMemoryError,
    replay,
)
from tflms.memplan.lifetimes import Event, Lifetime, LifetimeError, events, live_bytes_profile, lower_bound
from tflms.memplan.offsets import (
    STRATEGIES,
    InvalidPlanError,
    Plan,
    best_plan,
    first_fit,
    greedy_by_breadth,
    greedy_by_duration,
    greedy_by_size,
    validate,
)

__all__ = [
    "AllocatorResult", "BFCAllocatorModel", "CachingAllocatorModel", "Event", "InvalidPlanError",
    "Lifetime", "LifetimeError", "OutOfMemoryError", "Plan", "STRATEGIES", "best_plan", "events",
    "first_fit", "greedy_by_breadth", "greedy_by_duration", "greedy_by_size", "live_bytes_profile",
    "lower_bound", "replay", "validate",
]
