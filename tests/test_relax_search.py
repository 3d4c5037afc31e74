"""The relaxation (tflms.tune.recompute_sets): where its bisection stops, and its fill (``_fill``): what it keeps over
each kept tensor's life, and the judgment it can skip."""

from __future__ import annotations

import types

import pytest

from tflms.ir.graph import TensorRef
from tflms.sim.records import SimResult
from tflms.testing import GraphBuilder
from tflms.tune import recompute_sets


#: The fit's memory from 0 to 10 s: 2,000 bytes, 9,700 at the peak from 5 to 6, of a budget of 10,000.
TIMELINE = ((0.0, 2000, 0), (5.0, 9700, 0), (6.0, 2000, 0), (10.0, 0, 0))


def kept_fit(spans, clock=None):
    """A recompute fit whose plan re-runs each op of ``spans`` (``{op: (bytes, end of the op, start of its backward
    reader)}``) on :data:`TIMELINE`, and the evaluator the fill reads: ``(fit, ev)``."""
    b = GraphBuilder()
    records, decisions = [], []
    for name, (size, made, read) in spans.items():
        b.op(name, "Placeholder", shape=(size // 4,))
        records += [types.SimpleNamespace(name=name, start_s=made - 0.5, end_s=made),
                    types.SimpleNamespace(name="grad_" + name, start_s=read, end_s=read + 0.1)]
        decisions.append(types.SimpleNamespace(ops=(name,), tensors=(TensorRef(name),), readers=(("grad_" + name,),),
                                               clones=("lms/recompute_" + name,)))
    sim = types.SimpleNamespace(clock=clock, timeline=TIMELINE, ops=records, details=None)
    sim.op_spans = lambda stream=None: SimResult.op_spans(sim, stream)  # (from the records: no arrays here)
    fit = types.SimpleNamespace(sim=sim, plan=types.SimpleNamespace(recomputes=decisions))
    ev = types.SimpleNamespace(analysis=types.SimpleNamespace(graph=b.graph), budget=10_000, need=lambda sim: 9_700,
                               fastest_fit_s=lambda: float("inf"))
    return fit, ev


@pytest.mark.parametrize("clock, peak_judged", [("serial", False), ("graph", False), ("xla-clusters", True)])
def test_the_fill_skips_the_room_at_the_peak_where_the_larger_fill_fits_and_every_kernel_runs(monkeypatch, clock,
                                                                                               peak_judged):
    """Where the fill over the kept tensors' lives fits and keeps every op the room at the peak would, the peak's
    fill re-runs a superset of its ops: off the XLA clocks each re-run is a kernel on the one compute stream, so that
    plan computes no shorter and is not simulated. On the XLA clocks a clone may cost nothing (fused into its
    reader), and the peak's fill is judged as before."""
    # a lives before the peak; d (52 bytes) fits at it
    fit, ev = kept_fit({"a": (1000, 1.0, 4.0), "d": (52, 1.0, 9.0)}, clock)
    judged = []

    def judge(ev_, times, rerun, skipped, params, **_):
        judged.append(params)
        return types.SimpleNamespace(fits=True)

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    recompute_sets._fill(ev, {}, fit, ["kept", "a", "d"], 1, {"a": 1.0, "d": 1.0}, (), {"kept": 1})
    assert judged[0] == {"kept": 1, "filled": 2}  # a and d, over their lives
    assert [p.get("peak") for p in judged[1:]] == ([1] if peak_judged else [])


def test_the_relaxation_fills_the_room_its_bisection_leaves_over_each_kept_tensors_life(monkeypatch):
    """The bisection keeps a prefix of the ranking and stops at the first op that does not fit; the fill keeps the
    later ops whose outputs fit, in ranking order: each kept output lives from its op's end to its last backward
    reader, and fits where the memory held over that span, with what the fill kept before it, stays under the
    budget. An output read before the peak or made after it is kept whatever its size at the peak; ones whose
    keeping spares nothing are skipped. A fill that does not fit is judged again with its first half, once; and the
    ops that fit in the room at the peak alone are judged too, where they differ."""
    # op: (bytes, end of the op, start of its backward reader), the peak (9,700 of 10,000 bytes) from 5 to 6
    spans = {"a": (1000, 1.0, 4.0), "big": (4000, 2.0, 8.0), "b": (1500, 6.5, 9.0), "free": (100, 1.0, 2.0),
             "c": (1600, 1.0, 9.0), "d": (50, 1.0, 9.0), "e": (7500, 3.0, 3.5)}
    fit, ev = kept_fit(spans)
    sim, decisions = fit.sim, fit.plan.recomputes
    ops = ["kept", *spans]  # the ranking; the bisection kept ops[:1]
    saved = {op: 1.0 for op in ops}
    saved["free"] = 0.0
    judged = []

    def judge(ev, times, rerun, skipped, params, **_):
        judged.append((frozenset(rerun), params))
        return types.SimpleNamespace(fits=len(judged) > 1, sim=None)

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    added = recompute_sets._fill(ev, {}, fit, ops, 1, saved, (), {"kept": 1})
    # a (read before the peak), not big (over it), b (made after it), not c (over it), d (50 fits in the 300 left
    # at the peak), not e (7,500 where 2,000 and a's 1,000 are held: it alone would fit)
    assert [params["filled"] for _, params in judged] == [3, 1, 1]
    assert judged[0][0] == frozenset({"big", "free", "c", "e"})
    assert judged[1][0] == frozenset({"big", "b", "free", "c", "d", "e"})  # then only the first half of them (a)
    # and the ops that fit in the room at the peak alone (300 bytes: d)
    assert judged[2] == (frozenset({"a", "big", "b", "free", "c", "e"}), {"kept": 1, "filled": 1, "peak": 1})
    assert [trial.fits for trial in added] == [False, True, True]
    spans_of = recompute_sets._kept_spans(sim, decisions)
    assert spans_of["a"] == (1.0, 4.0) and spans_of["b"] == (6.5, 9.0)
    judged.clear()
    ev.need = lambda sim: 17_700  # no room left while any of them would live: nothing fits, nothing is judged
    assert recompute_sets._fill(ev, {}, fit, ops, 1, saved, (), {}) == [] and not judged


@pytest.mark.parametrize("clock", ["graph", "serial", "xla-clusters"])
def test_a_fill_that_computes_longer_than_the_fastest_fit_is_not_simulated_off_the_xla_clocks(monkeypatch, clock):
    """Off the XLA clocks each fill is judged under the fastest fit's time (``_judge_ops``'s ``bound``): one whose
    compute floor is slower is refused unsimulated, and counts as a fit for what follows, so its half (which re-runs
    more) is not judged either. On the XLA clocks no fill is bounded (its fits are what ``held`` can pin), and a
    fill that does not fit is judged again with its first half."""
    fit, ev = kept_fit({"a": (1000, 1.0, 4.0), "b": (1500, 6.5, 9.0), "d": (52, 1.0, 9.0)}, clock)
    ev.fastest_fit_s = lambda: 1.0
    calls = []

    def judge(ev_, times, rerun, skipped, params, bound=None, refused=None):
        calls.append((params.get("filled"), params.get("peak"), bound))
        if bound is not None:  # (a floor above the bound: refused, as ``_judge_ops`` refuses it)
            refused.append(bound() + 1.0)
            return None
        return types.SimpleNamespace(fits=False)

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    added = recompute_sets._fill(ev, {}, fit, ["kept", "a", "b", "d"], 1, {"a": 1.0, "b": 1.0, "d": 1.0}, (), {})
    assert added == [] if clock != "xla-clusters" else len(added) == len(calls)
    if clock == "xla-clusters":
        assert [(filled, peak) for filled, peak, _ in calls] == [(3, None), (1, None), (1, 1)]
        assert {bound for *_, bound in calls} == {None}
    else:  # the spans' fill refused, so not its half; the room at the peak (d alone, within a, b, d) not judged
        assert [(filled, peak) for filled, peak, _ in calls] == [(3, None)]
        assert calls[0][2] is ev.fastest_fit_s


@pytest.mark.parametrize("clock", ["graph", "serial", "xla-clusters"])
@pytest.mark.parametrize("ranked, fitting", [(100, 37), (100, 0), (100, 100), (20, 13), (507, 239)])
def test_the_bisection_narrows_to_a_sixteenth_of_the_ranking_off_the_xla_clocks_and_leaves_the_rest_to_the_fill(
        monkeypatch, clock, ranked, fitting):
    """Off the XLA clocks the relaxation bisects on how many of its ranking to keep until the counts it has not ruled
    out span at most a 16th of the ranking (one op on rankings under 32 ops), in at most four trials; the fill starts
    from the largest count that fitted. On the XLA clocks it bisects to one op, as every clock did until the
    thirty-eighth session: there its fits near the boundary are the fallbacks the pipeline holds to the budget when
    the winner's order cannot be (:func:`tflms.pipeline.held.held`, which runs for a step that keeps XLA only)."""
    spans = {f"op{k:03d}": (4, 1.0, 9.0) for k in range(ranked)}
    fit, ev = kept_fit(spans, clock)
    cand = types.SimpleNamespace(sim=fit.sim, plan=fit.plan, params={"price": 1.0}, fits=True)
    times = {op: 1.0 + k for k, op in enumerate(spans)}  # dearest per byte last: the ranking is the ops reversed
    monkeypatch.setattr(recompute_sets, "rerun_times", lambda sim, decisions: times)  # (the XLA clocks' re-run times)
    trials, filled = [], []

    def judge(ev_, times_, rerun, skipped, params, **_):
        trials.append(params["kept"])
        return types.SimpleNamespace(fits=params["kept"] <= fitting, params=params)

    def fill(ev_, times_, fit_, ops, kept, saved, skipped, params):
        filled.append((kept, fit_.params.get("kept"), len(ops)))
        return []

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    monkeypatch.setattr(recompute_sets, "_fill", fill)
    recompute_sets._relax(ev, times, cand, ())
    xla = clock == "xla-clusters"
    assert len(trials) <= (recompute_sets.RELAX_BISECTIONS if xla else 4)
    assert trials[0] == (ranked + 1) // 2  # the first trial halves the ranking
    (kept, fit_kept, length), = filled  # one ranking: each op spares only its own re-run
    assert length == ranked and kept <= fitting
    assert fit_kept == (kept or None)  # the fill starts from the trial that fitted (the plan itself for none)
    # what the bisection did not rule out: from the count that fitted to the first that did not
    high = min([k for k in trials if k > fitting], default=ranked + 1) - 1
    assert high - kept <= (1 if xla else max(1, ranked // recompute_sets.RELAX_RESOLUTION))
    assert all(k <= kept or k > fitting for k in trials)
    if xla:
        assert fitting - kept <= 1  # (the last count left open is not judged: the fill may keep it)


@pytest.mark.parametrize("clock", ["graph", "xla-clusters"])
@pytest.mark.parametrize("slow_below, fitting", [(60, 80), (60, 40), (0, 37)])
def test_a_bisection_trial_that_computes_longer_than_the_fastest_fit_is_taken_as_a_fit_unsimulated(
        monkeypatch, clock, slow_below, fitting):
    """Off the XLA clocks a trial whose compute floor is above the fastest fit's time (here: one keeping fewer than
    ``slow_below`` of the ranking) is not simulated: it could not win, nor could a hybrid of it, and the bisection
    keeps more, as after a fit. Where the fill would start from such a count, that count is simulated then; if it
    does not fit, the fill starts from the last count simulated that did. On the XLA clocks every trial is
    simulated (the fits near the boundary are what ``held`` pins)."""
    ranked = 100
    spans = {f"op{k:03d}": (4, 1.0, 9.0) for k in range(ranked)}
    fit, ev = kept_fit(spans, clock)
    ev.fastest_fit_s = lambda: 1.0
    cand = types.SimpleNamespace(sim=fit.sim, plan=fit.plan, params={"price": 1.0}, fits=True)
    times = {op: 1.0 + k for k, op in enumerate(spans)}
    monkeypatch.setattr(recompute_sets, "rerun_times", lambda sim, decisions: times)
    simulated, filled = [], []

    def judge(ev_, times_, rerun, skipped, params, bound=None, refused=None):
        if bound is not None and params["kept"] < slow_below:
            refused.append(bound() + 1.0)
            return None
        simulated.append(params["kept"])
        return types.SimpleNamespace(fits=params["kept"] <= fitting, params=params)

    def fill(ev_, times_, fit_, ops, kept, saved, skipped, params):
        filled.append((kept, fit_.params.get("kept")))
        return []

    monkeypatch.setattr(recompute_sets, "_judge_ops", judge)
    monkeypatch.setattr(recompute_sets, "_fill", fill)
    recompute_sets._relax(ev, times, cand, ())
    (kept, fit_kept), = filled
    assert kept == (fit_kept or 0)  # the fill starts from a count simulated, and fitting
    assert kept <= fitting
    if clock == "xla-clusters":
        assert simulated[0] == 50  # (no bound: the first trial, below ``slow_below`` or not, is simulated)
        return
    # below ``slow_below`` only the count the fill would have started from, once, after the bisection
    assert [k for k in simulated if k < slow_below] in ([], simulated[-1:])
    if fitting >= slow_below:  # the bisection went on past the unsimulated counts, as through fits
        assert slow_below <= kept and fitting - kept <= max(1, ranked // recompute_sets.RELAX_RESOLUTION)
    else:  # the count it took as fitting did not: the fill starts from the plan itself
        assert (kept, fit_kept) == (0, None)
