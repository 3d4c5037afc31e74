"""The swap policies as objects (tflms.policies.base): each plans exactly what the function it wraps plans,
and every candidate the tuner simulates names the policy object that made its plan."""

from __future__ import annotations

import pytest

from tflms.analysis.cto import analyze_graph
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.policies import IdleTime, PlanContext, SwapPolicy, TflmsRules, Vdnn
from tflms.policies.idle_time import NO_OVERHEAD, STICK_TO_LIMIT, idle_candidates, plan_idle
from tflms.policies.tflms_rules import plan_swaps
from tflms.policies.vdnn import VDNN_ALL, VDNN_CONV, plan_vdnn
from tflms.sim import get_profile, simulate
from tflms.testing import mlp_training_graph, serial_clock
from tflms.tune import STRATEGIES, tune

GPU = "/device:GPU:0"
PROFILE = serial_clock("v100-16gb-pcie3")  # the plans below were worked out on the serial clock


@pytest.fixture(scope="module")
def analysis():
    return analyze_graph(mlp_training_graph(8, batch=2048, width=512))


def test_each_policy_plans_what_its_function_plans(analysis):
    config = LMSConfig().with_rule_defaults()
    context = PlanContext(GPU)
    params = {"swapout_threshold": 2, "swapin_ahead": 2, "swapin_groupby": 4, "sync_mode": 1}
    rules = TflmsRules(**params)
    assert rules.name == "tflms-distance" and rules.params == params
    expected = plan_swaps(analysis, config.replace(**params), accelerator_device=GPU)
    assert expected.swaps and rules.plan(analysis, config, context) == expected
    assert TflmsRules().plan(analysis, config, context) == plan_swaps(analysis, config, accelerator_device=GPU)

    for policy, sync in ((VDNN_CONV, True), (VDNN_ALL, True), (VDNN_ALL, False)):
        vdnn = Vdnn(policy, sync)
        assert vdnn.name == policy
        assert vdnn.plan(analysis, config, context) == plan_vdnn(analysis, policy, config, accelerator_device=GPU,
                                                                 sync_offload=sync)

    profile = get_profile(PROFILE)
    chosen = idle_candidates(analysis, simulate(analysis.graph, profile), profile, config)[:3]
    assert chosen
    for mode, name in ((STICK_TO_LIMIT, "idle-time"), (NO_OVERHEAD, "idle-time-no-overhead")):
        idle = IdleTime(mode, tuple(chosen))
        assert idle.name == name
        plan = idle.plan(analysis, config, context)
        assert len(plan.swaps) == len(chosen)
        assert plan == plan_idle(analysis, chosen, config, GPU, mode)

    for policy in (rules, Vdnn(VDNN_ALL), IdleTime()):
        assert isinstance(policy, SwapPolicy)


def test_bad_policy_parameters_are_named():
    with pytest.raises(ConfigError, match="vdnn_some"):
        Vdnn("vdnn_some")
    with pytest.raises(ConfigError, match="fastest"):
        IdleTime("fastest")


def test_tuner_candidates_name_their_policy_objects(analysis):
    baseline = simulate(analysis.graph, PROFILE)
    result = tune(analysis, budget=int(baseline.peak_bytes * 0.8), profile=PROFILE,
                  strategies=STRATEGIES + (VDNN_CONV, VDNN_ALL))
    kinds = {"tflms-distance": TflmsRules, "idle-time": IdleTime, "idle-time-no-overhead": IdleTime,
             VDNN_CONV: Vdnn, VDNN_ALL: Vdnn}
    config = LMSConfig().with_rule_defaults()
    seen = set()
    for cand in result.candidates:
        if cand.strategy == "none":
            assert cand.policy is None and cand.plan is None
            continue
        assert isinstance(cand.policy, kinds[cand.strategy]) and cand.policy.name == cand.strategy
        # the candidate's plan is the policy's plan: the object is a full record of what was simulated
        assert cand.policy.plan(result.analysis, config, PlanContext(cand.plan.accelerator_device)) == cand.plan
        seen.add(cand.strategy)
    assert {"tflms-distance", "idle-time", VDNN_CONV, VDNN_ALL} <= seen
    assert all(c.params == c.policy.params for c in result.candidates if c.strategy == "tflms-distance")
