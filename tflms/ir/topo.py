"""Three graph walks the layers above share, for any graph of hashable nodes.

- :func:`priority_order`: Kahn's topological order with a priority among the ready nodes. The simulator's order from
  observed start times (:func:`tflms.sim.order.order_from_start_times`) and the XLA segment rule's order
  (:mod:`tflms.ir.xla_segments`) are this one loop with different priorities.
- :func:`connected_groups`: nodes in the groups some edges join (union-find): the XLA clusters of a segment and the
  recompute chains (:mod:`tflms.policies.recompute`).
- :func:`reachable`: the nodes some edges reach from a start (the cut bound's ancestors and descendants of its
  gradient op, :mod:`tflms.tune.cut_bound`; the ops after a peak, :mod:`tflms.tune.peakswap`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

Node = TypeVar("Node", bound=Hashable)


def priority_order(indegree: dict[Node, int], successors: Mapping[Node, Sequence[Node]],
                   priority: Callable[[Node], Any]) -> list[Node]:
    """Kahn's order: among the ready nodes, the one with the smallest ``priority`` runs first. ``priority(node)`` is
    asked once per node, when it becomes ready (all its predecessors ordered), and must be unique per node (end it
    with a position). ``indegree`` is consumed. Nodes on a cycle never become ready and are left out."""
    ready = [(priority(n), n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for succ in successors[node]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                heapq.heappush(ready, (priority(succ), succ))
    return order


def connected_groups(nodes: Sequence[Node], edges: Iterable[tuple[Node, Node]]) -> list[list[Node]]:
    """``nodes`` in the groups ``edges`` join (each edge's ends among ``nodes``), each group in ``nodes``' order, the
    groups in the order of their first node."""
    parent = {n: n for n in nodes}

    def root(n: Node) -> Node:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[rb] = ra
    groups: dict[Node, list[Node]] = {}
    for n in nodes:
        groups.setdefault(root(n), []).append(n)
    return list(groups.values())


def reachable(starts: Iterable[Node], neighbours: Mapping[Node, Sequence[Node]]) -> set[Node]:
    """``starts`` and every node reached from them along ``neighbours`` (successors: descendants; predecessors:
    ancestors)."""
    seen = set(starts)
    stack = list(seen)
    while stack:
        for n in neighbours[stack.pop()]:
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return seen
