"""What a memory budget counts, and the margin a predicted peak keeps below it (docs/guide.md, "The budget").

The budget is compared with the simulator's peak of accelerator memory over one training step
(:class:`tflms.sim.simulator.SimResult`): the resident bytes (weights, optimizer slots, the step's arguments,
constants) plus the most bytes of the step's own tensors alive at once (activations, gradients, temporaries).
tflms moves only tensors the step computes (activations, mostly): weights and optimizer state stay on the
accelerator. The simulator does not see what static shapes cannot show: cuDNN and cuBLAS workspaces and the
allocator's fragmentation (``fit_by="bfc"`` models the latter). The margin is room for those.

:data:`DEFAULT_MARGIN_FRACTION` is the one figure for the library and the bench (``tools/benchlib/common.py``
``HEADROOM``): a plan fits when ``peak * (1 + margin)`` is within the budget. It applies where tflms chooses the
budget itself, a GPU's or a profile's memory. A budget the user gives is their own limit, kept as given (no
margin): room they want kept free is already left out of it.
"""

from __future__ import annotations

from typing import Any

#: The margin on a predicted peak when the budget is a device's (or a profile's) whole memory: 5%.
#: A judgement, not a fit to measurements (no GPU TensorFlow has run here): room for kernel workspaces and
#: fragmentation, which the simulator does not see, that costs little (0.8 GB of a 16 GB V100). It is the headroom
#: every bench figure in docs/results.md was judged with, so the library's verdicts and those figures agree. The
#: report's measured peak (on a GPU, after the first step) beside the predicted one is how to check it.
DEFAULT_MARGIN_FRACTION = 0.05


def margin_fraction(budget_bytes: int | None) -> float:
    """The margin for a budget: :data:`DEFAULT_MARGIN_FRACTION` when tflms chose it (``None``: the device's or the
    profile's memory), ``0.0`` for a budget the user gave."""
    return DEFAULT_MARGIN_FRACTION if budget_bytes is None else 0.0


def budget_sim_options(config: Any) -> Any:
    """The simulator options a budget of ``config`` (an :class:`~tflms.config.LMSConfig`) is judged with: its host
    device and :func:`margin_fraction` of its ``budget_bytes``."""
    from tflms.sim.simulator import SimOptions
    return SimOptions(host_device=config.host_device, margin_fraction=margin_fraction(config.budget_bytes))


def margin_text(budget_bytes: int | None) -> str:
    """Half a sentence for reports: how the predicted peak is held below the budget."""
    fraction = margin_fraction(budget_bytes)
    if not fraction:
        return "the predicted peak must be within it (a budget you give gets no margin)"
    return f"the predicted peak plus a {fraction:.0%} margin must be within it"
