"""Swap policies, each ``(analysis, config, context) -> SwapPlan`` (docs/design.md, "Layout").

The policy objects (:mod:`tflms.policies.base`) are what the tuner searches over;
the functions they wrap stay public: :func:`~tflms.policies.tflms_rules.plan_swaps`,
:func:`~tflms.policies.idle_time.plan_idle`, :func:`~tflms.policies.vdnn.plan_vdnn`.
"""

from tflms.policies.base import IdleTime, PlanContext, SwapPolicy, TflmsRules, Vdnn

__all__ = ["IdleTime", "PlanContext", "SwapPolicy", "TflmsRules", "Vdnn"]
