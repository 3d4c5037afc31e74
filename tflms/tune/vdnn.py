"""vDNN's offload policies as swap plans (Rhu et al., "vDNN", MICRO 2016, arXiv:1602.08124).

vDNN offloads each layer's *input feature map* to host memory during the forward
pass and prefetches it during the backward pass, one layer ahead. Here a layer is
a compute-heavy forward op (:data:`COMPUTE_HEAVY_TYPES`: convolutions and matrix
products) and its feature maps are its data inputs. The policies:

- ``vdnn_all``: offload the input of every layer;
- ``vdnn_conv``: only the inputs of convolutions (:data:`CONV_TYPES`);
- ``vdnn_dyn``: the first of *none*, ``vdnn_conv``, ``vdnn_all`` whose simulated
  peak fits the budget (vDNN picks at run time; we pick by simulation).

A feature map is offloaded when it is needed in the backward pass (it has a
backward consumer) and :func:`~tflms.rewrite.plan.skip_reason` allows it (weights,
constants, the step's inputs are never swapped). Its forward consumers (and
consumers that only read its shape, :data:`METADATA_ONLY_TYPES`) keep the
resident tensor; all its other backward consumers share one swap-in (vDNN prefetches a
feature map once). The plans use the same :class:`~tflms.rewrite.plan.SwapDecision`
structure as TFLMS's, so ``apply_plan``, ``simulate`` and the compression pass
apply unchanged.

Prefetch trigger. The swap-in of layer ``i``'s input is triggered by the earliest
*backward op of the next layer* ``i+1`` (a backward op that reads one of layer
``i+1``'s inputs: its input gradient reading the weights, or the ``ReluGrad`` /
``MaxPoolGrad`` reading its feature map) that is an ancestor of the first backward
consumer: while layer ``i+1``'s gradients are computed, layer ``i``'s input comes
back. When there is no next layer or none
of its backward ops precedes the consumer, the TFLMS rule (an ancestor one level
before the consumer, :func:`~tflms.rewrite.plan.find_trigger`) applies and the
group's note says so.

Offload synchronization (``sync_offload``, vDNN's default): layer ``i+1``'s
compute-heavy op waits for the swap-out of layer ``i``'s input (a control edge),
so a feature map's memory is released before the next layer runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, Category
from tflms.config import LMSConfig
from tflms.errors import BudgetError, ConfigError
from tflms.ir.graph import Graph, TensorRef
from tflms.rewrite.apply import DEFAULT_COPY_OP, apply_plan
from tflms.rewrite.plan import IDENTITY_OPS, Skip, SwapDecision, SwapInGroup, SwapPlan, find_trigger, skip_reason, \
    swap_op_names
from tflms.sim.profiles import HardwareProfile, get_profile
from tflms.sim.simulator import SimOptions, SimResult, simulate
from tflms.units import format_bytes, parse_bytes

logger = logging.getLogger(__name__)

#: Convolutions: the layers ``vdnn_conv`` offloads.
CONV_TYPES = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D", "_FusedConv3D",
                        "_FusedDepthwiseConv2dNative"})
#: Compute-heavy forward ops: vDNN's layers (``vdnn_all``), and the layers whose backward ops trigger prefetches.
COMPUTE_HEAVY_TYPES = CONV_TYPES | frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                                              "_FusedMatMul", "Einsum"})
#: Consumers that read only a tensor's shape: they keep the resident tensor (they run as soon as it exists),
#: so a ``ShapeN`` of the gradient code does not pull a feature map back at the start of the backward pass.
METADATA_ONLY_TYPES = frozenset({"Shape", "ShapeN", "Size", "Rank"})
#: Ops that never trigger a prefetch: identities (grappler may remove them) and shape reads (they run early).
_NOT_TRIGGERS = IDENTITY_OPS | METADATA_ONLY_TYPES
VDNN_NONE, VDNN_ALL, VDNN_CONV, VDNN_DYN = "none", "vdnn_all", "vdnn_conv", "vdnn_dyn"
#: Static policies, in the order vdnn_dyn tries them (after "none").
VDNN_POLICIES = (VDNN_CONV, VDNN_ALL)
VDNN_STRATEGIES = (VDNN_ALL, VDNN_CONV, VDNN_DYN)
_POLICY_TYPES = {VDNN_ALL: COMPUTE_HEAVY_TYPES, VDNN_CONV: CONV_TYPES}


@dataclasses.dataclass(frozen=True)
class VdnnLayer:
    """One compute-heavy forward op and the feature maps (data inputs) it reads."""

    op: str
    type: str
    level: int
    inputs: tuple[TensorRef, ...]


def vdnn_layers(analysis: Analysis, op_types: Iterable[str] = COMPUTE_HEAVY_TYPES) -> list[VdnnLayer]:
    """Forward ops of ``op_types`` in forward order (level, then name)."""
    wanted = frozenset(op_types)
    graph, levels, cats = analysis.graph, analysis.levels, analysis.categories
    layers = [VdnnLayer(op.name, op.type, levels[op.name], tuple(op.inputs)) for op in graph
              if op.type in wanted and cats[op.name] is Category.FORWARD]
    return sorted(layers, key=lambda layer: (layer.level, layer.op))


def _is_ancestor(analysis: Analysis, candidate: str, of: str) -> bool:
    """Whether ``candidate`` precedes ``of`` (a path of data/control edges), searching only levels above it."""
    graph, levels = analysis.graph, analysis.levels
    floor = levels[candidate]
    seen, frontier = {of}, [of]
    while frontier:
        nxt = []
        for name in frontier:
            for pred in graph.predecessors(name):
                if pred == candidate:
                    return True
                if pred not in seen and levels[pred] > floor:
                    seen.add(pred)
                    nxt.append(pred)
        frontier = nxt
    return False


def next_layer_trigger(analysis: Analysis, next_layer: VdnnLayer | None, first_consumer: str,
                       producer_level: int) -> str | None:
    """The earliest backward op of ``next_layer`` that precedes ``first_consumer`` (see the module doc)."""
    if next_layer is None:
        return None
    graph, levels, cats = analysis.graph, analysis.levels, analysis.categories
    found = set()
    for ref in next_layer.inputs:
        for consumer, _ in graph.consumers(ref):
            if (cats[consumer] is Category.BACKWARD and graph.op(consumer).type not in _NOT_TRIGGERS
                    and producer_level < levels[consumer] < levels[first_consumer]):
                found.add(consumer)
    for name in sorted(found, key=lambda n: (levels[n], n)):
        if _is_ancestor(analysis, name, first_consumer):
            return name
    return None


def plan_vdnn(analysis: Analysis, policy: str, config: LMSConfig | None = None, *, accelerator_device: str,
              sync_offload: bool = True) -> SwapPlan:
    """vDNN's swap plan for ``policy`` (``vdnn_all`` or ``vdnn_conv``); see the module doc.

    ``config`` supplies the filters, ``min_swap_bytes`` and devices (its TFLMS
    distance parameters are not used).
    """
    if policy not in _POLICY_TYPES:
        raise ConfigError(f"unknown vDNN policy {policy!r}; choose {sorted(_POLICY_TYPES)} (or vdnn_dyn via "
                          "choose_vdnn)")
    config = config or LMSConfig()
    graph, levels, cats = analysis.graph, analysis.levels, analysis.categories
    all_layers = vdnn_layers(analysis)
    position = {layer.op: i for i, layer in enumerate(all_layers)}
    offloaded = [layer for layer in all_layers if layer.type in _POLICY_TYPES[policy]]
    swaps: list[SwapDecision] = []
    skipped: list[Skip] = []
    planned: set[TensorRef] = set()
    for layer in offloaded:
        i = position[layer.op]
        next_layer = all_layers[i + 1] if i + 1 < len(all_layers) else None
        for ref in layer.inputs:
            if ref in planned:
                continue
            planned.add(ref)
            reason = skip_reason(analysis, ref, config)
            if reason is not None:
                skipped.append(Skip(ref, *reason))
                continue
            if cats[ref.op] is not Category.FORWARD:
                skipped.append(Skip(ref, "not-forward", f"produced by a {cats[ref.op]} op"))
                continue
            consumers = sorted({c for c, _ in graph.consumers(ref)}, key=lambda n: (levels[n], n))
            far = tuple(c for c in consumers if cats[c] is Category.BACKWARD
                        and graph.op(c).type not in METADATA_ONLY_TYPES)
            if not far:
                skipped.append(Skip(ref, "not-needed-in-backward", "no backward op reads it: nothing to offload"))
                continue
            near = tuple(c for c in consumers if c not in far)
            p_level = levels[ref.op]
            trigger = next_layer_trigger(analysis, next_layer, far[0], p_level)
            note = ""
            if trigger is None:
                trigger = find_trigger(analysis, far[0], p_level, levels[far[0]] - 1)
                note = ("no backward op of the next layer precedes the first consumer: triggered one level "
                        "before it (TFLMS rule)" if next_layer is not None else
                        "last layer: triggered one level before its first backward consumer (TFLMS rule)")
                if trigger is None:
                    note = "no op precedes the first consumer: the swap-in starts when the swap-out ends"
            out_name, in_base = swap_op_names(ref)
            group = SwapInGroup(name=f"{in_base}_0", consumers=far, consumer_levels=tuple(levels[c] for c in far),
                                trigger=trigger, trigger_level=None if trigger is None else levels[trigger],
                                sync=trigger is None, note=note)
            sync_out = ()
            if sync_offload and next_layer is not None and next_layer.op not in far and next_layer.op not in near:
                sync_out = (next_layer.op,)
            info = graph.tensor(ref)
            swaps.append(SwapDecision(tensor=ref, dtype=info.dtype, num_bytes=info.num_bytes, producer_level=p_level,
                                      swap_out=out_name, sync_out_consumers=sync_out, swap_ins=(group,)))
    warnings = () if offloaded else (f"{policy}: no forward op of types {sorted(_POLICY_TYPES[policy])} in the graph",)
    return SwapPlan(config=config, accelerator_device=accelerator_device, swaps=tuple(swaps), skipped=tuple(skipped),
                    warnings=warnings)


@dataclasses.dataclass(frozen=True)
class VdnnCandidate:
    policy: str
    plan: SwapPlan | None
    sim: SimResult
    fits: bool


@dataclasses.dataclass(frozen=True)
class VdnnChoice:
    """``vdnn_dyn``'s answer: the first policy that fits, everything it simulated, and the rewritten graph."""

    budget_bytes: int
    profile: str
    chosen: VdnnCandidate
    candidates: tuple[VdnnCandidate, ...]
    graph: Graph

    @property
    def policy(self) -> str:
        return self.chosen.policy

    def table(self) -> str:
        lines = [f"vdnn_dyn on {self.profile}, budget {format_bytes(self.budget_bytes)}: chose {self.policy}",
                 f"{'policy':<12}{'swaps':>7}{'swapped':>12}{'peak':>12}{'step ms':>10}  fits"]
        for c in self.candidates:
            n = 0 if c.plan is None else len(c.plan.swaps)
            swapped = 0 if c.plan is None else c.plan.swapped_bytes
            lines.append(f"{c.policy:<12}{n:>7}{format_bytes(swapped):>12}"
                         f"{format_bytes(c.sim.peak_with_margin_bytes):>12}{c.sim.step_time_s * 1e3:>10.3f}  "
                         f"{'yes' if c.fits else 'no'}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "profile": self.profile, "policy": self.policy,
                "candidates": [{"policy": c.policy, "swaps": 0 if c.plan is None else len(c.plan.swaps),
                                "swapped_bytes": 0 if c.plan is None else c.plan.swapped_bytes,
                                "peak_bytes": c.sim.peak_with_margin_bytes, "step_time_s": c.sim.step_time_s,
                                "fits": c.fits} for c in self.candidates]}


