"""The largest-batch search's arithmetic (tflms/tune/maxbatch.py): the crossing of a need with the budget, found in few
needs, and the line through a failed probe's need that places the next probe (issue 48: the estimate's time)."""

from __future__ import annotations

import pytest

from tflms.tune.maxbatch import _Probes, crossing


def _counted(need):
    calls = []

    def counted(batch: int) -> int:
        calls.append(batch)
        return need(batch)
    return counted, calls


@pytest.mark.parametrize("need, budget", [
    (lambda b: 1000 + 37 * b, 1_000_000),  # a line: the unchanged step
    (lambda b: max(500 + 40 * b, 90_000 + 31 * b), 2_000_000),  # the largest of lines: the swap-only bound
    (lambda b: 1000 + 3 * b + b * b // 50, 5_000_000),  # a bend
    (lambda b: 1000 + 4096 * (b // 64), 700_000),  # steps: needs equal across many batches
])
def test_crossing_is_exact(need, budget):
    low = 1
    high = 2
    while need(high) <= budget:
        low, high = high, high * 2
    counted, calls = _counted(need)
    found = crossing(counted, budget, low, high)
    assert need(found) > budget >= need(found - 1)
    assert low < found <= high
    # never more needs than bisection with its two ends
    assert len(set(calls)) <= 2 + (high - low).bit_length()


def test_crossing_of_a_line_takes_few_needs():
    counted, calls = _counted(lambda b: 123_456 + 9_871 * b)
    found = crossing(counted, 16 << 30, 1 << 20, 1 << 21)
    assert 123_456 + 9_871 * found > 16 << 30 >= 123_456 + 9_871 * (found - 1)
    assert len(set(calls)) <= 4  # the two ends, the secant's landing and its neighbour (bisection: 22)


def test_interpolation_places_the_next_probe_on_the_line_through_the_failed_need():
    probes = _Probes.__new__(_Probes)
    probes.budget_bytes = 16_000
    probes.plain = {100: 2_000 + 10 * 100, 200: 2_000 + 10 * 200}  # the unchanged step: 2000 bytes at batch 0
    probes.needs = {1_000: 20_000}  # the least need found where batch 1000 failed
    # the line from (0, 2000) through (1000, 20000) meets 16000 at 1000 * 14000 / 18000
    assert probes.interpolate(1_000) == 777
    assert probes.interpolate(999) is None  # no failure recorded there
    probes.needs = {1_000: 15_000}  # a failure needing less than the budget: no line to follow
    assert probes.interpolate(1_000) is None
    probes.plain = {100: 3_000}
    assert probes.interpolate(1_000) is None  # one unchanged need does not place batch 0
