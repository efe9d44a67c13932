"""Progress of a run on the terminal: rich's live display on a terminal, plain lines elsewhere.

The runner (``ibemu.scenario.runner.ScenarioRun``) reports its phases through one callback,
``progress(phase, text)``: ``note``, ``build``, ``sm`` / ``manager``, ``warm-up``, ``traffic``,
``drain``, ``teardown``, ``interrupt``. :class:`Reporter` is that callback:

- on a terminal (stderr is a TTY, ``TERM`` is not ``dumb``): a rich progress display, one line
  per phase, a spinner while it runs and, for the phases it reports as they start (warm-up,
  traffic, drain), its duration once the next one starts; the traffic
  phase gets a bar over the run's duration in real time (the scenario's duration times the
  dilation factor: a dilated run's minutes are shown as the minutes they are). Colours follow
  rich, which honours ``NO_COLOR``;
- elsewhere (a pipe, a log file, CI): the plain lines ``[  2.31s] sm        ...`` it always
  printed, so scripts and logs read the same;
- ``--quiet``: nothing.

Use it as a context manager around the run, so the display is taken down (and the terminal
restored) however the run ends.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from types import TracebackType
from typing import IO, Any

PHASE_WIDTH = 9
TIMED = ("warm-up", "traffic", "drain")
"""Phases the runner reports as they start (the next one ends them): their lines get a duration.
The others are reported when done (``sm``: SUBNET UP) or say their own figures."""


def on_terminal(stream: IO[str]) -> bool:
    """Is ``stream`` a terminal rich can draw on?"""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


class Reporter:
    """``progress(phase, text)`` for the runner; see the module docstring."""

    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None, label: str = "",
                 traffic_s: float | None = None, live: bool | None = None,
                 timed: tuple[str, ...] = TIMED) -> None:
        self.quiet = quiet
        self.timed = timed
        """Phases whose lines get their duration (reported as they start, ended by the next)."""
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.traffic_s = traffic_s
        """Real seconds the traffic phase lasts (its bar's length); None: no bar."""
        self.live = (not quiet) and (on_terminal(self.stream) if live is None else live)
        self.t0 = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        self._phase_t0 = self.t0
        self._phase = ""
        self._handlers: list[tuple[Any, Any]] = []

    # ------------------------------------------------------------------ the callback

    def __call__(self, phase: str, text: str) -> None:
        if self.quiet:
            return
        if not self.live or self._progress is None:
            label = f"{self.label:<6} " if self.label else ""
            print(f"[{time.monotonic() - self.t0:6.2f}s] {label}{phase:<{PHASE_WIDTH}} {text}",
                  file=self.stream, flush=True)
            return
        self._finish_phase()
        now = time.monotonic()
        bar = phase == "traffic" and self.traffic_s is not None and self.traffic_s > 0
        head = f"{self.label} " if self.label else ""
        self._task = self._progress.add_task(f"{head}[bold]{phase:<{PHASE_WIDTH}}[/] {text}",
                                             total=self.traffic_s if bar else None, t0=now, bar=bar)
        self._phase, self._phase_t0 = phase, now
        if phase in ("note", "interrupt"):  # a line to read, not a phase that runs
            self._finish_phase()

    def _finish_phase(self) -> None:
        if self._task is None:
            return
        task = next((t for t in self._progress.tasks if t.id == self._task), None)
        took = time.monotonic() - self._phase_t0
        if task is not None:
            total = task.total if task.total else 1.0
            took_s = f" [dim]({took:.2f} s)[/]" if self._phase in self.timed else ""
            self._progress.update(self._task, total=total, completed=total, description=f"{task.description}{took_s}")
            self._progress.stop_task(self._task)
        self._task = None

    # ------------------------------------------------------------------ the display

    def __enter__(self) -> Reporter:
        if self.live:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn

            console = Console(file=self.stream, stderr=self.stream is sys.stderr)
            self._progress = Progress(SpinnerColumn(finished_text="[green]✓[/]"),
                                      TextColumn("{task.description}"), _time_bar(),
                                      console=console, transient=False, refresh_per_second=8)
            self._progress.start()
            # log records written meanwhile go above the display, not through it
            self._handlers = []
            for h in logging.getLogger().handlers:
                if isinstance(h, logging.StreamHandler) and h.stream is self.stream:
                    self._handlers.append((h, h.setStream(console.file)))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._finish_phase()
            for h, old in self._handlers:
                h.setStream(old)
            self._progress.stop()
            self._progress = None


def _time_bar() -> Any:
    """The traffic phase's bar column (rich is imported only when a terminal shows the display)."""
    from rich.progress import ProgressColumn
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    class TimeBar(ProgressColumn):
        """Advanced by time: the runner says only when the phase starts."""

        def render(self, task: Any) -> Any:
            if not task.fields.get("bar") or not task.total:
                return Text("")
            done = task.finished or not task.started
            elapsed = task.total if done else min(task.total, time.monotonic() - task.fields["t0"])
            left = max(0.0, task.total - elapsed)
            grid = Table.grid(padding=(0, 1))
            grid.add_row(ProgressBar(total=task.total, completed=elapsed, width=30),
                         Text(f"{elapsed:5.1f}/{task.total:.1f} s" + ("" if done else f", {left:.1f} s left")))
            return grid

    return TimeBar()
