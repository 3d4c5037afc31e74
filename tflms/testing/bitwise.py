"""Byte-level comparison of training state: weights, optimizer variables, losses.

"Bitwise identical" means the same bytes (``ndarray.tobytes()``), dtype and
shape. ``np.array_equal`` is not that: it says ``-0.0 == 0.0`` and that a NaN
differs from itself. A :class:`Snapshot` is an ordered list of named arrays;
two snapshots are matched by position (two runs build separate models, whose
Keras names may differ) and reported under the reference's names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: a training state: ``(name, value)`` pairs in a fixed order.
Snapshot = list[tuple[str, np.ndarray]]

#: how many differing entries an assertion message lists.
MAX_LISTED = 25


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", None) or type(variable).__name__


def snapshot(model: Any = None, optimizer: Any = None, *, variables: Iterable[Any] = (),
             losses: Sequence[Any] = ()) -> Snapshot:
    """Copies of every value that training changes, each with a readable name.

    ``model``: its ``weights`` (trainable and not: BatchNorm statistics too).
    ``optimizer``: its ``variables`` (iterations, learning rate, slots); when
    ``None`` and the model is compiled, ``model.optimizer``. ``variables``:
    more variables (e.g. plain ``tf.Variable`` s). ``losses``: per-step losses,
    named ``loss[step i]``.
    """
    state: Snapshot = [(f"loss[step {i}]", np.array(loss)) for i, loss in enumerate(losses)]
    tracked: list[Any] = []
    if model is not None:
        tracked += list(model.weights)
        if optimizer is None:
            optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        tracked += list(optimizer.variables)
    tracked += list(variables)
    for v in tracked:
        state.append((_name(v), np.array(v.numpy() if hasattr(v, "numpy") else v)))
    return state


@dataclasses.dataclass(frozen=True)
class Difference:
    """One entry of two snapshots that is not bitwise equal."""

    name: str
    reason: str  # "value", "dtype/shape" or "missing"
    max_abs_diff: float = float("nan")  # over the elements (NaN when not comparable)
    num_differing: int = 0
    size: int = 0
    detail: str = ""

    def __str__(self) -> str:
        if self.reason != "value":
            return f"{self.name}: {self.detail}"
        return (f"{self.name}: max |diff| = {self.max_abs_diff:.6g} ({self.num_differing} of {self.size} elements "
                f"differ{self.detail})")


def _as_snapshot(value: Any) -> Snapshot:
    if isinstance(value, list) and all(isinstance(e, tuple) and len(e) == 2 for e in value):
        return value
    if hasattr(value, "weights"):  # a Keras model (its compiled optimizer included)
        return snapshot(value)
    raise TypeError(f"expected a Snapshot (list of (name, array)) or a Keras model, got {type(value).__name__}")


def differences(reference: Any, candidate: Any) -> list[Difference]:
    """Every entry of ``candidate`` whose bytes differ from ``reference``'s, in order.

    Both are :class:`Snapshot` s (or Keras models, snapshotted with their
    optimizer).
    """
    ref, cand = _as_snapshot(reference), _as_snapshot(candidate)
    found: list[Difference] = []
    if len(ref) != len(cand):
        names = lambda s: [n for n, _ in s]  # noqa: E731
        found.append(Difference("<entries>", "missing", detail=f"{len(ref)} vs {len(cand)} entries "
                                f"({names(ref)[:8]}... vs {names(cand)[:8]}...)"))
    for (name, a), (_, b) in zip(ref, cand):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            found.append(Difference(name, "dtype/shape",
                                    detail=f"dtype/shape {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"))
            continue
        if a.tobytes() == b.tobytes():
            continue
        worst, where, extra = float("nan"), (), ""
        numeric = a.dtype.kind in "fiubc"
        if numeric and a.size:
            delta = np.abs(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
                           - b.astype(np.complex128 if b.dtype.kind == "c" else np.float64))
            if not np.isnan(delta).all():
                flat = int(np.nanargmax(delta))
                where = tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.shape else ()
                worst = float(delta.reshape(-1)[flat])
            if worst == 0.0:
                extra = "; equal as numbers: signed zeros or NaN payloads"
            elif where:
                extra = f"; largest at index {where}"
        if numeric and a.size:  # elements whose bytes differ (a -0.0 or a NaN payload counts)
            raw_a = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
            raw_b = np.ascontiguousarray(b).reshape(-1).view(np.uint8).reshape(b.size, -1)
            num = int(np.any(raw_a != raw_b, axis=-1).sum())
        else:
            num = int(np.sum(a != b))
        found.append(Difference(name, "value", max_abs_diff=worst, num_differing=num, size=int(a.size),
                                detail=extra))
    return found


def bitwise_diff(reference: Any, candidate: Any) -> list[str]:
    """One line per entry whose bytes differ (empty: bitwise identical); see :func:`differences`."""
    return [str(d) for d in differences(reference, candidate)]


def largest_relative_difference(reference: Any, candidate: Any, floor: float = 1e-6) -> float:
    """The largest |a - b| / |a| over the floating-point entries of two snapshots, where |a| is above ``floor``
    (float32 noise): how far a run that is not bitwise lies from its reference."""
    worst = 0.0
    for (_, a), (_, b) in zip(_as_snapshot(reference), _as_snapshot(candidate)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.dtype.kind == "f" and a.size:
            big = np.abs(a) > floor
            worst = max(worst, float(np.max(np.abs(a - b)[big] / np.abs(a)[big], initial=0.0)))
    return worst


def assert_bitwise_equal(reference: Any, candidate: Any, what: str = "state") -> None:
    """Raise ``AssertionError`` naming the first differing entry, the max difference and every other one."""
    found = differences(reference, candidate)
    if not found:
        return
    total = len(_as_snapshot(reference))
    worst = max((d.max_abs_diff for d in found if not np.isnan(d.max_abs_diff)), default=float("nan"))
    lines = "\n  ".join(str(d) for d in found[:MAX_LISTED])
    more = f"\n  ... and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
    raise AssertionError(f"{what}: {len(found)} of {total} entries differ, first {found[0].name!r}, "
                         f"max |diff| {worst:.6g}:\n  {lines}{more}")
