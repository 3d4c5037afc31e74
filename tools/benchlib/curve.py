"""``bench.py --curve``: simulated samples/s against batch size, every method, from ``none``'s maximum to the bound.

At each sampled batch every method runs exactly as at a search's common batch (:func:`benchlib.search.run_at_size`:
the full tune for the tflms methods, grappler's rewrite, the traced checkpoint-segments and keras-remat steps), so a
point is that method's own rewrite at that batch. A method whose peak with headroom exceeds the budget there has no
point (``None``): samples/s = batch / simulated step time where it fits.
"""

from __future__ import annotations

from .common import BOUND, HEADROOM, METHODS, say
from .models import MODELS, Steps
from .search import MethodResult, run_at_size

#: Batches sampled per curve unless ``--curve-points`` says otherwise (each runs every method, the full tune included).
CURVE_POINTS = 6


def curve_batches(low: int, high: int, points: int = CURVE_POINTS) -> list[int]:
    """``points`` batches evenly spaced from ``low`` to ``high``, both included, rounded and without repeats.

    ``low`` below 1 (nothing fits unchanged) starts at 1; ``high`` at or below ``low`` gives ``[low]``.
    """
    if points < 2:
        raise ValueError(f"curve_batches: at least 2 points (the two ends), got {points}")
    low = max(1, low)
    if high <= low:
        return [low]
    return sorted({round(low + i * (high - low) / (points - 1)) for i in range(points)})


def throughput_curve(steps: Steps, model: str, profile_name: str, budget: int | None,
                     results: dict[str, MethodResult], points: int = CURVE_POINTS,
                     headroom: float = HEADROOM) -> list[int]:
    """Fill each method's ``curve`` in ``results`` (a search's, with :data:`BOUND`): ``(batch, step seconds or
    None)`` at :func:`curve_batches` from ``none``'s maximum to the swap-only bound's. Returns the batches.

    Batch models only: a resolution model's size is a volume at batch 1 (``ValueError``).
    """
    if MODELS[model].kind != "batch":
        raise ValueError(f"throughput_curve: {model}'s size is a volume at batch 1, not a batch: no samples/s curve")
    batches = curve_batches(results["none"].max_size, results[BOUND].max_size, points)
    say(f"{model} {profile_name}: throughput curve at batches {batches}")
    for method in METHODS:
        results[method].curve = []
    for batch in batches:
        at = run_at_size(steps, model, profile_name, budget, batch, headroom)
        for method in METHODS:
            r = at[method]
            results[method].curve.append((batch, r.sim.step_time_s if r.overhead is not None else None))
    return batches
