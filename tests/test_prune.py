"""Dropping the swaps a fitting plan does not need (tflms.tune.prune)."""

from __future__ import annotations

import dataclasses

from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.ir.graph import TensorRef
from tflms.passes.swaps import DEFAULT_COPY_OP, apply_swaps
from tflms.policies.swapplan import SwapDecision, SwapInGroup, SwapPlan, swap_op_names
from tflms.sim.simulator import SimOptions, simulate
from tflms.testing.graphs import GraphBuilder, mlp_training_graph, serial_clock
from tflms.tune.prune import PRUNED_PARAM, ROUND_TRIP_PARAM, earlier_swap_ins, merged_swap_ins, predicted_drops, prune_swaps
from tflms.tune.search import TuneEvaluator

PROFILE = serial_clock("v100-16gb-pcie3")  # the scenarios below were worked out on the serial clock
SHAPE = (1024, 1024)  # 4 MiB: a copy takes about 0.34 ms on PCIe 3, an element-wise op about 0.02 ms
MIB = 2**20
CHAIN = 40  # element-wise ops in each chain: long enough (about 0.8 ms) to hide two copies


def _chain(b: GraphBuilder, start, prefix: str, op_type: str, ks=range(CHAIN), shape=SHAPE):
    """Element-wise ops ``{prefix}{k}`` for ``k`` in ``ks``, each reading the one before (the first ``start``);
    returns the last."""
    for k in ks:
        start = b.op(f"{prefix}{k}", op_type, [start], shape=shape)
    return start


def _graph():
    """``early`` waits across the ``c`` chain (not the peak); ``late`` waits across the peak (``t1``, ``t2``).

    Live bytes (MiB): the ``c`` chain holds ``x``, ``early``, ``late`` and two links (20); at ``t2`` the
    device holds ``x``, ``r``, ``t1``, ``t2`` (4 + 4 + 8 + 8 = 24) and ``late`` (28) unless it is away.
    """
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    early = b.op("early", "Relu", [x], shape=SHAPE)
    late = b.op("late", "Neg", [x], shape=SHAPE)
    c = _chain(b, x, "c", "Sin")
    r = b.op("r", "AddN", [early, c], shape=SHAPE)
    t1 = b.op("t1", "Sin", [r], shape=(2048, 1024))
    t2 = b.op("t2", "Cos", [r], shape=(2048, 1024))
    d = b.op("s", "AddN", [r, t1, t2], shape=SHAPE)
    d = _chain(b, d, "d", "Exp")
    b.op("out", "AddN", [late, d], shape=SHAPE)
    return b.graph


def _swap(analysis, tensor: str, consumer: str, trigger: str) -> SwapDecision:
    ref = TensorRef(tensor, 0)
    out_name, in_base = swap_op_names(ref)
    levels = analysis.levels
    return SwapDecision(tensor=ref, dtype="float32", num_bytes=4 * MIB, producer_level=levels[tensor],
                        swap_out=out_name, sync_out_consumers=(),
                        swap_ins=(SwapInGroup(f"{in_base}_0", (consumer,), (levels[consumer],), trigger,
                                              levels[trigger], sync=False),))


def _evaluator(analysis, budget: int, progress=None) -> TuneEvaluator:
    config = LMSConfig().with_rule_defaults()
    ev = TuneEvaluator(analysis, PROFILE, budget, PROFILE.host_memory_bytes, SimOptions(), config, "/device:GPU:0",
                    DEFAULT_COPY_OP, progress)
    ev.context = dataclasses.replace(ev.context, baseline=ev.plans.evaluate(None))
    return ev


def _both_swapped():
    analysis = analyze_graph(_graph())
    plan = SwapPlan(config=LMSConfig().with_rule_defaults(), accelerator_device="/device:GPU:0",
                    swaps=(_swap(analysis, "early", "r", "c20"), _swap(analysis, "late", "out", "d20")), skipped=())
    return analysis, plan


def test_the_constructed_graph_needs_exactly_the_late_swap():
    """The premise of the tests below, by simulation: each plan's peak, worked out in ``_graph``'s doc."""
    analysis, plan = _both_swapped()
    graph = analysis.graph
    assert simulate(graph, PROFILE).peak_bytes == 28 * MIB
    assert simulate(apply_swaps(graph, plan).graph, PROFILE).peak_bytes == 24 * MIB
    only_late = dataclasses.replace(plan, swaps=plan.swaps[1:])
    only_early = dataclasses.replace(plan, swaps=plan.swaps[:1])
    assert simulate(apply_swaps(graph, only_late).graph, PROFILE).peak_bytes == 24 * MIB
    assert simulate(apply_swaps(graph, only_early).graph, PROFILE).peak_bytes == 28 * MIB


