"""The swap plan record every policy returns, and the rules all policies share.

A policy (:mod:`tflms.policies.tflms_rules`, :mod:`tflms.policies.idle_time`,
:mod:`tflms.policies.vdnn`) decides which tensors to swap and where their
swap-ins are triggered; it returns a :class:`SwapPlan`, which the swap pass
(:func:`tflms.passes.apply_swaps`) turns into ops. The rules here are shared:
what may never be swapped (:func:`skip_reason`), how consumers are grouped
(:func:`group_consumers`), how a trigger is found (:func:`find_trigger`) and the
names of the inserted ops (:func:`swap_op_names`).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.analysis.cto import Analysis, Category
from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.ir.graph import TensorRef
from tflms.devices import runs_onednn_cpu_kernels
from tflms.policies.eligibility import INSERTED_PREFIX, clones_swappable, is_clone, is_inserted
from tflms.ir.op_types import CONDITIONAL_TYPES, HOST_PRODUCERS, IDENTITY_OPS, ONEDNN_WORKSPACE_EDGES

logger = logging.getLogger(__name__)

#: dtypes never swapped: handles and host-only data.
NEVER_SWAP_DTYPES = frozenset({"resource", "variant", "string"})
#: dtypes TensorFlow keeps in host memory on GPUs (shapes, indices).
HOST_MEMORY_DTYPES = frozenset({"int32"})
#: producers whose outputs are constants or alias resident buffers.
NO_SWAP_PRODUCERS = {"Const": "constant", "HostConst": "constant", "ReadVariableOp": "variable-read",
                     "VarHandleOp": "variable-read", "Placeholder": "function-input",
                     "_Arg": "function-input"}


@dataclasses.dataclass(frozen=True)
class SwapInGroup:
    """One swap-in op feeding a group of consumers."""

    name: str
    consumers: tuple[str, ...]
    consumer_levels: tuple[int, ...]
    trigger: str | None
    trigger_level: int | None
    sync: bool
    note: str = ""


@dataclasses.dataclass(frozen=True)
class SwapDecision:
    """Swap one tensor out once and back in for each consumer group."""

    tensor: TensorRef
    dtype: str
    num_bytes: int
    producer_level: int
    swap_out: str
    sync_out_consumers: tuple[str, ...]
    swap_ins: tuple[SwapInGroup, ...]

    @property
    def consumer_levels(self) -> tuple[int, ...]:
        return tuple(level for g in self.swap_ins for level in g.consumer_levels)


@dataclasses.dataclass(frozen=True)
class Skip:
    """A candidate tensor left alone, with a reason code and a sentence."""

    tensor: TensorRef
    reason: str
    detail: str


@dataclasses.dataclass(frozen=True)
class SwapPlan:
    """What the rewriter will do; built by a policy, applied by ``apply_swaps``.

    Two actions: ``swaps`` (copy a tensor to the host and back) and ``recomputes`` (re-run the ops
    that produce a tensor for the backward pass, :mod:`tflms.policies.recompute`); the pass applies
    the recomputes first, so a swap may serve a clone.
    """

    config: LMSConfig
    accelerator_device: str
    swaps: tuple[SwapDecision, ...]
    skipped: tuple[Skip, ...]
    warnings: tuple[str, ...] = ()
    recomputes: tuple[Any, ...] = ()  # tflms.policies.recompute.RecomputeDecision

    @property
    def swapped_bytes(self) -> int:
        return sum(s.num_bytes for s in self.swaps)

    @property
    def recomputed_bytes(self) -> int:
        return sum(r.num_bytes for r in self.recomputes)

    @property
    def changed(self) -> bool:
        """Whether the plan inserts anything (a swap or a recompute)."""
        return bool(self.swaps or self.recomputes)


def swap_op_names(tensor: TensorRef) -> tuple[str, str]:
    """Deterministic base names of a tensor's swap ops (swap-in gets ``_<group>``)."""
    return (f"{INSERTED_PREFIX}swap_out_{tensor.op}_{tensor.index}",
            f"{INSERTED_PREFIX}swap_in_{tensor.op}_{tensor.index}")


