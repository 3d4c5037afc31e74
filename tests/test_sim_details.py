"""A simulation's per-op and per-buffer records are views of flat arrays, built when read and released by the tuner."""

from __future__ import annotations

import collections
import gc
import os
import pathlib
import pickle
import tracemalloc

import pytest

import tflms
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


def test_op_spans_are_the_ops_view_by_name_without_building_it(graph):
    """``SimResult.op_spans``: each op's (start, end) as the ``ops`` view has it, by name and by stream, read from the
    arrays (no view built); a result without arrays answers from its records."""
    import dataclasses

    swapped = tflms.rewrite(graph, accelerator_device="/device:GPU:0", swapout_threshold=1).graph
    sim = simulate(swapped, PROFILE)
    spans = sim.op_spans()
    assert built(sim) == set()
    records = tuple(sim.ops)
    assert spans == {r.name: (r.start_s, r.end_s) for r in records}
    streams = {r.stream for r in records}
    assert {"compute", "h2d", "d2h"} <= streams, streams
    for stream in streams:
        assert sim.op_spans(stream) == {r.name: (r.start_s, r.end_s) for r in records if r.stream == stream}
    bare = dataclasses.replace(sim, details=None, ops=records)
    assert bare.op_spans() == spans and bare.op_spans("d2h") == sim.op_spans("d2h")


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


#: Where tflms's code lives, as imported and resolved: a frame or function running code from under here is tflms's.
TFLMS_DIRS = tuple({os.path.dirname(os.path.abspath(tflms.__file__)) + os.sep,
                    str(pathlib.Path(tflms.__file__).resolve().parent) + os.sep})
#: Frames kept per allocation traced: enough to reach the tflms frame that called the allocating library code.
TRACED_FRAMES = 100


def cycles_left_by(call, counted, *, traced: bool = False) -> list:
    """The objects of the reference cycles that ``call()`` made and left unreachable, those ``counted(o)`` selects.

    Only the call's own cycles, whatever ran in this process before and beside it (the tests of other files, in one
    process or in a pytest-xdist worker):

    - ``call()`` runs once unmeasured first, so what a first call in a process does once is done before: a tune on a
      worker that has not imported TensorFlow imports it, and that import's own cycles hold the tune's frames (by
      their ``f_back``), so every candidate and graph of the tune was found among them; networkx compiles each of
      its decorators at its first call;
    - every object that exists before the measured call is frozen (``gc.freeze``): garbage that an earlier test left
      reachable until the call, and that the collection after it would find, is not the call's;
    - the collector is off during the call, so nothing the call makes is collected before it is counted.

    ``traced``: the allocations during the call are traced (``tracemalloc``), for :func:`allocated_by_tflms`.
    """
    call()
    gc.collect()
    kept = len(gc.garbage)  # what was there before (uncollectable objects) stays, and is not counted
    gc.freeze()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    tracing = traced and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start(TRACED_FRAMES)
    try:
        call()
        gc.collect()
        return [o for o in gc.garbage[kept:] if counted(o)]
    finally:
        if tracing:
            tracemalloc.stop()
        gc.set_debug(0)
        del gc.garbage[kept:]
        gc.enable()
        gc.unfreeze()


def allocated_by_tflms(o) -> bool:
    """Allocated during the traced call with a tflms frame on the allocating stack: made by tflms's code, directly or
    through a library it called; not by another thread meanwhile (a pytest-xdist worker's execnet thread, a thread
    an earlier test left running), whose stack has no tflms frame."""
    traceback = tracemalloc.get_object_traceback(o)
    return traceback is not None and any(frame.filename.startswith(TFLMS_DIRS) for frame in traceback)


def is_tflms(o) -> bool:
    """An instance of a tflms class, or a function, method, frame or generator running tflms's code."""
    if type(o).__module__.split(".")[0] == "tflms":
        return True
    code = (getattr(getattr(o, "__func__", o), "__code__", None) or getattr(o, "f_code", None)
            or getattr(o, "gi_code", None) or getattr(o, "cr_code", None))
    return code is not None and code.co_filename.startswith(TFLMS_DIRS)


def described(objects) -> list:
    """The most common kinds among ``objects``; a function's or frame's with where its code is."""
    def kind(o):
        code = getattr(o, "__code__", None) or getattr(o, "f_code", None)
        return type(o).__qualname__ + (f" {code.co_filename}:{code.co_name}" if code is not None else "")
    return collections.Counter(kind(o) for o in objects).most_common(8)


def test_a_simulation_leaves_no_cyclic_garbage(graph):
    """The simulations run with the cyclic collector paused (``gc_paused``), and a tune runs hundreds: a reference
    cycle in one (the copy-release helper called itself through its closure) kept each simulation's per-op lists
    alive until the next full collection, about 120 million objects at the peak of DenseNet-121's tune.

    Counted: every object of an unreachable cycle that tflms's code allocated during the simulations, whatever its
    type (that cycle was a function and its closure's cell); not what another thread allocated meanwhile."""
    swapped = tflms.rewrite(graph, swapout_threshold=1).graph  # copies: the release helper runs

    def three_simulations():
        for _ in range(3):
            assert simulate(swapped, PROFILE).transfer_time_s > 0

    ours = cycles_left_by(three_simulations, allocated_by_tflms, traced=True)
    assert not ours, described(ours)


def test_a_tune_that_finds_nothing_leaves_no_cyclic_garbage(graph):
    """The hybrid search catches the BudgetError of each nested tune that finds nothing; the error's traceback held
    the tune's frame, and a local there named the error: a cycle that kept the nested tune's evaluator, with every
    candidate and graph, alive until the next full collection (a million objects on ResNet-50's tune).

    Counted: tflms's objects among the cycles the tune left (instances of its classes, its functions and frames).
    The tune's allocations are not traced: that makes it ten times slower."""
    from tflms.errors import BudgetError
    budget = int(simulate(graph, PROFILE).peak_bytes * 0.5)
    tried = []

    def tune_that_finds_nothing():
        try:
            tune(graph, budget=budget, profile=PROFILE)
        except BudgetError as err:
            tried.append(len(err.candidates))

    ours = cycles_left_by(tune_that_finds_nothing, is_tflms)
    assert len(tried) == 2 and min(tried) > 1  # the unmeasured call and the measured one
    assert not ours, described(ours)