def test_the_unneeded_swap_is_dropped_and_the_needed_one_kept():
    analysis, plan = _both_swapped()
    lines: list[str] = []
    ev = _evaluator(analysis, 24 * MIB, lines.append)
    cand = ev.run("tflms-distance", {"swapout_threshold": 2}, plan)
    assert cand.fits
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned in ev.candidates
    assert [s.tensor.name for s in pruned.plan.swaps] == ["late:0"]
    assert pruned.params == {"swapout_threshold": 2, PRUNED_PARAM: 1}
    assert pruned.fits and pruned.sim.peak_bytes == 24 * MIB
    assert pruned.sim.step_time_s <= cand.sim.step_time_s
    # one progress line per candidate (the callback's contract: verbose output counts them); the trials are logged
    assert len(lines) == 2 and "'pruned': 1" in lines[1] and "peak 24.00 MiB" in lines[1]


def test_the_prediction_ranks_only_the_swap_away_off_the_peak():
    analysis, plan = _both_swapped()
    sim = simulate(apply_swaps(analysis.graph, plan).graph, PROFILE)
    assert [s.tensor.name for s in predicted_drops(plan.swaps, sim, 24 * MIB)] == ["early:0"]
    # with 4 MiB more allowed both may go; while early is away the device holds x, late (its copy to the host
    # is still queued) and two links of the chain: 16 MiB, so early fits back under 20 MiB, not under 19
    assert len(predicted_drops(plan.swaps, sim, 28 * MIB)) == 2
    assert [s.tensor.name for s in predicted_drops(plan.swaps, sim, 20 * MIB)] == ["early:0"]
    assert predicted_drops(plan.swaps, sim, 19 * MIB) == []


def test_nothing_is_dropped_when_every_swap_is_needed():
    analysis, plan = _both_swapped()
    ev = _evaluator(analysis, 24 * MIB)
    only_late = ev.run("tflms-distance", {}, dataclasses.replace(plan, swaps=plan.swaps[1:]))
    assert only_late.fits
    before = len(ev.candidates)
    assert prune_swaps(ev, only_late) is None
    assert len(ev.candidates) == before


def test_a_wait_for_a_swap_out_the_fit_does_not_need_is_dropped():
    """``late``'s swap-out makes the ``c`` chain wait for its copy (about 0.34 ms); the copy ends long before
    the peak (``t2``) either way, so without the wait the step fits as well and is faster."""
    from tflms.tune.prune import UNSYNCED_PARAM
    analysis, plan = _both_swapped()
    early, late = plan.swaps
    waiting = dataclasses.replace(plan, swaps=(early, dataclasses.replace(late, sync_out_consumers=("c0",))))
    ev = _evaluator(analysis, 24 * MIB)
    cand = ev.run("tflms-distance", {"sync_mode": 1}, waiting)
    free = ev.run("tflms-distance", {"sync_mode": 0}, plan)
    assert cand.fits and cand.sim.step_time_s > free.sim.step_time_s  # the premise: the wait costs time
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits
    assert pruned.params == {"sync_mode": 1, PRUNED_PARAM: 1, UNSYNCED_PARAM: 1}
    assert [(s.tensor.name, s.sync_out_consumers) for s in pruned.plan.swaps] == [("late:0", ())]
    assert pruned.sim.step_time_s < cand.sim.step_time_s


def test_a_plan_without_waits_reads_no_order_for_the_wait_steps(monkeypatch):
    """The wait steps read the order's pinned ops (a buffer model of the whole graph: over a second on ResNet-50,
    which doubled the tuner's time at batch 208) only when some swap waits."""
    import tflms.schedule
    calls = []
    real = tflms.schedule.ordered_ops
    monkeypatch.setattr(tflms.schedule, "ordered_ops", lambda *a, **k: calls.append(1) or real(*a, **k))
    analysis, plan = _both_swapped()
    ev = _evaluator(analysis, 24 * MIB)
    cand = ev.run("tflms-distance", {}, plan)
    assert not any(s.sync_out_consumers for s in plan.swaps)
    assert prune_swaps(ev, cand) is not None and calls == []
    late = dataclasses.replace(plan.swaps[1], sync_out_consumers=("c0",))
    waiting = dataclasses.replace(plan, swaps=(plan.swaps[0], late))
    prune_swaps(ev, ev.run("tflms-distance", {"sync_mode": 1}, waiting))
    assert calls == []  # the wait is dropped by the step before; nothing is left to move


