"""SIGINT and SIGTERM as exceptions, and critical sections that finish before a signal takes effect.

The ``tflms`` command runs under :func:`handled`: SIGTERM (what ``kill``, CI
timeouts and container stops send) is handled like Ctrl-C, so the same
cleanup runs (``finally`` blocks remove temporary directories) and the
command prints one line instead of a traceback. :func:`deferred` wraps the
few steps that must not be cut in half (e.g. a commit and the removal of the
replaced output): a signal that arrives inside takes effect when it ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: The signals :func:`handled` and :func:`deferred` take over.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived. ``written``: an output completed before the signal took effect (else None)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.written: str | None = None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def _raise_interrupted(signum, frame):  # noqa: ARG001 - the signal module's handler signature
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (no-op in other threads)."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupted) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


_deferring = 0


def is_deferring() -> bool:
    """Whether a :func:`deferred` section is running."""
    return _deferring > 0


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A critical section: SIGINT and SIGTERM arriving inside are delivered when it ends.

    They are then delivered to the handlers that were in place before (under
    :func:`handled`: :class:`Interrupted` is raised as the section exits; with
    Python's defaults: ``KeyboardInterrupt``, or the end of the process for
    SIGTERM). Outside the main thread signals cannot be handled and this does
    nothing. Nested sections defer to the outermost.
    """
    global _deferring
    if not _in_main_thread() or _deferring:
        _deferring += 1
        try:
            yield
        finally:
            _deferring -= 1
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in SIGNALS}
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])
