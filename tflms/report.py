"""The rewrite report: what was swapped, what was skipped, and why."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from tflms.policies.swapplan import SwapPlan
from tflms.units import format_bytes


@dataclasses.dataclass(frozen=True)
class RewriteReport:
    """Everything a rewrite did, in a form for people (``table()``) and machines (``to_dict()``)."""

    plan: SwapPlan
    graph_summary: dict[str, Any]
    inserted_ops: tuple[str, ...]
    timings_s: dict[str, float]
    tuning: dict[str, Any] | None = None  # the tuner's summary when a budget chose the parameters
    compression: dict[str, str] = dataclasses.field(default_factory=dict)  # swapped tensor -> codec

    @property
    def swaps(self):
        return self.plan.swaps

    @property
    def skipped(self):
        return self.plan.skipped

    @property
    def warnings(self):
        return self.plan.warnings

    @property
    def num_swapped(self) -> int:
        return len(self.plan.swaps)

    @property
    def swapped_bytes(self) -> int:
        return self.plan.swapped_bytes

    @property
    def changed(self) -> bool:
        return bool(self.plan.swaps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.plan.config.to_dict(),
            "accelerator_device": self.plan.accelerator_device,
            "graph": self.graph_summary,
            "swapped_bytes": self.swapped_bytes,
            "swaps": [{
                "tensor": s.tensor.name, "dtype": s.dtype, "bytes": s.num_bytes,
                "producer_level": s.producer_level, "swap_out": s.swap_out,
                "sync_out_consumers": list(s.sync_out_consumers),
                "swap_ins": [{
                    "name": g.name, "consumers": list(g.consumers), "consumer_levels": list(g.consumer_levels),
                    "trigger": g.trigger, "trigger_level": g.trigger_level, "sync": g.sync, "note": g.note,
                } for g in s.swap_ins],
            } for s in self.plan.swaps],
            "skipped": [{"tensor": k.tensor.name, "reason": k.reason, "detail": k.detail}
                        for k in self.plan.skipped],
            "warnings": list(self.plan.warnings),
            "inserted_ops": list(self.inserted_ops),
            "timings_s": dict(self.timings_s),
            "tuning": self.tuning,
            "compression": dict(self.compression),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self, max_rows: int = 40) -> str:
        """A readable summary with one row per swapped tensor and skip counts."""
        lines = []
        g = self.graph_summary
        lines.append(f"graph: {g.get('ops')} ops, {g.get('levels')} levels, categories {g.get('categories')}")
        if self.tuning:
            lines.append(f"tuning: {self.tuning['reason']}")
        lines.append(f"swapped: {self.num_swapped} tensors, {format_bytes(self.swapped_bytes)} "
                     f"-> accelerator {self.plan.accelerator_device}, host {self.plan.config.host_device}")
        if self.plan.swaps:
            header = ("tensor", "bytes", "lvl", "consumer lvls", "trigger (lvl)", "sync")
            rows = []
            for s in self.plan.swaps[:max_rows]:
                for i, grp in enumerate(s.swap_ins):
                    trig = "-" if grp.trigger is None else f"{_short(grp.trigger)} ({grp.trigger_level})"
                    rows.append((_short(s.tensor.name) if i == 0 else "", format_bytes(s.num_bytes) if i == 0 else "",
                                 str(s.producer_level) if i == 0 else "", _levels(grp.consumer_levels), trig,
                                 "yes" if grp.sync else "no"))
            widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines.append(fmt.format(*header))
            lines.append(fmt.format(*("-" * w for w in widths)))
            lines.extend(fmt.format(*r) for r in rows)
            if len(self.plan.swaps) > max_rows:
                lines.append(f"... and {len(self.plan.swaps) - max_rows} more swapped tensors (see to_json())")
        if self.compression:
            codecs = Counter(self.compression.values())
            lines.append("compressed: " + ", ".join(f"{n} with {c}" for c, n in sorted(codecs.items())))
        if self.plan.skipped:
            counts = Counter(k.reason for k in self.plan.skipped)
            lines.append("skipped candidates: " + ", ".join(f"{r} x{n}" for r, n in sorted(counts.items())))
        for w in self.plan.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]


def _levels(levels) -> str:
    text = ",".join(str(v) for v in levels)
    return text if len(text) <= 24 else text[:21] + "..."