def test_a_wait_the_fit_needs_is_kept_and_moved_as_late_as_the_fit_allows():
    """With ``late`` produced last before the peak (its copy cannot end before ``t2`` unless compute waits),
    dropping the wait would put ``late`` on the device at the peak: the fit needs it, so it stays. Waiting at
    ``t2`` (the peak's allocator) instead of ``t1`` lets ``t1`` run beside the copy and still fits."""
    from tflms.tune.prune import LATER_PARAM, UNSYNCED_PARAM, later_waits
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    r = b.op("r", "Sin", [x], shape=SHAPE)
    late = b.op("late", "Neg", [r], shape=SHAPE)
    t1 = b.op("t1", "Sin", [r], shape=(2048, 1024))
    t2 = b.op("t2", "Cos", [t1], shape=(2048, 1024))
    d = b.op("s", "AddN", [r, t2], shape=SHAPE)
    d = _chain(b, d, "d", "Exp")
    b.op("out", "AddN", [late, d], shape=SHAPE)
    analysis = analyze_graph(b.graph)
    swap = dataclasses.replace(_swap(analysis, "late", "out", "d20"), sync_out_consumers=("t1",))
    plan = SwapPlan(config=LMSConfig().with_rule_defaults(), accelerator_device="/device:GPU:0", swaps=(swap,),
                    skipped=())
    waiting = simulate(apply_swaps(analysis.graph, plan).graph, PROFILE)
    free = simulate(apply_swaps(analysis.graph, dataclasses.replace(plan, swaps=(
        dataclasses.replace(swap, sync_out_consumers=()),))).graph, PROFILE)
    assert free.peak_bytes > waiting.peak_bytes  # the premise: without the wait the copy lags at the peak
    ev = _evaluator(analysis, waiting.peak_bytes)
    cand = ev.run("tflms-distance", {"sync_mode": 1}, plan)
    assert cand.fits
    graph = apply_swaps(analysis.graph, plan).graph
    (moved,) = later_waits(graph, plan.swaps, cand.sim, {op.name for op in graph})
    assert moved.sync_out_consumers == ("t2",)  # twice as far from the producer (r, late, t1, t2)
    assert later_waits(graph, plan.swaps, cand.sim, {"t1"}) == []  # only ops the order pins; none after t1
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits and UNSYNCED_PARAM not in pruned.params
    assert pruned.params == {"sync_mode": 1, LATER_PARAM: 1}
    assert pruned.plan.swaps[0].sync_out_consumers == ("t2",)
    assert pruned.sim.step_time_s < cand.sim.step_time_s


def _mlp_case():
    graph = mlp_training_graph(6, batch=512, width=1024)
    analysis = analyze_graph(graph)
    from tflms.policies.tflms_rules import plan_swaps
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0),
                      accelerator_device="/device:GPU:0")
    swapped = simulate(apply_swaps(graph, plan).graph, PROFILE)
    return analysis, plan, swapped


def test_pruning_an_mlp_plan_keeps_the_fit_and_the_time_and_is_deterministic():
    results = []
    for _ in range(2):
        analysis, plan, swapped = _mlp_case()
        budget = swapped.peak_bytes  # what swapping every activation reaches (6 MiB under the unswapped peak)
        ev = _evaluator(analysis, budget)
        cand = ev.run("tflms-distance", {"swapout_threshold": 1}, plan)
        assert cand.fits
        pruned = prune_swaps(ev, cand)
        assert pruned is not None, "the forward activations' swaps are not all needed at the backward peak"
        assert ev.need(pruned.sim) <= budget and pruned.fits
        assert pruned.sim.step_time_s <= cand.sim.step_time_s
        assert 0 < len(pruned.plan.swaps) < len(plan.swaps)
        # the swaps that went out and straight back became waits (see the round-trip tests below)
        assert pruned.params[PRUNED_PARAM] + pruned.params.get(ROUND_TRIP_PARAM, 0) == (
            len(plan.swaps) - len(pruned.plan.swaps))
        results.append((pruned.plan.swaps, pruned.sim.step_time_s, pruned.sim.peak_bytes))
    assert results[0] == results[1]


def _ungrouped_mlp():
    """The MLP with every activation swapped, one swap-in per reader level (MatMul gradient, ReluGrad)."""
    graph = mlp_training_graph(6, batch=512, width=1024)
    analysis = analyze_graph(graph)
    from tflms.policies.tflms_rules import plan_swaps
    plan = plan_swaps(analysis, LMSConfig(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0),
                      accelerator_device="/device:GPU:0")
    return analysis, plan, simulate(apply_swaps(graph, plan).graph, PROFILE)