def _in_scope(name: str, scope: str) -> bool:
    return name == scope or name.startswith(scope + "/")


def check_filters(analysis: Analysis, config: LMSConfig) -> list[str]:
    """Validate include/exclude filters against the graph; return warnings.

    An op type unknown to TensorFlow, or a scope that matches no op, is an error.
    A known op type that is absent from this graph only warns.
    """
    graph = analysis.graph
    warnings: list[str] = []
    if not (config.include_types or config.exclude_types or config.include_scopes or config.exclude_scopes):
        return warnings  # nothing to check (the tuner plans dozens of times: skip the walks over the graph)
    present_types = {op.type for op in graph}
    for field in ("include_types", "exclude_types"):
        for op_type in getattr(config, field):
            if op_type in present_types:
                continue
            if not _is_registered_op_type(op_type):
                close = difflib.get_close_matches(op_type, sorted(present_types), n=3)
                raise ConfigError(f"{field}: {op_type!r} is not a TensorFlow op type"
                                  + (f"; did you mean {close}?" if close else ""))
            warnings.append(f"{field}: no op of type {op_type!r} in this graph")
    names = [op.name for op in graph]
    for field in ("include_scopes", "exclude_scopes"):
        for scope in getattr(config, field):
            if not any(_in_scope(n, scope) for n in names):
                prefixes = sorted({n.rsplit("/", 1)[0] for n in names if "/" in n})
                close = difflib.get_close_matches(scope, prefixes, n=3)
                raise ConfigError(f"{field}: no op is under the scope {scope!r}"
                                  + (f"; did you mean {close}?" if close else ""))
    return warnings


def _is_registered_op_type(op_type: str) -> bool:
    from tflms._compat.tf import op_def
    return op_def(op_type) is not None


def skip_reason(analysis: Analysis, ref: TensorRef, config: LMSConfig,
                accelerator_device: str | None = None) -> tuple[str, str] | None:
    """Why ``ref`` must not be swapped, or ``None`` if it may be.

    ``accelerator_device`` is where the plan's unplaced ops run (default:
    ``config.accelerator_device``, else the first GPU, else the CPU).
    """
    graph = analysis.graph
    op = graph.op(ref.op)
    info = op.outputs[ref.index]
    if is_inserted(ref.op) and not (is_clone(ref.op) and clones_swappable()):
        return "inserted", (f"output of {ref.op}, an op tflms inserted (a recompute clone is made where it is read, "
                            "and swapped only where the hybrid search offers clones)")
    if info.dtype in NEVER_SWAP_DTYPES or info.dtype.endswith("_ref"):
        return "dtype", f"{info.dtype} tensors are handles or host data, never swapped"
    if op.type in NO_SWAP_PRODUCERS:
        return NO_SWAP_PRODUCERS[op.type], f"output of {op.type}: swapping it frees no activation memory"
    if op.type in IDENTITY_OPS:
        return "identity", f"{op.type} output aliases its input and grappler may remove the op"
    if ref.op in analysis.conditional or op.type in CONDITIONAL_TYPES:
        return "conditional", f"{op.type} runs only when its branch of a conditional is taken (may be dead)"
    workspace_reader = _onednn_workspace_reader(analysis, ref, op.type,
                                                accelerator_device or config.accelerator_device or "")
    if workspace_reader is not None:
        return "onednn-workspace", (f"{workspace_reader} reads it with {op.type}'s oneDNN workspace; through a "
                                    "swap-in it would run TensorFlow's own kernel, which is not bitwise the same "
                                    "(and the tensor stays alive until it anyway)")
    if info.dtype in HOST_MEMORY_DTYPES or op.type in HOST_PRODUCERS:
        return "host-memory", f"{info.dtype} output of {op.type} is kept in host memory by TensorFlow"
    if info.shape is None:
        return "unknown-shape", "unknown rank: give the step concrete input shapes"
    if len(info.shape) <= 1:
        return "rank<=1", f"rank-{len(info.shape)} tensor (scalars, biases, shapes are not worth a copy)"
    if info.num_bytes is None:
        return "unknown-shape", (f"shape {list(info.shape)} is not fully known; pass batch_size=... or trace "
                                 "with concrete input shapes")
    if info.num_bytes < config.min_swap_bytes:
        return "small", f"{info.num_bytes} bytes < min_swap_bytes={config.min_swap_bytes}"
    if config.include_types and op.type not in config.include_types:
        return "filtered", f"producer type {op.type} not in include_types"
    if op.type in config.exclude_types:
        return "filtered", f"producer type {op.type} is in exclude_types"
    if config.include_scopes and not any(_in_scope(ref.op, s) for s in config.include_scopes):
        return "filtered", "producer not under include_scopes"
    if any(_in_scope(ref.op, s) for s in config.exclude_scopes):
        return "filtered", "producer is under exclude_scopes"
    return None


