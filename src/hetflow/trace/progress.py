"""A progress bar for long runs that costs the loop nothing it would notice.

``advance`` only adds to a counter under a lock (well under a microsecond); a background
thread redraws the bar at most ``refresh_per_second`` times (default 10). The bar goes
to standard error, as warnings do, so that a program's output stays its own
(``python run.py > results.txt`` still shows the bar). It is drawn only on a terminal:
with standard error going to a file or a pipe (batch jobs, CI logs) it stays silent
unless ``force=True``::

    with hetflow.trace.progress(50, "solving") as bar:
        for it in range(50):
            hetflow.forall(n, step, u, v, device=["cpu0", "gpu0"])
            bar.advance()
"""
from __future__ import annotations

import contextlib
import math
import numbers
import sys
import threading

from ..errors import ArgumentError, ArgumentTypeError


class Progress:
    """The handle :func:`progress` yields: ``advance(k)`` and ``completed``.

    ``visible`` says whether a bar is being drawn.
    """

    def __init__(self, total: float | None, description: str, *, visible: bool, console=None,
                 refresh_per_second: float = 10.0):
        self.total = total
        self.description = description
        self.visible = visible
        self._completed = 0
        self._lock = threading.Lock()
        self._period = 1.0 / refresh_per_second
        self._stop = threading.Event()
        self._bar = self._task = self._thread = None
        if visible:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       SpinnerColumn, TaskProgressColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            columns = [SpinnerColumn(), TextColumn("[progress.description]{task.description}"),
                       BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn()]
            # auto_refresh off: the only redraws are ours, at our rate.
            self._bar = RichProgress(*columns, console=console, auto_refresh=False, transient=False)
            self._task = self._bar.add_task(description, total=total)

    @property
    def completed(self) -> float:
        return self._completed

    def advance(self, k: float = 1) -> None:
        """Count ``k`` (a finite number >= 0) more units of work done."""
        if isinstance(k, bool) or not isinstance(k, numbers.Real):
            raise ArgumentTypeError(f"progress advances by a number, got {type(k).__name__} {k!r}")
        if not 0 <= k < math.inf:  # NaN fails this too
            raise ArgumentError(f"progress can only advance by a finite non-negative amount, got {k!r}")
        with self._lock:
            self._completed += k

    # -- drawing ---------------------------------------------------------------------------
    def _draw(self) -> None:
        self._bar.update(self._task, completed=self._completed)
        self._bar.refresh()

    def _redraw_until_stopped(self) -> None:
        while not self._stop.wait(self._period):
            self._draw()

    def _start(self) -> None:
        if self._bar is not None:
            self._bar.start()
            self._draw()
            self._thread = threading.Thread(target=self._redraw_until_stopped, daemon=True,
                                            name="hetflow-progress")
            self._thread.start()

    def _finish(self) -> None:
        if self._bar is not None:
            self._stop.set()
            self._thread.join()
            self._draw()                  # the final count, whatever the last redraw saw
            self._bar.stop()


def _check(total, description, refresh_per_second):
    if total is not None and (isinstance(total, bool) or not isinstance(total, (int, float))
                              or not total >= 0):
        raise ArgumentError(f"progress total must be a non-negative number or None, got {total!r}")
    if not isinstance(description, str):
        raise ArgumentError(f"progress description must be a string, got {type(description).__name__}")
    if not isinstance(refresh_per_second, (int, float)) or not 0 < refresh_per_second <= 60:
        raise ArgumentError(f"refresh_per_second must be in (0, 60], got {refresh_per_second!r}")


@contextlib.contextmanager
def progress(total: float | None, description: str = "working", *, force: bool = False,
             file=None, refresh_per_second: float = 10.0):
    """A progress bar over ``total`` units (None: unknown) shown while the block runs.

    Yields a :class:`Progress`; call ``advance(k)`` as work completes. Drawn to ``file``
    (default ``sys.stderr``) only if it is a terminal, or if ``force``.
    """
    _check(total, description, refresh_per_second)
    file = sys.stderr if file is None else file
    console = None
    visible = force or _is_terminal(file)
    if visible:
        from rich.console import Console

        console = Console(file=file, force_terminal=True if force else None)
    bar = Progress(total, description, visible=visible, console=console,
                   refresh_per_second=refresh_per_second)
    bar._start()
    try:
        yield bar
    finally:
        bar._finish()


def _is_terminal(file) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:                      # a closed file
        return False