def test_merged_swap_ins_serve_every_reader_from_the_first_trigger():
    analysis, plan, sim = _ungrouped_mlp()
    several = [s for s in plan.swaps if len(s.swap_ins) > 1]
    assert several
    merged = merged_swap_ins(plan.swaps, sim, 2 * sim.peak_bytes)  # room for all: every one proposed
    assert sorted(s.tensor for s in merged) == sorted(s.tensor for s in several)
    by_tensor = {s.tensor: s for s in plan.swaps}
    for swap in merged:
        (group,) = swap.swap_ins
        before = by_tensor[swap.tensor].swap_ins
        assert set(group.consumers) == {c for g in before for c in g.consumers}
        assert group.trigger == before[0].trigger and group.name == before[0].name
    assert merged_swap_ins(plan.swaps, sim, 2 * sim.peak_bytes) == merged  # deterministic
    # readers on adjacent levels: the second copy starts before the first group's readers end, so the tensor
    # never leaves the device in between and one copy for both adds no bytes, whatever the limit
    assert {s.tensor for s in merged_swap_ins(plan.swaps, sim, sim.peak_bytes - 1)} == {s.tensor for s in merged}


def test_earlier_swap_ins_double_the_trigger_distance_and_stay_after_the_producer():
    analysis, plan, sim = _ungrouped_mlp()
    levels = analysis.levels
    moved = earlier_swap_ins(analysis, plan.swaps, sim, 2 * sim.peak_bytes)
    assert moved
    by_tensor = {s.tensor: s for s in plan.swaps}
    for swap in moved:
        for new, old in zip(swap.swap_ins, by_tensor[swap.tensor].swap_ins):
            assert new.consumers == old.consumers
            assert swap.producer_level < new.trigger_level <= old.trigger_level
            assert new.trigger_level == levels[new.trigger]
        assert any(n.trigger != o.trigger for n, o in zip(swap.swap_ins, by_tensor[swap.tensor].swap_ins))
    # under a limit the plan already exceeds, only moves that add no bytes remain (the copy was queued anyway)
    tight = earlier_swap_ins(analysis, plan.swaps, sim, sim.peak_bytes - 1)
    assert {s.tensor for s in tight} < {s.tensor for s in moved}


def test_the_tuner_prunes_its_fastest_fit_and_the_pruned_plan_wins_the_tie():
    """In the enforced order the fastest fit (threshold 12, ahead 4) swaps one activation it does not need."""
    from tflms.tune.tuner import tune
    analysis, plan, swapped = _mlp_case()
    budget = swapped.peak_bytes
    kwargs = dict(budget=budget, profile=PROFILE, strategies=["tflms-distance"], enforce_order=True)
    with_prune, without = tune(analysis, **kwargs), tune(analysis, prune=False, **kwargs)
    assert not any(PRUNED_PARAM in c.params for c in without.candidates)
    pruned = [c for c in with_prune.candidates if PRUNED_PARAM in c.params]
    assert len(pruned) == 1 and pruned[0] is with_prune.best
    source = without.best
    assert source.order is not None and pruned[0].order is not None  # judged in the same (enforced) order
    assert pruned[0].params == {**source.params, PRUNED_PARAM: 1}
    assert len(pruned[0].plan.swaps) == len(source.plan.swaps) - 1
    assert pruned[0].fits and pruned[0].sim.peak_with_margin_bytes <= budget
    assert pruned[0].sim.step_time_s <= source.sim.step_time_s
    assert pruned[0].swapped_bytes < source.swapped_bytes  # the tie on time goes to fewer bytes
    again = tune(analysis, **kwargs)
    assert again.best.plan == with_prune.best.plan and again.best.sim.step_time_s == with_prune.best.sim.step_time_s
    first = tune(analysis, first_fit=True, **kwargs)
    assert not any(PRUNED_PARAM in c.params for c in first.candidates)  # a yes/no answer: no pruning


