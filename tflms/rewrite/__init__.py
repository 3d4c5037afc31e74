"""Swap planning (pure, returns a plan) and applying a plan (returns a new graph + report)."""

from tflms.rewrite.api import RewriteResult, analyze, load_graph, rewrite
from tflms.rewrite.apply import apply_plan
from tflms.rewrite.plan import Skip, SwapDecision, SwapInGroup, SwapPlan, plan_swaps
from tflms.rewrite.report import RewriteReport

__all__ = ["RewriteResult", "RewriteReport", "Skip", "SwapDecision", "SwapInGroup", "SwapPlan", "analyze",
           "apply_plan", "load_graph", "plan_swaps", "rewrite"]
