"""A tuned step that keeps XLA runs the fastest plan the executor can be held to (tflms.pipeline.held, issue 47)."""

import dataclasses
import types

import pytest

from tflms.passes import order as order_pass
from tflms.pipeline import held as held_module


@dataclasses.dataclass(frozen=True)
class _Plan:
    name: str
    warnings: tuple = ()


def _cand(name: str, step_s: float, peak: int, fits: bool = True):
    return types.SimpleNamespace(strategy="recompute", params={"name": name}, plan=_Plan(name),
                                 sim=types.SimpleNamespace(step_time_s=step_s, peak_with_margin_bytes=peak),
                                 fits=fits, order=None)


def _result():
    best = _cand("best", 1.0, 900)
    others = [_cand("tight", 1.1, 990), _cand("roomy", 1.3, 700), _cand("missing", 1.05, 500, fits=False),
              _cand("roomier", 1.4, 600), _cand("same", 1.2, 600), _cand("slow", 2.0, 100)]
    others[4].plan = best.plan  # another candidate of the winner's own plan
    from tflms.tune.result import TuneResult
    return TuneResult(budget_bytes=1000, profile="p", baseline=None, best=best, candidates=(best, *others),
                      graph="winner's graph", analysis=types.SimpleNamespace(graph="step"))


def test_the_alternatives_are_the_next_fits_that_leave_room_for_what_pinning_cost_the_winner():
    result = _result()
    names = [c.params["name"] for c in held_module.alternatives(result)]
    assert names == ["tight", "roomy", "roomier"]  # by time; not the winner, its plan, a miss; at most three
    # pinning the winner needed 1,150 bytes: 250 more than its peak, so only plans with 250 bytes of room
    names = [c.params["name"] for c in held_module.alternatives(result, pinned_peak=1150)]
    assert names == ["roomy", "roomier", "slow"]


@pytest.fixture
def passes(monkeypatch):
    """The passes :func:`held` runs, as records: which graphs were held, and which may be pinned."""
    holdable, held_graphs = set(), []
    monkeypatch.setattr(held_module, "apply_swaps", lambda graph, plan, copy_op: types.SimpleNamespace(
        graph=f"{plan.name} rewrite"))
    monkeypatch.setattr(held_module, "place_swaps", lambda graph, plan: types.SimpleNamespace(
        graph=f"{graph}, placed", report=f"{plan.name} placement"))
    monkeypatch.setattr(held_module, "apply_tuned_order", lambda graph, order, profile, options: (graph, None))

    def hold(graph, order, *, budget_bytes, options, pin, profile):
        held_graphs.append(graph)
        if graph in holdable:
            return f"{graph}, pinned", {"guarantee": order_pass.GUARANTEE_PINNED, "applied": True,
                                        "guarantee_why": "pinned"}
        return graph, {"guarantee": order_pass.GUARANTEE_NONE, "pinned_peak_bytes": 1150,
                       "guarantee_why": "pinning level order would cut the step's XLA clusters"}

    monkeypatch.setattr(order_pass, "hold_to_budget", hold)
    return holdable, held_graphs


def test_a_winner_that_cannot_be_held_gives_way_to_the_first_fit_that_can(passes):
    holdable, held_graphs = passes
    holdable.add("roomier rewrite, placed")
    result = _result()
    placed = types.SimpleNamespace(graph="winner, placed", report="winner's placement")
    final, order, chosen, pinned, placement = held_module.held(placed, placed.graph, None, result, "profile",
                                                               "options", pin=True, xla=True, copy_op="Identity")
    assert held_graphs == ["winner, placed", "roomy rewrite, placed", "roomier rewrite, placed"]
    assert final == "roomier rewrite, placed, pinned" and pinned and placement.report == "roomier placement"
    assert chosen.best.params["name"] == "roomier" and chosen.graph == "roomier rewrite"
    assert chosen.candidates == result.candidates and chosen.budget_bytes == result.budget_bytes
    assert order["held_instead_of"]["params"] == {"name": "best"}
    assert "cut the step's XLA clusters" in order["held_instead_of"]["why"]
    assert order["guarantee_why"].startswith("pinned; this plan (1400.0 ms a step, simulated) runs instead of the "
                                             "fastest found (recompute, 1000.0 ms), which could not be held")
    # the plan reported: the fit's, with what the pipeline added to the winner's warnings
    chosen.best.plan = _Plan("roomier", ("its own",))
    reported = held_module.held_plan(_Plan("best", ("no GPU here",)), result, chosen)
    assert reported == _Plan("roomier", ("no GPU here", "its own"))
    assert held_module.held_plan("the plan", result, result) == "the plan"


@pytest.mark.parametrize("xla, pin", [(True, False), (False, True)])
def test_only_a_step_that_keeps_xla_and_pins_looks_further(passes, xla, pin):
    holdable, held_graphs = passes
    holdable.add("roomy rewrite, placed")
    result = _result()
    placed = types.SimpleNamespace(graph="winner, placed", report="winner's placement")
    final, order, chosen, _, placement = held_module.held(placed, placed.graph, None, result, "profile", "options",
                                                          pin=pin, xla=xla, copy_op="Identity")
    assert held_graphs == ["winner, placed"] and chosen is result and placement is placed
    assert order["guarantee"] == order_pass.GUARANTEE_NONE


