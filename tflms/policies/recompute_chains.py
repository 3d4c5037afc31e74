"""Which forward ops rebuild a tensor, and from what: the chain a recompute re-runs.

A tensor is rebuilt by re-running its producer and, walking back, the producers of every input that is not
kept (:func:`is_kept`: resident for the whole step, or alive into the backward pass anyway), up to
:data:`MAX_CHAIN_OPS` ops (:func:`chain_for`); the readers a clone serves are the tensor's readers outside the
forward pass (:func:`backward_readers`). :mod:`tflms.policies.recompute` plans the clones of such chains,
:mod:`tflms.policies.recompute_rank` ranks them.
"""

from __future__ import annotations

from collections.abc import Callable

from tflms.analysis.cto import Analysis, Category
from tflms.ir.graph import TensorRef
from tflms.ir.op_types import CONSTANT_OPS, METADATA_ONLY_TYPES, SOURCE_OPS, VARIABLE_READ_OPS
from tflms.policies.eligibility import recompute_skip_reason

#: The most ops one chain may re-run to rebuild one tensor (a longer chain costs more than it frees).
MAX_CHAIN_OPS = 12


def backward_readers(analysis: Analysis, ref: TensorRef, chain: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The readers of ``ref`` that are neither forward ops nor in the chain, by (level, name). Readers of its
    shape alone (``Shape``, ``Size``, ...: gradient ops run them as soon as the forward tensor exists) keep
    reading the original.

    The readers of each tensor are found once per analysis (kept in its ``__dict__``, as
    :func:`functools.cached_property` keeps its values): the recompute search asks about the same tensors for every
    plan, with different chains.
    """
    memo = analysis.__dict__.setdefault("_backward_readers", {})
    readers = memo.get(ref)
    if readers is None:
        cats, levels, graph = analysis.categories, analysis.levels, analysis.graph
        found = {c for c, _ in graph.consumers(ref) if cats[c] is not Category.FORWARD
                 and graph.op(c).type not in METADATA_ONLY_TYPES}
        readers = memo[ref] = tuple(sorted(found, key=lambda n: (levels[n], n)))
    if not chain or chain.isdisjoint(readers):
        return readers
    return tuple(c for c in readers if c not in chain)


def is_resident(analysis: Analysis, ref: TensorRef) -> bool:
    """Whether ``ref`` is on the device for the whole step: a constant, a variable read or a step argument."""
    op_type = analysis.graph.op(ref.op).type
    return op_type in CONSTANT_OPS or op_type in VARIABLE_READ_OPS or op_type in SOURCE_OPS


def is_kept(analysis: Analysis, ref: TensorRef) -> bool:
    """Whether ``ref`` is alive into the backward pass anyway: resident (:func:`is_resident`) or read by some op
    outside the forward pass."""
    graph = analysis.graph
    if is_resident(analysis, ref):
        return True
    if analysis.categories[ref.op] is not Category.FORWARD:
        return True
    cats = analysis.categories
    return any(cats[c] is not Category.FORWARD for c, _ in graph.consumers(ref))


def chain_for(analysis: Analysis, target: str, *, max_ops: int = MAX_CHAIN_OPS,
              kept: Callable[[TensorRef], bool] | None = None
              ) -> tuple[tuple[str, ...] | None, tuple[str, str] | None]:
    """The ops to re-run to rebuild ``target``'s outputs from kept tensors: ``(chain, None)`` or
    ``(None, (reason, sentence))``.

    Walks back from ``target``: an input that is kept (``kept``, default :func:`is_kept`) is a source; any other
    input's producer joins the chain if it may be recomputed, up to ``max_ops`` ops.
    """
    if kept is None:
        def kept(ref: TensorRef) -> bool:
            return is_kept(analysis, ref)
    reason = recompute_skip_reason(analysis, target)
    if reason is not None:
        return None, reason
    graph = analysis.graph
    chain, stack = {target}, [target]
    while stack:
        for ref in graph.op(stack.pop()).inputs:
            if ref.op in chain or kept(ref):
                continue
            why = recompute_skip_reason(analysis, ref.op)
            if why is not None:
                return None, ("source", f"input {ref.name} is freed in the forward pass and its producer cannot be "
                              f"recomputed ({why[0]}: {why[1]})")
            if len(chain) >= max_ops:
                return None, ("long-chain", f"rebuilding it needs more than {max_ops} ops")
            chain.add(ref.op)
            stack.append(ref.op)
    return tuple(sorted(chain, key=lambda n: (analysis.levels[n], n))), None
