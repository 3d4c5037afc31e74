"""The relaxation's fill (tflms.tune.recompute_sets._fill): what its room holds (``_Room``), and the judgment it
can skip."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tflms.ir.graph import TensorRef
from tflms.testing import GraphBuilder
from tflms.tune import recompute_sets


def test_the_room_keeps_an_output_where_it_fits_over_its_life():
    """``_Room.keep``: each kept output lives from its op's end to its backward reader (``_kept_spans``) and fits
    where the memory held over that span, with what was kept before it, stays under the budget; one that does not
    fit leaves the room as it was."""
    b = GraphBuilder()
    spans = {"a": (1000, 1.0, 4.0), "big": (4000, 2.0, 8.0), "b": (1500, 6.5, 9.0)}
    records, decisions = [], []
    for name, (size, made, read) in spans.items():
        b.op(name, "Placeholder", shape=(size // 4,))
        records += [types.SimpleNamespace(name=name, start_s=made - 0.5, end_s=made),
                    types.SimpleNamespace(name="grad_" + name, start_s=read, end_s=read + 0.1)]
        decisions.append(types.SimpleNamespace(ops=(name,), tensors=(TensorRef(name),), readers=(("grad_" + name,),),
                                               clones=("lms/recompute_" + name,)))
    sim = types.SimpleNamespace(timeline=((0.0, 2000, 0), (5.0, 9700, 0), (6.0, 2000, 0), (10.0, 0, 0)), ops=records)
    fit = types.SimpleNamespace(sim=sim, plan=types.SimpleNamespace(recomputes=decisions))
    ev = types.SimpleNamespace(analysis=types.SimpleNamespace(graph=b.graph), budget=10_000, need=lambda sim: 9_700)
    room = recompute_sets._Room(ev, fit)
    held = room.held.copy()
    assert room.keep("big") is False and np.array_equal(room.held, held)  # over the peak: 4,000 in 300
    assert room.keep("a") is True and room.keep("b") is True  # before the peak, after it
    assert room.held.tolist() == [3000, 9700, 3500, 0]


@pytest.mark.parametrize("clock, peak_judged", [("serial", False), ("graph", False), ("xla-clusters", True)])
def test_the_fill_skips_the_room_at_the_peak_where_the_larger_fill_fits_and_every_kernel_runs(monkeypatch, clock,
                                                                                               peak_judged):
    """Where the fill over the kept tensors' lives fits and keeps every op the room at the peak would, the peak's
    fill re-runs a superset of its ops: off the XLA clocks each re-run is a kernel on the one compute stream, so that
    plan computes no shorter and is not simulated. On the XLA clocks a clone may cost nothing (fused into its
    reader), and the peak's fill is judged as before."""
    b = GraphBuilder()
    spans = {"a": (1000, 1.0, 4.0), "d": (52, 1.0, 9.0)}  # a lives before the peak; d (52 bytes) fits at it
    records, decisions = [], []
    for name, (size, made, read) in spans.items():
        b.op(name, "Placeholder", shape=(size // 4,))
        records += [types.SimpleNamespace(name=name, start_s=made - 0.5, end_s=made),
                    types.SimpleNamespace(name="grad_" + name, start_s=read, end_s=read + 0.1)]
        decisions.append(types.SimpleNamespace(ops=(name,), tensors=(TensorRef(name),), readers=(("grad_" + name,),),
                                               clones=("lms/recompute_" + name,)))
    sim = types.SimpleNamespace(clock=clock, timeline=((0.0, 2000, 0), (5.0, 9700, 0), (6.0, 2000, 0), (10.0, 0, 0)),
                                ops=records)
    fit = types.SimpleNamespace(sim=sim, plan=types.SimpleNamespace(recomputes=decisions))
    ev = types.SimpleNamespace(analysis=types.SimpleNamespace(graph=b.graph), budget=10_000, need=lambda sim: 9_700)
    judged = []

    def judge(ev_, times, rerun, skipped, params):
        judged.append(params)
        return types.SimpleNamespace(fits=True)

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    recompute_sets._fill(ev, {}, fit, ["kept", "a", "d"], 1, {"a": 1.0, "d": 1.0}, (), {"kept": 1})
    assert judged[0] == {"kept": 1, "filled": 2}  # a and d, over their lives
    assert [p.get("peak") for p in judged[1:]] == ([1] if peak_judged else [])

