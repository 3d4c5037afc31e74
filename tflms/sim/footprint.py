"""The least device-plus-host memory any order and any swap rewrite of a step needs.

A swap rewrite moves bytes between the accelerator and the host; it does not make them
disappear. So besides the accelerator bound of :func:`tflms.sim.bounds.swap_only_bound`
(one op's working set must be on the device), a swap-only rewrite fits only if, at every
moment, what is live fits the accelerator *and the host together* (docs/design.md,
"Bounds", "Host capacity").

:func:`footprint_bound` gives an order-independent lower bound on that total. Under the
simulator's memory model (:func:`tflms.schedule.memory.buffer_model`), when op ``x`` runs
in *any* topological order, every buffer produced by ``x`` or one of its ancestors and
read by ``x`` or one of its descendants has been made and is still needed: it is live
somewhere, on the device or (swapped out) on the host. An element-wise op may write its
output into an input buffer it is the last reader of (``forward_out``); such a pair is
counted once whenever some order could make ``x`` that last reader (the input has no
reader among ``x``'s descendants). A function output (pinned) counts once its producer ran.

The maximum over ``x`` is found without scanning every op: in the model's level order
the live bytes while ``x`` runs are at least its cut (the cut's buffers are live in
every order), so ops are visited by decreasing level-order live bytes and the search
stops when that drops below the best cut found.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tflms.ir.graph import Graph


@dataclasses.dataclass(frozen=True)
class FootprintBound:
    """Device plus host bytes some moment of the step needs in every order (see :func:`footprint_bound`)."""

    resident_bytes: int  # on the accelerator all step
    cut_bytes: int  # transient buffers live while ``op`` runs, in every order
    op: str  # the op whose cut is largest
    ops_examined: int  # cuts computed (the rest were pruned by their level-order live bytes)

    @property
    def bound_bytes(self) -> int:
        return self.resident_bytes + self.cut_bytes

    def fits(self, device_bytes: int, host_bytes: int) -> bool:
        """Whether ``device_bytes`` of accelerator and ``host_bytes`` of host memory can hold that moment."""
        return self.bound_bytes <= device_bytes + host_bytes


def _level_order(model) -> list[int]:
    """A topological order of the needed ops by CTO level (longest path from a source), then graph position."""
    n = len(model)
    indeg = [len(p) for p in model.preds]
    level = [0] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for s in model.succs[i]:
            level[s] = max(level[s], level[i] + 1)
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != n:
        from tflms.errors import GraphError
        raise GraphError("the graph has a cycle: no execution order exists")
    return sorted(order, key=lambda i: (level[i], i))


def _level_live(model, order: list[int]) -> list[int]:
    """Transient device bytes live while each op runs in ``order`` (sequential model, forwarding ignored)."""
    pos = {i: k for k, i in enumerate(order)}
    n_pos = len(order)
    delta = [0] * (n_pos + 1)
    for i in order:
        if not model.needed[i]:
            continue
        for b in model.allocs[i]:
            start = pos[i]
            readers = [pos[r] for r in model.readers[b]]
            end = n_pos - 1 if model.pinned[b] else max(readers, default=start)
            delta[start] += model.size[b]
            delta[end + 1] -= model.size[b]
    live, out = 0, [0] * len(model)
    for k, i in enumerate(order):
        live += delta[k]
        out[i] = live
    return out


class Cuts:
    """Each op's cut (see the module doc) with its ancestors and descendants, on one buffer model.

    ``model``: :func:`tflms.schedule.memory.buffer_model` of the step without swaps. ``candidates`` lists
    the needed accelerator ops by decreasing transient bytes live while they run in level order
    (``level_live``), an upper bound on their cut.
    """

    def __init__(self, model) -> None:
        m = self.model = model
        n = len(m)
        order = _level_order(m)
        # Ancestor and descendant sets as bitsets (Python ints), each including the op itself.
        anc = [0] * n
        for i in order:
            a = 1 << i
            for p in m.preds[i]:
                a |= anc[p]
            anc[i] = a
        desc = [0] * n
        for i in reversed(order):
            d = 1 << i
            for s in m.succs[i]:
                d |= desc[s]
            desc[i] = d
        self._anc, self._desc, self._nbytes = anc, desc, (n + 7) // 8
        producer = np.full(len(m.size), -1, dtype=np.int64)
        for i in range(n):
            for b in m.allocs[i]:
                producer[b] = i
        self._producer = producer
        self._made = producer >= 0
        self._prod = np.where(self._made, producer, 0)
        self._size = np.asarray(m.size, dtype=np.int64)
        self._pinned = np.asarray(m.pinned, dtype=bool)
        self._needed = np.asarray(m.needed, dtype=bool)
        # readers of every buffer, flattened (CSR): "some reader is a descendant" is one reduceat per op
        counts = np.asarray([len(r) for r in m.readers], dtype=np.int64)
        self._flat = np.asarray([r for rs in m.readers for r in rs], dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts
        self._has_readers = counts > 0
        self.level_live = _level_live(m, order)
        self.candidates = sorted((i for i in range(n) if m.needed[i] and m.on_accelerator[i]),
                                 key=lambda i: (-self.level_live[i], m.names[i]))

    def _as_array(self, bits: int):
        return np.unpackbits(np.frombuffer(bits.to_bytes(self._nbytes, "little"), dtype=np.uint8),
                             bitorder="little")[:len(self.model)].astype(bool)

    def cut(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        """``(cut bytes of op i, its ancestors, its strict descendants)``, the sets as boolean arrays over
        the model's ops (the ancestors include ``i``)."""
        m = self.model
        a, d = self._as_array(self._anc[i]), self._as_array(self._desc[i])
        counted = self._made & a[self._prod] & (self._pinned | (self._producer == i) | self._read_by(d))
        cut = int(self._size[counted].sum())
        d[i] = False  # strict descendants
        out = m.forward_out[i]
        if out >= 0:
            for b in m.reads[i]:
                if (m.size[b] == m.size[out] and m.dtype[b] == m.dtype[out] and not m.pinned[b]
                        and not d[m.readers[b]].any()):
                    cut -= m.size[out]  # some order makes op i the input's last reader: it may write into it
                    break
        return cut, a, d

    def _read_by(self, ops: np.ndarray) -> np.ndarray:
        """By buffer: whether some reader of it is among ``ops`` (a boolean array over the model's ops)."""
        hit = np.zeros(len(self._size), dtype=bool)
        if len(self._flat):
            hits = np.add.reduceat(ops[self._flat].astype(np.int64), self._starts[self._has_readers])
            hit[self._has_readers] = hits > 0
        return hit

    def may_live(self, i: int) -> int:
        """Transient device bytes that may be live while op ``i`` runs in *some* execution, parallel ones
        included (see :func:`any_order_peak_bound`): buffers whose producer is not a strict descendant of
        ``i`` and that are pinned, made by ``i``, or read by some op that is not a strict ancestor of ``i``.
        Forwarding is ignored (it only shares buffers)."""
        a, d = self._as_array(self._anc[i]), self._as_array(self._desc[i])
        a[i] = d[i] = False  # strict ancestors and descendants
        made = self._made & self._needed[self._prod] & ~d[self._prod]
        counted = made & (self._pinned | (self._producer == i) | self._read_by(~a))
        return int(self._size[counted].sum())