def test_a_pruned_plan_on_a_traced_two_branch_model_trains_bitwise():
    """The pruned plan (round trips made waits, swaps dropped, swap-ins merged or moved earlier) through the swap
    pass, run by TensorFlow: the same bytes as the unrewritten step."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from test_schedule import assert_traced_step_trains_like_plain, traced_step_plan
    from tflms.tune.prune import MERGED_PARAM

    graph, analysis, plan = traced_step_plan(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    swapped = simulate(apply_swaps(graph, plan).graph, PROFILE)
    ev = _evaluator(analysis, swapped.peak_bytes)
    cand = ev.run("tflms-distance", {"swapout_threshold": 1}, plan)
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits and pruned.sim.step_time_s <= cand.sim.step_time_s
    # ten swaps, seventeen swap-ins: most swaps are not needed, and one tensor read at two levels is swapped in once
    assert pruned.params.get(PRUNED_PARAM, 0) >= 1 and pruned.params.get(MERGED_PARAM, 0) >= 1
    assert any(len(s.swap_ins) == 1 and len(s.swap_ins[0].consumers) > 1 for s in pruned.plan.swaps)
    # swaps that went out and straight back are gone (nothing was queued before them: no waits instead)
    assert pruned.params.get(ROUND_TRIP_PARAM, 0) >= 1
    rewritten = apply_swaps(graph, pruned.plan).graph
    assert any(op.name.startswith("lms/swap_in") for op in rewritten)

    assert_traced_step_trains_like_plain(rewritten, "pruned")

    # swap-ins triggered where the link idled (step 7; the pruned plan has none to move): new control edges only,
    # on grappler's step as the pipeline rewrites it (on the traced graph, which grappler would optimize after the
    # rewrite, each of these moves alone changes the trained bytes, e.g. a trigger inside a batch norm's
    # moments: the fallback path's exception, docs/design.md)
    graph, analysis, plan = traced_step_plan(preoptimized=True, swapout_threshold=1, swapin_ahead=1,
                                             swapin_groupby=0)
    swapped = simulate(apply_swaps(graph, plan).graph, PROFILE)
    gaps = {s.tensor: s for s in earlier_swap_ins(analysis, plan.swaps, swapped, 2 * swapped.peak_bytes,
                                                  into_gaps=True)}
    assert gaps, "no swap-in of the traced plan follows an idle link: the move is untested"
    moved = dataclasses.replace(plan, swaps=tuple(gaps.get(s.tensor, s) for s in plan.swaps))
    assert_traced_step_trains_like_plain(apply_swaps(graph, moved).graph, "swap-ins where the link idles",
                                         preoptimized=True)


def test_a_plan_whose_waits_were_dropped_or_moved_trains_bitwise():
    """Sync mode 1 on the traced two-branch model: pruning drops or moves its waits (control edges from
    swap-outs), and the plan with every wait moved later (:func:`later_waits`, ops the order pins) goes
    through the swap pass and TensorFlow and trains byte for byte like the plain step; so does a plan whose one
    wait was split with the copy queued before its own (:func:`split_waits`)."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from test_schedule import assert_traced_step_trains_like_plain, traced_step_plan
    from tflms.schedule import ordered_ops
    from tflms.tune.prune import LATER_PARAM, UNSYNCED_PARAM, _with_split_waits, later_waits, split_waits

    # grappler's step, as the pipeline rewrites it: a wait on a Conv2D of the traced graph would keep grappler
    # from fusing it with its BiasAdd
    graph, analysis, plan = traced_step_plan(preoptimized=True, swapout_threshold=1, swapin_ahead=1,
                                             swapin_groupby=0, sync_mode=1)
    assert any(s.sync_out_consumers for s in plan.swaps)
    waiting = apply_swaps(graph, plan).graph
    swapped = simulate(waiting, PROFILE)
    ev = _evaluator(analysis, swapped.peak_bytes)
    cand = ev.run("tflms-distance", {"sync_mode": 1}, plan)
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits and pruned.sim.step_time_s < cand.sim.step_time_s
    assert pruned.params.get(UNSYNCED_PARAM, 0) + pruned.params.get(LATER_PARAM, 0) >= 1

    pinned = set(ordered_ops(waiting, [r.name for r in swapped.ops if r.name in waiting]))
    moved = {s.tensor: s for s in later_waits(waiting, plan.swaps, swapped, pinned)}
    assert moved
    later = dataclasses.replace(plan, swaps=tuple(moved.get(s.tensor, s) for s in plan.swaps))
    rewritten = apply_swaps(graph, later).graph
    waits = {(c, op.name) for op in rewritten for c in op.control_inputs if c.startswith("lms/swap_out")}
    assert waits == {(s.swap_out, c) for s in later.swaps for c in s.sync_out_consumers}
    assert {c for s in moved.values() for c in s.sync_out_consumers} <= pinned

    assert_traced_step_trains_like_plain(waiting, "waits", preoptimized=True)  # the rules' own waits
    assert_traced_step_trains_like_plain(rewritten, "waits later", preoptimized=True)

    # a split wait (split_waits): one swap waits, the copies queued before its copy do not
    for index, only in enumerate(plan.swaps):
        if not only.sync_out_consumers:
            continue
        one = dataclasses.replace(plan, swaps=tuple(s if s is only else dataclasses.replace(s, sync_out_consumers=())
                                                    for s in plan.swaps))
        one_graph = apply_swaps(graph, one).graph
        one_sim = simulate(one_graph, PROFILE)
        one_pinned = set(ordered_ops(one_graph, [r.name for r in one_sim.ops if r.name in one_graph]))
        splits = split_waits(one_graph, one.swaps, one_sim, one_pinned)
        if splits:
            break
    assert splits, "no swap of the traced plan waits for a copy queued before its own: the split is untested"
    split, _ = _with_split_waits(list(one.swaps), splits)
    rewritten = apply_swaps(graph, dataclasses.replace(one, swaps=split)).graph
    waits = {(c, op.name) for op in rewritten for c in op.control_inputs if c.startswith("lms/swap_out")}
    assert waits == {(s.swap_out, c) for s in split for c in s.sync_out_consumers} and len(waits) > len(
        only.sync_out_consumers)
    (moved, pairs), = [p for p in splits if p[0].tensor == only.tensor]
    assert set(moved.sync_out_consumers) <= one_pinned  # the wait moved goes to an op the order pins
    assert {c for _, c in pairs} == set(only.sync_out_consumers)  # the one before it takes over its waits
    assert_traced_step_trains_like_plain(rewritten, "split waits", preoptimized=True)


