"""Memory-aware execution order of a training step, and the control edges that enforce it.

``schedule_order(graph) -> order``; ``order_edges(graph, order) -> [(before, after)]``;
``add_order_edges(graph, edges) -> Graph``. See docs/design.md ("Enforced order").
"""

from tflms.schedule.edges import add_order_edges, order_edges, ordered_ops
from tflms.schedule.memory import buffer_model, replay_peak
from tflms.schedule.timed import replay_peak_timed
from tflms.schedule.order import HEURISTICS, ScheduleResult, schedule_order, schedule_with_report

__all__ = ["HEURISTICS", "ScheduleResult", "add_order_edges", "buffer_model", "order_edges", "ordered_ops",
           "replay_peak", "replay_peak_timed", "schedule_order", "schedule_with_report"]
