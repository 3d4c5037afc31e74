"""What the integrations show while a step is rewritten: tuner progress and the one-line summary.

The tuner simulates one candidate rewrite after another (tens of them, up to a
minute on a large model); :func:`tflms.pipeline.rewrite_step` reports each
through its ``progress`` callable. The integrations show that as their users
expect, following ``verbose`` (Keras's convention):

- ``0``: nothing (the ``tflms`` loggers still log at INFO);
- ``1``: a ``keras.utils.Progbar`` counting simulated candidates (the target is
  unknown) with the elapsed time, finished when the rewrite is; then one summary
  line per traced signature (:func:`summary_line`);
- ``2``: one line per candidate (its parameters, predicted peak and step time),
  the summary line and the report's table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tflms.report import RewriteReport
from tflms.units import format_bytes

logger = logging.getLogger(__name__)

#: ``verbose`` levels (Keras's convention).
SILENT, SUMMARY, TABLE = 0, 1, 2


def check_verbose(verbose: int) -> int:
    if isinstance(verbose, bool) or verbose not in (SILENT, SUMMARY, TABLE):
        raise ValueError(f"verbose must be 0 (silent), 1 (progress and a summary line per trace) or 2 (a line per "
                         f"tuner candidate and report tables), got {verbose!r}")
    return verbose


def default_print(text: str) -> None:
    """Print as Keras prints (``io_utils.print_msg``: honours Keras's interactive-logging switch)."""
    from tflms._compat.tf import keras_print_msg
    keras_print_msg()(text)


@contextmanager
def tuner_progress(verbose: int, prefix: str,
                   say: Callable[[str], None] = default_print) -> Iterator[Callable[[str], None] | None]:
    """The ``progress`` callable for :func:`~tflms.pipeline.rewrite_step` at this ``verbose`` level.

    Yields ``None`` at verbose 0. At 1 a ``keras.utils.Progbar`` counts candidates
    and is finished (one closing line) when the block ends, if it started; at 2
    each candidate is one line ``PREFIX: candidate N: ...``.
    """
    if verbose == SILENT:
        yield None
        return
    count = 0
    if verbose == TABLE:
        def line(message: str) -> None:
            nonlocal count
            count += 1
            say(f"{prefix}: candidate {count}: {message}")
            logger.info("%s: candidate %d: %s", prefix, count, message)

        yield line
        return
    bar = None

    def tick(message: str) -> None:
        nonlocal count, bar
        count += 1
        logger.info("%s: candidate %d: %s", prefix, count, message)
        if bar is None:
            import keras
            say(f"{prefix}: simulating candidate rewrites for the budget")
            bar = keras.utils.Progbar(None, unit_name="candidate")
        bar.update(count)

    try:
        yield tick
    finally:
        if bar is not None:
            bar.update(count, finalize=True)


def summary_line(prefix: str, report: RewriteReport, what: str) -> str:
    """``PREFIX: WHAT: N tensors swapped (B) from ACC TO HOST (how)``, the prediction when the tuner made one
    (peak before -> after, overhead, profile), and a second line naming the hardware profile."""
    config = report.plan.config
    if report.tuning:
        how = f"tuner: {report.tuning['strategy']} for budget {format_bytes(report.tuning['budget_bytes'])}"
        if (report.plan_cache or {}).get("status") == "hit":
            how += ", plan reused from the plan cache"
    else:
        how = f"swapout_threshold={config.swapout_threshold}, swapin_ahead={config.swapin_ahead}"
    predicted = f"; {report.prediction_text()}" if report.prediction() else ""
    return (f"{prefix}: {what}: {report.num_swapped} tensors swapped ({format_bytes(report.swapped_bytes)}) from "
            f"{report.plan.accelerator_device} to {config.host_device} ({how}){predicted}\n"
            f"  {report.hardware_text()}"
            + (f"\n  budget in TensorFlow's executor: {report.order['guarantee_why']}"
               if report.order and report.order.get("guarantee_why") else ""))
