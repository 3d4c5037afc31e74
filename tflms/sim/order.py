"""Execution orders for the simulator: by CTO level, from observed start times, a given order checked.

The model is in the module doc of :mod:`tflms.sim.simulator`.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from tflms.analysis.cto import compute_levels
from tflms.errors import GraphError
from tflms.ir.graph import Graph
from tflms.ir.topo import priority_order
from tflms.sim.indexed import IndexedGraph, positions


def level_order(graph: Graph) -> list[str]:
    """Ops sorted by CTO level, ties by graph order."""
    levels = compute_levels(graph)
    position = {op.name: i for i, op in enumerate(graph)}
    return sorted(levels, key=lambda n: (levels[n], position[n]))


def order_from_start_times(graph: Graph, start_times: Mapping[str, float]) -> list[str]:
    """An execution order of ``graph`` that follows observed start times.

    ``start_times`` maps op names to when they started (e.g. the executor's
    ``ExecutorMeasurement.node_times``); names not in the graph are ignored. The
    result is a topological order: among ready ops the earliest observed start runs
    first; an op that was not observed (a fed placeholder, a runtime-only node) runs
    as soon as its inputs are ready, ties by graph order. A correct observation of a
    run respects every edge, so the result is then exactly the observed order.
    """
    position = {op.name: i for i, op in enumerate(graph)}
    indegree = {op.name: len(graph.predecessors(op.name)) for op in graph}
    successors: dict[str, list[str]] = {name: [] for name in indegree}
    for name in indegree:
        for pred in graph.predecessors(name):
            successors[pred].append(name)
    key: dict[str, float] = {}

    def priority(name: str) -> tuple[float, int]:
        # an op that was not observed runs as soon as its inputs are ready: it inherits its latest predecessor's key
        key[name] = start_times.get(name, max((key[p] for p in graph.predecessors(name)), default=float("-inf")))
        return key[name], position[name]
    order = priority_order(indegree, successors, priority)
    if len(order) != len(graph):
        raise GraphError("the graph has a cycle; no execution order exists")
    return order


def _level_sorted(net: IndexedGraph, alive: Sequence[bool]) -> list[int]:
    """Alive ops by CTO level (longest path from a source), ties by graph order (op id)."""
    n = len(net.names)
    preds = net.preds
    indegree = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    ready = []
    for i in range(n):
        if not alive[i]:
            continue
        p = preds[i]
        indegree[i] = len(p)
        for q in p:
            succs[q].append(i)
        if not p:
            ready.append(i)
    level = [0] * n
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        li = level[i] + 1
        for j in succs[i]:
            if level[j] < li:
                level[j] = li
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    count = sum(1 for a in alive if a)
    if seen != count:
        stuck = sorted(net.names[i] for i in range(n) if alive[i] and indegree[i] > 0)
        raise GraphError(f"the graph has a cycle through {len(stuck)} ops, e.g. {stuck[:5]}; "
                         "TF1 loops (NextIteration) are not supported: use TF2 control flow (tf.while_loop "
                         "inside tf.function)")
    order = [i for i in range(n) if alive[i]]
    order.sort(key=level.__getitem__)  # stable: ties keep graph order
    return order


def _order_ids(net: IndexedGraph, names: Sequence[str], alive: Sequence[bool], recvs: Sequence[int],
               recv_needs: Mapping[int, Sequence[tuple[int, int]]]) -> list[int]:
    """A given order (names; unknown and pruned names dropped) with each recv just before its first consumer."""
    recv_set = set(recvs)
    op_id = {net.names[i]: i for i in range(len(net.names)) if alive[i] and i not in recv_set}
    order = [op_id[n] for n in names if n in op_id]
    if recvs:
        pos = {op: k for k, op in enumerate(order)}
        before: dict[int, list[int]] = {}
        for r in recvs:  # recvs are in tensor-name order, as they were added
            t = net.inputs[r][0]
            consumers = [c for c, _ in recv_needs[t]]
            if any(c not in pos for c in consumers):
                continue  # a consumer missing from the order: reported by the completeness check
            first = min(pos[c] for c in consumers)
            before.setdefault(first, []).append(r)
        out = []
        for k, op in enumerate(order):
            out.extend(before.get(k, ()))
            out.append(op)
        order = out
    return order


def _check_order(net: IndexedGraph, order: Sequence[int], alive: Sequence[bool]) -> list[int]:
    """``position`` of every op in ``order``; raises if the order is incomplete or runs an op before its input."""
    n = len(net.names)
    position = positions(order, n)
    count = sum(1 for a in alive if a)
    if len(order) != count or any(alive[i] and position[i] < 0 for i in range(n)):
        missing = sorted(net.names[i] for i in range(n) if alive[i] and position[i] < 0)[:5]
        raise GraphError(f"the execution order must list every op exactly once; missing e.g. {missing}")
    preds, names = net.preds, net.names
    for k, i in enumerate(order):
        for p in preds[i]:
            if position[p] > k:
                raise GraphError(f"the execution order runs {names[i]!r} before its input {names[p]!r}")
    return position


def _observed_order(net: IndexedGraph, alive: Sequence[bool], start_times: Mapping[str, float]) -> list[str]:
    """:func:`order_from_start_times` over the alive ops of ``net`` (names out)."""
    n = len(net.names)
    preds, names = net.preds, net.names
    indegree = [len(preds[i]) if alive[i] else 0 for i in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        if alive[i]:
            for p in preds[i]:
                succs[p].append(i)
    key = [0.0] * n
    ready = []
    for i in range(n):
        if alive[i] and indegree[i] == 0:
            key[i] = start_times.get(names[i], float("-inf"))
            heapq.heappush(ready, (key[i], i))
    order: list[str] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(names[i])
        for j in succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                inherited = max(key[p] for p in preds[j])
                key[j] = start_times.get(names[j], inherited)
                heapq.heappush(ready, (key[j], j))
    if len(order) != sum(1 for a in alive if a):
        raise GraphError("the graph has a cycle; no execution order exists")
    return order
