"""The XLA tune with and without land cuts (tflms.tune.xla_cuts): which runs happen, and which winner is kept."""
from __future__ import annotations

import types

import pytest

from tflms.errors import BudgetError
from tflms.sim import SimOptions
from tflms.tune.xla_cuts import tune_xla

CLUSTERS = SimOptions(clock="xla-clusters")


def result(step_s: float, swaps: bool):
    plan = types.SimpleNamespace(swaps=("a swap",) if swaps else ())
    return types.SimpleNamespace(best=types.SimpleNamespace(plan=plan, sim=types.SimpleNamespace(step_time_s=step_s)))


def runner(without, with_cuts):
    """A tune that answers ``without`` / ``with_cuts`` (a result, or an exception to raise) and logs its calls."""
    calls = []

    def run(options):
        calls.append(options.xla_land_cuts)
        answer = with_cuts if options.xla_land_cuts else without
        if isinstance(answer, Exception):
            raise answer
        return answer
    return run, calls


def test_a_winner_that_only_recomputes_is_not_tuned_again():
    first = result(1.0, swaps=False)
    run, calls = runner(first, result(0.5, swaps=True))
    assert tune_xla(run, CLUSTERS) == (first, False) and calls == [False]


def test_a_winner_that_swaps_is_tuned_again_with_cuts_and_the_faster_kept():
    first, faster, slower = result(2.0, swaps=True), result(1.5, swaps=True), result(2.5, swaps=True)
    run, calls = runner(first, faster)
    assert tune_xla(run, CLUSTERS) == (faster, True) and calls == [False, True]
    run, calls = runner(first, slower)
    assert tune_xla(run, CLUSTERS) == (first, False) and calls == [False, True]
    run, _ = runner(first, result(2.0, swaps=True))  # a tie keeps the plan without cuts
    assert tune_xla(run, CLUSTERS) == (first, False)
    run, _ = runner(first, BudgetError("nothing fits with cuts"))
    assert tune_xla(run, CLUSTERS) == (first, False)


def test_where_nothing_fits_without_cuts_the_cuts_are_tried_and_else_the_first_error_raised():
    error, later = BudgetError("nothing fits"), BudgetError("nothing fits with cuts")
    error.candidates = ("many",)
    second = result(3.0, swaps=True)
    run, calls = runner(error, second)
    assert tune_xla(run, CLUSTERS) == (second, True) and calls == [False, True]
    assert error.candidates == ()  # (not held while the second tune ran)
    run, _ = runner(error, later)
    with pytest.raises(BudgetError) as raised:
        tune_xla(run, CLUSTERS)
    assert raised.value is error


def test_a_search_for_a_fit_stops_at_the_first_fit_and_other_clocks_tune_once():
    first = result(2.0, swaps=True)
    run, calls = runner(first, result(1.0, swaps=True))
    assert tune_xla(run, CLUSTERS, fit_only=True) == (first, False) and calls == [False]
    for options in (SimOptions(clock="xla"), SimOptions(clock="graph"), SimOptions(clock="xla-clusters",
                                                                                   xla_land_cuts=True)):
        answer = result(1.0, swaps=True)
        run, calls = runner(first, answer)  # (``answer`` where asked with cuts already)
        expected = answer if options.xla_land_cuts else first
        assert tune_xla(run, options) == (expected, options.xla_land_cuts) and calls == [options.xla_land_cuts]