def _onednn_workspace_reader(analysis: Analysis, ref: TensorRef, producer_type: str,
                             default_device: str) -> str | None:
    """The gradient op that gets ``ref``'s producer's oneDNN workspace by reading ``ref`` directly, if any.

    See :data:`~tflms.ir.op_types.ONEDNN_WORKSPACE_EDGES`; only ops that run
    oneDNN's CPU kernels count (on a GPU nothing depends on the direct edge).
    Unplaced ops run on ``default_device`` (``""``: the first GPU, else the CPU).
    """
    edge = ONEDNN_WORKSPACE_EDGES.get((producer_type, ref.index))
    if edge is None:
        return None
    graph = analysis.graph
    for consumer, index in graph.consumers(ref):
        op = graph.op(consumer)
        if (op.type, index) == edge and runs_onednn_cpu_kernels(op.device or default_device):
            return consumer
    return None


def group_consumers(consumers: Sequence[str], levels: Mapping[str, int], groupby: int) -> list[list[str]]:
    """Consumers in level order, split where a level is more than ``groupby`` past its group's first."""
    groups: list[list[str]] = []
    for name in sorted(consumers, key=lambda n: (levels[n], n)):
        if groups and levels[name] - levels[groups[-1][0]] <= groupby:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def find_trigger(analysis: Analysis, first_consumer: str, producer_level: int, target_level: int,
                 exclude: frozenset[str] = frozenset()) -> str | None:
    """The ancestor of ``first_consumer`` at the lowest level >= ``target_level``.

    Only ops strictly after the producer's level qualify (earlier ones would not
    delay the swap-in). Identity-like ops (:data:`~tflms.ir.op_types.IDENTITY_OPS`)
    and ``exclude`` never trigger. Ties prefer backward ops, then the name. When
    the window holds no ancestor that may trigger (e.g. only identities), the
    nearest one below the window is taken instead: the ancestor at the highest
    level under ``target_level``, still after the producer's level (the swap-in
    then starts a little earlier than asked, rather than synchronously). ``None``
    if no ancestor after the producer's level may trigger.
    """
    floor = max(target_level, producer_level + 1)
    best = _best_ancestor(analysis, first_consumer, floor, exclude, lowest=True)
    if best is None and floor > producer_level + 1:
        best = _best_ancestor(analysis, first_consumer, producer_level + 1, exclude, lowest=False)
    return best


def trigger_ended_by(analysis: Analysis, first_consumer: str, producer_level: int, ends: Mapping[str, float],
                     by: float) -> str | None:
    """The ancestor of ``first_consumer`` strictly after the producer's level that may trigger (as for
    :func:`find_trigger`) and ended last by ``by`` in a simulation (``ends``: op name -> end time; ops without
    one never trigger); ties by name. ``None`` if none ended by then."""
    index = _trigger_index(analysis)
    may, names = index.may_trigger, index.names
    best, best_end = None, None
    for p in index.ancestors(first_consumer, producer_level + 1):
        end = ends.get(names[p])
        if may[p] and end is not None and end <= by and (best is None or (end, names[best]) > (best_end, names[p])):
            best, best_end = p, end
    return None if best is None else names[best]


