"""The one contract every graph pass keeps: a new graph, whether anything changed, and a report."""

from __future__ import annotations

import dataclasses
from typing import Any

from tflms.ir.graph import Graph


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What a pass returns.

    ``graph``: the pass's output (the input graph object itself when nothing changed, never a
    modified input); ``changed``: whether ``graph`` differs from the input; ``report``: the
    pass's own record of what it did (inserted op names, compression choices, a placement).
    """

    graph: Graph
    changed: bool
    report: Any = None
