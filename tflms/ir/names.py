"""The names tflms gives the ops it inserts: every one starts with :data:`INSERTED_PREFIX`, a recompute clone with
:data:`CLONE_PREFIX`. Below the policies and passes that name them, so that any layer may recognise them."""

from __future__ import annotations

#: The name prefix of every op a tflms pass inserts (swap copies, codec calls, recompute clones).
INSERTED_PREFIX = "lms/"
#: The name prefix of recompute clones (:func:`tflms.policies.recompute.clone_name`).
CLONE_PREFIX = INSERTED_PREFIX + "recompute_"
#: The ``NoOp`` that joins the variable updates of one XLA update part into one cluster
#: (:func:`tflms.passes.xla_clusters.cluster_for_xla`).
XLA_JOIN_PREFIX = INSERTED_PREFIX + "xla_update_join_"


def is_inserted(name: str) -> bool:
    """Whether ``name`` is an op a tflms pass inserted (so a graph holding one was rewritten already)."""
    return name.startswith(INSERTED_PREFIX)


def is_clone(name: str) -> bool:
    """Whether ``name`` is a recompute clone (a graph with clones may still get swaps: the hybrid search's)."""
    return name.startswith(CLONE_PREFIX)