@dataclasses.dataclass(frozen=True)
class AnyOrderPeak:
    """The most accelerator bytes a step can hold at once in any execution (see :func:`any_order_peak_bound`)."""

    resident_bytes: int
    transient_bytes: int  # the most transient bytes that may be live while ``op`` runs
    op: str

    @property
    def bound_bytes(self) -> int:
        return self.resident_bytes + self.transient_bytes


def any_order_peak_bound(graph: Graph, options=None) -> AnyOrderPeak:
    """An upper bound on the accelerator peak of ``graph`` in every order TensorFlow's executor may take.

    The executor runs any op whose inputs are ready, on several threads at once, so the order the
    simulator judged (level order, or a schedule) holds only where control edges pin it. Under the
    simulator's memory model a buffer is live from its producer's start until its last reader ends. At the
    peak some op ``x`` has just allocated (live bytes grow only then) and is running, and a buffer live then has
    a producer that started (so it is not a strict descendant of ``x``: those start after ``x`` ends)
    and a reader that has not ended (so not all its readers are strict ancestors of ``x``: those ended
    before ``x`` started), or it is pinned (a function output). The bytes of every such buffer, maximised
    over ``x``, bound every execution's live bytes, parallel ones included; each buffer alone is live
    with ``x`` in some sequential order, but not necessarily all of them together, so the bound may be
    above every order's real peak. Resident bytes (variables, arguments) are added. ``options``: the
    simulator's :class:`~tflms.sim.simulator.SimOptions` (host device, pruning). Linear bitset work per
    op: 0.3 s on the bench's ResNet-50 step, 1.7 s on BERT-base's (docs/design.md, "Holding the executor
    to the budget").
    """
    from tflms.schedule.memory import buffer_model
    cuts = Cuts(buffer_model(graph, options))
    m = cuts.model
    best, best_op = 0, ""
    for i in range(len(m)):
        if not m.needed[i] or not m.allocs[i]:  # live bytes grow only when an op allocates
            continue
        live = cuts.may_live(i)
        if live > best or (live == best and best_op and m.names[i] < best_op):
            best, best_op = live, m.names[i]
    return AnyOrderPeak(resident_bytes=m.resident_bytes, transient_bytes=best, op=best_op)


def footprint_bound(graph: Graph, options=None) -> FootprintBound:
    """Resident bytes plus the largest cut of any op (see the module doc): a lower bound, in every
    execution order, on the accelerator and host bytes a swap-only rewrite of ``graph`` holds at once.

    ``graph`` is the step without swaps; ``options`` the simulator's
    :class:`~tflms.sim.simulator.SimOptions`. Ops that do not run are left out.
    """
    from tflms.schedule.memory import buffer_model
    cuts = Cuts(buffer_model(graph, options))
    best, best_op, examined = 0, "", 0
    for i in cuts.candidates:
        if cuts.level_live[i] <= best:
            break
        examined += 1
        cut = cuts.cut(i)[0]
        name = cuts.model.names[i]
        if cut > best or (cut == best and best_op and name < best_op):
            best, best_op = cut, name
    return FootprintBound(resident_bytes=cuts.model.resident_bytes, cut_bytes=best, op=best_op,
                          ops_examined=examined)
