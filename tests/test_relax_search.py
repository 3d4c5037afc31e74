"""The relaxation's search (tflms.tune.recompute_sets._relax): it starts where the fit's memory timeline says the
ranking stops fitting (``_Room.prefix``), walks from there, and ends where a count bisection would, on the same
one-op boundary; the fill's judgments it can skip."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tflms.ir.graph import TensorRef
from tflms.testing import GraphBuilder
from tflms.tune import recompute_sets

N = 600  # ops the fit re-runs, each its own decision (as many as BERT-base's relaxations rank, about)


def _fit(clock: str = "serial"):
    """A fit that re-runs ``N`` ops ``o0``, ``o1``, ... (100 bytes each, the dearest first by price per byte), with
    the graph, evaluator and prices the relaxation reads."""
    b = GraphBuilder()
    decisions = []
    for k in range(N):
        b.op(f"o{k}", "Placeholder", shape=(25,))
        decisions.append(types.SimpleNamespace(ops=(f"o{k}",), tensors=(TensorRef(f"o{k}"),),
                                               readers=((f"grad_o{k}",),), clones=(f"lms/recompute_o{k}",)))
    sim = types.SimpleNamespace(clock=clock, timeline=((0.0, 0, 0),), ops=())
    cand = types.SimpleNamespace(sim=sim, plan=types.SimpleNamespace(recomputes=decisions), params={"price": 1.0})
    ev = types.SimpleNamespace(analysis=types.SimpleNamespace(graph=b.graph), budget=10_000, need=lambda sim: 0)
    times = {f"o{k}": float(N - k) for k in range(N)}
    return ev, times, cand


@pytest.mark.parametrize("off", [-N, -300, -9, -1, 0, 1, 2, 9, 15, 16, 300, N])
@pytest.mark.parametrize("boundary", [1, 20, 300, N - 1])
def test_the_search_from_the_prediction_ends_on_the_bisections_boundary(monkeypatch, boundary, off):
    """Keeping up to ``boundary`` ops fits, one more does not. From any first count the walk (one op, then
    doubling, away from the first answer) and the bisection after it end where the count bisection did, to one op,
    within its budget of simulations, and the fill starts from that fit; from the right count it takes two."""
    ev, times, cand = _fit()
    judged, filled = [], []

    def judge(ev_, times_, rerun, skipped, params):
        kept = params["kept"]
        assert rerun == [f"o{k}" for k in range(kept, N)]  # the ranking's first ``kept`` are kept
        judged.append(kept)
        return types.SimpleNamespace(fits=kept <= boundary, kept=kept)

    def fill(ev_, times_, fit, ops, kept, saved, skipped, params):
        filled.append((getattr(fit, "kept", 0), kept, params["kept"]))
        return []

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    monkeypatch.setattr(recompute_sets, "_fill", fill)
    predicted = min(N, max(0, boundary + off))
    monkeypatch.setattr(recompute_sets._Room, "prefix", lambda self, ops: predicted)
    added = recompute_sets._relax(ev, times, cand, ())
    assert len(filled) == 1  # one ranking (own and spared re-runs agree)
    (fit, kept, marked), = filled
    assert fit == kept == marked  # the fill starts from the fit it was given
    assert len(added) == len(judged) <= 1 + recompute_sets.RELAX_WALK + recompute_sets.RELAX_BISECTIONS
    if abs(off) < 2 ** recompute_sets.RELAX_WALK:  # within the walk: it brackets the boundary (at most 8 counts
        # wide), then bisects that, where the count bisection of 600 took 9 or 10
        assert len(judged) <= 1 + recompute_sets.RELAX_WALK + (recompute_sets.RELAX_WALK - 1)
    # as the bisection, to one op: the fit keeps the boundary, or one op fewer where the one count left unknown (the
    # boundary) was not simulated, the fill's to take; a count one or two above the fit's missed (keeping all N is
    # no recompute plan: never judged)
    assert kept == boundary or (kept == boundary - 1 and boundary not in judged)
    assert kept + 1 in judged or kept + 2 in judged or kept + 1 == N
    if predicted == boundary:
        assert judged == [boundary, boundary + 1][:N - boundary]


def test_the_prediction_is_the_prefix_whose_kept_outputs_fit_over_their_lives():
    """``_Room.prefix``: each kept output lives from its op's end to its backward reader (``_kept_spans``) and fits
    where the memory held over that span, with what was kept before it, stays under the budget. The count stops at
    the first that does not fit, even if a later one would, and leaves the room as it was."""
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
    assert room.prefix(["a", "b", "big"]) == 2  # a before the peak, b after it; big (over it) does not fit
    assert room.prefix(["big", "a", "b"]) == 0  # b alone would fit: the prefix stops at big
    assert np.array_equal(room.held, held)
    assert room.keep("a") is True and room.keep("big") is False and not np.array_equal(room.held, held)


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


@pytest.mark.parametrize("boundary", [1, 300, N - 1])
def test_on_the_xla_clocks_the_search_is_the_count_bisection_whose_halfway_fits_held_can_pin(monkeypatch, boundary):
    """On the XLA clocks the pipeline pins the winner's order, which costs memory, and runs the fastest fit with
    room for that where the winner cannot be held: the bisection's halfway fits. There the search ignores the
    timeline's count and bisects the ranking by count, as before, within :data:`RELAX_BISECTIONS` simulations."""
    ev, times, cand = _fit("xla-clusters")
    monkeypatch.setattr(recompute_sets, "rerun_times", lambda sim, decisions: times)
    judged = []

    def judge(ev_, times_, rerun, skipped, params):
        judged.append(params["kept"])
        return types.SimpleNamespace(fits=params["kept"] <= boundary)

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    monkeypatch.setattr(recompute_sets, "_fill", lambda *args: [])
    monkeypatch.setattr(recompute_sets._Room, "prefix", lambda self, ops: boundary)  # right, and not asked
    recompute_sets._relax(ev, times, cand, ())
    low, high, bisected = 0, N, []
    while high - low > 1 and len(bisected) < recompute_sets.RELAX_BISECTIONS:
        middle = (low + high + 1) // 2
        bisected.append(middle)
        low, high = (middle, high) if middle <= boundary else (low, middle - 1)
    assert judged == bisected and judged[0] == (N + 1) // 2
