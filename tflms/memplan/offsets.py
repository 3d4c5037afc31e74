"""Static memory plans: one offset per tensor in a single pool.

A plan places every tensor at an ``offset`` in one pool so that two tensors
whose lifetimes overlap never share an address. The pool is then
``max(offset + size_bytes)``, and no plan can beat :func:`lower_bound` (the
largest live total at any step).

The heuristics are the offset-calculation strategies of Pisarchyk & Lee,
"Efficient Memory Management for Deep Neural Net Inference" (arXiv:2001.03288),
which TFLite's arena planner and GPU delegate use:

- :func:`greedy_by_size`: biggest tensors first; each goes into the smallest gap
  that fits among the already-placed tensors it conflicts with, else on top;
- :func:`greedy_by_breadth`: steps with the largest live total first; within a
  step its not-yet-placed tensors biggest first, best-fit as above;
- :func:`greedy_by_duration`: longest-lived tensors first (ties: biggest), best-fit;
  long-lived tensors form the "floor" the short ones pack around;
- :func:`first_fit`: allocation order (by first step); each goes into the lowest
  gap that fits, the way a naive online allocator without a free-list policy would.

:func:`best_plan` runs all of them and keeps the smallest pool (ties go to the
earlier strategy in :data:`STRATEGIES`), so its result is deterministic.
Every offset is a multiple of ``alignment``; all orders break ties by name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tflms.errors import ConfigError, TflmsError
from tflms.memplan.lifetimes import Lifetime, check_lifetimes, live_bytes_profile, lower_bound, num_steps_of

logger = logging.getLogger(__name__)

DEFAULT_ALIGNMENT_BYTES = 256
"""Offsets are multiples of this: CUDA's cudaMalloc guarantees 256-byte alignment and
TensorFlow's BFC allocator rounds every chunk to 256 bytes (``kMinAllocationSize``)."""


class InvalidPlanError(TflmsError):
    """A plan breaks an invariant: a missing, unaligned or out-of-pool offset, or two live tensors overlap."""


@dataclass(frozen=True)
class Plan:
    """Offsets of every tensor in one pool of ``pool_bytes`` bytes.

    ``pool_bytes`` is the highest ``offset + size_bytes`` (not padded to ``alignment``).
    ``lower_bound_bytes`` is :func:`tflms.memplan.lifetimes.lower_bound` of the same lifetimes.
    """

    strategy: str
    pool_bytes: int
    offsets: dict[str, int]
    lower_bound_bytes: int
    alignment: int = DEFAULT_ALIGNMENT_BYTES

    @property
    def fragmentation(self) -> float:
        """``pool_bytes / lower_bound_bytes - 1``: 0.0 is a perfect packing (also for an empty plan)."""
        if self.lower_bound_bytes == 0:
            return 0.0
        return self.pool_bytes / self.lower_bound_bytes - 1.0

    def to_json(self) -> str:
        """A deterministic JSON text of the plan (offsets sorted by tensor name)."""
        return json.dumps({
            "strategy": self.strategy,
            "pool_bytes": self.pool_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "fragmentation": round(self.fragmentation, 6),
            "alignment": self.alignment,
            "offsets": dict(sorted(self.offsets.items())),
        }, indent=2, sort_keys=False)


def _check_alignment(alignment: int) -> int:
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ConfigError(f"alignment must be a positive int number of bytes, got {alignment!r}; 256 is typical")
    return alignment


def _align_up(values: np.ndarray | int, alignment: int) -> np.ndarray | int:
    return (values + alignment - 1) // alignment * alignment


