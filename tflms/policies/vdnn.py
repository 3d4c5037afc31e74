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
backward consumer) and :func:`~tflms.policies.swapplan.skip_reason` allows it (weights,
constants, the step's inputs are never swapped). Its forward consumers (and
consumers that only read its shape, :data:`METADATA_ONLY_TYPES`) keep the
resident tensor; all its other backward consumers share one swap-in (vDNN prefetches a
feature map once). The plans use the same :class:`~tflms.policies.swapplan.SwapDecision`
structure as TFLMS's, so ``apply_plan``, ``simulate`` and the compression pass
apply unchanged.

Prefetch trigger. The swap-in of layer ``i``'s input is triggered by the earliest
*backward op of the next layer* ``i+1`` (a backward op that reads one of layer
``i+1``'s inputs: its input gradient reading the weights, or the ``ReluGrad`` /
``MaxPoolGrad`` reading its feature map) that is an ancestor of the first backward
consumer: while layer ``i+1``'s gradients are computed, layer ``i``'s input comes
back. When there is no next layer or none
of its backward ops precedes the consumer, the TFLMS rule (an ancestor one level
before the consumer, :func:`~tflms.policies.swapplan.find_trigger`) applies and the
group's note says so.

Offload synchronization (``sync_offload``, vDNN's default): layer ``i+1``'s
compute-heavy op waits for the swap-out of layer ``i``'s input (a control edge),
so a feature map's memory is released before the next layer runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from tflms.analysis.cto import Analysis, Category
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import COMPUTE_HEAVY_TYPES, CONV_TYPES, IDENTITY_OPS, METADATA_ONLY_TYPES
from tflms.policies.swapplan import Skip, SwapDecision, SwapInGroup, SwapPlan, find_trigger, skip_reason, \
    swap_op_names

logger = logging.getLogger(__name__)

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
                    and consumer not in analysis.conditional
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
            reason = skip_reason(analysis, ref, config, accelerator_device)
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