def _best_ancestor(analysis: Analysis, start: str, floor: int, exclude: frozenset[str], *, lowest: bool) -> str | None:
    """The ancestor of ``start`` at level >= ``floor`` that may trigger, at the lowest (or highest) level.

    Ties prefer backward ops, then the name. Answered by the analysis's :class:`_TriggerIndex`.
    """
    return _trigger_index(analysis).best(start, floor, exclude, lowest)


def _trigger_index(analysis: Analysis) -> "_TriggerIndex":
    """The :class:`_TriggerIndex` of ``analysis``, built on first use and kept with it.

    Stored in the analysis's ``__dict__`` the way :func:`functools.cached_property` stores
    its values (the analysis is frozen; the index is derived from it and never changes it).
    """
    index = analysis.__dict__.get("_trigger_index")
    if index is None:
        index = analysis.__dict__["_trigger_index"] = _TriggerIndex(analysis)
    return index


#: Trigger answers a :class:`_TriggerIndex` keeps (a tune asks a few thousand, many of them repeatedly).
TRIGGER_MEMO_SIZE = 1 << 16


class _TriggerIndex:
    """:func:`find_trigger`'s ancestor search over integer op ids, derived once per analysis.

    Per op: its level, its predecessors (ids), whether it may trigger (not an identity, not
    conditional) and its rank in the two tie orders ``(level, not backward, name)`` and
    ``(-level, not backward, name)``, so the best of a set of ancestors is the one of least
    rank. Answers are memoized by ``(start, floor, exclude, lowest)``: the tuner plans the
    same swaps under many parameter values.
    """

    def __init__(self, analysis: Analysis):
        names = list(analysis.order)
        ids = {name: i for i, name in enumerate(names)}
        levels, cats, preds = analysis.levels, analysis.categories, analysis.predecessors
        graph, conditional = analysis.graph, analysis.conditional
        self.names, self.ids = names, ids
        self.level = [levels[n] for n in names]
        self.preds = [[ids[p] for p in preds[n]] for n in names]
        self.may_trigger = [n not in conditional and graph.op(n).type not in IDENTITY_OPS for n in names]
        not_backward = [0 if cats[n] is Category.BACKWARD else 1 for n in names]
        self.rank_low = [0] * len(names)
        self.rank_high = [0] * len(names)
        for r, i in enumerate(sorted(range(len(names)), key=lambda i: (self.level[i], not_backward[i], names[i]))):
            self.rank_low[i] = r
        for r, i in enumerate(sorted(range(len(names)), key=lambda i: (-self.level[i], not_backward[i], names[i]))):
            self.rank_high[i] = r
        self._memo: dict = {}

    def ancestors(self, start: str, floor: int):
        """The ids of ``start``'s ancestors at level >= ``floor`` (reached through such ancestors only)."""
        level, preds = self.level, self.preds
        first = self.ids[start]
        seen, stack = {first}, [first]
        while stack:
            for p in preds[stack.pop()]:
                if p not in seen and level[p] >= floor:
                    seen.add(p)
                    stack.append(p)
                    yield p

    def best(self, start: str, floor: int, exclude: frozenset[str], lowest: bool) -> str | None:
        key = (start, floor, exclude, lowest)
        if key in self._memo:
            return self._memo[key]
        may = self.may_trigger
        rank = self.rank_low if lowest else self.rank_high
        excluded = {self.ids[n] for n in exclude if n in self.ids}
        best = -1
        for p in self.ancestors(start, floor):
            if may[p] and (best < 0 or rank[p] < rank[best]) and p not in excluded:
                best = p
        answer = None if best < 0 else self.names[best]
        if len(self._memo) >= TRIGGER_MEMO_SIZE:
            self._memo.clear()
        self._memo[key] = answer
        return answer
