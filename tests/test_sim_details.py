"""A simulation's per-op and per-buffer records are views of flat arrays, built when read and released by the tuner."""

from __future__ import annotations

import collections
import pickle

import pytest

from tflms.memplan.report import plan_step
from tflms.sim import HardwareProfile, simulate
from tflms.testing import mlp_training_graph
from tflms.tune import tune
from tflms.tune.search import VIEWS_KEPT

PROFILE = "v100-16gb-pcie3"
VIEWS = ("ops", "timeline", "buffer_owner", "buffer_lifetimes")


@pytest.fixture(scope="module")
def graph():
    return mlp_training_graph(12, batch=1024, width=2048)


def built(sim) -> set[str]:
    return set(sim.details._views)


def test_views_are_built_when_read_and_again_after_release(graph):
    sim = simulate(graph, PROFILE)
    assert built(sim) == set()  # nothing built by the simulation itself
    first = {kind: getattr(sim, kind) for kind in VIEWS}
    values = {kind: (dict(v) if kind == "buffer_owner" else tuple(v)) for kind, v in first.items()}
    assert built(sim) == set(VIEWS)
    assert len(values["ops"]) == len({r.name for r in values["ops"]}) > 100
    # one point before the memory events and one after each; without swaps every buffer is on the device
    assert len(values["timeline"]) == 1 + 2 * len(values["buffer_lifetimes"])
    assert values["buffer_owner"]  # aliases and forwarded outputs
    sim.release_views()
    assert built(sim) == set()
    for kind in VIEWS:
        again = getattr(sim, kind)
        assert again == values[kind] and values[kind] == again  # both ways round
    # a second simulation of the same graph is equal, field by field and view by view
    assert simulate(graph, PROFILE) == sim
    # what the records hold, in the order they always had
    ops = values["ops"]
    assert [(r.start_s, r.end_s, r.name) for r in ops] == sorted((r.start_s, r.end_s, r.name) for r in ops)
    assert {r.stream for r in ops} <= {"compute", "host", "h2d", "d2h"}
    assert all(r.device == ("host" if r.stream in ("host", "d2h") else "accelerator") for r in ops)
    firsts = [first for _, _, first, _ in values["buffer_lifetimes"]]
    assert firsts == sorted(firsts)
    assert all(first <= last for _, _, first, last in values["buffer_lifetimes"])
    # the peak is the timeline's highest device point, and the memory planner reads the lifetimes
    assert max(a for _, a, _ in values["timeline"]) == sim.peak_bytes
    assert plan_step(sim).lower_bound_bytes + sim.resident_bytes == sim.peak_bytes


def test_a_simulation_pickles_with_its_views(graph):
    sim = simulate(graph, PROFILE)
    copy = pickle.loads(pickle.dumps(sim))
    assert copy == sim and tuple(copy.ops) == tuple(sim.ops)


def test_the_tuner_keeps_the_views_of_its_last_simulations_only(graph):
    # a link at half of PCIe 3.0: the idle-time searches read the records of each simulation they score
    slow = HardwareProfile("slow-link", "16GiB", 14e12, 900, 8)
    result = tune(graph, budget=int(simulate(graph, slow).peak_bytes * 0.8), profile=slow)
    sims = list({id(c.sim): c.sim for c in result.candidates}.values())
    assert len(sims) > VIEWS_KEPT + 4
    with_views = [s for s in sims if built(s)]
    # the last few recorded, the unchanged step's (recorded apart), and the winner's (read after the searches);
    # without the release, 10 of these 24
    assert len(with_views) <= VIEWS_KEPT + 2
    # a released candidate's views come back whole
    released = next(s for s in sims if not built(s))
    assert len(released.ops) > 0 and max(a for _, a, _ in released.timeline) == released.peak_bytes


def test_a_simulation_leaves_no_cyclic_garbage(graph):
    """The simulations run with the cyclic collector paused (``gc_paused``), and a tune runs hundreds: a reference
    cycle in one (the copy-release helper called itself through its closure) kept each simulation's per-op lists
    alive until the next full collection, about 120 million objects at the peak of DenseNet-121's tune."""
    import gc

    import tflms
    swapped = tflms.rewrite(graph, swapout_threshold=1).graph  # copies: the release helper runs
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            assert simulate(swapped, PROFILE).transfer_time_s > 0
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_tune_that_finds_nothing_leaves_no_cyclic_garbage(graph):
    """The hybrid search catches the BudgetError of each nested tune that finds nothing; the error's traceback held
    the tune's frame, and a local there named the error: a cycle that kept the nested tune's evaluator, with every
    candidate and graph, alive until the next full collection (a million objects on ResNet-50's tune)."""
    import gc

    from tflms.errors import BudgetError
    budget = int(simulate(graph, PROFILE).peak_bytes * 0.5)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        try:
            tune(graph, budget=budget, profile=PROFILE)
        except BudgetError as err:
            tried = len(err.candidates)
        assert tried > 1
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith("tflms")]
        assert not ours, collections.Counter(type(o).__name__ for o in ours).most_common(5)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
