"""Which tensors are worth recomputing: Capuchin's ranking, and the greedy choice that keeps chains local.

:func:`rank_candidates` ranks every forward op whose outputs the backward pass reads by bytes freed per second
of recompute (its chain from :func:`~tflms.policies.recompute_chains.chain_for`); :func:`select` takes ranked
candidates greedily while their chains stay local (no chain re-running what another reads as kept, at most
:data:`MAX_JOINED_OPS` ops joined). The tuner decides how many to take (:mod:`tflms.tune.recompute_sets`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tflms.analysis.cto import Analysis, Category
from tflms.ir.graph import TensorRef
from tflms.policies.recompute_chains import backward_readers, chain_for
from tflms.policies.swapplan import Skip

#: The most ops chains joined by :func:`select` may hold together (one trigger region of the backward pass).
MAX_JOINED_OPS = 32


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A forward op whose outputs the backward pass reads, the chain that rebuilds them, and what it is worth."""

    target: str
    chain: tuple[str, ...]
    freed_bytes: int
    cost_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.freed_bytes / self.cost_s if self.cost_s > 0 else float("inf")


def rank_candidates(analysis: Analysis, op_time: Callable[[str], float], *,
                    min_bytes: int = 0) -> tuple[list[Candidate], list[Skip]]:
    """Every forward op whose outputs a backward op reads, more than ``min_bytes`` of them, with the chain that
    rebuilds them (:func:`chain_for`), ranked by bytes freed per second of recompute (Capuchin's rule; ties by
    name). ``op_time(name)`` is an op's simulated time."""
    graph, cats = analysis.graph, analysis.categories
    out, skipped = [], []
    for name in analysis.order:
        if cats[name] is not Category.FORWARD:
            continue
        op = graph.op(name)
        freed = 0
        for index, info in enumerate(op.outputs):
            if backward_readers(analysis, TensorRef(name, index)):
                freed += info.num_bytes or 0
        if freed <= min_bytes:  # (min_bytes >= 0: nothing freed is never a candidate)
            continue
        chain, why = chain_for(analysis, name)
        if chain is None:
            skipped.append(Skip(TensorRef(name, 0), *why))
            continue
        out.append(Candidate(name, chain, freed, sum(op_time(n) for n in chain)))
    out.sort(key=lambda c: (-c.bytes_per_s, c.target))
    return out, skipped


def select(analysis: Analysis, ranked: Sequence[Candidate], *, max_joined: int = MAX_JOINED_OPS) -> set[str]:
    """The ops to re-run for ``ranked`` candidates taken greedily in order, keeping every chain local.

    A candidate is taken unless its target is recomputed already, or its chain would recompute a tensor an
    earlier chain reads as a kept source (that chain's clone would keep the original alive), or it joins
    chains (by reading a tensor they recompute) into more than ``max_joined`` ops. Without the last two rules
    the union of every chain is one region whose clones start at the first backward reader of any of them:
    the whole forward pass re-run at once, which saves nothing.
    """
    graph = analysis.graph
    chosen: set[str] = set()
    pinned: set[TensorRef] = set()  # tensors some clone reads as kept originals
    root: dict[str, str] = {}
    size: dict[str, int] = {}

    def find(x: str) -> str:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for cand in ranked:
        if cand.target in chosen:
            continue
        ops = set(cand.chain)
        if any(TensorRef(op, i) in pinned for op in ops for i, _ in enumerate(graph.op(op).outputs)):
            continue
        sources = {ref for op in ops for ref in graph.op(op).inputs if ref.op not in ops}
        joined = {find(op) for op in ops if op in chosen} | {find(ref.op) for ref in sources if ref.op in chosen}
        new = ops - chosen
        if len(new) + sum(size[g] for g in joined) > max_joined:
            continue
        for op in new:
            root[op], size[op] = op, 1
        roots = joined | new
        top = min(roots)
        size[top] = sum(size[r] for r in roots)
        for r in roots:
            root[r] = top
        chosen |= new
        pinned |= {ref for ref in sources if ref.op not in chosen}
    return chosen
