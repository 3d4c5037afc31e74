"""Swap policies as objects with one signature: ``policy.plan(analysis, config, context) -> SwapPlan``.

Each policy is a frozen dataclass holding its own parameters, with a ``name``
(the tuner's strategy name) and a :meth:`~SwapPolicy.plan` that calls the
policy's public function, unchanged:

- :class:`TflmsRules` (``tflms-distance``): :func:`~tflms.policies.tflms_rules.plan_swaps`
  with the rule parameters it holds laid over ``config``;
- :class:`IdleTime` (``idle-time`` / ``idle-time-no-overhead``):
  :func:`~tflms.policies.idle_time.plan_idle` of the tensors it holds (chosen
  beforehand with :func:`~tflms.policies.idle_time.idle_candidates`);
- :class:`Vdnn` (``vdnn_conv`` / ``vdnn_all``): :func:`~tflms.policies.vdnn.plan_vdnn`.

:class:`PlanContext` carries what a policy may need beyond the graph and the
config: the accelerator device the plan is for, the hardware profile and the
simulation of the unrewritten step. The tuner (:mod:`tflms.tune.tuner`) builds
policy objects and judges every one through one entry, ``TuneEvaluator.evaluate``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from tflms.analysis.cto import Analysis
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.policies.idle_time import NO_OVERHEAD, STICK_TO_LIMIT, IdleCandidate, plan_idle
from tflms.policies.swapplan import SwapPlan
from tflms.policies.tflms_rules import plan_swaps
from tflms.policies.vdnn import VDNN_POLICIES, plan_vdnn
from tflms.profiles import HardwareProfile
from tflms.sim.simulator import SimResult

#: The TFLMS rule parameters :class:`TflmsRules` may set (the rest of the config is the caller's).
RULE_PARAMS = ("swapout_threshold", "swapin_ahead", "swapin_groupby", "sync_mode")
#: Strategy names of the idle-time modes.
IDLE_NAMES = {STICK_TO_LIMIT: "idle-time", NO_OVERHEAD: "idle-time-no-overhead"}


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """What a policy may need besides the analysis and the config.

    ``accelerator_device``: the device the plan's swap-ins return to;
    ``profile``: the hardware the plan is judged on; ``baseline``: the
    simulation of the step without swapping. Policies that do not need the
    last two ignore them.
    """

    accelerator_device: str
    profile: HardwareProfile | None = None
    baseline: SimResult | None = None


@runtime_checkable
class SwapPolicy(Protocol):
    """A swap policy: a name and a pure ``plan`` (same inputs, same plan)."""

    @property
    def name(self) -> str: ...

    def plan(self, analysis: Analysis, config: LMSConfig, context: PlanContext) -> SwapPlan: ...


@dataclasses.dataclass(frozen=True)
class TflmsRules:
    """TFLMS's rules (:func:`~tflms.policies.tflms_rules.plan_swaps`); parameters left ``None`` keep ``config``'s."""

    swapout_threshold: int | None = None
    swapin_ahead: int | None = None
    swapin_groupby: int | None = None
    sync_mode: int | None = None

    name = "tflms-distance"

    @property
    def params(self) -> dict[str, Any]:
        """The parameters set here, in :data:`RULE_PARAMS` order."""
        return {k: getattr(self, k) for k in RULE_PARAMS if getattr(self, k) is not None}

    def plan(self, analysis: Analysis, config: LMSConfig, context: PlanContext) -> SwapPlan:
        params = self.params
        return plan_swaps(analysis, config.replace(**params) if params else config,
                          accelerator_device=context.accelerator_device)


@dataclasses.dataclass(frozen=True)
class IdleTime:
    """Swaps ``tensors`` (idle-time candidates) in ``mode`` (:func:`~tflms.policies.idle_time.plan_idle`)."""

    mode: str = STICK_TO_LIMIT
    tensors: tuple[IdleCandidate, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in IDLE_NAMES:
            raise ConfigError(f"unknown idle-time mode {self.mode!r}; choose one of {sorted(IDLE_NAMES)}")
        object.__setattr__(self, "tensors", tuple(self.tensors))

    @property
    def name(self) -> str:
        return IDLE_NAMES[self.mode]

    def plan(self, analysis: Analysis, config: LMSConfig, context: PlanContext) -> SwapPlan:
        return plan_idle(analysis, self.tensors, config, context.accelerator_device, self.mode)


@dataclasses.dataclass(frozen=True)
class Vdnn:
    """vDNN's static offload policy ``policy`` (``vdnn_conv`` or ``vdnn_all``; :func:`~tflms.policies.vdnn.plan_vdnn`)."""

    policy: str
    sync_offload: bool = True

    def __post_init__(self) -> None:
        if self.policy not in VDNN_POLICIES:
            raise ConfigError(f"unknown vDNN policy {self.policy!r}; choose one of {list(VDNN_POLICIES)}")

    @property
    def name(self) -> str:
        return self.policy

    def plan(self, analysis: Analysis, config: LMSConfig, context: PlanContext) -> SwapPlan:
        return plan_vdnn(analysis, self.policy, config, accelerator_device=context.accelerator_device,
                         sync_offload=self.sync_offload)
