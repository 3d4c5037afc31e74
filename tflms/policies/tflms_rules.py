"""Swap planning with the TFLMS rules (Le et al., ISMM 2019): pure, returns a :class:`SwapPlan`.

For every forward tensor that may be swapped, the consumers whose level distance
exceeds ``swapout_threshold`` read it back from host memory. Those consumers are
grouped (``swapin_groupby``), and each group's swap-in is triggered by a control
edge from an ancestor of the group's first consumer about ``swapin_ahead`` levels
before it. Because the trigger's level is below every consumer's level and above
the producer's, the new edges can never close a cycle.
"""

from __future__ import annotations

from tflms.analysis.cto import Analysis, Category
from tflms.config import LMSConfig
from tflms.ir.graph import Op, TensorRef
from tflms.policies.swapplan import (Skip, SwapDecision, SwapInGroup, SwapPlan, check_filters, find_trigger,
                                     group_consumers, skip_reason, swap_op_names)


def plan_swaps(analysis: Analysis, config: LMSConfig, *, accelerator_device: str) -> SwapPlan:
    """Decide which tensors to swap and where to trigger their swap-ins (rule parameters not given: RULE_DEFAULTS)."""
    config = config.with_rule_defaults()
    warnings = check_filters(analysis, config)
    levels = analysis.levels
    swaps: list[SwapDecision] = []
    skipped: list[Skip] = []
    for ref, op, consumers in _forward_tensors(analysis):
        name, index = ref.op, ref.index
        p_level = levels[name]
        if not consumers or levels[consumers[-1]] - p_level <= config.swapout_threshold:
            continue
        far = [c for c in consumers if levels[c] - p_level > config.swapout_threshold]
        reason = skip_reason(analysis, ref, config, accelerator_device)
        if reason is not None:
            skipped.append(Skip(ref, *reason))
            continue
        near = tuple(c for c in consumers if c not in far)
        out_name, in_base = swap_op_names(ref)
        groups = []
        for gi, members in enumerate(group_consumers(far, levels, config.swapin_groupby)):
            first = members[0]
            ahead = 1 if config.sync_swap_in else config.swapin_ahead
            trigger = find_trigger(analysis, first, p_level, levels[first] - ahead)
            note = ""
            if trigger is None:
                note = (f"no op between the producer (level {p_level}) and {first!r} (level {levels[first]}) "
                        "precedes it: the swap-in starts when the swap-out ends (synchronous fallback)")
            groups.append(SwapInGroup(
                name=f"{in_base}_{gi}", consumers=tuple(members),
                consumer_levels=tuple(levels[m] for m in members), trigger=trigger,
                trigger_level=None if trigger is None else levels[trigger],
                sync=config.sync_swap_in or trigger is None, note=note))
        swaps.append(SwapDecision(
            tensor=ref, dtype=op.outputs[index].dtype, num_bytes=op.outputs[index].num_bytes,
            producer_level=p_level, swap_out=out_name,
            sync_out_consumers=near if config.sync_swap_out else (), swap_ins=tuple(groups)))
    return SwapPlan(config=config, accelerator_device=accelerator_device, swaps=tuple(swaps),
                    skipped=tuple(skipped), warnings=tuple(warnings))


def _forward_tensors(analysis: Analysis) -> list[tuple[TensorRef, Op, list[str]]]:
    """Every output of a forward op (in analysis order) with its consumers sorted by ``(level, name)``.

    Derived once per analysis and kept with it (in its ``__dict__``, as :func:`functools.cached_property`
    does): the tuner plans with the rules dozens of times on one analysis.
    """
    found = analysis.__dict__.get("_forward_tensors")
    if found is None:
        graph, levels = analysis.graph, analysis.levels
        found = []
        for name in analysis.order:
            if analysis.categories[name] is not Category.FORWARD:
                continue
            op = graph.op(name)
            for index in range(len(op.outputs)):
                ref = TensorRef(name, index)
                found.append((ref, op, sorted({c for c, _ in graph.consumers(ref)}, key=lambda n: (levels[n], n))))
        analysis.__dict__["_forward_tensors"] = found
    return found
