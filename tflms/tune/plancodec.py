"""A tuned plan as JSON, and the rewritten graph rebuilt from it (:mod:`tflms.tune.plancache`'s entries).

:func:`encode_plan` and :func:`decode_plan` turn a :class:`~tflms.policies.swapplan.SwapPlan` into plain JSON and
back (no pickle); :func:`rebuild_graph` applies a plan to the pipeline's analysis with the passes a tune's winner
goes through (recomputes, the order edges it had before its swaps, swaps, compression), deterministically, so a
cache hit gives the graph a fresh tune gives.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tflms.analysis.cto import Analysis
from tflms.config import LMSConfig
from tflms.ir.graph import Graph, TensorRef
from tflms.policies.swapplan import Skip, SwapDecision, SwapInGroup, SwapPlan

logger = logging.getLogger("tflms.tune.plancache")


# ------------------------------------------------------------------------------------------------ plan <-> JSON

def _ref(ref: TensorRef) -> list:
    return [ref.op, ref.index]


def _unref(data: Sequence) -> TensorRef:
    op, index = data
    if not isinstance(op, str) or not isinstance(index, int):
        raise ValueError(f"not a tensor reference: {data!r}")
    return TensorRef(op, index)


def encode_plan(plan: SwapPlan) -> dict[str, Any]:
    """``plan`` as a JSON-ready mapping (:func:`decode_plan` reads it back equal)."""
    return {
        "config": plan.config.to_dict(),
        "accelerator_device": plan.accelerator_device,
        "swaps": [{"tensor": _ref(s.tensor), "dtype": s.dtype, "num_bytes": s.num_bytes,
                   "producer_level": s.producer_level, "swap_out": s.swap_out,
                   "sync_out_consumers": list(s.sync_out_consumers),
                   "swap_ins": [{"name": g.name, "consumers": list(g.consumers),
                                 "consumer_levels": list(g.consumer_levels), "trigger": g.trigger,
                                 "trigger_level": g.trigger_level, "sync": g.sync, "note": g.note}
                                for g in s.swap_ins]}
                  for s in plan.swaps],
        "skipped": [{"tensor": _ref(k.tensor), "reason": k.reason, "detail": k.detail} for k in plan.skipped],
        "warnings": list(plan.warnings),
        "recomputes": [{"ops": list(r.ops), "tensors": [_ref(t) for t in r.tensors],
                        "readers": [list(rs) for rs in r.readers], "num_bytes": r.num_bytes,
                        "sources": [_ref(t) for t in r.sources], "triggers": list(r.triggers),
                        "gates": [[gate, _ref(ref), trigger] for gate, ref, trigger in r.gates],
                        "inserted": list(r.inserted), "copy": r.copy}
                       for r in plan.recomputes],
    }


def decode_plan(data: dict[str, Any], plan_cache: bool | str | None = None) -> SwapPlan:
    """The :class:`SwapPlan` :func:`encode_plan` wrote, its config's ``plan_cache`` set to ``plan_cache``.

    Raises ``(KeyError, TypeError, ValueError)`` on anything malformed."""
    from tflms.policies.recompute import RecomputeDecision
    config = LMSConfig(**{**data["config"], "plan_cache": plan_cache})
    swaps = tuple(SwapDecision(
        tensor=_unref(s["tensor"]), dtype=s["dtype"], num_bytes=s["num_bytes"], producer_level=s["producer_level"],
        swap_out=s["swap_out"], sync_out_consumers=tuple(s["sync_out_consumers"]),
        swap_ins=tuple(SwapInGroup(name=g["name"], consumers=tuple(g["consumers"]),
                                   consumer_levels=tuple(g["consumer_levels"]), trigger=g["trigger"],
                                   trigger_level=g["trigger_level"], sync=g["sync"], note=g["note"])
                       for g in s["swap_ins"]))
        for s in data["swaps"])
    skipped = tuple(Skip(_unref(k["tensor"]), k["reason"], k["detail"]) for k in data["skipped"])
    recomputes = tuple(RecomputeDecision(
        ops=tuple(r["ops"]), tensors=tuple(_unref(t) for t in r["tensors"]),
        readers=tuple(tuple(rs) for rs in r["readers"]), num_bytes=r["num_bytes"],
        sources=tuple(_unref(t) for t in r["sources"]), triggers=tuple(r["triggers"]),
        gates=tuple((gate, _unref(ref), trigger) for gate, ref, trigger in r["gates"]),
        inserted=tuple(r["inserted"]), copy=r["copy"])
        for r in data["recomputes"])
    return SwapPlan(config=config, accelerator_device=data["accelerator_device"], swaps=swaps, skipped=skipped,
                    warnings=tuple(data["warnings"]), recomputes=recomputes)


# ------------------------------------------------------------------------------------------------ the rewritten graph

def rebuild_graph(analysis: Analysis, plan: SwapPlan | None, *, pre_swap_edges: Sequence[tuple[str, str]] = (),
                  copy_op: str, compress: Callable[[Graph, SwapPlan], Graph] | None = None) -> Graph:
    """The rewritten graph of ``plan``, as the tuner built it for its winner: the recomputes, then the order edges
    pinned before the swaps (an order-first winner's), then the swaps, then (``compress``) the compression."""
    from tflms.passes.swaps import apply_swaps
    graph = analysis.graph
    if plan is None:
        return graph
    if plan.recomputes:
        graph = apply_swaps(graph, dataclasses.replace(plan, swaps=()), copy_op=copy_op).graph
    if pre_swap_edges:
        from tflms.schedule.edges import add_order_edges
        graph = add_order_edges(graph, [tuple(e) for e in pre_swap_edges])
    if plan.swaps:
        graph = apply_swaps(graph, dataclasses.replace(plan, recomputes=()), copy_op=copy_op).graph
    if compress is not None:
        graph = compress(graph, plan)
    return graph


def _recomputed(analysis: Analysis, plan: SwapPlan, copy_op: str) -> Graph:
    from tflms.passes.swaps import apply_swaps
    if not plan.recomputes:
        return analysis.graph
    return apply_swaps(analysis.graph, dataclasses.replace(plan, swaps=()), copy_op=copy_op).graph


def edges_added(before: Graph, after: Graph) -> list[tuple[str, str]] | None:
    """The control edges between ops of ``before`` that ``after`` has and ``before`` has not, in an order that adds
    them to ``before`` as ``after`` has them: each op's control inputs, and each op's control consumers, in
    ``after``'s order. ``None`` when ``after`` lacks an op of ``before`` or no order gives both."""
    found: list[tuple[str, str]] = []
    for op in before:
        if op.name not in after:
            return None
        had = set(op.control_inputs)
        found.extend((src, op.name) for src in after.op(op.name).control_inputs if src in before and src not in had)
    index = {edge: k for k, edge in enumerate(found)}
    succ: dict[int, list[int]] = {k: [] for k in range(len(found))}
    indegree = [0] * len(found)
    chains = [[k for k, (_, a) in enumerate(found) if a == name] for name in dict.fromkeys(a for _, a in found)]
    chains += [[index[(b, c)] for c in after.control_consumers(b) if (b, c) in index]
               for b in dict.fromkeys(b for b, _ in found)]
    for chain in chains:
        for x, y in zip(chain, chain[1:]):
            succ[x].append(y)
            indegree[y] += 1
    ready = [k for k in range(len(found)) if indegree[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(found[k])
        for s in succ[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, s)
    return out if len(out) == len(found) else None


def _recipe(result: Any, copy_op: str, compress: Callable[[Graph, SwapPlan], Graph] | None
            ) -> tuple[list[tuple[str, str]], bool, str] | None:
    """How :func:`rebuild_graph` gives ``result.graph`` again: ``(pre-swap edges, compressed, its digest)``, or
    ``None`` when no way tried gives it exactly (then nothing is stored)."""
    from tflms.ir.fingerprint import graph_digest
    analysis, plan = result.analysis, result.best.plan
    target = graph_digest(result.graph)
    edges: list[tuple[str, str]] = []
    if plan is not None and (result.best.order or {}).get("before_swaps"):
        edges = edges_added(_recomputed(analysis, plan, copy_op), result.graph)
        if edges is None:
            return None
    for compressed in ((True, False) if compress is not None and plan is not None else (False,)):
        try:
            graph = rebuild_graph(analysis, plan, pre_swap_edges=edges, copy_op=copy_op,
                                  compress=compress if compressed else None)
        except Exception as err:  # noqa: BLE001 - a recipe that fails is not the recipe
            logger.debug("plan cache: rebuilding with compressed=%s failed: %s", compressed, err)
            continue
        if graph_digest(graph) == target:
            return edges, compressed, target
    return None