def choose_vdnn(analysis: Analysis, profile: str | HardwareProfile, budget: int | str | None = None,
                config: LMSConfig | None = None, *, accelerator_device: str = "/device:GPU:0",
                sim_options: SimOptions | None = None, copy_op: str = DEFAULT_COPY_OP,
                sync_offload: bool = True) -> VdnnChoice:
    """``vdnn_dyn``: the first of none / ``vdnn_conv`` / ``vdnn_all`` whose simulated peak fits ``budget``.

    ``budget`` defaults to the profile's memory. Raises :class:`BudgetError`
    naming the smallest peak reached when none fits.
    """
    profile = get_profile(profile)
    budget_bytes = profile.memory_bytes if budget is None else parse_bytes(budget, what="budget")
    config = config or LMSConfig()
    options = sim_options or SimOptions(host_device=config.host_device)
    candidates = []
    for policy in (VDNN_NONE,) + VDNN_POLICIES:
        plan = None if policy == VDNN_NONE else plan_vdnn(analysis, policy, config,
                                                           accelerator_device=accelerator_device,
                                                           sync_offload=sync_offload)
        graph = analysis.graph if plan is None else apply_plan(analysis.graph, plan, copy_op=copy_op)
        sim = simulate(graph, profile, options=options)
        cand = VdnnCandidate(policy, plan, sim, sim.peak_with_margin_bytes <= budget_bytes)
        candidates.append(cand)
        if cand.fits:
            return VdnnChoice(budget_bytes, profile.name, cand, tuple(candidates), graph)
    best = min(candidates, key=lambda c: c.sim.peak_with_margin_bytes)
    raise BudgetError(f"vdnn_dyn: nothing fits {format_bytes(budget_bytes)} on {profile.name}; the smallest peak is "
                      f"{format_bytes(best.sim.peak_with_margin_bytes)} with {best.policy}: give a budget of at least "
                      "that, a smaller batch, or try the tflms-distance strategy")


def search_vdnn(ev: Any, sync_offload: bool = True, policies: Sequence[str] = VDNN_POLICIES) -> None:
    """Tuner hook: evaluate ``policies`` (default ``vdnn_conv`` and ``vdnn_all``) with the tuner's evaluator.

    The tuner then keeps the fastest fitting candidate, as for its other
    strategies (``vdnn_dyn``'s first-fit order is :func:`choose_vdnn`).
    """
    for policy in policies:
        plan = plan_vdnn(ev.analysis, policy, ev.base_config, accelerator_device=ev.accelerator,
                         sync_offload=sync_offload)
        ev.run(policy, {"sync_offload": sync_offload}, plan)
