"""The index-based simulator and the incremental plan evaluator give exactly the old simulator's answers.

The reference is ``tests/reference_simulator.py`` (the simulator as it was before it was rewritten over
integer ids) applied to ``apply_swaps``'s rewritten IR graph. Every field of the result is compared:
peaks, step time, the timeline, who is alive at the peak, every op's span, buffer owners and lifetimes.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_simulator as ref
from tflms.analysis.cto import Category, analyze_graph
from tflms.config import LMSConfig
from tflms.errors import GraphError
from tflms.ir.graph import TensorRef
from tflms.ir.tf_io import FunctionSignature
from tflms.passes.swaps import apply_swaps
from tflms.policies.tflms_rules import plan_swaps
from tflms.policies.swapplan import SwapDecision, SwapInGroup, SwapPlan, find_trigger, swap_op_names
from tflms.sim import get_profile, simulate
from tflms.tune.evaluator import PlanEvaluator, order_with_plan
from tflms.sim.simulator import SimOptions
from tflms.testing import GraphBuilder, mlp_training_graph
from tflms.policies.idle_time import NO_OVERHEAD, STICK_TO_LIMIT, idle_candidates, plan_idle
from tflms.tune.vdnn import VDNN_POLICIES, plan_vdnn

#: The reference simulator is the serial clock (one kernel after another, launches in their time): the V100
#: profile, timed that way (``host_kernels``: the ``auto`` clock is then ``serial``, tflms.sim.clock).
PROFILE = dataclasses.replace(get_profile("v100-16gb-pcie3"), host_kernels=True)
ACCEL = "/device:GPU:0"
FIELDS = [f.name for f in dataclasses.fields(ref.SimResult)]


def _record(r) -> tuple:
    return dataclasses.astuple(r) if dataclasses.is_dataclass(r) else tuple(r)


def differences(new, old) -> list[str]:
    """Fields in which two simulator results differ (OpRecords compared as tuples)."""
    out = []
    for name in FIELDS:
        a, b = getattr(new, name), getattr(old, name)
        if name == "ops":  # the reference's records are dataclasses, the new ones named tuples
            a, b = [_record(r) for r in a], [_record(r) for r in b]
        elif name == "buffer_owner":
            a, b = dict(a), dict(b)
        if a != b:
            out.append(name)
    return out


def reference(graph, plan, *, copy_op="Identity", options=None, order=None):
    rewritten = apply_swaps(graph, plan, copy_op=copy_op).graph if plan is not None else graph
    if order is not None and plan is not None:
        order = order_with_plan(order, plan)
    ref_options = None
    if options is not None:
        fields = dataclasses.asdict(options)
        assert fields.pop("transfer_order") == "release"  # the reference's only copy queue model
        assert fields.pop("clock") in ("auto", "serial")  # the reference's only clock (PROFILE's auto)
        assert fields.pop("xla_unsupported") == ()  # (read by the xla-clusters clock only)
        assert fields.pop("xla_left_out_rules") == ()  # (read by the xla-clusters clock only)
        assert fields.pop("xla_update_parts") == 1  # (read by the xla-clusters clock only)
        assert fields.pop("xla_land_cuts") is False  # (read by the xla-clusters clock only)
        assert fields.pop("xla_clones_last") is False  # (read by the xla-clusters clock only)
        ref_options = ref.SimOptions(**fields)
    return ref.simulate(rewritten, PROFILE, options=ref_options, order=order), rewritten


def assert_same(evaluator, graph, plan, *, copy_op="Identity", options=None, order=None):
    expected, rewritten = reference(graph, plan, copy_op=copy_op, options=options, order=order)
    got = evaluator.evaluate(plan)
    assert differences(got, expected) == [], f"evaluator vs reference, plan {plan_summary(plan)}"
    fast = simulate(rewritten, PROFILE, options=options,
                    order=None if order is None else (order_with_plan(order, plan) if plan else order))
    assert differences(fast, expected) == [], f"simulate vs reference, plan {plan_summary(plan)}"
    return got


def plan_summary(plan):
    if plan is None:
        return "none"
    return [(s.tensor.name, [(g.consumers, g.trigger) for g in s.swap_ins], s.sync_out_consumers) for s in plan.swaps]


# ----------------------------------------------------------------------------------------------- fixtures
def _sig(outputs=(), control_outputs=()):
    return FunctionSignature(input_names=("x",), num_captures=0, output_names=tuple(outputs),
                             control_output_names=tuple(control_outputs))


def residual_graph():
    """Two residual blocks with a branch, a host-side op feeding the accelerator, an op nothing needs, a
    MaxPool (workspaces), a signature (pruning) and a backward pass reading the forward activations."""
    b = GraphBuilder()
    s = (8, 16, 16, 4)
    x = b.op("x", "Placeholder", shape=s)
    scale = b.op("host/scale", "Const", shape=s)
    b.graph.op("host/scale").device = "/device:CPU:0"
    h = b.op("fw/conv0", "Conv2D", [x, scale], shape=s)
    acts = [h]
    for blk in range(2):
        a = b.op(f"fw/b{blk}/relu", "Relu", [h], shape=s)
        m = b.op(f"fw/b{blk}/mul", "Mul", [a, scale], shape=s)
        br = b.op(f"fw/b{blk}/branch", "Tanh", [h], shape=s)
        h = b.op(f"fw/b{blk}/add", "AddV2", [m, br], shape=s)
        acts += [a, m, br, h]
    p = b.op("fw/pool", "MaxPool", [h], shape=s)
    b.op("fw/unused", "Exp", [p], shape=(8, 16, 16, 16))
    loss = b.op("loss", "Sum", [p], shape=())
    g = b.op("gradient_tape/pool_grad", "MaxPoolGrad", [h, p, loss], shape=s)
    for k, act in enumerate(reversed(acts)):
        g = b.op(f"gradient_tape/g{k}", "ReluGrad", [g, act], shape=s)
    b.op("gradient_tape/wgrad", "Conv2DBackpropFilter", [x, scale, g], shape=s)
    b.op("opt/update", "AssignSubVariableOp", ["gradient_tape/wgrad"], shape=None, num_outputs=0)
    graph = b.graph
    graph.signature = _sig(outputs=["loss:0"], control_outputs=["opt/update"])
    return graph


def fixture_graph(request, name):
    if name == "cnn":
        return request.getfixturevalue("cnn_graph")[0]
    return {"mlp": lambda: mlp_training_graph(5, batch=64, width=128), "residual": residual_graph}[name]()


def tflms_plans(analysis, config=LMSConfig()):
    """TFLMS plans at every threshold, ahead, groupby and sync_mode of a small grid (deduplicated)."""
    max_distance = max((analysis.levels[c] - analysis.levels[n] for n in analysis.order
                        for c in analysis.graph.successors(n)), default=1)
    seen, plans = set(), []
    for threshold, ahead, groupby, sync in itertools.product(range(1, max_distance + 1), (1, 2, 5), (0, 3),
                                                             (0, 1, 2, 3)):
        plan = plan_swaps(analysis, config.replace(swapout_threshold=threshold, swapin_ahead=ahead,
                                                   swapin_groupby=groupby, sync_mode=sync), accelerator_device=ACCEL)
        if plan.swaps and plan.swaps not in seen:
            seen.add(plan.swaps)
            plans.append(plan)
    return plans


def idle_plans(analysis, graph, config=LMSConfig()):
    base = simulate(graph, PROFILE)
    cands = idle_candidates(analysis, base, PROFILE, config)
    plans = []
    for mode in (STICK_TO_LIMIT, NO_OVERHEAD):
        for k in (1, 2, len(cands) // 2, len(cands)):
            if k:
                plans.append(plan_idle(analysis, cands[:k], config, ACCEL, mode))
    return plans


# ----------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ["mlp", "residual", pytest.param("cnn", marks=pytest.mark.slow)])
def test_evaluator_equals_apply_and_simulate_on_tflms_idle_and_vdnn_plans(request, name):
    graph = fixture_graph(request, name)
    analysis = analyze_graph(graph)
    plans = tflms_plans(analysis) + idle_plans(analysis, graph)
    plans += [plan_vdnn(analysis, p, LMSConfig(), accelerator_device=ACCEL) for p in VDNN_POLICIES]
    assert len(plans) >= 8
    evaluator = PlanEvaluator(graph, PROFILE)
    assert_same(evaluator, graph, None)
    for plan in plans:
        assert_same(evaluator, graph, plan)
    assert evaluator.simulations == len({p.swaps for p in plans} | {()})  # plans without swaps: the base's result


@pytest.mark.parametrize("name", ["mlp", "residual", pytest.param("cnn", marks=pytest.mark.slow)])
def test_evaluator_equals_reference_with_deep_copies_margins_and_workspaces(request, name):
    graph = fixture_graph(request, name)
    analysis = analyze_graph(graph)
    options = SimOptions(margin_fraction=0.1, margin_bytes=1000, workspace_bytes_per_element={"MaxPool": 1.0})
    evaluator = PlanEvaluator(graph, PROFILE, options, copy_op="DeepCopy")
    for plan in tflms_plans(analysis)[::3]:
        assert_same(evaluator, graph, plan, copy_op="DeepCopy", options=options)


@pytest.mark.parametrize("name", ["mlp", "residual", pytest.param("cnn", marks=pytest.mark.slow)])
def test_evaluator_follows_a_given_order(request, name):
    graph = fixture_graph(request, name)
    analysis = analyze_graph(graph)
    # A depth-first schedule (not the level order): finish each op's fan-in before the next output.
    order = list(reversed(graph.topological_order()))
    seen, dfs = set(), []
    for root in order:
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                dfs.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(graph.predecessors(node)) if p not in seen)
    evaluator = PlanEvaluator(graph, PROFILE, order=dfs)
    assert_same(evaluator, graph, None, order=dfs)
    checked = 0
    for plan in tflms_plans(analysis)[::2]:
        try:
            expected, _ = reference(graph, plan, order=dfs)
        except GraphError:  # a trigger the schedule runs after a consumer: both must refuse
            with pytest.raises(GraphError):
                evaluator.evaluate(plan)
            continue
        assert differences(evaluator.evaluate(plan), expected) == []
        checked += 1
    assert checked >= 3


def test_order_with_plan_slots_swap_ops_after_their_last_input():
    graph = mlp_training_graph(3)
    analysis = analyze_graph(graph)
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=2), accelerator_device=ACCEL)
    order = list(analysis.order)
    swap = plan.swaps[0]
    group = swap.swap_ins[0]
    slotted = order_with_plan(order, plan)
    assert len(slotted) == len(order) + sum(1 + len(s.swap_ins) for s in plan.swaps)
    assert slotted[slotted.index(swap.tensor.op) + 1] == swap.swap_out
    last_input = max(swap.tensor.op, group.trigger, key=order.index)
    assert slotted.index(group.name) > slotted.index(last_input)
    assert slotted[slotted.index(group.name) - 1] in (last_input, swap.swap_out) or \
        slotted[slotted.index(group.name) - 1].startswith("lms/")


def test_negative_control_a_perturbed_cost_is_caught():
    graph = residual_graph()
    analysis = analyze_graph(graph)
    plan = tflms_plans(analysis)[0]
    evaluator = PlanEvaluator(graph, PROFILE)
    assert_same(evaluator, graph, plan)
    expected, _ = reference(graph, plan)
    perturbed = PlanEvaluator(graph, PROFILE)
    conv = perturbed._op_id["fw/conv0"]
    perturbed._costs.time_s(conv, graph.op("fw/conv0"))
    perturbed._costs._times[conv] *= 1.000001
    assert "step_time_s" in differences(perturbed.evaluate(plan), expected)
    # And a plan with one consumer group moved is caught too.
    swap = plan.swaps[0]
    moved = dataclasses.replace(plan, swaps=(dataclasses.replace(swap, swap_ins=swap.swap_ins[:1]),) + plan.swaps[1:])
    if moved.swaps != plan.swaps:
        assert differences(evaluator.evaluate(moved), expected) != []


def test_memo_returns_the_same_result_for_an_equal_plan():
    graph = mlp_training_graph(4)
    analysis = analyze_graph(graph)
    evaluator = PlanEvaluator(graph, PROFILE)
    a = plan_swaps(analysis, LMSConfig(swapout_threshold=2), accelerator_device=ACCEL)
    b = plan_swaps(analysis, LMSConfig(swapout_threshold=2), accelerator_device=ACCEL)
    assert evaluator.evaluate(a) is evaluator.evaluate(b)
    assert (evaluator.simulations, evaluator.memo_hits) == (1, 1)


def test_a_rewritten_graph_is_refused_like_apply_plan_refuses_it():
    graph = mlp_training_graph(3)
    analysis = analyze_graph(graph)
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=2), accelerator_device=ACCEL)
    rewritten = apply_swaps(graph, plan).graph
    with pytest.raises(GraphError, match="already holds tflms swap ops"):
        PlanEvaluator(rewritten, PROFILE).evaluate(plan)


# ----------------------------------------------------------------------------------------------- property
def _random_plan(data, analysis):
    """Random swaps: any tensors with consumers, random consumer groups, triggers among the first consumer's
    ancestors (or none), random synchronous swap-out consumers."""
    graph, levels = analysis.graph, analysis.levels
    refs = [TensorRef(n, i) for n in analysis.order for i in range(len(graph.op(n).outputs))
            if graph.consumers(TensorRef(n, i)) and graph.tensor(TensorRef(n, i)).dtype != "resource"]
    chosen = data.draw(st.lists(st.sampled_from(refs), unique=True, max_size=6))
    swaps = []
    for ref_ in sorted(chosen):
        consumers = sorted({c for c, _ in graph.consumers(ref_)}, key=lambda c: (levels[c], c))
        far = data.draw(st.lists(st.sampled_from(consumers), unique=True, min_size=1, max_size=len(consumers)))
        far = sorted(far, key=lambda c: (levels[c], c))
        near = tuple(c for c in consumers if c not in far)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(far) - 1)), max_size=2))) if len(far) > 1 else []
        bounds = [0] + [c for c in cuts if c < len(far)] + [len(far)]
        out_name, in_base = swap_op_names(ref_)
        groups = []
        for gi, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            members = tuple(far[lo:hi])
            if data.draw(st.booleans()):
                trigger = find_trigger(analysis, members[0], levels[ref_.op],
                                       levels[members[0]] - data.draw(st.integers(1, 4)))
            else:
                trigger = None
            groups.append(SwapInGroup(name=f"{in_base}_{gi}", consumers=members,
                                      consumer_levels=tuple(levels[m] for m in members), trigger=trigger,
                                      trigger_level=None if trigger is None else levels[trigger], sync=False))
        sync_out = near if data.draw(st.booleans()) else ()
        info = graph.tensor(ref_)
        swaps.append(SwapDecision(tensor=ref_, dtype=info.dtype, num_bytes=info.num_bytes or 0,
                                  producer_level=levels[ref_.op], swap_out=out_name, sync_out_consumers=sync_out,
                                  swap_ins=tuple(groups)))
    return SwapPlan(config=LMSConfig(), accelerator_device=ACCEL, swaps=tuple(swaps), skipped=())


_RANDOM = {}


def _random_setup(name):
    if name not in _RANDOM:
        graph = {"mlp": lambda: mlp_training_graph(4, batch=64, width=128), "residual": residual_graph}[name]()
        _RANDOM[name] = (graph, analyze_graph(graph), {c: PlanEvaluator(graph, PROFILE, copy_op=c)
                                                       for c in ("Identity", "DeepCopy")})
    return _RANDOM[name]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(["mlp", "residual"]), copy_op=st.sampled_from(["Identity", "DeepCopy"]))
def test_property_random_plans_give_the_reference_result(data, name, copy_op):
    graph, analysis, evaluators = _random_setup(name)
    plan = _random_plan(data, analysis)
    try:
        expected, _ = reference(graph, plan, copy_op=copy_op)
    except GraphError:
        with pytest.raises(GraphError):
            evaluators[copy_op].evaluate(plan)
        return
    assert differences(evaluators[copy_op].evaluate(plan), expected) == [], plan_summary(plan)


def test_backward_tensors_and_category_independence():
    # Swapping a backward-produced tensor (issue 11: any long-idle tensor is a candidate) is simulated alike.
    graph = residual_graph()
    analysis = analyze_graph(graph)
    backward = [n for n in analysis.order if analysis.categories[n] is Category.BACKWARD
                and len({c for c, _ in graph.consumers(TensorRef(n))}) >= 1 and graph.tensor(TensorRef(n)).num_bytes]
    ref_ = TensorRef(backward[0])
    consumers = tuple(sorted({c for c, _ in graph.consumers(ref_)}))
    out_name, in_base = swap_op_names(ref_)
    plan = SwapPlan(config=LMSConfig(), accelerator_device=ACCEL, skipped=(), swaps=(SwapDecision(
        tensor=ref_, dtype="float32", num_bytes=graph.tensor(ref_).num_bytes, producer_level=analysis.levels[ref_.op],
        swap_out=out_name, sync_out_consumers=(), swap_ins=(SwapInGroup(
            name=f"{in_base}_0", consumers=consumers, consumer_levels=(), trigger=None, trigger_level=None,
            sync=True),)),))
    got = assert_same(PlanEvaluator(graph, PROFILE), graph, plan)
    assert any(r.name == out_name for r in got.ops)


def recompute_plans(analysis, graph):
    """Recompute plans of growing sets (the tuner's ranking, best first), split and not, and segment plans."""
    from tflms.policies.recompute import plan_recomputes, rank_candidates, segment_ops, select
    from tflms.sim.cost import op_time_s
    ranked, _ = rank_candidates(analysis, lambda n: op_time_s(graph, graph.op(n), PROFILE))
    sets = [select(analysis, ranked[:k]) for k in sorted({1, 2, len(ranked) // 2, len(ranked)}) if k]
    sets += [segment_ops(analysis, segments) for segments in (1, 2)]
    plans, seen = [], set()
    for ops in sets:
        for split in (None, 1):
            decisions, _ = plan_recomputes(analysis, ops, split_levels=split)
            if decisions and decisions not in seen:
                seen.add(decisions)
                plans.append(SwapPlan(LMSConfig(), ACCEL, (), (), recomputes=decisions))
    return plans


@pytest.mark.parametrize("name", ["mlp", "residual", "cnn"])
def test_evaluator_equals_apply_and_simulate_on_recompute_plans(request, name):
    """Recompute plans go through the evaluator incrementally too (the clones appended, their readers rewired, which
    ops run derived again): the same result, field for field, as simulating the rewritten graph."""
    graph = fixture_graph(request, name)
    analysis = analyze_graph(graph)
    plans = recompute_plans(analysis, graph)
    assert len(plans) >= 3 and any(any(r.copy for r in p.recomputes) for p in plans)  # (split: copies re-run again)
    options = SimOptions(margin_fraction=0.1, margin_bytes=1000, workspace_bytes_per_element={"MaxPool": 1.0})
    # (on the xla-clusters clock the tuner's gates, appended without an IR op, are barriers inside the clusters as
    # the pass makes them, not copies)
    for opts in (None, options, SimOptions(clock="xla-clusters")):
        evaluator = PlanEvaluator(graph, PROFILE, opts)
        evaluator.evaluate(None)
        for plan in plans:
            got = evaluator.evaluate(plan)
            expected = simulate(apply_swaps(graph, plan).graph, PROFILE, options=opts)
            assert differences(got, expected) == [], [r.ops for r in plan.recomputes]
        assert evaluator.simulations == len(plans) + 1


def test_a_recomputed_op_that_only_the_backward_pass_read_no_longer_runs_in_either():
    """An original whose every reader now reads its clone is not needed: the evaluator derives again which ops run,
    as simulating the rewritten graph does (its last forward reader gone, it is pruned like any unread op)."""
    from tflms.policies.recompute import plan_recomputes
    b = GraphBuilder()
    s = (64, 256)
    x = b.op("x", "Placeholder", shape=s)
    a = b.op("fw/a", "Relu", [x], shape=s)
    side = b.op("fw/side", "Square", [a], shape=s)  # read by the backward pass alone
    h = b.op("fw/h", "Tanh", [a], shape=s)
    loss = b.op("loss", "Sum", [h], shape=())
    g = b.op("gradient_tape/g0", "TanhGrad", [h, loss], shape=s)
    g = b.op("gradient_tape/g1", "Mul", [g, side], shape=s)
    b.op("opt/update", "AssignSubVariableOp", [g], shape=None, num_outputs=0)
    graph = b.graph
    graph.signature = _sig(outputs=["loss:0"], control_outputs=["opt/update"])
    analysis = analyze_graph(graph)
    decisions, _ = plan_recomputes(analysis, ["fw/side"])
    assert decisions and decisions[0].ops == ("fw/side",)
    plan = SwapPlan(LMSConfig(), ACCEL, (), (), recomputes=decisions)
    expected = simulate(apply_swaps(graph, plan).graph, PROFILE)
    got = PlanEvaluator(graph, PROFILE).evaluate(plan)
    assert differences(got, expected) == []
    ran = {r.name for r in got.ops}
    assert "fw/side" not in ran and "lms/recompute_fw/side" in ran