def _place(items: Sequence[Lifetime], order: Sequence[int], alignment: int,
           fit: Literal["best", "first"]) -> dict[str, int]:
    """Place ``items`` one by one in ``order``; return name -> offset.

    For each tensor, look at the placed tensors whose lifetimes overlap it, in
    address order. The candidate gaps are the spaces below each of them (above
    every lower one, aligned up). ``fit="best"`` takes the smallest gap that fits
    (lowest address on ties), ``fit="first"`` the lowest gap that fits; if none
    fits the tensor goes on top of them all. Zero-byte tensors take offset 0 and
    never conflict.
    """
    count = len(items)
    firsts = np.fromiter((item.first for item in items), dtype=np.int64, count=count)
    lasts = np.fromiter((item.last for item in items), dtype=np.int64, count=count)
    sizes = np.fromiter((item.size_bytes for item in items), dtype=np.int64, count=count)
    offsets = np.zeros(count, dtype=np.int64)
    placed = np.zeros(count, dtype=bool)
    for index in order:
        size = int(sizes[index])
        if size == 0:
            continue  # occupies no bytes: offset 0, conflicts with nothing
        conflicting = np.flatnonzero(placed & (firsts <= lasts[index]) & (lasts >= firsts[index]))
        offset = 0
        if conflicting.size:
            by_address = conflicting[np.argsort(offsets[conflicting], kind="stable")]
            starts = offsets[by_address]
            top_so_far = np.maximum.accumulate(starts + sizes[by_address])
            candidates = _align_up(np.concatenate(([0], top_so_far[:-1])), alignment)
            fits = np.flatnonzero(candidates + size <= starts)
            if fits.size == 0:
                offset = int(_align_up(int(top_so_far[-1]), alignment))
            elif fit == "first":
                offset = int(candidates[fits[0]])
            else:
                gaps = starts[fits] - candidates[fits]
                offset = int(candidates[fits[int(np.argmin(gaps))]])
        offsets[index] = offset
        placed[index] = True
    return {item.name: int(offsets[i]) for i, item in enumerate(items)}


def _make_plan(strategy: str, items: Sequence[Lifetime], offsets: dict[str, int], alignment: int) -> Plan:
    pool = max((offsets[item.name] + item.size_bytes for item in items if item.size_bytes), default=0)
    ordered = {item.name: offsets[item.name] for item in sorted(items, key=lambda x: x.name)}
    return Plan(strategy=strategy, pool_bytes=pool, offsets=ordered,
                lower_bound_bytes=lower_bound(items), alignment=alignment)


def greedy_by_size(lifetimes: Iterable[Lifetime], alignment: int = DEFAULT_ALIGNMENT_BYTES) -> Plan:
    """Biggest tensor first (ties by name), each into the best-fitting gap among its conflicts."""
    items = check_lifetimes(lifetimes)
    alignment = _check_alignment(alignment)
    order = sorted(range(len(items)), key=lambda i: (-items[i].size_bytes, items[i].name))
    return _make_plan("greedy_by_size", items, _place(items, order, alignment, "best"), alignment)


def first_fit(lifetimes: Iterable[Lifetime], alignment: int = DEFAULT_ALIGNMENT_BYTES) -> Plan:
    """Allocation order (first step, then name), each into the lowest gap that fits among its conflicts."""
    items = check_lifetimes(lifetimes)
    alignment = _check_alignment(alignment)
    order = sorted(range(len(items)), key=lambda i: (items[i].first, items[i].name))
    return _make_plan("first_fit", items, _place(items, order, alignment, "first"), alignment)


def greedy_by_breadth(lifetimes: Iterable[Lifetime], alignment: int = DEFAULT_ALIGNMENT_BYTES) -> Plan:
    """Steps by live total, largest first (ties: earlier step); per step its unplaced tensors biggest first.

    A tensor is placed when the first step of that step order in which it is
    alive comes up, so the order is (that step's rank, -size, name); each goes
    into the best-fitting gap among its conflicts.
    """
    items = check_lifetimes(lifetimes)
    alignment = _check_alignment(alignment)
    breadth = live_bytes_profile(items)
    step_order = sorted(range(num_steps_of(items)), key=lambda step: (-int(breadth[step]), step))
    rank = np.empty(len(step_order), dtype=np.int64)
    rank[np.asarray(step_order, dtype=np.int64)] = np.arange(len(step_order), dtype=np.int64)
    first_rank = [int(rank[item.first:item.last + 1].min()) for item in items]
    order = sorted(range(len(items)), key=lambda i: (first_rank[i], -items[i].size_bytes, items[i].name))
    return _make_plan("greedy_by_breadth", items, _place(items, order, alignment, "best"), alignment)


def greedy_by_duration(lifetimes: Iterable[Lifetime], alignment: int = DEFAULT_ALIGNMENT_BYTES) -> Plan:
    """Longest-lived tensor first (ties: biggest, then name), each into the best-fitting gap."""
    items = check_lifetimes(lifetimes)
    alignment = _check_alignment(alignment)
    order = sorted(range(len(items)), key=lambda i: (-items[i].num_steps, -items[i].size_bytes, items[i].name))
    return _make_plan("greedy_by_duration", items, _place(items, order, alignment, "best"), alignment)


