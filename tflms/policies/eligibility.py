"""What a plan may touch, for every action: which ops tflms inserted, and which ops may be re-run.

Swap eligibility (:func:`tflms.policies.swapplan.skip_reason`) says which tensors may be copied
to the host; :func:`recompute_skip_reason` says which ops may be cloned into the backward pass
(:mod:`tflms.policies.recompute`). Both refuse with a reason code and a sentence the report shows.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from tflms.analysis.cto import Analysis, Category
from tflms.ir.names import CLONE_PREFIX, INSERTED_PREFIX, is_clone, is_inserted  # noqa: F401 (re-exported)
from tflms.ir.op_types import (CALL_OP_TYPES, CONDITIONAL_TYPES, HOST_PRODUCERS, IDENTITY_OPS, LOOP_TYPES,
                               ONEDNN_WORKSPACE_EDGES, PYTHON_CALLBACK_OPS, VARIABLE_READ_OPS)

#: dtypes a recomputed op may not produce: handles and host-only data.
NEVER_RECOMPUTE_DTYPES = frozenset({"resource", "variant", "string"})


_SWAP_CLONES: contextvars.ContextVar[bool] = contextvars.ContextVar("tflms_swap_clones", default=False)


@contextlib.contextmanager
def swapping_clones() -> Iterator[None]:
    """Within this block a recompute clone's output may be swapped (:func:`clones_swappable`).

    The hybrid search plans swaps on a recomputed step, where a clone rebuilt for its first backward reader can
    wait on the device across another branch's backward pass; swapping it is what fits DenseNet-121 at batch 1108
    and (with the memory-aware order pinned first, :func:`tflms.tune.hybrid._ordered_hybrids`) ResNet-50 at batch
    999 on v100-16gb-pcie3. Offered clones where it fits without them, the greedy searches chose slower plans
    (BERT-base at batch 329: 25.0 s a step against 21.6 s), so the level-order hybrid search offers them only
    when no hybrid fits without, and the order-first one searches both without and with them; nothing else ever
    swaps a clone: it is rebuilt where it is read.
    """
    token = _SWAP_CLONES.set(True)
    try:
        yield
    finally:
        _SWAP_CLONES.reset(token)


def clones_swappable() -> bool:
    """Whether a recompute clone's output may be swapped here (inside :func:`swapping_clones`)."""
    return _SWAP_CLONES.get()


def recompute_skip_reason(analysis: Analysis, name: str) -> tuple[str, str] | None:
    """Why the op ``name`` must not be re-run in the backward pass, or ``None`` if it may be.

    A clone must compute what the original computed and do nothing else: never an op with state
    or side effects (its op definition says stateful: variable writes, moving-average updates,
    random ops that keep state, collectives, queues), a variable read (the step may write the
    variable before the clone runs: the clone reads the original read's value instead), a call
    (its body may hold any of these), a Python callback, an op in control flow (it may be dead),
    or an op outside the forward pass. Stateless random ops (``StatelessRandom*``, Keras 3's
    Dropout) qualify: re-run from the same seed tensor they give the same values.

    Memoized with the analysis (in its ``__dict__``, as :func:`functools.cached_property` stores its values: the
    answer depends on the frozen analysis and the name alone): the tuner's recompute search asks about the same
    ops for every plan it makes.
    """
    memo = analysis.__dict__.setdefault("_recompute_skip_reasons", {})
    if name in memo:
        return memo[name]
    why = memo[name] = _recompute_skip_reason(analysis, name)
    return why


def _recompute_skip_reason(analysis: Analysis, name: str) -> tuple[str, str] | None:
    """:func:`recompute_skip_reason`, not memoized."""
    graph = analysis.graph
    op = graph.op(name)
    if is_inserted(name):
        return "inserted", "an op tflms inserted"
    if analysis.categories.get(name) is not Category.FORWARD:
        return "not-forward", f"{analysis.categories.get(name)} op: only forward ops are recomputed"
    if op.type in VARIABLE_READ_OPS:
        return "variable-read", ("a variable read: the step may write the variable before a clone would run, so "
                                 "clones read this read's value instead")
    if op.type in CALL_OP_TYPES:
        return "call", f"{op.type}: its function body may have side effects"
    if op.type in PYTHON_CALLBACK_OPS:
        return "stateful", f"{op.type} runs Python, which may have side effects"
    if name in analysis.conditional or op.type in CONDITIONAL_TYPES or op.type in LOOP_TYPES:
        return "conditional", f"{op.type} is in control flow (it may be dead, or run once per iteration)"
    if _is_stateful(op.type):
        return "stateful", (f"{op.type} is stateful (side effects or hidden state, e.g. a random op that keeps "
                            "its state): a second run would not compute the same values")
    if op.type in IDENTITY_OPS:
        return "identity", f"{op.type} output aliases its input: re-running it frees nothing"
    if op.type in HOST_PRODUCERS:
        return "host-memory", f"{op.type} computes shapes in host memory: nothing to save on the accelerator"
    for info in op.outputs:
        if info.dtype in NEVER_RECOMPUTE_DTYPES or info.dtype.endswith("_ref"):
            return "dtype", f"an output of dtype {info.dtype} (a handle or host data)"
    for index, _ in enumerate(op.outputs):
        if (op.type, index) in ONEDNN_WORKSPACE_EDGES:
            return "onednn-workspace", (f"{op.type}'s gradient may read its oneDNN workspace, which a clone would "
                                        "not hand over")
    return None


def _is_stateful(op_type: str) -> bool:
    from tflms._compat.tf import op_def
    definition = op_def(op_type)
    # an op type TensorFlow does not know (a graph built by hand) is treated as stateful: nothing proves it is not
    return definition is None or bool(definition.is_stateful)
