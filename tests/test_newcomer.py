"""What a new user meets (issue 14): honest verdicts, the hardware named, legends, full JSON, triggers."""

from __future__ import annotations

import json

import pytest

from tflms.analysis import analyze_graph
from tflms.pipeline import rewrite
from tflms.policies.swapplan import find_trigger
from tflms.testing import GraphBuilder

ACC = "/device:GPU:0"


# ------------------------------------------------------------------ triggers past identities
def _identity_window_graph():
    """``fw/a`` (level 1) is read again by ``gradient_tape/g`` (level 7), whose only ancestors at
    levels 5 and 6 are Identity ops; the nearest other ancestor is ``loss/l`` at level 4."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder")
    a = b.op("fw/a", "Relu", [x])
    c = b.op("fw/b", "Relu", [a])
    c = b.op("fw/c", "Relu", [c])
    loss = b.op("loss/l", "Mul", [c, c])
    i1 = b.op("gradient_tape/id1", "Identity", [loss])
    i2 = b.op("gradient_tape/id2", "Identity", [i1])
    b.op("gradient_tape/g", "ReluGrad", [i2, a])
    return b.graph


def test_trigger_skips_a_window_of_identities_to_the_nearest_other_ancestor():
    analysis = analyze_graph(_identity_window_graph())
    levels = analysis.levels
    assert (levels["fw/a"], levels["loss/l"], levels["gradient_tape/id2"], levels["gradient_tape/g"]) == (1, 4, 6, 7)
    # the window [6, 7) holds only an Identity: the trigger is the nearest ancestor below it that is not one
    assert find_trigger(analysis, "gradient_tape/g", 1, 6) == "loss/l"
    # never at or before the producer's level: from fw/b's level, nothing qualifies
    assert find_trigger(analysis, "gradient_tape/g", 4, 6) is None


def test_identity_window_no_longer_falls_back_to_a_synchronous_swap_in():
    report = rewrite(_identity_window_graph(), swapout_threshold=2, accelerator_device=ACC).report
    swap = next(s for s in report.swaps if s.tensor.name == "fw/a:0")
    [group] = swap.swap_ins
    assert (group.trigger, group.trigger_level, group.sync) == ("loss/l", 4, False)
