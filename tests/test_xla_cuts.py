"""The XLA tune each way that may win (tflms.tune.xla_cuts): with and without land cuts, the clones where they are
needed or last; which runs happen, and which winner is kept."""
from __future__ import annotations

import dataclasses
import types

import pytest

from tflms.errors import BudgetError
from tflms.sim import SimOptions
from tflms.tune.xla_cuts import tune_xla

CLUSTERS = SimOptions(clock="xla-clusters")
CUT = dataclasses.replace(CLUSTERS, xla_land_cuts=True)
LAST = dataclasses.replace(CLUSTERS, xla_clones_last=True)
LAST_CUT = dataclasses.replace(LAST, xla_land_cuts=True)


def result(step_s: float, swaps: bool, recomputes: bool = False):
    plan = types.SimpleNamespace(swaps=("a swap",) if swaps else (), recomputes=("a clone",) if recomputes else ())
    return types.SimpleNamespace(best=types.SimpleNamespace(plan=plan, sim=types.SimpleNamespace(step_time_s=step_s)))


def runner(without, with_cuts, last=None, last_cuts=None):
    """A tune that answers ``without`` / ``with_cuts`` (a result, or an exception to raise), and ``last`` /
    ``last_cuts`` with the clones ordered last, and logs its calls as ``(land cuts, clones last)``."""
    calls = []

    def run(options):
        calls.append((options.xla_land_cuts, options.xla_clones_last))
        answers = (last, last_cuts) if options.xla_clones_last else (without, with_cuts)
        answer = answers[options.xla_land_cuts]
        if answer is None:
            raise AssertionError(f"not expected to tune with {calls[-1]}")
        if isinstance(answer, Exception):
            raise answer
        return answer
    return run, calls


def test_a_winner_that_only_recomputes_is_not_tuned_again():
    first = result(1.0, swaps=False, recomputes=True)
    run, calls = runner(first, result(0.5, swaps=True))
    assert tune_xla(run, CLUSTERS) == (first, CLUSTERS) and calls == [(False, False)]


def test_a_winner_that_swaps_is_tuned_again_with_cuts_and_the_faster_kept():
    first, faster, slower = result(2.0, swaps=True), result(1.5, swaps=True), result(2.5, swaps=True)
    run, calls = runner(first, faster)
    assert tune_xla(run, CLUSTERS) == (faster, CUT) and calls == [(False, False), (True, False)]
    run, calls = runner(first, slower)
    assert tune_xla(run, CLUSTERS) == (first, CLUSTERS) and calls == [(False, False), (True, False)]
    run, _ = runner(first, result(2.0, swaps=True))  # a tie keeps the plan without cuts
    assert tune_xla(run, CLUSTERS) == (first, CLUSTERS)
    run, _ = runner(first, BudgetError("nothing fits with cuts"))
    assert tune_xla(run, CLUSTERS) == (first, CLUSTERS)


def test_a_hybrid_winner_is_tuned_again_with_the_clones_last_each_way_and_the_fastest_kept():
    hybrid, cut_hybrid = result(2.0, swaps=True, recomputes=True), result(1.8, swaps=True, recomputes=True)
    last, last_cut = result(1.9, swaps=True, recomputes=True), result(1.5, swaps=True, recomputes=True)
    run, calls = runner(hybrid, cut_hybrid, last, last_cut)
    assert tune_xla(run, CLUSTERS) == (last_cut, LAST_CUT)
    assert calls == [(False, False), (True, False), (False, True), (True, True)]
    run, _ = runner(hybrid, cut_hybrid, result(1.8, swaps=True, recomputes=True), result(1.9, swaps=True))
    assert tune_xla(run, CLUSTERS) == (cut_hybrid, CUT)  # a tie keeps the clones where they are needed
    # where the faster winner only swaps, the clones' order changes nothing: no third tune
    swaps_only = result(1.0, swaps=True)
    run, calls = runner(hybrid, swaps_only)
    assert tune_xla(run, CLUSTERS) == (swaps_only, CUT) and calls == [(False, False), (True, False)]
    # the clones last and their recompute-only winner: not tuned again with cuts
    recompute = result(1.0, swaps=False, recomputes=True)
    run, calls = runner(hybrid, BudgetError("nothing fits with cuts"), recompute)
    assert tune_xla(run, CLUSTERS) == (recompute, LAST) and calls == [(False, False), (True, False), (False, True)]
    # options that order the clones last already: tuned that way only
    run, calls = runner(None, None, hybrid, last_cut)
    assert tune_xla(run, LAST) == (last_cut, LAST_CUT) and calls == [(False, True), (True, True)]


def test_where_nothing_fits_without_cuts_the_cuts_are_tried_and_else_the_first_error_raised():
    error, later = BudgetError("nothing fits"), BudgetError("nothing fits with cuts")
    error.candidates = ("many",)
    second = result(3.0, swaps=True)
    run, calls = runner(error, second)
    assert tune_xla(run, CLUSTERS) == (second, CUT) and calls == [(False, False), (True, False)]
    assert error.candidates == ()  # (not held while the second tune ran)
    # nothing fits either way with the clones where needed: both again with them last
    last = result(4.0, swaps=True, recomputes=True)
    run, calls = runner(error, later, BudgetError("nothing fits, clones last"), last)
    assert tune_xla(run, CLUSTERS) == (last, LAST_CUT)
    assert calls == [(False, False), (True, False), (False, True), (True, True)]
    run, _ = runner(error, later, BudgetError("clones last"), BudgetError("clones last, cuts"))
    with pytest.raises(BudgetError) as raised:
        tune_xla(run, CLUSTERS)
    assert raised.value is error


def test_a_search_for_a_fit_stops_at_the_first_fit_and_other_clocks_tune_once():
    first = result(2.0, swaps=True, recomputes=True)
    run, calls = runner(first, result(1.0, swaps=True))
    assert tune_xla(run, CLUSTERS, fit_only=True) == (first, CLUSTERS) and calls == [(False, False)]
    error = BudgetError("nothing fits")
    run, calls = runner(error, error, error, first)  # a search tries each way until one fits
    assert tune_xla(run, CLUSTERS, fit_only=True) == (first, LAST_CUT) and len(calls) == 4
    for options in (SimOptions(clock="xla"), SimOptions(clock="graph")):
        run, calls = runner(first, None)
        assert tune_xla(run, options) == (first, options) and calls == [(False, False)]
    # options with land cuts already: never tuned without them, the clones' order still judged
    faster = result(1.0, swaps=True, recomputes=True)
    run, calls = runner(None, first, None, faster)
    assert tune_xla(run, CUT) == (faster, LAST_CUT) and calls == [(True, False), (True, True)]
