"""Tensor lifetimes over a schedule, and the facts every planner derives from them.

A :class:`Lifetime` says that a tensor of ``size_bytes`` is alive over the
schedule steps ``first..last`` inclusive. Two tensors *conflict* when their
step ranges intersect: they must then live at disjoint addresses.

From a set of lifetimes this module derives

- :func:`live_bytes_profile`: live bytes at each step;
- :func:`lower_bound`: the largest live total over all steps. No placement of
  the tensors in one address space can use fewer bytes, so it is the yardstick
  for both static plans (:mod:`tflms.memplan.offsets`) and allocator models
  (:mod:`tflms.memplan.allocators`);
- :func:`events`: the deterministic allocate/free sequence the allocator
  models replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tflms.errors import ConfigError

ALLOC: Literal["alloc"] = "alloc"
"""Event kind: the tensor is allocated at the start of ``Event.step``."""

FREE: Literal["free"] = "free"
"""Event kind: the tensor is freed at the start of ``Event.step`` (its last step was ``step - 1``)."""


class LifetimeError(ConfigError):
    """A lifetime is malformed, or a set of lifetimes repeats a tensor name."""


@dataclass(frozen=True)
class Lifetime:
    """A tensor of ``size_bytes`` bytes, alive over schedule steps ``first..last`` inclusive."""

    name: str
    size_bytes: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LifetimeError(f"a lifetime needs a non-empty tensor name, got {self.name!r}")
        for field_name in ("size_bytes", "first", "last"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise LifetimeError(
                    f"tensor {self.name!r}: {field_name} must be an int, got {type(value).__name__} {value!r}")
            object.__setattr__(self, field_name, int(value))
        if self.size_bytes < 0:
            raise LifetimeError(f"tensor {self.name!r}: size_bytes cannot be negative, got {self.size_bytes}")
        if self.first < 0:
            raise LifetimeError(f"tensor {self.name!r}: first step cannot be negative, got {self.first}")
        if self.last < self.first:
            raise LifetimeError(
                f"tensor {self.name!r}: last step {self.last} is before first step {self.first}; "
                "a tensor is alive over first..last inclusive, so use last >= first")

    @property
    def num_steps(self) -> int:
        """How many schedule steps the tensor is alive for."""
        return self.last - self.first + 1

    def overlaps(self, other: Lifetime) -> bool:
        """True if both tensors are alive at some common step (they then need disjoint addresses)."""
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Event:
    """One allocator call: allocate or free ``lifetime`` at the start of schedule ``step``."""

    step: int
    kind: Literal["alloc", "free"]
    lifetime: Lifetime

    @property
    def name(self) -> str:
        """The tensor's name."""
        return self.lifetime.name


def check_lifetimes(lifetimes: Iterable[Lifetime]) -> tuple[Lifetime, ...]:
    """Return ``lifetimes`` as a tuple, raising :class:`LifetimeError` on a repeated name or a non-Lifetime."""
    result = tuple(lifetimes)
    seen: set[str] = set()
    for item in result:
        if not isinstance(item, Lifetime):
            raise LifetimeError(f"expected Lifetime objects, got {type(item).__name__} {item!r}")
        if item.name in seen:
            raise LifetimeError(
                f"tensor {item.name!r} appears twice; every lifetime needs a unique name "
                "(give each version of a reused buffer its own name)")
        seen.add(item.name)
    return result


def num_steps_of(lifetimes: Iterable[Lifetime]) -> int:
    """Number of schedule steps the lifetimes span: ``max(last) + 1``, or 0 when there are none."""
    return max((item.last for item in lifetimes), default=-1) + 1


def live_bytes_profile(lifetimes: Iterable[Lifetime], num_steps: int | None = None) -> np.ndarray:
    """Return an int64 array whose entry ``s`` is the total size of the tensors alive at step ``s``.

    ``num_steps`` defaults to :func:`num_steps_of`; a larger value pads with zeros
    and a smaller one that would cut a lifetime off raises :class:`LifetimeError`.
    """
    items = check_lifetimes(lifetimes)
    needed = num_steps_of(items)
    if num_steps is None:
        num_steps = needed
    elif num_steps < needed:
        last_tensor = min(items, key=lambda item: (-item.last, item.name))
        raise LifetimeError(
            f"num_steps={num_steps} is too short: tensor {last_tensor.name!r} is alive until step "
            f"{last_tensor.last}; pass num_steps >= {needed} or leave it None")
    # Difference array: +size at first, -size after last; a prefix sum gives live bytes.
    delta = np.zeros(num_steps + 1, dtype=np.int64)
    if items:
        firsts = np.fromiter((item.first for item in items), dtype=np.int64, count=len(items))
        ends = np.fromiter((item.last + 1 for item in items), dtype=np.int64, count=len(items))
        sizes = np.fromiter((item.size_bytes for item in items), dtype=np.int64, count=len(items))
        np.add.at(delta, firsts, sizes)
        np.add.at(delta, ends, -sizes)
    return np.cumsum(delta[:num_steps])


def lower_bound(lifetimes: Iterable[Lifetime]) -> int:
    """Largest live total over all steps (0 for no tensors): no single pool can be smaller."""
    profile = live_bytes_profile(lifetimes)
    return int(profile.max()) if profile.size else 0


def events(lifetimes: Iterable[Lifetime]) -> tuple[Event, ...]:
    """Return the deterministic allocate/free sequence of the lifetimes.

    At each step ``s`` the tensors whose last step was ``s - 1`` are freed first,
    then the tensors whose first step is ``s`` are allocated; within each group
    the order is by name. Tensors still alive at the final step are freed at step
    ``num_steps_of(lifetimes)``, so every tensor has exactly one alloc and one
    free event.
    """
    items = check_lifetimes(lifetimes)
    frees_at: dict[int, list[Lifetime]] = {}
    allocs_at: dict[int, list[Lifetime]] = {}
    for item in items:
        allocs_at.setdefault(item.first, []).append(item)
        frees_at.setdefault(item.last + 1, []).append(item)
    result: list[Event] = []
    for step in sorted(set(frees_at) | set(allocs_at)):
        for item in sorted(frees_at.get(step, ()), key=lambda x: x.name):
            result.append(Event(step, FREE, item))
        for item in sorted(allocs_at.get(step, ()), key=lambda x: x.name):
            result.append(Event(step, ALLOC, item))
    return tuple(result)