def _queued_copies_graph():
    """``a`` and ``b`` (4 MiB each) are made one after the other and read again only by ``out``; their copies to
    the host queue on one link (about 0.34 ms each). ``w`` (8 MiB) fits only once one of them is gone, ``big``
    (12 MiB, after a 40-op chain of about 0.8 ms) only once both are. Live bytes (MiB): at ``c0`` the device
    holds ``x``, ``w``, ``c0`` (16) and whichever of ``a``, ``b`` is still there; at ``big`` ``x``, ``c39``,
    ``big`` (20) and the same."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    a = b.op("a", "Sin", [x], shape=SHAPE)
    bb = b.op("b", "Cos", [a], shape=SHAPE)
    c = _chain(b, b.op("w", "Neg", [bb], shape=(2048, 1024)), "c", "Sin")
    d = b.op("s", "Sum", [b.op("big", "Cos", [c], shape=(3072, 1024))], shape=SHAPE)
    d = _chain(b, d, "d", "Exp")
    b.op("out", "AddN", [a, bb, d], shape=SHAPE)
    return b.graph


def test_a_wait_that_stands_for_a_queued_copy_is_split_between_the_two_swaps():
    """``b`` waits at ``w`` for its copy, which queues behind ``a``'s: ``w`` waits for both although it needs only
    one gone (``a``'s ends first). The split: ``a`` waits at ``w``, ``b`` at the op that starts about when its
    copy ends if the chain runs on meanwhile; the fit holds and the step is faster. Without any wait it does not
    fit (the premise: the wait is needed, so the step before, which drops waits, keeps it)."""
    from tflms.tune.prune import SPLIT_PARAM, split_waits
    analysis = analyze_graph(_queued_copies_graph())
    a = _swap(analysis, "a", "out", "d20")
    b = dataclasses.replace(_swap(analysis, "b", "out", "d20"), sync_out_consumers=("w",))
    plan = SwapPlan(config=LMSConfig().with_rule_defaults(), accelerator_device="/device:GPU:0", swaps=(a, b),
                    skipped=())
    graph = apply_swaps(analysis.graph, plan).graph
    waiting = simulate(graph, PROFILE)
    free = simulate(apply_swaps(analysis.graph, dataclasses.replace(plan, swaps=(
        a, dataclasses.replace(b, sync_out_consumers=()),))).graph, PROFILE)
    assert (waiting.peak_bytes, free.peak_bytes) == (20 * MIB, 24 * MIB)

    chain = {op.name for op in graph if op.name.startswith("c")}
    ((moved, pairs),) = split_waits(graph, plan.swaps, waiting, {op.name for op in graph})
    assert moved.tensor.name == "b:0" and pairs == ((a.tensor, "w"),)
    (later,) = moved.sync_out_consumers
    assert later in chain and 10 <= int(later[1:]) <= 25  # the copy (0.34 ms) against 0.02 ms per chain op
    assert split_waits(graph, plan.swaps, waiting, {"w"}) == []  # only ops the order pins take waits
    assert split_waits(graph, plan.swaps, waiting, {op.name for op in graph}, frozenset({a.tensor})) == []
    halfway = split_waits(graph, plan.swaps, waiting, {op.name for op in graph}, reach=0.5)[0][0]
    assert int(halfway.sync_out_consumers[0][1:]) < int(later[1:])

    ev = _evaluator(analysis, waiting.peak_bytes)
    cand = ev.run("tflms-distance", {"sync_mode": 1}, plan)
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits and pruned.params[SPLIT_PARAM] == 1
    waits = {s.tensor.name: s.sync_out_consumers for s in pruned.plan.swaps}
    assert waits["a:0"] == ("w",) and waits["b:0"][0] in chain
    assert pruned.sim.step_time_s < 0.85 * cand.sim.step_time_s


def _round_trip_case():
    """``s`` (8 MiB) goes to the host for ``out``; ``r`` goes out and straight back for ``u``, its swap-in
    triggered by ``r`` itself: the copy back starts when the copy out ends, so ``r`` never leaves the device. The
    round trip only delays ``u`` until ``s``'s copy (queued first) has ended and ``s``'s bytes are free.

    Live bytes (MiB): ``x`` (4) always; at ``r`` and at ``out`` 16 (``s`` and ``r``, ``s`` back and ``out``); at
    ``u`` 24 while ``s``'s copy is still going (``s``, ``r``, ``u``: 8 + 4 + 8), 16 once it ended."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    s = b.op("s", "Exp", [x], shape=(2048, 1024))
    r = b.op("r", "Sin", [x], shape=SHAPE)
    u = b.op("u", "Mul", [r, x], shape=(2048, 1024))  # twice as large: not written into ``r``'s buffer
    d = b.op("t", "Sum", [u], shape=(256,))
    d = _chain(b, d, "d", "Exp", shape=(256,))
    b.op("out", "Mul", [s, d], shape=SHAPE)
    analysis = analyze_graph(b.graph)
    far = dataclasses.replace(_swap(analysis, "s", "out", "d20"), num_bytes=8 * MIB)
    trip = _swap(analysis, "r", "u", "r")
    plan = SwapPlan(config=LMSConfig().with_rule_defaults(), accelerator_device="/device:GPU:0",
                    swaps=(far, trip), skipped=())
    return analysis, plan


def test_a_swap_that_goes_out_and_straight_back_becomes_a_wait_for_the_copies_queued_before_it():
    from tflms.tune.prune import round_trips
    analysis, plan = _round_trip_case()
    graph = analysis.graph
    tripping = simulate(apply_swaps(graph, plan).graph, PROFILE)
    far, trip = plan.swaps
    dropped = simulate(apply_swaps(graph, dataclasses.replace(plan, swaps=(far,))).graph, PROFILE)
    waiting = dataclasses.replace(plan, swaps=(dataclasses.replace(far, sync_out_consumers=("u",)),))
    waited = simulate(apply_swaps(graph, waiting).graph, PROFILE)
    # the premises: dropping the round trip alone puts s and u's output on the device together; waiting for s's
    # copy instead needs what the round trip needs, sooner
    assert dropped.peak_bytes > tripping.peak_bytes
    assert waited.peak_bytes == tripping.peak_bytes and waited.step_time_s < tripping.step_time_s

    pinned = {op.name for op in graph}
    assert round_trips(plan.swaps, tripping, pinned) == [(trip, ((far.tensor, "u"),))]
    assert round_trips(plan.swaps, tripping, pinned - {"u"}) == []  # a reader the order does not pin gets no wait
    assert round_trips(plan.swaps, tripping, pinned, frozenset({trip.tensor})) == []

    ev = _evaluator(analysis, tripping.peak_bytes)
    cand = ev.run("tflms-distance", {}, plan)
    assert cand.fits
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits
    assert pruned.params[ROUND_TRIP_PARAM] == 1 and PRUNED_PARAM not in pruned.params
    assert [(s.tensor.name, s.sync_out_consumers) for s in pruned.plan.swaps] == [("s:0", ("u",))]
    assert pruned.sim.step_time_s < cand.sim.step_time_s


def _idle_link_graph():
    """``mid`` and ``late`` (4 MiB each, made early) wait across ``big`` (12 MiB, the peak); ``mid`` is read
    again at ``e`` (after ``d24``), ``late`` by ``out`` at the end. Swapped in one level ahead, ``late``'s copy
    (about 0.34 ms) makes ``out`` wait, while the host-to-device link idles from the end of ``mid``'s copy
    (triggered at ``s``, right after the peak) to ``d39``."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=SHAPE)
    late = b.op("late", "Neg", [x], shape=SHAPE)
    mid = b.op("mid", "Relu", [x], shape=SHAPE)
    c = _chain(b, x, "c", "Sin")
    d = b.op("s", "Sum", [b.op("big", "Cos", [c], shape=(3072, 1024))], shape=SHAPE)
    d = b.op("e", "AddN", [mid, _chain(b, d, "d", "Exp", range(25))], shape=SHAPE)
    d = _chain(b, d, "d", "Exp", range(25, CHAIN))
    b.op("out", "AddN", [late, d], shape=SHAPE)
    return b.graph


def test_a_swap_in_is_triggered_where_the_link_went_idle_when_there_is_room():
    """``earlier_swap_ins(into_gaps=True)``: only ``late``'s copy follows an idle link; its new trigger is the
    first reader's ancestor at the level of the op that ended when ``mid``'s copy did, which the doubling of
    :func:`earlier_swap_ins` does not reach in one round. The copy then holds its bytes from there, past the peak
    only when the limit has room for it; the pruning pass keeps the move (it fits and ``out`` no longer waits)."""
    from tflms.tune.prune import EARLIER_PARAM
    analysis = analyze_graph(_idle_link_graph())
    levels = analysis.levels
    plan = SwapPlan(config=LMSConfig().with_rule_defaults(), accelerator_device="/device:GPU:0",
                    swaps=(_swap(analysis, "mid", "e", "s"), _swap(analysis, "late", "out", "d39")), skipped=())
    sim = simulate(apply_swaps(analysis.graph, plan).graph, PROFILE)
    ends = {r.name: r.end_s for r in sim.ops}
    copies = {r.name: r for r in sim.ops if r.stream == "h2d"}
    mid_copy = next(r for n, r in copies.items() if "mid" in n)
    late_copy = next(r for n, r in copies.items() if "late" in n)
    assert mid_copy.end_s < ends["d20"] < ends["d38"] <= late_copy.start_s  # the premise: the link idles between
    assert ends["out"] - late_copy.end_s < 0.05e-3 < late_copy.end_s - ends["d39"]  # and out waits for late

    (moved,) = earlier_swap_ins(analysis, plan.swaps, sim, sim.peak_bytes, into_gaps=True)
    (group,) = moved.swap_ins
    assert moved.tensor.name == "late:0" and group.consumers == ("out",)
    assert group.trigger.startswith("d") and levels[group.trigger] < levels["d39"]
    went_idle = mid_copy.end_s
    # the last of out's ancestors to end by the time the link went idle: the next one in the chain ends after
    k = int(group.trigger[1:])
    assert ends[group.trigger] <= went_idle < ends[f"d{k + 1}" if k != 24 else "e"]
    assert earlier_swap_ins(analysis, plan.swaps, sim, sim.peak_bytes, into_gaps=True) == [moved]  # deterministic
    doubled = {s.tensor.name: s.swap_ins[0].trigger for s in earlier_swap_ins(analysis, plan.swaps, sim,
                                                                                 sim.peak_bytes)}
    assert levels[doubled["late:0"]] > levels[group.trigger]

    # mid's copy followed the idle link too, idle from the step's start: nothing made after mid ended by then
    roomy = earlier_swap_ins(analysis, plan.swaps, sim, 2 * sim.peak_bytes, into_gaps=True)
    assert {s.tensor.name for s in roomy} == {"late:0"}

    ev = _evaluator(analysis, sim.peak_with_margin_bytes)
    cand = ev.run("tflms-distance", {}, plan)
    pruned = prune_swaps(ev, cand)
    assert pruned is not None and pruned.fits and pruned.params[EARLIER_PARAM] >= 1
    late = next(s for s in pruned.plan.swaps if s.tensor.name == "late:0")
    assert levels[late.swap_ins[0].trigger] <= levels[group.trigger]
    assert pruned.sim.step_time_s < cand.sim.step_time_s - 0.2e-3  # out no longer waits for the copy
    doubling_only = prune_swaps(_evaluator(analysis, sim.peak_with_margin_bytes), cand, gap_simulations=0)
    assert pruned.sim.step_time_s < doubling_only.sim.step_time_s  # the control: the doubling stops short (at e)
