"""Where a tflms copy cuts its XLA segment (issue 47): a copy back's trigger cut and a swap-out's release cut.

The segment rule (:func:`tflms.ir.xla_segments.segment_rule`) ends a segment at each copy where it goes into the
order, and a ready copy goes first. Two cuts move from there, each to where what crosses it costs least in memory:
:func:`trigger_cuts` puts a copy back after the member of its trigger's fused chain where the fewest fused bytes
cross, and :func:`release_cuts` makes a swap-out's segment end after the nearby readers of its tensor, so that the
tensor can die once it is copied. docs/design.md, "Trigger cuts" and "Release cuts".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from tflms.ir.op_types import ALIAS_OPS, XLA_FUSIBLE
from tflms.ir.xla_gates import BARRIER

#: A node of the segment rule: an op name in the pass, an op id in the simulator.
Node = TypeVar("Node", bound=Hashable)


#: A copy back's trigger cut (:func:`trigger_cuts`) moves to the member at most this many graph positions after its
#: trigger where the fewest fused bytes cross. (BERT-base: a layer normalization's gradient spans about 100 positions,
#: its reduction near the start.)
DEFER_SPAN = 128


def trigger_cuts(where: Mapping[Node, tuple], preds: Mapping[Node, Sequence[Node]],
                 succs: Mapping[Node, Sequence[Node]], outside: Mapping[Node, str], boundary: set[Node],
                 triggered: Callable[[Node], bool], fused_bytes: Callable[[Node], int]) -> dict[Node, Node]:
    """For each copy back among ``boundary`` (``triggered``) whose trigger is a member: the member after which it
    goes into the order instead, where the cut it makes costs least.

    A boundary ends its segment where it goes into the order, and a ready one goes first: right after its trigger.
    A cluster allocates its outputs when it starts, so what crosses the cut that the copy back makes is held from the
    start of the trigger's cluster, and a trigger inside a fused chain (the reduction of a layer normalization's
    gradient, whose other branches read the same element-wise products after it) cuts the chain where its products
    are widest: BERT-base in mixed_bfloat16 at batch 5460 on h200-141gb (simulated), two 4 GiB swaps whose triggers
    cut layer 2's normalization gradient raised the 14-segment plan's peak from 146.9 to 170.0 GiB, its float32
    products live from the start of the backward pass's first cluster (docs/design.md, "Trigger cuts").

    The cost of a cut after member ``m``: the bytes of the outputs XLA fuses (``fused_bytes``, 0 for one it writes)
    of members placed before it and read by members after it, no reader outside (what a copy reads is written
    anyway). The cut goes after the cheapest member from the trigger on, within :data:`DEFER_SPAN` positions and
    before the copy's first reader, the earliest of equals, where it is cheaper than after the trigger: TensorFlow
    starts the copy when the trigger's cluster ends (a control edge from a member waits for its whole cluster), so
    the copy waits for the members before the cut, a few kernels."""
    copies = sorted((b for b in boundary if triggered(b)), key=where.__getitem__)
    if not copies:
        return {}
    at: dict[int, list[Node]] = {}
    for n, w in where.items():
        if n not in outside:
            at.setdefault(w[0], []).append(n)
    deferred: dict[Node, Node] = {}
    for b in copies:
        triggers = [p for p in preds[b] if p not in outside]
        if not triggers:
            continue
        trigger = max(triggers, key=where.__getitem__)
        limit = min((where[r] for r in members_after(b, succs, outside)), default=None)
        first = where[trigger][0]
        window = sorted((n for i in range(first - DEFER_SPAN, first + DEFER_SPAN + 1) for n in at.get(i, ())),
                        key=where.__getitem__)
        rank = {n: k for k, n in enumerate(window)}
        cross = [0] * (len(window) + 1)  # differences: what crosses a cut after window[k]
        for n in window:
            size = fused_bytes(n)
            if not size or any(s in outside for s in succs[n]):
                continue
            last = max((rank.get(s, len(window)) for s in succs[n]), default=rank[n])
            if last > rank[n]:
                cross[rank[n]] += size
                cross[last] -= size
        cost = list(itertools.accumulate(cross[:-1]))
        places = [m for m in window[rank[trigger]:] if limit is None or where[m] < limit]
        best = min(places, key=lambda m: (cost[rank[m]], where[m]), default=trigger)
        if cost[rank[best]] < cost[rank[trigger]]:
            deferred[b] = best
    return deferred


#: A swap-out's release cut (:func:`release_cuts`) waits for at most this many of its tensor's readers and the ops they
#: feed, none placed more than :data:`RELEASE_SPAN` graph positions after the tensor's producer: the readers near it
#: in the forward pass. (BERT-base: from an attention layer's softmax to the product that reads its dropout, 27
#: positions.)
RELEASE_OPS = 32
RELEASE_SPAN = 64


def release_through(op_type: str) -> bool:
    """Whether a swap-out's release cut (:func:`release_cuts`) waits on through an op of this type for its readers: one
    XLA fuses into its consumers (element-wise, data movement, views), whose output need not reach memory."""
    return (op_type in XLA_FUSIBLE or op_type in ALIAS_OPS) and op_type != BARRIER


def release_cuts(where: Mapping[Node, tuple], preds: Mapping[Node, Sequence[Node]],
                 succs: Mapping[Node, Sequence[Node]], outside: Mapping[Node, str], boundary: set[Node],
                 leaves: Callable[[Node], bool], through: Callable[[Node], bool]) -> dict[Node, frozenset[Node]]:
    """For each swap-out among ``boundary`` (``leaves``), the members its release cut waits for (the segment rule
    ends the segment the swap-out opens after the last of them): those that read its tensor's producer and, on
    through the ops XLA fuses (``through``), the ops they feed, up to the first whose output reaches memory (a
    product, a reduction); none a reader of the swap-out itself (a synchronous reader waits for the copy), none at
    or after the first reader of its copies back, at most :data:`RELEASE_OPS` of them within :data:`RELEASE_SPAN`
    positions of the producer.

    Why: a cluster holds its inputs until it ends (the executor keeps an op's inputs until it completes). A swap-out
    runs right after its producer and ends the producer's segment, so the tensor's other readers in the forward pass
    (dropout's scaling of an attention layer's probabilities) open the next segment, whose cluster holds the tensor as
    an input until it ends, at the next boundary, often deep in the backward pass: the copy to the host then frees
    nothing. Cut after them, where what crosses the cut is written anyway, and the tensor dies once its copy and
    their cluster are done, while the copy still starts right after its producer. BERT-base in mixed_bfloat16 at
    batch 1872 on h200-141gb (simulated), the relaxed recompute plan with layer 0's attention probabilities swapped
    instead of re-run: peak 149.2 GiB without the cut (the 11 GiB tensor live at the peak, 0.17 s after its copy
    ended), 137.7 GiB with it, at the same step time (docs/design.md, "Release cuts")."""
    releases: dict[Node, frozenset[Node]] = {}
    for b in boundary:  # (each swap-out's own walk, in a fixed order: the set's order does not matter)
        if not leaves(b):
            continue
        sources = [p for p in preds[b] if p not in outside]
        if not sources:
            continue
        held = members_after(b, succs, outside)  # its synchronous readers and its copies' readers
        limit = min((where[r] for r in held), default=None)
        start = min(where[p][0] for p in sources)
        seen = {*sources, b}
        stack = sorted({s for p in sources for s in succs[p]} - seen, key=where.__getitem__, reverse=True)
        waits: list[Node] = []
        while stack and len(waits) < RELEASE_OPS:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if (n in outside or n in held or (limit is not None and where[n] >= limit)
                    or where[n][0] - start > RELEASE_SPAN):
                continue
            waits.append(n)
            if through(n):
                stack.extend(sorted((s for s in succs[n] if s not in seen), key=where.__getitem__, reverse=True))
        if waits:
            releases[b] = frozenset(waits)
    return releases


def members_after(node: Node, succs: Mapping[Node, Sequence[Node]], outside: Mapping[Node, str]) -> set[Node]:
    """The members that ``node`` reaches through left-out nodes only: a swap-out's synchronous readers, and the readers
    of its copies back (through the simulator's host ops and TensorFlow's ``_Recv`` too)."""
    found: set[Node] = set()
    stack, seen = list(succs[node]), {node}
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in outside:
            stack.extend(succs[n])
        else:
            found.add(n)
    return found
