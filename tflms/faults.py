"""A test-only hook that pauses or kills the process at named phases, so fault tests do not depend on timing.

Unset (always, outside tests) it costs one environment lookup per phase and
does nothing. Set ``TFLMS_FAULT`` to ``PHASE:ACTION`` (several separated by
``;``) and the process acts when it reaches ``PHASE``:

- ``sigkill``, ``sigterm``, ``sigint``: send that signal to itself (SIGTERM
  and SIGINT are then raised where the handlers put them; the hook waits for
  that, unless a critical section defers the signal);
- ``pause=PATH``: create ``PATH.reached``, then wait until ``PATH.go``
  exists (at most :data:`PAUSE_LIMIT_S`), so a test can act on the paused
  process (send a signal, create OUT_DIR) and then let it go on.

Phases (:data:`PHASES`) of ``tflms rewrite``: ``after-load`` (the input is
loaded, no temporary directory written yet), ``after-rewrite``,
``during-save`` (the temporary directory is fully written, not yet checked),
``during-verify`` (both models are loaded, before running them),
``before-commit``, ``after-exchange`` (``--replace``: the new model is in
OUT_DIR, the old one at the hidden sibling, not yet removed),
``after-commit``.
"""

from __future__ import annotations

import os
import signal
import time

#: The environment variable read by :func:`fault_point`.
ENV = "TFLMS_FAULT"
PHASES = ("after-load", "after-rewrite", "during-save", "during-verify", "before-commit", "after-exchange",
          "after-commit")
_SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
#: Longest a ``pause`` waits for its ``.go`` file before going on.
PAUSE_LIMIT_S = 120.0
#: Longest the hook waits for a handled signal it sent itself to be raised.
SIGNAL_WAIT_S = 10.0
_POLL_S = 0.01


def fault_point(phase: str) -> None:
    """Act as ``TFLMS_FAULT`` says for ``phase`` (nothing when it is unset)."""
    spec = os.environ.get(ENV)
    if spec:
        _act(phase, spec)


def _act(phase: str, spec: str) -> None:
    from tflms import interrupts
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        where, _, action = item.partition(":")
        if where not in PHASES:
            raise ValueError(f"{ENV}={spec!r}: unknown phase {where!r}; phases: {', '.join(PHASES)}")
        if where != phase:
            continue
        if action in _SIGNALS:
            os.kill(os.getpid(), _SIGNALS[action])
            deadline = time.monotonic() + SIGNAL_WAIT_S
            while not interrupts.is_deferring() and time.monotonic() < deadline:
                time.sleep(_POLL_S)  # the handler raises here
        elif action.startswith("pause="):
            path = action[len("pause="):]
            with open(path + ".reached", "w", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while not os.path.exists(path + ".go") and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        else:
            raise ValueError(f"{ENV}={spec!r}: unknown action {action!r}; use sigkill, sigterm, sigint or "
                             "pause=PATH")