def test_where_no_fit_can_be_held_the_winner_runs_as_before(passes):
    _, held_graphs = passes
    result = _result()
    placed = types.SimpleNamespace(graph="winner, placed", report="winner's placement")
    final, order, chosen, _, placement = held_module.held(placed, placed.graph, None, result, "profile", "options",
                                                          pin=True, xla=True, copy_op="Identity")
    assert len(held_graphs) == 4 and chosen is result and final == "winner, placed" and placement is placed
    assert order["guarantee"] == order_pass.GUARANTEE_NONE and "held_instead_of" not in order


def test_the_pipeline_reports_and_runs_the_plan_that_was_held(monkeypatch):
    """Through the pipeline (the test MLP keeping XLA, under XLA alone's peak): where pinning the winner would not fit,
    the step that runs is another fit's, and the report says so: its tuning, the plan, and why."""
    from tflms.config import LMSConfig
    from tflms.pipeline import rewrite_step
    from tflms.sim import SimOptions, simulate
    from tflms.testing import mlp_training_graph

    graph = mlp_training_graph(4, batch=256)
    profile = "h100-80gb-pcie5"
    peak = simulate(graph, profile, options=SimOptions(clock="xla")).peak_bytes
    config = LMSConfig(budget_bytes=int(peak * 0.9), profile=profile)
    plain = rewrite_step(graph, config, build=False, xla=True)
    calls = []
    hold = order_pass.hold_to_budget

    def first_fails(graph, order, **kwargs):  # the winner's pinned step does not fit; any other's does
        out, record = hold(graph, order, **kwargs)
        calls.append(record["guarantee"])
        if len(calls) == 1:
            record = {**record, "guarantee": order_pass.GUARANTEE_NONE, "pinned_peak_bytes": 0,
                      "guarantee_why": "pinning level order would cut the step's XLA clusters (forced)"}
            return graph, record
        return out, record

    monkeypatch.setattr(order_pass, "hold_to_budget", first_fails)
    out = rewrite_step(graph, config, build=False, xla=True)
    tuning, order = out.report.tuning, out.report.order
    assert len(calls) == 2 and order["guarantee"] != order_pass.GUARANTEE_NONE
    assert order["held_instead_of"]["params"] == plain.report.tuning["params"]
    assert tuning["held_instead_of"] == order["held_instead_of"] and tuning["params"] != plain.report.tuning["params"]
    assert tuning["predicted_step_time_s"] >= plain.report.tuning["predicted_step_time_s"]
    assert "runs instead of the fastest fit" in tuning["reason"] and "could not be" in order["guarantee_why"]
    assert out.report.plan != plain.report.plan and out.report.xla_clusters["kept"]
    assert {"order", "guarantee"} <= set(out.report.timings_s)  # each stage timed as before


def test_hold_tuned_answers_for_a_tune_what_the_pipeline_would_run(monkeypatch):
    """The tools' entry (benchlib's tflms-xla prices what runs): a tune of the test MLP on the xla-clusters clock, held
    as the pipeline holds it. Its winner holds (pinned, or proved for every order); with its pinned step forced over
    the budget, the next fit that holds runs, and the record says which plan it passed over."""
    from tflms.sim import SimOptions, simulate
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    from tflms.testing import mlp_training_graph
    from tflms.tune import tune

    graph = mlp_training_graph(4, batch=256)
    profile = "h100-80gb-pcie5"
    options = SimOptions(clock=CLOCK_XLA_CLUSTERS)
    peak = simulate(graph, profile, options=options).peak_bytes
    result = tune(graph, budget=int(peak * 0.9), profile=profile, sim_options=options, enforce_order=True)
    runs, order = held_module.hold_tuned(result, profile, options)
    assert runs is result and order["guarantee"] != order_pass.GUARANTEE_NONE and "held_instead_of" not in order

    calls = []
    hold = order_pass.hold_to_budget

    def first_fails(graph, order, **kwargs):
        out, record = hold(graph, order, **kwargs)
        calls.append(record["guarantee"])
        if len(calls) == 1:
            return graph, {**record, "guarantee": order_pass.GUARANTEE_NONE, "pinned_peak_bytes": 0,
                           "guarantee_why": "pinning level order would cut the step's XLA clusters (forced)"}
        return out, record

    monkeypatch.setattr(order_pass, "hold_to_budget", first_fails)
    runs, order = held_module.hold_tuned(result, profile, options)
    assert runs.best is held_module.alternatives(result, 0)[0] and runs.best.sim.step_time_s >= result.best.sim.step_time_s
    assert order["guarantee"] != order_pass.GUARANTEE_NONE and order["held_instead_of"]["params"] == result.best.params
