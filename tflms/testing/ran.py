"""What TensorFlow really ran: the post-optimization graphs of run metadata.

Grappler optimizes a function when it is instantiated (its first call), and run
metadata reports the function's graphs then, not on later calls. So record
around the whole training run (:func:`record_run_metadata`) and pick the graphs
out afterwards: the training step is the largest function graph that ran.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from tflms.ir.op_types import PLUMBING_OP_TYPES



@dataclasses.dataclass
class RanGraphs:
    """The function graphs TensorFlow reported while recording (filled when the ``with`` block ends)."""

    function_graphs: list[Any] = dataclasses.field(default_factory=list)

    def step_graph(self, must_hold: Iterable[str] = ()):
        """The ``FunctionGraphs`` entry of the training step.

        With ``must_hold`` (e.g. a report's inserted op names): the one whose
        pre-optimization graph holds all of them; otherwise the largest graph
        after optimization. ``None`` if nothing matches.
        """
        names = set(must_hold)
        graphs = self.function_graphs
        if names:
            graphs = [fg for fg in graphs if names <= {n.name for n in fg.pre_optimization_graph.node}]
        if not graphs:
            return None
        return max(graphs, key=lambda fg: len(fg.post_optimization_graph.node))

    def missing_after_optimization(self, inserted: Iterable[str]) -> list[str]:
        """Inserted ops (swap ops) that grappler removed from the step that ran; all of them if no step holds them."""
        names = sorted(set(inserted))
        holder = self.step_graph(names)
        if holder is None:
            return names
        ran = {n.name for n in holder.post_optimization_graph.node}
        ran |= {n.name for g in holder.partition_graphs for n in g.node}
        return [n for n in names if n not in ran]


@contextlib.contextmanager
def record_run_metadata() -> Iterator[RanGraphs]:
    """Collect the function graphs TensorFlow optimizes and runs inside the block (every call's)."""
    from tflms._compat.tf import recorded_function_graphs
    ran = RanGraphs()
    with recorded_function_graphs() as graphs:
        yield ran
    ran.function_graphs = graphs


def op_type_counts(graph_def: Any, *, exclude_names: Iterable[str] = (),
                   exclude_types: Iterable[str] = PLUMBING_OP_TYPES) -> dict[str, int]:
    """Op-type counts of a ``GraphDef`` (e.g. a post-optimization graph), leaving out named ops and plumbing."""
    names, types = set(exclude_names), set(exclude_types)
    counts = collections.Counter(n.op for n in graph_def.node if n.name not in names and n.op not in types)
    return dict(sorted(counts.items()))


def count_differences(plain: dict[str, int], other: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{op type: (plain count, other count)}`` for every type whose count differs."""
    return {t: (plain.get(t, 0), other.get(t, 0)) for t in sorted(set(plain) | set(other))
            if plain.get(t, 0) != other.get(t, 0)}