STRATEGIES: Mapping[str, Callable[..., Plan]] = {
    "greedy_by_size": greedy_by_size,
    "greedy_by_breadth": greedy_by_breadth,
    "greedy_by_duration": greedy_by_duration,
    "first_fit": first_fit,
}
"""Every strategy by name, in the order :func:`best_plan` prefers them on ties."""


def best_plan(lifetimes: Iterable[Lifetime], alignment: int = DEFAULT_ALIGNMENT_BYTES,
              strategies: Sequence[str] | None = None) -> Plan:
    """Run ``strategies`` (default: all of :data:`STRATEGIES`) and return the plan with the smallest pool.

    Ties go to the strategy listed first, so the result is deterministic.
    """
    items = check_lifetimes(lifetimes)
    names = list(STRATEGIES) if strategies is None else list(strategies)
    if not names:
        raise ConfigError(f"best_plan needs at least one strategy; choose from {sorted(STRATEGIES)}")
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise ConfigError(f"unknown planning strategy {unknown[0]!r}; choose from {sorted(STRATEGIES)}")
    best: Plan | None = None
    for name in names:
        plan = STRATEGIES[name](items, alignment=alignment)
        logger.debug("strategy %s: pool %d bytes (lower bound %d)", name, plan.pool_bytes, plan.lower_bound_bytes)
        if best is None or plan.pool_bytes < best.pool_bytes:
            best = plan
    assert best is not None
    return best


def validate(plan: Plan, lifetimes: Iterable[Lifetime]) -> None:
    """Raise :class:`InvalidPlanError` unless ``plan`` is a correct placement of ``lifetimes``.

    Checked: the plan has an offset for exactly these tensors; every offset is a
    non-negative multiple of ``plan.alignment``; every tensor ends within
    ``plan.pool_bytes``; ``plan.lower_bound_bytes`` is the true lower bound and
    the pool is not below it; and no two tensors with overlapping lifetimes and
    non-zero sizes overlap in address space.
    """
    items = check_lifetimes(lifetimes)
    names = {item.name for item in items}
    missing = sorted(names - set(plan.offsets))
    if missing:
        raise InvalidPlanError(f"plan {plan.strategy!r} has no offset for tensor {missing[0]!r}")
    extra = sorted(set(plan.offsets) - names)
    if extra:
        raise InvalidPlanError(f"plan {plan.strategy!r} places tensor {extra[0]!r}, which has no lifetime")
    for item in items:
        offset = plan.offsets[item.name]
        if offset < 0 or offset % plan.alignment:
            raise InvalidPlanError(
                f"plan {plan.strategy!r}: tensor {item.name!r} has offset {offset}, "
                f"not a non-negative multiple of the alignment {plan.alignment}")
        if offset + item.size_bytes > plan.pool_bytes:
            raise InvalidPlanError(
                f"plan {plan.strategy!r}: tensor {item.name!r} ends at {offset + item.size_bytes}, "
                f"past the pool of {plan.pool_bytes} bytes")
    bound = lower_bound(items)
    if plan.lower_bound_bytes != bound:
        raise InvalidPlanError(
            f"plan {plan.strategy!r} records lower bound {plan.lower_bound_bytes}, but the lifetimes give {bound}")
    if plan.pool_bytes < bound:
        raise InvalidPlanError(
            f"plan {plan.strategy!r}: pool of {plan.pool_bytes} bytes is below the lower bound {bound}; "
            "some live tensors must overlap")
    # Sweep in order of first step: only tensors starting no later than i's last step can overlap i.
    sized = sorted((item for item in items if item.size_bytes), key=lambda x: (x.first, x.name))
    for i, a in enumerate(sized):
        a_start = plan.offsets[a.name]
        for b in sized[i + 1:]:
            if b.first > a.last:
                break
            b_start = plan.offsets[b.name]
            if a_start < b_start + b.size_bytes and b_start < a_start + a.size_bytes:
                raise InvalidPlanError(
                    f"plan {plan.strategy!r}: tensors {a.name!r} [{a_start}, {a_start + a.size_bytes}) and "
                    f"{b.name!r} [{b_start}, {b_start + b.size_bytes}) overlap in memory while both are alive "
                    f"at step {max(a.first, b.first)}")
